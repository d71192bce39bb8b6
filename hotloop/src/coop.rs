//! The cooperative budget: how much work that never has to wait a task
//! may do in one poll before it gives way to the other tasks of its
//! worker, as tokio's `coop` does.
//!
//! A read from a peer that sends faster than the task consumes, or a
//! write to a peer that reads as fast, completes at once every time: a
//! loop of them never returns `Pending`, and for as long as it runs no
//! other task of the worker runs, no timer fires and the driver is not
//! polled. So the worker gives each poll of a task (and of `block_on`'s
//! future) [`BUDGET_PER_POLL`] units; every I/O operation that completes
//! without waiting takes one (a receive, a send, a readiness check found
//! ready, an accept, a `sendfile` step, a finished task's result), and
//! once none is left the next one returns `Pending` before it makes its
//! system call or takes a byte, so nothing is lost. The task is woken
//! after the worker's next poll of the driver (tokio defers it the same
//! way): the other tasks queued, the timers due and the I/O that came
//! run first, so a busy task holds its worker for one poll a turn.
//!
//! # Implementation notes
//! - The budget is a thread-local counter, set for each poll and put back
//!   after it ([`with_budget`]); the check and the charge are a load and
//!   a store. Off a worker (and outside a task's poll, in the worker
//!   loop's own code) it is unlimited.
//! - A wait that must not be held back is exempt ([`exempt`]): the
//!   non-waiting `try_*` calls (they answer now, and are not polls), and
//!   [`unconstrained`]'s future.
//! - Timers take nothing: a `Sleep` that returns `Pending` has filed its
//!   timer, which the connections' deadline watches rely on (a budget
//!   `Pending` would leave them unfiled), and a `timeout`'s deadline is
//!   then always checked, so a timeout around a loop that spends its
//!   budget on every poll still fires.
//! - A leaf: it imports nothing of the crate, so the driver may use it.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Units a task may spend in one poll (tokio's figure).
pub(crate) const BUDGET_PER_POLL: u32 = 128;

/// No limit: off a worker, between polls, and inside [`unconstrained`].
const UNLIMITED: u32 = u32::MAX;

thread_local! {
    /// Units left in the current poll.
    static BUDGET: Cell<u32> = const { Cell::new(UNLIMITED) };
    /// The tasks the budget stopped, woken after the worker's next poll
    /// of the driver ([`wake_deferred`]).
    static DEFERRED: RefCell<Vec<Waker>> = const { RefCell::new(Vec::new()) };
}

/// Runs `poll` (one poll of a task) with a full budget, and puts the
/// budget that was there back after it, also when it panics: a task
/// polled in place inside another's poll gets its own budget, and the
/// outer task's is left as it was.
#[inline]
pub(crate) fn with_budget<R>(poll: impl FnOnce() -> R) -> R {
    with(BUDGET_PER_POLL, poll)
}

/// Runs `f` with no limit, and puts the budget back after it: for a call
/// that answers now whatever the budget (a `try_*` call made of a poll).
#[inline]
pub(crate) fn exempt<R>(f: impl FnOnce() -> R) -> R {
    with(UNLIMITED, f)
}

#[inline]
fn with<R>(budget: u32, f: impl FnOnce() -> R) -> R {
    let _restore = Restore(BUDGET.replace(budget));
    f()
}

/// Puts a budget back when dropped.
struct Restore(u32);

impl Drop for Restore {
    #[inline]
    fn drop(&mut self) {
        BUDGET.set(self.0);
    }
}

/// Ready if the budget has a unit left; otherwise returns `Pending`, so
/// the operation is not made, and has the task woken after the worker's
/// next poll of the driver. Takes nothing: [`spend`] does, once the
/// operation has completed.
#[inline]
pub(crate) fn poll_proceed(cx: &mut Context<'_>) -> Poll<()> {
    if BUDGET.get() == 0 {
        defer(cx.waker());
        return Poll::Pending;
    }
    Poll::Ready(())
}

/// Keeps `waker` for [`wake_deferred`]: the task runs again only after
/// the driver's next poll, with the timers due then and the tasks woken
/// by it, as tokio defers it. Woken at once if it cannot be kept (the
/// thread's locals are going away).
#[cold]
fn defer(waker: &Waker) {
    let kept = DEFERRED.try_with(|d| {
        let Ok(mut d) = d.try_borrow_mut() else { return false };
        if !d.iter().any(|w| w.will_wake(waker)) {
            d.push(waker.clone());
        }
        true
    });
    if kept != Ok(true) {
        waker.wake_by_ref();
    }
}

