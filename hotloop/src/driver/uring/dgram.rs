//! Datagram receives on io_uring: one multishot `RECVMSG` per socket that
//! picks buffers from the socket's own provided-buffer ring, its datagrams
//! queued in the driver until the owner takes them.
//!
//! # Implementation notes
//! - The first receive of a datagram socket (Linux 6.0+, unless
//!   `HOTLOOP_URING_MULTISHOT_RECVMSG=0` or `HOTLOOP_URING_MULTISHOT_RECV=0`)
//!   registers a ring of `dgram_buffers` buffers (64 unless `DriverConfig` says otherwise) of [`DGRAM_BUFFER_BYTES`]
//!   under a buffer group of its own and arms an `IORING_OP_RECVMSG` with
//!   `IORING_RECV_MULTISHOT`. Each datagram lands in one buffer as the
//!   kernel lays it out: the `io_uring_recvmsg_out` header, the source
//!   address, the control messages (GRO segment size, ECN, destination
//!   address) and the payload. A completion queues the buffer's id with the
//!   decoded metadata; a receive copies the payload into the caller's
//!   buffer and gives the ring buffer back to the kernel. Where a ring cannot
//!   be registered, the socket receives as before (`RECVMSG` and `recvmmsg`).
//! - Why a ring per socket: a socket whose owner reads slowly holds its own
//!   buffers, never another socket's, and an operation can own its ring
//!   until its last completion even after the socket is closed.
//! - Why 64 KiB buffers: a datagram, and a GRO train, is at most 64 KiB, so
//!   the kernel never truncates one; truncation is then decided only by the
//!   caller's buffer, exactly as with a plain `recvmsg`. The ring's memory is
//!   `calloc`ed: a page is resident only once the kernel has written into it,
//!   so 64 buffers are about 4 MiB of address space but, for 1,200-byte QUIC
//!   datagrams, at most two pages each. `HOTLOOP_URING_DGRAM_BUFFERS` (a
//!   power of two up to 32768) changes the count.
//! - When every buffer holds a datagram not yet taken, the kernel ends the
//!   multishot with `ENOBUFS` and leaves further datagrams in the socket's
//!   receive buffer, where UDP queues (or drops) them as it always does. It
//!   is re-armed when the owner has taken half of the queue (or all of it),
//!   so a full ring never makes the driver spin. Any other end (a cancel, an
//!   error, which is queued for the owner) is re-armed by the next receive.
//! - Closing the socket drops its queue. An armed multishot is cancelled;
//!   it keeps the descriptor, the ring and the header it names until its
//!   last completion, then the ring is unregistered and freed.

use std::collections::VecDeque;
use std::io;
use std::task::{Poll, Waker};

use io_uring::{cqueue, opcode, types};

use super::bufring::{BufRing, RecvRing};
use super::lifecycle::{FeedKind, Ops};
use super::ring::Ring;
use super::shared::SharedFd;
use crate::driver::udp::{self, RecvMeta};
use crate::slab::{Key, Slab};

/// Bytes per buffer: the kernel's header, name and control space, and room
/// for the largest datagram or GRO train (64 KiB).
pub(super) const DGRAM_BUFFER_BYTES: usize = udp::MULTISHOT_RECV_HEADER_BYTES + 64 * 1024;

/// A datagram the kernel put in a ring buffer, not yet taken.
struct Received {
    bid: u16,
    /// Where the payload starts in the buffer.
    start: usize,
    /// `len` is the payload bytes in the buffer; `truncated` what the kernel said.
    meta: RecvMeta,
}

/// One datagram socket's multishot receive and its queue.
pub(super) struct Datagrams {
    ring: RecvRing,
    /// Datagrams (each holding a ring buffer) and errors, oldest first.
    queue: VecDeque<io::Result<Received>>,
    /// The multishot receive in flight.
    op: Option<Key>,
    /// Tasks waiting for a datagram.
    waiters: Vec<Waker>,
}

/// The buffer groups of datagram sockets' rings: one group id each,
/// handed out and given back here.
pub(super) struct DgramRings {
    /// Whether datagram sockets receive with multishot `RECVMSG` (Linux 6.0).
    multishot: bool,
    /// Buffers in each datagram socket's ring.
    buffers: u16,
    /// Buffer group ids of datagram rings freed for reuse.
    free_groups: Vec<u16>,
    /// The last buffer group id handed out (0 is the stream ring's).
    next_group: u16,
    /// True once a datagram ring failed to register (said once).
    ring_failed: bool,
}

