//! Where an in-flight operation is in its life: the state of its slot in
//! the driver's operation slab, from submission to its last completion.
//!
//! # Implementation notes
//! Every entry carries its slot's generational key as `user_data`, so a
//! completion for a slot that was freed and reused is recognised and
//! dropped. An operation works either for a future or for the driver:
//!
//! - A **single-shot** operation of a future (`op.rs`) has the four states
//!   of a future's operation: `Waiting` (queued, then submitted),
//!   `Completed`, `Cancelled` (dropped after submission: the slot keeps
//!   its memory and socket), or `Withdrawn` (dropped before: the next
//!   enter skips the entry and frees the slot).
//! - A **zero-copy send** (`SEND_ZC`) is a single-shot operation with two
//!   completions: its result, flagged `IORING_CQE_F_MORE`, then a
//!   notification (`IORING_CQE_F_NOTIF`) once the kernel no longer reads
//!   the buffer. The future takes the result as it would a `SEND`'s (so
//!   dropping it means what dropping a `SEND` means); what keeps the bytes
//!   alive after that is another handle on them (`IoBuf::share`), which
//!   waits in the driver until the notification (`zero_copy.rs`). A
//!   notification that comes before the future took the result is folded
//!   into it; a future dropped with the result untaken leaves the slot
//!   `Cancelled` until the notification.
//! - A **feed** is a multishot accept or `RECVMSG` the driver keeps armed
//!   for a socket's queue (`accept.rs`, `dgram.rs`): one state, `Feed`,
//!   with what it carries ([`FeedKind`]) and how far it has got
//!   ([`FeedStage`]). A feed not yet submitted is withdrawn like a
//!   single-shot operation. (A stream's multishot receive goes through
//!   the same stages, but in its stream's own slot: `pooled.rs`.)
//! - A **lingering** write is the rest of a written-behind send whose
//!   stream no longer waits for it (dropped, or shut down in both
//!   directions; `linger.rs`): each completion submits its next part
//!   under the same key until all is sent (then, after a shutdown, the
//!   write side's), the socket fails, or its deadline passes.
//!
//! ```text
//! single-shot:  Waiting{submitted: false} --enter--> Waiting{submitted: true} --completion--> Completed
//!                  | future dropped                     | future dropped                         | future takes it
//!                  v                                    v                                        v
//!               Withdrawn --enter: freed            Cancelled --last completion: freed         freed
//!
//! feed:         Queued --enter--> Feeding --completions--> the queue's owner
//!                  | socket closed   | socket closed
//!                  v                 v
//!               Withdrawn         Orphaned --last completion: freed
//!                                 (what it still delivers is closed or given back)
//! ```
//!
//! The future that waits on a single-shot operation, and the moves between
//! its states, are in `op.rs`; the ring (`ring.rs`) reads the states to
//! skip withdrawn entries and mark the rest submitted.

use std::any::Any;
use std::io;
use std::task::Waker;

use super::linger::LingeringWrite;
use super::shared::SharedFd;
use crate::slab::{Key, Slab};

/// In a zero-copy send's notification asked for with
/// `IORING_SEND_ZC_REPORT_USAGE`: the kernel copied the bytes after all
/// (`IORING_NOTIF_USAGE_ZC_COPIED` in `<linux/io_uring.h>`; the io-uring
/// crate keeps its constants private).
pub(super) const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;

/// What the kernel reported for one completion.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cqe {
    pub(super) res: i32,
    /// A zero-copy send's notification is still to come: the kernel may
    /// still read the buffer.
    pub(super) more: bool,
    /// A zero-copy send's notification came and said the kernel copied
    /// the bytes after all.
    pub(super) zc_copied: bool,
}

