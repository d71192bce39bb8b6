//! The atomics that loom checks: loom's under `--cfg loom`, std's otherwise.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::AtomicBool;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::AtomicBool;