impl DgramRings {
    pub(super) fn new(multishot: bool, buffers: u16) -> DgramRings {
        DgramRings {
            multishot,
            buffers,
            free_groups: Vec::new(),
            next_group: super::bufring::GROUP,
            ring_failed: false,
        }
    }

    /// A buffer group id for a new ring, if any is left.
    fn take_group(&mut self) -> Option<u16> {
        match self.free_groups.pop() {
            Some(g) => Some(g),
            None if self.next_group < u16::MAX => {
                self.next_group += 1;
                Some(self.next_group)
            }
            None => None,
        }
    }
}

/// The datagram sockets' queues, each with its own ring, and the buffer
/// groups those rings take.
pub(super) struct Dgrams {
    queues: Slab<Datagrams>,
    rings: DgramRings,
}

impl Dgrams {
    /// No socket yet; `multishot`: whether datagram sockets receive with
    /// multishot `RECVMSG`, into rings of `buffers` buffers.
    pub(super) fn new(multishot: bool, buffers: u16) -> Dgrams {
        Dgrams { queues: Slab::default(), rings: DgramRings::new(multishot, buffers) }
    }

    /// Handles a completion of the multishot receive of `dgrams`.
    pub(super) fn on_completion(
        &mut self,
        dgrams: Key,
        key: Key,
        res: i32,
        flags: u32,
        woken: &mut Vec<Waker>,
    ) {
        let last = !cqueue::more(flags);
        let Some(d) = self.queues.get_mut(dgrams) else { return };
        match (res, cqueue::buffer_select(flags)) {
            (n, Some(bid)) if n >= 0 => {
                let bytes = d.ring.buf_ring.bytes(bid, n as usize);
                match types::RecvMsgOut::parse(bytes, &d.ring.msg) {
                    Ok(out) => {
                        let start = out.payload_data().as_ptr() as usize - bytes.as_ptr() as usize;
                        let mut meta = udp::decode_multishot(
                            out.name_data(),
                            out.control_data(),
                            out.flags(),
                            out.payload_data().len(),
                        );
                        meta.truncated |= out.is_payload_truncated();
                        d.queue.push_back(Ok(Received { bid, start, meta }));
                    }
                    // Shorter than the layout it was given: cannot happen, but
                    // the buffer must not be lost.
                    Err(()) => {
                        d.ring.buf_ring.push(bid);
                        d.ring.buf_ring.publish();
                    }
                }
            }
            (n, None) if n >= 0 => {}
            (e, bid) if e == -libc::ENOBUFS || e == -libc::ECANCELED => {
                if let Some(bid) = bid {
                    d.ring.buf_ring.push(bid);
                    d.ring.buf_ring.publish();
                }
            }
            (e, bid) => {
                if let Some(bid) = bid {
                    d.ring.buf_ring.push(bid);
                    d.ring.buf_ring.publish();
                }
                d.queue.push_back(Err(io::Error::from_raw_os_error(-e)));
            }
        }
        if last && d.op == Some(key) {
            d.op = None;
        }
        // A receiver waits for a datagram, or, when the multishot just ended,
        // to arm it again.
        if !d.queue.is_empty() || last {
            woken.append(&mut d.waiters);
        }
    }

    /// Gives a datagram socket a ring and a queue, if the kernel has
    /// multishot `RECVMSG` and a ring can be registered; `None` means the
    /// socket receives without them.
    pub(super) fn open(&mut self, ring: &Ring) -> Option<Key> {
        if !self.rings.multishot {
            return None;
        }
        let group = self.rings.take_group()?;
        match BufRing::with_group(ring.io_uring(), group, self.rings.buffers, DGRAM_BUFFER_BYTES) {
            Ok(buf_ring) => {
                let msg = Box::new(udp::multishot_recv_template());
                Some(self.queues.insert(Datagrams {
                    ring: RecvRing { buf_ring, msg },
                    queue: VecDeque::new(),
                    op: None,
                    waiters: Vec::new(),
                }))
            }
            Err(e) => {
                self.rings.free_groups.push(group);
                if !std::mem::replace(&mut self.rings.ring_failed, true) {
                    crate::log::warn(format_args!(
                        "io_uring: a datagram socket's buffer ring could not be registered ({e}); \
                         such sockets receive without multishot RECVMSG"
                    ));
                }
                None
            }
        }
    }

