//! A TCP connection with owned-buffer reads and writes.

use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::driver::Source;
use crate::runtime::context;
use crate::sys;

/// A TCP connection owned by one worker.
///
/// Reads and writes take `&self`, so one task may read while another
/// writes (wrap the stream in an `Rc`); at most one read and one write
/// should be in flight at a time.
pub struct TcpStream {
    src: Source,
}

impl TcpStream {
    /// Wraps a connected (or connecting) socket on the current worker's driver.
    pub(crate) fn from_fd(fd: OwnedFd) -> io::Result<TcpStream> {
        let src = context::with(|cx| Source::new(&cx.driver, fd))?;
        Ok(TcpStream { src })
    }

    pub(crate) fn source(&self) -> &Source {
        &self.src
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
        let stream = TcpStream::from_fd(sys::tcp_socket(&addr)?)?;
        stream.src.connect(addr).await?;
        Ok(stream)
    }

    /// Reads into `buf`, replacing its contents: up to `buf.capacity()`
    /// bytes for a `Vec`. `Ok(0)` means the peer closed its side.
    ///
    /// # Cancel safety
    /// On epoll, dropping the future (a `timeout`, a `select`) loses
    /// nothing: the bytes stay in the socket. On io_uring the read is a
    /// kernel operation: dropped in the loop turn it was made, it is
    /// withdrawn before the kernel sees it and loses nothing; dropped later,
    /// it is cancelled, but if the kernel had already copied bytes into its
    /// buffer, those bytes go with the buffer. A caller that times reads out
    /// and keeps using the connection should use
    /// [`read_pooled`](Self::read_pooled), which waits for readiness and
    /// then reads, and is cancel-safe on both drivers.
    pub async fn read<B: IoBufMut>(&self, buf: B) -> BufResult<usize, B> {
        self.src.recv(buf).await
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
        super::pool::ReadPooled::new(&self.src)
    }

    /// Writes some of `buf`; returns how many bytes were taken.
    ///
    /// On io_uring, a write whose future is dropped after the kernel saw it
    /// may still have sent some bytes: treat a cancelled write as leaving
    /// the stream in an unknown state.
    pub async fn write<B: IoBuf>(&self, buf: B) -> BufResult<usize, B> {
        self.src.send(buf).await
    }

    /// Writes all of `buf`.
    pub async fn write_all<B: IoBuf>(&self, buf: B) -> BufResult<(), B> {
        let total = buf.bytes_init();
        let mut slice = buf.slice(..);
        let mut done = 0;
        while done < total {
            let (res, s) = self.src.send(slice).await;
            let buf = s.into_inner();
            match res {
                Ok(0) => return (Err(io::ErrorKind::WriteZero.into()), buf),
                Ok(n) => done += n,
                Err(e) => return (Err(e), buf),
            }
            slice = buf.slice(done..);
        }
        (Ok(()), slice.into_inner())
    }

    /// Writes the buffers in order with one call (`sendmsg`); may write fewer bytes than all.
    pub async fn write_vectored<B: IoBuf>(&self, bufs: Vec<B>) -> BufResult<usize, Vec<B>> {
        self.src.send_vectored(bufs).await
    }

    /// Shuts down the read half, the write half or both.
    pub async fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.src.shutdown(how).await
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        sys::local_addr(self.src.fd())
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        sys::peer_addr(self.src.fd())
    }

    /// Sets `TCP_NODELAY`.
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        sys::setsockopt_int(self.src.fd(), libc::IPPROTO_TCP, libc::TCP_NODELAY, on as i32)
    }

    /// Sets `SO_LINGER`. `Some(Duration::ZERO)` makes closing the stream
    /// reset the connection (the peer reads `ECONNRESET`, not a clean end
    /// of stream), which is how a proxy passes on a cut; `None` restores
    /// the default (close sends a FIN after the unsent data).
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        sys::set_linger(self.src.fd(), linger)
    }

    /// Reads `TCP_NODELAY`.
    pub fn nodelay(&self) -> io::Result<bool> {
        Ok(sys::getsockopt_int(self.src.fd(), libc::IPPROTO_TCP, libc::TCP_NODELAY)? != 0)
    }
}

impl AsRawFd for TcpStream {
    fn as_raw_fd(&self) -> RawFd {
        self.src.fd()
    }
}

impl std::fmt::Debug for TcpStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStream").field("fd", &self.src.fd()).finish()
    }
}
