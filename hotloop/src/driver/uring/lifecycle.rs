//! Where an in-flight operation is in its life: the state of its slot in
//! the driver's operation slab, from submission to its last completion.
//!
//! # Implementation notes
//! Every entry carries its slot's generational key as `user_data`, so a
//! completion for a slot that was freed and reused is recognised and
//! dropped. A slot goes through:
//!
//! ```text
//! Waiting{submitted: false} --driver's next enter--> Waiting{submitted: true}
//!       |                                                  |        \
//!   future dropped: storage freed at once,            completion    future dropped: storage
//!   entry skipped at the enter (Withdrawn)                 v          moves into the slot,
//!                                                  Completed(cqe)     AsyncCancel queued
//!                                                          |              v
//!                                             future polled: freed    Cancelled(storage)
//!                                                                         |
//!                                                   last completion: freed (storage dropped)
//! ```
//!
//! The driver-owned states beside it: a multishot accept, receive or
//! `RECVMSG` feeds its socket's queue (`Accept`, `RecvMulti`,
//! `RecvMsgMulti`) and becomes an orphan when its socket closes, freed at
//! its last completion; a written-behind send whose stream was dropped
//! becomes `Lingering` and submits its next part under the same key at
//! each completion until it is done (`write_behind.rs`).
//!
//! The future that waits on a slot, and the moves between these states,
//! are in `op.rs`; the ring (`ring.rs`) reads the states to skip withdrawn
//! entries and mark the rest submitted.

use std::any::Any;
use std::io;
use std::task::Waker;

use super::bufring::RecvRing;
use super::linger::LingeringWrite;
use super::SharedFd;
use crate::slab::Key;

/// What the kernel reported for one completion.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cqe {
    pub(super) res: i32,
}

impl Cqe {
    /// The result as `io::Result`: a negative value is `-errno`.
    pub(super) fn result(&self) -> io::Result<u32> {
        if self.res < 0 {
            Err(io::Error::from_raw_os_error(-self.res))
        } else {
            Ok(self.res as u32)
        }
    }
}

/// Where one operation is in its life.
pub(super) enum Lifecycle {
    /// The future waits (its waker, once polled). `submitted` is false
    /// while the entry is still in the driver's list, where it can be
    /// withdrawn.
    Waiting { waker: Option<Waker>, submitted: bool },
    /// The completion arrived and the future has not taken it yet.
    Completed(Cqe),
    /// The future was dropped after submission: the slot keeps the
    /// operation's memory and socket until the last completion arrives.
    Cancelled(Box<dyn Any>),
    /// The future was dropped before submission: the entry is skipped at
    /// the next enter, which frees the slot.
    Withdrawn,
    /// An accept whose completions go to a listener's queue.
    Accept { listener: Key, fd: SharedFd, submitted: bool },
    /// An accept whose listener was closed: descriptors it still delivers
    /// are closed at once. It keeps the listening socket until its end.
    Orphan(#[allow(dead_code)] SharedFd),
    /// A multishot receive whose bytes go to a socket's receive queue.
    RecvMulti { stream: Key, fd: SharedFd, submitted: bool },
    /// A multishot receive whose socket was closed: buffers it still
    /// fills go straight back to the ring.
    OrphanRecv(#[allow(dead_code)] SharedFd),
    /// A multishot `RECVMSG` whose datagrams go to a socket's queue.
    RecvMsgMulti { dgrams: Key, fd: SharedFd, submitted: bool },
    /// A multishot `RECVMSG` whose socket was closed: it keeps the socket
    /// and its ring (freed at the last completion).
    OrphanRecvMsg { _fd: SharedFd, ring: Box<RecvRing> },
    /// The rest of a written-behind send whose stream was dropped: each
    /// completion submits the next part under the same key until all is
    /// sent, the socket fails, or its deadline passes.
    Lingering(Box<LingeringWrite>),
}

impl Lifecycle {
    /// True while the kernel has (or will get) the operation and may
    /// still post completions for it.
    pub(super) fn held_by_kernel(&self) -> bool {
        match self {
            Lifecycle::Waiting { .. }
            | Lifecycle::Cancelled(_)
            | Lifecycle::Accept { .. }
            | Lifecycle::Orphan(_)
            | Lifecycle::RecvMulti { .. }
            | Lifecycle::OrphanRecv(_)
            | Lifecycle::RecvMsgMulti { .. }
            | Lifecycle::OrphanRecvMsg { .. }
            | Lifecycle::Lingering(_) => true,
            Lifecycle::Completed(_) | Lifecycle::Withdrawn => false,
        }
    }

    /// True for an operation whose future still waits for it.
    pub(super) fn is_waiting(&self) -> bool {
        matches!(
            self,
            Lifecycle::Waiting { .. }
                | Lifecycle::Accept { .. }
                | Lifecycle::RecvMulti { .. }
                | Lifecycle::RecvMsgMulti { .. }
        )
    }

    /// Records that the entry went into the submission queue.
    pub(super) fn mark_submitted(&mut self) {
        match self {
            Lifecycle::Waiting { submitted, .. }
            | Lifecycle::Accept { submitted, .. }
            | Lifecycle::RecvMulti { submitted, .. }
            | Lifecycle::RecvMsgMulti { submitted, .. } => *submitted = true,
            Lifecycle::Completed(_)
            | Lifecycle::Cancelled(_)
            | Lifecycle::Withdrawn
            | Lifecycle::Orphan(_)
            | Lifecycle::OrphanRecv(_)
            | Lifecycle::OrphanRecvMsg { .. }
            | Lifecycle::Lingering(_) => {}
        }
    }
}
