//! Completions: reaping the completion queue and delivering each
//! completion to the operation, queue or driver state it belongs to.

use std::any::Any;
use std::task::Waker;

use io_uring::cqueue;

use super::lifecycle::{self, Cqe, FeedKind, Lifecycle, NOTIF_USAGE_ZC_COPIED};
use super::multishot::Then;
use super::state::Uring;
use super::unclaimed;
use super::user_data::UserData;
use crate::slab::Key;
use crate::stats;

impl Uring {
    /// Handles the completions waiting in the completion queue.
    pub(super) fn reap(&mut self, woken: &mut Vec<Waker>, freed: &mut Vec<Box<dyn Any>>) -> usize {
        let cqes = self.completions.take(&mut self.ring);
        for &(user_data, res, flags) in &cqes {
            self.dispatch(user_data, res, flags, woken, freed);
        }
        let n = cqes.len();
        self.completions.give_back(cqes, &self.ring);
        n
    }

    /// Delivers one completion.
    fn dispatch(
        &mut self,
        user_data: u64,
        res: i32,
        flags: u32,
        woken: &mut Vec<Waker>,
        freed: &mut Vec<Box<dyn Any>>,
    ) {
        let last = !cqueue::more(flags);
        let key = match UserData::from_u64(user_data) {
            Some(UserData::Wake) => {
                self.wake.on_completion(res, last);
                return;
            }
            Some(UserData::Cancel | UserData::TimerUpdate | UserData::SlotClose) => return,
            // Read by `Ring::run_now` itself; one arriving here had nobody
            // waiting (unreachable: it waits until its entry completes).
            Some(UserData::RunNow) => return,
            Some(UserData::Timer) => {
                self.timer.on_completion();
                return;
            }
            Some(UserData::StreamReceive(stream)) => {
                self.streams.on_completion(&mut self.ring, stream, res, flags, woken);
                return;
            }
            Some(UserData::Op(key)) => key,
            None => {
                stats::add(&self.ring.stats.stale_events, 1);
                return;
            }
        };
        if cqueue::notif(flags) {
            self.on_notification(user_data, res, freed);
            return;
        }
        let Some(state) = self.ops.get_mut(key) else {
            stats::add(&self.ring.stats.stale_events, 1);
            return;
        };
        match state {
            Lifecycle::Waiting { waker, .. } => {
                let waker = waker.take();
                *state = Lifecycle::Completed(Cqe { res, more: !last, zc_copied: false });
                woken.extend(waker);
                // Further tasks waiting on it (a socket's operation several
                // tasks poll).
                self.ops.wake_more(key, woken);
            }
            Lifecycle::Cancelled(_) => {
                if last {
                    // The kernel is done with the storage (and the socket).
                    if let Some(Lifecycle::Cancelled(storage)) = self.ops.remove(key) {
                        lifecycle::close_unclaimed(&*storage, res);
                        freed.push(storage);
                    }
                }
            }
            Lifecycle::Feed { kind, queue, stage, .. } => {
                let (kind, queue) = (*kind, *queue);
                if stage.is_orphaned() {
                    if stage.complete(last) == Then::Free {
                        self.ops.remove(key);
                    }
                    self.on_orphan_completion(kind, queue, res, last);
                    return;
                }
                stage.complete(last);
                match kind {
                    FeedKind::Accept | FeedKind::AcceptDirect => self.listeners.on_completion(
                        &mut self.ring,
                        stage,
                        queue,
                        key,
                        res,
                        kind == FeedKind::AcceptDirect,
                        last,
                        woken,
                    ),
                    FeedKind::RecvMsg => self.dgrams.on_completion(queue, key, res, flags, woken),
                }
                if last {
                    self.ops.remove(key);
                }
            }
            Lifecycle::Lingering(write) => match write.next_entry(res) {
                // The next part (or a wait for room) under the same key:
                // its entry points into the write's buffer, which stays in
                // this slot.
                Some(entry) => self.ring.push(entry.user_data(user_data)),
                None => {
                    if let Some(Lifecycle::Lingering(mut write)) = self.ops.remove(key) {
                        woken.extend(write.finish());
                        freed.push(write);
                    }
                }
            },
            // A single-shot operation completes once, and a withdrawn one
            // never reached the kernel: nothing more can come.
            Lifecycle::Completed(_) | Lifecycle::Withdrawn => {}
        }
    }

    /// A zero-copy send's notification: the kernel no longer reads its
    /// buffer. Frees what kept the bytes alive: the handle the send's
    /// future left (`zero_copy.rs`), or the slot of a future dropped before it
    /// took the result; or, if the result is still untaken, folds the
    /// notification into it.
    fn on_notification(&mut self, user_data: u64, res: i32, freed: &mut Vec<Box<dyn Any>>) {
        let copied = res as u32 & NOTIF_USAGE_ZC_COPIED != 0;
        let counter =
            if copied { &self.ring.stats.send_zc_copied } else { &self.ring.stats.send_zc };
        stats::add(counter, 1);
        if self.zero_copy.on_notification(user_data, copied, freed) {
            return;
        }
        let Some(UserData::Op(key)) = UserData::from_u64(user_data) else { return };
        match self.ops.get_mut(key) {
            Some(Lifecycle::Completed(cqe)) => {
                cqe.more = false;
                cqe.zc_copied = copied;
            }
            Some(Lifecycle::Cancelled(_)) => {
                if let Some(Lifecycle::Cancelled(storage)) = self.ops.remove(key) {
                    freed.push(storage);
                }
            }
            // The kernel posts the notification after the result, so the
            // slot is in one of the two states above, or gone with its
            // handle in `zero_copy`.
            _ => stats::add(&self.ring.stats.stale_events, 1),
        }
    }

    /// Disposes of what an orphaned feed still delivers: a connection is
    /// closed, and a datagram socket's ring (with its queue) is freed at
    /// the last completion.
    fn on_orphan_completion(&mut self, kind: FeedKind, queue: Key, res: i32, last: bool) {
        if matches!(kind, FeedKind::Accept | FeedKind::AcceptDirect) && res >= 0 {
            stats::add(&self.ring.stats.accepted_unserved, 1);
        }
        match kind {
            FeedKind::Accept => unclaimed::close(res),
            // A slot the kernel filled for nobody: given back at once.
            FeedKind::AcceptDirect => {
                if let (Some(table), Ok(slot)) = (&self.ring.direct, u32::try_from(res)) {
                    drop(table.filled(slot));
                }
            }
            FeedKind::RecvMsg if last => self.dgrams.free(&self.ring, queue),
            // Buffers it still fills die with its ring, at the last completion.
            FeedKind::RecvMsg => {}
        }
    }
}
