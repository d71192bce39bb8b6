//! Readiness-style reads on io_uring: one multishot receive per socket
//! that picks kernel buffers from the [`BufRing`], its bytes queued until
//! the owner takes them with a non-blocking read.
//!
//! # Implementation notes
//! - The first pooled read of a socket gives it a queue (a slot in the
//!   driver's `streams` slab) and arms an `IORING_OP_RECV` with
//!   `IORING_RECV_MULTISHOT` and buffer selection (Linux 6.0). While the
//!   peer is quiet it holds no buffer; each arrival posts a completion that
//!   names the ring buffer it filled. The driver copies those bytes into the
//!   queue's own chunk list and gives the buffer straight back, so the ring
//!   is never held by a slow reader.
//! - `try_recv` copies from the queue (as much as fits, across chunks) and
//!   says `WouldBlock` when it is empty; `readable` waits until it is not.
//!   An emptied queue's block goes to a small per-driver list of spares
//!   that the next arrival on any socket takes, so a request costs no
//!   allocation and an idle socket holds no block.
//!   Bytes wait in the driver, not in a future, so dropping a read loses
//!   nothing (the same cancel safety as epoll).
//! - The queue is bounded by [`QUEUED_BYTES_MAX`]: past it the multishot is
//!   cancelled and re-armed when the owner has read the queue down, so a
//!   peer that sends faster than the owner reads is held back by TCP, not
//!   by the driver's memory.
//! - A completion without `F_MORE` ends the multishot: end of stream (0),
//!   an error (queued for the reader), or `ENOBUFS` when the ring ran dry,
//!   after which the next read re-arms it.
//! - Closing the socket drops its queue; a multishot still armed is
//!   cancelled, and buffers it still fills are given back as they come.

use std::io;
use std::mem::MaybeUninit;
use std::num::NonZeroI32;
use std::os::fd::AsRawFd;
use std::task::Waker;

use io_uring::{cqueue, opcode, types};

use super::bufring::{BufRing, GROUP};
use super::lifecycle::{FeedKind, Lifecycle};
use super::{SharedFd, Uring};
use crate::slab::Key;
use crate::sys;

/// The most received bytes queued per socket before the multishot
/// receive is paused.
pub(super) const QUEUED_BYTES_MAX: usize = 64 * 1024;

/// The most emptied queue blocks a driver keeps for reuse.
pub(super) const SPARE_QUEUES_MAX: usize = 64;
/// The largest emptied queue block kept for reuse; larger ones are freed.
const SPARE_QUEUE_BYTES_MAX: usize = 16 * 1024;

/// What the multishot receive of one socket has delivered: 40 bytes, which
/// every idle connection pays.
#[derive(Default)]
pub(super) struct Stream {
    /// Received bytes not yet taken; `None` once they all are, so a quiet
    /// socket holds no block.
    queue: Option<Box<Queue>>,
    /// The end of the stream, or an error, after the queued bytes.
    end: Option<End>,
    /// The multishot receive in flight.
    pub(super) op: Option<Key>,
    /// True once a cancel was queued for `op` because the queue was full.
    cancelling: bool,
    /// The task waiting in `readable`.
    waiter: Option<Waker>,
}

/// How a stream ended: cleanly, or with an errno, in 4 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct End(NonZeroI32);

impl End {
    /// The peer's end of stream (`i32::MIN` is no errno).
    const CLEAN: End = End(NonZeroI32::MIN);

    /// The error `errno` (positive).
    fn error(errno: i32) -> End {
        NonZeroI32::new(errno).map_or(End::CLEAN, End)
    }

    /// What a read at this end returns once the queue is empty.
    fn result(self) -> io::Result<usize> {
        if self == End::CLEAN {
            Ok(0)
        } else {
            Err(io::Error::from_raw_os_error(self.0.get()))
        }
    }
}

/// Received bytes, from `read_pos`: a block that goes from a socket's
/// [`Stream`] to the driver's spares when emptied and back at the next
/// arrival, on any socket.
#[derive(Default)]
pub(super) struct Queue {
    bytes: Vec<u8>,
    read_pos: usize,
}

impl Stream {
    fn queued_bytes(&self) -> usize {
        self.queue.as_ref().map_or(0, |q| q.bytes.len() - q.read_pos)
    }

    fn is_empty(&self) -> bool {
        self.queued_bytes() == 0 && self.end.is_none()
    }
}

/// Handles a completion of the multishot receive of `stream`.
pub(super) fn on_completion(
    ur: &mut Uring,
    stream: Key,
    key: Key,
    res: i32,
    flags: u32,
    woken: &mut Vec<Waker>,
) {
    let last = !cqueue::more(flags);
    let bid = cqueue::buffer_select(flags);
    let Some(s) = ur.streams.get_mut(stream) else {
        give_back(ur.buf_ring.as_mut(), bid);
        return;
    };
    match res {
        n if n > 0 => {
            if let (Some(bid), Some(ring)) = (bid, ur.buf_ring.as_mut()) {
                let spares = &mut ur.spare_queues;
                let q = s.queue.get_or_insert_with(|| spares.pop().unwrap_or_default());
                q.bytes.extend_from_slice(ring.bytes(bid, n as usize));
                ring.push(bid);
                ring.publish();
            }
        }
        0 => s.end = Some(End::CLEAN),
        e if e == -libc::ENOBUFS || e == -libc::ECANCELED => {}
        e => s.end = Some(End::error(-e)),
    }
    if last {
        if s.op == Some(key) {
            s.op = None;
        }
        s.cancelling = false;
    } else if s.queued_bytes() >= QUEUED_BYTES_MAX && !s.cancelling {
        s.cancelling = true;
        ur.ring.push_cancel(key);
    }
    // A reader waits for bytes, or, when the receive just ended (a cancel,
    // `ENOBUFS`), to arm it again.
    if !s.is_empty() || last {
        woken.extend(s.waiter.take());
    }
}