/// True while a task the budget stopped waits to be woken: the worker
/// must not sleep.
#[inline]
pub(crate) fn has_deferred() -> bool {
    DEFERRED.try_with(|d| d.try_borrow().is_ok_and(|d| !d.is_empty())).unwrap_or(false)
}

/// Wakes the tasks the budget stopped: the worker calls it after each
/// poll of the driver, and when it stops running tasks.
pub(crate) fn wake_deferred() {
    let deferred = DEFERRED
        .try_with(|d| d.try_borrow_mut().map(|mut d| std::mem::take(&mut *d)).unwrap_or_default())
        .unwrap_or_default();
    for w in deferred {
        w.wake();
    }
}

/// Takes one unit: an operation completed without waiting.
#[inline]
pub(crate) fn spend() {
    let left = BUDGET.get();
    if left != UNLIMITED && left > 0 {
        BUDGET.set(left - 1);
    }
}

/// `poll` under the budget: not called once it is spent (the task is
/// woken to run again later); one unit taken if it completes.
#[inline]
pub(crate) fn poll_budgeted<T>(
    cx: &mut Context<'_>,
    poll: impl FnOnce(&mut Context<'_>) -> Poll<T>,
) -> Poll<T> {
    std::task::ready!(poll_proceed(cx));
    let polled = poll(cx);
    if polled.is_ready() {
        spend();
    }
    polled
}

/// Takes one unit, first giving way if none is left: for a step of a
/// loop inside an `async fn` that never waits (a `sendfile` loop).
pub(crate) async fn step() {
    std::future::poll_fn(|cx| poll_budgeted(cx, |_| Poll::Ready(()))).await
}

/// Runs `future` without the cooperative budget: its I/O never gives way
/// to the worker's other tasks on its own, as tokio's
/// `task::unconstrained` does.
///
/// Each poll of a task may make 128 I/O operations that complete without
/// waiting (reads, writes, readiness checks, accepts, results of other
/// tasks); the next one returns `Pending` and wakes the task, so a
/// connection whose peer floods it, or reads as fast as it is written,
/// cannot hold the worker, its timers and its other connections. Inside
/// this future that limit is lifted (and what it spends is not charged
/// to the task): for a loop that must not be interrupted, and that
/// bounds its own work. A loop that never waits stops every other task
/// of the worker for as long as it runs.
pub fn unconstrained<F: Future>(future: F) -> Unconstrained<F> {
    Unconstrained { future }
}

pin_project_lite::pin_project! {
    /// The future of [`unconstrained`]: `F`, polled without the budget.
    #[must_use = "futures do nothing unless awaited"]
    pub struct Unconstrained<F> {
        #[pin]
        future: F,
    }
}

impl<F: Future> Future for Unconstrained<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let future = self.project().future;
        exempt(|| future.poll(cx))
    }
}

impl<F> std::fmt::Debug for Unconstrained<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unconstrained").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::task::{Wake, Waker};

    struct Count(AtomicU32);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A poll gets [`BUDGET_PER_POLL`] operations; the next one is not
    /// made, and its task is woken once the worker wakes the deferred
    /// tasks (once, however often it was stopped); an exempt call and a
    /// nested poll leave the outer budget as they found it; off a poll
    /// there is no limit.
    #[test]
    fn a_poll_spends_its_budget_then_gives_way() {
        let count = Arc::new(Count(AtomicU32::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut made = 0;
        with_budget(|| {
            while poll_budgeted(&mut cx, |_| Poll::Ready(())).is_ready() {
                made += 1;
            }
            assert_eq!(exempt(|| poll_budgeted(&mut cx, |_| Poll::Ready(()))), Poll::Ready(()));
            with_budget(|| assert!(poll_proceed(&mut cx).is_ready()));
            assert!(poll_proceed(&mut cx).is_pending(), "the nested poll refilled it");
        });
        assert_eq!(made, BUDGET_PER_POLL);
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "woken only after the driver's poll");
        assert!(has_deferred());
        wake_deferred();
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken once");
        assert!(!has_deferred());
        for _ in 0..1000 {
            assert!(poll_budgeted(&mut cx, |_| Poll::Ready(())).is_ready());
        }
    }
}
