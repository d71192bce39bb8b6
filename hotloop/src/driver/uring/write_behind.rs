//! Borrowed-slice writes (the poll form behind tokio's and futures'
//! `AsyncWrite`) on a completion driver, and the rest of such a write
//! after its stream is dropped.
//!
//! # Implementation notes
//! - On a quiet worker (`Driver::send_directly`) `poll_write` first
//!   tries a non-blocking `sendmsg(2)` of the caller's slices, as epoll
//!   writes; what the kernel takes is reported at once, and `EAGAIN`
//!   leaves the write to the path below.
//! - Otherwise writes are written behind: `poll_write` copies the caller's bytes
//!   into a buffer the stream owns, submits the send and returns their
//!   count at once, as a buffered writer does. `AsyncWrite` promises
//!   nothing about what a caller passes next, so a write that returned
//!   `Pending` must have taken nothing; one that returned `Ok(n)` must not
//!   depend on the caller's slice again. A later `poll_write`,
//!   `poll_flush`, shutdown or owned-buffer write first waits for the send
//!   in flight (sending the rest if the kernel took part), and reports its
//!   error if it failed. At most [`WRITE_BEHIND_MAX_BYTES`] are taken per
//!   call.
//! - A reported byte is delivered or the connection fails, within the
//!   send deadline ([`super::linger::WRITE_LINGER`]): when the stream is dropped
//!   with a send in flight (or waiting for room), the send becomes a
//!   lingering write (`linger.rs`) that the driver keeps going, part after
//!   part, until every byte is in the kernel, the socket fails, or the
//!   deadline passes (then it is cut and a TCP connection reset, never
//!   closed as if complete). A shutdown of both directions hands the send
//!   over the same way ([`WriteBehind::hand_over`]), and the driver shuts
//!   the write side after its last byte; later writes fail as on a shut
//!   socket, and a flush reports how the handed-over send ended.
//! - A Unix stream socket is never written behind: it cannot be reset, so
//!   a cut write would read as a clean end, and a write kept going for a
//!   peer that stopped reading would hold the dropped stream's descriptor
//!   for as long. Its writes are non-blocking `sendmsg(2)` calls, busy
//!   worker or not, and `EAGAIN` waits for room (a `POLL_ADD`) having
//!   taken nothing, as on epoll: what the kernel took is all that was
//!   reported, and a drop closes the descriptor as epoll's and tokio's do.
//! - Reads have no owned buffer here: every read style takes from the
//!   socket's one receive path (`pooled.rs`), so no bytes wait in a
//!   place another style would not look.

use std::io;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll, Waker};

use super::linger::{send_entry, Handover};
use super::op::{is_retry, Op};
use super::source::SourceCore;

/// The most bytes one `poll_write` takes.
const WRITE_BEHIND_MAX_BYTES: usize = 64 * 1024;

/// What the write direction of a stream is waiting for.
enum Pending {
    /// Nothing in flight.
    Idle,
    /// The send of `buf[write_sent..]`.
    Send(Op<Vec<u8>>),
    /// Room to send, after the kernel answered `EAGAIN`; the bytes wait in
    /// `spare`.
    Writable(Op<()>),
    /// The stream was shut down in both directions while a send was in
    /// flight: the driver sends the rest and shuts the write side.
    HandedOver(Rc<Handover>),
}

/// A stream's write-behind buffer for the poll-based I/O traits.
pub(super) struct WriteBehind {
    /// True for a socket that is never written behind (a Unix stream):
    /// every write is a direct send, and `Writable` holds no bytes.
    direct_only: bool,
    write: Pending,
    /// Bytes of the buffer in flight that earlier completions already sent.
    sent: usize,
    /// The buffer of the last finished write, kept for the next one; while
    /// `write` is `Writable`, the bytes still to send.
    spare: Vec<u8>,
}

impl WriteBehind {
    /// The write state of a stream; `direct_only` for a socket never
    /// written behind (see the module notes).
    pub(super) fn new(direct_only: bool) -> Self {
        WriteBehind { direct_only, write: Pending::Idle, sent: 0, spare: Vec::new() }
    }

    /// True while a write taken by `poll_write` is still being sent.
    pub(super) fn is_writing(&self) -> bool {
        match self.write {
            Pending::Idle => false,
            // A direct-only socket's wait for room holds no bytes.
            Pending::Writable(_) => !self.direct_only,
            Pending::Send(_) | Pending::HandedOver(_) => true,
        }
    }

