//! The runtime: a builder, one worker per core, and the loop each runs.
//!
//! Each worker owns a thread. [`Runtime::block_on`] runs its future on the
//! calling thread, in a context of its own (with its own driver and
//! wheel), while the workers run what is spawned on them. A worker owns its tasks, its I/O driver and its
//! timer wheel outright: nothing on the hot path is shared or locked. Other
//! threads reach a worker only through its inbox and eventfd
//! ([`Handle`]).
//!
//! # Layout
//! Imports among these files run one way: each names only the files
//! before it in this list, and none names this file's items
//! (`hotloop/tests/layering.rs` checks it).
//! 1. `key`: a task's identity (`TaskKey`), which nearly every file names.
//! 2. `load`: the load a worker publishes for the others.
//! 3. `tokio_time`: tokio's timer, entered by every worker (feature
//!    `tokio-time`; `tokio_time_off.rs` without it).
//! 4. `join_slot`: the slot a task's output waits in, `JoinError`,
//!    `RemoteJoinHandle`.
//! 5. `blocking`: the blocking pool.
//! 6. `config`: the builder's settings.
//! 7. `shared`: what other threads may touch: each worker's inbox and
//!    doorbell, and `RuntimeShared` (every worker's half, the blocking
//!    pool), which the context holds and [`Handle`] wraps.
//! 8. `task`: the task slab and the waker's state.
//! 9. `context`: the per-worker state and its thread-local, and the waker's
//!    wake (a wake on the task's own worker goes onto the run queue here).
//! 10. `worker`: the loop.
//! 11. `join`: `spawn`, [`JoinHandle`], and a task's side of its join slot,
//!     which takes the task's panic from the context.
//! 12. `handle`: [`Handle`] and [`spawn_blocking`], which reach the
//!     current worker and spawn through `join`.
//! 13. `join_set`: [`JoinSet`].
//! 14. `current`: what the rest of the crate sees of the current worker.
//!
//! Then this file: the builder and [`Runtime`].

mod blocking;
mod config;
mod context;
pub(crate) mod current;
mod handle;
mod join;
mod join_set;
mod join_slot;
mod key;
pub(crate) mod load;
pub(crate) mod shared;
mod task;
#[cfg(feature = "tokio-time")]
mod tokio_time;
#[cfg(not(feature = "tokio-time"))]
#[path = "tokio_time_off.rs"]
mod tokio_time;
mod worker;

pub(crate) use config::Config;
pub use config::{BusyPoll, DriverKind, KernelBusyPoll, Registration};
pub use handle::{spawn_blocking, Handle};
pub use join::{run_local, spawn, wake_all, yield_now, AbortHandle, JoinHandle, RunLocal};
pub(crate) use join::{run_now_if_alone, spawn_detached, spawn_detached_with, yield_to_driver};
// The hyper executor's tasks report nothing back (`hyper/rt.rs`).
#[cfg(feature = "hyper")]
pub(crate) use join::OnDone;
pub use join_set::JoinSet;
pub use join_slot::{JoinError, RemoteJoinHandle};
pub(crate) use key::TaskKey;
pub(crate) use shared::WorkerShared;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::pin;
use std::rc::Rc;
use std::sync::{mpsc, Arc};

use context::{Clock, Context};
use task::TaskSlab;

use crate::driver::Driver;
use crate::stats::{DriverInfo, StatsSnapshot};
use crate::sys;
use crate::time::wheel::TimerWheel;

/// Configures and builds a [`Runtime`].
#[derive(Debug, Clone, Default)]
pub struct Builder {
    config: Config,
}

impl Builder {
    /// The number of workers (default: the available cores).
    pub fn workers(mut self, n: usize) -> Self {
        self.config.workers = n.max(1);
        self
    }

    /// Pins worker `i` to CPU `i` (modulo the CPU count). Off by default.
    pub fn pin_cpus(mut self, pin: bool) -> Self {
        self.config.pin_cpus = pin;
        self
    }

    /// The I/O driver (default: [`DriverKind::Auto`]).
    pub fn driver(mut self, driver: DriverKind) -> Self {
        self.config.driver = driver;
        self
    }

    /// Whether the poller spins instead of sleeping (default: off).
    pub fn busy_poll(mut self, mode: BusyPoll) -> Self {
        self.config.busy_poll = mode;
        self
    }

    /// Asks the kernel to busy-poll device queues inside the poller
    /// (`EPIOCSPARAMS` on epoll, NAPI registration on io_uring) where it
    /// allows. Whether it took effect is reported in the stats.
    pub fn kernel_busy_poll(mut self, params: Option<KernelBusyPoll>) -> Self {
        self.config.kernel_busy_poll = params;
        self
    }

