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
//! - The ring is entered through a registered ring descriptor
//!   (`IORING_REGISTER_RING_FDS`, Linux 5.18) where the kernel allows it:
//!   each enter names the ring by its slot in the thread's own table
//!   (`IORING_ENTER_REGISTERED_RING`), so the kernel skips looking the
//!   descriptor up and taking a reference on its file. The slot belongs to
//!   the thread that set the ring up (the worker's; another thread, where
//!   the set-up lets one enter, names it by its descriptor); it is given back
//!   when the ring is dropped, since a thread has 16 of them. Where the
//!   kernel refuses (older kernels, or 16 rings already registered on the
//!   thread) the ring is entered by its
//!   descriptor, and the driver's description line says so.
//! - Completion queue overflow: with `NODROP` the kernel holds completions
//!   that did not fit and hands them over at the next enter; every turn
//!   that found the queue overflowed counts (`cq_overflows`).
//! - With direct descriptors on (`HOTLOOP_URING_DIRECT_FDS`), the ring
//!   registers a sparse file table (`register_files_sparse`) that accepted
//!   connections fill; the slots their last holders let go are closed
//!   (`IORING_OP_CLOSE` on the slot) at the head of the next submission.
//! - [`Ring::run_now`] runs one entry to its completion inside a task's
//!   poll (installing a plain descriptor for a direct socket, at once; a
//!   shutdown, which the kernel runs on an io-wq thread): other
//!   completions it finds on the way wait in `early`, which the next reap
//!   reads first and which keeps the next enter from sleeping.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring};

use super::shared::DirectTable;
use super::user_data::UserData;
use crate::driver::config::DriverConfig;
use crate::slab::Key;
use crate::stats::{self, WorkerStats};

/// Completion queue entries per submission queue entry (the kernel's default is 2).
const CQ_ENTRIES_PER_SQ: u32 = 4;
/// `IORING_ENTER_GETEVENTS`: run deferred completion work and reap.
const IORING_ENTER_GETEVENTS: u32 = 1;
/// `IORING_ENTER_EXT_ARG`: the argument is an `io_uring_getevents_arg`.
const IORING_ENTER_EXT_ARG: u32 = 1 << 3;
/// `IORING_ENTER_REGISTERED_RING`: the descriptor argument is a slot in
/// the thread's registered rings.
const IORING_ENTER_REGISTERED_RING: u32 = 1 << 4;
/// `IORING_REGISTER_RING_FDS` (Linux 5.18).
const IORING_REGISTER_RING_FDS: libc::c_uint = 20;
/// `IORING_UNREGISTER_RING_FDS`.
const IORING_UNREGISTER_RING_FDS: libc::c_uint = 21;
/// `offset` asking the kernel to pick a free slot.
const RING_SLOT_ANY: u32 = u32::MAX;

/// `struct io_uring_rsrc_update` (`linux/io_uring.h`).
#[repr(C)]
struct RsrcUpdate {
    offset: u32,
    resv: u32,
    data: u64,
}

/// `struct io_uring_getevents_arg` (`linux/io_uring.h`).
#[repr(C)]
struct GeteventsArg {
    sigmask: u64,
    sigmask_sz: u32,
    min_wait_usec: u32,
    ts: u64,
}

/// `struct __kernel_timespec`.
#[repr(C)]
struct KernelTimespec {
    tv_sec: i64,
    tv_nsec: i64,
}

/// How `io_uring_enter` names the ring.
#[derive(Debug, Clone, Copy)]
struct EnterTarget {
    /// The descriptor, or the slot among the thread's registered rings.
    fd: i32,
    /// `IORING_ENTER_REGISTERED_RING` when `fd` is a slot, else 0.
    flag: u32,
    /// The thread whose table holds the slot.
    thread: Option<std::thread::ThreadId>,
}

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
    /// How each enter names the ring.
    target: EnterTarget,
    /// The registered file table of direct sockets, if there is one.
    pub(super) direct: Option<Rc<DirectTable>>,
    /// Completions read out of the queue by [`Ring::run_now`], oldest
    /// first, not yet handled.
    early: Vec<(u64, i32, u32)>,
    /// Test hook: this many submits fail with `EBUSY` before the kernel is asked.
    #[cfg(test)]
    pub(super) failing_submits: u32,
}

