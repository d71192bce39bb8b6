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
//!   with what it carries ([`FeedKind`]) and how far it has got: the
//!   multishot stage machine every multishot operation embeds
//!   (`multishot.rs`; a stream's multishot receive goes through the same
//!   stages in its stream's own slot, `pooled.rs`).
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
//! feed:         the stages of `multishot.rs`, from Queued; its last
//!               completion frees the slot (an orphan's, whatever it
//!               delivered, is closed or given back)
//! ```
//!
//! The slots live in [`Ops`], which makes the moves between the states; the
//! future that waits on a single-shot operation is in `op.rs`, and the
//! ring (`ring.rs`) asks [`Ops::admit`] to skip withdrawn entries and mark
//! the rest submitted.

use std::any::Any;
use std::io;
use std::task::{Poll, Waker};
use std::time::Instant;

use io_uring::squeue;

use super::linger::{Lingering, LingeringWrite};
use super::multishot::{Closed, Stage, Then};
use super::ring::Ring;
use super::shared::SharedFd;
use super::unclaimed::{self, OpenPath};
use super::user_data::UserData;
use super::waiters::MoreWaiters;
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
    /// A single-shot operation whose future waits (the first task's
    /// waker, once polled; further tasks, on an operation a socket keeps
    /// for whichever task polls, in [`Ops`]' `more`). `submitted` is false
    /// while the entry is still in the driver's list, where it can be
    /// withdrawn.
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
        stage: Stage,
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
    /// Accepted connections as direct sockets, each in a slot of the
    /// ring's file table (`IORING_FILE_INDEX_ALLOC`), for a listener's queue.
    AcceptDirect,
    /// Datagrams in the socket's own buffer ring (`dgram.rs`).
    RecvMsg,
}

impl Lifecycle {
    /// A single-shot operation, not yet submitted.
    pub(super) const QUEUED_OP: Lifecycle = Lifecycle::Waiting { waker: None, submitted: false };

    /// A feed of `queue`, not yet submitted.
    pub(super) fn queued_feed(kind: FeedKind, queue: Key, fd: &SharedFd) -> Lifecycle {
        Lifecycle::Feed { kind, stage: Stage::Queued, queue, fd: fd.clone() }
    }

    /// True while the kernel has (or will get) the operation and may
    /// still post completions for it.
    pub(super) fn held_by_kernel(&self) -> bool {
        match self {
            Lifecycle::Completed(_) | Lifecycle::Withdrawn => false,
            Lifecycle::Feed { stage, .. } => stage.held_by_kernel(),
            Lifecycle::Waiting { .. } | Lifecycle::Cancelled(_) | Lifecycle::Lingering(_) => true,
        }
    }

    /// True for an operation whose future or queue still waits for it.
    pub(super) fn is_waiting(&self) -> bool {
        match self {
            Lifecycle::Waiting { .. } => true,
            Lifecycle::Feed { stage, .. } => stage.feeds_its_queue(),
            _ => false,
        }
    }
}

/// Closes the descriptor a finished operation returned when nobody will
/// take it: `storage` is the operation's (as `Op` keeps it, with its
/// socket), `res` its result. Only an open returns a descriptor.
pub(super) fn close_unclaimed(storage: &dyn Any, res: i32) {
    if storage.is::<(OpenPath, Option<SharedFd>)>() {
        unclaimed::close(res);
    }
}

/// The operation slab: every in-flight operation's slot, keyed by the
/// generational key its entries carry as `user_data`, and the moves
/// between the slot states above.
#[derive(Default)]
pub(super) struct Ops {
    slots: Slab<Lifecycle>,
    /// The tasks waiting on an operation beyond its first (a socket's
    /// kept poll, or its written-behind send, polled by several tasks).
    more: MoreWaiters,
}

impl Ops {
    /// Queues `entry` for a future's single-shot operation in a new slot.
    pub(super) fn submit(&mut self, ring: &mut Ring, entry: squeue::Entry) -> Key {
        let key = self.slots.insert(Lifecycle::QUEUED_OP);
        ring.push(entry.user_data(UserData::Op(key).to_u64()));
        key
    }

    /// Queues `entry`, a multishot operation of `kind` feeding `queue` on
    /// `fd`, in a new slot.
    pub(super) fn submit_feed(
        &mut self,
        ring: &mut Ring,
        entry: squeue::Entry,
        kind: FeedKind,
        queue: Key,
        fd: &SharedFd,
    ) -> Key {
        let key = self.slots.insert(Lifecycle::queued_feed(kind, queue, fd));
        ring.push(entry.user_data(UserData::Op(key).to_u64()));
        key
    }

    pub(super) fn get(&self, key: Key) -> Option<&Lifecycle> {
        self.slots.get(key)
    }

    pub(super) fn get_mut(&mut self, key: Key) -> Option<&mut Lifecycle> {
        self.slots.get_mut(key)
    }

