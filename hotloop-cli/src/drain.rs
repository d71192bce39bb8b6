//! Graceful stop for connection handlers: each worker's "stopping" flag and
//! the handlers parked on it.
//!
//! A handler polls [`StopWatch::poll_stopped`] while it waits for something
//! it may give up on a stop (an idle keep-alive connection waiting for its
//! next request); [`begin`] sets the flag on every worker and wakes those
//! handlers, so idle connections close at once while busy ones finish.
//!
//! # Implementation notes
//! The flag is one process-wide atomic, set by [`begin`] at once, so a
//! handler busy with a request sees it when it picks its answer even if
//! its worker has not run anything else since. The parked wakers live in
//! a per-worker list; a connection takes its slot once, at its first idle
//! wait, and keeps it until it closes, so an idle wait costs an atomic
//! load and a waker comparison, not a thread-local lookup and a slot taken
//! and freed per request. [`begin`] wakes the list by spawning a task on
//! each worker after setting the flag, so a handler that checked the flag
//! before it was set and then parked is woken by that task, and one that
//! checks after sees it. A handler woken while it is busy, not idle, just
//! polls again.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Poll, Waker};

use hotloop::Handle;

/// Set once the server is stopping.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// One worker's parked handlers.
#[derive(Default)]
struct Drain {
    /// Parked handlers' wakers; `None` marks a slot whose waker was taken
    /// (or never set); free slots are listed in `free`.
    parked: RefCell<Vec<Option<Waker>>>,
    free: RefCell<Vec<usize>>,
}

thread_local! {
    static DRAIN: Rc<Drain> = Rc::default();
}

/// True once the server has been told to stop.
pub fn stopping() -> bool {
    STOPPING.load(Ordering::Relaxed)
}

/// Runs `f` until it completes (`Some`) or the server is told to stop
/// while `f` waits (`None`, also when the stop came before the call and
/// `f` is not ready at once). For waits that are not on the request path
/// (a QUIC connection waiting for its next stream); an HTTP connection's
/// idle read polls its [`StopWatch`] directly.
pub async fn until_stop<F: Future>(f: F) -> Option<F::Output> {
    let mut f = pin!(f);
    let mut watch = StopWatch::default();
    poll_fn(|cx| {
        // `f` first: what is ready now is still taken after the stop.
        if let Poll::Ready(v) = f.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        if watch.poll_stopped(cx.waker()) {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

/// A connection's registration for the stop: its slot in its worker's list
/// of parked handlers, taken at the first wait and freed on drop.
#[derive(Default)]
pub struct StopWatch {
    /// The worker's list and this connection's slot in it.
    slot: Option<(Rc<Drain>, usize)>,
    /// The waker last filed, to skip filing the same one again.
    filed: Option<Waker>,
}

impl StopWatch {
    /// True if the server is stopping; otherwise files `waker` so that
    /// [`begin`] wakes it.
    pub fn poll_stopped(&mut self, waker: &Waker) -> bool {
        if stopping() {
            return true;
        }
        // The usual case: the same task parks again after its last request.
        // Its waker is still in the list, since only `begin` takes wakers
        // out, and it sets the flag first.
        if self.filed.as_ref().is_some_and(|w| w.will_wake(waker)) {
            return false;
        }
        self.file(waker);
        false
    }

    #[cold]
    fn file(&mut self, waker: &Waker) {
        let (drain, i) = self.slot.get_or_insert_with(|| {
            DRAIN.with(|d| {
                let i = d.free.borrow_mut().pop().unwrap_or_else(|| {
                    let mut parked = d.parked.borrow_mut();
                    parked.push(None);
                    parked.len() - 1
                });
                (d.clone(), i)
            })
        });
        drain.parked.borrow_mut()[*i] = Some(waker.clone());
        self.filed = Some(waker.clone());
    }
}

impl Drop for StopWatch {
    fn drop(&mut self) {
        if let Some((drain, i)) = self.slot.take() {
            drain.parked.borrow_mut()[i] = None;
            drain.free.borrow_mut().push(i);
        }
    }
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
            let wakers: Vec<Waker> =
                DRAIN.with(|d| d.parked.borrow_mut().iter_mut().filter_map(Option::take).collect());
            for w in wakers {
                w.wake();
            }
        }));
    }
}
