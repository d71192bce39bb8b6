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
//! - `stream_recv` (behind the stream's `try_recv`) copies from the queue
//!   (as much as fits, across chunks) and says `WouldBlock` when it is
//!   empty; `stream_ready` (behind `poll_readable`) waits until it is not.
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
//! - A socket that leaves the driver open (`TcpStream::into_std`) first
//!   has its receive cancelled and its last completion awaited
//!   (`Streams::detach`): until then the kernel could still take bytes the
//!   next owner should read. Bytes the queue holds, or an error the
//!   receive took from the socket, refuse the move: they cannot be put
//!   back.

use std::io;
use std::mem::MaybeUninit;
use std::num::NonZeroI32;
use std::task::Waker;

use io_uring::{cqueue, opcode};

use super::bufring::{BufRing, GROUP};
use super::lifecycle::Ops;
use super::multishot::{Closed, Stage, Then};
use super::ring::Ring;
use super::shared::SharedFd;
use super::user_data::UserData;
use super::waiters::MoreWaiters;
use crate::slab::{Key, Slab};
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
    /// The first task waiting in `readable` (others, on a stream several
    /// tasks read, in [`Streams`]' `more`).
    waiter: Option<Waker>,
    /// The socket, held from its owner's close to the receive's last
    /// completion (`Stage::Orphaned`).
    fd: Option<SharedFd>,
    /// The end of the stream, or an error, after the queued bytes.
    end: Option<End>,
    /// Where the multishot receive is (`multishot.rs`). It has no slot in
    /// the operation slab: its `user_data` is the stream's own key,
    /// tagged as a stream receive, and its stage lives here, so an idle
    /// connection pays for one slot, not two.
    receive: Stage,
}

/// Whether the entry carrying `user_data`, leaving the driver's list,
/// goes to the kernel (marking it submitted), or is dropped because its
/// operation was withdrawn (freeing its slot).
pub(super) fn admit(ops: &mut Ops, streams: &mut Streams, user_data: u64) -> bool {
    match UserData::from_u64(user_data) {
        Some(UserData::StreamReceive(stream)) => streams.admit(stream),
        Some(UserData::Op(key)) => ops.admit(key),
        _ => false,
    }
}

/// The receive queues of the sockets read with pooled reads, the spare
/// blocks they take bytes into, and the provided-buffer ring their
/// multishot receives pick from.
pub(super) struct Streams {
    queues: Slab<Stream>,
    /// The tasks waiting on a socket's queue beyond its first.
    more: MoreWaiters,
    /// Emptied receive-queue blocks, reused by the next arrival. Boxed:
    /// a socket's queue is a box, handed over without an allocation.
    #[allow(clippy::vec_box)]
    spare_queues: Vec<Box<Queue>>,
    /// The provided buffers multishot receives pick from, where the kernel
    /// has them (Linux 6.0); without them pooled reads wait with `POLL_ADD`.
    buf_ring: Option<BufRing>,
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

    /// True while the kernel holds (or will get) its receive.
    pub(super) fn held_by_kernel(&self) -> bool {
        self.receive.held_by_kernel()
    }

    /// True while its socket is closed and the kernel still holds its
    /// receive.
    pub(super) fn is_orphaned(&self) -> bool {
        self.receive.is_orphaned()
    }
}

/// Gives the buffer a completion named back to the ring, its bytes unread
/// (a part of it, while the kernel goes on filling it).
pub(super) fn give_back(ring: Option<&mut BufRing>, bid: Option<u16>, res: i32, flags: u32) {
    if let (Some(ring), Some(bid)) = (ring, bid) {
        ring.take(bid, res.max(0) as usize, flags, None);
    }
}

impl Streams {
    /// No socket yet; `buf_ring`: the ring the receives pick from, if any.
    pub(super) fn new(buf_ring: Option<BufRing>) -> Streams {
        Streams {
            queues: Slab::default(),
            more: MoreWaiters::default(),
            spare_queues: Vec::with_capacity(SPARE_QUEUES_MAX),
            buf_ring,
        }
    }

    /// True if the receives have a provided-buffer ring to pick from.
    pub(super) fn reads_from_ring(&self) -> bool {
        self.buf_ring.is_some()
    }

    /// True if that ring's buffers are filled a completion at a time
    /// (`IOU_PBUF_RING_INC`).
    pub(super) fn reads_incrementally(&self) -> bool {
        self.buf_ring.as_ref().is_some_and(BufRing::incremental)
    }

