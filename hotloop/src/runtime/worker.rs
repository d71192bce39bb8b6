//! The worker loop: run tasks, poll the driver, fire timers, repeat.
//!
//! One turn of the loop:
//! 1. poll up to `event_interval` queued tasks (so a busy task set cannot
//!    starve I/O), letting the driver submit after each poll what has
//!    waited too long (io_uring: entries queued early in a long run);
//! 2. poll the driver: with a zero timeout if work is queued or busy
//!    polling is on, else until the next timer or an event;
//! 3. take what other threads left in the inbox (wakes, spawns, shutdown);
//! 4. wake what waited for "after the next poll" (accept batches that hit
//!    their bound, tasks that spent their cooperative budget), then fire
//!    due timers.
//!
//! Each task poll gets a cooperative budget (`coop.rs`): I/O that never
//! waits stops it after 128 operations, so one busy connection takes one
//! poll a turn and the loop gets on to the driver and the timers.

use super::config::BusyPoll;
use super::context::Context;
use super::key::TaskKey;
use super::task::{TaskWaker, MAIN_TASK};
use crate::driver::Park;
use crate::stats;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll, Waker};

/// The largest number of timers fired in one loop turn; the rest fire on the next.
const TIMERS_PER_TURN_MAX: usize = 1024;

/// Busy polling: the clock is read once in this many empty spins (turns
/// that ran no task and found no event). An io_uring spin that finds
/// nothing makes no system call and takes well under 100 ns, a third of
/// which was the clock reading; an epoll spin is one `epoll_wait`. Nothing
/// in an empty spin needs the time, and timers fire at most this many
/// spins late (a few microseconds, against their millisecond ticks).
const EMPTY_SPINS_PER_CLOCK_READ: u32 = 16;

/// Why the loop stopped without the main future completing.
pub(crate) struct ShutdownRequested;

