//! The io_uring floor server: the least work io_uring needs to answer echo
//! or HTTP over TCP, with no runtime at all.
//!
//! It keeps the contract of its epoll twin, [`super::floor`]: one worker
//! thread per `--workers`, each with its own `SO_REUSEPORT` listener, its own
//! ring and a slab of connections; HTTP parsed with
//! [`proto::parse_request`], one response per complete request, keep-alive,
//! pipelining and `Connection: close` honoured, the `200` built once; echo
//! writes back every byte read. Its figures are the floor hotloop's io_uring
//! driver is measured against, as the epoll floor is for the epoll driver.
//!
//! # Implementation notes
//! - The ring is set up with `IORING_SETUP_SINGLE_ISSUER |
//!   IORING_SETUP_DEFER_TASKRUN` (Linux 6.1), so completions are produced
//!   only when the worker enters the kernel; if that is refused, with
//!   `IORING_SETUP_COOP_TASKRUN` (5.19). Linux 5.19 is the least this server
//!   runs on (multishot accept, cancel-any). The ring is built, and the
//!   buffer ring registered, on the worker thread: a single-issuer ring
//!   belongs to the thread that created it.
//! - Each loop turn is one `io_uring_enter` (`submit_and_wait(1)`): it
//!   submits what the previous turn queued and waits for a completion; then
//!   every completion is handled. Entries that do not fit a full submission
//!   queue wait in a backlog, in order, for the next turn.
//! - With `--busy-poll` the turn's `io_uring_enter` never waits: it submits
//!   with `IORING_ENTER_GETEVENTS` and `min_complete` 0 (liburing's
//!   `io_uring_submit_and_get_events`), which runs the deferred completion
//!   work and returns at once, in a loop, as a hand-written busy-polling
//!   server does (hotloop's `--busy-poll always`). One system call per spin:
//!   with `DEFER_TASKRUN` completions are only produced inside such an
//!   enter. It costs a whole core per worker, idle or not.
//! - One multishot accept per listener. Each connection has one multishot
//!   receive that picks buffers from a provided-buffer ring ([`BUFFERS`] of
//!   [`BUFFER_BYTES`], `IORING_REGISTER_PBUF_RING`). The bytes are handled at
//!   once (parsed, or copied to be echoed) and the buffer given back in the
//!   same turn, so the worker never holds a ring buffer across turns.
//!   Without a buffer ring, or without multishot receive (Linux 5.19 says
//!   `EINVAL`), each connection gets its own [`RECV_BUF_BYTES`] buffer and a
//!   single-shot receive armed again after each completion.
//! - `ENOBUFS` (the ring ran dry within one turn) ends a multishot receive.
//!   The connection is armed again at the end of the turn, when every buffer
//!   is back in the ring, so re-arming cannot spin.
//! - At most one send per connection is in flight: from the response built
//!   at start (HTTP) or from the connection's `out` buffer (echo). Bytes to
//!   send meanwhile wait in `pending`, and become `out` when the send
//!   completes. A short send is submitted again for the rest. Past
//!   [`PENDING_MAX_BYTES`] waiting, the receive is cancelled until `pending`
//!   drains, so a client that does not read cannot grow server memory.
//! - A connection is closed (its descriptor dropped) only once none of its
//!   operations is in flight: until then the kernel may write into its
//!   buffers and holds its socket. `Connection: close`, a bad request, an
//!   error or the peer's end of stream stops reading (cancelling the
//!   receive), lets the replies already queued go out, then closes.
//! - `user_data` is the operation's kind, the connection's slot and a
//!   generation, so a completion never reaches a newer connection in the
//!   same slot.
//! - Accepting pauses for [`ACCEPT_PAUSE_MS`] on `EMFILE`, `ENFILE`,
//!   `ENOBUFS` or `ENOMEM` (a timeout operation), as in the epoll floor.
//! - Stop: SIGINT and SIGTERM are blocked in every thread and taken by the
//!   main thread, which raises a flag and writes each worker's eventfd, on
//!   which a poll is armed. The worker cancels everything in flight
//!   (`IORING_ASYNC_CANCEL_ANY`), handles completions until none is left,
//!   and returns, dropping every descriptor and buffer.
//! - [`FALLBACK_ENV`] and [`BUFFERS_ENV`] let tests take the fallback paths
//!   and run the buffer ring dry on any kernel.
//! - Socket options are the epoll floor's: `SO_REUSEADDR` and
//!   `SO_REUSEPORT` on the listener, none per connection.
//!
//! Invariant: a connection's buffers and descriptor are freed only when
//! `recv_armed` is false and `sending` is `None`, i.e. when no operation of
//! it is in flight; the buffer ring is freed only with the worker, after its
//! last operation has completed (or, after a failure of the ring itself,
//! never).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::alloc::Layout;
use std::collections::VecDeque;
use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{mpsc, Arc};

use io_uring::types::{BufRingEntry, CancelBuilder, Fd, Timespec};
use io_uring::{cqueue, opcode, squeue, IoUring};
use slab::Slab;

