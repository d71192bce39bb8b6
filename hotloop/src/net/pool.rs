//! A per-worker pool of read buffers, so an idle connection holds none.
//!
//! [`TcpStream::read_pooled`](super::TcpStream::read_pooled) takes a buffer
//! from its worker's pool only when data is there to read. It is built on
//! the driver's readiness primitive: try a non-blocking read into a pooled
//! buffer, and on `WouldBlock` put the buffer back and wait for readiness
//! (an epoll edge; on io_uring, bytes in the socket's queue that its
//! multishot receive fills, or a `POLL_ADD` without a buffer ring), which
//! holds no buffer. Ten
//! thousand idle connections then cost ten thousand parked tasks, not ten
//! thousand buffers, on either driver.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

pub use crate::buf::pool::POOLED_BUFFER_BYTES;
use crate::buf::pool::{give, lend, take};
use crate::buf::PooledBuf;
use crate::coop;

use crate::driver::StreamSource;

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
    src: &'a StreamSource,
}

impl<'a> ReadPooled<'a> {
    pub(crate) fn new(src: &'a StreamSource) -> Self {
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
                // A read that completes takes a unit of the task's budget;
                // with none left, none is made (`coop.rs`).
                std::task::ready!(coop::poll_proceed(cx));
                let mut buf = take();
                match src.try_recv_into(&mut buf) {
                    Ok(_) => {
                        coop::spend();
                        return Poll::Ready(Ok(lend(buf)));
                    }
                    Err(e) => {
                        give(buf);
                        match e.kind() {
                            io::ErrorKind::WouldBlock => {}
                            io::ErrorKind::Interrupted => continue,
                            _ => {
                                coop::spend();
                                return Poll::Ready(Err(e));
                            }
                        }
                    }
                }
            }
            // The wait is not charged: the read after it is.
            std::task::ready!(coop::exempt(|| src.poll_readable(cx)))?;
        }
    }
}

impl std::fmt::Debug for ReadPooled<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadPooled").finish_non_exhaustive()
    }
}