impl Ring {
    /// Creates the ring, trying the most capable setup first, registers its
    /// descriptor and NAPI busy polling if asked. Returns the ring, a
    /// sentence on kernel busy polling and one on the ring descriptor.
    pub(super) fn new(
        config: &DriverConfig,
        stats: Arc<WorkerStats>,
    ) -> io::Result<(Ring, String, String)> {
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
        let (target, registered) = if config.uring_switches.registered_ring {
            match register_ring_fd(&ring) {
                Ok(target) => (target, "ring descriptor registered".to_string()),
                Err(e) => (
                    unregistered(&ring),
                    format!(
                        "ring descriptor not registered ({e}; needs Linux 5.18 and a free slot of \
                         the thread's 16): each enter looks it up"
                    ),
                ),
            }
        } else {
            (
                unregistered(&ring),
                "ring descriptor not registered (HOTLOOP_URING_REGISTERED_RING=0)".to_string(),
            )
        };
        let ring = Ring {
            ring: Box::new(ring),
            pending: VecDeque::new(),
            waiting_since_ns: 0,
            stats,
            target,
            direct: None,
            early: Vec::new(),
            #[cfg(test)]
            failing_submits: 0,
        };
        Ok((ring, kernel_busy_poll, registered))
    }

    /// True if the ring is entered through a registered descriptor.
    #[cfg(test)]
    pub(super) fn is_registered(&self) -> bool {
        self.target.flag != 0
    }

