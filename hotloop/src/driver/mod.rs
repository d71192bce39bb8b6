//! The I/O driver boundary.
//!
//! # The contract
//! Every backend module provides the same two types:
//! - `Driver`, one per worker, behind an `Rc` that every socket of the
//!   worker holds: `new(config, unpark, stats)` sets it up; `poll(park)`
//!   waits as the [`Park`] says (not at all, or until something happens
//!   or an absolute deadline passes), then wakes every task whose I/O
//!   became ready or completed, and returns how many events or
//!   completions it handled; `enter()` marks it as running on this thread
//!   until the guard drops.
//! - `Source`, a socket bound to one `Driver`, with the socket operations:
//!   owned-buffer `recv`/`send`/`send_vectored`, `connect`, `shutdown`,
//!   `poll_accept`/`accept_now`, a readiness wait (`poll_readable`) with a
//!   non-blocking `try_recv` beside it, waits for the next readiness that
//!   never answer from remembered state (`poll_next_readable`,
//!   `next_writable`: for pidfds and Unix datagram sockets), the borrowed-slice poll forms
//!   behind tokio's and futures' I/O traits, and `send_file` (a file's
//!   bytes to the socket without a copy through user space); for datagram sockets, owned
//!   `recv_msg`/`send_msg`, batched borrowed `poll_recv_batch`/
//!   `poll_send_batch`, `try_send_one` and `writable` (each backend's
//!   `udp.rs`; control messages are encoded in [`udp`] only).
//!
//! Two backends exist on Linux and both always compile: [`epoll`]
//! (readiness) and [`uring`] (completion). [`Driver`] and [`Source`] here
//! are enums over them, chosen once at start-up; every operation matches
//! once and calls its backend. File operations exist only on io_uring
//! (`uring/file.rs`): [`Driver::ring_for`] says whether the ring runs one,
//! and the file layer (`fs/`) uses the blocking pool otherwise. The network layer (`net/`) sees only this
//! module.
//!
//! # Architecture invariants
//! - `driver/` imports nothing from `runtime/` or `net/`: the runtime
//!   enters the driver, never the reverse. Its inputs are a
//!   [`DriverConfig`], an [`Unpark`] and the worker's counters.
//! - A source holds its driver (an `Rc`), so an operation never looks up
//!   "the current runtime": it cannot reach another runtime's state, and
//!   nothing in here is `Send`.
//! - An operation owns everything the kernel may touch, the socket
//!   included, until its last completion (io_uring; see `uring/op.rs`).
//! - Waiting on a driver that is not entered on this thread (its runtime
//!   is not running here) is an error, not a hang.

mod config;
pub(crate) mod epoll;
pub(crate) mod probe;
pub(crate) mod udp;
pub(crate) mod uring;
mod wake;

pub use config::{AcceptMode, DriverKind, KernelBusyPoll, Registration};
pub(crate) use config::{DriverConfig, UringSwitches};
pub(crate) use wake::Unpark;

use std::io;
use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::stats::{DriverInfo, WorkerStats};
use crate::sys;
use udp::{RecvMeta, SendMeta, Transmit};

/// How long one poll of a driver may block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Park {
    /// Do not block: take what is ready.
    Skip,
    /// Block until something happens or, if given, until this time on
    /// `CLOCK_MONOTONIC` in nanoseconds (`sys::monotonic_ns`'s clock).
    ///
    /// A deadline rather than a timeout: a driver that keeps a timer of
    /// its own armed (epoll's timerfd) re-arms it only when the deadline
    /// moves earlier, instead of setting up a kernel timer for every
    /// wait.
    Until(Option<u64>),
}

/// The driver one worker uses.
#[derive(Clone)]
pub(crate) enum Driver {
    /// Readiness-based, edge-triggered epoll.
    Epoll(Rc<epoll::Driver>),
    /// Completion-based io_uring.
    Uring(Rc<uring::Driver>),
}

