//! The current worker, as the rest of the crate reaches it: one function
//! per thing a socket, a timer, a file or a process needs from the worker
//! it runs on.
//!
//! # Implementation notes
//! The worker's `Context` keeps its fields to the runtime; everything
//! outside `runtime/` comes through here (`hotloop/tests/layering.rs`
//! checks it), so a field can change without a change in `net/` or
//! `time/`. Each function is one visit to the thread-local, inlined, and
//! costs what reading the field in place did. Where a caller needs several
//! facts at one moment (an accept, a timer's poll), it gets a view of them
//! for one visit ([`Turn`], [`Timers`]) rather than one call per fact.
//!
//! Functions named `try_*` return `None` outside a worker (and while the
//! thread's locals are being torn down); the others panic there, with a
//! message that says how to get onto one.

use std::cell::{Cell, RefMut};
use std::rc::Rc;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

use super::context::{self, Context};
use super::join_slot::RemoteJoinHandle;
use super::shared::WorkerShared;
use crate::driver::Driver;
use crate::stats::{self, WorkerStats};
use crate::time::wheel::TimerWheel;

/// True on a hotloop worker.
#[inline]
pub(crate) fn on_worker() -> bool {
    context::try_with(|_| ()).is_some()
}

/// True on one of a runtime's worker threads, whose loop runs until the
/// runtime is dropped; false on `block_on`'s context (its tasks run only
/// while `block_on` does) and outside any runtime.
pub(crate) fn on_worker_thread() -> bool {
    context::try_with(|cx| !Arc::ptr_eq(&cx.shared, &cx.runtime.main)).unwrap_or(false)
}

#[cfg(feature = "quic")]
/// Panics unless called on a hotloop worker: for a function whose state
/// lives with the worker and would be kept in vain anywhere else.
#[inline]
pub(crate) fn assert_on_worker() {
    context::with(|_| ());
}

/// Runs `f` with the current worker's I/O driver, on which a socket is
/// made (every socket made here holds a clone of it).
///
/// # Panics
/// Outside a hotloop worker.
#[inline]
pub(crate) fn with_driver<R>(f: impl FnOnce(&Driver) -> R) -> R {
    context::with(|cx| f(&cx.driver))
}

/// Runs `f` with the current worker's I/O driver, or returns `None`
/// outside a worker.
#[inline]
pub(crate) fn try_with_driver<R>(f: impl FnOnce(&Driver) -> R) -> Option<R> {
    context::try_with(|cx| f(&cx.driver))
}

/// Adds one to the counter of the current worker's stats that `counter`
/// picks, as in `count(|s| &s.handoffs_in)`.
///
/// # Panics
/// Outside a hotloop worker.
#[inline]
pub(crate) fn count(counter: impl FnOnce(&WorkerStats) -> &AtomicU64) {
    context::with(|cx| stats::add(counter(&cx.shared.stats), 1));
}

/// The number of the current loop turn: it goes up by one at each poll
/// of the driver.
///
/// # Panics
/// Outside a hotloop worker.
#[inline]
pub(crate) fn turn() -> u64 {
    context::with(|cx| cx.turn.get())
}

/// The current worker's shared half, for something that must reach the
/// worker from another thread later (its inbox, its stats, its load).
///
/// # Panics
/// Outside a hotloop worker.
#[inline]
pub(crate) fn worker_shared() -> Arc<WorkerShared> {
    context::with(|cx| cx.shared.clone())
}

#[cfg(feature = "quic")]
/// The current worker's id, unique over every worker of every runtime in
/// the process (unlike its index): tells a timer or a socket wrapper
/// whether it is on the worker it was made on.
///
/// # Panics
/// Outside a hotloop worker.
#[inline]
pub(crate) fn worker_uid() -> u64 {
    context::with(|cx| cx.uid)
}

#[cfg(feature = "quic")]
/// [`worker_uid`], or `None` outside a worker.
#[inline]
pub(crate) fn try_worker_uid() -> Option<u64> {
    context::try_with(|cx| cx.uid)
}

/// The time the loop read at the start of this turn, in nanoseconds since
/// the worker's clock started (comparable only on this worker), or `None`
/// outside a worker.
#[cfg(feature = "hyper")]
#[inline]
pub(crate) fn try_clock_ns() -> Option<u64> {
    context::try_with(|cx| cx.clock.cached_ns())
}

/// `t` in nanoseconds since the worker's clock started (see
/// [`try_clock_ns`]), or `None` outside a worker.
#[cfg(feature = "hyper")]
pub(crate) fn try_clock_ns_at(t: Instant) -> Option<u64> {
    context::try_with(|cx| cx.clock.ns_at(t))
}

/// The instant `ns` nanoseconds after the worker's clock started (see
/// [`try_clock_ns`]), or `None` outside a worker.
#[cfg(feature = "hyper")]
pub(crate) fn try_clock_instant_at(ns: u64) -> Option<Instant> {
    context::try_with(|cx| cx.clock.instant_at_ns(ns))
}

/// The time the loop read at the start of this turn (no system call), or
/// `None` outside a worker.
#[inline]
pub(crate) fn try_clock_now() -> Option<Instant> {
    context::try_with(|cx| cx.clock.cached())
}

/// The time a new deadline counts from on this worker (the system clock,
/// unless paused time moved the worker's clock off it), or `None`
/// outside a worker.
#[inline]
pub(crate) fn try_deadline_base() -> Option<Instant> {
    context::try_with(|cx| cx.clock.deadline_base())
}

/// The time of this loop turn on `CLOCK_MONOTONIC`, in nanoseconds:
/// comparable with other workers' readings (paused or advanced time aside).
///
/// # Panics
/// Outside a hotloop worker.
#[inline]
pub(crate) fn clock_monotonic_ns() -> u64 {
    context::with(|cx| cx.clock.monotonic_ns())
}

