//! Each worker's idle read buffers, lent to reads that have data and
//! given back when the bytes are dropped. The pool lives in a
//! thread-local that the runtime opens when a worker starts on the thread
//! and closes when it ends; off a worker, buffers given back are freed.

use std::cell::RefCell;

/// The size of each pooled buffer.
pub const POOLED_BUFFER_BYTES: usize = 16 * 1024;

/// The most idle buffers a worker keeps; more are freed.
pub(crate) const POOL_IDLE_MAX: usize = 1024;

/// A worker's idle buffers.
struct BufPool {
    idle: Vec<Vec<u8>>,
    /// True while this thread runs a worker: off a worker, buffers given
    /// back are freed rather than kept by a thread that will not read.
    open: bool,
}

impl BufPool {
    fn take(&mut self) -> Vec<u8> {
        self.idle.pop().unwrap_or_else(|| Vec::with_capacity(POOLED_BUFFER_BYTES))
    }

    fn give(&mut self, mut buf: Vec<u8>) {
        if self.open && self.idle.len() < POOL_IDLE_MAX && buf.capacity() == POOLED_BUFFER_BYTES {
            buf.clear();
            self.idle.push(buf);
        }
    }
}

thread_local! {
    // A thread-local of its own rather than a field of the worker's
    // context: a read takes and gives back a buffer, and reaching it
    // through the context (a thread-local, a borrow of the current
    // context, then the pool's own cell) cost about 100 instructions per
    // request.
    static POOL: RefCell<BufPool> = const {
        RefCell::new(BufPool { idle: Vec::new(), open: false })
    };
}

/// Starts keeping idle buffers on this thread: it now runs a worker.
pub(crate) fn open() {
    POOL.with(|p| p.borrow_mut().open = true);
}

/// Stops keeping idle buffers on this thread and frees those it kept: its
/// worker has finished.
pub(crate) fn close() {
    let _ = POOL.try_with(|p| {
        let idle = {
            let mut p = p.borrow_mut();
            p.open = false;
            std::mem::take(&mut p.idle)
        };
        drop(idle);
    });
}

/// Takes a buffer from this worker's pool (a new one if it is empty).
pub(crate) fn take() -> Vec<u8> {
    POOL.try_with(|p| p.borrow_mut().take())
        .unwrap_or_else(|_| Vec::with_capacity(POOLED_BUFFER_BYTES))
}

/// Returns a buffer to this worker's pool (or frees it off a worker).
pub(crate) fn give(buf: Vec<u8>) {
    let _ = POOL.try_with(move |p| {
        if let Ok(mut p) = p.try_borrow_mut() {
            p.give(buf);
        }
    });
}
