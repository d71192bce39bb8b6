//! The io_uring driver's state, `Uring`: the ring and everything the
//! kernel may still refer to, made of parts each defined and handled in
//! its own file, and the entry points that hand a part the others it
//! needs. The driver (`mod.rs`) holds it; a turn (`turn.rs`), the
//! completions' delivery (`dispatch.rs`) and the drop (`teardown.rs`) run
//! all its parts.

use std::any::Any;
use std::io;
use std::task::Waker;

use super::ring::{self, Ring};
use super::shared::SharedFd;
use super::user_data::UserData;
use super::wakeups::{DeadlineTimer, Wake};
use super::{accept, dgram, lifecycle, linger, pooled, zero_copy};
use crate::slab::Key;

/// The ring and everything the kernel may still refer to: one part per
/// job, each owned by its file with the methods that touch only its own
/// state. `impl Uring` keeps what coordinates parts: the entry points
/// below hand each part the others it needs, and a turn (`turn.rs`), the
/// completions' delivery (`dispatch.rs`) and the drop (`teardown.rs`) run
/// them all.
pub(super) struct Uring {
    pub(super) ring: Ring,
    /// The completions one poll copies out of the ring (`ring.rs`).
    pub(super) completions: ring::Completions,
    /// In-flight operations' slots and their lifecycle (`lifecycle.rs`).
    pub(super) ops: lifecycle::Ops,
    /// The listeners' accept queues (`accept.rs`).
    pub(super) listeners: accept::Listeners,
    /// The receive queues of sockets read with pooled reads, their spare
    /// blocks and the provided-buffer ring (`pooled.rs`).
    pub(super) streams: pooled::Streams,
    /// The receive queues of datagram sockets, each with its own ring
    /// (`dgram.rs`).
    pub(super) dgrams: dgram::Dgrams,
    /// The poll on the worker's unpark eventfd (`turn.rs`).
    pub(super) wake: Wake,
    /// What keeps each zero-copy send's bytes alive until its
    /// notification, and the sockets the kernel copied for (`zero_copy.rs`).
    pub(super) zero_copy: zero_copy::ZeroCopyKeeps,
    /// The deadlines of writes left running by dropped streams (`linger.rs`).
    pub(super) lingering: linger::Lingering,
    /// The driver's one deadline timer (`turn.rs`).
    pub(super) timer: DeadlineTimer,
}

impl Uring {
    /// Queues `entry` for a future's operation (`op.rs`); returns its key.
    pub(super) fn submit_op(&mut self, entry: io_uring::squeue::Entry) -> Key {
        self.ops.submit(&mut self.ring, entry)
    }

    /// Takes the completion of the operation `key` if it arrived, else
    /// parks `waker` (none: only looks).
    pub(super) fn poll_op(
        &mut self,
        key: Key,
        waker: Option<&Waker>,
    ) -> std::task::Poll<lifecycle::Cqe> {
        self.ops.poll(key, waker)
    }

    /// Moves every task waiting on the operation `key` into `out`.
    pub(super) fn take_op_waiters(&mut self, key: Key, out: &mut Vec<Waker>) {
        self.ops.take_waiters(key, out);
    }

    /// Forgets the future of the operation `key`: the storage back if it
    /// can be freed now, else kept until the last completion.
    pub(super) fn forget_op(&mut self, key: Key, storage: Box<dyn Any>) -> Option<Box<dyn Any>> {
        self.ops.forget(&mut self.ring, key, storage)
    }

    /// Keeps `write`, whose current send is the operation `key`, going
    /// after its future is gone.
    pub(super) fn linger(&mut self, key: Key, write: linger::LingeringWrite) {
        self.ops.linger(&mut self.ring, &mut self.lingering, key, write);
    }

    /// Submits `entry`, the next step of `write`, in a slot of its own.
    pub(super) fn start_lingering(
        &mut self,
        write: Box<linger::LingeringWrite>,
        entry: io_uring::squeue::Entry,
    ) {
        self.ops.start_lingering(&mut self.ring, &mut self.lingering, write, entry);
    }

