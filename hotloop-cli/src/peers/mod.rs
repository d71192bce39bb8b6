//! Peer servers the bench measures hotloop against.

pub mod floor;