impl Cqe {
    /// A completion that is the operation's last.
    pub(super) fn of(res: i32) -> Cqe {
        Cqe { res, more: false, zc_copied: false }
    }

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
    /// A single-shot operation whose future waits (its waker, once
    /// polled). `submitted` is false while the entry is still in the
    /// driver's list, where it can be withdrawn.
    Waiting { waker: Option<Waker>, submitted: bool },
    /// The completion arrived and the future has not taken it yet.
    Completed(Cqe),
    /// The future was dropped after submission: the slot keeps the
    /// operation's memory and socket until the last completion arrives.
    Cancelled(Box<dyn Any>),
    /// Dropped before submission: the entry is skipped at the next enter,
    /// which frees the slot.
    Withdrawn,
    /// A multishot operation feeding the queue `queue` (a key into the
    /// driver's slab for `kind`). `fd` is held, never read, so that the
    /// socket stays open until the last completion.
    Feed {
        kind: FeedKind,
        stage: FeedStage,
        queue: Key,
        #[allow(dead_code)]
        fd: SharedFd,
    },
    /// The rest of a written-behind send whose stream no longer waits for it.
    Lingering(Box<LingeringWrite>),
}

/// What a feed's completions carry, and so which queue it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FeedKind {
    /// Accepted connections, for a listener's queue (`accept.rs`).
    Accept,
    /// Datagrams in the socket's own buffer ring (`dgram.rs`).
    RecvMsg,
}

/// How far a feed has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FeedStage {
    /// In the driver's list; can still be withdrawn.
    Queued,
    /// Submitted: its completions go to its queue.
    Feeding,
    /// Its socket closed after submission and a cancel was sent. What it
    /// still delivers is closed or given back; a `RecvMsg` feed's queue
    /// stays until the last completion, because it owns the ring the
    /// kernel picks buffers from.
    Orphaned,
}

impl Lifecycle {
    /// A single-shot operation, not yet submitted.
    pub(super) const QUEUED_OP: Lifecycle = Lifecycle::Waiting { waker: None, submitted: false };

    /// A feed of `queue`, not yet submitted.
    pub(super) fn queued_feed(kind: FeedKind, queue: Key, fd: &SharedFd) -> Lifecycle {
        Lifecycle::Feed { kind, stage: FeedStage::Queued, queue, fd: fd.clone() }
    }

    /// True while the kernel has (or will get) the operation and may
    /// still post completions for it.
    pub(super) fn held_by_kernel(&self) -> bool {
        match self {
            Lifecycle::Completed(_) | Lifecycle::Withdrawn => false,
            Lifecycle::Waiting { .. }
            | Lifecycle::Cancelled(_)
            | Lifecycle::Feed { .. }
            | Lifecycle::Lingering(_) => true,
        }
    }

    /// True for an operation whose future or queue still waits for it.
    pub(super) fn is_waiting(&self) -> bool {
        match self {
            Lifecycle::Waiting { .. } => true,
            Lifecycle::Feed { stage, .. } => *stage != FeedStage::Orphaned,
            _ => false,
        }
    }

    /// Records that the entry went into the submission queue.
    pub(super) fn mark_submitted(&mut self) {
        match self {
            Lifecycle::Waiting { submitted, .. } => *submitted = true,
            Lifecycle::Feed { stage: stage @ FeedStage::Queued, .. } => *stage = FeedStage::Feeding,
            _ => {}
        }
    }

    /// Whether the entry of `key`, leaving the driver's list, goes to the
    /// kernel (marking it submitted), or is dropped because its operation
    /// was withdrawn (freeing the slot).
    pub(super) fn admit(ops: &mut Slab<Lifecycle>, key: Key) -> bool {
        match ops.get_mut(key) {
            Some(Lifecycle::Withdrawn) => {
                ops.remove(key);
                false
            }
            Some(state) => {
                state.mark_submitted();
                true
            }
            // Unreachable: a slot is freed only after its entry left the list.
            None => false,
        }
    }

    /// Detaches a feed from its queue, whose socket is closing: withdrawn
    /// if the kernel has not seen it, else orphaned. Returns true if the
    /// caller has to send the cancel (it was just orphaned).
    pub(super) fn orphan_feed(&mut self) -> bool {
        match self {
            Lifecycle::Feed { stage: FeedStage::Queued, .. } => {
                *self = Lifecycle::Withdrawn;
                false
            }
            Lifecycle::Feed { stage: stage @ FeedStage::Feeding, .. } => {
                *stage = FeedStage::Orphaned;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every idle io_uring stream holds one slot for its multishot
    /// receive: the state stays as small as the flat one was.
    #[test]
    fn a_slot_state_stays_small() {
        assert!(std::mem::size_of::<Lifecycle>() <= 24, "{}", std::mem::size_of::<Lifecycle>());
    }
}
