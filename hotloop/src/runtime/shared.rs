//! The parts of the runtime that other threads may touch: each worker's
//! inbox of wakes and spawned closures, the doorbell that says whether to
//! unpark it, its counters ([`WorkerShared`]); and what the whole runtime
//! shares ([`RuntimeShared`]: every worker's half, the blocking pool),
//! which a worker's context holds and a `Handle` wraps.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::blocking::BlockingPool;
use super::key::TaskKey;
use crate::driver::Unpark;
use crate::loom::{fence, AtomicBool};
use crate::stats::{DriverInfo, WorkerStats};

/// A closure sent to a worker to run there (usually one that spawns a task).
pub(crate) type Runnable = Box<dyn FnOnce() + Send>;

/// What other threads have left for a worker.
#[derive(Default)]
pub(crate) struct Inbox {
    pub(crate) wakes: Vec<TaskKey>,
    pub(crate) runnables: Vec<Runnable>,
    pub(crate) shutdown: bool,
}

/// The handshake that lets a worker block in its poller without missing a
/// message from another thread.
///
/// The worker sets `sleeping` and then checks `pending`; a sender sets
/// `pending` and then swaps `sleeping`. A sequentially consistent fence
/// between each side's store and its load (Dekker's pattern) makes at least
/// one of them see the other's store: either the worker does not block, or
/// the sender unparks it (the loom test below checks every interleaving;
/// loom models the fences, while it weakens SeqCst accesses alone to
/// acquire/release).
#[derive(Debug, Default)]
pub(crate) struct Doorbell {
    /// Set by the worker just before it may block in the poller.
    sleeping: AtomicBool,
    /// Set when the inbox has something, so the worker checks it without locking.
    pending: AtomicBool,
}