use super::floor::{
    invalid, listener, stop_workers, App, ACCEPT_PAUSE_MS, BODY_SIZE_MAX_BYTES, WORKERS_MAX,
};
use crate::proto::{self, Request};

/// Submission queue entries per ring.
pub const SQ_ENTRIES: u32 = 1024;

/// Completion queue entries per ring: room for a turn's completions.
pub const CQ_ENTRIES: u32 = 8 * SQ_ENTRIES;

/// Buffers in each worker's provided-buffer ring (a power of two).
pub const BUFFERS: u16 = 1024;

/// Bytes per provided buffer.
pub const BUFFER_BYTES: usize = 4096;

/// Bytes of a connection's own receive buffer, without a buffer ring.
pub const RECV_BUF_BYTES: usize = 4096;

/// Bytes waiting behind a send in flight past which reading pauses.
pub const PENDING_MAX_BYTES: usize = 64 * 1024;

/// The buffer group the ring is registered under.
const GROUP: u16 = 0;

/// `user_data` kinds, in the top byte.
const KIND_SHIFT: u32 = 56;
const ACCEPT: u64 = 1;
const WAKE: u64 = 2;
const PAUSE: u64 = 3;
const RECV: u64 = 4;
const SEND: u64 = 5;
const CANCEL: u64 = 6;
const STOP: u64 = 7;

/// Generations wrap within the 24 bits between the kind and the slot.
const GEN_MASK: u32 = 0x00ff_ffff;

/// `IORING_ENTER_GETEVENTS` (io_uring_enter(2)): run deferred completion
/// work and reap, here with `min_complete` 0 so the enter never waits.
const IORING_ENTER_GETEVENTS: u32 = 1;

/// Environment variable: `1` makes the server take the paths it falls back
/// to on older kernels (`IORING_SETUP_COOP_TASKRUN`, a single-shot receive
/// into each connection's own buffer), so they can be tested anywhere.
pub const FALLBACK_ENV: &str = "HOTLOOP_FLOOR_URING_FALLBACK";

/// Environment variable: buffers in the provided-buffer ring instead of
/// [`BUFFERS`] (a power of two), so a test can run the ring dry.
pub const BUFFERS_ENV: &str = "HOTLOOP_FLOOR_URING_BUFFERS";

/// Options of the io_uring floor server.
#[derive(Debug, Clone)]
pub struct FloorUringArgs {
    /// What to serve.
    pub app: App,
    /// Address to listen on; port 0 picks a free port, printed at start.
    pub addr: SocketAddr,
    /// Worker threads, each with its own listener and ring.
    pub workers: usize,
    /// HTTP response body size in bytes.
    pub body_size: usize,
    /// Microseconds of CPU work per HTTP request.
    pub work_us: u64,
    /// Never wait in `io_uring_enter`: submit and reap in a loop.
    pub busy_poll: bool,
}

/// Serves until SIGINT or SIGTERM, then ends every operation, closes
/// everything and returns.
///
/// Prints `floor-uring APP listening on ADDR (N workers; SETUP)` on standard
/// output once every worker's ring is ready, so a caller that asked for
/// port 0 learns the port.
pub fn run(args: &FloorUringArgs) -> io::Result<()> {
    if args.workers == 0 || args.workers > WORKERS_MAX {
        return Err(invalid(format!("--workers {}: give 1 to {WORKERS_MAX}", args.workers)));
    }
    if args.body_size > BODY_SIZE_MAX_BYTES {
        return Err(invalid(format!(
            "--body-size {}: at most {BODY_SIZE_MAX_BYTES} bytes",
            args.body_size
        )));
    }
    let fallback = std::env::var_os(FALLBACK_ENV).is_some_and(|v| v == "1");
    let buffers = match std::env::var(BUFFERS_ENV) {
        Err(_) => BUFFERS,
        Ok(v) => match v.parse::<u16>() {
            Ok(n) if n.is_power_of_two() && n <= 1 << 15 => n,
            _ => {
                return Err(invalid(format!("{BUFFERS_ENV}={v}: give a power of two up to 32768")))
            }
        },
    };
    crate::load::sys::raise_nofile_limit()?;

    // Bind every listener before serving, so a port in use is reported at
    // once; the first one fixes the port when port 0 was asked for.
    let first = listener(args.addr, false)?;
    let addr = first
        .local_addr()?
        .as_socket()
        .ok_or_else(|| invalid("listener has no inet address".into()))?;
    let mut listeners = vec![first];
    for _ in 1..args.workers {
        listeners.push(listener(addr, false)?);
    }

    // Blocked before any worker starts, so every thread inherits the mask.
    let signals = hotloop::signal::ShutdownSignals::block()?;
    // Built once and shared: sends read them until the process ends.
    let config = Config {
        app: args.app,
        work_us: args.work_us,
        busy_poll: args.busy_poll,
        keepalive: Box::leak(proto::response_ok(args.body_size, false).into_boxed_slice()),
        close: Box::leak(proto::response_ok(args.body_size, true).into_boxed_slice()),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel::<io::Result<String>>();
    let mut wakers = Vec::new();
    let mut handles = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        let wake = eventfd()?;
        wakers.push(wake.try_clone()?);
        let listener: OwnedFd = l.into();
        let (stop, ready) = (Arc::clone(&stop), ready_tx.clone());
        let handle =
            std::thread::Builder::new().name(format!("floor-uring-{i}")).spawn(move || {
                let worker = match Worker::new(config, listener, wake, fallback, buffers) {
                    Ok(w) => w,
                    Err(e) => {
                        let _ =
                            ready.send(Err(io::Error::new(e.kind(), format!("worker {i}: {e}"))));
                        return Ok(());
                    }
                };
                let _ = ready.send(Ok(worker.describe()));
                drop(ready);
                let result = worker.run(&stop);
                if let Err(e) = &result {
                    eprintln!("hotloop floor-uring: worker {i}: {e}");
                    // Wake the main thread so the whole server stops.
                    // SAFETY: kill(2) with our own pid and a valid signal
                    // number has no memory-safety preconditions.
                    unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
                }
                result
            })?;
        handles.push(handle);
    }
    drop(ready_tx);

    let mut first_err = None;
    let mut setup = String::new();
    for _ in 0..args.workers {
        match ready_rx.recv() {
            Ok(Ok(s)) => setup = s,
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(io::Error::other("a floor-uring worker ended at start"));
                break;
            }
        }
    }
    if first_err.is_none() {
        let plural = if args.workers == 1 { "" } else { "s" };
        println!(
            "floor-uring {} listening on {addr} ({} worker{plural}; {setup})",
            args.app.as_str(),
            args.workers
        );
        io::stdout().flush()?;
        loop {
            if signals.wait()?.is_stop() {
                break;
            }
        }
    }

    stop_workers("floor-uring", &stop, &wakers, handles, first_err)
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd(2) has no pointer arguments.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: eventfd(2) succeeded, so `fd` is a new descriptor nothing
    // else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What every worker serves, read-only.
