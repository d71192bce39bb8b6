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
//! - Operations queue their entries in the driver's own list while tasks
//!   run ([`ring::Ring`]); [`Driver::poll`] moves them into the submission
//!   queue and submits them with one `io_uring_enter` per loop turn, which
//!   also waits. Until then an entry can be withdrawn: an operation dropped
//!   in the turn it was made never reaches the kernel, loses no bytes and
//!   needs no cancel. A full submission queue is never an error: what does
//!   not fit is submitted in more enters (`sq_full`), or waits in the list
//!   for the next turn. The exception is a stream write on a quiet
//!   worker, which tries a non-blocking `send(2)` (owned buffer) or
//!   `sendmsg(2)` (poll form) first ([`Driver::send_directly`]).
//! - The turn's enter is not the only one on a busy worker: after each task
//!   poll, entries whose oldest has waited longer than the submit delay
//!   (`HOTLOOP_URING_SUBMIT_AFTER_US`, 200 µs) are submitted without waiting
//!   or reaping ([`Driver::after_task_poll`]). Costly requests (60 µs of
//!   work each) otherwise held every answer queued early in a turn until
//!   the turn's last task ended: under an accept storm with two workers the
//!   established connections' p50 was twice epoll's and their p99 2-3 ms
//!   over it, a gap the bound closes.
//! - An owned write of a shared buffer (`IoBuf::share`) from 64 KiB is a
//!   `SEND_ZC`: it returns at its result, and another handle on its bytes
//!   waits in `zero_copy.rs` until the notification that the kernel no longer
//!   reads them (`lifecycle.rs`). A socket whose zero-copy sends the
//!   kernel reports copied (a local peer) goes back to copying sends.
//! - The worker's unpark eventfd has a multishot `POLL_ADD` on it (one-shot,
//!   re-armed after each wake, on kernels without multishot poll), so a
//!   write from another thread ends a sleeping poll.
//! - In-flight operations live in a generational slab ([`lifecycle`], [`op`]);
//!   `user_data` is the slot's key. A stream's multishot receive lives in
//!   its stream's slot instead (`pooled.rs`): its `user_data` is the
//!   stream's key with bit 31 set. Values no key can take mark the eventfd
//!   poll, cancel requests and the deadline timer.
//! - A wait until a deadline is a wait for one completion, with an
//!   absolute `IORING_OP_TIMEOUT` in the ring that stays armed across
//!   waits and is moved (`IORING_TIMEOUT_UPDATE`) only when a deadline
//!   comes earlier than the armed one, as epoll's timerfd is: a timeout on
//!   every `io_uring_enter` set up a kernel timer per wait and needed a
//!   clock reading to turn the deadline into a timeout.
//! - An operation holds its socket (a shared descriptor) as well as its
//!   memory until its last completion, so a socket closed by its owner
//!   stays open for as long as the kernel may still act on it, and its
//!   number cannot be reused under a queued entry.
//! - With `HOTLOOP_URING_DIRECT_FDS=1` accepted TCP connections are slots
//!   of a file table the ring registers (`accept.rs`, `shared.rs`): the
//!   same rule holds for a slot, closed with `IORING_OP_CLOSE` after its
//!   last holder; a system call on such a socket gets a plain descriptor
//!   installed first ([`Driver::plain_fd`]).
//! - Wakers are woken, and the storage of finished cancelled operations
//!   dropped, only after the driver's state is released: a buffer whose
//!   destructor does I/O, or panics, finds the driver usable.
//! - Dropping the driver cancels everything in flight and waits (at most
//!   [`DRAIN_ON_DROP_MAX`](teardown::DRAIN_ON_DROP_MAX)) for the last completions, so no memory the
//!   kernel may still write is freed and no accepted descriptor leaks.
//! - A byte a stream reported written is delivered or the connection is
//!   reset, within [`WRITE_LINGER`] (a Unix stream, which has no reset,
//!   is not cut while its runtime drives the ring): a written-behind send
//!   the stream no longer waits for (dropped, or shut down in both
//!   directions) lingers in the driver (`linger.rs`). The ring is driven until it ends by
//!   whoever is on the thread: the worker's loop while the runtime runs;
//!   off its turn, the thread that drops a socket ([`Driver::settle`]);
//!   the thread the runtime leaves ([`Driver::leave`]: `block_on`
//!   returning, a worker stopping, a runtime dropped); and the driver's
//!   own drop. Each waits in the ring, never spins, and ends at the
//!   deadline at the latest.
//!
//! Architecture invariant: nothing but the worker's own thread touches the
//! ring (`SINGLE_ISSUER` makes the kernel enforce it).
//!
//! # Layout
//! This file defines the driver (`Driver`), the face every socket role
//! reaches the ring through, with its own entry points (`poll`, `leave`,
//! `settle`); its state (`Uring`, in `state.rs`) is made of parts each
//! defined and handled in its own file. Beneath it, imports run one way,
//! and none runs back up to this file except to the face: each module names
//! only modules before it in this list, bottom to top
//! (`tests/layering.rs` checks it):
//!
//! 1. `bufring`: provided-buffer rings; `shared`: the descriptor and file
//!    types an operation holds; `user_data`: what an entry's `user_data`
//!    names, encoded and decoded in one place; `multishot`: the stages of
//!    a multishot operation the driver keeps armed for a queue; `waiters`:
//!    the tasks parked on one wait beyond its first.
//! 2. `linger`: the rest of a written-behind send its stream no longer
//!    waits for (dropped, or shut down in both directions).
//! 3. `unclaimed`: descriptors the kernel hands back that nobody will take;
//!    `zero_copy`: what keeps a zero-copy send's bytes alive until its
//!    notification.
//! 4. `ring`: setup, the pending list, the one enter per turn, the
//!    completions a poll copies out.
//! 5. `lifecycle`: an operation's slot states, and the slab of them.
//! 6. `op`: the future of an operation, and what its drop does.
//! 7. `accept`, `pooled`, `dgram`: the multishot queues of listeners,
//!    streams and datagram sockets, each a part of the driver's state;
//!    `wakeups`: the eventfd's poll and the deadline timer, the parts that
//!    end a wait besides completions.
//! 8. `state`: `Uring`, the driver's state made of those parts, and the
//!    entry points that hand a part the others it needs.
//! 9. `dispatch`: delivering each completion; `turn`: one turn of the
//!    ring, and the waits of a ring driven off its turn; `teardown`:
//!    dropping the driver.
//! 10. `source`: the descriptor and driver every socket role holds, and its
//!     ring entries.
//! 11. `readiness`, `listener`: the watched descriptor and the listener.
//! 12. `write_behind`: the poll-form writes' buffer; `stream`: the stream
//!     source; `udp`: the datagram source.
//! 13. `file`: file operations, and `send_file` on a stream.

