//! Each worker's idle read buffers, lent to reads that have data and
//! given back when the bytes are dropped. The pool lives in a
//! thread-local that the runtime opens when a worker starts on the thread
//! and closes when it ends; off a worker, buffers given back are freed.
//!
//! # Implementation notes
//! - A lent buffer goes back to the pool that lent it, wherever it is
//!   dropped. On the lending thread it goes onto the pool's own list, with
//!   no lock; on another thread (another worker, a `spawn_blocking`
//!   thread, any thread the bytes were sent to) onto the pool's [`Returns`],
//!   a locked list the owner takes from when its own runs dry. Kept by the
//!   dropping worker instead, a buffer sent on from its reader left the
//!   reader's pool empty (a new allocation per read) while the other
//!   worker's filled with buffers it might never use.
//! - Each list keeps at most [`POOL_IDLE_MAX`] buffers; more are freed, and
//!   so is every buffer given back to a pool whose worker has ended.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::PooledBuf;

/// The size of each pooled buffer.
pub const POOLED_BUFFER_BYTES: usize = 16 * 1024;

/// The most idle buffers a worker keeps on each of its two lists (its own,
/// and the one other threads give back to); more are freed.
pub(crate) const POOL_IDLE_MAX: usize = 1024;

/// A worker's idle buffers.
struct BufPool {
    idle: Vec<Vec<u8>>,
    /// True while this thread runs a worker: off a worker, buffers given
    /// back are freed rather than kept by a thread that will not read.
    open: bool,
    /// Where other threads give this pool's buffers back; made when a
    /// worker first opens the pool on this thread.
    returns: Option<Arc<Returns>>,
}

impl BufPool {
    fn take(&mut self) -> Vec<u8> {
        if self.idle.is_empty() {
            if let Some(returns) = &self.returns {
                returns.take_all(&mut self.idle);
            }
        }
        self.idle.pop().unwrap_or_else(|| Vec::with_capacity(POOLED_BUFFER_BYTES))
    }

    fn give(&mut self, mut buf: Vec<u8>) {
        if self.open && self.idle.len() < POOL_IDLE_MAX && buf.capacity() == POOLED_BUFFER_BYTES {
            buf.clear();
            self.idle.push(buf);
        }
    }

    /// True if `home` is this pool's list of buffers given back.
    fn is_home(&self, home: &Arc<Returns>) -> bool {
        self.returns.as_ref().is_some_and(|r| Arc::ptr_eq(r, home))
    }
}

/// A pool's buffers given back from other threads.
pub(crate) struct Returns {
    list: Mutex<ReturnList>,
    /// The list's length, for the owner to see without the lock that it
    /// is empty.
    len: AtomicUsize,
}

struct ReturnList {
    idle: Vec<Vec<u8>>,
    /// False once the owner's worker has ended: buffers are then freed.
    open: bool,
}

impl Returns {
    fn lock(&self) -> std::sync::MutexGuard<'_, ReturnList> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `buf` for the owner, or frees it (the list is full, or the
    /// owner's worker has ended).
    fn give(&self, mut buf: Vec<u8>) {
        let mut list = self.lock();
        if list.open && list.idle.len() < POOL_IDLE_MAX && buf.capacity() == POOLED_BUFFER_BYTES {
            buf.clear();
            list.idle.push(buf);
            self.len.store(list.idle.len(), Ordering::Relaxed);
        }
    }

    /// Moves every buffer given back onto `idle` (the owner's, empty).
    fn take_all(&self, idle: &mut Vec<Vec<u8>>) {
        if self.len.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut list = self.lock();
        std::mem::swap(idle, &mut list.idle);
        self.len.store(0, Ordering::Relaxed);
    }

    /// Opens or closes the list; closing frees what it holds.
    fn set_open(&self, open: bool) {
        let freed = {
            let mut list = self.lock();
            list.open = open;
            self.len.store(0, Ordering::Relaxed);
            std::mem::take(&mut list.idle)
        };
        drop(freed);
    }
}

thread_local! {
    // A thread-local of its own rather than a field of the worker's
    // context: a read takes and gives back a buffer, and reaching it
    // through the context (a thread-local, a borrow of the current
    // context, then the pool's own cell) cost about 100 instructions per
    // request.
    static POOL: RefCell<BufPool> = const {
        RefCell::new(BufPool { idle: Vec::new(), open: false, returns: None })
    };
}

/// Starts keeping idle buffers on this thread: it now runs a worker.
pub(crate) fn open() {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        p.open = true;
        let returns = p.returns.get_or_insert_with(|| {
            let list = ReturnList { idle: Vec::new(), open: true };
            Arc::new(Returns { list: Mutex::new(list), len: AtomicUsize::new(0) })
        });
        returns.set_open(true);
    });
}