#[derive(Debug, Clone, Copy)]
struct Config {
    app: App,
    work_us: u64,
    /// `--busy-poll`: the ring is entered without waiting.
    busy_poll: bool,
    /// The `200` that keeps the connection open.
    keepalive: &'static [u8],
    /// The `200` that closes it.
    close: &'static [u8],
}

fn token(kind: u64, slot: usize, gen: u32) -> u64 {
    (kind << KIND_SHIFT) | (u64::from(gen & GEN_MASK) << 32) | slot as u64
}

/// Builds the ring, with deferred task running when the kernel allows it
/// (and `fallback` does not ask for the older setup).
fn build_ring(fallback: bool) -> io::Result<(IoUring, &'static str)> {
    if !fallback {
        let mut builder = IoUring::builder();
        builder.setup_cqsize(CQ_ENTRIES).setup_single_issuer().setup_defer_taskrun();
        match builder.build(SQ_ENTRIES) {
            Ok(ring) => return Ok((ring, "defer-taskrun")),
            // Older than 6.1: the flags are refused.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("io_uring_setup: {e}"))),
        }
    }
    let mut builder = IoUring::builder();
    builder.setup_cqsize(CQ_ENTRIES).setup_coop_taskrun();
    match builder.build(SQ_ENTRIES) {
        Ok(ring) => Ok((ring, "coop-taskrun")),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("io_uring_setup: {e} (the io_uring floor needs Linux 5.19 or later)"),
        )),
    }
}

/// The ring of provided receive buffers, shared with the kernel.
///
/// Entries live in page-aligned memory; the buffers are one heap block cut
/// into [`BUFFER_BYTES`] pieces named by their index (the buffer id). The
/// kernel takes entries from the head; a buffer goes back by writing an
/// entry at the tail, published with a release store.
struct BufRing {
    entries: NonNull<BufRingEntry>,
    layout: Layout,
    buffers: Box<[u8]>,
    /// Buffers (and entries), a power of two.
    count: u16,
    /// The tail as the worker knows it; the kernel reads the published one.
    tail: u16,
}

