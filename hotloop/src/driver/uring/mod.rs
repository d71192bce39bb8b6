//! The io_uring driver: completion-based, one ring per worker.
//!
//! # Implementation notes
//! - The ring is set up with `SINGLE_ISSUER | DEFER_TASKRUN` (Linux 6.1):
//!   only the worker's thread submits, and the kernel runs completion work
//!   only when that thread enters the ring, never by interrupting it. Where
//!   the kernel refuses that (`EINVAL`), it falls back to `COOP_TASKRUN`,
//!   then to a plain ring. `IORING_FEAT_NODROP` (completions are kept, not
//!   lost, when the completion queue is full) and `IORING_FEAT_EXT_ARG`
//!   (waits with a timeout) are required.
//! - Operations only queue entries in the submission queue while tasks
//!   run; [`Uring::poll`] flushes them with one `io_uring_enter` per loop
//!   turn, which also waits: for a completion (`None`), until the timeout
//!   (`Some(d)`), or not at all (`Some(ZERO)`, which still runs the
//!   deferred completion work and so is how busy polling spins). With
//!   `IORING_SETUP_TASKRUN_FLAG` the kernel marks the ring when completion
//!   work is waiting, so a zero-timeout poll with nothing to submit and no
//!   mark only reads the completion queue, without a system call. Only a
//!   full submission queue causes an extra `io_uring_enter` (`sq_full`).
//! - The worker's eventfd has a multishot `POLL_ADD` on it, so a write
//!   from another thread ends a sleeping `poll`; the driver drains it on
//!   each completion and re-arms the poll when the kernel ends it.
//! - In-flight operations live in a slab ([`op`]); accepts have a queue
//!   per listener ([`accept`]). `user_data` is `generation << 32 | index`;
//!   two values no slot can produce mark the eventfd poll and cancel
//!   requests, whose completions carry nothing to deliver.
//! - Completion queue overflow: with `NODROP` the kernel holds the
//!   completions that did not fit and hands them over at the next enter;
//!   the driver counts every turn that found the queue overflowed, plus any
//!   completion the kernel reports as dropped (`cq_overflows`).
//! - Reads are single-shot `IORING_OP_RECV` into the caller's own buffer.
//!   Multishot receive with a provided-buffer ring is not used: the
//!   owned-buffer API hands each read the caller's buffer, so kernel-picked
//!   buffers would cost a copy or a different API, and no measurement has
//!   shown it winning for this runtime's request/response traffic.
//! - Dropping the driver cancels everything in flight and waits (at most
//!   [`DRAIN_ON_DROP_MAX`]) for the last completions, so no memory the
//!   kernel may still write is freed and no accepted descriptor leaks.
//!
//! Architecture invariant: nothing but the worker's own thread touches the
//! ring (`SINGLE_ISSUER` makes the kernel enforce it).

mod accept;
pub(crate) mod compat;
mod op;

pub(crate) use compat::{poll_read_slice, poll_write_slice};
pub(crate) use op::{connect, poll_ready, recv, send, send_vectored, shutdown};

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use self::op::{Lifecycle, OpKey, Ops};
use super::{probe, Driver};
use crate::runtime::{context, Config, WorkerShared};
use crate::stats::{self, WorkerStats};
use crate::sys;

/// `user_data` of the eventfd's poll.
const WAKE_USER_DATA: u64 = u64::MAX;
/// `user_data` of cancel requests.
const CANCEL_USER_DATA: u64 = u64::MAX - 1;
/// Completion queue entries per submission queue entry (the kernel's default is 2).
const CQ_ENTRIES_PER_SQ: u32 = 4;
/// How long dropping the driver waits for cancelled operations to complete.
const DRAIN_ON_DROP_MAX: Duration = Duration::from_secs(1);
/// The longest sleep while the eventfd's poll could not be re-armed.
const WAKE_REARM_RETRY: Duration = Duration::from_millis(1);
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

/// The ring and the counters it bumps: the part of the driver that submits.
struct Ring {
    /// Boxed: the ring's bookkeeping is large and the driver enum holds it inline.
    ring: Box<IoUring>,
    stats: Arc<WorkerStats>,
}