    /// Frees the slot of `key`, returning its state.
    pub(super) fn remove(&mut self, key: Key) -> Option<Lifecycle> {
        self.slots.remove(key)
    }

    /// Every slot in use, with its key.
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (Key, &Lifecycle)> {
        self.slots.iter()
    }

    /// Slots in use.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// A cancelled operation the kernel never ends (no entry behind it), as
    /// a zero-copy send whose notification a dead peer holds up (for tests).
    #[cfg(test)]
    pub(super) fn insert_stuck(&mut self) -> Key {
        self.slots.insert(Lifecycle::Cancelled(Box::new(())))
    }

    /// Whether the entry of `key`, leaving the driver's list, goes to the
    /// kernel (marking it submitted), or is dropped because its operation
    /// was withdrawn (freeing the slot).
    pub(super) fn admit(&mut self, key: Key) -> bool {
        match self.slots.get_mut(key) {
            Some(Lifecycle::Waiting { submitted, .. }) => {
                *submitted = true;
                true
            }
            Some(Lifecycle::Feed { stage, .. }) => {
                let goes = stage.admit();
                if !goes {
                    self.slots.remove(key);
                }
                goes
            }
            Some(Lifecycle::Withdrawn) => {
                self.slots.remove(key);
                false
            }
            Some(_) => true,
            // Unreachable: a slot is freed only after its entry left the list.
            None => false,
        }
    }

    /// Takes the completion of `key` if it arrived, else parks `waker`
    /// (beside any other task's: every one is woken); without a waker, only
    /// looks.
    pub(super) fn poll(&mut self, key: Key, waker: Option<&Waker>) -> Poll<Cqe> {
        match self.slots.get_mut(key) {
            Some(Lifecycle::Completed(cqe)) => {
                let cqe = *cqe;
                self.slots.remove(key);
                Poll::Ready(cqe)
            }
            Some(Lifecycle::Waiting { waker: parked, .. }) => {
                if let Some(waker) = waker {
                    self.more.park(parked, key, waker);
                }
                Poll::Pending
            }
            // Only the future frees its own slot, so it is never missing or
            // in a driver-only state while the future waits.
            _ => Poll::Ready(Cqe::of(-libc::ECANCELED)),
        }
    }

    /// Moves the tasks waiting on the operation `key` beyond its first into
    /// `woken` (it completed; the first's waker is in its slot). One
    /// compare when no operation has a second task, the common case.
    #[inline]
    pub(super) fn wake_more(&mut self, key: Key, woken: &mut Vec<Waker>) {
        self.more.take_into(key, woken);
    }

    /// Moves every task waiting on the operation `key` into `out`, which
    /// wakes them: the operation is about to leave them (handed to the
    /// driver), and they look again at what replaced it.
    pub(super) fn take_waiters(&mut self, key: Key, out: &mut Vec<Waker>) {
        if let Some(Lifecycle::Waiting { waker, .. }) = self.slots.get_mut(key) {
            out.extend(waker.take());
            self.more.take_into(key, out);
        }
    }

    /// Forgets the future of `key`. Returns the storage if it can be freed
    /// now (the kernel never saw the entry, or already completed it);
    /// otherwise keeps it in the slot until the last completion and asks
    /// the kernel to cancel.
    pub(super) fn forget(
        &mut self,
        ring: &mut Ring,
        key: Key,
        storage: Box<dyn Any>,
    ) -> Option<Box<dyn Any>> {
        let Some(state) = self.slots.get_mut(key) else {
            // A slot the future waited on is never freed under it; if it
            // somehow were, leak rather than risk freeing memory in use.
            std::mem::forget(storage);
            return None;
        };
        match state {
            Lifecycle::Waiting { submitted: false, .. } => {
                *state = Lifecycle::Withdrawn;
                self.more.forget(key);
                Some(storage)
            }
            Lifecycle::Waiting { .. } => {
                *state = Lifecycle::Cancelled(storage);
                self.more.forget(key);
                ring.push_cancel(key);
                None
            }
            // A zero-copy send's result nobody took: the kernel may read
            // the buffer until the notification.
            Lifecycle::Completed(cqe) if cqe.more => {
                *state = Lifecycle::Cancelled(storage);
                None
            }
            Lifecycle::Completed(cqe) => {
                // A result nobody will take: an opened file is closed.
                close_unclaimed(&*storage, cqe.res);
                self.slots.remove(key);
                Some(storage)
            }
            Lifecycle::Cancelled(_)
            | Lifecycle::Feed { .. }
            | Lifecycle::Lingering(_)
            | Lifecycle::Withdrawn => {
                std::mem::forget(storage);
                None
            }
        }
    }