impl BufRing {
    /// Allocates the ring and its buffers, registers them with `ring` and
    /// hands every buffer to the kernel.
    fn new(ring: &IoUring, count: u16) -> io::Result<BufRing> {
        if !count.is_power_of_two() || count > 1 << 15 {
            return Err(invalid(format!("{count} buffers: give a power of two up to 32768")));
        }
        let layout = Layout::from_size_align(usize::from(count) * size_of::<BufRingEntry>(), 4096)
            .map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(entries) = NonNull::new(ptr.cast::<BufRingEntry>()) else {
            return Err(io::ErrorKind::OutOfMemory.into());
        };
        let mut buf_ring = BufRing {
            entries,
            layout,
            buffers: vec![0u8; usize::from(count) * BUFFER_BYTES].into_boxed_slice(),
            count,
            tail: 0,
        };
        // SAFETY: `entries` points at `count` zeroed, page-aligned entries
        // that live, with the buffers, as long as this value; the worker
        // unregisters the ring before dropping it, and drops it only when no
        // operation is in flight.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                entries.as_ptr() as u64,
                count,
                GROUP,
                0,
            )?;
        }
        for bid in 0..count {
            buf_ring.give_back(bid);
        }
        buf_ring.publish();
        Ok(buf_ring)
    }

    /// The `len` bytes the kernel wrote into buffer `bid`.
    fn bytes(&self, bid: u16, len: usize) -> &[u8] {
        let start = usize::from(bid) * BUFFER_BYTES;
        &self.buffers[start..start + len.min(BUFFER_BYTES)]
    }

    /// Queues buffer `bid` for the kernel (visible after [`BufRing::publish`]).
    fn give_back(&mut self, bid: u16) {
        if bid >= self.count {
            return;
        }
        let index = usize::from(self.tail & (self.count - 1));
        let addr = self.buffers.as_ptr() as u64 + (usize::from(bid) * BUFFER_BYTES) as u64;
        // SAFETY: `index < count`, so the entry is inside the allocation;
        // the kernel reads no entry between the published tail and this one.
        let entry = unsafe { &mut *self.entries.as_ptr().add(index) };
        entry.set_addr(addr);
        entry.set_len(BUFFER_BYTES as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Publishes the buffers given back since the last call.
    fn publish(&self) {
        // SAFETY: `entries` is the ring's first entry, whose `resv` field is
        // the shared tail; only this function writes it.
        let tail = unsafe { BufRingEntry::tail(self.entries.as_ptr()) } as *const AtomicU16;
        // SAFETY: the tail is a naturally aligned u16 inside the allocation;
        // the kernel reads it with acquire ordering, which this pairs with.
        unsafe { (*tail).store(self.tail, Ordering::Release) };
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the worker unregisters
        // the ring (or leaks it) before it is dropped.
        unsafe { std::alloc::dealloc(self.entries.as_ptr().cast(), self.layout) };
    }
}

/// The submission side of a worker's ring.
struct Sq {
    ring: IoUring,
    /// Entries that did not fit the submission queue, in order.
    backlog: VecDeque<squeue::Entry>,
    /// Operations submitted (or queued) whose last completion has not come.
    inflight: usize,
    /// Set once everything is being cancelled: nothing new is started.
    stopping: bool,
    /// Enter without waiting for a completion (`--busy-poll`).
    busy_poll: bool,
}

impl Sq {
    /// Queues `entry` for the next submission.
    ///
    /// # Safety
    /// Every buffer `entry` names must stay valid, and in place, until the
    /// operation's last completion has been reaped.
    unsafe fn push(&mut self, entry: squeue::Entry) {
        self.inflight += 1;
        if self.backlog.is_empty() {
            // SAFETY: the caller's promise covers the entry's buffers.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return;
            }
            // Full: hand the queue to the kernel now. A failure (the kernel
            // busy with completions) leaves the entries queued; the next
            // turn reaps and submits them.
            let _ = self.ring.submit();
            // SAFETY: as above.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return;
            }
        }
        self.backlog.push_back(entry);
    }

    /// Submits everything queued and waits for at least one completion;
    /// with busy polling, runs the kernel's completion work and returns
    /// without waiting.
    fn enter(&mut self) -> io::Result<()> {
        while let Some(entry) = self.backlog.front() {
            // SAFETY: queued by `push`, whose caller promised the buffers
            // outlive the operation.
            if unsafe { self.ring.submission().push(entry) }.is_err() {
                break;
            }
            self.backlog.pop_front();
        }
        let entered = if self.busy_poll {
            let queued = self.ring.submission().len() as u32;
            // SAFETY: no argument pointer is passed (`None`); the queued
            // entries were pushed by `push`, whose callers keep their buffers
            // valid until the last completion. GETEVENTS with min_complete 0
            // runs deferred completion work and never waits.
            unsafe {
                self.ring.submitter().enter::<libc::sigset_t>(
                    queued,
                    0,
                    IORING_ENTER_GETEVENTS,
                    None,
                )
            }
        } else {
            self.ring.submit_and_wait(1)
        };
        match entered {
            Ok(_) => Ok(()),
            // A signal, or completions to reap before more is taken.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EBUSY | libc::EAGAIN | libc::ETIME)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(io::Error::new(e.kind(), format!("io_uring_enter: {e}"))),
        }
    }
}

/// What a send in flight reads from.
#[derive(Debug, Clone, Copy)]
enum Outgoing {
    /// A response built at start.
    Reply(&'static [u8]),
    /// The connection's `out` buffer.
    Out,
}

/// One accepted connection.
struct Conn {
    fd: OwnedFd,
    gen: u32,
    /// A receive is in flight (until its last completion).
    recv_armed: bool,
    /// No more reading: the peer ended or failed, or asked to close.
    read_done: bool,
    /// Reading waits for `pending` to drain.
    paused: bool,
    /// A send failed: nothing more goes out.
    broken: bool,
    /// The send in flight, and how much of it went out before.
    sending: Option<Outgoing>,
    sent: usize,
    /// Echo bytes (or queued replies) a send in flight reads.
    out: Vec<u8>,
    /// Bytes to send once the send in flight completes.
    pending: Vec<u8>,
    /// The start of an HTTP request head not yet complete.
    inbuf: Vec<u8>,
    /// The receive buffer without a buffer ring (empty with one).
    rbuf: Box<[u8]>,
}

impl Conn {
    fn new(fd: OwnedFd, gen: u32) -> Conn {
        Conn {
            fd,
            gen,
            recv_armed: false,
            read_done: false,
            paused: false,
            broken: false,
            sending: None,
            sent: 0,
            out: Vec::new(),
            pending: Vec::new(),
            inbuf: Vec::new(),
            rbuf: Box::default(),
        }
    }