mod accept;
mod bufring;
mod dgram;
mod dispatch;
mod file;
mod lifecycle;
mod linger;
mod listener;
mod multishot;
mod op;
mod pooled;
mod readiness;
mod ring;
mod shared;
mod source;
mod state;
mod stream;
mod teardown;
mod turn;
mod udp;
mod unclaimed;
mod user_data;
mod waiters;
mod wakeups;
mod write_behind;
mod zero_copy;

pub(crate) use linger::WRITE_LINGER;
pub(crate) use listener::{Accepted, ListenerSource};
pub(crate) use readiness::ReadinessSource;
pub(crate) use shared::SharedFd;
pub(crate) use stream::{SendOwned, StreamProbe, StreamSource};
pub(crate) use udp::DatagramSource;

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::RawFd;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::task::Waker;
use std::time::Instant;

use self::ring::Ring;
use self::state::Uring;
use self::turn::{SettleFor, SETTLE_MAX};
use self::wakeups::{DeadlineTimer, Wake};
use super::config::{DriverConfig, UringSwitches};
use super::park::Park;
use super::probe;
use super::wake::Unpark;
use crate::stats::WorkerStats;

/// The most completions a poll may have handled for the stream writes
/// after it to go out as direct sends; beyond it they are ring entries
/// submitted together. Measured on loopback: with one
/// connection at a time a direct send saves 4% of a serial connection's
/// CPU, while at 16 or 256 busy connections batched entries cost 5-8%
/// less CPU per request than a system call each.
const DIRECT_SEND_COMPLETIONS_MAX: usize = 2;

