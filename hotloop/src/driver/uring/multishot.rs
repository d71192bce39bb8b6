//! Where a multishot operation the driver keeps armed for a queue is: the
//! one stage machine of a listener's accept (`accept.rs`), a datagram
//! socket's `RECVMSG` (`dgram.rs`) and a stream's receive (`pooled.rs`).
//!
//! # Implementation notes
//! Each user embeds a [`Stage`] (an accept's and a `RECVMSG`'s in their
//! operation slot, `lifecycle.rs`; a stream's receive in the stream's own
//! slot) and moves it only through the methods here, which say what the
//! owner has to do: queue a cancel, free the slot, dispose of what a
//! completion still delivers. Two rules hold for every user:
//!
//! - A queued entry never reaches a freed slot: an operation closed before
//!   the kernel saw it is `Withdrawn`, and its slot is freed when the ring
//!   skips its entry ([`Stage::admit`]), never before.
//! - The owner of what the kernel writes (a buffer ring, a `msghdr`, the
//!   socket) outlives the last completion: a closed operation the kernel
//!   has is `Orphaned`, cancelled, and freed at its last completion
//!   ([`Stage::complete`]).
//!
//! ```text
//! Unarmed --arm--> Queued --enter--> Armed --cancel--> Cancelling
//!    ^                |                |  \                |
//!    |                | close          |   last completion | last completion
//!    |                v                |   (no F_MORE)     v
//!    |             Withdrawn           +-----------------> Unarmed
//!    |             --enter: freed      | close             | close
//!    |                                 v                   v
//!    +--(an unarmed queue is        Orphaned (cancel sent) --last completion: freed
//!        freed at once on close)
//! ```

/// How far a multishot operation has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Stage {
    /// None in flight.
    #[default]
    Unarmed,
    /// In the driver's list, where it can still be withdrawn.
    Queued,
    /// Submitted: its completions go to its queue.
    Armed,
    /// Submitted, and a cancel queued (its queue is full, or its owner
    /// takes no more): its completions still go to its queue.
    Cancelling,
    /// Closed before submission: the next enter skips the entry and frees
    /// the slot.
    Withdrawn,
    /// Closed after submission: a cancel was sent, what it still delivers
    /// is disposed of (a connection closed, a buffer given back), and its
    /// last completion frees the slot and what it holds.
    Orphaned,
}

/// What the owner of a stage does after a move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Then {
    /// Nothing.
    Nothing,
    /// Queue a cancel of the operation.
    Cancel,
    /// Free the slot now: the kernel never had the operation, or is done.
    Free,
}

/// What closing a stage did ([`Stage::close`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Closed {
    /// Nothing was in flight: the caller frees the slot now.
    Free,
    /// The kernel had not seen it: the ring frees the slot when it skips
    /// the entry.
    Withdrawn,
    /// The kernel has it: it now holds what the kernel uses until its last
    /// completion; `cancel` if the caller queues the cancel (else one is
    /// queued already).
    Orphaned { cancel: bool },
    /// Closed before: nothing done.
    Before,
}

impl Stage {
    /// True while the kernel has (or will get) the operation and may
    /// still post completions for it.
    pub(super) fn held_by_kernel(self) -> bool {
        !matches!(self, Stage::Unarmed | Stage::Withdrawn)
    }

    /// True while its queue still takes what it delivers.
    pub(super) fn feeds_its_queue(self) -> bool {
        matches!(self, Stage::Queued | Stage::Armed | Stage::Cancelling)
    }

    /// True while nothing is in flight and nothing is queued: what
    /// [`Stage::arm`] needs.
    pub(super) fn is_unarmed(self) -> bool {
        self == Stage::Unarmed
    }

    /// Arms it, if nothing is in flight: true if the caller is to queue
    /// the entry.
    pub(super) fn arm(&mut self) -> bool {
        if *self != Stage::Unarmed {
            return false;
        }
        *self = Stage::Queued;
        true
    }

    /// Its entry leaves the driver's list: true if it goes to the kernel
    /// (marking it armed), false if it was withdrawn (the caller frees the
    /// slot) or nothing is armed.
    pub(super) fn admit(&mut self) -> bool {
        match self {
            Stage::Queued => {
                *self = Stage::Armed;
                true
            }
            // Admitted before, and held back by a full submission queue.
            Stage::Armed | Stage::Cancelling | Stage::Orphaned => true,
            // Unreachable for `Unarmed`: an unarmed operation has no entry.
            Stage::Withdrawn | Stage::Unarmed => false,
        }
    }