    /// Arms a receive unless one is armed or reading is over or paused.
    fn arm_recv(&mut self, sq: &mut Sq, slot: usize, multishot: bool) {
        if sq.stopping || self.recv_armed || self.read_done || self.paused {
            return;
        }
        let fd = Fd(self.fd.as_raw_fd());
        let entry = if multishot {
            opcode::RecvMulti::new(fd, GROUP).build()
        } else {
            if self.rbuf.is_empty() {
                self.rbuf = vec![0u8; RECV_BUF_BYTES].into_boxed_slice();
            }
            opcode::Recv::new(fd, self.rbuf.as_mut_ptr(), self.rbuf.len() as u32).build()
        };
        self.recv_armed = true;
        // SAFETY: a multishot receive writes only into the buffer ring,
        // which outlives every operation; a single-shot one writes into
        // `rbuf`, a heap block neither resized nor freed while `recv_armed`
        // (the connection is removed only when it is false).
        unsafe { sq.push(entry.user_data(token(RECV, slot, self.gen))) };
    }

    /// Cancels the receive in flight, if any; its last completion follows.
    fn cancel_recv(&mut self, sq: &mut Sq, slot: usize) {
        if self.recv_armed {
            let entry = opcode::AsyncCancel::new(token(RECV, slot, self.gen)).build();
            // SAFETY: a cancel names no buffer.
            unsafe { sq.push(entry.user_data(token(CANCEL, slot, self.gen))) };
        }
    }

    /// Reads no more; the connection closes once its replies are out.
    fn stop_reading(&mut self, sq: &mut Sq, slot: usize) {
        if !self.read_done {
            self.read_done = true;
            self.cancel_recv(sq, slot);
        }
    }

    /// Sends `reply` now, or after what is already going out.
    fn queue_reply(&mut self, sq: &mut Sq, slot: usize, reply: &'static [u8]) {
        if self.broken {
            return;
        }
        if self.sending.is_none() {
            self.send(sq, slot, Outgoing::Reply(reply));
        } else {
            self.pending.extend_from_slice(reply);
            self.check_pending(sq, slot);
        }
    }

    /// Sends a copy of `bytes` now, or after what is already going out.
    fn queue_bytes(&mut self, sq: &mut Sq, slot: usize, bytes: &[u8]) {
        if self.broken {
            return;
        }
        if self.sending.is_none() {
            self.out.clear();
            self.out.extend_from_slice(bytes);
            self.send(sq, slot, Outgoing::Out);
        } else {
            self.pending.extend_from_slice(bytes);
            self.check_pending(sq, slot);
        }
    }

    /// Pauses reading while too much waits to be sent.
    fn check_pending(&mut self, sq: &mut Sq, slot: usize) {
        if self.pending.len() >= PENDING_MAX_BYTES && !self.paused {
            self.paused = true;
            self.cancel_recv(sq, slot);
        }
    }

    fn send(&mut self, sq: &mut Sq, slot: usize, what: Outgoing) {
        if sq.stopping {
            return;
        }
        self.sending = Some(what);
        self.sent = 0;
        self.submit_send(sq, slot);
    }

    /// Submits the rest of the send in flight.
    fn submit_send(&mut self, sq: &mut Sq, slot: usize) {
        let bytes: &[u8] = match self.sending {
            Some(Outgoing::Reply(b)) => b,
            Some(Outgoing::Out) => &self.out,
            None => return,
        };
        let rest = &bytes[self.sent.min(bytes.len())..];
        let len = rest.len().min(u32::MAX as usize) as u32;
        let entry = opcode::Send::new(Fd(self.fd.as_raw_fd()), rest.as_ptr(), len)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(token(SEND, slot, self.gen));
        // SAFETY: replies live for the whole process; `out` is a heap block
        // left untouched while `sending` is Some (new bytes go to `pending`),
        // and the connection is removed only when `sending` is None.
        unsafe { sq.push(entry) };
    }