impl Driver {
    /// Creates the driver `config` asks for; `Auto` probes the kernel and
    /// falls back to epoll. The returned info says which and why.
    pub(crate) fn new(
        config: &DriverConfig,
        unpark: Arc<Unpark>,
        stats: Arc<WorkerStats>,
    ) -> io::Result<(Driver, DriverInfo)> {
        let (requested, by) = match std::env::var("HOTLOOP_DRIVER").ok().as_deref() {
            Some(s) if !s.is_empty() => (
                s.parse().map_err(|e: String| io::Error::new(io::ErrorKind::InvalidInput, e))?,
                " (HOTLOOP_DRIVER)",
            ),
            _ => (config.kind, ""),
        };
        let mut fallback = false;
        let (use_uring, mut reason) = match requested {
            DriverKind::Epoll => (false, format!("epoll was requested{by}")),
            DriverKind::Uring => (true, format!("io_uring was requested{by}")),
            DriverKind::Auto => match probe::uring_support() {
                Ok(()) => (
                    true,
                    "auto: the kernel supports every io_uring feature hotloop uses".to_string(),
                ),
                Err(why) => {
                    fallback = true;
                    (false, format!("auto: {why}; using epoll"))
                }
            },
        };
        if use_uring {
            match uring::Driver::new(config, unpark.clone(), stats.clone()) {
                Ok((driver, kernel_busy_poll)) => {
                    let info = DriverInfo {
                        driver: "uring",
                        reason,
                        busy_poll: String::new(),
                        kernel_busy_poll,
                        fallback: false,
                    };
                    return Ok((Driver::Uring(driver), info));
                }
                // The probe's small ring worked but this one did not: auto still falls back.
                Err(e) if requested == DriverKind::Auto => {
                    fallback = true;
                    reason = format!("auto: io_uring setup failed ({e}); using epoll");
                }
                Err(e) => return Err(e),
            }
        }
        let (driver, kernel_busy_poll) = epoll::Driver::new(config, unpark, stats)?;
        let info = DriverInfo {
            driver: "epoll",
            reason,
            busy_poll: String::new(),
            kernel_busy_poll,
            fallback,
        };
        Ok((Driver::Epoll(driver), info))
    }

    /// Waits for I/O as `park` says and wakes the tasks it concerns.
    pub(crate) fn poll(&self, park: Park) -> io::Result<usize> {
        match self {
            Driver::Epoll(d) => d.poll(park),
            Driver::Uring(d) => d.poll(park),
        }
    }

    /// Marks the driver as running on this thread until the guard drops:
    /// only then may its sources wait.
    pub(crate) fn enter(&self) -> EnterGuard {
        let entered = match self {
            Driver::Epoll(d) => d.entered(),
            Driver::Uring(d) => d.entered(),
        };
        entered.set(true);
        EnterGuard { driver: self.clone() }
    }
}

/// A file operation the io_uring driver runs as a ring operation where
/// the kernel has its opcode (`uring/file.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileOp {
    /// `OPENAT`.
    Open,
    /// `OPENAT2`.
    OpenBeneath,
    /// `READ`.
    Read,
    /// `WRITE`.
    Write,
    /// `STATX`.
    Statx,
    /// `FSYNC`.
    Fsync,
    /// `FTRUNCATE` (Linux 6.9).
    Ftruncate,
    /// `RENAMEAT`.
    Rename,
    /// `UNLINKAT`.
    Unlink,
    /// `MKDIRAT`.
    Mkdir,
}

impl FileOp {
    fn code(self) -> u8 {
        use io_uring::opcode;
        match self {
            FileOp::Open => opcode::OpenAt::CODE,
            FileOp::OpenBeneath => opcode::OpenAt2::CODE,
            FileOp::Read => opcode::Read::CODE,
            FileOp::Write => opcode::Write::CODE,
            FileOp::Statx => opcode::Statx::CODE,
            FileOp::Fsync => opcode::Fsync::CODE,
            FileOp::Ftruncate => opcode::Ftruncate::CODE,
            FileOp::Rename => opcode::RenameAt::CODE,
            FileOp::Unlink => opcode::UnlinkAt::CODE,
            FileOp::Mkdir => opcode::MkDirAt::CODE,
        }
    }
}

