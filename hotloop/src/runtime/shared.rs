//! The part of a worker that other threads may touch: its inbox of wakes
//! and spawned closures, its eventfd, its counters.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::task::TaskKey;
use crate::stats::WorkerStats;
use crate::sys;

/// A closure sent to a worker to run there (usually one that spawns a task).
pub(crate) type Runnable = Box<dyn FnOnce() + Send>;

/// What other threads have left for a worker.
#[derive(Default)]
pub(crate) struct Inbox {
    pub(crate) wakes: Vec<TaskKey>,
    pub(crate) runnables: Vec<Runnable>,
    pub(crate) shutdown: bool,
}

/// The thread-safe half of a worker.
pub(crate) struct WorkerShared {
    pub(crate) id: usize,
    pub(crate) inbox: Mutex<Inbox>,
    /// Set when the inbox has something, so the worker checks it without locking.
    pub(crate) inbox_pending: AtomicBool,
    /// Set by the worker just before it may block in the poller.
    pub(crate) sleeping: AtomicBool,
    /// Written to wake the worker out of its poller.
    pub(crate) eventfd: OwnedFd,
    pub(crate) stats: Arc<WorkerStats>,
}

impl WorkerShared {
    pub(crate) fn new(id: usize) -> std::io::Result<Arc<Self>> {
        Ok(Arc::new(WorkerShared {
            id,
            inbox: Mutex::new(Inbox::default()),
            inbox_pending: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            eventfd: sys::eventfd()?,
            stats: Arc::new(WorkerStats::default()),
        }))
    }

    /// Queues a wake from another thread.
    pub(crate) fn push_wake(&self, key: TaskKey) {
        self.with_inbox(|inbox| inbox.wakes.push(key));
    }

    /// Queues a closure to run on this worker.
    pub(crate) fn push_runnable(&self, f: Runnable) {
        self.with_inbox(|inbox| inbox.runnables.push(f));
    }

    /// Asks the worker to stop.
    pub(crate) fn push_shutdown(&self) {
        self.with_inbox(|inbox| inbox.shutdown = true);
    }

    fn with_inbox(&self, f: impl FnOnce(&mut Inbox)) {
        {
            let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut inbox);
        }
        self.inbox_pending.store(true, Ordering::SeqCst);
        // Only a worker that may be blocked in the poller needs the eventfd:
        // it sets `sleeping` and then re-checks `inbox_pending`, so one of the
        // two sides always sees the other.
        if self.sleeping.swap(false, Ordering::SeqCst) {
            sys::eventfd_signal(self.eventfd.as_raw_fd());
        }
    }

    /// Takes everything in the inbox.
    pub(crate) fn take_inbox(&self) -> Inbox {
        self.inbox_pending.store(false, Ordering::SeqCst);
        let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *inbox)
    }
}
