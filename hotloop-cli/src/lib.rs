//! The parts of the `hotloop` command that other programs (the fuzz
//! targets) reuse: the wire formats every server in the bench speaks.

pub mod proto;
