//! The per-worker context: everything a worker owns, reachable from the
//! tasks running on it through a thread-local that is set only while the
//! worker runs.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

use super::config::Config;
use super::handle::Handle;
use super::shared::WorkerShared;
use super::task::{TaskKey, TaskSlab};
use crate::driver::Driver;
use crate::stats::DriverInfo;
use crate::time::wheel::TimerWheel;

/// One worker's state. Only its own thread touches it.
pub(crate) struct Context {
    pub(crate) id: usize,
    /// Unique over every context of every runtime in the process: tells a
    /// timer which wheel it lives in.
    pub(crate) uid: u64,
    pub(crate) shared: Arc<WorkerShared>,
    pub(crate) config: Config,
    pub(crate) handle: Handle,
    pub(crate) tasks: RefCell<TaskSlab>,
    pub(crate) run_queue: RefCell<VecDeque<TaskKey>>,
    pub(crate) driver: RefCell<Driver>,
    /// True when `driver` is io_uring, read without borrowing it.
    pub(crate) uring: bool,
    pub(crate) driver_info: DriverInfo,
    pub(crate) timers: RefCell<TimerWheel<Waker>>,
    pub(crate) clock: Clock,
    /// Incremented once per poll of the driver: one "wakeup" of the loop.
    pub(crate) turn: Cell<u64>,
    /// Wakers to wake after the next poll of the driver.
    pub(crate) after_poll: RefCell<Vec<Waker>>,
    /// Read buffers lent to connections only while they have data.
    pub(crate) buf_pool: RefCell<crate::net::pool::BufPool>,
    /// The payload of the task that just panicked, while its future is dropped.
    pub(crate) panic_payload: RefCell<Option<Box<dyn std::any::Any + Send>>>,
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<Context>>> = const { RefCell::new(None) };
}

/// The source of [`Context::uid`].
pub(crate) static NEXT_CONTEXT_UID: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(1);

impl Context {
    /// True when this worker's driver is io_uring.
    pub(crate) fn is_uring(&self) -> bool {
        self.uring
    }
}

/// Tasks queued to run on the current worker now (0 outside a worker): how
/// far behind the loop is, for accept pacing (`net/listener.rs`).
pub(crate) fn run_queue_len() -> usize {
    try_with(|cx| cx.run_queue.borrow().len()).unwrap_or(0)
}

/// Runs `f` with the current worker's context, or returns `None` outside a worker.
pub(crate) fn try_with<R>(f: impl FnOnce(&Context) -> R) -> Option<R> {
    CURRENT.with(|c| c.borrow().as_deref().map(f))
}

/// Runs `f` with the current worker's context.
///
/// # Panics
/// Outside a hotloop worker, with a message that says how to get into one.
pub(crate) fn with<R>(f: impl FnOnce(&Context) -> R) -> R {
    try_with(f).expect(
        "this hotloop function must be called on a hotloop worker: \
         call it from inside `Runtime::block_on` or a task spawned there",
    )
}

/// Makes `cx` the current context until the guard drops.
pub(crate) fn enter(cx: Rc<Context>) -> EnterGuard {
    let previous = CURRENT.with(|c| c.borrow_mut().replace(cx));
    assert!(
        previous.is_none(),
        "a hotloop runtime cannot be started from inside another: `block_on` was called on a worker thread"
    );
    EnterGuard
}

/// Clears the current context when dropped.
pub(crate) struct EnterGuard;

impl Drop for EnterGuard {
    fn drop(&mut self) {
        // Take the Rc out before dropping it, so a destructor that looks at the
        // context finds none instead of a borrowed cell.
        let cx = CURRENT.with(|c| c.borrow_mut().take());
        drop(cx);
    }
}

/// The worker's clock: the wheel counts whole milliseconds since `base`.
pub(crate) struct Clock {
    base: Instant,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Clock { base: Instant::now() }
    }

    /// Reads the system clock.
    pub(crate) fn update(&self) -> Instant {
        Instant::now()
    }

    /// The tick that has fully elapsed at `t` (rounds down).
    pub(crate) fn tick_at(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_millis() as u64
    }

    /// The first tick at or after `deadline` (rounds up, so a timer never fires early).
    pub(crate) fn tick_for_deadline(&self, deadline: Instant) -> u64 {
        let since = deadline.saturating_duration_since(self.base);
        let ms = since.as_millis() as u64;
        if since > Duration::from_millis(ms) {
            ms + 1
        } else {
            ms
        }
    }

    /// The instant at which `tick` begins.
    pub(crate) fn instant_of(&self, tick: u64) -> Instant {
        self.base + Duration::from_millis(tick)
    }
}
