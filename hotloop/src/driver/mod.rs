//! The I/O driver boundary.
//!
//! # The contract
//! Every backend provides, per worker:
//! - `new(config, worker) -> io::Result<Self>`: set up, including the
//!   worker's eventfd so other threads can wake it;
//! - `poll(timeout) -> io::Result<usize>`: wait at most `timeout` (`None`:
//!   until something happens), then wake every task whose I/O became ready
//!   or completed; returns how many events or completions it handled;
//! - the socket operations below, taking owned buffers and returning them
//!   with the result ([`crate::buf`]).
//!
//! Two backends exist on Linux and both always compile: [`epoll`]
//! (readiness) and [`uring`] (completion). One enum, [`Driver`], chooses
//! at start-up; the socket operations here match on it once per call. The
//! network layer (`net/`) sees only these functions and [`Source`].
//!
//! # Architecture invariant
//! A socket is only touched by the worker that created or accepted it.
//! Nothing in here is `Send`.

pub(crate) mod epoll;
pub(crate) mod probe;
pub(crate) mod uring;

use std::cell::Cell;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::runtime::context;
use crate::runtime::{DriverKind, Registration};
use crate::stats::DriverInfo;
use crate::sys;

use crate::runtime::{Config, WorkerShared};

/// The driver one worker uses.
pub(crate) enum Driver {
    /// Readiness-based, edge-triggered epoll.
    Epoll(epoll::Epoll),
    /// Completion-based io_uring.
    Uring(uring::Uring),
}

impl Driver {
    /// Creates the driver the configuration asks for; `Auto` probes the
    /// kernel and falls back to epoll, saying why.
    pub(crate) fn new(
        config: &Config,
        worker: &Arc<WorkerShared>,
    ) -> io::Result<(Driver, DriverInfo)> {
        let requested = match std::env::var("HOTLOOP_DRIVER").ok().as_deref() {
            Some(s) if !s.is_empty() => {
                s.parse().map_err(|e: String| io::Error::new(io::ErrorKind::InvalidInput, e))?
            }
            _ => config.driver,
        };
        let busy_poll = config.busy_poll.to_string();
        let (use_uring, mut reason) = match requested {
            DriverKind::Epoll => (false, "epoll was requested".to_string()),
            DriverKind::Uring => (true, "io_uring was requested".to_string()),
            DriverKind::Auto => match probe::uring_support() {
                Ok(()) => (
                    true,
                    "auto: the kernel supports every io_uring feature hotloop uses".to_string(),
                ),
                Err(why) => (false, format!("auto: {why}; using epoll")),
            },
        };
        if use_uring {
            match uring::Uring::new(config, worker) {
                Ok((uring, kernel_busy_poll)) => {
                    let info = DriverInfo { driver: "uring", reason, busy_poll, kernel_busy_poll };
                    return Ok((Driver::Uring(uring), info));
                }
                // The probe's small ring worked but this one did not: auto still falls back.
                Err(e) if requested == DriverKind::Auto => {
                    reason = format!("auto: io_uring setup failed ({e}); using epoll");
                }
                Err(e) => return Err(e),
            }
        }
        if requested == DriverKind::Auto && worker.id == 0 {
            crate::log::warn(format_args!("{reason}"));
        }
        let (epoll, kernel_busy_poll) = epoll::Epoll::new(config, worker)?;
        let info = DriverInfo { driver: "epoll", reason, busy_poll, kernel_busy_poll };
        Ok((Driver::Epoll(epoll), info))
    }

    /// Waits for I/O for at most `timeout` and wakes the tasks it concerns.
    pub(crate) fn poll(&mut self, timeout: Option<Duration>) -> io::Result<usize> {
        match self {
            Driver::Epoll(d) => d.poll(timeout),
            Driver::Uring(d) => d.poll(timeout),
        }
    }
}

/// Which way an operation waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Waiting to read or accept.
    Read,
    /// Waiting to write or for a connect to finish.
    Write,
}

/// A socket owned by the runtime, closed when dropped.
///
/// On epoll it remembers its registration, made lazily the first time an
/// operation has to wait (or at once in eager mode), kept until close.
pub(crate) struct Source {
    fd: OwnedFd,
    /// The epoll token (`generation << 32 | slot`), once registered.
    token: Cell<Option<u64>>,
    /// True when the worker that owns the socket runs io_uring: read once
    /// at creation, so operations need not look at the driver to choose.
    uring: bool,
    /// io_uring: the owned buffers behind borrowed-slice reads and writes,
    /// made on first use. Declared after `fd`, so the descriptor closes
    /// before their operations are cancelled.
    pub(crate) uring_buffers: std::cell::RefCell<Option<Box<uring::compat::StreamBuffers>>>,
}