    /// How many task polls a worker makes between two polls of its driver
    /// (default 61), so that a busy task set cannot starve I/O.
    pub fn event_interval(mut self, polls: u32) -> Self {
        self.config.event_interval = polls.max(1);
        self
    }

    /// When sockets are registered with epoll (default: lazily).
    pub fn registration(mut self, mode: Registration) -> Self {
        self.config.registration = mode;
        self
    }

    /// The most I/O events handled per poll of the driver (default 1024).
    pub fn events_per_poll_max(mut self, n: usize) -> Self {
        self.config.events_per_poll_max = n.max(1);
        self
    }

    /// Submission queue entries of each io_uring (default 1024).
    pub fn uring_entries(mut self, n: u32) -> Self {
        self.config.uring_entries = n.max(8);
        self
    }

    /// The most threads the blocking pool ([`spawn_blocking`]) runs at once
    /// (default 512). Threads start only when work arrives.
    pub fn max_blocking_threads(mut self, n: usize) -> Self {
        self.config.max_blocking_threads = n.max(1);
        self
    }

    /// How long an idle blocking-pool thread waits for work before it
    /// exits (default 10 s).
    pub fn blocking_keep_alive(mut self, idle: std::time::Duration) -> Self {
        self.config.blocking_keep_alive = idle;
        self
    }

    /// How long dropping the runtime (or [`Runtime::shutdown`]) waits for
    /// the [`spawn_blocking`] jobs already running to return (default
    /// 10 s), so a job writing a file is not cut when `main` returns and a
    /// stuck one does not hang the drop for good. Jobs not yet started are
    /// cancelled without waiting. [`Runtime::shutdown_timeout`] and
    /// [`Runtime::shutdown_background`] choose another bound for one
    /// shutdown. A runtime dropped by a task (of another runtime) does not
    /// wait: the task's worker would stall every other task it runs.
    pub fn blocking_shutdown_timeout(mut self, bound: std::time::Duration) -> Self {
        self.config.blocking_shutdown_timeout = bound;
        self
    }

    /// Starts every worker now on a thread of its own, and returns once
    /// each has its driver. [`Runtime::block_on`] runs on the calling thread
    /// instead, in a context of its own (its own driver and wheel).
    pub fn build(self) -> io::Result<Runtime> {
        let config = self.config;
        let shared: Vec<Arc<WorkerShared>> =
            (0..config.workers).map(WorkerShared::new).collect::<io::Result<_>>()?;
        // The caller's context is numbered after the workers.
        let main_shared = WorkerShared::new(config.workers)?;
        let blocking =
            blocking::BlockingPool::new(config.max_blocking_threads, config.blocking_keep_alive);
        let handle = Handle::new(shared.clone(), main_shared.clone(), blocking);

        let (ready_tx, ready_rx) = mpsc::channel::<(usize, io::Result<DriverInfo>)>();
        let mut threads = Vec::new();
        for worker in shared.iter().cloned() {
            let config = config.clone();
            let handle = handle.clone();
            let ready = ready_tx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("hotloop-worker-{}", worker.id))
                .spawn(move || worker_thread(worker, config, handle, ready));
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    stop_threads(&shared, threads);
                    return Err(e);
                }
            }
        }
        drop(ready_tx);

        let main_config = Config { pin_cpus: false, busy_poll: BusyPoll::Off, ..config.clone() };
        let main_cx = Context::new(main_shared, main_config, handle.clone());
        let mut first_error =
            main_cx.as_ref().err().map(|e| io::Error::new(e.kind(), e.to_string()));
        let mut info = DriverInfo::default();
        for _ in 0..config.workers {
            match ready_rx.recv() {
                Ok((0, Ok(i))) => info = i,
                Ok((_, Ok(_))) => {}
                Ok((_, Err(e))) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error
                        .get_or_insert(io::Error::other("a worker thread exited during start-up"));
                }
            }
        }
        if let Some(e) = first_error {
            stop_threads(&shared, threads);
            return Err(e);
        }
        let main_cx = main_cx?;
        crate::log::info(format_args!(
            "{} workers on {} ({}), busy-poll {}",
            config.workers, info.driver, info.reason, info.busy_poll
        ));
        *handle.inner.info.lock().unwrap_or_else(|e| e.into_inner()) = info;
        let blocking_wait = config.blocking_shutdown_timeout;
        Ok(Runtime { main: Some(main_cx), threads, handle, blocking_wait })
    }
}

fn stop_threads(shared: &[Arc<WorkerShared>], threads: Vec<std::thread::JoinHandle<()>>) {
    for s in shared {
        s.push_shutdown();
    }
    for t in threads {
        let _ = t.join();
    }
}

/// Counts the worker's thread as ended when dropped, last thing on it
/// (after its context and every task are gone), unwinding or not.
struct ExitNotice(Arc<shared::RuntimeShared>);

