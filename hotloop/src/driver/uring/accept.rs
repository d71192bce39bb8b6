//! Accepting on io_uring: one multishot (or single) accept per listener,
//! its completions queued for `poll_accept`.
//!
//! # Implementation notes
//! - A listener's first `poll_accept` gives it a queue (a slot in the
//!   driver's listener slab, named by a generational key, never by the
//!   descriptor's number) and arms an `IORING_OP_ACCEPT` with
//!   `IORING_ACCEPT_MULTISHOT` (Linux 5.19+). From then on the kernel
//!   accepts every connection that arrives and posts one completion each,
//!   flagged `IORING_CQE_F_MORE` while the accept stays armed. The driver
//!   pushes each result onto the listener's queue, and `poll_accept` pops
//!   from it: the listener's per-turn bound (`net/listener.rs`) decides how
//!   many are taken per loop turn, exactly as on epoll.
//! - A completion without `F_MORE` ends the multishot (an error such as
//!   `EMFILE`, a full completion queue, a cancel). The next `poll_accept`
//!   that finds the queue empty arms it again (`multishot_rearms`). An
//!   error is queued like a connection, so the listener sees it in order.
//! - The queue is bounded by [`ACCEPT_QUEUE_MAX`]: when it fills, the
//!   multishot is cancelled, so connections wait in the kernel's backlog
//!   (where `listen(2)`'s bound applies) instead of as descriptors here.
//! - In [`AcceptMode::Single`] mode each empty-queue `poll_accept` submits
//!   one plain accept, which completes once.
//! - Accepted sockets get `SOCK_CLOEXEC`. They stay blocking: io_uring
//!   never blocks the caller, and a blocking socket never sends an
//!   operation back with `EAGAIN`.
//! - The accept holds the listening socket (a shared descriptor) until
//!   its last completion. Closing the listener drops its queue (closing
//!   every connection nobody took), withdraws an accept the kernel has not
//!   seen, and turns one it has into an orphan that is cancelled and closes
//!   whatever it still delivers.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::task::Waker;

use io_uring::{opcode, types};

use super::lifecycle::{FeedKind, Ops};
use super::multishot::{Stage, Then};
use super::ring::Ring;
use super::shared::SharedFd;
use super::unclaimed;
use crate::driver::config::AcceptMode;
use crate::slab::{Key, Slab};
use crate::stats;

/// The most accepted connections (or errors) queued per listener before
/// the multishot accept is cancelled until the queue drains.
pub(crate) const ACCEPT_QUEUE_MAX: usize = 1024;

/// One listener's accept state.
pub(super) struct Listener {
    /// Accepted connections and errors, oldest first.
    queue: VecDeque<io::Result<OwnedFd>>,
    /// The accept in flight, if any (its stage is in its slot).
    pub(super) op: Option<Key>,
    /// The tasks waiting in `poll_accept` (several tasks may accept on one listener).
    waiters: Vec<Waker>,
    /// True once a multishot accept has been armed (later arms are re-arms).
    armed_before: bool,
    /// True if `op` is a multishot accept.
    op_multishot: bool,
    /// The most connections the listener's owner will take before it says
    /// otherwise: the queue never holds more.
    room: usize,
}

impl Default for Listener {
    fn default() -> Self {
        Listener {
            queue: VecDeque::new(),
            op: None,
            waiters: Vec::new(),
            armed_before: false,
            op_multishot: false,
            room: usize::MAX,
        }
    }
}

/// The listeners' accept queues, each in a slot named by a generational
/// key (never the descriptor's number).
pub(super) struct Listeners {
    queues: Slab<Listener>,
    /// Whether `AcceptMode::Multishot` really is multishot here.
    multishot: bool,
}

impl Listeners {
    /// No listener yet; `multishot`: whether the kernel has multishot accept.
    pub(super) fn new(multishot: bool) -> Listeners {
        Listeners { queues: Slab::default(), multishot }
    }

