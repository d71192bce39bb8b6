//! Unix domain stream sockets: [`UnixListener`] and [`UnixStream`], with
//! the same API as their TCP counterparts.
//!
//! # Implementation notes
//! - A `UnixStream` holds the same stream core as a `TcpStream`
//!   (`stream_core.rs`), and a `UnixListener` the same accept policy as a
//!   `TcpListener` (`listener.rs`): the driver's socket source does not care
//!   about the address family, and io_uring's multishot accept works on a
//!   Unix listener as on a TCP one.
//! - `connect` is a plain `connect(2)` on a non-blocking socket: for
//!   `AF_UNIX` it finishes at once or fails; it never reports a handshake
//!   in progress. When the listener's backlog is full it fails with
//!   `EAGAIN`, and nothing can be polled for the moment the backlog has
//!   room (the kernel waits for that only in a blocking connect), so
//!   `connect` retries on the worker's timer, backing off from 1 ms to
//!   [`UNIX_CONNECT_RETRY_PAUSE_MAX`], for at most [`UNIX_CONNECT_FULL_BACKLOG_WAIT`].
//! - Sockets made by `connect` and `pair` are non-blocking on epoll and
//!   blocking on io_uring, like accepted ones: a ring operation on a
//!   blocking socket waits in the kernel instead of coming back with
//!   `EAGAIN`, and the direct reads pass `MSG_DONTWAIT`.
//! - Binding never removes a file unless
//!   [`ListenerOptions::remove_stale_socket`] asks for it, and dropping a
//!   listener never removes its socket file (as in std and tokio): the
//!   path belongs to whoever bound it, and a later bind by another process
//!   may already have replaced it.

use std::future::Future;
use std::io;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use socket2::{Domain, SockAddr, Socket, Type};

use super::listener::{count_reset_in_queue, Accept, Acceptor};
use super::options::ListenerOptions;
use super::stream_core::StreamCore;
use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::driver::{Accepted, Driver};
use crate::runtime::current;
use crate::sys;

/// How long [`UnixStream::connect`] keeps retrying while the listener's
/// backlog is full before it gives up with `ErrorKind::WouldBlock`.
pub(crate) const UNIX_CONNECT_FULL_BACKLOG_WAIT: Duration = Duration::from_secs(5);

/// The longest pause between two of those retries.
pub(crate) const UNIX_CONNECT_RETRY_PAUSE_MAX: Duration = Duration::from_millis(64);

/// A Unix domain stream connection owned by one worker.
///
/// The same API as [`TcpStream`](super::TcpStream): owned-buffer reads
/// and writes taking `&self` (at most one read and one write in flight),
/// [`read_pooled`](Self::read_pooled), and tokio's and futures' I/O traits
/// under the `tokio-io` and `futures-io` features.
pub struct UnixStream {
    core: StreamCore,
}

impl UnixStream {
    /// Wraps an accepted socket on the current worker's driver.
    pub(crate) fn from_fd(fd: OwnedFd) -> io::Result<UnixStream> {
        Ok(UnixStream { core: StreamCore::new(fd)?.into_unix() })
    }

    /// Wraps a connection a listener of the current worker accepted.
    pub(crate) fn from_accepted(accepted: Accepted) -> io::Result<UnixStream> {
        Ok(UnixStream { core: StreamCore::from_accepted(accepted)?.into_unix() })
    }

    /// Wraps a socket this process connected, blocking or not as the
    /// current worker's driver wants it (see the module notes).
    pub(crate) fn from_own_fd(fd: OwnedFd) -> io::Result<UnixStream> {
        let nonblocking = current::with_driver(|d| matches!(d, Driver::Epoll(_)));
        socket2::SockRef::from(&fd).set_nonblocking(nonblocking)?;
        Self::from_fd(fd)
    }

    pub(crate) fn core(&self) -> &StreamCore {
        &self.core
    }

    /// Sends up to `len` bytes of `file`, from `offset`, without copying
    /// them through user space; returns how many were sent, fewer only when
    /// the file ends first. As [`TcpStream::send_file`](super::TcpStream::send_file).
    pub async fn send_file(
        &self,
        file: &crate::fs::File,
        offset: u64,
        len: u64,
    ) -> io::Result<u64> {
        self.core.send_file(file, offset, len).await
    }

