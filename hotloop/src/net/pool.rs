//! A per-worker pool of read buffers, so an idle connection holds none.
//!
//! [`TcpStream::read_pooled`](super::TcpStream::read_pooled) takes a buffer
//! from its worker's pool only when data is there to read. It is built on
//! the driver's readiness primitive: try a non-blocking read into a pooled
//! buffer, and on `WouldBlock` put the buffer back and wait for readiness
//! (an epoll edge, or an io_uring `POLL_ADD`), which holds no buffer. Ten
//! thousand idle connections then cost ten thousand parked tasks, not ten
//! thousand buffers, on either driver.

use std::io;

pub use crate::buf::PooledBuf;
use crate::driver::Source;
use crate::runtime::context;

/// Reads into a buffer from the current worker's pool, taken only once
/// there is data. An empty result means the peer closed its side.
pub(crate) async fn read_pooled(src: &Source) -> io::Result<PooledBuf> {
    loop {
        // On epoll, a socket that the last read drained waits for an edge
        // first instead of making a read that would fail.
        if src.may_read_now() {
            let mut buf = take();
            match src.try_recv_into(&mut buf) {
                Ok(_) => return Ok(PooledBuf::lent(buf, give)),
                Err(e) => {
                    give(buf);
                    match e.kind() {
                        io::ErrorKind::WouldBlock => {}
                        io::ErrorKind::Interrupted => continue,
                        _ => return Err(e),
                    }
                }
            }
        }
        src.readable().await?;
    }
}

/// The size of each pooled buffer.
pub const POOLED_BUFFER_BYTES: usize = 16 * 1024;

/// The most idle buffers a worker keeps; more are freed.
pub(crate) const POOL_IDLE_MAX: usize = 1024;

/// A worker's idle buffers.
#[derive(Default)]
pub(crate) struct BufPool {
    idle: Vec<Vec<u8>>,
}

impl BufPool {
    pub(crate) fn take(&mut self) -> Vec<u8> {
        self.idle.pop().unwrap_or_else(|| Vec::with_capacity(POOLED_BUFFER_BYTES))
    }

    pub(crate) fn give(&mut self, mut buf: Vec<u8>) {
        if self.idle.len() < POOL_IDLE_MAX && buf.capacity() == POOLED_BUFFER_BYTES {
            buf.clear();
            self.idle.push(buf);
        }
    }
}

/// Takes a buffer from the current worker's pool.
pub(crate) fn take() -> Vec<u8> {
    context::with(|cx| cx.buf_pool.borrow_mut().take())
}

/// Returns a buffer to the current worker's pool (or frees it off a worker).
pub(crate) fn give(buf: Vec<u8>) {
    context::try_with(|cx| cx.buf_pool.borrow_mut().give(buf));
}
