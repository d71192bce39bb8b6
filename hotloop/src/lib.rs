//! hotloop: a thread-per-core async runtime for low-latency Linux network servers.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod time;