/// One worker's io_uring driver.
pub(crate) struct Driver {
    state: RefCell<Uring>,
    entered: Cell<bool>,
    /// Wakers collected by a poll, woken once the state is released.
    woken: RefCell<Vec<Waker>>,
    /// Storage of operations the kernel is done with, dropped once the
    /// state is released.
    freed: RefCell<Vec<Box<dyn Any>>>,
    /// Empty pipes for file sends (`file.rs`), at most
    /// [`file::PIPES_POOLED_MAX`].
    pipes: RefCell<Vec<file::Pipe>>,
    /// The switches it was built with (file operations on the ring, how
    /// `send_file` moves bytes).
    pub(crate) switches: UringSwitches,
    /// Completions the last [`Driver::poll`] handled: a worker that found
    /// only a few has few tasks whose ring entries the next enter could
    /// carry together, so its stream writes go out at once
    /// ([`Driver::send_directly`]).
    last_completions: Cell<usize>,
    /// The worker's counters (`direct_sends` is bumped outside the ring).
    stats: Arc<WorkerStats>,
    /// True if the driver has a provided-buffer ring, for its whole life:
    /// a stream's reads then take from a multishot receive's queue, else
    /// they wait on a `POLL_ADD` (see `stream.rs`).
    reads_from_ring: bool,
    /// Owned stream writes of at least this many bytes go out as
    /// `SEND_ZC` (`None`: switched off, or the kernel lacks it).
    send_zc_min_bytes: Option<usize>,
}

impl Driver {
    /// Sets up the ring and arms the eventfd's poll. Returns the driver, a
    /// sentence on kernel busy polling (NAPI) and one on how the ring is
    /// entered (a registered descriptor or not).
    pub(crate) fn new(
        config: &DriverConfig,
        unpark: Arc<Unpark>,
        stats: Arc<WorkerStats>,
    ) -> io::Result<(Rc<Driver>, String, String)> {
        let (mut ring, kernel_busy_poll, ring_fd) =
            Ring::new(config, stats.clone()).map_err(|e| match probe::uring_support() {
                Err(why) => io::Error::new(e.kind(), why),
                Ok(()) => e,
            })?;
        let switches = config.uring_switches;
        let buf_ring = if switches.multishot_recv && probe::multishot_recv_supported() {
            bufring::BufRing::new(ring.io_uring(), switches.recv_incremental).ok()
        } else {
            None
        };
        let reads_from_ring = buf_ring.is_some();
        let direct_said = match switches.direct_fd_slots {
            None => "plain descriptors (HOTLOOP_URING_DIRECT_FDS=0)".to_string(),
            Some(_) if !probe::multishot_accept_supported() || !reads_from_ring => {
                "plain descriptors: direct ones need multishot accept and receive".to_string()
            }
            Some(_) if !probe::opcode_supported(io_uring::opcode::FixedFdInstall::CODE) => {
                "plain descriptors: direct ones need IORING_OP_FIXED_FD_INSTALL (Linux 6.8)"
                    .to_string()
            }
            Some(slots) => {
                let limit = crate::sys::nofile_soft_limit().unwrap_or(u64::MAX);
                let slots = slots.min(u32::try_from(limit).unwrap_or(u32::MAX));
                match ring.register_direct_table(slots) {
                    Ok(()) => {
                        format!("accepted TCP connections are direct descriptors ({slots} slots)")
                    }
                    Err(e) => {
                        format!("plain descriptors: registering {slots} direct ones failed ({e})")
                    }
                }
            }
        };
        let mut uring = Uring {
            ring,
            completions: ring::Completions::new(config.events_per_poll_max),
            ops: lifecycle::Ops::default(),
            listeners: accept::Listeners::new(probe::multishot_accept_supported()),
            streams: pooled::Streams::new(buf_ring),
            dgrams: dgram::Dgrams::new(
                switches.multishot_recvmsg && probe::multishot_recv_supported(),
                switches.dgram_buffers,
            ),
            wake: Wake::new(unpark),
            zero_copy: zero_copy::ZeroCopyKeeps::default(),
            lingering: linger::Lingering::default(),
            timer: DeadlineTimer::default(),
        };
        uring.wake.arm(&mut uring.ring);
        debug_assert_eq!(reads_from_ring, uring.streams.reads_from_ring());
        let recv_said = if !reads_from_ring {
            "streams read without a buffer ring"
        } else if uring.streams.reads_incrementally() {
            "stream receives fill 64 KiB buffers a part at a time (IOU_PBUF_RING_INC)"
        } else if !switches.recv_incremental {
            "stream receives take 4 KiB buffers whole (HOTLOOP_URING_RECV_INC=0)"
        } else {
            "stream receives take 4 KiB buffers whole: IOU_PBUF_RING_INC needs Linux 6.12"
        };
        let (send_zc_min_bytes, send_zc_said) =
            match (switches.send_zc_min_bytes, probe::send_zc_support()) {
                (None, _) => (None, "zero-copy sends off (HOTLOOP_URING_SEND_ZC=0)".to_string()),
                (Some(_), Err(why)) => (None, format!("zero-copy sends off: {why}")),
                (Some(n), Ok(())) => {
                    (Some(n), format!("owned writes of {n} bytes or more sent zero-copy"))
                }
            };
        let driver = Driver {
            state: RefCell::new(uring),
            entered: Cell::new(false),
            woken: RefCell::new(Vec::new()),
            freed: RefCell::new(Vec::new()),
            pipes: RefCell::new(Vec::new()),
            switches,
            last_completions: Cell::new(0),
            stats,
            reads_from_ring,
            send_zc_min_bytes,
        };
        let said = format!("{ring_fd}; {send_zc_said}; {recv_said}; {direct_said}");
        Ok((Rc::new(driver), kernel_busy_poll, said))
    }