    /// No operation in flight, and nothing more to do.
    fn is_finished(&self, stopping: bool) -> bool {
        (self.read_done || stopping) && !self.recv_armed && self.sending.is_none()
    }
}

/// Answers every complete request among the bytes received so far.
fn on_http(config: &Config, sq: &mut Sq, c: &mut Conn, slot: usize, fresh: &[u8]) {
    let mut inbuf = std::mem::take(&mut c.inbuf);
    let buffered = !inbuf.is_empty();
    if buffered {
        inbuf.extend_from_slice(fresh);
    }
    let data: &[u8] = if buffered { &inbuf } else { fresh };
    let mut consumed = 0;
    let mut close = false;
    while consumed < data.len() {
        let (reply, len, last) = match proto::parse_request(&data[consumed..]) {
            Request::Complete { len, close, .. } => {
                proto::spin_work(config.work_us);
                (if close { config.close } else { config.keepalive }, len, close)
            }
            Request::Partial => break,
            Request::Malformed => (proto::response_error(400), 0, true),
            Request::TooLarge => (proto::response_error(431), 0, true),
            Request::Unsupported(status) => (proto::response_error(status), 0, true),
        };
        consumed += len;
        c.queue_reply(sq, slot, reply);
        if last {
            close = true;
            break;
        }
    }
    // Keep an incomplete request head for the next receive.
    if close {
        inbuf.clear();
        c.stop_reading(sq, slot);
    } else if buffered {
        inbuf.drain(..consumed);
    } else {
        inbuf.extend_from_slice(&fresh[consumed..]);
    }
    c.inbuf = inbuf;
}

struct Worker {
    /// First, so it is dropped before the memory its operations used.
    sq: Sq,
    listener: OwnedFd,
    wake: OwnedFd,
    config: Config,
    setup: &'static str,
    bufs: Option<BufRing>,
    /// Multishot receive works here (Linux 6.0); cleared on `EINVAL`.
    multishot_recv: bool,
    conns: Slab<Conn>,
    next_gen: u32,
    /// Connections whose receive ended with `ENOBUFS`, armed again at the
    /// end of the turn.
    starved: Vec<(usize, u32)>,
    /// The accept pause; the kernel reads it when the timeout is submitted.
    pause: Box<Timespec>,
    accept_armed: bool,
    accept_paused: bool,
    accept_pauses: u64,
    enobufs: u64,
    cqes: Vec<(u64, i32, u32)>,
}

impl Worker {
    fn new(
        config: Config,
        listener: OwnedFd,
        wake: OwnedFd,
        fallback: bool,
        buffers: u16,
    ) -> io::Result<Worker> {
        let (ring, setup) = build_ring(fallback)?;
        // Without a buffer ring each connection reads into its own buffer.
        let bufs = if fallback { None } else { BufRing::new(&ring, buffers).ok() };
        Ok(Worker {
            sq: Sq {
                ring,
                backlog: VecDeque::new(),
                inflight: 0,
                stopping: false,
                busy_poll: config.busy_poll,
            },
            listener,
            wake,
            config,
            setup,
            multishot_recv: bufs.is_some(),
            bufs,
            conns: Slab::new(),
            next_gen: 0,
            starved: Vec::new(),
            pause: Box::new(Timespec::new().nsec(ACCEPT_PAUSE_MS as u32 * 1_000_000)),
            accept_armed: false,
            accept_paused: false,
            accept_pauses: 0,
            enobufs: 0,
            cqes: Vec::new(),
        })
    }

    /// The ring's setup, for the start-up line.
    fn describe(&self) -> String {
        let recv = if self.multishot_recv {
            let n = self.bufs.as_ref().map_or(0, |b| b.count);
            format!("multishot receive on {n} provided buffers of {BUFFER_BYTES} bytes")
        } else {
            format!("single-shot receive into {RECV_BUF_BYTES}-byte buffers per connection")
        };
        let busy = if self.sq.busy_poll { ", busy polling" } else { "" };
        format!("{}, {recv}{busy}", self.setup)
    }

    fn run(mut self, stop: &AtomicBool) -> io::Result<()> {
        self.arm_wake();
        self.arm_accept();
        let mut failure = None;
        loop {
            if let Err(e) = self.sq.enter() {
                failure = Some(e);
                break;
            }
            let mut cqes = std::mem::take(&mut self.cqes);
            cqes.extend(self.sq.ring.completion().map(|c| (c.user_data(), c.result(), c.flags())));
            for &(user_data, res, flags) in &cqes {
                if !cqueue::more(flags) {
                    self.sq.inflight = self.sq.inflight.saturating_sub(1);
                }
                if let Err(e) = self.on_completion(user_data, res, flags, stop) {
                    if failure.is_none() {
                        failure = Some(e);
                        // End every operation before the buffers go.
                        self.begin_stop();
                    }
                }
            }
            cqes.clear();
            self.cqes = cqes;
            if self.sq.stopping && self.sq.inflight == 0 {
                break;
            }
            self.end_turn();
        }
        if self.sq.inflight > 0 {
            // The ring failed with operations in flight: the kernel may still
            // write into their buffers, so they are left to the process's end.
            std::mem::forget(std::mem::take(&mut self.conns));
            std::mem::forget(self.bufs.take());
        }
        if self.enobufs > 0 || self.accept_pauses > 0 {
            eprintln!(
                "hotloop floor-uring: {} receives armed again after ENOBUFS, {} accept pauses",
                self.enobufs, self.accept_pauses
            );
        }
        failure.map_or(Ok(()), Err)
    }

