//! The per-worker context: everything a worker owns, reachable from the
//! tasks running on it through a thread-local that is set only while the
//! worker runs. Its fields are the runtime's own; the rest of the crate
//! asks [`super::current`] for what it needs.
//!
//! A task's waker ([`TaskWaker`]) is woken here: a wake on the task's own
//! worker goes straight onto this context's run queue, and only a wake
//! from elsewhere goes through the worker's inbox.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::time::{Duration, Instant};

use super::config::Config;
use super::key::TaskKey;
use super::shared::{RuntimeShared, WorkerShared};
use super::task::{TaskSlab, TaskWaker};
use crate::driver::Driver;
use crate::stats::DriverInfo;
use crate::time::wheel::TimerWheel;

/// One worker's state. Only its own thread touches it.
pub(crate) struct Context {
    pub(super) id: usize,
    /// Unique over every context of every runtime in the process: tells a
    /// timer which wheel it lives in.
    pub(super) uid: u64,
    pub(super) shared: Arc<WorkerShared>,
    pub(super) config: Config,
    /// What the runtime's threads share (its `Handle` wraps it).
    pub(super) runtime: Arc<RuntimeShared>,
    pub(super) tasks: RefCell<TaskSlab>,
    pub(super) run_queue: RefCell<VecDeque<TaskKey>>,
    /// The worker's I/O driver; every socket made here holds a clone.
    pub(super) driver: Driver,
    pub(super) driver_info: DriverInfo,
    pub(super) timers: RefCell<TimerWheel<Waker>>,
    pub(super) clock: Clock,
    /// Incremented once per poll of the driver: one "wakeup" of the loop.
    pub(super) turn: Cell<u64>,
    /// Task polls left in this turn before the loop looks at I/O again
    /// (`event_interval` at the start of each turn). A poll run in place
    /// ([`crate::runtime::run_now_if_alone`]) takes from it too.
    pub(super) polls_left: Cell<u32>,
    /// Wakers to wake after the next poll of the driver.
    pub(super) after_poll: RefCell<Vec<Waker>>,
    /// The task that just panicked and its payload, while its future is
    /// dropped: only that task's join slot takes it.
    pub(super) panic_payload: RefCell<Option<(TaskKey, Box<dyn std::any::Any + Send>)>>,
    /// The loop's idle time in the current load window.
    pub(super) load_meter: super::load::LoadMeter,
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<Context>>> = const { RefCell::new(None) };
}

/// The source of [`Context::uid`].
pub(crate) static NEXT_CONTEXT_UID: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(1);

/// Runs `f` with the current worker's context, or returns `None` outside
/// a worker (including while the thread's locals are being torn down).
pub(crate) fn try_with<R>(f: impl FnOnce(&Context) -> R) -> Option<R> {
    CURRENT
        .try_with(|c| match c.try_borrow() {
            Ok(cx) => cx.as_deref().map(f),
            Err(_) => None,
        })
        .ok()
        .flatten()
}