    /// True while the runtime that owns the driver runs on this thread.
    pub(crate) fn entered(&self) -> &Cell<bool> {
        &self.entered
    }

    /// Submits what tasks queued, waits for completions as `park` says
    /// and wakes the tasks they concern. Returns how many completions
    /// were handled.
    pub(crate) fn poll(&self, park: Park) -> io::Result<usize> {
        let mut woken = std::mem::take(&mut *self.woken.borrow_mut());
        let mut freed = std::mem::take(&mut *self.freed.borrow_mut());
        let res = self.state.borrow_mut().poll(park, &mut woken, &mut freed);
        if let Ok(n) = res {
            self.last_completions.set(n);
        }
        self.release(&mut woken, &mut freed);
        *self.woken.borrow_mut() = woken;
        *self.freed.borrow_mut() = freed;
        res
    }

    /// Runs `send`, a non-blocking send system call, in place of a ring
    /// entry when the worker is quiet: unless switched off, when the last
    /// poll handled at most [`DIRECT_SEND_COMPLETIONS_MAX`] completions. A
    /// lone connection (serial, or one request at a time) then gets its
    /// answer out inside the task's poll, without the entry, its completion
    /// and a second poll of the task; a busy worker keeps batching its
    /// sends into one enter, which costs less than a system call each.
    ///
    /// `None`: the worker is busy, or the socket had no room (`EAGAIN`);
    /// the caller goes through the ring. `Some`: the call's result, counted
    /// in `direct_sends`.
    pub(crate) fn send_directly(
        &self,
        send: impl FnOnce() -> io::Result<usize>,
    ) -> Option<io::Result<usize>> {
        if !self.switches.direct_send || self.last_completions.get() > DIRECT_SEND_COMPLETIONS_MAX {
            return None;
        }
        match send() {
            Err(e) if op::is_retry(&e) => None,
            res => {
                crate::stats::add(&self.stats.direct_sends, 1);
                Some(res)
            }
        }
    }

    /// Shuts `fd` down (`how`) now: `shutdown(2)` on its plain descriptor,
    /// or for a direct socket without one a `SHUTDOWN` entry run at once
    /// (one enter, as an install would cost, but no descriptor made): the
    /// poll-form shutdown of a connection's end, which hyper makes on every
    /// connection it closes.
    pub(crate) fn shutdown_now(&self, fd: &SharedFd, how: std::net::Shutdown) -> io::Result<()> {
        if let Some(raw) = fd.raw_fd() {
            return crate::sys::shutdown(raw, how);
        }
        let Ok(mut st) = self.state.try_borrow_mut() else {
            // Inside the driver (never from a task's poll): by descriptor.
            return crate::sys::shutdown(self.plain_fd(fd)?, how);
        };
        let how = match how {
            std::net::Shutdown::Read => libc::SHUT_RD,
            std::net::Shutdown::Write => libc::SHUT_WR,
            std::net::Shutdown::Both => libc::SHUT_RDWR,
        };
        let entry = fd.entry(|t| io_uring::opcode::Shutdown::new(t, how).build());
        match st.ring.run_now(entry)? {
            res if res < 0 => Err(io::Error::from_raw_os_error(-res)),
            _ => Ok(()),
        }
    }