    /// Gives the turn's buffers back, then arms the receives that found the
    /// ring empty: every buffer is back now, so they do not fail again at
    /// once.
    fn end_turn(&mut self) {
        if let Some(bufs) = &self.bufs {
            bufs.publish();
        }
        let multishot = self.multishot();
        for (slot, gen) in std::mem::take(&mut self.starved) {
            if let Some(c) = self.conns.get_mut(slot).filter(|c| c.gen == gen) {
                c.arm_recv(&mut self.sq, slot, multishot);
            }
        }
    }

    fn multishot(&self) -> bool {
        self.bufs.is_some() && self.multishot_recv
    }

    fn on_completion(
        &mut self,
        user_data: u64,
        res: i32,
        flags: u32,
        stop: &AtomicBool,
    ) -> io::Result<()> {
        let slot = (user_data & 0xffff_ffff) as usize;
        let gen = (user_data >> 32) as u32 & GEN_MASK;
        match user_data >> KIND_SHIFT {
            ACCEPT => return self.on_accept(res, flags),
            WAKE => {
                if stop.load(Ordering::Acquire) {
                    self.begin_stop();
                } else {
                    self.drain_wake();
                    self.arm_wake();
                }
            }
            PAUSE => {
                self.accept_paused = false;
                self.arm_accept();
            }
            RECV => self.on_recv(slot, gen, res, flags),
            SEND => self.on_send(slot, gen, res),
            STOP if res < 0 && res != -libc::ENOENT => self.shut_everything(),
            // Cancels: their targets' own completions say what happened.
            _ => {}
        }
        Ok(())
    }

    fn arm_wake(&mut self) {
        let entry = opcode::PollAdd::new(Fd(self.wake.as_raw_fd()), libc::POLLIN as u32).build();
        // SAFETY: a poll names no buffer.
        unsafe { self.sq.push(entry.user_data(WAKE << KIND_SHIFT)) };
    }