    /// Waits for room in the socket (a write found none), for a
    /// direct-only socket, whose wait holds no bytes; ready at once if no
    /// write found the socket full.
    pub(super) fn poll_room(&mut self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        debug_assert!(self.direct_only);
        self.room(Some(cx.waker()))
    }

    /// [`WriteBehind::poll_room`], parking `waker` (if any) while the
    /// socket has no room.
    fn room(&mut self, waker: Option<&Waker>) -> Poll<io::Result<()>> {
        if let Pending::Writable(op) = &mut self.write {
            let (cqe, ()) = std::task::ready!(op.poll_with(waker));
            self.write = Pending::Idle;
            cqe.result()?;
        }
        Poll::Ready(Ok(()))
    }

    /// A direct-only socket's write: a non-blocking `sendmsg(2)` of `data`
    /// once the socket has room; nothing is taken while it has none.
    fn write_direct(
        &mut self,
        sock: &SourceCore,
        waker: Option<&Waker>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let Some(fd) = sock.fd.raw_fd() else {
            // Only an accepted TCP socket is ever a direct descriptor.
            return Poll::Ready(Err(io::Error::from_raw_os_error(libc::EBADF)));
        };
        loop {
            std::task::ready!(self.room(waker))?;
            match crate::sys::send_vectored_nowait(fd, data) {
                Err(e) if is_retry(&e) => {
                    self.write = Pending::Writable(sock.submit_poll(libc::POLLOUT)?);
                }
                res => return Poll::Ready(res),
            }
        }
    }

    /// Takes up to [`WRITE_BEHIND_MAX_BYTES`] of `data` once the previous
    /// write is done, and starts sending them.
    pub(super) fn poll_write(
        &mut self,
        sock: &SourceCore,
        cx: &mut TaskContext<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.write(sock, Some(cx.waker()), data)
    }