    /// Sets `SO_LINGER` on a direct socket without a plain descriptor,
    /// with no descriptor made: an `IORING_OP_URING_CMD` entry
    /// (`SOCKET_URING_OP_SETSOCKOPT`, Linux 6.7) run at once. Out of
    /// descriptors, installing one for `setsockopt(2)` fails, and a cut
    /// that cannot set the option closes with a FIN: a truncated transfer
    /// would look complete. `None` when the caller should go through a
    /// plain descriptor instead: the socket has one, the kernel has no
    /// socket commands (`EOPNOTSUPP`, or `EINVAL` before `URING_CMD`), or
    /// the call comes from inside the driver.
    pub(crate) fn set_linger_direct(
        &self,
        fd: &SharedFd,
        linger: Option<std::time::Duration>,
    ) -> Option<io::Result<()>> {
        if fd.raw_fd().is_some() || fd.slot().is_none() {
            return None;
        }
        let mut st = self.state.try_borrow_mut().ok()?;
        // The option's value where the kernel reads it. Boxed: should the
        // enter fail after the entry went in, the kernel may still read it
        // later, and it is leaked then rather than freed under it.
        let value = Box::new(crate::sys::linger(linger));
        let entry = fd.entry(|t| {
            io_uring::opcode::SetSockOpt::new(
                t,
                libc::SOL_SOCKET as u32,
                libc::SO_LINGER as u32,
                std::ptr::from_ref::<libc::linger>(&value).cast(),
                std::mem::size_of::<libc::linger>() as u32,
            )
            .build()
        });
        let res = match st.ring.run_now(entry) {
            Ok(res) => res,
            Err(e) => {
                Box::leak(value);
                return Some(Err(e));
            }
        };
        match res {
            0.. => Some(Ok(())),
            res if -res == libc::EOPNOTSUPP || -res == libc::EINVAL => None,
            res => Some(Err(io::Error::from_raw_os_error(-res))),
        }
    }