impl Driver {
    /// The io_uring driver if this is one and its kernel has `op`;
    /// `None` means the caller runs the operation another way (the
    /// blocking pool for files, `sendfile` for sockets).
    pub(crate) fn ring_for(&self, op: FileOp) -> Option<&Rc<uring::Driver>> {
        match self {
            Driver::Uring(d) if d.switches.files_on_ring && probe::opcode_supported(op.code()) => {
                Some(d)
            }
            Driver::Uring(_) | Driver::Epoll(_) => None,
        }
    }
}

/// Keeps a driver entered; see [`Driver::enter`].
pub(crate) struct EnterGuard {
    driver: Driver,
}

impl Drop for EnterGuard {
    fn drop(&mut self) {
        match &self.driver {
            Driver::Epoll(d) => d.entered().set(false),
            Driver::Uring(d) => d.entered().set(false),
        }
    }
}

/// The error of an operation that would wait on a driver whose runtime is
/// not running on this thread.
pub(crate) fn not_running() -> io::Error {
    io::Error::other(
        "this socket belongs to a hotloop runtime that is not running on this thread: \
         use it inside the `block_on` or the worker that created it",
    )
}

/// Which way an operation waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Waiting to read or accept.
    Read,
    /// Waiting to write or for a connect to finish.
    Write,
}

/// A socket owned by one worker's driver, closed when the last of its
/// holders (the source, or an operation the kernel still has) lets go.
pub(crate) enum Source {
    /// A socket on the epoll driver.
    Epoll(epoll::Source),
    /// A socket on the io_uring driver.
    Uring(uring::Source),
}

/// Calls `$body` with `$s` bound to the backend's source.
macro_rules! each {
    ($src:expr, $s:ident => $body:expr) => {
        match $src {
            Source::Epoll($s) => $body,
            Source::Uring($s) => $body,
        }
    };
}

impl Source {
    /// Wraps a connected or connecting socket.
    pub(crate) fn new(driver: &Driver, fd: OwnedFd) -> io::Result<Source> {
        Ok(match driver {
            Driver::Epoll(d) => Source::Epoll(epoll::Source::new(d, fd)?),
            Driver::Uring(d) => Source::Uring(uring::Source::new(d, fd)?),
        })
    }

    /// Wraps a listening socket.
    pub(crate) fn new_listener(driver: &Driver, fd: OwnedFd) -> io::Result<Source> {
        Ok(match driver {
            Driver::Epoll(d) => Source::Epoll(epoll::Source::new_listener(d, fd)?),
            Driver::Uring(d) => Source::Uring(uring::Source::new_listener(d, fd)?),
        })
    }

    /// Wraps a datagram socket: non-blocking on epoll, blocking on io_uring
    /// (so a receive operation waits in the kernel instead of failing with
    /// `EAGAIN`; the direct calls pass `MSG_DONTWAIT`).
    pub(crate) fn new_datagram(driver: &Driver, fd: OwnedFd) -> io::Result<Source> {
        use std::os::fd::AsRawFd;
        sys::set_nonblocking(fd.as_raw_fd(), matches!(driver, Driver::Epoll(_)))?;
        Source::new(driver, fd)
    }

    /// The raw descriptor (for syscalls that never wait).
    pub(crate) fn fd(&self) -> RawFd {
        each!(self, s => s.fd())
    }

