//! One turn of the ring: the worker's wake poll, the deadline timer,
//! the lingering writes' deadlines, then submit and wait; and the waits of
//! a ring driven off its runtime's turn (`Driver::settle`).

use std::any::Any;
use std::io;
use std::rc::Weak;
use std::task::Waker;
use std::time::{Duration, Instant};

use super::pooled;
use super::shared::SockFd;
use super::state::Uring;
use crate::driver::park::Park;
use crate::slab::Key;
use crate::sys;

/// How long a socket dropped outside its runtime waits for its cancelled
/// operations, so that it closes (and its peer sees the end) at once; and
/// how long a lingering write cut at its deadline waits for its cancel.
pub(super) const SETTLE_MAX: Duration = Duration::from_millis(100);

/// What a ring driven off its turn waits for.
#[derive(Clone, Copy)]
pub(super) enum SettleFor<'a> {
    /// Everything still owed: the runtime leaves the thread.
    All,
    /// What still holds a socket just dropped: its cancelled operations,
    /// its orphaned receive or accept, its lingering write.
    Socket(&'a Weak<SockFd>),
    /// An operation whose future was just dropped.
    Op(Key),
}

impl Uring {
    /// One turn: submit, wait, reap.
    pub(super) fn poll(
        &mut self,
        park: Park,
        woken: &mut Vec<Waker>,
        freed: &mut Vec<Box<dyn Any>>,
    ) -> io::Result<usize> {
        if !self.wake.is_armed() {
            self.wake.arm(&mut self.ring);
        }
        self.cancel_expired_lingerers();
        let timeout = match (park, self.first_lingering()) {
            (Park::Skip, _) => Some(Duration::ZERO),
            // A lingering write must be cut at its deadline even on a
            // worker with nothing else to do: wait no longer than the
            // first one (rare: a timed wait, as for any deadline before).
            (Park::Until(deadline), Some(first)) => {
                let until_first = first.saturating_duration_since(Instant::now());
                let until_deadline =
                    deadline.map(|d| Duration::from_nanos(d.saturating_sub(sys::monotonic_ns())));
                Some(until_deadline.map_or(until_first, |t| t.min(until_first)))
            }
            (Park::Until(deadline), None) => {
                if let Some(deadline) = deadline {
                    self.timer.arm(&mut self.ring, deadline);
                }
                None
            }
        };
        self.ring.enter(timeout, |ud| pooled::admit(&mut self.ops, &mut self.streams, ud))?;
        Ok(self.reap(woken, freed))
    }

    /// Cancels the lingering writes that ran past their deadline: each
    /// ends (and resets its connection) at the cancel's completion.
    pub(super) fn cancel_expired_lingerers(&mut self) {
        let (ops, ring) = (&self.ops, &mut self.ring);
        self.lingering.take_expired(|key| {
            if ops.held_by_kernel(key) {
                ring.push_cancel(key);
            }
        });
    }

    /// The deadline of the first lingering write still going, forgetting
    /// those ahead of it that ended (their deadlines come first: every
    /// write gets the same linger time from when it starts).
    pub(super) fn first_lingering(&mut self) -> Option<Instant> {
        let ops = &self.ops;
        self.lingering.first(|key| ops.is_lingering(key))
    }

    /// Until when the operations whose owner is gone are worth waiting
    /// for, if any is left: a cancelled operation, an orphaned feed or
    /// stream receive until `bound`; a lingering write cut at its deadline
    /// until [`SETTLE_MAX`] after the cut.
    fn cancels_until(&self, bound: Instant) -> Option<Instant> {
        let mut until = self.ops.cancels_until(bound, SETTLE_MAX);
        if self.streams.any_orphaned() {
            until = until.max(Some(bound));
        }
        until
    }

    /// True while the kernel may still end something `what` waits for.
    fn still_owed(&self, what: SettleFor<'_>) -> bool {
        match what {
            SettleFor::All => true,
            // Every operation, orphan or lingering write on the socket holds
            // its descriptor.
            SettleFor::Socket(sock) => sock.strong_count() > 0,
            SettleFor::Op(key) => self.ops.held_by_kernel(key),
        }
    }

    /// One wait of a ring its runtime is not driving (`Driver::settle`):
    /// submits what is queued, waits in the ring for the next completion
    /// and handles what came. Returns false once nothing is left to wait
    /// for: `what` is owed nothing more, or no lingering write goes on
    /// (each ends with all its bytes in the kernel, a failure, or its cut
    /// at its deadline) and no cancelled operation is left or
    /// `cancels_until` has passed.
    pub(super) fn settle_step(
        &mut self,
        cancels_until: Instant,
        what: SettleFor<'_>,
        woken: &mut Vec<Waker>,
        freed: &mut Vec<Box<dyn Any>>,
    ) -> bool {
        if !self.wake.is_armed() {
            self.wake.arm(&mut self.ring);
        }
        self.cancel_expired_lingerers();
        let now = Instant::now();
        // A lingering write still going is waited for until its deadline
        // (it is cut then, at the top of the next step).
        let until = if !self.still_owed(what) {
            None
        } else {
            match self.first_lingering() {
                Some(deadline) => Some(deadline),
                None => self.cancels_until(cancels_until).filter(|&until| until > now),
            }
        };
        let admit = |ud| pooled::admit(&mut self.ops, &mut self.streams, ud);
        let Some(until) = until else {
            // Nothing to wait for; what is queued (a first cancel, a send)
            // still goes to the kernel now.
            let _ = self.ring.enter(Some(Duration::ZERO), admit);
            self.reap(woken, freed);
            return false;
        };
        // Never a zero wait: `until` is ahead, and a completion ends it early.
        let wait = until.saturating_duration_since(now).max(Duration::from_micros(100));
        if self.ring.enter(Some(wait), admit).is_err() {
            return false;
        }
        self.reap(woken, freed);
        true
    }
}
