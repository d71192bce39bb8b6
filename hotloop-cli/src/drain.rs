//! Graceful stop for connection handlers: the "stopping" flag, and the
//! wake that makes every parked handler look at it.
//!
//! A handler checks [`stopping`] whenever it waits for something it may
//! give up on a stop (an idle keep-alive connection waiting for its next
//! request); [`begin`] sets the flag and wakes every task of every worker,
//! so idle connections close (once quiet: `conn/timer.rs`) while busy ones
//! finish. The same happens when a successor has taken the sockets over.
//!
//! # Implementation notes
//! The flag is one process-wide atomic, set by [`begin`] at once, so a
//! handler busy with a request sees it when it picks its answer even if
//! its worker has not run anything else since. No list of parked handlers
//! is kept: [`begin`] spawns a task on each worker, after setting the
//! flag, that wakes every task there ([`hotloop::task::wake_all`]). A
//! handler that checked the flag before it was set and then parked is
//! woken by that task, and one that checks after sees it. A task woken
//! while it is busy, or that does not care about the stop, polls again
//! and parks. So an idle connection holds nothing for the stop (a list
//! slot was 16 bytes of every idle connection's memory), and an idle wait
//! costs one atomic load.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use hotloop::Handle;

/// Set once the server is stopping.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// `--drain-idle-quiet-ms`, in milliseconds; `u64::MAX` for none (at or
/// above the drain timeout: see [`set_idle_quiet`]).
static IDLE_QUIET_MS: AtomicU64 = AtomicU64::new(hotloop::net::DRAIN_IDLE_QUIET.as_millis() as u64);

/// Sets how long, during a drain, a connection waiting for its client's
/// next request must have been quiet before it is closed (the hand-written
/// handlers read it through [`idle_quiet`]; the hyper ones get it in their
/// `ServerOptions`). At or above `drain_timeout` (every drain's, SIGTERM's
/// or a hand-over's) none is closed for being idle before the drain's
/// deadline, however long it was idle before the stop: each is closed
/// after answering its next request, or cut at the deadline. Called once
/// at start-up.
pub fn set_idle_quiet(quiet: Duration, drain_timeout: Duration) {
    let ms = if quiet >= drain_timeout {
        u64::MAX
    } else {
        u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX - 1)
    };
    IDLE_QUIET_MS.store(ms, Ordering::Relaxed);
}

/// See [`set_idle_quiet`]: `None` when idle connections are not closed
/// for a stop.
pub fn idle_quiet() -> Option<Duration> {
    let ms = IDLE_QUIET_MS.load(Ordering::Relaxed);
    (ms != u64::MAX).then(|| Duration::from_millis(ms))
}

/// True once the server has been told to stop.
pub fn stopping() -> bool {
    STOPPING.load(Ordering::Relaxed)
}

/// Runs `f` until it completes (`Some`) or the server is told to stop
/// while `f` waits (`None`, also when the stop came before the call and
/// `f` is not ready at once). For waits that are not on the request path
/// (a QUIC connection waiting for its next stream); an HTTP connection's
/// idle read checks [`stopping`] directly.
pub async fn until_stop<F: Future>(f: F) -> Option<F::Output> {
    let mut f = pin!(f);
    poll_fn(|cx| {
        // `f` first: what is ready now is still taken after the stop.
        if let Poll::Ready(v) = f.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        if stopping() {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

/// Tells every worker of `handle`'s runtime to stop: [`stopping`] says so
/// from now on, and waits wrapped in [`until_stop`] end.
pub fn begin(handle: &Handle) {
    // The spawn below carries this store to each worker (its queue hand-off
    // synchronises), so the woken handlers see it.
    STOPPING.store(true, Ordering::SeqCst);
    for worker in 0..handle.workers() {
        // Detached: the task runs once on the worker and ends.
        drop(handle.spawn_on(worker, || async {
            hotloop::task::wake_all();
        }));
    }
}
