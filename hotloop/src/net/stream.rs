//! A TCP connection with owned-buffer reads and writes.

use std::future::Future;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::task::{Context, Poll};
use std::time::Duration;

use socket2::{Domain, Socket, Type};

use super::stream_core::StreamCore;
use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::sys;

/// A TCP connection owned by one worker.
///
/// Reads and writes take `&self`, so one task may read while another
/// writes (wrap the stream in an `Rc`); at most one read and one write
/// should be in flight at a time.
pub struct TcpStream {
    core: StreamCore,
}

impl TcpStream {
    /// Wraps a connected (or connecting) socket on the current worker's driver.
    pub(crate) fn from_fd(fd: OwnedFd) -> io::Result<TcpStream> {
        Ok(TcpStream { core: StreamCore::new(fd)? })
    }

    /// Wraps a connection a listener of the current worker accepted (on
    /// io_uring, perhaps a direct descriptor).
    pub(crate) fn from_accepted(accepted: crate::driver::Accepted) -> io::Result<TcpStream> {
        Ok(TcpStream { core: StreamCore::from_accepted(accepted)? })
    }

    pub(crate) fn core(&self) -> &StreamCore {
        &self.core
    }

    /// Connects to the first address of `addr` that accepts.
    ///
    /// A socket address is used as it is; a host name (`"host:port"`,
    /// `("host", port)`) is resolved on the runtime's blocking pool (see
    /// [`lookup_host`](super::lookup_host)), never on the worker.
    pub async fn connect(addr: impl super::ToSocketAddrs) -> io::Result<TcpStream> {
        let mut last_err = None;
        for addr in addr.to_target()?.resolve().await? {
            match Self::connect_addr(addr).await {
                Ok(s) => return Ok(s),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "no address to connect to")
        }))
    }

    /// Wraps a connected `std::net::TcpStream` on the current worker's
    /// driver, as tokio's `TcpStream::from_std` does; the socket is made
    /// non-blocking here.
    ///
    /// # Panics
    /// Outside a hotloop worker.
    pub fn from_std(stream: std::net::TcpStream) -> io::Result<TcpStream> {
        stream.set_nonblocking(true)?;
        TcpStream::from_fd(stream.into())
    }

    /// Takes the connection off this worker's driver and hands back the
    /// `std::net::TcpStream` (non-blocking), to move it to another worker
    /// ([`from_std`](Self::from_std) there) or another thread, as tokio's
    /// `into_std`. Nothing is lost on the way: bytes accepted by the
    /// poll-form writes are sent first, and on io_uring the stream's armed
    /// multishot receive is cancelled and its last completion awaited, so
    /// no receive left in the kernel takes a byte the new owner should
    /// read. A peer's end the driver already saw stays in the socket: the
    /// new owner's reads return 0.
    ///
    /// # Errors
    /// The stream comes back in the error ([`IntoStdError::into_parts`]),
    /// unchanged and usable, when it cannot move yet:
    /// - `ErrorKind::InvalidData` while received bytes wait in the driver
    ///   (io_uring's receive queue): read them, then move it. An idle
    ///   connection (everything sent was read) has none.
    /// - The connection's error (`ConnectionReset`, ...) when the driver
    ///   already received it: the socket would not report it again.
    /// - An error of the flush, or of `epoll_ctl`.
    ///
    /// A write whose future was dropped while in flight (see
    /// [`write_owned`](Self::write_owned)) may still be sent after the
    /// move; the driver then keeps its own descriptor until it is done and
    /// the returned stream holds a duplicate.
    ///
    /// # Panics
    /// Outside the worker that owns the stream.
    pub async fn into_std(self) -> Result<std::net::TcpStream, IntoStdError> {
        match self.core.into_fd().await {
            Ok(fd) => Ok(std::net::TcpStream::from(fd)),
            Err((core, error)) => Err(IntoStdError { stream: TcpStream { core }, error }),
        }
    }

    /// Connects to `addr`, giving up after `limit` with `ErrorKind::TimedOut`.
    pub async fn connect_timeout(addr: SocketAddr, limit: Duration) -> io::Result<TcpStream> {
        crate::time::timeout(limit, Self::connect_addr(addr)).await?
    }

    async fn connect_addr(addr: SocketAddr) -> io::Result<TcpStream> {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM.nonblocking(), None)?;
        Self::connect_socket(socket.into(), addr).await
    }

    /// Connects the fresh non-blocking socket `fd` to `addr`.
    pub(crate) async fn connect_socket(fd: OwnedFd, addr: SocketAddr) -> io::Result<TcpStream> {
        let stream = TcpStream::from_fd(fd)?;
        stream.core.source().connect(addr).await?;
        Ok(stream)
    }

    /// Sends up to `len` bytes of `file`, from `offset`, without
    /// copying them through user space; returns how many were sent.
    ///
    /// Fewer than `len` only when the file ends first (also when it
    /// shrinks during the send): nothing past its end is sent, and
    /// the send does not wait for it to grow. This is `sendfile(2)` on
    /// both drivers, waiting for room in the socket when it has none (on
    /// io_uring with a `POLL_ADD`; `HOTLOOP_URING_SEND_FILE=splice` sends
    /// with two `SPLICE` operations per step through a pipe of the
    /// worker's instead). Where the kernel refuses (`EINVAL`, `ENOSYS`,
    /// `EOPNOTSUPP`: a file system without splice support), the rest is
    /// read and written instead, in 64 KiB steps.
    ///
    /// The bytes travel as references to the file's cached pages until the
    /// peer has them: a change to the file made meanwhile (a truncation
    /// included) may show in bytes already counted as sent, as with
    /// `sendfile` in any server. Replace files by renaming a new one into
    /// place to serve consistent bytes.
    ///
    /// The file's cursor does not move. An error may come after
    /// some bytes were sent: the stream is then best closed.
    /// Dropping the future mid-send leaves the stream at an unknown
    /// point of the file.
    pub async fn send_file(
        &self,
        file: &crate::fs::File,
        offset: u64,
        len: u64,
    ) -> io::Result<u64> {
        self.core().send_file(file, offset, len).await
    }

    /// Reads into `buf`, replacing its contents: up to `buf.capacity()`
    /// bytes for a `Vec`. `Ok(0)` means the peer closed its side.
    ///
    /// # Cancel safety
    /// Cancel-safe on both drivers: dropping the future (a `timeout`, a
    /// `select`) loses nothing. It waits for readiness and then reads
    /// without waiting (on io_uring from the socket's receive queue, which
    /// every read style on the stream shares), so the kernel never holds
    /// a read into this buffer.
    pub fn read_owned<B: IoBufMut>(
        &self,
        buf: B,
    ) -> impl Future<Output = BufResult<usize, B>> + '_ {
        self.core.read(buf)
    }

    /// Reads into a buffer borrowed from the worker's pool
    /// ([`POOLED_BUFFER_BYTES`](super::POOLED_BUFFER_BYTES) bytes), taken
    /// only once data is there, so an idle connection holds no buffer (on
    /// either driver). An empty result means the peer closed its side.
    ///
    /// # Cancel safety
    /// Cancel-safe on both drivers: it waits for readiness (which holds no
    /// data) and then reads without waiting, so a dropped future never
    /// takes bytes with it.
    pub fn read_pooled(&self) -> super::ReadPooled<'_> {
        self.core.read_pooled()
    }

    /// Writes some of `buf`; returns how many bytes were taken.
    ///
    /// On io_uring, a write whose future is dropped after the kernel saw it
    /// may still have sent some bytes: treat a cancelled write as leaving
    /// the stream in an unknown state.
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

    /// Waits until the stream may have bytes to read, or an end or error
    /// to report, as tokio's `readable`; then [`try_read`](Self::try_read)
    /// says which. The wake may find nothing (`WouldBlock`): wait again.
    ///
    /// # Cancel safety
    /// Cancel-safe: it holds no data.
    pub async fn readable(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.core.poll_read_ready(cx)).await
    }

    /// The poll form of [`readable`](Self::readable).
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.core.poll_read_ready(cx)
    }

    /// Reads what the stream has into `buf` without waiting: `Ok(0)` at
    /// the peer's end (or for an empty `buf`), `ErrorKind::WouldBlock`
    /// when there is nothing yet. It shares the stream's one receive path
    /// with every other read style, so no byte is lost between them.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.core.try_read(buf)
    }

    /// Waits until [`try_write`](Self::try_write) may take bytes, as
    /// tokio's `writable`: on epoll once the socket has room, on io_uring
    /// once the stream's write in flight is done. The socket may still be
    /// full when it returns (`WouldBlock`): wait again.
    ///
    /// # Cancel safety
    /// Cancel-safe: it holds no data.
    pub async fn writable(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.core.poll_write_ready(cx)).await
    }

    /// The poll form of [`writable`](Self::writable).
    pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.core.poll_write_ready(cx)
    }

    /// Writes what the stream can take of `buf` without waiting; returns
    /// how many bytes it took, or `ErrorKind::WouldBlock`.
    ///
    /// On epoll it is one non-blocking `send`. On io_uring it is the
    /// poll-form write: unless the worker sends directly, the bytes are
    /// copied into the stream's write-behind buffer and sent with the
    /// worker's next submission, and a `try_write` while that send is in
    /// flight is `WouldBlock`; a byte taken is never dropped, also if the
    /// stream is dropped next.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.core.try_write(buf)
    }

    /// Splits the stream into a read half and a write half that can go to
    /// two tasks of this worker, as tokio's `into_split`. The write half
    /// shuts the stream's write side down when it is dropped (after the
    /// bytes it wrote are out), unless [`OwnedWriteHalf::forget`](super::OwnedWriteHalf::forget)
    /// drops it; [`OwnedReadHalf::reunite`](super::OwnedReadHalf::reunite)
    /// gives the stream back. The halves share the stream through an
    /// `Rc`: like the stream, they stay on its worker.
    pub fn into_split(self) -> (super::OwnedReadHalf, super::OwnedWriteHalf) {
        super::split::into_split(self)
    }

    /// Borrowed halves, as tokio's `split`: each implements only its
    /// direction of tokio's I/O traits. The stream's methods take `&self`,
    /// so `&stream` serves as either half too.
    pub fn split(&self) -> (super::ReadHalf<'_>, super::WriteHalf<'_>) {
        super::split::split(self)
    }

    /// Shuts down the read half, the write half or both.
    pub fn shutdown_with(&self, how: Shutdown) -> impl Future<Output = io::Result<()>> + '_ {
        self.core.shutdown(how)
    }

    /// Shuts down the read half, the write half or both in the kernel at
    /// once, without waiting: unlike [`shutdown_with`](Self::shutdown_with),
    /// bytes the poll-form writes took that io_uring still has in flight
    /// are not sent first (their send fails, and the driver resets the
    /// connection). With [`set_linger`](Self::set_linger)
    /// `Some(Duration::ZERO)` first, it cuts a connection now. A direct
    /// io_uring socket runs a ring entry, with no descriptor installed.
    pub fn shutdown_now(&self, how: Shutdown) -> io::Result<()> {
        self.core.source().shutdown_now(how)
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        sys::local_addr(self.core.try_as_fd()?.as_raw_fd())
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        sys::peer_addr(self.core.try_as_fd()?.as_raw_fd())
    }

    /// How many bytes of this connection the peer has acknowledged
    /// (`TCP_INFO`'s `tcpi_bytes_acked`): a long send's progress as the
    /// peer sees it, whatever hands the bytes to the kernel (a
    /// [`send_file`](Self::send_file) step included). A send timeout that
    /// means "no progress for so long" compares two readings rather than
    /// timing a whole step. On io_uring a direct socket gets a plain
    /// descriptor for it.
    pub fn bytes_acked(&self) -> io::Result<u64> {
        sys::tcp_bytes_acked(self.core.try_as_fd()?.as_raw_fd())
    }

    /// True if the peer has sent bytes (or its end of stream) that no read
    /// has taken yet: held by the driver (io_uring's receive moves what
    /// arrives out of the kernel, ahead of the reads) or waiting in the
    /// kernel (a peek that takes nothing). A server deciding whether to
    /// linger before it closes asks this: closing with unread bytes in
    /// the kernel sends a reset. An error once the stream has closed.
    pub fn input_pending(&self) -> io::Result<bool> {
        // The kernel's queue first: on an io_uring direct socket the peek
        // first installs a descriptor, an enter that may run the receive
        // and move the bytes into the driver, where the second look finds
        // them (with their completion not yet reaped, if so).
        let in_kernel = self.input_probe().pending();
        if self.core.source().holds_input() {
            return Ok(true);
        }
        in_kernel
    }

    /// A probe of this connection's kernel queues, to be used while a read
    /// of the stream is in flight (the read borrows the stream; the probe
    /// does not). A drain uses it to tell an idle keep-alive connection
    /// from one whose next request is arriving (see
    /// [`input_pending`](super::input_pending)), or whose last answer is
    /// still on its way to the client. Making one costs nothing
    /// on either driver: an io_uring direct socket gets a plain descriptor
    /// only if the probe is used.
    pub fn input_probe(&self) -> InputProbe {
        InputProbe(self.core.source().probe())
    }
}