/// Runs the worker until `main` completes (or, with `None`, until shutdown is requested).
pub(crate) fn run<F: Future>(
    cx: &Context,
    mut main: Option<Pin<&mut F>>,
) -> Result<F::Output, ShutdownRequested> {
    let main_header = TaskWaker::new(MAIN_TASK, cx.shared.clone());
    let main_waker = Waker::from(main_header.clone());
    if main.is_some() {
        cx.run_queue.borrow_mut().push_back(MAIN_TASK);
    }
    // Whatever way the loop ends, the tasks the budget stopped are queued
    // again (a later `block_on` runs the tasks of its context).
    let _deferred = WakeDeferred;
    let mut last_event = cx.clock.update();
    // The clock at the last driver poll's return.
    let mut polled_at = last_event;
    // Empty spins since the clock was last read.
    let mut unclocked_spins = 0u32;
    loop {
        // 1. Tasks.
        let mut ran_tasks = false;
        cx.polls_left.set(cx.config.event_interval);
        while cx.polls_left.get() > 0 {
            let Some(key) = cx.run_queue.borrow_mut().pop_front() else {
                break;
            };
            cx.polls_left.set(cx.polls_left.get() - 1);
            ran_tasks = true;
            if key == MAIN_TASK {
                if let Some(fut) = main.as_mut() {
                    // A wake from now on (including from inside this poll) queues it again.
                    main_header.clear_scheduled();
                    let mut task_cx = TaskContext::from_waker(&main_waker);
                    stats::add(&cx.shared.stats.tasks_polled, 1);
                    let polled = crate::coop::with_budget(|| fut.as_mut().poll(&mut task_cx));
                    if let Poll::Ready(out) = polled {
                        return Ok(out);
                    }
                }
            } else {
                run_task(cx, key);
            }
            cx.driver.after_task_poll();
        }

        // 2. I/O.
        let wait = match poll_wait(cx, last_event, ran_tasks) {
            // Paused, with work out that ends only in real time (a blocking
            // job, a file operation on the ring): wait for its result (a
            // wake through the inbox, or a completion), not for a deadline
            // of the paused clock.
            Wait::Sleep(Some(_)) if cx.clock.is_paused() && paused_clock_held(cx) => {
                Wait::Sleep(None)
            }
            wait => wait,
        };
        let park = match wait {
            // Paused time never sleeps until a deadline: look for I/O, and
            // if there is none, jump to the deadline below.
            Wait::Sleep(Some(_)) if cx.clock.is_paused() => Park::Skip,
            Wait::Sleep(deadline) if announce_sleep(cx) => {
                stats::add(&cx.shared.stats.poller_waits, 1);
                Park::Until(deadline)
            }
            _ => Park::Skip,
        };
        // A sleep or a spin may be idle time: when it began, for the load
        // meter. A turn that ran no task has done nothing since the last
        // poll returned, so a busy-polling spin reads no clock for it.
        let idle_from = match (park != Park::Skip || wait == Wait::Spin, ran_tasks) {
            (false, _) => None,
            (true, false) => Some(polled_at),
            (true, true) => Some(cx.clock.update()),
        };
        let events = match cx.driver.poll(park) {
            Ok(n) => n,
            Err(e) => panic!("the I/O driver failed and the worker cannot continue: {e}"),
        };
        cx.shared.doorbell.awake();
        if wait == Wait::Spin && events == 0 {
            stats::add(&cx.shared.stats.poller_spins, 1);
        }
        if events == 0 && cx.clock.is_paused() {
            auto_advance(cx, wait);
        }
        // An empty spin right after another reads no clock, up to a bound:
        // no task ran and nothing arrived, so nothing waits on the time.
        // `polled_at` then stays at the last reading, and the idle time
        // of the unread spins is counted at the next one.
        let empty_spin = wait == Wait::Spin && events == 0 && !ran_tasks;
        let now = if empty_spin && unclocked_spins + 1 < EMPTY_SPINS_PER_CLOCK_READ {
            unclocked_spins += 1;
            cx.clock.cached_ns()
        } else {
            unclocked_spins = 0;
            cx.clock.update()
        };
        polled_at = now;
        if let Some(from) = idle_from {
            // A spin that found events was work; a sleep was idle until they came.
            if wait != Wait::Spin || events == 0 {
                cx.load_meter.idle(now.saturating_sub(from));
            }
        }
        if events > 0 {
            last_event = now;
        }
        cx.load_meter.turn_ended(
            cx.clock.monotonic_ns(),
            cx.run_queue.borrow().len(),
            &cx.shared.load,
        );
        cx.turn.set(cx.turn.get() + 1);

        // 3. Inbox.
        if cx.shared.doorbell.is_pending() {
            let inbox = cx.shared.take_inbox();
            stats::add(&cx.shared.stats.remote_wakeups, 1);
            cx.run_queue.borrow_mut().extend(inbox.wakes);
            for f in inbox.runnables {
                // A runnable that panics (a `spawn_on` closure) reports
                // through its join handle; the worker carries on.
                drop_guarded(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
            }
            if inbox.shutdown {
                return Err(ShutdownRequested);
            }
            last_event = now;
        }

        // 4. Deferred wakes (the tasks the cooperative budget stopped
        // among them) and timers.
        let deferred = std::mem::take(&mut *cx.after_poll.borrow_mut());
        for w in deferred {
            w.wake();
        }
        crate::coop::wake_deferred();
        fire_timers(cx);
    }
}

/// Wakes the tasks the cooperative budget stopped when the loop ends.
struct WakeDeferred;

impl Drop for WakeDeferred {
    fn drop(&mut self) {
        crate::coop::wake_deferred();
    }
}

/// Polls one task, dropping it if it finished, panicked or was aborted.
pub(super) fn run_task(cx: &Context, key: TaskKey) {
    let (mut future, waker) = {
        let mut tasks = cx.tasks.borrow_mut();
        let Some(task) = tasks.get_mut(key) else { return };
        if task.is_aborted() {
            // Aborted from outside its runtime: drop it here, on its own worker.
            let task = tasks.remove(key);
            drop(tasks);
            drop_guarded(task);
            return;
        }
        let Some(future) = task.future.take() else { return };
        // A wake from now on (including from inside this poll) queues the task again.
        task.header.clear_scheduled();
        // Moved out for the poll and back after it: no reference-count
        // traffic per poll, as a clone would cost.
        (future, std::mem::replace(&mut task.waker, Waker::noop().clone()))
    };
    stats::add(&cx.shared.stats.tasks_polled, 1);
    let mut task_cx = TaskContext::from_waker(&waker);
    // A fresh budget for the poll (`coop.rs`); a task polled in place
    // inside another's poll leaves the other's budget as it was.
    let result = crate::coop::with_budget(|| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            future.as_mut().poll(&mut task_cx)
        }))
    });
    let done = match result {
        Ok(Poll::Ready(())) => true,
        Ok(Poll::Pending) => false,
        Err(payload) => {
            explain_panic(&*payload);
            *cx.panic_payload.borrow_mut() = Some((key, payload));
            true
        }
    };
    let mut tasks = cx.tasks.borrow_mut();
    let finished = match tasks.get_mut(key) {
        Some(task) if !done && !task.is_aborted() => {
            task.future = Some(future);
            task.waker = waker;
            return;
        }
        Some(_) => tasks.remove(key),
        None => None,
    };
    drop(tasks);
    // Dropped outside the borrow (destructors may spawn or close sockets),
    // and guarded: a destructor that panics must not take the worker down.
    drop_guarded(future);
    // The task's own waker (moved out for the poll), so that its header
    // may be kept for the next spawn if nothing else holds a clone.
    drop(waker);
    if let Some(task) = finished {
        // Only the runtime's own parts are left in it: no user destructor.
        cx.tasks.borrow_mut().retire(task);
    }
    cx.panic_payload.borrow_mut().take();
}