impl Ring {
    /// Queues one entry; if the submission queue is full, flushes it first.
    fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        for _ in 0..2 {
            // SAFETY: the caller built `entry` over memory that outlives the operation (the
            // `Op::submit` contract); the queue copies the entry itself.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                stats::add(&self.stats.submissions, 1);
                return Ok(());
            }
            stats::add(&self.stats.sq_full, 1);
            stats::add(&self.stats.uring_enters, 1);
            match self.ring.submit() {
                Ok(_) => {}
                Err(e) if is_transient(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            "the io_uring submission queue stayed full after a flush; raise `uring_entries`",
        ))
    }

    /// Queues a cancel of the operation `key`.
    fn push_cancel(&mut self, key: OpKey) -> io::Result<()> {
        let entry = opcode::AsyncCancel::new(key.user_data()).build().user_data(CANCEL_USER_DATA);
        self.push(&entry)
    }

    /// Submits what is queued and waits as `timeout` says: one `io_uring_enter`.
    fn enter(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let (pending, kernel_has_work) = {
            let sq = self.ring.submission();
            (sq.len() as u32, sq.taskrun() || sq.cq_overflow())
        };
        if timeout == Some(Duration::ZERO) && pending == 0 && !kernel_has_work {
            // Nothing to submit and no completion work waiting in the kernel
            // (`IORING_SQ_TASKRUN` is clear): peeking at the completion queue
            // needs no system call.
            return Ok(());
        }
        stats::add(&self.stats.uring_enters, 1);
        let submitter = self.ring.submitter();
        let res = match timeout {
            None => submitter.submit_and_wait(1),
            Some(d) if d.is_zero() => {
                // SAFETY: no argument pointer is passed; GETEVENTS with min_complete 0 only runs
                // deferred work and never waits.
                unsafe {
                    submitter.enter::<libc::sigset_t>(pending, 0, IORING_ENTER_GETEVENTS, None)
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
}

/// Results of `io_uring_enter` that are not failures: the timeout passed
/// (`ETIME`), a signal came (`EINTR`), or the kernel wants the completion
/// queue reaped before it takes more (`EBUSY`, `EAGAIN`).
fn is_transient(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN))
}

/// One worker's io_uring instance.
pub(crate) struct Uring {
    ring: Ring,
    ops: Ops,
    listeners: accept::Listeners,
    eventfd: RawFd,
    /// True while the eventfd's multishot poll is armed.
    wake_armed: bool,
    /// Whether `AcceptMode::Multishot` really is multishot here.
    multishot_accept: bool,
    /// The most completions handled per poll.
    completions_per_poll_max: usize,
    /// Completions copied out of the ring, reused every poll.
    cqes: Vec<(u64, i32, u32)>,
    /// The kernel's dropped-completion counter at the last look.
    dropped_seen: u32,
}

impl Uring {
    /// Sets up the ring and arms the eventfd's poll. Returns the driver and
    /// a sentence on kernel busy polling (NAPI).
    pub(crate) fn new(config: &Config, worker: &Arc<WorkerShared>) -> io::Result<(Uring, String)> {
        let (ring, _setup) =
            build_ring(config.uring_entries).map_err(|e| match probe::uring_support() {
                Err(why) => io::Error::new(e.kind(), why),
                Ok(()) => e,
            })?;
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
        let mut uring = Uring {
            ring: Ring { ring: Box::new(ring), stats: worker.stats.clone() },
            ops: Ops::default(),
            listeners: accept::Listeners::default(),
            eventfd: worker.eventfd.as_raw_fd(),
            wake_armed: false,
            multishot_accept: probe::multishot_accept_supported(),
            completions_per_poll_max: config.events_per_poll_max,
            cqes: Vec::with_capacity(config.events_per_poll_max),
            dropped_seen: 0,
        };
        uring.arm_wake()?;
        Ok((uring, kernel_busy_poll))
    }

    /// Arms the multishot poll on the worker's eventfd.
    fn arm_wake(&mut self) -> io::Result<()> {
        let entry = opcode::PollAdd::new(types::Fd(self.eventfd), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(WAKE_USER_DATA);
        self.ring.push(&entry)?;
        self.wake_armed = true;
        Ok(())
    }

    /// Submits what tasks queued, waits for completions for at most
    /// `timeout` and wakes the tasks they concern. Returns how many
    /// completions were handled.
    pub(crate) fn poll(&mut self, mut timeout: Option<Duration>) -> io::Result<usize> {
        if !self.wake_armed && self.arm_wake().is_err() {
            // Without the eventfd's poll nothing from another thread can end
            // the wait: sleep briefly and try again next turn.
            timeout = Some(timeout.map_or(WAKE_REARM_RETRY, |t| t.min(WAKE_REARM_RETRY)));
        }
        self.ring.enter(timeout)?;
        Ok(self.reap())
    }

    /// Handles the completions waiting in the completion queue.
    fn reap(&mut self) -> usize {
        let overflowed = self.ring.ring.submission().cq_overflow();
        let mut cq = self.ring.ring.completion();
        let dropped = cq.overflow();
        let lost = dropped.wrapping_sub(self.dropped_seen);
        self.dropped_seen = dropped;
        self.cqes.clear();
        self.cqes.extend(
            (&mut cq)
                .take(self.completions_per_poll_max)
                .map(|e| (e.user_data(), e.result(), e.flags())),
        );
        drop(cq);
        if overflowed || lost > 0 {
            stats::add(&self.ring.stats.cq_overflows, u64::from(overflowed) + u64::from(lost));
        }
        let cqes = std::mem::take(&mut self.cqes);
        for &(user_data, res, flags) in &cqes {
            self.dispatch(user_data, res, flags);
        }
        let n = cqes.len();
        self.cqes = cqes;
        stats::add(&self.ring.stats.completions, n as u64);
        stats::add(&self.ring.stats.poller_events, n as u64);
        n
    }

    /// Delivers one completion.
    fn dispatch(&mut self, user_data: u64, res: i32, flags: u32) {
        let last = !cqueue::more(flags);
        match user_data {
            WAKE_USER_DATA => {
                sys::eventfd_drain(self.eventfd);
                if last {
                    self.wake_armed = false;
                }
                return;
            }
            CANCEL_USER_DATA => return,
            _ => {}
        }
        let key = OpKey::from_user_data(user_data);
        let Some(state) = self.ops.get_mut(key) else {
            stats::add(&self.ring.stats.stale_events, 1);
            return;
        };
        match state {
            Lifecycle::Waiting(waker) => {
                let waker = waker.take();
                *state = Lifecycle::Completed(op::Cqe { res });
                if let Some(w) = waker {
                    w.wake();
                }
            }
            Lifecycle::Cancelled(_) => {
                if last {
                    // The kernel is done with the storage: free it now.
                    drop(self.ops.remove(key));
                }
            }
            Lifecycle::Accept(listener) => {
                let listener = *listener;
                if last {
                    self.ops.remove(key);
                }
                self.listeners.on_completion(listener, key, res, last, &mut self.ring);
            }
            Lifecycle::Orphan => {
                accept::close_accepted(res);
                if last {
                    self.ops.remove(key);
                }
            }
            // A single-shot operation completes once; nothing more can come.
            Lifecycle::Completed(_) | Lifecycle::Vacant => {}
        }
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        for key in self.listeners.clear() {
            if let Some(state) = self.ops.get_mut(key) {
                *state = Lifecycle::Orphan;
            }
        }
        for key in self.ops.keys() {
            let _ = self.ring.push_cancel(key);
        }
        let wake_cancel =
            opcode::AsyncCancel::new(WAKE_USER_DATA).build().user_data(CANCEL_USER_DATA);
        let _ = self.ring.push(&wake_cancel);
        let deadline = Instant::now() + DRAIN_ON_DROP_MAX;
        while self.ops.held_by_kernel() > 0 && Instant::now() < deadline {
            if self.ring.enter(Some(Duration::from_millis(10))).is_err() {
                break;
            }
            self.reap();
        }
        if self.ops.held_by_kernel() > 0 {
            // The kernel still holds some operations: their memory must not be freed.
            std::mem::forget(std::mem::take(&mut self.ops));
        }
    }
}

/// Creates the ring, trying the most capable setup first.
fn build_ring(entries: u32) -> io::Result<(IoUring, SetupMode)> {
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
            Ok(ring) => return Ok((ring, mode)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last_err = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last_err.unwrap_or_else(|| io::Error::other("io_uring setup failed")))
}

/// Runs `f` with the current worker's io_uring driver.
///
/// # Panics
/// Outside a worker, or on a worker whose driver is epoll.
fn with_uring<R>(f: impl FnOnce(&mut Uring) -> R) -> R {
    context::with(|cx| match &mut *cx.driver.borrow_mut() {
        Driver::Uring(ur) => f(ur),
        Driver::Epoll(_) => unreachable!("an io_uring operation on a worker whose driver is epoll"),
    })
}