impl Source {
    /// Wraps a socket; in eager mode on epoll, registers it now.
    pub(crate) fn new(fd: OwnedFd) -> io::Result<Source> {
        context::with(|cx| {
            let src = Source::bare(fd, cx.is_uring());
            if cx.config.registration == Registration::Eager {
                if let Driver::Epoll(ep) = &mut *cx.driver.borrow_mut() {
                    src.token.set(Some(ep.register(src.fd.as_raw_fd())?));
                }
            }
            Ok(src)
        })
    }

    fn bare(fd: OwnedFd, uring: bool) -> Source {
        Source { fd, token: Cell::new(None), uring, uring_buffers: Default::default() }
    }

    /// Wraps a listening socket, which always ends up waiting: register it now.
    pub(crate) fn new_listener(fd: OwnedFd) -> io::Result<Source> {
        context::with(|cx| {
            let src = Source::bare(fd, cx.is_uring());
            if let Driver::Epoll(ep) = &mut *cx.driver.borrow_mut() {
                src.token.set(Some(ep.register(src.fd.as_raw_fd())?));
            }
            Ok(src)
        })
    }

    /// The raw descriptor.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Runs `op` until it stops returning `WouldBlock`, parking the task
    /// on epoll in between (epoll only).
    fn poll_io<R>(
        &self,
        task_cx: &mut TaskContext<'_>,
        dir: Direction,
        mut op: impl FnMut() -> io::Result<R>,
    ) -> Poll<io::Result<R>> {
        if let Some(token) = self.token.get() {
            // Registered and drained in this direction: wait for the next edge
            // without a syscall that would only say EAGAIN.
            let ready = context::with(|cx| match &*cx.driver.borrow() {
                Driver::Epoll(ep) => ep.is_ready(token, dir),
                Driver::Uring(_) => true,
            });
            if !ready {
                return self.park(task_cx, dir);
            }
        }
        loop {
            match op() {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                r => return Poll::Ready(r),
            }
        }
        // The socket has nothing for us: only now does it need to be registered.
        self.park(task_cx, dir)
    }

    /// Like [`Source::poll_io`] for reads and writes of `asked` bytes: one
    /// that moves fewer bytes drained the socket's queue (or filled its send
    /// buffer), so the next one waits for an edge instead of trying.
    fn poll_io_bytes(
        &self,
        task_cx: &mut TaskContext<'_>,
        dir: Direction,
        asked: usize,
        op: impl FnMut() -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        let polled = self.poll_io(task_cx, dir, op);
        if let (Poll::Ready(Ok(n)), Some(token)) = (&polled, self.token.get()) {
            if *n > 0 && *n < asked {
                context::with(|cx| {
                    if let Driver::Epoll(ep) = &mut *cx.driver.borrow_mut() {
                        ep.clear_ready(token, dir);
                    }
                });
            }
        }
        polled
    }

