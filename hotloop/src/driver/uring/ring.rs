//! The ring itself: setup, the list of entries waiting for the next enter,
//! and the one `io_uring_enter` per loop turn.
//!
//! # Implementation notes
//! - Entries wait in [`Ring::pending`], not in the submission queue, until
//!   [`Ring::enter`] (or [`Ring::submit_pending`], when the oldest has
//!   waited too long while tasks ran: [`Ring::waiting_since_ns`]) moves
//!   them there. An entry whose operation was
//!   withdrawn meanwhile (its slot says so: `admit` answers for the
//!   driver) is skipped and its slot freed: the kernel never sees it.
//! - With `IORING_SETUP_TASKRUN_FLAG` the kernel marks the ring when
//!   completion work is waiting, so a zero-timeout enter with nothing to
//!   submit and no mark only reads the completion queue, without a system
//!   call.
//! - Completion queue overflow: with `NODROP` the kernel holds completions
//!   that did not fit and hands them over at the next enter; every turn
//!   that found the queue overflowed counts (`cq_overflows`).

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring};

use crate::driver::config::DriverConfig;
use crate::slab::Key;
use crate::stats::{self, WorkerStats};

/// `user_data` of the eventfd's poll.
pub(super) const WAKE_USER_DATA: u64 = u64::MAX;
/// `user_data` of cancel requests.
pub(super) const CANCEL_USER_DATA: u64 = u64::MAX - 1;
/// `user_data` of the driver's deadline timer (`IORING_OP_TIMEOUT`).
pub(super) const TIMER_USER_DATA: u64 = u64::MAX - 2;
/// `user_data` of a request that moves the deadline timer.
pub(super) const TIMER_UPDATE_USER_DATA: u64 = u64::MAX - 3;
/// `user_data` at or above this is one of the driver's own entries above,
/// not an operation's slab key (no key reaches it: its index would be
/// past four billion slots).
const DRIVER_USER_DATA_MIN: u64 = TIMER_UPDATE_USER_DATA;
/// Completion queue entries per submission queue entry (the kernel's default is 2).
const CQ_ENTRIES_PER_SQ: u32 = 4;
/// `IORING_ENTER_GETEVENTS`: run deferred completion work and reap.
const IORING_ENTER_GETEVENTS: u32 = 1;

/// How the ring was set up, from the most to the least capable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SetupMode {
    /// `SINGLE_ISSUER | DEFER_TASKRUN` (Linux 6.1+).
    DeferTaskrun,
    /// `COOP_TASKRUN` (Linux 5.19+).
    CoopTaskrun,
    /// No flags.
    Plain,
}

/// The ring, the entries waiting for it, and the counters it bumps.
pub(super) struct Ring {
    /// Boxed: the ring's bookkeeping is large.
    ring: Box<IoUring>,
    /// Entries made since the last enter, oldest first.
    pending: VecDeque<squeue::Entry>,
    /// When the oldest entry not yet handed to the kernel was made
    /// (`sys::monotonic_ns`), or 0 if none waits.
    waiting_since_ns: u64,
    pub(super) stats: Arc<WorkerStats>,
    /// Test hook: this many submits fail with `EBUSY` before the kernel is asked.
    #[cfg(test)]
    pub(super) failing_submits: u32,
}