    /// The descriptor, borrowed for as long as the source lives (for
    /// socket options through safe wrappers such as `socket2::SockRef`).
    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        each!(self, s => s.as_fd())
    }

    /// Receives into `buf` (from its start up to its capacity).
    pub(crate) async fn recv<B: IoBufMut>(&self, buf: B) -> BufResult<usize, B> {
        each!(self, s => s.recv(buf).await)
    }

    /// Sends the initialised bytes of `buf`; may send fewer.
    pub(crate) async fn send<B: IoBuf>(&self, buf: B) -> BufResult<usize, B> {
        each!(self, s => s.send(buf).await)
    }

    /// Sends the buffers in order in one call; may send fewer bytes than all.
    pub(crate) async fn send_vectored<B: IoBuf>(&self, bufs: Vec<B>) -> BufResult<usize, Vec<B>> {
        each!(self, s => s.send_vectored(bufs).await)
    }

    /// Connects a fresh non-blocking socket to `addr`.
    pub(crate) async fn connect(&self, addr: SocketAddr) -> io::Result<()> {
        each!(self, s => s.connect(addr).await)
    }

    /// Sends up to `len` bytes of `file` from `offset` without copying them
    /// through user space, stopping early at the file's end: `sendfile` on
    /// both drivers (io_uring waits for room with a `POLL_ADD`; with
    /// `HOTLOOP_URING_SEND_FILE=splice`, `SPLICE` through a pipe). Returns
    /// the bytes sent, and the error that stopped it before `len`, if one did.
    pub(crate) async fn send_file(
        &self,
        file: &uring::SharedFile,
        offset: u64,
        len: u64,
    ) -> (u64, io::Result<()>) {
        each!(self, s => s.send_file(file, offset, len).await)
    }

    /// Shuts down one or both directions of a connection.
    pub(crate) async fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        each!(self, s => s.shutdown(how).await)
    }

    /// Ready once the socket may have bytes to read (or an end or error to
    /// report); then [`Source::try_recv`] says whether it has. Holds no
    /// buffer while it waits.
    pub(crate) fn poll_readable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        each!(self, s => s.poll_readable(cx))
    }

    /// Ready when the descriptor next polls readable: for a descriptor
    /// that is not a socket, such as a pidfd (readable once its process
    /// has exited). It never answers from remembered readiness, since its
    /// caller has just looked and found nothing: epoll waits for the next
    /// event (registration reports a descriptor readable already), io_uring
    /// keeps a one-shot `POLL_ADD` across polls.
    pub(crate) fn poll_next_readable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        each!(self, s => s.poll_next_readable(cx))
    }

    /// Ready when the socket next polls writable; as
    /// [`Source::poll_next_readable`], never from remembered readiness.
    pub(crate) async fn next_writable(&self) -> io::Result<()> {
        match self {
            Source::Epoll(s) => std::future::poll_fn(|cx| s.poll_next_writable(cx)).await,
            Source::Uring(s) => s.next_writable().await,
        }
    }

    /// False when the last read drained the socket and nothing new has
    /// been signalled since: waiting first saves a syscall that would fail.
    pub(crate) fn may_read_now(&self) -> bool {
        each!(self, s => s.may_read_now())
    }

    /// Receives at most `buf.len()` bytes without waiting.
    /// `ErrorKind::WouldBlock` when there are none.
    pub(crate) fn try_recv(&self, buf: &mut [std::mem::MaybeUninit<u8>]) -> io::Result<usize> {
        each!(self, s => s.try_recv(buf))
    }

    /// Receives into the spare capacity of `buf` without waiting, growing
    /// its length by what was received.
    pub(crate) fn try_recv_into(&self, buf: &mut Vec<u8>) -> io::Result<usize> {
        let n = self.try_recv(buf.spare_capacity_mut())?;
        // SAFETY: `try_recv` initialised the first `n` bytes of the spare capacity.
        unsafe { buf.set_len(buf.len() + n) };
        Ok(n)
    }

    /// Takes one connection from a listening socket, or parks the task
    /// until one comes.
    pub(crate) fn poll_accept(
        &self,
        cx: &mut TaskContext<'_>,
        mode: AcceptMode,
    ) -> Poll<io::Result<OwnedFd>> {
        each!(self, s => s.poll_accept(cx, mode))
    }

    /// Takes one connection only if one is ready now, never parking: for
    /// draining a listener's queue when a server stops.
    pub(crate) fn accept_now(&self, mode: AcceptMode) -> Option<io::Result<OwnedFd>> {
        each!(self, s => s.accept_now(mode))
    }

    /// Sets how many connections a listener's owner will take from now on
    /// (`usize::MAX`: all). The driver never accepts more than that ahead
    /// of the owner; the kernel's backlog holds the rest.
    pub(crate) fn set_accept_room(&self, room: usize) {
        each!(self, s => s.set_accept_room(room))
    }

    /// Reads into a borrowed slice, for the poll-based I/O traits.
    pub(crate) fn poll_read_slice(
        &self,
        cx: &mut TaskContext<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        // SAFETY: `[u8]` and `[MaybeUninit<u8>]` share a layout, and the
        // backends write only initialised bytes, so `buf` stays initialised.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(
                buf.as_mut_ptr().cast::<std::mem::MaybeUninit<u8>>(),
                buf.len(),
            )
        };
        self.poll_read_uninit(cx, dst)
    }

    /// Reads into a borrowed slice that may be uninitialised (a tokio
    /// `ReadBuf`'s or hyper's spare room, which need not be zeroed first);
    /// `Ok(n)` means the first `n` bytes of `buf` were written.
    pub(crate) fn poll_read_uninit(
        &self,
        cx: &mut TaskContext<'_>,
        buf: &mut [std::mem::MaybeUninit<u8>],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => s.poll_read_uninit(cx, buf))
    }

    /// Writes from a borrowed slice, for the poll-based I/O traits.
    pub(crate) fn poll_write_slice(
        &self,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => s.poll_write_slices(cx, &[io::IoSlice::new(buf)]))
    }

    /// Writes several borrowed slices with one call, for the poll-based I/O traits.
    pub(crate) fn poll_write_slices(
        &self,
        cx: &mut TaskContext<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => s.poll_write_slices(cx, bufs))
    }

    /// Waits until every byte a borrowed-slice write accepted is in the
    /// kernel (io_uring writes behind; on epoll there is nothing to wait for).
    pub(crate) fn poll_flush(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        each!(self, s => s.poll_flush(cx))
    }
}