    /// Whether the receive of `stream`, leaving the driver's list, goes
    /// to the kernel (marking it armed), or was withdrawn (freeing its
    /// slot).
    fn admit(&mut self, stream: Key) -> bool {
        let Some(s) = self.queues.get_mut(stream) else { return false };
        if s.receive.admit() {
            return true;
        }
        if s.receive == Stage::Withdrawn {
            self.queues.remove(stream);
        }
        false
    }

    /// Handles a completion of the multishot receive of `stream`.
    pub(super) fn on_completion(
        &mut self,
        ring: &mut Ring,
        stream: Key,
        res: i32,
        flags: u32,
        woken: &mut Vec<Waker>,
    ) {
        let last = !cqueue::more(flags);
        let bid = cqueue::buffer_select(flags);
        let Some(s) = self.queues.get_mut(stream) else {
            give_back(self.buf_ring.as_mut(), bid, res, flags);
            return;
        };
        if s.receive.is_orphaned() {
            give_back(self.buf_ring.as_mut(), bid, res, flags);
            if s.receive.complete(last) == Then::Free {
                // The kernel is done: the slot and the socket go.
                self.queues.remove(stream);
            }
            return;
        }
        match res {
            n if n > 0 => {
                if let (Some(bid), Some(buf_ring)) = (bid, self.buf_ring.as_mut()) {
                    let spares = &mut self.spare_queues;
                    let q = s.queue.get_or_insert_with(|| spares.pop().unwrap_or_default());
                    buf_ring.take(bid, n as usize, flags, Some(&mut q.bytes));
                }
            }
            0 => s.end = Some(End::CLEAN),
            e if e == -libc::ENOBUFS || e == -libc::ECANCELED => {}
            e => s.end = Some(End::error(-e)),
        }
        s.receive.complete(last);
        if !last && s.queued_bytes() >= QUEUED_BYTES_MAX && s.receive.cancel() == Then::Cancel {
            ring.push_cancel_of(UserData::StreamReceive(stream));
        }
        // A reader waits for bytes, or, when the receive just ended (a cancel,
        // `ENOBUFS`), to arm it again.
        if !s.is_empty() || last {
            woken.extend(s.waiter.take());
            self.more.take_into(stream, woken);
        }
    }

    /// Arms the multishot receive of `stream` if it is not armed and the
    /// queue has room.
    fn arm(&mut self, ring: &mut Ring, stream: Key, fd: &SharedFd) {
        let Some(s) = self.queues.get_mut(stream) else { return };
        // Armed already, the common case (every read that finds the queue
        // empty asks), is told by one compare, before the queue is looked at.
        if !s.receive.is_unarmed() || s.end.is_some() || s.queued_bytes() >= QUEUED_BYTES_MAX / 2 {
            return;
        }
        let armed = s.receive.arm();
        debug_assert!(armed, "an unarmed receive arms");
        let entry = fd.entry(|t| opcode::RecvMulti::new(t, GROUP).build());
        // A multishot receive entry points at no memory of ours: the kernel picks ring buffers.
        ring.push(entry.user_data(UserData::StreamReceive(stream).to_u64()));
    }

