//! Borrowed-slice reads and writes (the poll form behind tokio's and
//! futures' I/O traits) on a completion driver.
//!
//! # Implementation notes
//! - Reads: the kernel may write into a read's buffer after the caller's
//!   slice is gone, so a stream reads into a buffer it owns and copies out.
//! - Writes are written behind: `poll_write` copies the caller's bytes
//!   into a buffer the stream owns, submits the send and returns their
//!   count at once, as a buffered writer does. `AsyncWrite` promises
//!   nothing about what a caller passes next, so a write that returned
//!   `Pending` must have taken nothing; one that returned `Ok(n)` must not
//!   depend on the caller's slice again. A later `poll_write`,
//!   `poll_flush` or shutdown first waits for the send in flight (sending
//!   the rest if the kernel took part), and reports its error if it
//!   failed. At most [`WRITE_BEHIND_MAX_BYTES`] are taken per call.
//! - Dropping the stream cancels a read in flight; a send in flight is
//!   left to finish for up to [`super::WRITE_LINGER`], like the bytes of a
//!   closed socket in the kernel's send buffer.

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use io_uring::opcode;

use super::op::{OnDrop, Op};
use super::socket::{is_retry, Source};

/// Bytes per owned read buffer.
const READ_BUFFER_BYTES: usize = 16 * 1024;
/// The most bytes one `poll_write` takes.
const WRITE_BEHIND_MAX_BYTES: usize = 64 * 1024;

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
pub(super) struct StreamBuffers {
    read: Pending<Vec<u8>>,
    /// Received bytes not yet handed out, from `filled_pos`.
    filled: Vec<u8>,
    filled_pos: usize,
    write: Pending<Vec<u8>>,
    /// Bytes of the buffer in flight that earlier completions already sent.
    write_sent: usize,
    /// The buffer of the last finished write, kept for the next one.
    write_spare: Vec<u8>,
}

impl Default for StreamBuffers {
    fn default() -> Self {
        StreamBuffers {
            read: Pending::Idle,
            filled: Vec::new(),
            filled_pos: 0,
            write: Pending::Idle,
            write_sent: 0,
            write_spare: Vec::new(),
        }
    }
}

impl StreamBuffers {
    /// True while a write taken by `poll_write` is still being sent.
    pub(super) fn is_writing(&self) -> bool {
        !matches!(self.write, Pending::Idle)
    }