    /// A completion arrived, its last if `last` (no `F_MORE`). Returns
    /// `Free` when an orphan's last completion came (the caller frees the
    /// slot); otherwise the completion is its queue's unless
    /// [`Stage::is_orphaned`], and a last one leaves it unarmed.
    pub(super) fn complete(&mut self, last: bool) -> Then {
        match (*self, last) {
            (Stage::Orphaned, true) => Then::Free,
            (Stage::Orphaned, false) => Then::Nothing,
            (_, true) => {
                *self = Stage::Unarmed;
                Then::Nothing
            }
            (_, false) => Then::Nothing,
        }
    }

    /// True once its socket closed while the kernel had it.
    pub(super) fn is_orphaned(self) -> bool {
        self == Stage::Orphaned
    }

    /// Stops it while its queue stays (full, or its owner takes no more):
    /// withdrawn if the kernel has not seen it (`Free`: the caller forgets
    /// it, and the ring frees the slot when it skips the entry), else
    /// cancelled once (`Cancel`).
    pub(super) fn cancel(&mut self) -> Then {
        match self {
            Stage::Queued => {
                *self = Stage::Withdrawn;
                Then::Free
            }
            Stage::Armed => {
                *self = Stage::Cancelling;
                Then::Cancel
            }
            _ => Then::Nothing,
        }
    }

    /// Its queue's socket closes: an unarmed one is freed now, a queued
    /// one withdrawn, a submitted one orphaned (and cancelled, unless its
    /// cancel is queued already).
    pub(super) fn close(&mut self) -> Closed {
        match self {
            Stage::Unarmed => Closed::Free,
            Stage::Queued => {
                *self = Stage::Withdrawn;
                Closed::Withdrawn
            }
            Stage::Armed => {
                *self = Stage::Orphaned;
                Closed::Orphaned { cancel: true }
            }
            Stage::Cancelling => {
                *self = Stage::Orphaned;
                Closed::Orphaned { cancel: false }
            }
            Stage::Withdrawn | Stage::Orphaned => Closed::Before,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Closed, Stage, Then};

    /// The ownership rules, move by move: nothing the kernel has is freed
    /// before its last completion, and a withdrawn entry's slot waits for
    /// the ring to skip it.
    #[test]
    fn every_user_moves_through_the_same_stages() {
        let mut s = Stage::default();
        assert!(s.arm() && !s.arm(), "armed once, and only once");
        assert_eq!(s.close(), Closed::Withdrawn);
        assert!(!s.admit(), "a withdrawn entry never reaches the kernel");
        assert!(!s.held_by_kernel());

        let mut s = Stage::default();
        assert!(s.arm() && s.admit());
        assert_eq!((s, s.complete(false)), (Stage::Armed, Then::Nothing));
        assert_eq!(s.cancel(), Then::Cancel);
        assert_eq!(s.cancel(), Then::Nothing, "one cancel per operation");
        assert!(s.feeds_its_queue());
        assert_eq!(s.close(), Closed::Orphaned { cancel: false });
        assert!(s.admit(), "an entry held back by a full queue still goes");
        assert_eq!(s.complete(false), Then::Nothing);
        assert!(s.held_by_kernel() && !s.feeds_its_queue());
        assert_eq!(s.complete(true), Then::Free, "an orphan is freed at its last completion");

        let mut s = Stage::default();
        assert!(s.arm() && s.admit());
        assert_eq!(s.close(), Closed::Orphaned { cancel: true });
        assert_eq!(s.close(), Closed::Before);

        let mut s = Stage::default();
        assert!(s.arm() && s.admit());
        assert_eq!(s.complete(true), Then::Nothing);
        assert_eq!(s, Stage::Unarmed, "a last completion ends the multishot");
        assert_eq!(s.close(), Closed::Free);

        let mut s = Stage::default();
        assert!(s.arm());
        assert_eq!(s.cancel(), Then::Free, "stopped before the kernel saw it: withdrawn");
        assert!(!s.admit());
    }
}