impl Drop for ExitNotice {
    fn drop(&mut self) {
        self.0.exits.ended();
    }
}

fn worker_thread(
    shared: Arc<WorkerShared>,
    config: Config,
    handle: Handle,
    ready: mpsc::Sender<(usize, io::Result<DriverInfo>)>,
) {
    // Made first, so dropped last.
    let _exit = ExitNotice(handle.inner.clone());
    let id = shared.id;
    let cx = match Context::new(shared.clone(), config, handle) {
        Ok(cx) => cx,
        Err(e) => {
            let _ = ready.send((id, Err(e)));
            shared.die();
            return;
        }
    };
    let _ = ready.send((id, Ok(cx.driver_info.clone())));
    drop(ready);
    let guard = context::enter(cx.clone());
    // Panics inside tasks never get here; this catches a failure of the
    // loop itself (its driver failing), which ends the worker.
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        worker::run::<std::future::Pending<()>>(&cx, None)
    }));
    if run.is_err() {
        crate::log::warn(format_args!(
            "worker {id} stopped after a failure of its loop; its tasks are cancelled"
        ));
    }
    shutdown_tasks(&cx);
    // Whatever arrives from now on is dropped at once, so every waiter
    // (a remote join handle, `block_on_all`) gets `JoinError::Cancelled`.
    drop(shared.die());
    drop(guard);
}

/// Drops every task while the context is still entered, so their
/// destructors can reach the driver to close their descriptors. A
/// destructor that panics is reported and the rest are still dropped.
fn shutdown_tasks(cx: &Context) {
    loop {
        let tasks = cx.tasks.borrow_mut().drain();
        if tasks.is_empty() {
            break;
        }
        for task in tasks {
            worker::drop_guarded(task);
        }
    }
    cx.run_queue.borrow_mut().clear();
    cx.after_poll.borrow_mut().clear();
}

impl Context {
    fn new(shared: Arc<WorkerShared>, config: Config, handle: Handle) -> io::Result<Rc<Context>> {
        let id = shared.id;
        if config.pin_cpus {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            sys::pin_to_cpu(id % cpus)?;
        }
        let (driver, mut driver_info) =
            Driver::new(&config.driver_config(), shared.unpark.clone(), shared.stats.clone())?;
        driver_info.busy_poll = config.busy_poll.to_string();
        // Only a fallback is worth a warning; a driver asked for by name is
        // reported in the stats and the start-up info event.
        if driver_info.fallback && id == 0 {
            crate::log::warn(format_args!("{}", driver_info.reason));
        }
        Ok(Rc::new(Context {
            id,
            uid: context::NEXT_CONTEXT_UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            shared,
            config,
            runtime: handle.inner,
            tasks: RefCell::new(TaskSlab::default()),
            run_queue: RefCell::new(VecDeque::with_capacity(256)),
            driver,
            driver_info,
            timers: RefCell::new(TimerWheel::new()),
            clock: Clock::new(),
            turn: Cell::new(0),
            polls_left: Cell::new(0),
            after_poll: RefCell::new(Vec::new()),
            panic_payload: RefCell::new(None),
            load_meter: load::LoadMeter::default(),
        }))
    }
}

/// Ok if the io_uring driver can run on this kernel, else a sentence
/// saying why not (the same probe `DriverKind::Auto` makes).
pub fn uring_available() -> Result<(), String> {
    crate::driver::probe::uring_support()
}

/// A thread-per-core runtime.
///
/// Dropping it stops every worker, drops every task and closes every
/// descriptor the runtime opened, then waits for the [`spawn_blocking`]
/// jobs already running (at most [`Builder::blocking_shutdown_timeout`]).
pub struct Runtime {
    main: Option<Rc<Context>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    handle: Handle,
    /// How long the shutdown waits for running blocking jobs.
    blocking_wait: std::time::Duration,
}

impl Runtime {
    /// A builder with the defaults.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// A runtime with the defaults.
    pub fn new() -> io::Result<Runtime> {
        Builder::default().build()
    }

