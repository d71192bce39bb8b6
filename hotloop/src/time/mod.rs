//! Time: the per-worker timer wheel.

pub mod wheel;
