//! The blocking pool: threads shared by a runtime's workers for work that
//! would stall a worker (file system calls, name resolution, CPU-heavy
//! code, foreign libraries that block).
//!
//! [`spawn_blocking`](crate::spawn_blocking) (in `handle.rs`, which
//! reaches the pool through the current worker) queues a closure; a pool
//! thread runs it and hands the result to the awaiting task through the
//! same slot and waker as a cross-thread [`RemoteJoinHandle`]: the stored
//! `Waker` is the task's, and waking it from the pool thread goes through
//! the worker's inbox and eventfd like any other remote wake. A worker
//! never waits for the pool.
//!
//! # Implementation notes
//! - Threads start on demand, up to `max_blocking_threads`, and exit after
//!   `blocking_keep_alive` without work. The queue itself is unbounded, as
//!   in tokio: a job waits when every thread is busy.
//! - A queued job's handle resolves to `JoinError::Cancelled` if the
//!   runtime shuts down before a thread takes it. A running job is never
//!   interrupted; its thread exits when the job returns. Shutdown waits
//!   for the running jobs (a job writing a file is not cut when `main`
//!   returns, as with tokio), but at most a bound
//!   (`Builder::blocking_shutdown_timeout`, `Runtime::shutdown_timeout`,
//!   none with `Runtime::shutdown_background`), so a stuck call cannot
//!   hang `Runtime::drop` for good.
//! - Panics inside a job are caught and returned as `JoinError::Panicked`.
//!   A panic in a destructor the pool thread runs after (a result whose
//!   handle was dropped is dropped there) is caught too: the thread goes
//!   on, and its counts stay right even if it unwinds.
//! - A worker whose paused clock waits for the pool's jobs (see
//!   `time/paused.rs`) may have nothing else to wake it when the last one
//!   ends (a job whose handle was dropped, one awaited on another worker,
//!   one queued from outside the runtime): it leaves its driver's unpark
//!   with the pool before it blocks, and the job that ends the count
//!   unparks it, so the clock moves on (tokio's pool likewise unparks its
//!   driver when a blocking task ends).

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::join_slot::{Completion, JoinError, JoinSlot, RemoteJoinHandle};
use crate::driver::Unpark;
use crate::stats::BlockingCounters;

/// The default upper bound on blocking threads (tokio's default).
pub(crate) const BLOCKING_THREADS_MAX_DEFAULT: usize = 512;
/// The default time an idle blocking thread waits for work before exiting.
pub(crate) const BLOCKING_KEEP_ALIVE_DEFAULT: Duration = Duration::from_secs(10);
/// The default bound on the wait of a runtime's shutdown for the blocking
/// jobs already running.
pub(crate) const BLOCKING_SHUTDOWN_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// A queued closure; it updates the counters itself, before it hands its
/// result over, so a caller that sees the result sees the counters too.
type Job = Box<dyn FnOnce(&Inner) + Send>;

/// A cloneable handle to one runtime's blocking pool.
#[derive(Clone)]
pub(crate) struct BlockingPool {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    work: Condvar,
    /// Notified when the last running job returns after shutdown.
    finished: Condvar,
    max_threads: usize,
    keep_alive: Duration,
    stats: Stats,
    /// The drivers of the workers whose paused clock waits for the jobs
    /// out to end (each once); unparked and cleared when none is left.
    watchers: Mutex<Vec<Arc<Unpark>>>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    threads: usize,
    /// Threads waiting for work that no one has notified yet.
    idle: usize,
    /// Notifications sent to idle threads and not yet consumed.
    notified: usize,
    /// Jobs a thread took and has not returned from.
    running: usize,
    shutdown: bool,
}

/// Written by whichever thread changes them (so they are atomics with
/// `fetch_add`, unlike the per-worker counters).
#[derive(Default)]
struct Stats {
    /// Jobs whose result has not reached its handle yet: queued, running,
    /// or handing the result over. Paused time waits while any is (see
    /// [`BlockingPool::has_jobs`]); the other counts are the stats'.
    undelivered: AtomicU64,
    queued: AtomicU64,
    running: AtomicU64,
    threads: AtomicU64,
    completed: AtomicU64,
    threads_started: AtomicU64,
}