/// The current worker's context itself, for a handle that must find its
/// way back to it later (a `Weak` does not keep it alive).
pub(crate) fn current() -> Option<Rc<Context>> {
    CURRENT.try_with(|c| c.try_borrow().ok().and_then(|c| c.clone())).ok().flatten()
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
///
/// # The context rule
/// A thread runs at most one worker at a time: entering a context on a
/// thread that already has one (a `block_on` called from inside a task)
/// is refused *before* anything changes, so the worker that made the
/// call keeps its own context, driver and pool, and the refusal is an
/// ordinary panic inside the calling task (its `JoinHandle` reports
/// `Panicked`). The one place a context is stacked on another is
/// [`enter_over`], for dropping a runtime from inside another's task.
///
/// # Panics
/// If this thread already runs a hotloop worker.
pub(crate) fn enter(cx: Rc<Context>) -> (EnterGuard, crate::driver::EnterGuard) {
    let occupied = CURRENT.with(|c| c.try_borrow().map_or(true, |c| c.is_some()));
    assert!(
        !occupied,
        "a hotloop runtime cannot be entered from inside another: `block_on` was called on a \
         worker thread (await the future instead, or run the blocking part with `spawn_blocking`)"
    );
    let driver = cx.driver.enter();
    CURRENT.with(|c| *c.borrow_mut() = Some(cx));
    crate::buf::pool::open();
    (EnterGuard { _tokio: super::tokio_time::enter() }, driver)
}

/// Clears the current context when dropped.
pub(crate) struct EnterGuard {
    /// tokio's timer, entered while the worker runs (feature `tokio-time`).
    _tokio: super::tokio_time::Guard,
}

impl Drop for EnterGuard {
    fn drop(&mut self) {
        // Take the Rc out before dropping it, so a destructor that looks at the
        // context finds none instead of a borrowed cell.
        let cx = CURRENT.try_with(|c| c.borrow_mut().take()).ok().flatten();
        drop(cx);
        // After the context (and the tasks it held, which may give buffers back).
        crate::buf::pool::close();
    }
}

/// Makes `cx` the current context for a moment, over whatever context
/// the thread has (none, or another runtime's worker whose task is
/// dropping a `Runtime`), and puts that one back when the guard drops.
///
/// Only a runtime's own shutdown uses this: it runs no task of the other
/// context in between, and never panics (a panic while a task unwinds
/// would abort the process).
pub(crate) fn enter_over(cx: Rc<Context>) -> OverGuard {
    let driver = cx.driver.enter();
    let previous = CURRENT.try_with(|c| c.try_borrow_mut().ok().map(|mut c| c.replace(cx)));
    let installed = matches!(previous, Ok(Some(_)));
    OverGuard { previous: previous.ok().flatten().flatten(), installed, _driver: driver }
}

/// Restores the context [`enter_over`] covered.
pub(crate) struct OverGuard {
    previous: Option<Rc<Context>>,
    /// False if the context could not be installed (the thread's locals
    /// are being torn down, or the cell is in use): then nothing is restored.
    installed: bool,
    _driver: crate::driver::EnterGuard,
}

impl Drop for OverGuard {
    fn drop(&mut self) {
        if !self.installed {
            return;
        }
        let previous = self.previous.take();
        let ours = CURRENT.try_with(|c| {
            c.try_borrow_mut().ok().map(|mut c| std::mem::replace(&mut *c, previous))
        });
        drop(ours);
    }
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let worker_id = self.worker.id;
        let queued_locally = try_with(|cx| {
            if cx.id == worker_id && Arc::ptr_eq(&cx.shared, &self.worker) {
                cx.run_queue.borrow_mut().push_back(self.key);
                true
            } else {
                false
            }
        });
        if queued_locally != Some(true) {
            self.worker.push_wake(self.key);
        }
    }
}

/// The worker's clock: the wheel counts whole milliseconds since `base`,
/// and the loop reads the system clock once per turn, after the driver's
/// poll, into `now_ns`, which timers compare against instead of reading
/// the clock again. The driver sleeps until an absolute time on the same
/// clock ([`Clock::monotonic_at_tick`]), so deciding how long to sleep
/// needs no reading.
///
/// A reading is one `clock_gettime` and a subtraction; the `Instant` of a
/// turn is made only when something asks for it ([`Clock::cached`]), since
/// most turns never do, and `Instant`'s own arithmetic (normalising
/// seconds and nanoseconds) cost more than the reading itself.
///
/// The clock can be paused ([`crate::time::pause`]): an update then reads
/// nothing and the time moves only by [`Clock::advance`] (or the loop's
/// auto-advance to the next timer). On resume it runs on from where it
/// stood, `offset_ns` ahead of the system clock (or from the system
/// clock, if that is ahead), so it never goes back.
///
/// Work in flight that only ends in real time holds a paused clock: the
/// loop waits for it instead of jumping to the next timer. The blocking
/// pool counts its own jobs; everything else that holds the clock (a file
/// operation on this worker's ring) counts itself in `holds` while it runs.
pub(crate) struct Clock {
    base: Instant,
    /// The monotonic clock at `base`, in nanoseconds, read just after it:
    /// `base + (reading - base_raw)` is then never later than the real time
    /// of the reading.
    base_raw: u64,
    /// Nanoseconds since `base` at the last [`Clock::update`].
    now_ns: Cell<u64>,
    /// `base + now_ns`, once asked for since the last update.
    now: Cell<Option<Instant>>,
    /// True while time is paused.
    paused: Cell<bool>,
    /// How far this clock runs ahead of the system clock, in nanoseconds
    /// (time skipped while paused, or by an advance); 0 unless paused time
    /// was used.
    offset_ns: Cell<u64>,
    /// Operations in flight on this worker that hold a paused clock; each
    /// holder keeps a clone and takes its count back when it ends, on
    /// whatever thread-local state is current then.
    holds: Rc<Cell<usize>>,
}

impl Clock {
    /// The latest tick a timer is filed at, and the clock's last: the
    /// last whose start the clock's count of nanoseconds holds (about 584
    /// years), far enough to mean "never". A timer is never filed past a
    /// tick the clock can reach, so a paused clock that jumps to it fires
    /// it (a timer past its reach kept a paused worker spinning for good).
    pub(crate) const TICK_MAX: u64 = u64::MAX / NANOS_PER_MILLI;