impl Doorbell {
    /// Worker: about to block. False if a message came in meanwhile (then
    /// it must not block).
    pub(crate) fn announce_sleep(&self) -> bool {
        self.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.pending.load(Ordering::Relaxed) {
            self.sleeping.store(false, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Any thread: true while the worker may be sleeping in its poller.
    pub(crate) fn is_asleep(&self) -> bool {
        self.sleeping.load(Ordering::Relaxed)
    }

    /// Worker: back from the poller.
    pub(crate) fn awake(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }

    /// Worker: true if a message is waiting.
    pub(crate) fn is_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Worker: about to take the inbox.
    pub(crate) fn clear(&self) {
        self.pending.store(false, Ordering::SeqCst);
    }

    /// Sender: after queuing a message. True if the worker may be blocked
    /// and must be unparked.
    pub(crate) fn ring(&self) -> bool {
        self.pending.store(true, Ordering::Release);
        fence(Ordering::SeqCst);
        self.sleeping.swap(false, Ordering::AcqRel)
    }
}

/// What every thread of one runtime shares: the state behind its `Handle`.
pub(crate) struct RuntimeShared {
    pub(crate) workers: Vec<Arc<WorkerShared>>,
    /// The context of the thread that runs `block_on`.
    pub(crate) main: Arc<WorkerShared>,
    pub(crate) info: Mutex<DriverInfo>,
    /// Threads for `spawn_blocking`, shared by every worker.
    pub(crate) blocking: BlockingPool,
    /// The next worker `Handle::spawn` picks (round-robin).
    pub(super) next_worker: AtomicUsize,
    /// How many worker threads have ended, for a shutdown with a bound.
    pub(crate) exits: WorkerExits,
}

impl RuntimeShared {
    pub(crate) fn new(
        workers: Vec<Arc<WorkerShared>>,
        main: Arc<WorkerShared>,
        blocking: BlockingPool,
    ) -> Self {
        RuntimeShared {
            workers,
            main,
            info: Mutex::new(DriverInfo::default()),
            blocking,
            next_worker: AtomicUsize::new(0),
            exits: WorkerExits::default(),
        }
    }
}

/// Counts the worker threads that have ended, so that a shutdown with a
/// bound (`Runtime::shutdown_timeout`) waits for them no longer than it:
/// a thread cannot be joined with a timeout.
#[derive(Default)]
pub(crate) struct WorkerExits {
    ended: Mutex<usize>,
    changed: Condvar,
}

impl WorkerExits {
    /// A worker thread: it has ended (nothing of it runs after this but
    /// the thread's own exit).
    pub(crate) fn ended(&self) {
        *self.ended.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.changed.notify_all();
    }

    /// Waits until `workers` threads have ended, for at most `bound`.
    /// Returns true if they have.
    pub(crate) fn wait(&self, workers: usize, bound: Duration) -> bool {
        let ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        let (ended, _) = self
            .changed
            .wait_timeout_while(ended, bound, |ended| *ended < workers)
            .unwrap_or_else(|e| e.into_inner());
        *ended >= workers
    }
}

/// The thread-safe half of a worker.
pub(crate) struct WorkerShared {
    pub(crate) id: usize,
    pub(crate) inbox: Mutex<Inbox>,
    pub(crate) doorbell: Doorbell,
    /// Ends the driver's wait (an eventfd the driver polls).
    pub(crate) unpark: Arc<Unpark>,
    /// Set when the worker's thread stopped for good (its loop failed):
    /// what is sent to it from then on is dropped at once, so whoever
    /// waits for it gets `JoinError::Cancelled` instead of waiting forever.
    pub(crate) dead: std::sync::atomic::AtomicBool,
    pub(crate) stats: Arc<WorkerStats>,
    /// The load other workers read to decide where a connection goes.
    pub(crate) load: super::load::WorkerLoad,
}

impl WorkerShared {
    pub(crate) fn new(id: usize) -> std::io::Result<Arc<Self>> {
        Ok(Arc::new(WorkerShared {
            id,
            inbox: Mutex::new(Inbox::default()),
            doorbell: Doorbell::default(),
            unpark: Arc::new(Unpark::new()?),
            dead: std::sync::atomic::AtomicBool::new(false),
            stats: Arc::new(WorkerStats::default()),
            load: super::load::WorkerLoad::default(),
        }))
    }

    /// Queues a wake from another thread.
    pub(crate) fn push_wake(&self, key: TaskKey) {
        self.with_inbox(|inbox| inbox.wakes.push(key));
    }

    /// Queues a closure to run on this worker (dropped at once if the
    /// worker is dead).
    pub(crate) fn push_runnable(&self, f: Runnable) {
        let mut f = Some(f);
        self.with_inbox(|inbox| inbox.runnables.extend(f.take()));
        // Dropped outside the lock: its destructor may finish a join slot.
        drop(f);
    }

    /// Asks the worker to stop.
    pub(crate) fn push_shutdown(&self) {
        self.with_inbox(|inbox| inbox.shutdown = true);
    }

    fn with_inbox(&self, f: impl FnOnce(&mut Inbox)) {
        {
            let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
            if self.dead.load(Ordering::Acquire) {
                return;
            }
            f(&mut inbox);
        }
        if self.doorbell.ring() {
            self.unpark.unpark();
        }
    }

    /// Takes everything in the inbox.
    pub(crate) fn take_inbox(&self) -> Inbox {
        self.doorbell.clear();
        let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *inbox)
    }

    /// The worker's busy share now, in per-mille (see `load.rs`).
    pub(crate) fn busy_at(&self, now_ns: u64) -> u32 {
        if self.dead.load(Ordering::Acquire) {
            return super::load::BUSY_FULL_PERMILLE;
        }
        self.load.busy_at(now_ns, self.doorbell.is_asleep())
    }

    /// Marks the worker dead and hands back what was left for it.
    pub(crate) fn die(&self) -> Inbox {
        let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
        self.dead.store(true, Ordering::Release);
        std::mem::take(&mut *inbox)
    }
}

#[cfg(all(test, hotloop_loom))]
mod loom_tests {
    use super::Doorbell;
    use loom::sync::atomic::{AtomicBool, Ordering};
    use loom::sync::Arc;

    /// A worker that decides to block is always unparked by a sender that
    /// queued a message at the same time: no interleaving loses the wake.
    #[test]
    fn no_lost_wakeup() {
        loom::model(|| {
            let bell = Arc::new(Doorbell::default());
            let unparked = Arc::new(AtomicBool::new(false));
            let sender = {
                let (bell, unparked) = (bell.clone(), unparked.clone());
                loom::thread::spawn(move || {
                    if bell.ring() {
                        unparked.store(true, Ordering::SeqCst);
                    }
                })
            };
            let blocks = bell.announce_sleep();
            sender.join().unwrap();
            if blocks {
                assert!(unparked.load(Ordering::SeqCst), "the worker blocks and nobody unparks it");
            } else {
                assert!(bell.is_pending(), "the worker stayed awake for a message it can see");
            }
        });
    }
}