impl BlockingPool {
    pub(crate) fn new(max_threads: usize, keep_alive: Duration) -> Self {
        BlockingPool {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                work: Condvar::new(),
                finished: Condvar::new(),
                max_threads: max_threads.max(1),
                keep_alive,
                stats: Stats::default(),
                watchers: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Queues `f`; its result arrives through the returned handle.
    pub(crate) fn spawn<F, R>(&self, f: F) -> RemoteJoinHandle<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let slot = JoinSlot::new(None, None);
        // Dropped unrun (at shutdown), the completion reports `Cancelled`.
        let completion = Completion(slot.clone());
        let job: Job = Box::new(move |pool: &Inner| {
            let stats = &pool.stats;
            // Aborted while it waited in the queue: not run, as tokio skips
            // a blocking job aborted before it starts.
            let out = if completion.0.abort_requested() {
                Err(JoinError::Cancelled)
            } else {
                catch_unwind(AssertUnwindSafe(f)).map_err(JoinError::Panicked)
            };
            stats.running.fetch_sub(1, Relaxed);
            stats.completed.fetch_add(1, Relaxed);
            completion.0.finish(out);
            // After the result (and the wake it sends through the worker's
            // inbox): a paused worker that reads no job out then reads the wake.
            pool.delivered(1);
        });
        if let Err(job) = self.push(job) {
            drop(job); // the runtime is shutting down: the handle says Cancelled
        }
        RemoteJoinHandle { slot }
    }

    fn push(&self, job: Job) -> Result<(), Job> {
        let mut st = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.shutdown {
            return Err(job);
        }
        st.queue.push_back(job);
        self.inner.stats.undelivered.fetch_add(1, Relaxed);
        self.inner.stats.queued.fetch_add(1, Relaxed);
        if st.idle > 0 {
            st.idle -= 1;
            st.notified += 1;
            self.inner.work.notify_one();
        } else if st.threads < self.inner.max_threads {
            let inner = self.inner.clone();
            let spawned = std::thread::Builder::new()
                .name("hotloop-blocking".into())
                .spawn(move || inner.run());
            // Without a new thread the job waits for a busy one to finish
            // (there is at least one unless none could ever be started).
            if spawned.is_ok() {
                st.threads += 1;
                self.inner.stats.threads.fetch_add(1, Relaxed);
                self.inner.stats.threads_started.fetch_add(1, Relaxed);
            } else if st.threads == 0 {
                let job = st.queue.pop_back().expect("just pushed");
                self.inner.stats.queued.fetch_sub(1, Relaxed);
                self.inner.delivered(1);
                return Err(job);
            }
        }
        Ok(())
    }

    /// Cancels queued jobs and lets idle threads exit; running jobs finish
    /// on their own threads.
    pub(crate) fn shutdown(&self) {
        let dropped = {
            let mut st = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
            st.shutdown = true;
            self.inner.stats.queued.fetch_sub(st.queue.len() as u64, Relaxed);
            self.inner.delivered(st.queue.len() as u64);
            std::mem::take(&mut st.queue)
        };
        self.inner.work.notify_all();
        // Their handles learn `Cancelled` as the jobs drop, outside the lock.
        drop(dropped);
    }

    /// After [`BlockingPool::shutdown`]: waits until no job is running, for
    /// at most `bound`. Returns true if none is.
    pub(crate) fn wait_running(&self, bound: Duration) -> bool {
        let st = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        let (st, _) = self
            .inner
            .finished
            .wait_timeout_while(st, bound, |st| st.running > 0)
            .unwrap_or_else(|e| e.into_inner());
        st.running == 0
    }

    /// True while a job is queued or running, or handing its result over:
    /// paused time does not jump ahead while one may still wake a task.
    ///
    /// A job leaves the count only after its result, and the wake that
    /// goes with it, were handed over (`Release`, read here with
    /// `Acquire`), so a worker that reads "no job" reads the wake in its
    /// inbox afterwards: it never finds both empty in between.
    pub(crate) fn has_jobs(&self) -> bool {
        self.inner.stats.undelivered.load(Acquire) > 0
    }

    /// As [`BlockingPool::has_jobs`], for a worker about to block while
    /// its paused clock waits for the jobs: if one is out, `unpark` is
    /// called when the last one ends, so the worker looks again even if
    /// no result of theirs comes its way.
    ///
    /// The count is read under the lock the ending job takes after its
    /// decrement: either the job finds the watcher there, or the count
    /// read here is already the decremented one.
    pub(crate) fn watch_jobs(&self, unpark: &Arc<Unpark>) -> bool {
        let mut watchers = self.inner.watchers.lock().unwrap_or_else(|e| e.into_inner());
        if !self.has_jobs() {
            return false;
        }
        if !watchers.iter().any(|w| Arc::ptr_eq(w, unpark)) {
            watchers.push(unpark.clone());
        }
        true
    }

    /// The pool's counters now.
    pub(crate) fn counters(&self) -> BlockingCounters {
        let s = &self.inner.stats;
        BlockingCounters {
            queued: s.queued.load(Relaxed),
            running: s.running.load(Relaxed),
            threads: s.threads.load(Relaxed),
            threads_max: self.inner.max_threads as u64,
            threads_started: s.threads_started.load(Relaxed),
            completed: s.completed.load(Relaxed),
        }
    }
}

impl Inner {
    /// Takes `n` jobs off the undelivered count; if that leaves none,
    /// unparks the workers waiting for it (see [`BlockingPool::watch_jobs`]).
    fn delivered(&self, n: u64) {
        if n == 0 || self.stats.undelivered.fetch_sub(n, Release) != n {
            return;
        }
        let watchers =
            std::mem::take(&mut *self.watchers.lock().unwrap_or_else(|e| e.into_inner()));
        for w in watchers {
            w.unpark();
        }
    }