    /// A `Send` handle to the workers.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// A snapshot of every worker's counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.handle.stats()
    }

    /// Runs `future` to completion on the calling thread, while the workers
    /// run whatever was spawned on them. Tasks spawned from inside `future`
    /// with [`spawn`] run on the calling thread too.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        let cx = self.main.as_ref().expect("runtime is shutting down").clone();
        let guard = context::enter(cx.clone());
        // The future (finished or not) is dropped inside the context, so
        // what it holds (a timer, a socket) is given back to this worker
        // at once rather than left for the next `block_on`.
        let out = {
            let future = pin!(future);
            worker::run(&cx, Some(future))
        };
        drop(guard);
        match out {
            Ok(v) => v,
            Err(worker::ShutdownRequested) => {
                unreachable!("the caller's context is never asked to shut down")
            }
        }
    }

    /// Runs the future that `make_future(worker)` returns on every worker at
    /// once and waits for all of them: the usual shape of a thread-per-core
    /// server. Results come back in worker order.
    pub fn block_on_all<F, Fut>(&self, make_future: F) -> Vec<Result<Fut::Output, JoinError>>
    where
        F: Fn(usize) -> Fut + Send + Sync + Clone + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        let remote: Vec<_> = (0..self.handle.workers())
            .map(|w| {
                let f = make_future.clone();
                self.handle.spawn_on(w, move || f(w))
            })
            .collect();
        self.block_on(async move {
            let mut out = Vec::with_capacity(remote.len());
            for r in remote {
                out.push(r.await);
            }
            out
        })
    }

    /// Stops the workers, drops every task and closes every descriptor,
    /// then waits for the [`spawn_blocking`] jobs already running, at most
    /// [`Builder::blocking_shutdown_timeout`]; jobs not yet started are
    /// cancelled. Tasks are dropped, not completed: stop them first for a
    /// graceful end. It waits for every worker to stop, however long a
    /// task holds one's thread. Dropping the runtime does the same.
    pub fn shutdown(mut self) {
        let bound = self.blocking_wait;
        self.stop(None, bound);
    }

    /// As [`Runtime::shutdown`], waiting at most `bound` in all for the
    /// workers to stop and the blocking jobs already running to return
    /// (tokio's `shutdown_timeout`). A worker whose thread a task still
    /// holds by then is left to stop on its own (it drops its tasks when
    /// the task lets go).
    pub fn shutdown_timeout(mut self, bound: std::time::Duration) {
        self.stop(Some(bound), bound);
    }

    /// As [`Runtime::shutdown`], without waiting for the workers to stop
    /// or for the blocking jobs already running: the workers drop their
    /// tasks on their own threads, and the jobs finish on theirs, which may
    /// be cut when the process exits (tokio's `shutdown_background`).
    pub fn shutdown_background(mut self) {
        self.stop(Some(std::time::Duration::ZERO), std::time::Duration::ZERO);
    }

    /// Stops everything, waiting at most `workers_wait` for the workers
    /// (`None`: until they stop) and then at most `blocking_wait` (less
    /// the time the workers took, with a bound) for the blocking jobs
    /// already running. Runs once: a later call (the drop after a
    /// shutdown) finds nothing left.
    fn stop(
        &mut self,
        workers_wait: Option<std::time::Duration>,
        blocking_wait: std::time::Duration,
    ) {
        let started = std::time::Instant::now();
        let threads = std::mem::take(&mut self.threads);
        match workers_wait {
            None => stop_threads(&self.handle.inner.workers, threads),
            Some(bound) => {
                for s in &self.handle.inner.workers {
                    s.push_shutdown();
                }
                if self.handle.inner.exits.wait(self.handle.inner.workers.len(), bound) {
                    for t in threads {
                        let _ = t.join();
                    }
                } else {
                    // Detached: a stray worker owns what it touches (its
                    // context, and the runtime's shared state through its
                    // own `Arc`), so nothing is freed under it.
                    drop(threads);
                    if !bound.is_zero() {
                        crate::log::warn(format_args!(
                            "a worker still running {} ms after the runtime's shutdown (a task \
                             holds its thread); left to stop on its own",
                            bound.as_millis()
                        ));
                    }
                }
            }
        }
        let blocking_wait = match workers_wait {
            Some(_) => blocking_wait.saturating_sub(started.elapsed()),
            None => blocking_wait,
        };
        self.handle.inner.blocking.shutdown();
        let Some(cx) = self.main.take() else { return };
        // Over whatever context this thread has: a task of another
        // runtime may own this one and drop it, even while unwinding.
        let guard = context::enter_over(cx.clone());
        shutdown_tasks(&cx);
        drop(guard);
        // Sockets the caller still holds keep the driver alive; they
        // find it no longer entered and fail rather than wait.
        // Last, as tokio's drop: the tasks that awaited the jobs are gone,
        // and a job is cut only when the process exits.
        if !self.handle.inner.blocking.wait_running(blocking_wait) && !blocking_wait.is_zero() {
            crate::log::warn(format_args!(
                "blocking jobs still running {} ms after the runtime's shutdown; not waited for",
                blocking_wait.as_millis()
            ));
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Dropped by a task (of another runtime): its worker is not held
        // for the blocking jobs, which would stall every task it runs
        // (tokio refuses such a drop with a panic).
        let wait =
            if current::on_worker() { std::time::Duration::ZERO } else { self.blocking_wait };
        self.stop(None, wait);
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("workers", &self.handle.workers()).finish()
    }
}