/// A look into a TCP connection's kernel queues (what came in and has not
/// been read; what went out and has not been acknowledged), made by
/// [`TcpStream::input_probe`]. It does not keep the connection open.
pub struct InputProbe(crate::driver::StreamProbe);

impl InputProbe {
    /// True if the peer has sent bytes (or its end of stream) that nobody
    /// has read yet, in the kernel: a peek that takes nothing. A read
    /// through the driver may not have seen them yet (on io_uring they
    /// reach the stream with a completion a loop turn later). An error
    /// once the stream has closed (`NotConnected` on io_uring, `EBADF` on
    /// epoll, where the probe names the descriptor by its number).
    pub fn pending(&self) -> io::Result<bool> {
        self.0.input_pending()
    }

    /// How long ago the last segment carrying data from the peer arrived
    /// (`TCP_INFO`'s `tcpi_last_data_recv`), in the kernel's milliseconds
    /// and ticks (1 to 10 ms). Bytes the kernel has already handed on
    /// count too, which [`pending`](Self::pending) cannot see: an io_uring
    /// multishot receive's, in the buffer ring until its completion is
    /// read, or a TLS record's first segments, read and held by the TLS
    /// layer until the rest comes. Before any data, the connection's age.
    /// An error once the stream has closed, as `pending`'s.
    pub fn since_data_received(&self) -> io::Result<std::time::Duration> {
        self.0.since_data_received()
    }

