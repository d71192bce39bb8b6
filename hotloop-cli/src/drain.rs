//! Graceful stop for connection handlers: each worker's "stopping" flag and
//! the handlers parked on it.
//!
//! A handler wraps the waits it may give up on a stop (an idle keep-alive
//! connection waiting for its next request) in [`until_stop`]; [`begin`]
//! sets the flag on every worker and wakes those waits, so idle
//! connections close at once while busy ones finish.
//!
//! # Implementation notes
//! The flag is one process-wide atomic, set by [`begin`] at once, so a
//! handler busy with a request sees it when it picks its answer even if
//! its worker has not run anything else since. The parked wakers live in
//! a thread-local per worker, so a handler takes no lock to park; [`begin`]
//! wakes them by spawning a task on each worker after setting the flag,
//! so a handler that checked the flag before it was set and then parked is
//! woken by that task, and one that checks after sees it.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Poll, Waker};

use hotloop::Handle;

/// Set once the server is stopping.
static STOPPING: AtomicBool = AtomicBool::new(false);

#[derive(Default)]
struct Drain {
    /// Parked handlers' wakers; `None` marks a free slot, listed in `free`.
    parked: RefCell<Vec<Option<Waker>>>,
    free: RefCell<Vec<usize>>,
}

thread_local! {
    static DRAIN: Drain = Drain::default();
}

/// True once the server has been told to stop.
pub fn stopping() -> bool {
    STOPPING.load(Ordering::Relaxed)
}

/// Runs `f` until it completes (`Some`) or the server is told to stop
/// while `f` waits (`None`, also when the stop came before the call and
/// `f` is not ready at once).
pub async fn until_stop<F: Future>(f: F) -> Option<F::Output> {
    let mut f = pin!(f);
    let mut slot = Parked(None);
    poll_fn(|cx| {
        // `f` first: what is ready now (a request already in the socket) is
        // still taken after the stop.
        if let Poll::Ready(v) = f.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        if stopping() {
            return Poll::Ready(None);
        }
        slot.park(cx.waker());
        Poll::Pending
    })
    .await
}

/// A handler's slot among the parked wakers, freed when it drops.
struct Parked(Option<usize>);

impl Parked {
    fn park(&mut self, waker: &Waker) {
        DRAIN.with(|d| {
            let mut parked = d.parked.borrow_mut();
            match self.0 {
                Some(i) => {
                    if !parked[i].as_ref().is_some_and(|w| w.will_wake(waker)) {
                        parked[i] = Some(waker.clone());
                    }
                }
                None => {
                    let i = match d.free.borrow_mut().pop() {
                        Some(i) => i,
                        None => {
                            parked.push(None);
                            parked.len() - 1
                        }
                    };
                    parked[i] = Some(waker.clone());
                    self.0 = Some(i);
                }
            }
        })
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            // `try_with`: a handler dropped while its thread exits finds no drain.
            let _ = DRAIN.try_with(|d| {
                d.parked.borrow_mut()[i] = None;
                d.free.borrow_mut().push(i);
            });
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