    /// As [`WriteBehind::poll_write`], but never waits: `WouldBlock` while
    /// the previous write is still being sent. It parks no waker, so a task
    /// waiting on that send (`writable`, a flush) keeps its wake-up.
    pub(super) fn try_write(
        &mut self,
        sock: &SourceCore,
        data: &[io::IoSlice<'_>],
    ) -> io::Result<usize> {
        match self.write(sock, None, data) {
            Poll::Ready(res) => res,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// [`WriteBehind::poll_write`], parking `waker` (if any) when the
    /// previous write is not done.
    fn write(
        &mut self,
        sock: &SourceCore,
        waker: Option<&Waker>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total: usize = data.iter().map(|b| b.len()).sum();
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        if self.direct_only {
            return self.write_direct(sock, waker, data);
        }
        if let Pending::HandedOver(_) = self.write {
            // The write side is shut, or about to be: as `send(2)` on a shut socket.
            return Poll::Ready(Err(io::Error::from_raw_os_error(libc::EPIPE)));
        }
        std::task::ready!(self.flush(sock, waker))?;
        // On a quiet worker the bytes go straight out, uncopied, as on
        // epoll: a lone connection's answer then needs no entry, no
        // completion and no second poll before its flush is done.
        // (A direct socket without a plain descriptor cannot: the ring it is.)
        if let Some(fd) = sock.fd.raw_fd() {
            if let Some(res) =
                sock.driver.send_directly(|| crate::sys::send_vectored_nowait(fd, data))
            {
                return Poll::Ready(res);
            }
        }
        // Copied and written behind: the send goes to the kernel with the
        // loop's one `io_uring_enter` of the turn, batched with every
        // other connection's. (A direct `send` on a busy worker, as epoll
        // makes, cost 9-15% more CPU per hyper request in a same-service
        // comparison: a system call per response against a share of one
        // enter.)
        let mut buf = std::mem::take(&mut self.spare);
        buf.clear();
        for slice in data {
            let room = WRITE_BEHIND_MAX_BYTES - buf.len();
            if room == 0 {
                break;
            }
            buf.extend_from_slice(&slice[..slice.len().min(room)]);
        }
        let taken = buf.len();
        self.sent = 0;
        if let Err((e, buf)) = self.submit_send(sock, buf) {
            self.spare = buf;
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(taken))
    }

    /// Sends `buf[sent..]`.
    fn submit_send(&mut self, sock: &SourceCore, buf: Vec<u8>) -> Result<(), (io::Error, Vec<u8>)> {
        let entry = send_entry(&sock.fd, &buf[self.sent..]);
        // SAFETY: the entry points at initialised bytes inside `buf`'s heap block, which does not
        // move with `buf`; the op owns `buf` until its last completion.
        let op = unsafe { sock.submit(entry, buf) }?;
        self.write = Pending::Send(op);
        Ok(())
    }

    /// Waits until every byte taken by `poll_write` is sent (after a
    /// handover, until the driver is done with them); returns the error of
    /// a send that failed.
    pub(super) fn poll_flush(
        &mut self,
        sock: &SourceCore,
        cx: &mut TaskContext<'_>,
    ) -> Poll<io::Result<()>> {
        self.flush(sock, Some(cx.waker()))
    }

    /// [`WriteBehind::poll_flush`], parking `waker` (if any) while a send
    /// is not done.
    fn flush(&mut self, sock: &SourceCore, waker: Option<&Waker>) -> Poll<io::Result<()>> {
        if self.direct_only {
            // What the kernel took is all that was reported: nothing to wait for.
            return Poll::Ready(Ok(()));
        }
        loop {
            match &mut self.write {
                Pending::Idle => return Poll::Ready(Ok(())),
                Pending::HandedOver(handover) => return handover.poll_with(waker),
                Pending::Send(op) => {
                    let (cqe, buf) = std::task::ready!(op.poll_with(waker));
                    self.write = Pending::Idle;
                    match cqe.result() {
                        Ok(n) => {
                            self.sent += n as usize;
                            if n == 0 || self.sent >= buf.len() {
                                self.spare = buf;
                                if n == 0 {
                                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                                }
                                continue;
                            }
                            // The kernel took part: send the rest before anything new.
                            if let Err((e, buf)) = self.submit_send(sock, buf) {
                                self.spare = buf;
                                return Poll::Ready(Err(e));
                            }
                        }
                        Err(e) if is_retry(&e) => {
                            // Keep the unsent bytes; resend them once writable.
                            self.spare = buf;
                            self.write = Pending::Writable(sock.submit_poll(libc::POLLOUT)?);
                        }
                        Err(e) => {
                            self.spare = buf;
                            return Poll::Ready(Err(e));
                        }
                    }
                }
                Pending::Writable(op) => {
                    let (cqe, ()) = std::task::ready!(op.poll_with(waker));
                    self.write = Pending::Idle;
                    cqe.result()?;
                    let buf = std::mem::take(&mut self.spare);
                    if let Err((e, buf)) = self.submit_send(sock, buf) {
                        self.spare = buf;
                        return Poll::Ready(Err(e));
                    }
                }
            }
        }
    }

    /// The stream is shut down in both directions: hands a send still in
    /// flight (or waiting for room) to the driver, which sends the rest
    /// and then shuts the write side, so the shutdown waits for no peer
    /// and cuts nothing. Returns false if no send was in flight (the
    /// caller shuts both sides itself).
    pub(super) fn hand_over(&mut self, sock: &SourceCore) -> bool {
        if self.direct_only {
            return false;
        }
        match self.write {
            Pending::Idle => return false,
            Pending::HandedOver(_) => return true,
            Pending::Send(_) | Pending::Writable(_) => {}
        }
        // A direct socket gets a plain descriptor now, while the driver is
        // free, so a cut write can still reset it (`linger::abort`).
        let _ = sock.driver.plain_fd(&sock.fd);
        let handover = Rc::new(Handover::default());
        // A task waiting on the send (a flush, `writable`) waits on the
        // handover instead: woken, it finds it.
        match std::mem::replace(&mut self.write, Pending::Idle) {
            Pending::Idle | Pending::HandedOver(_) => {}
            Pending::Send(op) => {
                op.wake_waiters();
                op.linger(self.sent, Some(handover.clone()));
            }
            Pending::Writable(wait) => {
                wait.wake_waiters();
                drop(wait);
                let buf = std::mem::take(&mut self.spare);
                sock.driver.linger_send(&sock.fd, buf, self.sent, Some(handover.clone()));
            }
        }
        self.write = Pending::HandedOver(handover);
        true
    }

    /// The stream is being dropped: hands a send still in flight (or
    /// waiting for room) to the driver, which finishes it.
    pub(super) fn linger(self, sock: &SourceCore) {
        if self.direct_only {
            // A wait for room holds no bytes: dropped, it is cancelled.
            return;
        }
        if !matches!(self.write, Pending::Idle | Pending::HandedOver(_)) {
            // As in `hand_over`: a plain descriptor to reset it by.
            let _ = sock.driver.plain_fd(&sock.fd);
        }
        match self.write {
            Pending::Idle | Pending::HandedOver(_) => {}
            Pending::Send(op) => op.linger(self.sent, None),
            Pending::Writable(wait) => {
                drop(wait);
                sock.driver.linger_send(&sock.fd, self.spare, self.sent, None);
            }
        }
    }
}