    /// Copies queued bytes into `dst`; `WouldBlock` if there are none
    /// (arming the receive for them).
    pub(super) fn recv(
        &mut self,
        ring: &mut Ring,
        key: &mut Option<Key>,
        fd: &SharedFd,
        dst: &mut [MaybeUninit<u8>],
    ) -> io::Result<usize> {
        let stream = *key.get_or_insert_with(|| self.queues.insert(Stream::default()));
        let s = self.queues.get_mut(stream).expect("a live socket's receive queue was freed");
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
                // (A direct socket without a plain descriptor arms it.)
                None if s.receive == Stage::Unarmed && fd.raw_fd().is_some() => {
                    let raw = fd.raw_fd().expect("just checked");
                    // SAFETY: `dst` is a live slice of `len` writable bytes for the duration of
                    // the call.
                    let res = unsafe { sys::recv_nowait(raw, dst.as_mut_ptr().cast(), dst.len()) };
                    if !matches!(&res, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
                        return res;
                    }
                    res
                }
                None => Err(io::ErrorKind::WouldBlock.into()),
            }
        };
        self.arm(ring, stream, fd);
        result
    }

    /// True if `stream` has bytes, an end or an error to hand out; parks
    /// nothing and arms nothing.
    pub(super) fn holds_input(&self, stream: Key) -> bool {
        self.queues.get(stream).is_some_and(|s| !s.is_empty())
    }

    /// True (and nothing parked) if `stream` has bytes, an end or an
    /// error to hand out; otherwise parks `waker` and arms the receive.
    pub(super) fn ready(
        &mut self,
        ring: &mut Ring,
        key: &mut Option<Key>,
        fd: &SharedFd,
        waker: &Waker,
    ) -> bool {
        let stream = *key.get_or_insert_with(|| self.queues.insert(Stream::default()));
        let s = self.queues.get_mut(stream).expect("a live socket's receive queue was freed");
        if !s.is_empty() {
            return true;
        }
        self.more.park(&mut s.waiter, stream, waker);
        self.arm(ring, stream, fd);
        false
    }

    /// Ends the receive of `stream` for a socket that leaves the driver
    /// open (`TcpStream::into_std`): its last completion must have come,
    /// since a receive still in the kernel would take bytes meant for the
    /// socket's next owner. Cancels an armed receive and parks `waker`
    /// until its last completion (`Pending`), withdraws one the kernel has
    /// not seen, then frees the slot (`Ready(Ok)`: the caller forgets
    /// the key). Refused, the slot and its receive left to the owner, while
    /// received bytes wait in the queue (`InvalidData`: the owner reads
    /// them first) or after an error the receive reported (that error, which
    /// the socket will not report again).
    pub(super) fn detach(
        &mut self,
        ring: &mut Ring,
        stream: Key,
        waker: &Waker,
    ) -> std::task::Poll<io::Result<()>> {
        use std::task::Poll;
        let Some(s) = self.queues.get_mut(stream) else { return Poll::Ready(Ok(())) };
        let queued = s.queued_bytes();
        if queued > 0 {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{queued} received bytes are not read yet: read them before moving the stream"
                ),
            )));
        }
        if let Some(end) = s.end.filter(|e| *e != End::CLEAN) {
            return Poll::Ready(end.result().map(drop));
        }
        match s.receive {
            // Nothing in the kernel: a clean end stays in the socket
            // (every later `recv` returns 0 again), so the slot can go.
            Stage::Unarmed => {
                self.queues.remove(stream);
                self.more.forget(stream);
                Poll::Ready(Ok(()))
            }
            // Not submitted: withdrawn, and the ring frees the slot when it
            // skips the entry.
            Stage::Queued => {
                s.receive.cancel();
                s.waiter = None;
                self.more.forget(stream);
                Poll::Ready(Ok(()))
            }
            Stage::Armed | Stage::Cancelling => {
                if s.receive.cancel() == Then::Cancel {
                    ring.push_cancel_of(UserData::StreamReceive(stream));
                }
                s.waiter = Some(waker.clone());
                Poll::Pending
            }
            // Only a closed socket's slot is in these stages.
            Stage::Withdrawn | Stage::Orphaned => Poll::Ready(Ok(())),
        }
    }

    /// Forgets the receive queue `key` of a socket being closed. A
    /// receive the kernel holds is cancelled, and keeps the slot, with
    /// `fd` (if given), until its last completion; one not yet submitted
    /// is withdrawn.
    pub(super) fn release(&mut self, ring: &mut Ring, key: Key, fd: Option<&SharedFd>) {
        let Some(s) = self.queues.get_mut(key) else { return };
        // Bytes nobody will read, and waiters nobody will poll.
        s.queue = None;
        s.waiter = None;
        self.more.forget(key);
        match s.receive.close() {
            Closed::Free => {
                self.queues.remove(key);
            }
            // The socket stays open until the last completion.
            Closed::Orphaned { cancel } => {
                s.fd = fd.cloned();
                if cancel {
                    ring.push_cancel_of(UserData::StreamReceive(key));
                }
            }
            // Withdrawn (the ring frees the slot), or released before.
            Closed::Withdrawn | Closed::Before => {}
        }
    }

    /// Forgets every socket's queue (the driver is dropped).
    pub(super) fn release_all(&mut self, ring: &mut Ring) {
        for key in self.queues.keys() {
            self.release(ring, key, None);
        }
    }

    /// True while the kernel holds (or will get) any socket's receive.
    pub(super) fn any_held_by_kernel(&self) -> bool {
        self.queues.iter().any(|(_, s)| s.held_by_kernel())
    }

    /// True while a closed socket's receive is still in the kernel.
    pub(super) fn any_orphaned(&self) -> bool {
        self.queues.iter().any(|(_, s)| s.is_orphaned())
    }

    /// Leaks every queue and the buffer ring: the kernel may still fill
    /// its buffers, and the sockets the queues hold must stay open.
    pub(super) fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.queues));
        std::mem::forget(self.buf_ring.take());
    }

    /// Unregisters the buffer ring, which no receive picks from any more.
    pub(super) fn unregister(&self, ring: &Ring) {
        if let Some(buf_ring) = &self.buf_ring {
            buf_ring.unregister(ring.io_uring());
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