/// Stops keeping idle buffers on this thread and frees those it kept: its
/// worker has finished.
pub(crate) fn close() {
    let _ = POOL.try_with(|p| {
        let (idle, returns) = {
            let mut p = p.borrow_mut();
            p.open = false;
            (std::mem::take(&mut p.idle), p.returns.clone())
        };
        drop(idle);
        if let Some(returns) = returns {
            returns.set_open(false);
        }
    });
}

/// Takes a buffer from this worker's pool (a new one if it is empty).
pub(crate) fn take() -> Vec<u8> {
    POOL.try_with(|p| p.borrow_mut().take())
        .unwrap_or_else(|_| Vec::with_capacity(POOLED_BUFFER_BYTES))
}

/// Returns a buffer taken but not lent to this worker's pool (or frees it
/// off a worker).
pub(crate) fn give(buf: Vec<u8>) {
    let _ = POOL.try_with(move |p| {
        if let Ok(mut p) = p.try_borrow_mut() {
            p.give(buf);
        }
    });
}

/// Lends `buf`, taken from this thread's pool, as bytes read: it comes
/// back to this pool when dropped, on whatever thread.
pub(crate) fn lend(buf: Vec<u8>) -> PooledBuf {
    let home = POOL.try_with(|p| p.try_borrow().ok().and_then(|p| p.returns.clone()));
    PooledBuf::lent(buf, home.ok().flatten())
}

/// Gives a lent buffer back to `home`, its pool: onto the pool's own list
/// on the pool's thread, else onto the list other threads give back to.
pub(crate) fn give_back(buf: Vec<u8>, home: &Arc<Returns>) {
    let mut buf = Some(buf);
    let _ = POOL.try_with(|p| {
        if let Ok(mut p) = p.try_borrow_mut() {
            if p.is_home(home) {
                p.give(buf.take().expect("given once"));
            }
        }
    });
    if let Some(buf) = buf {
        home.give(buf);
    }
}

/// How many idle buffers this thread's pool keeps: on its own list, and
/// given back from other threads.
#[cfg(test)]
fn idle_counts() -> (usize, usize) {
    POOL.with(|p| {
        let p = p.borrow();
        let returned = p.returns.as_ref().map_or(0, |r| r.lock().idle.len());
        (p.idle.len(), returned)
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::mpsc;

    use super::*;

    /// A thread standing for a worker: its pool open while `f` runs.
    fn worker<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(move || {
            open();
            let out = f();
            close();
            out
        })
        .join()
        .unwrap()
    }

    fn addresses(bufs: &[PooledBuf]) -> HashSet<usize> {
        bufs.iter().map(|b| b.as_ptr() as usize).collect()
    }

    /// Buffers lent on one worker and dropped on another (or on a plain
    /// thread) go back to the lender, which reuses them; the other
    /// worker's pool keeps none of them, and the lender's lists stay
    /// within their bound however many are dropped elsewhere.
    #[test]
    fn buffers_dropped_off_their_worker_go_back_to_it() {
        const ROUND: usize = 64;
        let (to_b, on_b) = mpsc::channel::<Vec<PooledBuf>>();
        let (b_done, b_dropped) = mpsc::channel::<(usize, usize)>();
        let b = std::thread::spawn(move || {
            open();
            for bufs in on_b {
                drop(bufs);
                b_done.send(idle_counts()).unwrap();
            }
            close();
        });
        worker(move || {
            let lend_round = || (0..ROUND).map(|_| lend(take())).collect::<Vec<_>>();
            let first = addresses(&lend_round());
            assert_eq!(idle_counts(), (ROUND, 0), "dropped on the lender, kept on its own list");
            for round in 0..40 {
                let bufs = lend_round();
                assert_eq!(addresses(&bufs), first, "round {round}: the lender reuses its buffers");
                if round % 2 == 0 {
                    to_b.send(bufs).unwrap();
                    assert_eq!(b_dropped.recv().unwrap(), (0, 0), "the other worker keeps none");
                } else {
                    std::thread::spawn(move || drop(bufs)).join().unwrap();
                }
                assert_eq!(idle_counts(), (0, ROUND), "given back to the lender");
            }
            // More than a list holds, all dropped elsewhere: the rest is freed.
            let many: Vec<_> = (0..POOL_IDLE_MAX + ROUND).map(|_| lend(take())).collect();
            std::thread::spawn(move || drop(many)).join().unwrap();
            assert_eq!(idle_counts(), (0, POOL_IDLE_MAX));
            drop(to_b);
        });
        b.join().unwrap();
    }

    /// Once its worker has ended, a pool frees what is given back to it.
    #[test]
    fn a_closed_pool_frees_what_comes_back() {
        let (bufs, home) = worker(|| {
            let bufs: Vec<_> = (0..8).map(|_| lend(take())).collect();
            (bufs, POOL.with(|p| p.borrow().returns.clone().unwrap()))
        });
        drop(bufs);
        assert_eq!(home.lock().idle.len(), 0);
        assert!(!home.lock().open);
    }
}