    /// Parks the task on epoll until the socket is ready in `dir`.
    fn park<R>(&self, task_cx: &mut TaskContext<'_>, dir: Direction) -> Poll<io::Result<R>> {
        let parked = context::with(|cx| match &mut *cx.driver.borrow_mut() {
            Driver::Epoll(ep) => ep.park(self, dir, task_cx.waker()),
            Driver::Uring(_) => unreachable!("readiness wait on the io_uring driver"),
        });
        match parked {
            Ok(()) => Poll::Pending,
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        let token = self.token.get();
        let fd = self.fd.as_raw_fd();
        context::try_with(|cx| match &mut *cx.driver.borrow_mut() {
            Driver::Epoll(ep) => ep.release(token),
            Driver::Uring(ur) => ur.release(fd),
        });
        // `fd` closes here. Closing removes it from epoll's interest list
        // (no EPOLL_CTL_DEL needed); events already queued for it carry
        // the old generation and are dropped.
    }
}

/// Receives into `buf` (from its start up to its capacity).
pub(crate) async fn recv<B: IoBufMut>(src: &Source, mut buf: B) -> BufResult<usize, B> {
    if src.uring {
        return uring::recv(src, buf).await;
    }
    let fd = src.fd();
    let res = poll_fn(|cx| {
        let asked = buf.bytes_total();
        src.poll_io_bytes(cx, Direction::Read, asked, || {
            // SAFETY: the buffer is owned by this future and has `bytes_total` writable bytes.
            unsafe { sys::recv(fd, buf.stable_mut_ptr(), asked) }
        })
    })
    .await;
    if let Ok(n) = res {
        // SAFETY: the kernel wrote `n` bytes at the start of the buffer.
        unsafe { buf.set_init(n) };
    }
    (res, buf)
}

/// Receives into a buffer from the worker's pool, taken only once there
/// is data: while the socket has nothing, no buffer is held (epoll).
pub(crate) async fn recv_pooled(src: &Source) -> io::Result<crate::net::PooledBuf> {
    use crate::net::pool;
    if src.uring {
        // Readiness on the ring (a POLL_ADD holds no buffer), then the read
        // as a plain non-blocking syscall into a pool buffer.
        loop {
            let mut buf = pool::take();
            // SAFETY: `buf` is a live Vec with `capacity` writable bytes.
            let res = unsafe { sys::recv_nowait(src.fd(), buf.as_mut_ptr(), buf.capacity()) };
            match res {
                Ok(n) => {
                    // SAFETY: the kernel wrote `n <= capacity` bytes at the start.
                    unsafe { buf.set_len(n) };
                    return Ok(crate::net::PooledBuf::new(buf));
                }
                Err(e) => {
                    pool::give(buf);
                    match e.kind() {
                        io::ErrorKind::WouldBlock => {
                            uring::poll_ready(src.fd(), libc::POLLIN).await?
                        }
                        io::ErrorKind::Interrupted => {}
                        _ => return Err(e),
                    }
                }
            }
        }
    }
    let fd = src.fd();
    poll_fn(|cx| {
        let mut buf = pool::take();
        let polled = src.poll_io_bytes(cx, Direction::Read, buf.capacity(), || {
            // SAFETY: `buf` is a live Vec with `capacity` writable bytes.
            unsafe { sys::recv(fd, buf.as_mut_ptr(), buf.capacity()) }
        });
        match polled {
            Poll::Ready(Ok(n)) => {
                // SAFETY: the kernel wrote `n <= capacity` bytes at the start.
                unsafe { buf.set_len(n) };
                Poll::Ready(Ok(crate::net::PooledBuf::new(buf)))
            }
            // Waiting or failed: the buffer goes back until data comes.
            Poll::Ready(Err(e)) => {
                pool::give(buf);
                Poll::Ready(Err(e))
            }
            Poll::Pending => {
                pool::give(buf);
                Poll::Pending
            }
        }
    })
    .await
}

/// Sends the initialised bytes of `buf`; may send fewer.
pub(crate) async fn send<B: IoBuf>(src: &Source, buf: B) -> BufResult<usize, B> {
    if src.uring {
        return uring::send(src, buf).await;
    }
    let fd = src.fd();
    let res = poll_fn(|cx| {
        src.poll_io_bytes(cx, Direction::Write, buf.bytes_init(), || {
            // SAFETY: the buffer is owned by this future and has `bytes_init` readable bytes.
            unsafe { sys::send(fd, buf.stable_ptr(), buf.bytes_init()) }
        })
    })
    .await;
    (res, buf)
}

/// Sends the buffers in order in one call; may send fewer bytes than all.
pub(crate) async fn send_vectored<B: IoBuf>(
    src: &Source,
    bufs: Vec<B>,
) -> BufResult<usize, Vec<B>> {
    if src.uring {
        return uring::send_vectored(src, bufs).await;
    }
    let fd = src.fd();
    let iov = crate::buf::iovecs(&bufs);
    let total: usize = iov.iter().map(|v| v.iov_len).sum();
    let res = poll_fn(|cx| {
        src.poll_io_bytes(cx, Direction::Write, total, || {
            // SAFETY: each iovec describes one of `bufs`, owned by this future until it returns.
            unsafe { sys::sendmsg(fd, &iov) }
        })
    })
    .await;
    (res, bufs)
}

/// Connects a fresh non-blocking socket to `addr`.
pub(crate) async fn connect(src: &Source, addr: SocketAddr) -> io::Result<()> {
    if src.uring {
        return uring::connect(src, addr).await;
    }
    match sys::connect(src.fd(), &addr) {
        Ok(()) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    // Writable means the handshake ended; SO_ERROR says how.
    let fd = src.fd();
    poll_fn(|cx| {
        src.poll_io(cx, Direction::Write, || {
            match sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR)? {
                0 => match sys::peer_addr(fd) {
                    Ok(_) => Ok(()),
                    Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                        Err(io::ErrorKind::WouldBlock.into())
                    }
                    Err(e) => Err(e),
                },
                errno => Err(io::Error::from_raw_os_error(errno)),
            }
        })
    })
    .await
}

/// Shuts down one or both directions of a connection.
pub(crate) async fn shutdown(src: &Source, how: std::net::Shutdown) -> io::Result<()> {
    if src.uring {
        return uring::shutdown(src, how).await;
    }
    sys::shutdown(src.fd(), how)
}