    /// The clock's end, in nanoseconds since its start: the start of
    /// [`Clock::TICK_MAX`]. The time stops there, however far it is moved
    /// (`advance(Duration::MAX)`), and every deadline is due there.
    const END_NS: u64 = Self::TICK_MAX * NANOS_PER_MILLI;

    pub(crate) fn new() -> Self {
        let base = Instant::now();
        let base_raw = crate::sys::monotonic_ns();
        Clock {
            base,
            base_raw,
            now_ns: Cell::new(0),
            now: Cell::new(Some(base)),
            paused: Cell::new(false),
            offset_ns: Cell::new(0),
            holds: Rc::new(Cell::new(0)),
        }
    }

    /// The count of operations that hold this clock while paused: a
    /// holder adds one when it starts and takes it back when it ends.
    pub(crate) fn holds(&self) -> &Rc<Cell<usize>> {
        &self.holds
    }

    /// True while an operation counted in [`Clock::holds`] is in flight.
    pub(crate) fn is_held(&self) -> bool {
        self.holds.get() > 0
    }

    /// Reads the system clock and remembers it as this turn's time;
    /// returns it as nanoseconds since the clock's start. While paused it
    /// reads nothing and returns the paused time.
    pub(crate) fn update(&self) -> u64 {
        if self.paused.get() {
            return self.now_ns.get();
        }
        let ns = self.real_ns().saturating_add(self.offset_ns.get()).min(Self::END_NS);
        self.now_ns.set(ns);
        self.now.set(None);
        ns
    }

    /// The time of the last [`Clock::update`] on `CLOCK_MONOTONIC`, in
    /// nanoseconds: comparable across workers (paused or advanced time
    /// aside, which moves this worker's clock alone).
    pub(crate) fn monotonic_ns(&self) -> u64 {
        self.now_ns.get().saturating_sub(self.offset_ns.get()).saturating_add(self.base_raw)
    }

    /// The system clock, in nanoseconds since `base`.
    fn real_ns(&self) -> u64 {
        crate::sys::monotonic_ns().saturating_sub(self.base_raw)
    }

    /// The time to count a new deadline from (`sleep(d)` is `d` after
    /// it): the system clock, unless paused time moved this clock off it.
    pub(crate) fn deadline_base(&self) -> Instant {
        if self.paused.get() {
            return self.cached();
        }
        match self.offset_ns.get() {
            0 => Instant::now(),
            offset => Instant::now() + Duration::from_nanos(offset),
        }
    }

    /// True while time is paused.
    pub(crate) fn is_paused(&self) -> bool {
        self.paused.get()
    }

    /// Stops the clock at the current time, moved up to the next whole
    /// tick: deadlines of whole milliseconds from it then fall on tick
    /// starts, so a jump to a timer's tick lands on its deadline exactly.
    pub(crate) fn pause(&self) {
        if !self.paused.get() {
            let ns = self.update().div_ceil(NANOS_PER_MILLI).saturating_mul(NANOS_PER_MILLI);
            self.now_ns.set(ns);
            self.now.set(None);
            self.paused.set(true);
        }
    }

    /// Starts the clock again from where it stands (or from the system
    /// clock, if that is ahead).
    pub(crate) fn resume(&self) {
        if self.paused.replace(false) {
            self.offset_ns.set(self.now_ns.get().saturating_sub(self.real_ns()));
            self.update();
        }
    }