/// Gives a buffer a completion named back to the ring.
pub(super) fn give_back(ring: Option<&mut BufRing>, bid: Option<u16>) {
    if let (Some(ring), Some(bid)) = (ring, bid) {
        ring.push(bid);
        ring.publish();
    }
}

impl Uring {
    /// Arms the multishot receive of `stream` if it is not armed and the
    /// queue has room.
    fn arm_stream(&mut self, stream: Key, fd: &SharedFd) {
        let Some(s) = self.streams.get_mut(stream) else { return };
        if s.op.is_some() || s.end.is_some() || s.queued_bytes() >= QUEUED_BYTES_MAX / 2 {
            return;
        }
        let entry = opcode::RecvMulti::new(types::Fd(fd.as_raw_fd()), GROUP).build();
        let op = self.ops.insert(Lifecycle::queued_feed(FeedKind::Recv, stream, fd));
        s.op = Some(op);
        // A multishot receive entry points at no memory of ours: the kernel picks ring buffers.
        self.ring.push(entry.user_data(op.to_u64()));
    }

    /// Copies queued bytes into `dst`; `WouldBlock` if there are none
    /// (arming the receive for them).
    pub(super) fn stream_recv(
        &mut self,
        key: &mut Option<Key>,
        fd: &SharedFd,
        dst: &mut [MaybeUninit<u8>],
    ) -> io::Result<usize> {
        let stream = *key.get_or_insert_with(|| self.streams.insert(Stream::default()));
        let s = self.streams.get_mut(stream).expect("a live socket's receive queue was freed");
        let n = s.queued_bytes().min(dst.len());
        if n > 0 {
            let q = s.queue.as_deref_mut().expect("queued bytes are in the queue");
            let src = &q.bytes[q.read_pos..q.read_pos + n];
            // SAFETY: `dst` has room for `n` bytes (`n <= dst.len()`), `src`
            // holds `n` initialised bytes, and they cannot overlap: `src` is
            // the queue's own heap block, `dst` the caller's memory.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<u8>(), n)
            };
            q.read_pos += n;
            if q.read_pos == q.bytes.len() {
                // Emptied: the block goes to the driver's spares, not to the
                // allocator (a free and a malloc per request otherwise), and
                // a quiet socket holds none.
                if let Some(mut q) = s.queue.take() {
                    if self.spare_queues.len() < SPARE_QUEUES_MAX
                        && q.bytes.capacity() <= SPARE_QUEUE_BYTES_MAX
                    {
                        q.bytes.clear();
                        q.read_pos = 0;
                        self.spare_queues.push(q);
                    }
                }
            }
        }
        let result = if n > 0 {
            Ok(n)
        } else {
            match s.end.take() {
                // The end of the stream stays: every later read sees it too.
                Some(End::CLEAN) => {
                    s.end = Some(End::CLEAN);
                    Ok(0)
                }
                Some(error) => error.result(),
                // Nothing queued and no receive armed: the bytes, if any, are
                // in the socket. A short connection (its request there at
                // accept, with `TCP_DEFER_ACCEPT`) is read without arming a
                // receive it would only have to cancel.
                None if s.op.is_none() => {
                    // SAFETY: `dst` is a live slice of `len` writable bytes for the duration of
                    // the call.
                    let res = unsafe {
                        sys::recv_nowait(fd.as_raw_fd(), dst.as_mut_ptr().cast(), dst.len())
                    };
                    if !matches!(&res, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
                        return res;
                    }
                    res
                }
                None => Err(io::ErrorKind::WouldBlock.into()),
            }
        };
        self.arm_stream(stream, fd);
        result
    }

    /// True (and nothing parked) if `stream` has bytes, an end or an
    /// error to hand out; otherwise parks `waker` and arms the receive.
    pub(super) fn stream_ready(
        &mut self,
        key: &mut Option<Key>,
        fd: &SharedFd,
        waker: &Waker,
    ) -> bool {
        let stream = *key.get_or_insert_with(|| self.streams.insert(Stream::default()));
        let s = self.streams.get_mut(stream).expect("a live socket's receive queue was freed");
        if !s.is_empty() {
            return true;
        }
        match &s.waiter {
            Some(w) if w.will_wake(waker) => {}
            _ => s.waiter = Some(waker.clone()),
        }
        self.arm_stream(stream, fd);
        false
    }

    /// Forgets the receive queue `key` of a socket being closed.
    pub(super) fn release_stream(&mut self, key: Key) {
        let Some(s) = self.streams.remove(key) else { return };
        let Some(op) = s.op else { return };
        if self.ops.get_mut(op).is_some_and(Lifecycle::orphan_feed) {
            self.ring.push_cancel(op);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::mem::size_of;

    /// Every socket read with pooled reads holds one, idle connections
    /// included: its size is watched (80 bytes when it held the byte
    /// block inline, 48 with its end as a `Result` and a 12-byte key).
    #[test]
    fn a_stream_queue_stays_small() {
        assert!(size_of::<super::Stream>() <= 40, "{}", size_of::<super::Stream>());
    }
}
