//! What ends a ring's wait besides an operation's completion: the poll on
//! the worker's unpark eventfd (`Wake`), through which other threads wake
//! a worker that waits in the ring, and the driver's one deadline timer
//! (`DeadlineTimer`). Each is a part of the driver's state that arms its
//! own entry; a turn (`turn.rs`) arms them, `dispatch.rs` delivers their
//! completions.

use std::sync::Arc;

use io_uring::{opcode, types};

use super::ring::Ring;
use super::user_data::UserData;
use crate::driver::wake::Unpark;
use crate::stats;

/// Nanoseconds per second, for the deadline timer's `timespec`.
const NANOS_PER_SEC: u64 = 1_000_000_000;
/// The poll on the worker's unpark eventfd, through which other threads
/// wake a worker that waits in the ring.
pub(super) struct Wake {
    unpark: Arc<Unpark>,
    /// True while the eventfd's poll is armed.
    armed: bool,
    /// False on kernels without multishot poll: re-arm after every wake.
    multishot: bool,
}

impl Wake {
    pub(super) fn new(unpark: Arc<Unpark>) -> Wake {
        Wake { unpark, armed: false, multishot: true }
    }

    /// True while the eventfd's poll is armed (a turn re-arms it otherwise).
    pub(super) fn is_armed(&self) -> bool {
        self.armed
    }

    /// Arms the multishot (or one-shot) poll on the unpark eventfd.
    pub(super) fn arm(&mut self, ring: &mut Ring) {
        let entry = opcode::PollAdd::new(types::Fd(self.unpark.fd()), libc::POLLIN as u32)
            .multi(self.multishot)
            .build()
            .user_data(UserData::Wake.to_u64());
        ring.push(entry);
        self.armed = true;
    }

    /// A completion of the poll: the wakes are taken, and the poll is
    /// re-armed at the next turn if it ended.
    pub(super) fn on_completion(&mut self, res: i32, last: bool) {
        self.unpark.drain();
        if res == -libc::EINVAL && self.multishot {
            // No multishot poll on this kernel (before 5.13): one-shot from now on.
            self.multishot = false;
        }
        if last {
            self.armed = false;
        }
    }
}

/// The driver's one deadline timer (`IORING_OP_TIMEOUT`), moved rather
/// than added to when a nearer deadline comes.
#[derive(Default)]
pub(super) struct DeadlineTimer {
    /// When it expires (`CLOCK_MONOTONIC` nanoseconds); `None` once it
    /// has, or before it was first armed.
    armed: Option<u64>,
    /// The deadline the timer's entries point at. The kernel copies it
    /// when it takes an entry, so one place serves them all (entries
    /// still pending read its latest value, the latest deadline).
    spec: Box<types::Timespec>,
}

impl DeadlineTimer {
    /// Makes the deadline timer expire no later than `deadline`: a new
    /// timer when none is armed, moved when it is armed for later, left
    /// alone otherwise (an expiry that comes early costs a spare turn).
    pub(super) fn arm(&mut self, ring: &mut Ring, deadline: u64) {
        if self.armed.is_some_and(|armed| armed <= deadline) {
            return;
        }
        *self.spec = types::Timespec::new()
            .sec(deadline / NANOS_PER_SEC)
            .nsec((deadline % NANOS_PER_SEC) as u32);
        let spec: *const types::Timespec = &*self.spec;
        let entry = match self.armed {
            None => opcode::Timeout::new(spec)
                .flags(types::TimeoutFlags::ABS)
                .build()
                .user_data(UserData::Timer.to_u64()),
            Some(_) => opcode::TimeoutUpdate::new(UserData::Timer.to_u64(), spec)
                .flags(types::TimeoutFlags::ABS)
                .build()
                .user_data(UserData::TimerUpdate.to_u64()),
        };
        // The kernel reads `spec` when it takes the entry; the box lives as
        // long as the ring's entries do.
        ring.push(entry);
        self.armed = Some(deadline);
        stats::add(&ring.stats.timer_arms, 1);
    }

    /// Its completion: expired (`ETIME`) or cancelled with the ring,
    /// either way no longer armed. (A move that came too late fails with
    /// `ENOENT`, after this completion.)
    pub(super) fn on_completion(&mut self) {
        self.armed = None;
    }
}