/// Datagram operations (`udp.rs` in each backend).
impl Source {
    /// Receives one datagram into `buf` (from its start up to its capacity),
    /// with what the kernel said about it.
    pub(crate) async fn recv_msg<B: IoBufMut>(&self, buf: B) -> BufResult<RecvMeta, B> {
        each!(self, s => s.recv_msg(buf).await)
    }

    /// Sends the initialised bytes of `buf` as one datagram, or as a train
    /// of `meta.segment_size` datagrams (GSO).
    pub(crate) async fn send_msg<B: IoBuf>(&self, buf: B, meta: SendMeta) -> BufResult<usize, B> {
        each!(self, s => s.send_msg(buf, meta).await)
    }

    /// Receives up to [`udp::BATCH_DATAGRAMS_MAX`] datagrams into borrowed
    /// buffers, one per buffer, or parks the task until one comes.
    pub(crate) fn poll_recv_batch(
        &self,
        cx: &mut TaskContext<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => s.poll_recv_batch(cx, bufs, meta))
    }

    /// Sends up to [`udp::BATCH_DATAGRAMS_MAX`] transmits from borrowed
    /// buffers, or parks the task until the socket has room. Returns how
    /// many the kernel took.
    pub(crate) fn poll_send_batch(
        &self,
        cx: &mut TaskContext<'_>,
        transmits: &[Transmit<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => s.poll_send_batch(cx, transmits))
    }

    /// Sends one transmit now, or fails with `WouldBlock`; then
    /// [`Source::writable`] waits for room.
    pub(crate) fn try_send_one(&self, transmit: &Transmit<'_>) -> io::Result<usize> {
        each!(self, s => s.try_send_one(transmit))
    }

    /// Waits until the socket may have room to send.
    pub(crate) async fn writable(&self) -> io::Result<()> {
        each!(self, s => s.writable().await)
    }

    /// True once the socket's receives take from an io_uring multishot
    /// `RECVMSG` (never on epoll).
    pub(crate) fn receives_from_ring(&self) -> bool {
        matches!(self, Source::Uring(s) if s.receives_from_ring())
    }
}