    /// Empties the eventfd, so a poll armed again waits for a new write.
    fn drain_wake(&self) {
        let mut count: u64 = 0;
        // SAFETY: `count` is 8 writable bytes; the eventfd is non-blocking
        // and owned by this worker.
        unsafe { libc::read(self.wake.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    }

    fn arm_accept(&mut self) {
        if self.sq.stopping || self.accept_armed || self.accept_paused {
            return;
        }
        let entry = opcode::AcceptMulti::new(Fd(self.listener.as_raw_fd()))
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(ACCEPT << KIND_SHIFT);
        self.accept_armed = true;
        // SAFETY: the accept reports no peer address, so it names no buffer.
        unsafe { self.sq.push(entry) };
    }

    fn on_accept(&mut self, res: i32, flags: u32) -> io::Result<()> {
        if !cqueue::more(flags) {
            self.accept_armed = false;
        }
        if res >= 0 {
            // SAFETY: a successful accept completion carries a new
            // descriptor that nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(res) };
            if !self.sq.stopping {
                self.open(fd);
            }
        } else if !self.sq.stopping {
            match -res {
                // The connection died in the queue; go on. (ECANCELED: the
                // multishot cancelled by a pause.)
                libc::ECONNABORTED
                | libc::EINTR
                | libc::EPROTO
                | libc::EAGAIN
                | libc::ECANCELED => {}
                libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM => {
                    self.pause_accepting(res, flags)
                }
                e => {
                    let e = io::Error::from_raw_os_error(e);
                    return Err(io::Error::new(e.kind(), format!("accept: {e}")));
                }
            }
        }
        self.arm_accept();
        Ok(())
    }

    /// Stops accepting for a while: the backlog stays full while there is
    /// no descriptor or memory, so accepting again at once would spin.
    fn pause_accepting(&mut self, res: i32, flags: u32) {
        if self.accept_pauses == 0 {
            eprintln!(
                "hotloop floor-uring: accept: {}; pausing accepts for {ACCEPT_PAUSE_MS} ms each time (open connections: {})",
                io::Error::from_raw_os_error(-res),
                self.conns.len()
            );
        }
        self.accept_pauses += 1;
        self.accept_paused = true;
        if cqueue::more(flags) {
            let entry = opcode::AsyncCancel::new(ACCEPT << KIND_SHIFT).build();
            // SAFETY: a cancel names no buffer.
            unsafe { self.sq.push(entry.user_data(CANCEL << KIND_SHIFT)) };
        }
        let timespec: *const Timespec = &*self.pause;
        let entry = opcode::Timeout::new(timespec).build().user_data(PAUSE << KIND_SHIFT);
        // SAFETY: the timespec is boxed in the worker, which outlives every
        // operation; the kernel reads it when the entry is submitted.
        unsafe { self.sq.push(entry) };
    }

    fn open(&mut self, fd: OwnedFd) {
        let gen = self.next_gen;
        self.next_gen = self.next_gen.wrapping_add(1) & GEN_MASK;
        let slot = self.conns.insert(Conn::new(fd, gen));
        let multishot = self.multishot();
        self.conns[slot].arm_recv(&mut self.sq, slot, multishot);
    }

    fn on_recv(&mut self, slot: usize, gen: u32, res: i32, flags: u32) {
        let last = !cqueue::more(flags);
        let bid = cqueue::buffer_select(flags);
        let Worker { sq, conns, bufs, config, starved, enobufs, multishot_recv, .. } = self;
        let multishot = bufs.is_some() && *multishot_recv;
        let Some(c) = conns.get_mut(slot).filter(|c| c.gen == gen) else {
            // Not expected: a connection outlives its operations.
            if let (Some(bid), Some(bufs)) = (bid, bufs.as_mut()) {
                bufs.give_back(bid);
            }
            return;
        };
        if last {
            c.recv_armed = false;
        }
        let mut starving = false;
        if res > 0 {
            let n = res as usize;
            let reading = !c.read_done && !c.broken;
            match (bid, bufs.as_mut()) {
                (Some(bid), Some(bufs)) => {
                    if reading {
                        on_bytes(config, sq, c, slot, bufs.bytes(bid, n));
                    }
                    bufs.give_back(bid);
                }
                _ => {
                    let rbuf = std::mem::take(&mut c.rbuf);
                    if reading && n <= rbuf.len() {
                        on_bytes(config, sq, c, slot, &rbuf[..n]);
                    }
                    c.rbuf = rbuf;
                }
            }
        } else {
            if let (Some(bid), Some(bufs)) = (bid, bufs.as_mut()) {
                bufs.give_back(bid);
            }
            match -res {
                // End of stream: what was sent is answered; close after it.
                0 => c.read_done = true,
                libc::ENOBUFS => {
                    starving = true;
                    starved.push((slot, gen));
                    *enobufs += 1;
                }
                // Paused, closing or stopping.
                libc::ECANCELED | libc::EINTR | libc::EAGAIN => {}
                // Linux 5.19 has the buffer ring but no multishot receive.
                libc::EINVAL if multishot && bid.is_none() => {
                    eprintln!(
                        "hotloop floor-uring: no multishot receive here; single-shot receives from now on"
                    );
                    *multishot_recv = false;
                }
                // A reset or another error: nothing more comes or goes.
                _ => {
                    c.read_done = true;
                    c.broken = true;
                    c.pending.clear();
                }
            }
        }
        let multishot = bufs.is_some() && *multishot_recv;
        if last && !starving {
            c.arm_recv(sq, slot, multishot);
        }
        if c.is_finished(sq.stopping) {
            conns.remove(slot);
        }
    }

    fn on_send(&mut self, slot: usize, gen: u32, res: i32) {
        let multishot = self.multishot();
        let Worker { sq, conns, .. } = self;
        let Some(c) = conns.get_mut(slot).filter(|c| c.gen == gen) else { return };
        let Some(what) = c.sending else { return };
        if res <= 0 {
            // A reset peer (or the stop's cancel): drop what waits.
            c.sending = None;
            c.broken = true;
            c.pending.clear();
            c.stop_reading(sq, slot);
        } else {
            c.sent += res as usize;
            let len = match what {
                Outgoing::Reply(b) => b.len(),
                Outgoing::Out => c.out.len(),
            };
            if c.sent < len && !sq.stopping {
                // A short send: the rest goes next.
                c.submit_send(sq, slot);
                return;
            }
            c.sending = None;
            if !c.pending.is_empty() {
                std::mem::swap(&mut c.out, &mut c.pending);
                c.pending.clear();
                c.send(sq, slot, Outgoing::Out);
            }
            if c.paused && c.pending.is_empty() {
                c.paused = false;
                c.arm_recv(sq, slot, multishot);
            }
        }
        if c.is_finished(sq.stopping) {
            conns.remove(slot);
        }
    }

    /// Cancels every operation in flight; the loop ends when the last one
    /// has completed.
    fn begin_stop(&mut self) {
        if self.sq.stopping {
            return;
        }
        self.sq.stopping = true;
        // Connections with nothing in flight close now.
        self.conns.retain(|_, c| !c.is_finished(true));
        let entry = opcode::AsyncCancel2::new(CancelBuilder::any()).build();
        // SAFETY: a cancel names no buffer.
        unsafe { self.sq.push(entry.user_data(STOP << KIND_SHIFT)) };
    }

    /// Ends every operation by shutting its socket down, if cancelling
    /// everything was refused: receives see end of stream, sends fail and
    /// the accept fails.
    fn shut_everything(&mut self) {
        for (_, c) in &self.conns {
            // SAFETY: shutdown(2) on a descriptor the connection owns.
            unsafe { libc::shutdown(c.fd.as_raw_fd(), libc::SHUT_RDWR) };
        }
        // SAFETY: as above, on the worker's listener.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.bufs.is_some() {
            // Unregistered before its memory is freed (the fields drop after
            // this); a failure leaves it to the ring's own teardown, which
            // comes first.
            let _ = self.sq.ring.submitter().unregister_buf_ring(GROUP);
        }
    }
}

fn on_bytes(config: &Config, sq: &mut Sq, c: &mut Conn, slot: usize, bytes: &[u8]) {
    match config.app {
        App::Echo => c.queue_bytes(sq, slot, bytes),
        App::Http => on_http(config, sq, c, slot, bytes),
    }
}