    /// Moves the clock `by` forward: the paused time, or, running, the
    /// offset from the system clock; at most to the clock's end, where
    /// every timer is due.
    pub(crate) fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        if self.paused.get() {
            let ns = self.now_ns.get().saturating_add(by).min(Self::END_NS);
            self.now_ns.set(ns);
            self.now.set(None);
        } else {
            self.offset_ns.set(self.offset_ns.get().saturating_add(by));
            self.update();
        }
    }

    /// Moves a paused clock to the start of `tick`, if that is later (at
    /// most to the clock's end).
    pub(crate) fn advance_to_tick(&self, tick: u64) {
        let ns = tick.min(Self::TICK_MAX) * NANOS_PER_MILLI;
        if self.paused.get() && ns > self.now_ns.get() {
            self.now_ns.set(ns);
            self.now.set(None);
        }
    }

    /// The tick that has fully elapsed at the last [`Clock::update`]
    /// (rounds down).
    pub(crate) fn tick_now(&self) -> u64 {
        self.now_ns.get() / NANOS_PER_MILLI
    }

    /// True once the clock stands at its end (moved there by an advance):
    /// every deadline, even one past the end, is due.
    pub(crate) fn at_end(&self) -> bool {
        self.now_ns.get() >= Self::END_NS
    }

    /// The time `tick` begins on `CLOCK_MONOTONIC`, in nanoseconds: the
    /// deadline a driver waits until.
    pub(crate) fn monotonic_at_tick(&self, tick: u64) -> u64 {
        tick.saturating_mul(NANOS_PER_MILLI)
            .saturating_add(self.base_raw)
            .saturating_sub(self.offset_ns.get())
    }

    /// The time of the last [`Clock::update`]: never later than the real
    /// time, so a deadline compared against it is never taken as passed early.
    /// The time of the last [`Clock::update`], in nanoseconds since the
    /// clock's start: [`Clock::cached`] in 8 bytes, with no arithmetic.
    #[inline]
    pub(crate) fn cached_ns(&self) -> u64 {
        self.now_ns.get()
    }

    /// `t` in nanoseconds since the clock's start (0 before it).
    #[cfg(feature = "hyper")]
    pub(crate) fn ns_at(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The instant `ns` nanoseconds after the clock's start.
    #[cfg(feature = "hyper")]
    pub(crate) fn instant_at_ns(&self, ns: u64) -> Instant {
        self.base + Duration::from_nanos(ns)
    }

    pub(crate) fn cached(&self) -> Instant {
        if let Some(now) = self.now.get() {
            return now;
        }
        let now = self.base + Duration::from_nanos(self.now_ns.get());
        self.now.set(Some(now));
        now
    }

    /// The first tick at or after `deadline` (rounds up, so a timer never
    /// fires early), at most [`Clock::TICK_MAX`].
    pub(crate) fn tick_for_deadline(&self, deadline: Instant) -> u64 {
        let since = deadline.saturating_duration_since(self.base);
        // In u64 (`as_millis` is u128 arithmetic).
        let ms = since
            .as_secs()
            .saturating_mul(1000)
            .saturating_add(u64::from(since.subsec_millis()))
            .min(Self::TICK_MAX);
        if ms < Self::TICK_MAX && !since.subsec_nanos().is_multiple_of(1_000_000) {
            ms + 1
        } else {
            ms
        }
    }
}

const NANOS_PER_MILLI: u64 = 1_000_000;

#[cfg(test)]
mod tests {
    use super::Clock;
    use std::time::{Duration, Instant};

    #[test]
    fn the_clocks_integer_answers_agree_with_instant_arithmetic() {
        let clock = Clock::new();
        std::thread::sleep(Duration::from_millis(3));
        let before = Instant::now();
        let ns = clock.update();
        let after = Instant::now();
        let now = clock.cached();
        // The turn's instant is the reading's, and never ahead of the real time.
        assert!(now <= after, "{now:?} > {after:?}");
        assert!(now + Duration::from_millis(1) > before, "reading far behind the real time");
        assert_eq!(now, clock.base + Duration::from_nanos(ns));
        assert_eq!(clock.cached(), now, "asked twice, the same instant");
        let since = now - clock.base;
        assert_eq!(clock.tick_now(), since.as_millis() as u64);
        // On the drivers' clock, the current tick has begun at the reading
        // and the next begins within a millisecond of it.
        let reading = clock.base_raw + ns;
        assert!(clock.monotonic_at_tick(clock.tick_now()) <= reading);
        let next = clock.monotonic_at_tick(clock.tick_now() + 1);
        assert!(next > reading && next - reading <= 1_000_000, "{next} vs {reading}");
        assert_eq!(
            clock.base + Duration::from_millis(clock.tick_now() + 1),
            now + Duration::from_nanos(next - reading),
            "a tick's monotonic time is exact to the nanosecond"
        );
        assert!(crate::sys::monotonic_ns() >= reading, "the drivers' clock is the one read");
        // A deadline rounds up to its tick, never down.
        let tick = clock.tick_for_deadline(now + Duration::from_micros(1_500));
        assert!(clock.base + Duration::from_millis(tick) >= now + Duration::from_micros(1_500));
        assert!(clock.base + Duration::from_millis(tick - 1) < now + Duration::from_micros(1_500));
        // A deadline on a tick's edge is that tick.
        let edge = clock.base + Duration::from_millis(7);
        assert_eq!(clock.tick_for_deadline(edge), 7);
        // "Never" stays far away without overflowing.
        assert!(
            clock.monotonic_at_tick(Clock::TICK_MAX) > reading + 86_400 * 365 * 100 * 1_000_000_000
        );
        // A later reading moves on, and so does the instant made from it.
        std::thread::sleep(Duration::from_millis(2));
        assert!(clock.update() >= ns + 2_000_000);
        assert!(clock.cached() >= now + Duration::from_millis(2));
    }
}
