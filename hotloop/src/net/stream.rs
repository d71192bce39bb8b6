//! A TCP connection with owned-buffer reads and writes.

use std::future::Future;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
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

    /// Connects to `addr`, giving up after `limit` with `ErrorKind::TimedOut`.
    pub async fn connect_timeout(addr: SocketAddr, limit: Duration) -> io::Result<TcpStream> {
        crate::time::timeout(limit, Self::connect_addr(addr)).await?
    }

    async fn connect_addr(addr: SocketAddr) -> io::Result<TcpStream> {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM.nonblocking(), None)?;
        let stream = TcpStream::from_fd(socket.into())?;
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

    /// Shuts down the read half, the write half or both.
    pub fn shutdown_with(&self, how: Shutdown) -> impl Future<Output = io::Result<()>> + '_ {
        self.core.shutdown(how)
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        sys::local_addr(self.core.fd())
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        sys::peer_addr(self.core.fd())
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
        f.debug_struct("TcpStream").field("fd", &self.core.fd()).finish()
    }
}
