//! One turn of the ring: the worker's wake poll, the deadline timer,
//! the lingering writes' deadlines, then submit and wait.

use std::any::Any;
use std::io;
use std::task::Waker;
use std::time::{Duration, Instant};

use io_uring::{opcode, types};

use super::lifecycle::Lifecycle;
use super::ring::{TIMER_UPDATE_USER_DATA, TIMER_USER_DATA, WAKE_USER_DATA};
use super::{pooled, Uring, NANOS_PER_SEC};
use crate::driver::park::Park;
use crate::stats;
use crate::sys;

impl Uring {
    /// Arms the multishot (or one-shot) poll on the unpark eventfd.
    pub(super) fn arm_wake(&mut self) {
        let entry = opcode::PollAdd::new(types::Fd(self.unpark.fd()), libc::POLLIN as u32)
            .multi(self.wake_multishot)
            .build()
            .user_data(WAKE_USER_DATA);
        self.ring.push(entry);
        self.wake_armed = true;
    }

    /// Makes the deadline timer expire no later than `deadline`: a new
    /// timer when none is armed, moved when it is armed for later, left
    /// alone otherwise (an expiry that comes early costs a spare turn).
    fn arm_timer(&mut self, deadline: u64) {
        if self.timer_armed.is_some_and(|armed| armed <= deadline) {
            return;
        }
        *self.timer_spec = types::Timespec::new()
            .sec(deadline / NANOS_PER_SEC)
            .nsec((deadline % NANOS_PER_SEC) as u32);
        let spec: *const types::Timespec = &*self.timer_spec;
        let entry = match self.timer_armed {
            None => opcode::Timeout::new(spec)
                .flags(types::TimeoutFlags::ABS)
                .build()
                .user_data(TIMER_USER_DATA),
            Some(_) => opcode::TimeoutUpdate::new(TIMER_USER_DATA, spec)
                .flags(types::TimeoutFlags::ABS)
                .build()
                .user_data(TIMER_UPDATE_USER_DATA),
        };
        // The kernel reads `timer_spec` when it takes the entry; the box
        // lives as long as the ring's entries do.
        self.ring.push(entry);
        self.timer_armed = Some(deadline);
        stats::add(&self.ring.stats.timer_arms, 1);
    }

    /// One turn: submit, wait, reap.
    pub(super) fn poll(
        &mut self,
        park: Park,
        woken: &mut Vec<Waker>,
        freed: &mut Vec<Box<dyn Any>>,
    ) -> io::Result<usize> {
        if !self.wake_armed {
            self.arm_wake();
        }
        self.cancel_expired_lingerers();
        let timeout = match (park, self.lingering.front()) {
            (Park::Skip, _) => Some(Duration::ZERO),
            // A lingering write must be cut at its deadline even on a
            // worker with nothing else to do: wait no longer than the
            // first one (rare: a timed wait, as for any deadline before).
            (Park::Until(deadline), Some(&(first, _))) => {
                let until_first = first.saturating_duration_since(Instant::now());
                let until_deadline =
                    deadline.map(|d| Duration::from_nanos(d.saturating_sub(sys::monotonic_ns())));
                Some(until_deadline.map_or(until_first, |t| t.min(until_first)))
            }
            (Park::Until(deadline), None) => {
                if let Some(deadline) = deadline {
                    self.arm_timer(deadline);
                }
                None
            }
        };
        self.ring.enter(timeout, |ud| pooled::admit(&mut self.ops, &mut self.streams, ud))?;
        Ok(self.reap(woken, freed))
    }

    /// Cancels the writes of dropped streams that ran past their linger time.
    fn cancel_expired_lingerers(&mut self) {
        let Some(&(first, _)) = self.lingering.front() else { return };
        let now = Instant::now();
        if first > now {
            return;
        }
        while let Some(&(deadline, key)) = self.lingering.front() {
            if deadline > now {
                break;
            }
            self.lingering.pop_front();
            if self.ops.get(key).is_some_and(Lifecycle::held_by_kernel) {
                self.ring.push_cancel(key);
            }
        }
    }
}
