//! Borrowed-slice reads and writes (the poll form behind tokio's and
//! futures' I/O traits) on a completion driver.
//!
//! # Implementation notes
//! The kernel may write into a read's buffer after the caller's slice is
//! gone, so a stream reads into a buffer it owns ([`StreamBuffers`]) and
//! copies out; a write copies the caller's bytes into an owned buffer
//! before submitting. At most one read and one write are in flight per
//! stream. A write that returned `Pending` has already taken a copy of the
//! caller's bytes: the caller must call again with the same bytes (the
//! `AsyncWrite` contract), and gets the count the kernel sent.
//! Dropping the stream drops the in-flight operations, which hands their
//! buffers to the driver until their last completion ([`super::op`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use io_uring::{opcode, types};

use super::op::{is_retry, Op};
use crate::driver::Source;

/// Bytes per owned read buffer and most bytes copied per write.
const STREAM_BUFFER_BYTES: usize = 16 * 1024;

/// What one direction of a stream is waiting for.
enum Pending<T: 'static> {
    /// Nothing in flight.
    Idle,
    /// The data operation.
    Data(Op<T>),
    /// Readiness after the kernel answered `EAGAIN`.
    Ready(Op<()>),
}

/// A stream's owned buffers for the poll-based I/O traits.
pub(crate) struct StreamBuffers {
    read: Pending<Vec<u8>>,
    /// Received bytes not yet handed out, from `filled_pos`.
    filled: Vec<u8>,
    filled_pos: usize,
    write: Pending<Vec<u8>>,
    /// A write buffer kept for the next write.
    write_spare: Vec<u8>,
}

impl Default for StreamBuffers {
    fn default() -> Self {
        StreamBuffers {
            read: Pending::Idle,
            filled: Vec::new(),
            filled_pos: 0,
            write: Pending::Idle,
            write_spare: Vec::new(),
        }
    }
}

/// Submits a readiness poll for `events` on `fd`.
fn submit_poll(fd: i32, events: i16) -> io::Result<Op<()>> {
    let entry = opcode::PollAdd::new(types::Fd(fd), events as u32).build();
    // SAFETY: a poll entry points at no memory.
    unsafe { Op::submit(entry, ()) }.map_err(|(e, ())| e)
}

/// Reads into `dst` through the stream's owned buffer.
pub(crate) fn poll_read_slice(
    src: &Source,
    cx: &mut TaskContext<'_>,
    dst: &mut [u8],
) -> Poll<io::Result<usize>> {
    if dst.is_empty() {
        return Poll::Ready(Ok(0));
    }
    let mut cell = src.uring_buffers.borrow_mut();
    let sb = cell.get_or_insert_with(Box::default);
    loop {
        if sb.filled_pos < sb.filled.len() {
            let n = dst.len().min(sb.filled.len() - sb.filled_pos);
            dst[..n].copy_from_slice(&sb.filled[sb.filled_pos..sb.filled_pos + n]);
            sb.filled_pos += n;
            return Poll::Ready(Ok(n));
        }
        match &mut sb.read {
            Pending::Idle => {
                let mut buf = std::mem::take(&mut sb.filled);
                buf.clear();
                buf.reserve(STREAM_BUFFER_BYTES);
                sb.filled_pos = 0;
                let len = buf.capacity().min(u32::MAX as usize) as u32;
                let entry = opcode::Recv::new(types::Fd(src.fd()), buf.as_mut_ptr(), len).build();
                // SAFETY: the entry points at `buf`'s heap block of `len` writable bytes; the op owns
                // `buf` (the block does not move with it) until its last completion.
                match unsafe { Op::submit(entry, buf) } {
                    Ok(op) => sb.read = Pending::Data(op),
                    Err((e, buf)) => {
                        sb.filled = buf;
                        return Poll::Ready(Err(e));
                    }
                }
            }
            Pending::Data(op) => {
                let (cqe, mut buf) = std::task::ready!(Pin::new(op).poll(cx));
                sb.read = Pending::Idle;
                match cqe.result() {
                    Ok(n) => {
                        // SAFETY: the kernel wrote `n` bytes at the start of the buffer.
                        unsafe { buf.set_len(n as usize) };
                        sb.filled = buf;
                        if n == 0 {
                            return Poll::Ready(Ok(0));
                        }
                    }
                    Err(e) if is_retry(&e) => {
                        sb.filled = buf;
                        sb.read = Pending::Ready(submit_poll(src.fd(), libc::POLLIN)?);
                    }
                    Err(e) => {
                        sb.filled = buf;
                        return Poll::Ready(Err(e));
                    }
                }
            }
            Pending::Ready(op) => {
                let (cqe, ()) = std::task::ready!(Pin::new(op).poll(cx));
                sb.read = Pending::Idle;
                cqe.result()?;
            }
        }
    }
}

/// Writes from `data` through the stream's owned buffer.
pub(crate) fn poll_write_slice(
    src: &Source,
    cx: &mut TaskContext<'_>,
    data: &[u8],
) -> Poll<io::Result<usize>> {
    if data.is_empty() {
        return Poll::Ready(Ok(0));
    }
    let mut cell = src.uring_buffers.borrow_mut();
    let sb = cell.get_or_insert_with(Box::default);
    loop {
        match &mut sb.write {
            Pending::Idle => {
                let mut buf = std::mem::take(&mut sb.write_spare);
                buf.clear();
                buf.extend_from_slice(&data[..data.len().min(STREAM_BUFFER_BYTES * 4)]);
                let len = buf.len().min(u32::MAX as usize) as u32;
                let entry = opcode::Send::new(types::Fd(src.fd()), buf.as_ptr(), len)
                    .flags(libc::MSG_NOSIGNAL)
                    .build();
                // SAFETY: the entry points at `buf`'s `len` initialised bytes in a heap block that
                // does not move with `buf`; the op owns `buf` until its last completion.
                match unsafe { Op::submit(entry, buf) } {
                    Ok(op) => sb.write = Pending::Data(op),
                    Err((e, buf)) => {
                        sb.write_spare = buf;
                        return Poll::Ready(Err(e));
                    }
                }
            }
            Pending::Data(op) => {
                let (cqe, buf) = std::task::ready!(Pin::new(op).poll(cx));
                sb.write = Pending::Idle;
                sb.write_spare = buf;
                match cqe.result() {
                    Ok(n) => return Poll::Ready(Ok(n as usize)),
                    Err(e) if is_retry(&e) => {
                        sb.write = Pending::Ready(submit_poll(src.fd(), libc::POLLOUT)?);
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            Pending::Ready(op) => {
                let (cqe, ()) = std::task::ready!(Pin::new(op).poll(cx));
                sb.write = Pending::Idle;
                cqe.result()?;
            }
        }
    }
}
