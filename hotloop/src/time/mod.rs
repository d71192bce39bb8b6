//! Time: `sleep`, `timeout` and `interval` (with tokio's missed-tick
//! behaviours), on each worker's timer wheel.
//!
//! A timer's deadline is rounded up to the wheel's 1 ms tick, so it never
//! fires early; the worker's poller sleeps at most until the wheel's
//! earliest deadline.
//!
//! Time can be paused on a worker ([`pause`], or
//! `#[hotloop::test(start_paused = true)]`), as with tokio's `test-util`:
//! deadlines then move only with [`advance`], or when the worker has
//! nothing to run, no I/O ready and no file or blocking-pool work out, when
//! its clock jumps to the next timer (`paused.rs` has the rule).
//! Deadlines made with this module's functions and [`now`] follow the
//! paused clock; an `Instant` taken from `std::time::Instant::now()` does not.

mod paused;
// The wheel is the runtime's own; the benchmarks and the reference-model
// test reach it as a data structure through the `bench` feature.
#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod wheel;
#[cfg(not(feature = "bench"))]
#[allow(dead_code)] // what only the benchmarks and the model test use
pub(crate) mod wheel;

pub use paused::{advance, pause, resume};

use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use std::sync::Arc;

use crate::runtime::current::{self, Timers};
use crate::runtime::WorkerShared;
use wheel::TimerKey;

/// How far past the turn's time a deadline may lie and still be checked
/// against the real time when polled: one tick of the wheel.
const JUST_DUE: Duration = Duration::from_millis(1);

/// A future that completes at a deadline. Dropping it cancels the timer.
#[must_use = "futures do nothing unless awaited"]
pub struct Sleep {
    deadline: Instant,
    /// The timer, once filed in a worker's wheel.
    entry: Option<Filed>,
}

/// Where a [`Sleep`]'s timer is filed: the key in its wheel, and the
/// worker whose wheel it is (a `Sleep` is `Send`, so it may be polled or
/// dropped on another worker, which must not touch this wheel).
struct Filed {
    key: TimerKey,
    /// The context whose wheel holds the timer.
    uid: u64,
    owner: Arc<WorkerShared>,
}

impl Filed {
    /// Cancels the timer: directly on its own worker, else by asking that
    /// worker to do it, so its wheel does not keep a stale entry.
    fn cancel(self, here: Option<&Timers<'_>>) {
        match here {
            Some(t) if t.worker_uid() == self.uid => {
                t.wheel().cancel(self.key);
            }
            _ => self.ask_owner(false),
        }
    }

    /// Takes the timer out of its wheel for a reset made off its worker,
    /// and wakes the waker it held, on its worker: the task polls its
    /// `Sleep` again and files a new timer at the new deadline, with its
    /// own waker, so the wake-up survives the reset (a reset on the
    /// timer's own worker moves the entry, waker and all, instead).
    ///
    /// Race-free without a handshake of its own: the request carries only
    /// the key, never a deadline, so requests applied late or out of order
    /// against later polls and resets on the owner cannot move a timer
    /// anywhere. A stale key (the timer fired, or the task re-filed it)
    /// cancels nothing and wakes nothing; the task was woken already, or
    /// holds the new entry at the deadline it read when it polled.
    fn take_and_wake(self) {
        self.ask_owner(true);
    }

    /// Asks the timer's worker, through its inbox, to cancel the entry and,
    /// with `wake`, to wake the waker it held.
    fn ask_owner(self, wake: bool) {
        let (key, uid) = (self.key, self.uid);
        self.owner.push_runnable(Box::new(move || {
            let waker = current::try_with_timers(|t| {
                (t.worker_uid() == uid).then(|| t.wheel().cancel(key)).flatten()
            });
            // Woken outside the wheel's borrow.
            if let Some(waker) = waker.flatten().filter(|_| wake) {
                waker.wake();
            }
        }));
    }
}

/// The current worker's idea of now: the time its loop read at the start
/// of this turn, so reading it costs no system call. Never ahead of the
/// real time, and at most one loop turn behind it. Outside a worker, the
/// real time.
///
/// Good for timestamps that only need to be as fine as a loop turn, such
/// as the last activity of a connection, checked against an idle timeout.
pub fn now() -> Instant {
    current::try_clock_now().unwrap_or_else(Instant::now)
}