/// Shuts down a direction at once with the syscall, on either driver
/// (`shutdown(2)` never blocks).
pub(crate) fn shutdown_now(src: &Source, how: std::net::Shutdown) -> io::Result<()> {
    sys::shutdown(src.fd(), how)
}

/// How a listener asks the driver for connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AcceptMode {
    /// io_uring: one submission keeps accepting until the kernel stops it
    /// (Linux 5.19+). On epoll, the same as `Single`.
    #[default]
    Multishot,
    /// One submission (or one `accept4`) per connection.
    Single,
}

impl std::str::FromStr for AcceptMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "multishot" => Ok(AcceptMode::Multishot),
            "single" | "singleshot" => Ok(AcceptMode::Single),
            other => Err(format!("unknown accept mode `{other}`: expected multishot or single")),
        }
    }
}

/// Takes one connection only if one is ready now, never parking: for
/// draining a listener's queue when a server stops.
pub(crate) fn accept_now(src: &Source, mode: AcceptMode) -> Option<io::Result<OwnedFd>> {
    if !src.uring {
        // Straight to the syscall: an edge for a connection that just came
        // in may not have been polled yet.
        return match sys::accept(src.fd()) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            other => Some(other),
        };
    }
    let mut cx = TaskContext::from_waker(std::task::Waker::noop());
    match poll_accept(src, &mut cx, mode) {
        Poll::Ready(r) => Some(r),
        Poll::Pending => None,
    }
}

/// Takes one connection from a listening socket, or parks the task until one comes.
pub(crate) fn poll_accept(
    src: &Source,
    task_cx: &mut TaskContext<'_>,
    mode: AcceptMode,
) -> Poll<io::Result<OwnedFd>> {
    let uring_poll = context::with(|cx| match &mut *cx.driver.borrow_mut() {
        Driver::Uring(ur) => Some(ur.poll_accept(src.fd(), task_cx, mode)),
        Driver::Epoll(_) => None,
    });
    match uring_poll {
        Some(p) => p,
        None => src.poll_io(task_cx, Direction::Read, || sys::accept(src.fd())),
    }
}

/// Reads into a borrowed slice, for the poll-based I/O traits (tokio's and
/// futures' `AsyncRead`). On io_uring the bytes land first in a buffer the
/// stream owns (the kernel may write into it after this call returns).
pub(crate) fn poll_read_slice(
    src: &Source,
    task_cx: &mut TaskContext<'_>,
    buf: &mut [u8],
) -> Poll<io::Result<usize>> {
    if src.uring {
        return uring::poll_read_slice(src, task_cx, buf);
    }
    let fd = src.fd();
    let asked = buf.len();
    // SAFETY: `buf` is a live, writable slice for the duration of the call.
    src.poll_io_bytes(task_cx, Direction::Read, asked, || unsafe {
        sys::recv(fd, buf.as_mut_ptr(), asked)
    })
}

/// Writes from a borrowed slice, for the poll-based I/O traits. On io_uring
/// the bytes are copied into a buffer the stream owns before submission.
pub(crate) fn poll_write_slice(
    src: &Source,
    task_cx: &mut TaskContext<'_>,
    buf: &[u8],
) -> Poll<io::Result<usize>> {
    if src.uring {
        return uring::poll_write_slice(src, task_cx, buf);
    }
    let fd = src.fd();
    // SAFETY: `buf` is a live, readable slice for the duration of the call.
    src.poll_io_bytes(task_cx, Direction::Write, buf.len(), || unsafe {
        sys::send(fd, buf.as_ptr(), buf.len())
    })
}

/// Writes several borrowed slices with one call, for the poll-based I/O traits.
pub(crate) fn poll_write_slices(
    src: &Source,
    task_cx: &mut TaskContext<'_>,
    bufs: &[io::IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    if src.uring {
        // One staging copy; the kernel sees a single buffer.
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut joined = Vec::with_capacity(total.min(256 * 1024));
        for b in bufs {
            if joined.len() + b.len() > joined.capacity() && !joined.is_empty() {
                break;
            }
            joined.extend_from_slice(b);
        }
        return uring::poll_write_slice(src, task_cx, &joined);
    }
    let fd = src.fd();
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    // IoSlice is ABI-compatible with iovec on Unix.
    let iov: &[libc::iovec] =
        // SAFETY: std documents `IoSlice` as `#[repr(transparent)]` over `iovec` on Unix.
        unsafe { std::slice::from_raw_parts(bufs.as_ptr().cast(), bufs.len()) };
    // SAFETY: every iovec describes one of `bufs`, live for the duration of the call.
    src.poll_io_bytes(task_cx, Direction::Write, total, || unsafe { sys::sendmsg(fd, iov) })
}