/// Adds what to do to a panic that tokio raises when a task calls a tokio
/// API that needs a tokio runtime (most often `tokio::time::sleep`).
fn explain_panic(payload: &(dyn std::any::Any + Send)) {
    let msg = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
    if msg.is_some_and(|m| m.contains("must be called from the context of a Tokio")) {
        crate::log::warn(format_args!(
            "a task called a tokio API that needs a tokio runtime on a hotloop worker: for \
             timers use hotloop::time::{{sleep, timeout, interval}} or \
             hotloop::tower::TimeoutLayer, or enable hotloop's `tokio-time` feature, which \
             hosts tokio's timer"
        ));
    }
}

/// Drops `value`, catching a panic from its destructor: the worker and
/// every other task carry on, and the panic is reported.
pub(crate) fn drop_guarded<T>(value: T) {
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(value)));
    if dropped.is_err() {
        crate::log::warn(format_args!("a task's destructor panicked; the worker carries on"));
    }
}

/// What the worker does in the driver this turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Work is queued: look for I/O without waiting.
    Now,
    /// Nothing queued, but busy polling says not to sleep.
    Spin,
    /// Sleep until an event or the wheel's earliest deadline, on the
    /// driver's clock (`None`: no timer).
    Sleep(Option<u64>),
}

/// Decides how the driver may wait this turn. A sleep is until the
/// wheel's earliest tick as an absolute time, so no clock reading is
/// needed for it; only a spin budget reads the clock again, and only when
/// tasks ran this turn (they took time; otherwise the reading after the
/// last poll is as good).
fn poll_wait(cx: &Context, last_event_ns: u64, ran_tasks: bool) -> Wait {
    if !cx.run_queue.borrow().is_empty()
        || !cx.after_poll.borrow().is_empty()
        || crate::coop::has_deferred()
    {
        return Wait::Now;
    }
    match cx.config.busy_poll {
        // A paused clock moves only when the worker would sleep (it jumps
        // to the next timer then): spinning would hold it still for good.
        _ if cx.clock.is_paused() => {}
        BusyPoll::Always => return Wait::Spin,
        BusyPoll::Adaptive { spin_budget } => {
            let now = if ran_tasks { cx.clock.update() } else { cx.clock.cached_ns() };
            if u128::from(now.saturating_sub(last_event_ns)) < spin_budget.as_nanos() {
                return Wait::Spin;
            }
        }
        BusyPoll::Off => {}
    }
    let next = cx.timers.borrow().next_deadline();
    Wait::Sleep(next.map(|tick| cx.clock.monotonic_at_tick(tick)))
}

/// Tells other threads the worker may block, so they write its eventfd;
/// false if something arrived in the inbox meanwhile (then it must not block).
/// The worker sets `sleeping` and then checks `inbox_pending`; a sender sets
/// `inbox_pending` and then checks `sleeping`: one of them sees the other.
fn announce_sleep(cx: &Context) -> bool {
    cx.shared.doorbell.announce_sleep()
}

/// True while work is in flight that a paused clock waits for rather than
/// jump past (the rule is in `time/paused.rs`): a job queued or running on
/// the blocking pool (the runtime's, whichever worker queued it), or a file
/// operation on this worker's ring. The loop then blocks until something
/// comes: a ring operation ends in a completion on this driver; the pool
/// unparks it when its last job ends, which may send nothing this way (a
/// dropped handle, a job awaited on another worker or queued from outside).
fn paused_clock_held(cx: &Context) -> bool {
    cx.clock.is_held() || cx.runtime.blocking.watch_jobs(&cx.shared.unpark)
}

/// With the clock paused and nothing to do (no task, no I/O event, no
/// message from another thread, no work out that holds the clock), moves
/// the clock to the next timer. Work that holds the clock makes the loop
/// wait instead (see `run`), so it never gets here.
fn auto_advance(cx: &Context, wait: Wait) {
    let Wait::Sleep(Some(_)) = wait else { return };
    if cx.shared.doorbell.is_pending() || !cx.run_queue.borrow().is_empty() {
        return;
    }
    let next = cx.timers.borrow().next_deadline();
    if let Some(tick) = next {
        cx.clock.advance_to_tick(tick);
    }
}

/// Wakes the tasks whose timers are due at the clock's current time.
pub(crate) fn fire_timers(cx: &Context) {
    let tick = cx.clock.tick_now();
    let mut due = Vec::new();
    {
        let mut timers = cx.timers.borrow_mut();
        match timers.next_deadline() {
            Some(next) if next <= tick => {}
            _ => return,
        }
        timers.poll(tick, TIMERS_PER_TURN_MAX, |_, waker| due.push(waker));
    }
    stats::add(&cx.shared.stats.timers_fired, due.len() as u64);
    for w in due {
        w.wake();
    }
}