    /// `io_uring_enter(2)` on this ring, naming it as [`Ring::target`] says.
    ///
    /// # Safety
    /// `arg` is null or points to what `flags` says it is (an
    /// `io_uring_getevents_arg` with `IORING_ENTER_EXT_ARG`), valid for the
    /// call, with `arg_size` its size.
    unsafe fn enter_raw(
        &self,
        to_submit: u32,
        min_complete: u32,
        flags: u32,
        arg: *const libc::c_void,
        arg_size: usize,
    ) -> io::Result<()> {
        // A slot names the ring only in the thread that registered it;
        // another thread names it by its descriptor (with SINGLE_ISSUER
        // the kernel then refuses it, EEXIST; a ring set up without it,
        // the COOP_TASKRUN fallback, lets another thread enter).
        let (fd, slot_flag) = match self.target.thread {
            Some(owner) if owner != std::thread::current().id() => (self.ring.as_raw_fd(), 0),
            _ => (self.target.fd, self.target.flag),
        };
        // SAFETY: the caller vouches for `arg`; the ring (or the slot
        // naming it in this thread's table) outlives the call.
        let res = unsafe {
            libc::syscall(
                libc::SYS_io_uring_enter,
                fd,
                to_submit,
                min_complete,
                flags | slot_flag,
                arg,
                arg_size,
            )
        };
        if res < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Flags every enter needs from the ring's state: deferred completion
    /// work, or completions held back by a full completion queue, are only
    /// handed over by an enter with `GETEVENTS` (as the `io-uring` crate's
    /// `submit` does).
    fn getevents_if_needed(&mut self) -> u32 {
        let sq = self.ring.submission();
        if sq.taskrun() || sq.cq_overflow() {
            IORING_ENTER_GETEVENTS
        } else {
            0
        }
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
        self.push_cancel_of(UserData::Op(key));
    }

    /// Queues a cancel of the entry of `owner`.
    pub(super) fn push_cancel_of(&mut self, owner: UserData) {
        let entry =
            opcode::AsyncCancel::new(owner.to_u64()).build().user_data(UserData::Cancel.to_u64());
        self.push(entry);
        crate::stats::add(&self.stats.cancellations, 1);
    }

    /// Moves pending entries into the submission queue, submitting when it
    /// fills. `admit` says, for an entry's `user_data`, whether it goes
    /// (marking its operation submitted) or was withdrawn (freeing its
    /// slot). Stops early (leaving the rest pending) if the kernel says
    /// "not now".
    fn flush(&mut self, admit: &mut impl FnMut(u64) -> bool) -> io::Result<()> {
        self.close_given_back_slots();
        while let Some(entry) = self.pending.front() {
            let user_data = entry.get_user_data();
            if UserData::has_slot(user_data) && !admit(user_data) {
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

    /// Queues the close of every direct slot whose last holder let go, at
    /// the head of the list: nothing queued names such a slot any more.
    fn close_given_back_slots(&mut self) {
        let Some(table) = &self.direct else { return };
        let mut slots = Vec::new();
        table.take_closed(&mut slots);
        for slot in slots.into_iter().rev() {
            let entry = opcode::Close::new(types::Fixed(slot))
                .build()
                .user_data(UserData::SlotClose.to_u64());
            self.pending.push_front(entry);
        }
    }

    /// Whether a direct socket's slot waits for its close entry.
    pub(super) fn slots_to_close(&self) -> bool {
        self.direct.as_ref().is_some_and(|t| t.has_closed())
    }

    /// Registers a sparse file table of `slots` for direct sockets.
    pub(super) fn register_direct_table(&mut self, slots: u32) -> io::Result<()> {
        self.ring.submitter().register_files_sparse(slots)?;
        self.direct = Some(Rc::new(DirectTable::new(slots)));
        Ok(())
    }

    /// Runs `entry` now and returns its result: an operation the kernel
    /// completes as it is submitted (`IORING_OP_FIXED_FD_INSTALL`), or soon
    /// after on one of its io-wq threads (`SHUTDOWN`, which it always runs
    /// there). Other completions read on the way are kept for the next
    /// reap. It waits for its entry's completion however many enters that
    /// takes: every such entry shares one `user_data`, so one left behind
    /// would later be read as another's result (an install's descriptor
    /// taken from a shutdown's 0, which is standard input).
    pub(super) fn run_now(&mut self, entry: squeue::Entry) -> io::Result<i32> {
        let entry = entry.user_data(UserData::RunNow.to_u64());
        // SAFETY: the entries `run_now` is given point at no memory, or at
        // memory their caller keeps until the completion, which this call
        // waits for (a unit test's timeout at a `Timespec` of its caller;
        // a socket option at its boxed value, leaked if this call fails).
        while unsafe { self.ring.submission().push(&entry) }.is_err() {
            if !self.submit_now()? {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
        stats::add(&self.stats.submissions, 1);
        let mut wait = 0;
        loop {
            stats::add(&self.stats.uring_enters, 1);
            let queued = self.ring.submission().len() as u32;
            // SAFETY: no argument.
            match unsafe {
                self.enter_raw(queued, wait, IORING_ENTER_GETEVENTS, std::ptr::null(), 0)
            } {
                Ok(()) => {}
                Err(e) if is_transient(&e) => {}
                Err(e) => return Err(e),
            }
            wait = 1;
            let mut found = None;
            for e in self.ring.completion() {
                if e.user_data() == UserData::RunNow.to_u64() && found.is_none() {
                    found = Some(e.result());
                } else {
                    self.early.push((e.user_data(), e.result(), e.flags()));
                }
            }
            if let Some(res) = found {
                return Ok(res);
            }
        }
    }

    /// True if a completion the kernel posted and no reap has handled yet
    /// carries `user_data` with a result of 0 or more. The completions
    /// still in the queue move to `early` on the way (the next reap takes
    /// them from there, in order): an enter in the middle of a turn (an
    /// early submit, [`Ring::run_now`]) may have run a receive that moved
    /// a socket's bytes into a buffer, out of the socket and out of sight
    /// of a peek, before any reap saw its completion.
    pub(super) fn has_unreaped(&mut self, user_data: u64) -> bool {
        let cq = self.ring.completion();
        self.early.extend(cq.map(|e| (e.user_data(), e.result(), e.flags())));
        self.early.iter().any(|&(ud, res, _)| ud == user_data && res >= 0)
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
        let queued = self.ring.submission().len() as u32;
        let flags = self.getevents_if_needed();
        // SAFETY: no argument.
        match unsafe { self.enter_raw(queued, 0, flags, std::ptr::null(), 0) } {
            Ok(()) => Ok(true),
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
        if !self.early.is_empty() {
            // Completions already read out wait to be handled.
            timeout = Some(Duration::ZERO);
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
        let res = match timeout {
            // SAFETY: no argument; waits for one completion.
            None => unsafe {
                self.enter_raw(queued, 1, IORING_ENTER_GETEVENTS, std::ptr::null(), 0)
            },
            // SAFETY: no argument; GETEVENTS with min_complete 0 only runs
            // deferred work and never waits.
            Some(d) if d.is_zero() => unsafe {
                self.enter_raw(queued, 0, IORING_ENTER_GETEVENTS, std::ptr::null(), 0)
            },
            Some(d) => {
                let ts = KernelTimespec {
                    tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
                    tv_nsec: i64::from(d.subsec_nanos()),
                };
                let arg = GeteventsArg {
                    sigmask: 0,
                    sigmask_sz: 0,
                    min_wait_usec: 0,
                    ts: &ts as *const KernelTimespec as u64,
                };
                // SAFETY: `arg` is an `io_uring_getevents_arg` (EXT_ARG)
                // whose `ts` points to `ts`; both live until the call returns.
                unsafe {
                    self.enter_raw(
                        queued,
                        1,
                        IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG,
                        (&arg as *const GeteventsArg).cast(),
                        std::mem::size_of::<GeteventsArg>(),
                    )
                }
            }
        };
        match res {
            Ok(()) => Ok(()),
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
        let early = self.early.len().min(max);
        out.extend(self.early.drain(..early));
        out.extend((&mut cq).take(max - early).map(|e| (e.user_data(), e.result(), e.flags())));
        (overflowed, lost)
    }
}

/// The completions one poll copies out of the ring: the buffer they go
/// to, reused every poll, how many one poll handles at most, and the
/// kernel's dropped-completion counter at the last look.
pub(super) struct Completions {
    cqes: Vec<(u64, i32, u32)>,
    max: usize,
    dropped_seen: u32,
}

impl Completions {
    /// At most `max` completions per poll.
    pub(super) fn new(max: usize) -> Completions {
        Completions { cqes: Vec::with_capacity(max), max, dropped_seen: 0 }
    }

    /// Copies what is waiting in `ring`'s completion queue (at most the
    /// bound) and lends it out, counting a full or lossy queue
    /// (`cq_overflows`); [`Completions::give_back`] returns the buffer.
    pub(super) fn take(&mut self, ring: &mut Ring) -> Vec<(u64, i32, u32)> {
        let (overflowed, lost) =
            ring.take_completions(&mut self.cqes, self.max, &mut self.dropped_seen);
        if overflowed || lost > 0 {
            stats::add(&ring.stats.cq_overflows, u64::from(overflowed) + u64::from(lost));
        }
        std::mem::take(&mut self.cqes)
    }

    /// Takes back the buffer [`Completions::take`] lent, once its
    /// completions are handled, and counts them.
    pub(super) fn give_back(&mut self, cqes: Vec<(u64, i32, u32)>, ring: &Ring) {
        let n = cqes.len() as u64;
        stats::add(&ring.stats.completions, n);
        stats::add(&ring.stats.poller_events, n);
        self.cqes = cqes;
    }
}

impl Drop for Ring {
    /// Gives the registered slot back: the thread's table holds a
    /// reference to the ring, which would otherwise stay open (and the
    /// slot taken) until the thread exits.
    fn drop(&mut self) {
        let Some(thread) = self.target.thread else { return };
        // A slot names a ring only in the thread that registered it.
        if thread != std::thread::current().id() {
            return;
        }
        let update = RsrcUpdate { offset: self.target.fd as u32, resv: 0, data: 0 };
        // SAFETY: `update` is one `io_uring_rsrc_update`, valid for the call.
        unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                self.ring.as_raw_fd(),
                IORING_UNREGISTER_RING_FDS,
                &update as *const RsrcUpdate,
                1u32,
            );
        }
    }
}

/// Registers `ring`'s descriptor in the calling thread's table of rings.
fn register_ring_fd(ring: &IoUring) -> io::Result<EnterTarget> {
    let mut update = RsrcUpdate { offset: RING_SLOT_ANY, resv: 0, data: ring.as_raw_fd() as u64 };
    // SAFETY: `update` is one `io_uring_rsrc_update` the kernel writes the
    // slot into, valid for the call.
    let res = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            ring.as_raw_fd(),
            IORING_REGISTER_RING_FDS,
            &mut update as *mut RsrcUpdate,
            1u32,
        )
    };
    match res {
        1 => Ok(EnterTarget {
            fd: update.offset as i32,
            flag: IORING_ENTER_REGISTERED_RING,
            thread: Some(std::thread::current().id()),
        }),
        n if n < 0 => Err(io::Error::last_os_error()),
        // 0: the kernel registered nothing (every slot taken).
        _ => Err(io::Error::from_raw_os_error(libc::EBUSY)),
    }
}

/// Entering `ring` by its descriptor.
fn unregistered(ring: &IoUring) -> EnterTarget {
    EnterTarget { fd: ring.as_raw_fd(), flag: 0, thread: None }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use io_uring::opcode;

    use super::Ring;
    use crate::driver::config::{DriverConfig, DriverKind, Registration, UringSwitches};
    use crate::stats::WorkerStats;

    /// The most rings one thread may register (`IO_RINGFD_REG_MAX`).
    const THREAD_SLOTS: usize = 16;

    fn config(registered_ring: bool) -> DriverConfig {
        DriverConfig {
            kind: DriverKind::Uring,
            registration: Registration::Lazy,
            events_per_poll_max: 64,
            uring_entries: 8,
            kernel_busy_poll: None,
            uring_switches: UringSwitches { registered_ring, ..UringSwitches::from_env() },
        }
    }

    fn ring(registered_ring: bool) -> (Ring, String) {
        let (ring, _, said) = Ring::new(&config(registered_ring), Arc::default()).unwrap();
        (ring, said)
    }

    /// An entry `run_now` runs gets its own completion back, even one the
    /// kernel completes only after several enters have returned with
    /// others' completions (a multishot timer firing every 50 us): before,
    /// it gave up after eight enters and the next call took the late
    /// completion as its own.
    #[test]
    fn run_now_waits_for_its_own_completion() {
        let (mut ring, _) = ring(false);
        let every = Box::new(io_uring::types::Timespec::new().nsec(50_000));
        let ticks = opcode::Timeout::new(&*every)
            .count(0)
            .flags(io_uring::types::TimeoutFlags::MULTISHOT)
            .build()
            .user_data(3);
        ring.push(ticks);
        ring.submit_pending(|_| true).unwrap();
        // 20 ms: some 400 ticks, so that well over eight come in between
        // even on a machine too busy to enter the ring often.
        let later = io_uring::types::Timespec::new().nsec(20_000_000);
        let res = ring.run_now(opcode::Timeout::new(&later).build()).unwrap();
        assert_eq!(res, -libc::ETIME, "the 20 ms timeout's own result");
        std::thread::sleep(Duration::from_millis(21));
        assert_eq!(ring.run_now(opcode::Nop::new().build()).unwrap(), 0, "the NOP's own result");
        assert!(ring.early.len() > 8, "the ticks came in between: {}", ring.early.len());
        // The multishot timer's memory outlives the ring's use of it.
        drop(ring);
        drop(every);
    }

    /// A `NOP` goes in and its completion comes back through `enter`, both
    /// through the waiting enter and through the one that submits alone.
    fn assert_enters(ring: &mut Ring) {
        let mut out = Vec::new();
        let mut dropped = 0;
        ring.push(opcode::Nop::new().build().user_data(7));
        ring.enter(Some(Duration::from_secs(5)), |_| true).unwrap();
        ring.take_completions(&mut out, 8, &mut dropped);
        assert_eq!(out.len(), 1, "the NOP's completion did not come back");
        assert_eq!((out[0].0, out[0].1), (7, 0));
        ring.push(opcode::Nop::new().build().user_data(8));
        ring.submit_pending(|_| true).unwrap();
        ring.enter(None, |_| true).unwrap();
        ring.take_completions(&mut out, 8, &mut dropped);
        assert_eq!(out.iter().map(|c| c.0).collect::<Vec<_>>(), [8]);
        let stats: &WorkerStats = &ring.stats;
        assert!(stats.uring_enters.load(std::sync::atomic::Ordering::Relaxed) >= 3);
    }

    /// Each ring registers its descriptor and gives the slot back when
    /// dropped: a thread that sets up more rings, one after another, than
    /// it has slots still registers every one.
    #[test]
    fn registered_ring_slots_are_given_back() {
        if crate::__private::skip_uring_test() {
            return;
        }
        for i in 0..THREAD_SLOTS + 4 {
            let (mut ring, said) = ring(true);
            assert!(ring.is_registered(), "ring {i} was not registered: {said}");
            assert_eq!(said, "ring descriptor registered");
            assert_enters(&mut ring);
        }
    }

    /// With every slot of the thread taken the kernel refuses (`EBUSY`):
    /// the ring is entered by its descriptor and says why; a slot given
    /// back is taken by the next ring.
    #[test]
    fn refused_registration_enters_by_descriptor() {
        if crate::__private::skip_uring_test() {
            return;
        }
        let mut held = Vec::new();
        let refused = loop {
            assert!(held.len() <= THREAD_SLOTS, "the kernel never refused a slot");
            let (ring, said) = ring(true);
            if !ring.is_registered() {
                break (ring, said);
            }
            held.push(ring);
        };
        let (mut refused, said) = refused;
        assert_eq!(held.len(), THREAD_SLOTS);
        assert!(said.starts_with("ring descriptor not registered ("), "{said}");
        assert_enters(&mut refused);
        held.pop();
        let (mut again, said) = ring(true);
        assert!(again.is_registered(), "{said}");
        assert_enters(&mut again);
    }

    /// The switch off: the ring is entered by its descriptor.
    #[test]
    fn registered_ring_switched_off() {
        if crate::__private::skip_uring_test() {
            return;
        }
        let (mut ring, said) = ring(false);
        assert!(!ring.is_registered());
        assert!(said.contains("HOTLOOP_URING_REGISTERED_RING=0"), "{said}");
        assert_enters(&mut ring);
    }
}