/// Waits for `duration`. A duration too long for the clock (such as
/// `Duration::MAX`) waits about 30 years, which is to say forever.
pub fn sleep(duration: Duration) -> Sleep {
    sleep_until(deadline_after(duration))
}

/// `now + duration`, saturated at a far-future instant.
fn deadline_after(duration: Duration) -> Instant {
    saturating_add(deadline_base(), duration)
}

/// The time new deadlines count from: the system clock, or on a worker
/// whose time was paused, that worker's clock.
fn deadline_base() -> Instant {
    current::try_deadline_base().unwrap_or_else(Instant::now)
}

/// The worker's clock read now, as a sleep judges its deadline (its pause
/// and its advances included), rather than the turn's cached reading
/// ([`now`]): for code that must agree with a sleep it just saw ready.
/// `Instant::now()` would not (it is ahead of a paused clock, and behind
/// one advanced). Only the hyper deadlines need it.
#[cfg(feature = "hyper")]
pub(crate) fn clock_now() -> Instant {
    deadline_base()
}

/// `at + duration`, saturated at a far-future instant: every deadline in
/// this module is made here, so none overflows the clock.
fn saturating_add(at: Instant, duration: Duration) -> Instant {
    at.checked_add(duration).unwrap_or_else(|| far_future(at))
}

/// An instant about 30 years ahead of `from`, which every platform's
/// `Instant` can represent: the stand-in for "never".
fn far_future(from: Instant) -> Instant {
    from + Duration::from_secs(86_400 * 365 * 30)
}

/// Waits until `deadline`.
pub fn sleep_until(deadline: Instant) -> Sleep {
    Sleep { deadline, entry: None }
}

impl Sleep {
    /// The instant this sleep completes.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// True once the deadline has passed (by the worker's clock, as a
    /// poll judges it, or the real time outside a worker): the next poll
    /// completes.
    pub fn is_elapsed(&self) -> bool {
        current::try_with_timers(|t| is_due(t, self.deadline))
            .unwrap_or_else(|| Instant::now() >= self.deadline)
    }

    /// Moves the deadline, earlier or later, as tokio's `Sleep::reset`
    /// does: a task waiting on this `Sleep` wakes at the new deadline.
    ///
    /// It may be called on any thread. On the worker that holds the timer
    /// the entry moves in place (no allocation, no wake). Anywhere else
    /// (another worker, a plain thread), that worker is asked to take the
    /// entry out and wake the task that waits on it, which then files a
    /// new timer at the new deadline: one extra poll of the waiting task,
    /// and no lost wake-up.
    pub fn reset(&mut self, deadline: Instant) {
        self.deadline = deadline;
        let Some(filed) = self.entry.take() else { return };
        let mut filed = Some(filed);
        let entry = &mut self.entry;
        current::try_with_timers(|t| {
            let Some(f) = filed.take_if(|f| f.uid == t.worker_uid()) else { return };
            let tick = t.tick_for_deadline(deadline);
            if t.wheel().reset(f.key, tick) {
                *entry = Some(f);
            }
            // A stale key: the timer fired and woke the task already.
        });
        if let Some(f) = filed {
            f.take_and_wake();
        }
    }
}