    /// The bytes written to the connection that the peer has not
    /// acknowledged yet (`ioctl(SIOCOUTQ)`): still in the kernel's send
    /// queue, or sent and unacknowledged. A write returns once the kernel
    /// has taken its bytes, and to a client that reads slowly megabytes
    /// of an answer may still be on their way then. Bytes an io_uring
    /// stream holds in its write-behind buffer are not counted (a flush
    /// hands them to the kernel). An error once the stream has closed, as
    /// [`pending`](Self::pending)'s.
    pub fn unacknowledged_output(&self) -> io::Result<usize> {
        self.0.unacknowledged_output()
    }

    /// How long ago the peer's last acknowledgement arrived (`TCP_INFO`'s
    /// `tcpi_last_ack_recv`), in the kernel's milliseconds and ticks: the
    /// last of this side's bytes reaching the peer, or a window update
    /// its reads sent after its receive buffer had filled. An error once
    /// the stream has closed, as [`pending`](Self::pending)'s.
    pub fn since_ack_received(&self) -> io::Result<std::time::Duration> {
        self.0.since_ack_received()
    }
}

impl std::fmt::Debug for InputProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InputProbe").finish_non_exhaustive()
    }
}

/// Why [`TcpStream::into_std`] could not move a stream, with the stream
/// itself, unchanged.
pub struct IntoStdError {
    stream: TcpStream,
    error: io::Error,
}