    /// Takes one queued connection of the listener `key` (made on first
    /// use), arming an accept if none is in flight (`accept.rs`).
    pub(super) fn poll_accept(
        &mut self,
        key: &mut Option<Key>,
        fd: &SharedFd,
        mode: crate::driver::config::AcceptMode,
        room: usize,
        waker: Option<&Waker>,
    ) -> Option<io::Result<accept::Taken>> {
        self.listeners.poll_accept(&mut self.ops, &mut self.ring, key, fd, mode, room, waker)
    }

    /// True once no accept of the listener `key` is in flight.
    pub(super) fn poll_accept_settled(&mut self, key: Key, waker: &Waker) -> bool {
        self.listeners.poll_accept_settled(key, waker)
    }

    /// Takes one queued connection of the listener `key`.
    pub(super) fn take_queued(&mut self, key: Key) -> Option<io::Result<accept::Taken>> {
        self.listeners.take_queued(key)
    }

    /// Sets how many connections the listener's owner will take; the
    /// tasks to wake (once the state is released) go into `woken`.
    pub(super) fn set_accept_room(
        &mut self,
        key: Option<Key>,
        room: usize,
        woken: &mut Vec<Waker>,
    ) {
        self.listeners.set_accept_room(&mut self.ops, &mut self.ring, key, room, woken);
    }

    /// Forgets the listener `key`.
    pub(super) fn release_listener(&mut self, key: Key) {
        self.listeners.release_listener(&mut self.ops, &mut self.ring, key);
    }

    /// Copies the bytes the receive of a socket queued (`pooled.rs`).
    pub(super) fn stream_recv(
        &mut self,
        key: &mut Option<Key>,
        fd: &SharedFd,
        dst: &mut [std::mem::MaybeUninit<u8>],
    ) -> io::Result<usize> {
        self.streams.recv(&mut self.ring, key, fd, dst)
    }

    /// True if a socket's queue has something to hand out, else parks `waker`.
    pub(super) fn stream_ready(
        &mut self,
        key: &mut Option<Key>,
        fd: &SharedFd,
        waker: &Waker,
    ) -> bool {
        self.streams.ready(&mut self.ring, key, fd, waker)
    }

    /// True if the receive queue `key` has bytes, an end or an error to
    /// hand out (`pooled.rs`), or a completion of its receive that no reap
    /// has handled yet brought bytes or the end. Without a buffer ring a
    /// stream's key names the poll its read waits on, and the kernel holds
    /// every byte.
    pub(super) fn stream_holds_input(&mut self, key: Key) -> bool {
        self.streams.reads_from_ring()
            && (self.streams.holds_input(key)
                || self.ring.has_unreaped(UserData::StreamReceive(key).to_u64()))
    }

    /// Ends the receive of a socket leaving the driver open (`pooled.rs`).
    pub(super) fn detach_stream(
        &mut self,
        key: Key,
        waker: &Waker,
    ) -> std::task::Poll<io::Result<()>> {
        self.streams.detach(&mut self.ring, key, waker)
    }

    /// Forgets the receive queue `key` of a socket being closed.
    pub(super) fn release_stream(&mut self, key: Key, fd: Option<&SharedFd>) {
        self.streams.release(&mut self.ring, key, fd);
    }

    /// Gives a datagram socket a ring and a queue, if it can (`dgram.rs`).
    pub(super) fn open_dgrams(&mut self) -> Option<Key> {
        self.dgrams.open(&self.ring)
    }

    /// Hands up to `max` queued datagrams of `dgrams` to `deliver`.
    pub(super) fn poll_dgrams(
        &mut self,
        dgrams: Key,
        fd: &SharedFd,
        waker: &Waker,
        max: usize,
        deliver: impl FnMut(usize, &[u8], crate::driver::udp::RecvMeta),
    ) -> std::task::Poll<io::Result<usize>> {
        self.dgrams.poll(&mut self.ops, &mut self.ring, dgrams, fd, waker, max, deliver)
    }

    /// Forgets the queue of a datagram socket being closed.
    pub(super) fn release_dgrams(&mut self, key: Key) {
        self.dgrams.release(&mut self.ops, &mut self.ring, key);
    }
}