    /// Handles a completion of the accept `key` of `listener`, whose
    /// stage (`stage`) has taken it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_completion(
        &mut self,
        ring: &mut Ring,
        stage: &mut Stage,
        listener: Key,
        key: Key,
        res: i32,
        last: bool,
        woken: &mut Vec<Waker>,
    ) {
        let Some(l) = self.queues.get_mut(listener) else {
            // Unreachable by construction (closing a listener orphans its accept
            // first); still, never leak a descriptor.
            unclaimed::close(res);
            return;
        };
        if res >= 0 {
            // SAFETY: an accept completion's non-negative result is a descriptor the kernel
            // just installed for this process; nothing else owns it.
            l.queue.push_back(Ok(unsafe { OwnedFd::from_raw_fd(res) }));
        } else if res != -libc::ECANCELED {
            l.queue.push_back(Err(io::Error::from_raw_os_error(-res)));
        }
        if last {
            if l.op == Some(key) {
                l.op = None;
            }
        } else if l.queue.len() >= l.room.min(ACCEPT_QUEUE_MAX) && stage.cancel() == Then::Cancel {
            ring.push_cancel(key);
        }
        woken.append(&mut l.waiters);
    }

    /// Takes one queued connection of the listener `key` (made on first
    /// use), arming an accept if none is in flight. With a waker, parks it
    /// when the queue is empty.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn poll_accept(
        &mut self,
        ops: &mut Ops,
        ring: &mut Ring,
        key: &mut Option<Key>,
        fd: &SharedFd,
        mode: AcceptMode,
        room: usize,
        waker: Option<&Waker>,
    ) -> Option<io::Result<OwnedFd>> {
        let lkey = *key.get_or_insert_with(|| self.queues.insert(Listener::default()));
        // Multishot only when the owner takes whatever comes: one multishot
        // enter can accept a whole backlog, which a bound could not hold.
        let multishot = mode == AcceptMode::Multishot && self.multishot && room >= ACCEPT_QUEUE_MAX;
        let l = self.queues.get_mut(lkey).expect("a live listener's accept queue was freed");
        l.room = room;
        if let Some(r) = l.queue.pop_front() {
            return Some(r);
        }
        // A bounded owner (accept pacing while its worker is behind, or a
        // connection limit near) takes connections straight from the
        // kernel's backlog, one `accept4` each when it asks, as epoll's
        // accept loop does; the accept armed below only wakes it.
        if mode == AcceptMode::Multishot && !multishot && room > 0 {
            match crate::sys::accept_blocking(fd.as_raw_fd()) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                other => return Some(other),
            }
        }
        if l.op.is_none() && room > 0 {
            let raw = types::Fd(fd.as_raw_fd());
            let entry = if multishot {
                opcode::AcceptMulti::new(raw).flags(libc::SOCK_CLOEXEC).build()
            } else {
                opcode::Accept::new(raw, std::ptr::null_mut(), std::ptr::null_mut())
                    .flags(libc::SOCK_CLOEXEC)
                    .build()
            };
            if multishot {
                if l.armed_before {
                    stats::add(&ring.stats.multishot_rearms, 1);
                }
                l.armed_before = true;
            }
            // An accept entry points at no memory (null address pointers).
            let op = ops.submit_feed(ring, entry, FeedKind::Accept, lkey, fd);
            l.op = Some(op);
            l.op_multishot = multishot;
        }
        if let Some(waker) = waker {
            let l = self.queues.get_mut(lkey).expect("just looked up");
            if !l.waiters.iter().any(|w| w.will_wake(waker)) {
                l.waiters.push(waker.clone());
            }
        }
        None
    }

    /// True once no accept of the listener `key` is in flight: a stopped
    /// accept's last completion has come, so the kernel accepts nothing
    /// more for it. Parks `waker` until then otherwise (every completion
    /// of the accept wakes the listener's waiters).
    pub(super) fn poll_accept_settled(&mut self, key: Key, waker: &Waker) -> bool {
        let Some(l) = self.queues.get_mut(key) else { return true };
        if l.op.is_none() {
            return true;
        }
        if !l.waiters.iter().any(|w| w.will_wake(waker)) {
            l.waiters.push(waker.clone());
        }
        false
    }

    /// Takes one queued connection of the listener `key` without arming
    /// anything or parking.
    pub(super) fn take_queued(&mut self, key: Key) -> Option<io::Result<OwnedFd>> {
        self.queues.get_mut(key)?.queue.pop_front()
    }

    /// Sets how many connections the listener's owner will take from now
    /// on. At or below what is queued, an accept in flight is stopped
    /// (withdrawn, or cancelled), so further connections wait in the
    /// kernel's backlog.
    pub(super) fn set_accept_room(
        &mut self,
        ops: &mut Ops,
        ring: &mut Ring,
        key: Option<Key>,
        room: usize,
    ) {
        let Some(l) = key.and_then(|k| self.queues.get_mut(k)) else { return };
        l.room = room;
        // A bounded owner stops a multishot accept whatever is queued: one
        // enter could accept a whole backlog ahead of it.
        let bounded_multishot = l.op_multishot && room < ACCEPT_QUEUE_MAX;
        if l.queue.len() < room && !bounded_multishot {
            return;
        }
        let Some(op) = l.op else { return };
        // Once: an accept being cancelled is left to its last completion.
        if ops.stop_feed(ring, op) == Then::Free {
            l.op = None;
        }
    }

    /// Forgets the listener `key`: closes the connections nobody took and
    /// detaches its accept.
    pub(super) fn release_listener(&mut self, ops: &mut Ops, ring: &mut Ring, key: Key) {
        if let Some(l) = self.queues.remove(key) {
            if let Some(op) = l.op {
                // An accept the kernel has is cancelled, and closes whatever
                // it still delivers.
                ops.orphan_feed(ring, op);
            }
            // Dropping `l` closes its queue's connections.
        }
    }

    /// Forgets every listener (the driver is dropped).
    pub(super) fn release_all(&mut self, ops: &mut Ops, ring: &mut Ring) {
        for key in self.queues.keys() {
            self.release_listener(ops, ring, key);
        }
    }
}