    /// Detaches the feed `key` from its queue, whose socket is closing:
    /// withdrawn if the kernel has not seen it, else orphaned (and
    /// cancelled, unless it is being cancelled already). Returns true if
    /// the kernel has it: it keeps what it names until its last
    /// completion.
    pub(super) fn orphan_feed(&mut self, ring: &mut Ring, key: Key) -> bool {
        let Some(state @ Lifecycle::Feed { .. }) = self.slots.get_mut(key) else { return false };
        let Lifecycle::Feed { stage, .. } = state else { return false };
        match stage.close() {
            Closed::Orphaned { cancel } => {
                if cancel {
                    ring.push_cancel(key);
                }
                true
            }
            // The socket goes now; the ring frees the slot when it skips
            // the entry.
            Closed::Withdrawn => {
                *state = Lifecycle::Withdrawn;
                false
            }
            Closed::Free | Closed::Before => false,
        }
    }

    /// True if the feed `key` was orphaned before (its socket closed).
    pub(super) fn is_orphaned_feed(&self, key: Key) -> bool {
        matches!(self.slots.get(key), Some(Lifecycle::Feed { stage, .. }) if stage.is_orphaned())
    }

    /// Stops the feed `key` while its queue stays: withdrawn if the kernel
    /// has not seen it (`Free`: its owner forgets it), else cancelled
    /// once (`Cancel`).
    pub(super) fn stop_feed(&mut self, ring: &mut Ring, key: Key) -> Then {
        let Some(state @ Lifecycle::Feed { .. }) = self.slots.get_mut(key) else {
            return Then::Nothing;
        };
        let Lifecycle::Feed { stage, .. } = state else { return Then::Nothing };
        let then = stage.cancel();
        match then {
            Then::Cancel => ring.push_cancel(key),
            // Withdrawn: the socket goes now, the slot when the ring skips
            // the entry.
            Then::Free => *state = Lifecycle::Withdrawn,
            Then::Nothing => {}
        }
        then
    }

    /// Keeps `write`, whose current send is the operation `key`, going
    /// after its future is gone.
    pub(super) fn linger(
        &mut self,
        ring: &mut Ring,
        lingering: &mut Lingering,
        key: Key,
        mut write: LingeringWrite,
    ) {
        let Some(state) = self.slots.get_mut(key) else {
            write.abandon();
            return;
        };
        match state {
            // The send is queued or in the kernel: its completion continues it.
            Lifecycle::Waiting { .. } => {
                lingering.push(write.deadline(), key);
                *state = Lifecycle::Lingering(Box::new(write));
                self.more.forget(key);
            }
            // The send completed and nobody took the result yet: continue now.
            Lifecycle::Completed(cqe) => {
                let res = cqe.res;
                self.slots.remove(key);
                match write.next_entry(res) {
                    Some(entry) => self.start_lingering(ring, lingering, Box::new(write), entry),
                    // Nobody waits on a handover made just now.
                    None => drop(write.finish()),
                }
            }
            _ => write.abandon(),
        }
    }

    /// Submits `entry`, the next step of `write`, in a slot of its own.
    pub(super) fn start_lingering(
        &mut self,
        ring: &mut Ring,
        lingering: &mut Lingering,
        write: Box<LingeringWrite>,
        entry: squeue::Entry,
    ) {
        let deadline = write.deadline();
        let key = self.slots.insert(Lifecycle::Lingering(write));
        lingering.push(deadline, key);
        ring.push(entry.user_data(UserData::Op(key).to_u64()));
    }

    /// True if `key` is a lingering write still going.
    pub(super) fn is_lingering(&self, key: Key) -> bool {
        matches!(self.slots.get(key), Some(Lifecycle::Lingering(_)))
    }

    /// True while the kernel holds (or will get) the operation `key`.
    pub(super) fn held_by_kernel(&self, key: Key) -> bool {
        self.slots.get(key).is_some_and(Lifecycle::held_by_kernel)
    }

    /// True while the kernel holds (or will get) any operation.
    pub(super) fn any_held_by_kernel(&self) -> bool {
        self.slots.iter().any(|(_, s)| s.held_by_kernel())
    }

    /// Until when the operations whose owner is gone are worth waiting
    /// for: a cancelled operation or an orphaned feed until `bound`; a
    /// lingering write cut at its deadline until `after_cut` past it.
    pub(super) fn cancels_until(
        &self,
        bound: Instant,
        after_cut: std::time::Duration,
    ) -> Option<Instant> {
        let mut until = None;
        for (_, s) in self.slots.iter() {
            let this = match s {
                Lifecycle::Lingering(write) => write.deadline() + after_cut,
                s if s.held_by_kernel() && !s.is_waiting() => bound,
                _ => continue,
            };
            until = until.max(Some(this));
        }
        until
    }

    /// Queues a cancel of every operation the kernel holds but lingering
    /// writes (which the driver's drop lets finish).
    pub(super) fn cancel_all_but_lingering(&self, ring: &mut Ring) {
        for (key, s) in self.slots.iter() {
            if s.held_by_kernel() && !matches!(s, Lifecycle::Lingering(_)) {
                ring.push_cancel(key);
            }
        }
    }

    /// Leaks every slot: the kernel may still use their memory.
    pub(super) fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.slots));
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
