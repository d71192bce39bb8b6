//! The atomics and locks that loom checks: loom's under `--cfg hotloop_loom`, std's otherwise.

#[cfg(hotloop_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool};
#[cfg(not(hotloop_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool};

/// The shared-state types of the join slot.
pub(crate) mod sync {
    #[cfg(hotloop_loom)]
    pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
    #[cfg(not(hotloop_loom))]
    pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};
}