    /// Arms the multishot receive of `dgrams` unless it is armed or most
    /// of the ring is waiting to be taken.
    fn arm(&mut self, ops: &mut Ops, ring: &mut Ring, dgrams: Key, fd: &SharedFd) {
        let Some(d) = self.queues.get_mut(dgrams) else { return };
        if d.op.is_some() || d.queue.len() > usize::from(d.ring.buf_ring.count()) / 2 {
            return;
        }
        let hdr: *const libc::msghdr = &*d.ring.msg;
        let entry =
            fd.entry(|t| opcode::RecvMsgMulti::new(t, hdr, d.ring.buf_ring.group()).build());
        // The entry points at the boxed header, which the queue keeps (and,
        // once the socket is closed, the operation) until the last completion.
        d.op = Some(ops.submit_feed(ring, entry, FeedKind::RecvMsg, dgrams, fd));
    }

    /// Hands up to `max` queued datagrams to `deliver` (index, payload,
    /// metadata whose `len` is the payload's), oldest first, giving their
    /// buffers back. Returns how many; an error queued behind datagrams
    /// comes at the next call. With nothing queued, parks `waker` and arms
    /// the receive.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn poll(
        &mut self,
        ops: &mut Ops,
        ring: &mut Ring,
        dgrams: Key,
        fd: &SharedFd,
        waker: &Waker,
        max: usize,
        mut deliver: impl FnMut(usize, &[u8], RecvMeta),
    ) -> Poll<io::Result<usize>> {
        let Some(d) = self.queues.get_mut(dgrams) else {
            return Poll::Ready(Err(io::Error::other("a live socket's datagram queue was freed")));
        };
        let mut n = 0;
        let mut error = None;
        while n < max {
            match d.queue.front() {
                None => break,
                Some(Err(_)) if n > 0 => break,
                Some(Err(_)) => {
                    error = d.queue.pop_front().and_then(Result::err);
                    break;
                }
                Some(Ok(r)) => {
                    let bytes = d.ring.buf_ring.bytes(r.bid, r.start + r.meta.len);
                    deliver(n, &bytes[r.start..], r.meta);
                    d.ring.buf_ring.push(r.bid);
                    d.queue.pop_front();
                    n += 1;
                }
            }
        }
        if n > 0 {
            d.ring.buf_ring.publish();
        }
        if n == 0 && error.is_none() && !d.waiters.iter().any(|w| w.will_wake(waker)) {
            d.waiters.push(waker.clone());
        }
        self.arm(ops, ring, dgrams, fd);
        match (n, error) {
            (_, Some(e)) => Poll::Ready(Err(e)),
            (0, None) => Poll::Pending,
            (n, None) => Poll::Ready(Ok(n)),
        }
    }

    /// Forgets the queue of a datagram socket being closed. An armed
    /// multishot is cancelled and keeps the queue's slot, and with it the
    /// ring and header it names, until its last completion
    /// ([`Dgrams::free`]).
    pub(super) fn release(&mut self, ops: &mut Ops, ring: &mut Ring, key: Key) {
        let Some(d) = self.queues.get_mut(key) else { return };
        match d.op {
            // Closed before: its feed frees the slot at its last completion.
            Some(op) if ops.is_orphaned_feed(op) => {}
            // In the kernel: cancelled, and orphaned until its last
            // completion; else withdrawn before the kernel saw it (the next
            // enter skips its entry), and the ring can go now.
            Some(op) if ops.get(op).is_some() => {
                if ops.orphan_feed(ring, op) {
                    // Datagrams nobody will take: their buffers die with the ring.
                    d.queue.clear();
                    d.waiters.clear();
                } else {
                    self.free(ring, key);
                }
            }
            // Nothing armed.
            _ => self.free(ring, key),
        }
    }

    /// Forgets every socket's queue (the driver is dropped).
    pub(super) fn release_all(&mut self, ops: &mut Ops, ring: &mut Ring) {
        for key in self.queues.keys() {
            self.release(ops, ring, key);
        }
    }

    /// Leaks every queue and its ring: the kernel may still fill them.
    pub(super) fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.queues));
    }

    /// Frees the queue `key` of a closed datagram socket and its ring.
    pub(super) fn free(&mut self, ring: &Ring, key: Key) {
        if let Some(d) = self.queues.remove(key) {
            self.free_recv_ring(ring, d.ring);
        }
    }

    /// Unregisters a ring no operation can pick from any more, frees it and
    /// its group id.
    fn free_recv_ring(&mut self, ring: &Ring, recv_ring: RecvRing) {
        recv_ring.buf_ring.unregister(ring.io_uring());
        self.rings.free_groups.push(recv_ring.buf_ring.group());
    }
}
