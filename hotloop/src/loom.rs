//! The atomics that loom checks: loom's under `--cfg hotloop_loom`, std's otherwise.

#[cfg(hotloop_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool};
#[cfg(not(hotloop_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool};
