//! Accepting on io_uring: one multishot (or single) accept per listener,
//! its completions queued for `poll_accept`.
//!
//! # Implementation notes
//! - A listener's first `poll_accept` arms an `IORING_OP_ACCEPT` with
//!   `IORING_ACCEPT_MULTISHOT` (Linux 5.19+). From then on the kernel
//!   accepts every connection that arrives and posts one completion each,
//!   flagged `IORING_CQE_F_MORE` while the accept stays armed. The driver
//!   pushes each result onto the listener's FIFO queue, and `poll_accept`
//!   pops from it: the listener's per-turn bound (`net/listener.rs`) decides
//!   how many are taken per loop turn, exactly as on epoll.
//! - A completion without `F_MORE` ends the multishot (an error such as
//!   `EMFILE`, a full completion queue, a cancel). It is not re-armed at
//!   once: the next `poll_accept` that finds the queue empty arms it again,
//!   and counts `multishot_rearms`. An error is queued like a connection, so
//!   the listener sees it in order, pauses on `EMFILE` and then calls
//!   `poll_accept` again, which re-arms.
//! - The queue is bounded by [`ACCEPT_QUEUE_MAX`]: when it fills, the
//!   multishot is cancelled, so connections wait in the kernel's backlog
//!   (where `listen(2)`'s bound applies) instead of as descriptors here.
//! - In [`AcceptMode::Single`] mode each empty-queue `poll_accept` submits
//!   one plain accept, which completes once.
//! - Accepted sockets get `SOCK_CLOEXEC`. They stay blocking: io_uring
//!   never blocks the caller, and a blocking socket never sends an
//!   operation back with `EAGAIN`.
//! - Closing a listener ([`Uring::release`]) turns its accept into an
//!   orphan and cancels it; descriptors that still arrive for it are
//!   closed, as is every one left in the queue.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::task::{Context as TaskContext, Poll, Waker};

use io_uring::{opcode, types};

use super::op::{Lifecycle, OpKey};
use super::{Ring, Uring};
use crate::driver::AcceptMode;
use crate::stats;

/// The most accepted connections (or errors) queued per listener before
/// the multishot accept is cancelled until the queue drains.
pub(crate) const ACCEPT_QUEUE_MAX: usize = 1024;

/// One listener's accept state.
#[derive(Default)]
struct Listener {
    /// Accepted connections and errors, oldest first.
    queue: VecDeque<io::Result<OwnedFd>>,
    /// The accept in flight, if any.
    op: Option<OpKey>,
    /// True once a cancel was queued for `op` because the queue was full.
    cancelling: bool,
    /// The task waiting in `poll_accept`.
    waker: Option<Waker>,
    /// True once a multishot accept has been armed (later arms are re-arms).
    armed_before: bool,
}

/// Every listener that has accepted on this ring, by descriptor.
#[derive(Default)]
pub(super) struct Listeners {
    map: HashMap<RawFd, Listener>,
}

impl Listeners {
    /// Handles a completion of the accept of listener `fd`.
    pub(super) fn on_completion(
        &mut self,
        fd: RawFd,
        key: OpKey,
        res: i32,
        last: bool,
        ring: &mut Ring,
    ) {
        let Some(l) = self.map.get_mut(&fd) else {
            // Unreachable by construction (release orphans the op first);
            // still, never leak a descriptor.
            close_accepted(res);
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
            l.cancelling = false;
        } else if l.queue.len() >= ACCEPT_QUEUE_MAX && !l.cancelling {
            l.cancelling = ring.push_cancel(key).is_ok();
        }
        if let Some(w) = l.waker.take() {
            w.wake();
        }
    }

    /// Forgets listener `fd`: returns its accept in flight, closes its queue.
    fn remove(&mut self, fd: RawFd) -> Option<OpKey> {
        let l = self.map.remove(&fd)?;
        // Dropping the queue closes the connections nobody took.
        drop(l.queue);
        l.op
    }

    /// Forgets every listener; returns their accepts in flight.
    pub(super) fn clear(&mut self) -> Vec<OpKey> {
        self.map.drain().filter_map(|(_, l)| l.op).collect()
    }
}

/// Closes the descriptor an accept completion delivered, if it is one.
pub(super) fn close_accepted(res: i32) {
    if res >= 0 {
        // SAFETY: a non-negative accept result is a new descriptor nobody else owns.
        drop(unsafe { OwnedFd::from_raw_fd(res) });
    }
}

impl Uring {
    /// Takes one queued connection of listener `fd`, arming an accept and
    /// parking the task if there is none.
    pub(crate) fn poll_accept(
        &mut self,
        fd: RawFd,
        cx: &mut TaskContext<'_>,
        mode: AcceptMode,
    ) -> Poll<io::Result<OwnedFd>> {
        let multishot = mode == AcceptMode::Multishot && self.multishot_accept;
        let l = self.listeners.map.entry(fd).or_default();
        if let Some(r) = l.queue.pop_front() {
            return Poll::Ready(r);
        }
        if l.op.is_none() {
            let key = self.ops.insert(Lifecycle::Accept(fd));
            let entry = if multishot {
                opcode::AcceptMulti::new(types::Fd(fd)).flags(libc::SOCK_CLOEXEC).build()
            } else {
                opcode::Accept::new(types::Fd(fd), std::ptr::null_mut(), std::ptr::null_mut())
                    .flags(libc::SOCK_CLOEXEC)
                    .build()
            };
            if let Err(e) = self.ring.push(&entry.user_data(key.user_data())) {
                self.ops.remove(key);
                return Poll::Ready(Err(e));
            }
            if multishot {
                if l.armed_before {
                    stats::add(&self.ring.stats.multishot_rearms, 1);
                }
                l.armed_before = true;
            }
            l.op = Some(key);
        }
        match &l.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => l.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Forgets a descriptor that is about to be closed. For a listener,
    /// cancels its accept and closes the connections nobody took.
    pub(crate) fn release(&mut self, fd: RawFd) {
        let Some(key) = self.listeners.remove(fd) else {
            return;
        };
        if let Some(state) = self.ops.get_mut(key) {
            *state = Lifecycle::Orphan;
            // If the queue has no room even after a flush, the accept stays
            // armed on a socket nobody can reach until the ring closes;
            // whatever it accepts is closed as it arrives.
            let _ = self.ring.push_cancel(key);
        }
    }
}