/// Whether a sleep until `deadline` is over, as its poll and
/// [`Sleep::is_elapsed`] both judge it.
///
/// By the loop's time of this turn: no clock read per poll. It is never
/// ahead of the real time, so a sleep never ends early. A deadline less
/// than a wheel tick past it (a zero sleep, an interval's first tick) may
/// already have passed in real time: one clock read tells, where the
/// wheel would wait for its next tick, up to a millisecond. A clock moved
/// to its end (`advance(Duration::MAX)`) has every deadline behind it.
fn is_due(t: &Timers<'_>, deadline: Instant) -> bool {
    let turn = t.now();
    turn >= deadline
        || (deadline - turn <= JUST_DUE && t.deadline_base() >= deadline)
        || t.clock_at_end()
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, task_cx: &mut TaskContext<'_>) -> Poll<()> {
        current::with_timers(|t| {
            if is_due(t, self.deadline) {
                if let Some(filed) = self.entry.take() {
                    filed.cancel(Some(t));
                }
                return Poll::Ready(());
            }
            if let Some(filed) = self.entry.take_if(|f| f.uid != t.worker_uid()) {
                // Polled on another worker than the one holding the timer.
                filed.cancel(Some(t));
            }
            let mut timers = t.wheel();
            match self.entry.as_ref().and_then(|f| timers.get_mut(f.key)) {
                Some(w) => {
                    if !w.will_wake(task_cx.waker()) {
                        *w = task_cx.waker().clone();
                    }
                }
                None => {
                    let tick = t.tick_for_deadline(self.deadline);
                    let key = timers.insert(tick, task_cx.waker().clone());
                    self.entry = Some(Filed { key, uid: t.worker_uid(), owner: t.worker_shared() });
                }
            }
            Poll::Pending
        })
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        let mut filed = self.entry.take();
        if filed.is_some() {
            current::try_with_timers(|t| filed.take().map(|f| f.cancel(Some(t))));
            if let Some(f) = filed {
                f.cancel(None);
            }
        }
    }
}

/// The error of a [`timeout`] whose deadline passed first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "deadline has elapsed")
    }
}

impl std::error::Error for Elapsed {}

impl From<Elapsed> for std::io::Error {
    fn from(_: Elapsed) -> Self {
        std::io::Error::new(std::io::ErrorKind::TimedOut, "deadline has elapsed")
    }
}

/// Runs `future` for at most `duration`.
pub fn timeout<F: Future>(duration: Duration, future: F) -> Timeout<F> {
    timeout_at(deadline_after(duration), future)
}

/// Runs `future` until `deadline` at the latest.
pub fn timeout_at<F: Future>(deadline: Instant, future: F) -> Timeout<F> {
    Timeout { future, sleep: sleep_until(deadline) }
}

pin_project_lite::pin_project! {
    /// A future with a deadline, made by [`timeout`] and [`timeout_at`]: it
    /// gives the future's output, or [`Elapsed`] if the deadline passes
    /// first. The future is polled first, so an output ready at the
    /// deadline is not lost. Dropping it drops the future and cancels the
    /// timer.
    #[must_use = "futures do nothing unless awaited"]
    pub struct Timeout<F> {
        #[pin]
        future: F,
        sleep: Sleep,
    }
}

impl<F> Timeout<F> {
    /// Moves the deadline, earlier or later, from any thread, as
    /// [`Sleep::reset`] does: the task waiting on the timeout wakes at the
    /// new deadline.
    pub fn reset(self: Pin<&mut Self>, deadline: Instant) {
        self.project().sleep.reset(deadline);
    }

    /// The future.
    pub fn get_ref(&self) -> &F {
        &self.future
    }

    /// The future, mutably.
    pub fn get_mut(&mut self) -> &mut F {
        &mut self.future
    }

    /// The future, with the deadline dropped.
    pub fn into_inner(self) -> F {
        self.future
    }

    /// The deadline.
    pub fn deadline(&self) -> Instant {
        self.sleep.deadline()
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(v) = this.future.poll(cx) {
            return Poll::Ready(Ok(v));
        }
        Pin::new(this.sleep).poll(cx).map(|()| Err(Elapsed))
    }
}

impl<F> std::fmt::Debug for Timeout<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeout").field("deadline", &self.sleep.deadline()).finish()
    }
}

/// A stream of ticks at a fixed period: [`interval`], [`interval_at`].
pub struct Interval {
    period: Duration,
    /// Completes at the next tick; its deadline is that tick's instant.
    sleep: Sleep,
    missed: MissedTickBehavior,
}

/// What an [`Interval`] does after it missed ticks: a tick counts as
/// missed when the interval is polled only after the following tick was
/// due too (a task busy for longer than a period, a worker held up).
///
/// The variants are tokio's; the default is not: tokio bursts, hotloop
/// delays, so a late tick never makes the next ones come early unless
/// asked to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissedTickBehavior {
    /// Ticks at once, as often as needed to get back to the original
    /// schedule: every missed tick is delivered, late.
    Burst,
    /// Starts the schedule again from the late tick: the next one is a
    /// period after it. The default.
    #[default]
    Delay,
    /// Drops the missed ticks: the next one is the first tick of the
    /// original schedule still ahead.
    Skip,
}

