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
use std::marker::PhantomData;
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
    free: RefCell<Vec<u32>>,
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
    // The waker the list holds, to skip filing the same one again.
    let mut filed: Option<Waker> = None;
    poll_fn(|cx| {
        // `f` first: what is ready now is still taken after the stop.
        if let Poll::Ready(v) = f.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        let same = filed.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        let mut in_list = same;
        if watch.poll_stopped(cx.waker(), &mut in_list) {
            return Poll::Ready(None);
        }
        if !same {
            filed = Some(cx.waker().clone());
        }
        Poll::Pending
    })
    .await
}

/// A connection's registration for the stop: its slot in its worker's list
/// of parked handlers, taken at the first wait and freed on drop.
///
/// Only the slot's index is kept (4 bytes; the list is the worker's
/// thread-local, and a connection never leaves its worker). Whether the
/// list holds the connection's current waker is its owner's to know: a
/// connection's timer keeps one waker for its timer and its stop.
pub struct StopWatch {
    /// The index in this worker's list, or [`NO_SLOT`].
    slot: u32,
    /// Tied to its worker's thread, as the list is.
    _worker: PhantomData<Rc<()>>,
}

/// A [`StopWatch`] that has not filed a waker yet.
const NO_SLOT: u32 = u32::MAX;

impl Default for StopWatch {
    fn default() -> Self {
        StopWatch { slot: NO_SLOT, _worker: PhantomData }
    }
}

impl StopWatch {
    /// True if the server is stopping; otherwise files `waker` so that
    /// [`begin`] wakes it, unless `filed` says the list already holds it
    /// (or one that wakes the same task); `filed` is true afterwards.
    pub fn poll_stopped(&mut self, waker: &Waker, filed: &mut bool) -> bool {
        if stopping() {
            return true;
        }
        // The usual case: the same task parks again after its last request.
        // Its waker is still in the list, since only `begin` takes wakers
        // out, and it sets the flag first.
        if !*filed {
            self.file(waker);
            *filed = true;
        }
        false
    }

    #[cold]
    fn file(&mut self, waker: &Waker) {
        DRAIN.with(|d| {
            if self.slot == NO_SLOT {
                let i = d.free.borrow_mut().pop().unwrap_or_else(|| {
                    let mut parked = d.parked.borrow_mut();
                    parked.push(None);
                    u32::try_from(parked.len() - 1).expect("fewer than 2^32 parked handlers")
                });
                self.slot = i;
            }
            d.parked.borrow_mut()[self.slot as usize] = Some(waker.clone());
        });
    }
}

impl Drop for StopWatch {
    fn drop(&mut self) {
        if self.slot == NO_SLOT {
            return;
        }
        // The list is gone only when its thread ends, and with it the slot.
        let _ = DRAIN.try_with(|d| {
            d.parked.borrow_mut()[self.slot as usize] = None;
            d.free.borrow_mut().push(self.slot);
        });
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