impl IntoStdError {
    /// The stream back, and why it did not move.
    pub fn into_parts(self) -> (TcpStream, io::Error) {
        (self.stream, self.error)
    }

    /// Why the stream did not move.
    pub fn error(&self) -> &io::Error {
        &self.error
    }
}

impl std::fmt::Debug for IntoStdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntoStdError")
            .field("stream", &self.stream)
            .field("error", &self.error)
            .finish()
    }
}

impl std::fmt::Display for IntoStdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the stream could not leave its worker: {}", self.error)
    }
}

impl std::error::Error for IntoStdError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// The error alone; the stream is closed.
impl From<IntoStdError> for io::Error {
    fn from(e: IntoStdError) -> io::Error {
        e.error
    }
}

impl AsRawFd for TcpStream {
    fn as_raw_fd(&self) -> RawFd {
        self.core.fd()
    }
}

impl AsFd for TcpStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.core.as_fd()
    }
}

impl std::fmt::Debug for TcpStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // What the socket has now: asking for a direct socket's descriptor
        // would install one (a system call, and a descriptor it keeps).
        let mut d = f.debug_struct("TcpStream");
        match self.core.ids_now() {
            (Some(fd), None) => d.field("fd", &fd),
            (fd, Some(slot)) => d.field("fd", &fd).field("direct_slot", &slot),
            (None, None) => d.field("fd", &None::<RawFd>),
        };
        d.finish()
    }
}