impl MissedTickBehavior {
    /// The instant of the tick after the one `scheduled` for, delivered at `now`.
    fn next_tick(self, scheduled: Instant, now: Instant, period: Duration) -> Instant {
        let on_schedule = saturating_add(scheduled, period);
        if now <= on_schedule {
            return on_schedule;
        }
        match self {
            MissedTickBehavior::Burst => on_schedule,
            MissedTickBehavior::Delay => saturating_add(now, period),
            MissedTickBehavior::Skip => {
                // The time past the last tick of the original schedule
                // that is due; `now - scheduled` is bounded by how long
                // the process has run, so it fits in a u64 of nanoseconds.
                let late = now.duration_since(scheduled).as_nanos() % period.as_nanos();
                let past_tick = Duration::from_nanos(u64::try_from(late).unwrap_or(0));
                saturating_add(now, period - past_tick)
            }
        }
    }
}

/// Ticks every `period`, the first tick at once. A tick that is late does
/// not make the next ones come faster: the schedule restarts from the late
/// tick ([`MissedTickBehavior::Delay`]; see
/// [`Interval::set_missed_tick_behavior`]).
///
/// # Panics
/// If `period` is zero.
pub fn interval(period: Duration) -> Interval {
    interval_at(deadline_base(), period)
}

/// Ticks every `period`, the first tick at `start`.
///
/// # Panics
/// If `period` is zero.
pub fn interval_at(start: Instant, period: Duration) -> Interval {
    assert!(period > Duration::ZERO, "interval period must be non-zero");
    Interval { period, sleep: sleep_until(start), missed: MissedTickBehavior::default() }
}

impl Interval {
    /// Waits for the next tick; returns the instant it was scheduled for.
    ///
    /// Cancel-safe: dropped before it completes, it takes no tick, and
    /// the next call waits for the same one.
    pub async fn tick(&mut self) -> Instant {
        std::future::poll_fn(|cx| self.poll_tick(cx)).await
    }

    /// The poll form of [`tick`](Self::tick), for a hand-written future or
    /// stream: ready with the tick's scheduled instant when it is due,
    /// else the task is woken when it is.
    pub fn poll_tick(&mut self, cx: &mut TaskContext<'_>) -> Poll<Instant> {
        std::task::ready!(Pin::new(&mut self.sleep).poll(cx));
        let scheduled = self.sleep.deadline();
        let next = self.missed.next_tick(scheduled, deadline_base(), self.period);
        // The completed sleep holds no timer, so this only moves its
        // deadline; the timer is filed at the next poll.
        self.sleep.reset(next);
        Poll::Ready(scheduled)
    }

    /// Starts the schedule again: the next tick a period from now.
    pub fn reset(&mut self) {
        self.reset_at(deadline_after(self.period));
    }

    /// Starts the schedule again with a tick now.
    pub fn reset_immediately(&mut self) {
        self.reset_at(deadline_base());
    }

    /// Starts the schedule again: the next tick `after` from now.
    pub fn reset_after(&mut self, after: Duration) {
        self.reset_at(deadline_after(after));
    }

    /// Starts the schedule again: the next tick at `deadline`.
    ///
    /// Like every reset of the interval, it may be called on any thread,
    /// and a task waiting for a tick wakes at the new one (see
    /// [`Sleep::reset`]).
    pub fn reset_at(&mut self, deadline: Instant) {
        self.sleep.reset(deadline);
    }

    /// What the interval does after missed ticks.
    pub fn missed_tick_behavior(&self) -> MissedTickBehavior {
        self.missed
    }

    /// Sets what the interval does after missed ticks.
    pub fn set_missed_tick_behavior(&mut self, behavior: MissedTickBehavior) {
        self.missed = behavior;
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }
}

impl std::fmt::Debug for Interval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interval")
            .field("period", &self.period)
            .field("next_tick", &self.sleep.deadline())
            .field("missed_tick_behavior", &self.missed)
            .finish()
    }
}