    /// Reads into `dst` through the owned buffer.
    pub(super) fn poll_read(
        &mut self,
        src: &Source,
        cx: &mut TaskContext<'_>,
        dst: &mut [MaybeUninit<u8>],
    ) -> Poll<io::Result<usize>> {
        if dst.is_empty() {
            return Poll::Ready(Ok(0));
        }
        loop {
            if self.filled_pos < self.filled.len() {
                let n = dst.len().min(self.filled.len() - self.filled_pos);
                let src = &self.filled[self.filled_pos..self.filled_pos + n];
                // SAFETY: `dst` has room for `n` bytes, `src` holds `n`
                // initialised bytes, and the two never overlap (`filled` is
                // this buffer's own heap block).
                unsafe {
                    std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<u8>(), n)
                };
                self.filled_pos += n;
                return Poll::Ready(Ok(n));
            }
            match &mut self.read {
                Pending::Idle => {
                    let mut buf = std::mem::take(&mut self.filled);
                    buf.clear();
                    buf.reserve(READ_BUFFER_BYTES);
                    self.filled_pos = 0;
                    let len = buf.capacity().min(u32::MAX as usize) as u32;
                    let entry =
                        opcode::Recv::new(io_uring::types::Fd(src.fd()), buf.as_mut_ptr(), len)
                            .build();
                    // SAFETY: the entry points at `buf`'s heap block of `len` writable bytes; the
                    // op owns `buf` (the block does not move with it) until its last completion.
                    match unsafe { src.submit(entry, buf, OnDrop::Cancel) } {
                        Ok(op) => self.read = Pending::Data(op),
                        Err((e, buf)) => {
                            self.filled = buf;
                            return Poll::Ready(Err(e));
                        }
                    }
                }
                Pending::Data(op) => {
                    let (cqe, mut buf) = std::task::ready!(Pin::new(op).poll(cx));
                    self.read = Pending::Idle;
                    match cqe.result() {
                        Ok(n) => {
                            // SAFETY: the kernel wrote `n` bytes at the start of the buffer.
                            unsafe { buf.set_len(n as usize) };
                            self.filled = buf;
                            if n == 0 {
                                return Poll::Ready(Ok(0));
                            }
                        }
                        Err(e) if is_retry(&e) => {
                            self.filled = buf;
                            self.read = Pending::Ready(src.submit_poll(libc::POLLIN)?);
                        }
                        Err(e) => {
                            self.filled = buf;
                            return Poll::Ready(Err(e));
                        }
                    }
                }
                Pending::Ready(op) => {
                    let (cqe, ()) = std::task::ready!(Pin::new(op).poll(cx));
                    self.read = Pending::Idle;
                    cqe.result()?;
                }
            }
        }
    }

    /// Takes up to [`WRITE_BEHIND_MAX_BYTES`] of `data` once the previous
    /// write is done, and starts sending them.
    pub(super) fn poll_write(
        &mut self,
        src: &Source,
        cx: &mut TaskContext<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total: usize = data.iter().map(|b| b.len()).sum();
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        std::task::ready!(self.poll_flush(src, cx))?;
        let mut buf = std::mem::take(&mut self.write_spare);
        buf.clear();
        for slice in data {
            let room = WRITE_BEHIND_MAX_BYTES - buf.len();
            if room == 0 {
                break;
            }
            buf.extend_from_slice(&slice[..slice.len().min(room)]);
        }
        let taken = buf.len();
        self.write_sent = 0;
        if let Err((e, buf)) = self.submit_send(src, buf) {
            self.write_spare = buf;
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(taken))
    }

    /// Sends `buf[write_sent..]`.
    fn submit_send(&mut self, src: &Source, buf: Vec<u8>) -> Result<(), (io::Error, Vec<u8>)> {
        let rest = &buf[self.write_sent..];
        let entry = opcode::Send::new(
            io_uring::types::Fd(src.fd()),
            rest.as_ptr(),
            rest.len().min(u32::MAX as usize) as u32,
        )
        .flags(libc::MSG_NOSIGNAL)
        .build();
        // SAFETY: the entry points at initialised bytes inside `buf`'s heap block, which does not
        // move with `buf`; the op owns `buf` until its last completion.
        let op = unsafe { src.submit(entry, buf, OnDrop::Linger) }?;
        self.write = Pending::Data(op);
        Ok(())
    }

    /// Waits until every byte taken by `poll_write` is sent; returns the
    /// error of a send that failed.
    pub(super) fn poll_flush(
        &mut self,
        src: &Source,
        cx: &mut TaskContext<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            match &mut self.write {
                Pending::Idle => return Poll::Ready(Ok(())),
                Pending::Data(op) => {
                    let (cqe, buf) = std::task::ready!(Pin::new(op).poll(cx));
                    self.write = Pending::Idle;
                    match cqe.result() {
                        Ok(n) => {
                            self.write_sent += n as usize;
                            if n == 0 || self.write_sent >= buf.len() {
                                self.write_spare = buf;
                                if n == 0 {
                                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                                }
                                continue;
                            }
                            // The kernel took part: send the rest before anything new.
                            if let Err((e, buf)) = self.submit_send(src, buf) {
                                self.write_spare = buf;
                                return Poll::Ready(Err(e));
                            }
                        }
                        Err(e) if is_retry(&e) => {
                            // Keep the unsent bytes; resend them once writable.
                            self.write_spare = buf;
                            self.write = Pending::Ready(src.submit_poll(libc::POLLOUT)?);
                        }
                        Err(e) => {
                            self.write_spare = buf;
                            return Poll::Ready(Err(e));
                        }
                    }
                }
                Pending::Ready(op) => {
                    let (cqe, ()) = std::task::ready!(Pin::new(op).poll(cx));
                    self.write = Pending::Idle;
                    cqe.result()?;
                    let buf = std::mem::take(&mut self.write_spare);
                    if let Err((e, buf)) = self.submit_send(src, buf) {
                        self.write_spare = buf;
                        return Poll::Ready(Err(e));
                    }
                }
            }
        }
    }
}