    /// The plain descriptor of `fd`, installed now
    /// (`IORING_OP_FIXED_FD_INSTALL`, one enter) if it is a direct socket
    /// without one: for system calls, and for handing the socket to user
    /// code or another thread. The socket keeps it until it closes.
    pub(crate) fn plain_fd(&self, fd: &SharedFd) -> io::Result<RawFd> {
        if let Some(raw) = fd.raw_fd() {
            return Ok(raw);
        }
        let slot = fd.slot().expect("a socket has a descriptor or a slot");
        let mut st = self.state.try_borrow_mut().map_err(|_| {
            io::Error::new(io::ErrorKind::WouldBlock, "the io_uring driver is busy on this thread")
        })?;
        let entry = io_uring::opcode::FixedFdInstall::new(io_uring::types::Fixed(slot), 0).build();
        let res = st.ring.run_now(entry)?;
        if res < 0 {
            return Err(io::Error::from_raw_os_error(-res));
        }
        crate::stats::add(&self.stats.direct_fd_installs, 1);
        // SAFETY: a non-negative `FIXED_FD_INSTALL` result is a descriptor
        // the kernel just installed (close-on-exec) for this process;
        // nothing else owns it.
        let owned = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(res) };
        Ok(fd.set_plain(owned))
    }

    /// Called after each task poll: hands the queued entries to the kernel
    /// if the oldest has waited longer than the switches allow, so that an
    /// answer queued early in a long run of tasks (a busy worker with
    /// costly requests) leaves while the later tasks run, as it would on
    /// epoll, instead of at the end of the run.
    pub(crate) fn after_task_poll(&self) {
        let Some(limit) = self.switches.submit_after_ns else { return };
        let since = match self.state.try_borrow() {
            Ok(st) => st.ring.waiting_since_ns(),
            Err(_) => return,
        };
        if since.is_some_and(|t| crate::sys::monotonic_ns().saturating_sub(t) >= limit) {
            crate::stats::add(&self.stats.early_submits, 1);
            self.submit_now();
        }
    }

    /// Wakes what a poll collected and drops what it freed, with the state
    /// released. A destructor that panics is reported, not propagated: the
    /// worker and every other operation carry on.
    fn release(&self, woken: &mut Vec<Waker>, freed: &mut Vec<Box<dyn Any>>) {
        for w in woken.drain(..) {
            w.wake();
        }
        for storage in freed.drain(..) {
            let dropped =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(storage)));
            if dropped.is_err() {
                crate::log::warn(format_args!(
                    "a buffer's destructor panicked when its cancelled io_uring operation ended; \
                     the worker carries on"
                ));
            }
        }
    }

    /// Keeps `keep`, another handle on the bytes of a zero-copy send on
    /// `fd`, until the send's notification (`user_data`) says the kernel no
    /// longer reads them.
    fn keep_until_notified(&self, user_data: u64, keep: Box<dyn Any>, fd: &SharedFd) {
        match self.state.try_borrow_mut() {
            Ok(mut st) => st.zero_copy.keep(user_data, keep, fd),
            // Never from a destructor the driver runs; were it so, leaking
            // beats freeing bytes the kernel may read.
            Err(_) => std::mem::forget(keep),
        }
    }

    /// True (once) if a notification said the kernel copied a zero-copy
    /// send on the socket `fd` marks ([`SockFd::mark`](shared::SockFd::mark)) after its stream had taken the result: the stream's
    /// later writes are plain sends. Also forgets the mark of a stream
    /// being dropped.
    fn take_copied_mark(&self, fd: i64) -> bool {
        match self.state.try_borrow_mut() {
            Ok(mut st) => st.zero_copy.take_copied_mark(fd),
            Err(_) => false,
        }
    }

    /// Hands what is queued to the kernel now, without waiting or reaping.
    fn submit_now(&self) {
        if let Ok(mut st) = self.state.try_borrow_mut() {
            let st = &mut *st;
            let _ = st.ring.submit_pending(|ud| pooled::admit(&mut st.ops, &mut st.streams, ud));
        }
    }

    /// Sends `buf[sent..]` on `fd` after its stream stopped waiting for
    /// it: the rest of a written-behind write that was waiting for room
    /// when the stream was dropped (or, with `handover`, shut down in
    /// both directions).
    fn linger_send(
        &self,
        fd: &SharedFd,
        buf: Vec<u8>,
        sent: usize,
        handover: Option<Rc<linger::Handover>>,
    ) {
        let mut write = linger::LingeringWrite::new(
            buf,
            sent,
            fd.clone(),
            Instant::now() + WRITE_LINGER,
            handover,
        );
        let Ok(mut st) = self.state.try_borrow_mut() else {
            // Inside a destructor the driver runs: the bytes cannot go, so
            // the peer is told (the kernel never had this buffer).
            drop(write.finish());
            return;
        };
        match write.first_entry() {
            Some(entry) => st.start_lingering(Box::new(write), entry),
            None => drop(write.finish()),
        }
    }

    /// The runtime leaves this thread (`block_on` returns, a worker stops,
    /// a runtime is dropped): from now on nobody enters the ring until it
    /// comes back, so what it still owes is settled here.
    pub(crate) fn leave(&self) {
        self.entered.set(false);
        self.settle(SettleFor::All);
    }

    /// A socket was dropped (`sock`: its descriptor, which operations the
    /// kernel still holds may keep open): outside the runtime's turn, the
    /// ring is driven until they end, so the socket really closes now.
    fn settle_socket(&self, sock: &Weak<shared::SockFd>) {
        self.settle(SettleFor::Socket(sock));
    }

    /// The future of the operation `key` was dropped: outside the
    /// runtime's turn, the ring is driven until the kernel is done with it.
    fn settle_op(&self, key: crate::slab::Key) {
        self.settle(SettleFor::Op(key));
    }

    /// Outside its runtime's turn nobody else enters the ring, so the
    /// calling thread drives it, waiting in the ring for each completion
    /// (never spinning), for as long as `what` is owed: until the
    /// cancelled operations it waits for have ended (at most
    /// [`SETTLE_MAX`]), so a dropped socket really closes, and until the
    /// lingering writes among them have ended, their bytes all in the
    /// kernel, their socket failed, or their deadline ([`WRITE_LINGER`])
    /// passed and cut them. A stream reported those bytes written while
    /// they were still in user space, where no close of the kernel's sends
    /// them: this is the close that waits, as one with `SO_LINGER` does.
    /// A socket's or an operation's settle waits only for what holds that
    /// socket or is that operation: an operation of another socket the
    /// kernel never ends (a zero-copy send's notification from a dead peer)
    /// would otherwise cost every later drop the whole bound.
    fn settle(&self, what: SettleFor<'_>) {
        if self.entered.get() {
            return;
        }
        let cancels_until = Instant::now() + SETTLE_MAX;
        loop {
            let mut woken = Vec::new();
            let mut freed = Vec::new();
            let more = match self.state.try_borrow_mut() {
                Ok(mut st) => st.settle_step(cancels_until, what, &mut woken, &mut freed),
                Err(_) => false,
            };
            self.release(&mut woken, &mut freed);
            // What `release` dropped may have been a direct socket's last
            // holder: its slot's close goes to the kernel by one more step.
            let slots_to_close = self.state.try_borrow().is_ok_and(|st| st.ring.slots_to_close());
            if !more && !slots_to_close {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::Duration;

    use crate::driver::Driver as AnyDriver;
    use crate::net::TcpListener;
    use crate::runtime::current;
    use crate::time::{sleep, timeout};
    use crate::{DriverKind, Runtime};

    /// Makes the next `n` submissions of the current worker's ring fail
    /// as a full or busy ring would.
    fn fail_submits(n: u32) {
        current::with_driver(|d| match d {
            AnyDriver::Uring(d) => d.state.borrow_mut().ring.failing_submits = n,
            AnyDriver::Epoll(_) => panic!("this test needs the io_uring driver"),
        });
    }

    /// Operations the kernel holds whose futures are gone.
    fn cancelled_ops() -> usize {
        current::with_driver(|d| match d {
            AnyDriver::Uring(d) => d
                .state
                .borrow()
                .ops
                .iter()
                .filter(|(_, s)| s.held_by_kernel() && !s.is_waiting())
                .count(),
            AnyDriver::Epoll(_) => 0,
        })
    }

    /// Submissions that fail (a full ring, `EBUSY`) delay entries but never
    /// lose them: the listener keeps accepting and cancels still land.
    #[test]
    fn failed_submissions_delay_but_never_lose_entries() {
        if crate::runtime::uring_available().is_err() {
            eprintln!("skipped: io_uring is not available");
            return;
        }
        let rt = Runtime::builder()
            .workers(1)
            .driver(DriverKind::Uring)
            .uring_entries(8)
            .build()
            .unwrap();
        rt.block_on(async {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            fail_submits(20);
            let mut clients: Vec<std::net::TcpStream> = Vec::new();
            let mut streams = Vec::new();
            for _ in 0..20 {
                clients.push(std::net::TcpStream::connect(addr).unwrap());
                let s = timeout(Duration::from_secs(2), l.accept_stream())
                    .await
                    .expect("accepting stopped after failed submissions")
                    .expect("a failed submission reached the listener as an error");
                streams.push(s);
            }
            // Reads with nothing to read, each cancelled by its timeout while
            // submissions keep failing.
            fail_submits(50);
            for s in &streams {
                assert!(timeout(Duration::from_millis(1), s.read_owned(Vec::with_capacity(16)))
                    .await
                    .is_err());
            }
            for _ in 0..200 {
                if cancelled_ops() == 0 {
                    break;
                }
                sleep(Duration::from_millis(2)).await;
            }
            assert_eq!(cancelled_ops(), 0, "a cancel was lost: a read still holds its socket");
            // Everything still works.
            clients[0].write_all(b"hi").unwrap();
            let (res, buf) = streams[0].read_owned(Vec::with_capacity(16)).await;
            assert_eq!((res.unwrap(), &buf[..]), (2, &b"hi"[..]));
        });
        assert!(rt.stats().total.sq_full + rt.stats().total.uring_enters > 0);
    }
}