/// Stops the current worker's clock (see [`crate::time::pause`]).
///
/// # Panics
/// Outside a hotloop worker.
pub(crate) fn pause_clock() {
    context::with(|cx| cx.clock.pause());
}

/// Starts the current worker's clock again (see [`crate::time::resume`]).
///
/// # Panics
/// Outside a hotloop worker.
pub(crate) fn resume_clock() {
    context::with(|cx| cx.clock.resume());
}

/// Moves the current worker's clock `by` forward and wakes the tasks
/// whose timers are due by then (see [`crate::time::advance`]).
///
/// # Panics
/// Outside a hotloop worker.
pub(crate) fn advance_clock(by: Duration) {
    context::with(|cx| {
        cx.clock.advance(by);
        super::worker::fire_timers(cx);
    });
}

/// Work that holds the current worker's paused clock while it runs (see
/// [`hold_paused_clock`]); dropping it lets the clock go.
pub(crate) struct PausedClockHold(Rc<Cell<usize>>);

impl Drop for PausedClockHold {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// Marks work that only ends in real time (a file operation on the ring)
/// as in flight until the returned hold drops: while any is, a paused
/// clock does not jump to the next timer, and the loop waits for the work
/// instead, as it does for a blocking-pool job. `None` outside a worker.
pub(crate) fn hold_paused_clock() -> Option<PausedClockHold> {
    context::try_with(|cx| {
        let holds = cx.clock.holds();
        holds.set(holds.get() + 1);
        PausedClockHold(holds.clone())
    })
}

/// Queues `f` on the blocking pool of the current worker's runtime, or
/// returns `None` outside a worker.
#[inline]
pub(crate) fn try_spawn_blocking<F, R>(f: F) -> Option<RemoteJoinHandle<R>>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    context::try_with(|cx| cx.runtime.blocking.spawn(f))
}

/// What the accept path reads of the current loop turn, in one visit to
/// the thread-local (see [`with_turn`]).
pub(crate) struct Turn<'a> {
    cx: &'a Context,
}

impl Turn<'_> {
    /// The turn's number (see [`turn`]).
    #[inline]
    pub(crate) fn number(&self) -> u64 {
        self.cx.turn.get()
    }

    /// The time the loop read at the start of this turn, in nanoseconds
    /// on the worker's clock (no `Instant` arithmetic).
    #[inline]
    pub(crate) fn now_ns(&self) -> u64 {
        self.cx.clock.cached_ns()
    }

    /// How many tasks wait to run on this worker.
    #[inline]
    pub(crate) fn run_queue_len(&self) -> usize {
        self.cx.run_queue.borrow().len()
    }

    /// The worker's counters.
    #[inline]
    pub(crate) fn stats(&self) -> &WorkerStats {
        &self.cx.shared.stats
    }

    /// The worker's index in its runtime, as logs name it.
    #[inline]
    pub(crate) fn worker_index(&self) -> usize {
        self.cx.id
    }
}

/// Runs `f` with a view of the current loop turn.
///
/// # Panics
/// Outside a hotloop worker.
#[inline]
pub(crate) fn with_turn<R>(f: impl FnOnce(&Turn<'_>) -> R) -> R {
    context::with(|cx| f(&Turn { cx }))
}

/// The current worker's timer wheel and clock, in one visit to the
/// thread-local (see [`with_timers`]).
pub(crate) struct Timers<'a> {
    cx: &'a Context,
}

impl Timers<'_> {
    /// The worker's wheel, borrowed until the guard drops.
    ///
    /// # Panics
    /// If the wheel is borrowed already (a timer's waker must not be woken
    /// while it is held).
    #[inline]
    pub(crate) fn wheel(&self) -> RefMut<'_, TimerWheel<Waker>> {
        self.cx.timers.borrow_mut()
    }

    /// The time the loop read at the start of this turn.
    #[inline]
    pub(crate) fn now(&self) -> Instant {
        self.cx.clock.cached()
    }

    /// The time a deadline counts from: the real time, unless paused time
    /// moved the worker's clock off it (then the worker's clock).
    #[inline]
    pub(crate) fn deadline_base(&self) -> Instant {
        self.cx.clock.deadline_base()
    }

    /// True once the clock stands at its end (an advance moved it as far
    /// as it goes): every deadline is due.
    #[inline]
    pub(crate) fn clock_at_end(&self) -> bool {
        self.cx.clock.at_end()
    }

    /// The wheel's tick for `deadline`: the first at or after it, so a
    /// timer never fires early.
    #[inline]
    pub(crate) fn tick_for_deadline(&self, deadline: Instant) -> u64 {
        self.cx.clock.tick_for_deadline(deadline)
    }

    /// The worker's id (as the free function `worker_uid` gives it): which wheel this is.
    #[inline]
    pub(crate) fn worker_uid(&self) -> u64 {
        self.cx.uid
    }

    /// The worker's shared half, through which another thread asks it to
    /// cancel a timer in this wheel.
    #[inline]
    pub(crate) fn worker_shared(&self) -> Arc<WorkerShared> {
        self.cx.shared.clone()
    }
}

/// Runs `f` with the current worker's timers.
///
/// # Panics
/// Outside a hotloop worker.
#[inline]
pub(crate) fn with_timers<R>(f: impl FnOnce(&Timers<'_>) -> R) -> R {
    context::with(|cx| f(&Timers { cx }))
}

/// Runs `f` with the current worker's timers, or returns `None` outside a
/// worker.
#[inline]
pub(crate) fn try_with_timers<R>(f: impl FnOnce(&Timers<'_>) -> R) -> Option<R> {
    context::try_with(|cx| f(&Timers { cx }))
}