    /// Connects to the listener at `path`.
    ///
    /// A path that does not exist fails with `ErrorKind::NotFound`, and one
    /// nobody listens on with `ErrorKind::ConnectionRefused`; the error
    /// names the path. A path starting with a NUL byte names a socket in
    /// Linux's abstract namespace.
    pub async fn connect(path: impl AsRef<Path>) -> io::Result<UnixStream> {
        let path = path.as_ref();
        let addr = SockAddr::unix(path).map_err(|e| with_path(e, "connect to", path))?;
        let socket = Socket::new(Domain::UNIX, Type::STREAM.nonblocking(), None)?;
        let mut waited = Duration::ZERO;
        let mut pause = Duration::from_millis(1);
        loop {
            match socket.connect(&addr) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // The backlog is full: see the module notes.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if waited >= UNIX_CONNECT_FULL_BACKLOG_WAIT {
                        return Err(io::Error::new(
                            io::ErrorKind::WouldBlock,
                            format!(
                                "connect to {}: the listener's backlog stayed full for {:?}",
                                path.display(),
                                UNIX_CONNECT_FULL_BACKLOG_WAIT
                            ),
                        ));
                    }
                    crate::time::sleep(pause).await;
                    waited += pause;
                    pause = (pause * 2).min(UNIX_CONNECT_RETRY_PAUSE_MAX);
                }
                Err(e) => return Err(with_path(e, "connect to", path)),
            }
        }
        Self::from_own_fd(socket.into())
    }

    /// Creates a pair of connected, unnamed sockets (`socketpair(2)`).
    pub fn pair() -> io::Result<(UnixStream, UnixStream)> {
        let (a, b) = std::os::unix::net::UnixStream::pair()?;
        Ok((Self::from_own_fd(a.into())?, Self::from_own_fd(b.into())?))
    }

    /// Reads into `buf`, replacing its contents. `Ok(0)` means the peer
    /// closed its side. Cancel safety as [`TcpStream::read_owned`](super::TcpStream::read_owned).
    pub fn read_owned<B: IoBufMut>(
        &self,
        buf: B,
    ) -> impl Future<Output = BufResult<usize, B>> + '_ {
        self.core.read(buf)
    }

    /// Reads into a buffer borrowed from the worker's pool, taken only once
    /// data is there; cancel-safe on both drivers. An empty result means the
    /// peer closed its side. See [`TcpStream::read_pooled`](super::TcpStream::read_pooled).
    pub fn read_pooled(&self) -> super::ReadPooled<'_> {
        self.core.read_pooled()
    }

    /// Writes some of `buf`; returns how many bytes were taken.
    pub fn write_owned<B: IoBuf>(&self, buf: B) -> impl Future<Output = BufResult<usize, B>> + '_ {
        self.core.write(buf)
    }

    /// Writes all of `buf`.
    pub fn write_all_owned<B: IoBuf>(&self, buf: B) -> impl Future<Output = BufResult<(), B>> + '_ {
        self.core.write_all(buf)
    }

    /// Writes the buffers in order with one call (`sendmsg`); may write fewer bytes than all.
    pub fn write_vectored_owned<B: IoBuf>(
        &self,
        bufs: Vec<B>,
    ) -> impl Future<Output = BufResult<usize, Vec<B>>> + '_ {
        self.core.write_vectored(bufs)
    }

    /// Shuts down the read half, the write half or both.
    pub fn shutdown_with(&self, how: Shutdown) -> impl Future<Output = io::Result<()>> + '_ {
        self.core.shutdown(how)
    }

    /// The local address (unnamed for a connecting socket or one of a pair).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        sys::unix_local_addr(self.core.as_fd())
    }

    /// The peer's address (unnamed for an accepted connection whose peer
    /// did not bind, which is the usual case).
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        sys::unix_peer_addr(self.core.as_fd())
    }

    /// The credentials of the peer process (`SO_PEERCRED`): its pid, uid
    /// and gid when it connected (or made the pair).
    pub fn peer_cred(&self) -> io::Result<super::UCred> {
        super::UCred::of(self.core.source().as_fd())
    }
}

impl AsRawFd for UnixStream {
    fn as_raw_fd(&self) -> RawFd {
        self.core.fd()
    }
}

impl AsFd for UnixStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.core.as_fd()
    }
}

impl std::fmt::Debug for UnixStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnixStream").field("fd", &self.core.fd()).finish()
    }
}

/// A Unix domain listening socket bound to one worker, with the accept
/// policy of [`TcpListener`](super::TcpListener).
pub struct UnixListener {
    acceptor: Acceptor,
}

impl UnixListener {
    /// Binds to `path` with the default options. Fails with
    /// `ErrorKind::AddrInUse` if the path exists (see
    /// [`ListenerOptions::remove_stale_socket`]).
    pub fn bind(path: impl AsRef<Path>) -> io::Result<UnixListener> {
        Self::bind_with(path, ListenerOptions::default())
    }

    /// Binds to `path` with `options` (the TCP-only fields are ignored).
    pub fn bind_with(path: impl AsRef<Path>, options: ListenerOptions) -> io::Result<UnixListener> {
        let fd = bind_unix_socket(path.as_ref(), &options)?;
        Self::from_fd(fd, options)
    }

    /// Wraps an already listening, non-blocking socket (see [`bind_unix_socket`]).
    pub(crate) fn from_fd(fd: OwnedFd, options: ListenerOptions) -> io::Result<UnixListener> {
        Ok(UnixListener { acceptor: Acceptor::new(fd, options)? })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        sys::unix_local_addr(self.acceptor.as_fd())
    }