impl Ring {
    /// Creates the ring, trying the most capable setup first, and registers
    /// NAPI busy polling if asked. Returns the ring and a sentence on it.
    pub(super) fn new(
        config: &DriverConfig,
        stats: Arc<WorkerStats>,
    ) -> io::Result<(Ring, String)> {
        let ring = build_ring(config.uring_entries)?;
        let params = ring.params();
        if !params.is_feature_nodrop() || !params.is_feature_ext_arg() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring lacks IORING_FEAT_NODROP or IORING_FEAT_EXT_ARG (Linux 5.11+); use the epoll driver",
            ));
        }
        let kernel_busy_poll = match config.kernel_busy_poll {
            None => "off".to_string(),
            Some(p) => {
                let mut napi = types::Napi::new()
                    .set_busy_poll_timeout(p.busy_poll_us)
                    .set_prefer_busy_poll(true);
                match ring.submitter().register_napi(&mut napi) {
                    Ok(()) => format!(
                        "on: IORING_REGISTER_NAPI {} us, prefer busy poll, budget is the kernel's \
                         (only NAPI devices benefit; loopback has no NAPI id, so only user-space \
                         spinning helps there)",
                        p.busy_poll_us
                    ),
                    Err(e) => {
                        format!("not applied: IORING_REGISTER_NAPI failed ({e}); needs Linux 6.9+")
                    }
                }
            }
        };
        let ring = Ring {
            ring: Box::new(ring),
            pending: VecDeque::new(),
            waiting_since_ns: 0,
            stats,
            #[cfg(test)]
            failing_submits: 0,
        };
        Ok((ring, kernel_busy_poll))
    }

    /// The ring itself, for registrations.
    pub(super) fn io_uring(&self) -> &IoUring {
        &self.ring
    }

    /// Queues `entry` for the next enter. Never fails: what does not fit
    /// in the submission queue then waits here.
    ///
    /// Every pointer in `entry` must stay valid until the operation's last
    /// completion (the `Op::submit` contract, `op.rs`).
    pub(super) fn push(&mut self, entry: squeue::Entry) {
        if self.waiting_since_ns == 0 {
            self.waiting_since_ns = crate::sys::monotonic_ns().max(1);
        }
        self.pending.push_back(entry);
    }

    /// When the oldest entry the kernel has not been handed yet was made
    /// (`sys::monotonic_ns`), if one waits.
    pub(super) fn waiting_since_ns(&self) -> Option<u64> {
        (self.waiting_since_ns != 0).then_some(self.waiting_since_ns)
    }

    /// Once the pending entries have moved into the submission queue, just
    /// before the enter that hands them over: what is still pending (the
    /// kernel said "not now") waits from now on.
    fn submitted(&mut self) {
        self.waiting_since_ns =
            if self.pending.is_empty() { 0 } else { crate::sys::monotonic_ns().max(1) };
    }

    /// Queues a cancel of the operation `key`.
    pub(super) fn push_cancel(&mut self, key: Key) {
        self.push_cancel_user_data(key.to_u64());
    }

    /// Queues a cancel of whatever carries `user_data`.
    pub(super) fn push_cancel_user_data(&mut self, user_data: u64) {
        let entry = opcode::AsyncCancel::new(user_data).build().user_data(CANCEL_USER_DATA);
        self.push(entry);
        crate::stats::add(&self.stats.cancellations, 1);
    }

    /// Moves pending entries into the submission queue, submitting when it
    /// fills. `admit` says, for an entry's `user_data`, whether it goes
    /// (marking its operation submitted) or was withdrawn (freeing its
    /// slot). Stops early (leaving the rest pending) if the kernel says
    /// "not now".
    fn flush(&mut self, admit: &mut impl FnMut(u64) -> bool) -> io::Result<()> {
        while let Some(entry) = self.pending.front() {
            let user_data = entry.get_user_data();
            if user_data < DRIVER_USER_DATA_MIN && !admit(user_data) {
                self.pending.pop_front();
                continue;
            }
            // SAFETY: the entry's pointers stay valid until its operation's last completion
            // (the `Op::submit` contract); the queue copies the entry itself.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                self.pending.pop_front();
                stats::add(&self.stats.submissions, 1);
                continue;
            }
            // The submission queue is full: hand it to the kernel and go on.
            stats::add(&self.stats.sq_full, 1);
            if !self.submit_now()? {
                break;
            }
        }
        Ok(())
    }

    /// Moves what is pending into the submission queue and submits it,
    /// without waiting for anything.
    pub(super) fn submit_pending(&mut self, mut admit: impl FnMut(u64) -> bool) -> io::Result<()> {
        self.flush(&mut admit)?;
        if !self.ring.submission().is_empty() {
            self.submit_now()?;
        }
        self.submitted();
        Ok(())
    }

    /// Submits the submission queue without waiting; false if the kernel
    /// said "not now" (then the rest waits for the next turn).
    fn submit_now(&mut self) -> io::Result<bool> {
        stats::add(&self.stats.uring_enters, 1);
        #[cfg(test)]
        if self.failing_submits > 0 {
            self.failing_submits -= 1;
            return Ok(false);
        }
        match self.ring.submit() {
            Ok(_) => Ok(true),
            Err(e) if is_transient(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Submits what is queued and waits as `timeout` says: one
    /// `io_uring_enter` (more only if the submission queue filled).
    pub(super) fn enter(
        &mut self,
        mut timeout: Option<Duration>,
        mut admit: impl FnMut(u64) -> bool,
    ) -> io::Result<()> {
        self.flush(&mut admit)?;
        if !self.pending.is_empty() {
            // The kernel refused more for now: come back soon rather than sleep.
            timeout =
                Some(timeout.map_or(Duration::from_millis(1), |t| t.min(Duration::from_millis(1))));
        }
        let (queued, kernel_has_work) = {
            let sq = self.ring.submission();
            (sq.len() as u32, sq.taskrun() || sq.cq_overflow())
        };
        self.submitted();
        if timeout == Some(Duration::ZERO) && queued == 0 && !kernel_has_work {
            // Nothing to submit and no completion work waiting in the kernel
            // (`IORING_SQ_TASKRUN` is clear): peeking at the completion queue
            // needs no system call.
            return Ok(());
        }
        stats::add(&self.stats.uring_enters, 1);
        #[cfg(test)]
        if self.failing_submits > 0 {
            self.failing_submits -= 1;
            return Ok(());
        }
        let submitter = self.ring.submitter();
        let res = match timeout {
            None => submitter.submit_and_wait(1),
            Some(d) if d.is_zero() => {
                // SAFETY: no argument pointer is passed; GETEVENTS with min_complete 0 only runs
                // deferred work and never waits.
                unsafe {
                    submitter.enter::<libc::sigset_t>(queued, 0, IORING_ENTER_GETEVENTS, None)
                }
            }
            Some(d) => {
                let ts = types::Timespec::from(d);
                submitter.submit_with_args(1, &types::SubmitArgs::new().timespec(&ts))
            }
        };
        match res {
            Ok(_) => Ok(()),
            Err(e) if is_transient(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Copies at most `max` completions into `out`. Returns whether the
    /// queue had overflowed and how many completions the kernel dropped
    /// since the last look.
    pub(super) fn take_completions(
        &mut self,
        out: &mut Vec<(u64, i32, u32)>,
        max: usize,
        dropped_seen: &mut u32,
    ) -> (bool, u32) {
        let overflowed = self.ring.submission().cq_overflow();
        let mut cq = self.ring.completion();
        let dropped = cq.overflow();
        let lost = dropped.wrapping_sub(*dropped_seen);
        *dropped_seen = dropped;
        out.clear();
        out.extend((&mut cq).take(max).map(|e| (e.user_data(), e.result(), e.flags())));
        (overflowed, lost)
    }
}

/// Results of `io_uring_enter` that are not failures: the timeout passed
/// (`ETIME`), a signal came (`EINTR`), or the kernel wants the completion
/// queue reaped before it takes more (`EBUSY`, `EAGAIN`).
fn is_transient(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN))
}

/// Creates the ring, trying the most capable setup first.
fn build_ring(entries: u32) -> io::Result<IoUring> {
    let mut last_err = None;
    for mode in [SetupMode::DeferTaskrun, SetupMode::CoopTaskrun, SetupMode::Plain] {
        let mut builder = IoUring::builder();
        builder.setup_cqsize(entries.saturating_mul(CQ_ENTRIES_PER_SQ)).setup_clamp();
        match mode {
            SetupMode::DeferTaskrun => {
                builder.setup_single_issuer().setup_defer_taskrun().setup_taskrun_flag();
            }
            SetupMode::CoopTaskrun => {
                builder.setup_coop_taskrun().setup_taskrun_flag();
            }
            SetupMode::Plain => {}
        }
        match builder.build(entries) {
            Ok(ring) => return Ok(ring),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last_err = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last_err.unwrap_or_else(|| io::Error::other("io_uring setup failed")))
}