    /// A pool thread: take jobs until none comes for `keep_alive`, or shutdown.
    fn run(self: Arc<Self>) {
        // Declared before the lock's guard, so dropped after it.
        let mut thread = ThreadCounted { pool: &self, counted: true };
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(job) = st.queue.pop_front() {
                self.stats.queued.fetch_sub(1, Relaxed);
                self.stats.running.fetch_add(1, Relaxed);
                st.running += 1;
                drop(st);
                {
                    let _running = JobCounted(&self);
                    // The job catches its closure's panic; what it does not
                    // is a destructor that runs here: the result's, when its
                    // handle was dropped (this job holds its last reference),
                    // or the waker's. The thread carries on either way.
                    if catch_unwind(AssertUnwindSafe(|| job(&self))).is_err() {
                        crate::log::warn(format_args!(
                            "a blocking job's result or waker panicked when dropped; the pool \
                             thread carries on"
                        ));
                    }
                }
                st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            if st.shutdown {
                break;
            }
            st.idle += 1;
            let (guard, waited) =
                self.work.wait_timeout(st, self.keep_alive).unwrap_or_else(|e| e.into_inner());
            st = guard;
            if st.notified > 0 {
                // Whoever notified already took us off the idle count.
                st.notified -= 1;
            } else {
                st.idle -= 1;
                if waited.timed_out() && st.queue.is_empty() {
                    break;
                }
            }
        }
        // Under the lock that saw nothing to do: a job queued after it
        // finds this thread gone and starts another.
        st.threads -= 1;
        self.stats.threads.fetch_sub(1, Relaxed);
        thread.counted = false;
    }
}

/// A running job's place in the counts, given back when it returns, also
/// by unwinding: a count never taken back made shutdown wait its whole
/// bound for a job long gone.
struct JobCounted<'a>(&'a Inner);

impl Drop for JobCounted<'_> {
    fn drop(&mut self) {
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        st.running -= 1;
        if st.running == 0 && st.shutdown {
            self.0.finished.notify_all();
        }
    }
}

/// A pool thread's place in the counts, given back if the thread unwinds
/// (its normal end gives it back itself): a thread counted after it died
/// kept the pool from starting another, and at `max_blocking_threads`
/// such deaths no queued job ran.
struct ThreadCounted<'a> {
    pool: &'a Inner,
    /// False once the thread gave its place back.
    counted: bool,
}

impl Drop for ThreadCounted<'_> {
    fn drop(&mut self) {
        if self.counted {
            let mut st = self.pool.state.lock().unwrap_or_else(|e| e.into_inner());
            st.threads -= 1;
            self.pool.stats.threads.fetch_sub(1, Relaxed);
        }
    }
}
