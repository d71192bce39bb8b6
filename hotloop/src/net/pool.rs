//! A per-worker pool of read buffers, so an idle connection holds none.
//!
//! [`TcpStream::read_pooled`](super::TcpStream::read_pooled) takes a buffer
//! from its worker's pool only when data is there to read. It is built on
//! the driver's readiness primitive: try a non-blocking read into a pooled
//! buffer, and on `WouldBlock` put the buffer back and wait for readiness
//! (an epoll edge, or an io_uring `POLL_ADD`), which holds no buffer. Ten
//! thousand idle connections then cost ten thousand parked tasks, not ten
//! thousand buffers, on either driver.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

pub use crate::buf::PooledBuf;
use crate::driver::Source;

/// The future of [`TcpStream::read_pooled`](super::TcpStream::read_pooled):
/// a buffer from the worker's pool with what the socket had, taken only
/// once data is there. An empty buffer means the peer closed its side.
///
/// A named future rather than an `async fn`, so a read is one poll
/// function, not a chain of nested state machines. It keeps no state: a
/// wait in progress is held by the socket (epoll's readiness bits, or
/// io_uring's receive queue or readiness poll), so dropping the future
/// between polls loses nothing.
#[must_use = "futures do nothing unless polled"]
pub struct ReadPooled<'a> {
    src: &'a Source,
}

impl<'a> ReadPooled<'a> {
    pub(crate) fn new(src: &'a Source) -> Self {
        ReadPooled { src }
    }
}

impl Future for ReadPooled<'_> {
    type Output = io::Result<PooledBuf>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let src = self.src;
        loop {
            // On epoll, a socket that the last read drained waits for an
            // edge first instead of making a read that would fail.
            if src.may_read_now() {
                let mut buf = take();
                match src.try_recv_into(&mut buf) {
                    Ok(_) => return Poll::Ready(Ok(PooledBuf::lent(buf, give))),
                    Err(e) => {
                        give(buf);
                        match e.kind() {
                            io::ErrorKind::WouldBlock => {}
                            io::ErrorKind::Interrupted => continue,
                            _ => return Poll::Ready(Err(e)),
                        }
                    }
                }
            }
            std::task::ready!(src.poll_readable(cx))?;
        }
    }
}

impl std::fmt::Debug for ReadPooled<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadPooled").finish_non_exhaustive()
    }
}

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
