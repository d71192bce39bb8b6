//! The `Send` handle: spawn onto, wake and inspect workers from any thread;
//! and `spawn_blocking`, which reaches the blocking pool through the
//! current worker.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::blocking::BlockingPool;
use super::context;
use super::join::{abort_local, spawn_detached_with, OnDone, TaskCompletion};
use super::join_slot::{JoinError, JoinSlot, RemoteJoinHandle};
use super::shared::{RuntimeShared, WorkerShared};
use crate::stats::StatsSnapshot;

/// A cheap, cloneable, `Send` handle to a runtime's workers.
#[derive(Clone)]
pub struct Handle {
    pub(crate) inner: Arc<RuntimeShared>,
}

impl Handle {
    pub(crate) fn new(
        workers: Vec<Arc<WorkerShared>>,
        main: Arc<WorkerShared>,
        blocking: BlockingPool,
    ) -> Self {
        Handle { inner: Arc::new(RuntimeShared::new(workers, main, blocking)) }
    }

    /// The handle of the runtime whose worker is running the caller.
    ///
    /// # Panics
    /// Outside a hotloop worker.
    pub fn current() -> Handle {
        context::with(|cx| Handle { inner: cx.runtime.clone() })
    }

    /// The number of workers.
    pub fn workers(&self) -> usize {
        self.inner.workers.len()
    }

    /// Runs `make_future` on worker `worker` and spawns the future it returns
    /// there. The future itself need not be `Send`; only the closure and the
    /// output cross threads.
    ///
    /// # Panics
    /// If `worker >= self.workers()`.
    pub fn spawn_on<F, Fut>(&self, worker: usize, make_future: F) -> RemoteJoinHandle<Fut::Output>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        let slot = JoinSlot::new(None, None);
        let completion = TaskCompletion(slot.clone());
        let shared = &self.inner.workers[worker];
        // The handle's abort goes to the worker's inbox behind the spawn
        // below, so it finds the task's key there; an abort before the
        // spawn ran stops the spawn.
        let (owner, aborted) = (shared.clone(), slot.clone());
        slot.set_aborter(Box::new(move || {
            owner.push_runnable(Box::new(move || {
                if let (Some(key), Some(cx)) = (aborted.key(), context::current()) {
                    abort_local(&cx, key);
                }
            }))
        }));
        shared.push_runnable(Box::new(move || {
            if completion.0.abort_requested() {
                // Dropped unspawned: the handle says `Cancelled`.
                return;
            }
            // A closure that panics reports it through the join handle.
            let future = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(make_future)) {
                Ok(future) => future,
                Err(payload) => {
                    completion.0.finish(Err(JoinError::Panicked(payload)));
                    return;
                }
            };
            let slot = completion.0.clone();
            let key = spawn_detached_with(move || {
                OnDone::new(future, move |out| completion.0.finish(Ok(out)))
            });
            slot.set_key(key);
        }));
        RemoteJoinHandle { slot }
    }

    /// Spawns a `Send` future on the next worker, round-robin.
    pub fn spawn<F>(&self, future: F) -> RemoteJoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let worker = self.inner.next_worker.fetch_add(1, Ordering::Relaxed) % self.workers();
        self.spawn_on(worker, move || future)
    }

    /// Runs `f` on the runtime's blocking pool (see
    /// [`spawn_blocking`]); callable from any thread.
    pub fn spawn_blocking<F, R>(&self, f: F) -> RemoteJoinHandle<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        self.inner.blocking.spawn(f)
    }

    /// A snapshot of every worker's counters, and of the thread that runs
    /// `block_on` (apart from the workers').
    pub fn stats(&self) -> StatsSnapshot {
        let stats: Vec<_> = self.inner.workers.iter().map(|w| w.stats.clone()).collect();
        let info = self.inner.info.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut snapshot = StatsSnapshot::collect(&stats, &self.inner.main.stats, info);
        snapshot.blocking = self.inner.blocking.counters();
        let now = crate::sys::monotonic_ns();
        snapshot.loads = self
            .inner
            .workers
            .iter()
            .map(|w| w.load.snapshot(now, w.doorbell.is_asleep()))
            .collect();
        snapshot
    }
}

/// Runs `f` on the runtime's blocking pool and returns a handle to await
/// its result, without blocking the worker.
///
/// Use it for anything that blocks: file system calls, `getaddrinfo`,
/// compression of a large body, a synchronous client library. The closure
/// and its result cross threads, so both must be `Send`.
///
/// ```no_run
/// # hotloop::Runtime::new().unwrap().block_on(async {
/// let len = hotloop::spawn_blocking(|| std::fs::read("/etc/hostname").map(|b| b.len()))
///     .await
///     .expect("the closure did not panic")?;
/// # Ok::<(), std::io::Error>(()) });
/// ```
///
/// # Panics
/// Outside a hotloop worker (use [`Handle::spawn_blocking`](crate::Handle::spawn_blocking) there).
pub fn spawn_blocking<F, R>(f: F) -> RemoteJoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    context::with(|cx| cx.runtime.blocking.spawn(f))
}

/// So that functions taking a runtime's handle (`serve`, `serve_hyper`,
/// `serve_tls`, ...) take it by reference (`rt.handle()`) or by value (a
/// clone) alike.
impl AsRef<Handle> for Handle {
    fn as_ref(&self) -> &Handle {
        self
    }
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle").field("workers", &self.workers()).finish()
    }
}