    /// The options it was created with.
    pub fn options(&self) -> &ListenerOptions {
        self.acceptor.options()
    }

    /// Accepts a connection and looks up its peer address (usually unnamed).
    pub async fn accept(&self) -> io::Result<(UnixStream, SocketAddr)> {
        loop {
            let stream = self.accept_stream().await?;
            match stream.peer_addr() {
                Ok(addr) => return Ok((stream, addr)),
                Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => count_reset_in_queue(),
                Err(e) => return Err(e),
            }
        }
    }

    /// Accepts a connection without looking up its peer address, under the
    /// listener's accept policy (see
    /// [`TcpListener::accept_stream`](super::TcpListener::accept_stream)).
    pub async fn accept_stream(&self) -> io::Result<UnixStream> {
        UnixStream::from_accepted(self.acceptor.accept_fd().await?)
    }

    /// See [`TcpListener::set_accept_room`](super::TcpListener::set_accept_room).
    pub fn set_accept_room(&self, room: Option<usize>) {
        self.acceptor.set_accept_room(room);
    }

    /// Accepts under the policy of [`Self::accept_stream`], handing back
    /// the descriptor (a server may pass it to another worker).
    pub(crate) async fn accept_fd(&self) -> io::Result<Accepted> {
        self.acceptor.accept_fd().await
    }

    /// Takes a connection only if one is ready now, ignoring the accept
    /// bound (for draining the queue when a server stops).
    pub fn accept_ready(&self) -> Option<io::Result<UnixStream>> {
        Some(self.acceptor.accept_fd_ready()?.and_then(UnixStream::from_accepted))
    }
}

impl AsRawFd for UnixListener {
    fn as_raw_fd(&self) -> RawFd {
        self.acceptor.fd()
    }
}

impl AsFd for UnixListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.acceptor.as_fd()
    }
}

impl std::fmt::Debug for UnixListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnixListener")
            .field("fd", &self.acceptor.fd())
            .field("addr", &self.local_addr().ok())
            .finish()
    }
}

/// Creates a non-blocking Unix listening socket bound to `path`. Needs no
/// runtime: the server helper binds on one thread and hands the socket
/// (or copies of it) to the workers.
pub(crate) fn bind_unix_socket(path: &Path, options: &ListenerOptions) -> io::Result<OwnedFd> {
    let addr = SockAddr::unix(path).map_err(|e| with_path(e, "bind", path))?;
    if options.remove_stale_socket {
        remove_stale_socket(path, &addr)?;
    }
    let socket = Socket::new(Domain::UNIX, Type::STREAM.nonblocking(), None)?;
    socket.bind(&addr).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "bind {}: the path exists; remove it, or set \
                     ListenerOptions::remove_stale_socket to remove a socket nobody listens on",
                    path.display()
                ),
            )
        } else {
            with_path(e, "bind", path)
        }
    })?;
    socket.listen(options.backlog.min(i32::MAX as u32) as i32)?;
    Ok(socket.into())
}

/// Removes the socket file at `path` if nobody listens on it. Anything
/// else at the path stays, and the bind that follows reports `AddrInUse`.
fn remove_stale_socket(path: &Path, addr: &SockAddr) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {}
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(with_path(e, "inspect", path)),
    }
    // A refused connect is the one sure sign that nobody listens; a full
    // backlog (`EAGAIN`) or an accepted connect means a live listener.
    let probe = Socket::new(Domain::UNIX, Type::STREAM.nonblocking(), None)?;
    match probe.connect(addr) {
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    Err(with_path(e, "remove stale socket", path))
                }
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// `e`, with what was being done and to which path, keeping its kind.
fn with_path(e: io::Error, doing: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{doing} {}: {e}", path.display()))
}

impl Accept for UnixListener {
    type Stream = UnixStream;
    fn from_fd(fd: OwnedFd, options: ListenerOptions) -> io::Result<Self> {
        UnixListener::from_fd(fd, options)
    }
    fn accept_fd(&self) -> impl Future<Output = io::Result<Accepted>> + '_ {
        UnixListener::accept_fd(self)
    }
    fn stream_from_accepted(accepted: Accepted) -> io::Result<UnixStream> {
        UnixStream::from_accepted(accepted)
    }
    fn accept_fd_ready(&self) -> Option<io::Result<Accepted>> {
        self.acceptor.accept_fd_ready()
    }
    fn set_accept_room(&self, room: Option<usize>) {
        UnixListener::set_accept_room(self, room)
    }
    fn poll_accept_settled(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.acceptor.poll_accept_settled(cx)
    }
    fn take_accepted(&self) -> Option<io::Result<Accepted>> {
        self.acceptor.take_accepted()
    }
}
