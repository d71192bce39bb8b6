//! [`TcpSocket`]: a TCP socket configured before it connects or listens,
//! as tokio's `TcpSocket`.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::time::Duration;

use socket2::{Domain, SockAddr, Socket, Type};

use super::{ListenerOptions, TcpListener, TcpStream};

/// A TCP socket not yet connected or listening: set its options, bind it
/// to a local address if need be, then [`connect`](TcpSocket::connect) or
/// [`listen`](TcpSocket::listen).
///
/// ```no_run
/// # hotloop::Runtime::new()?.block_on(async {
/// use hotloop::net::TcpSocket;
///
/// let socket = TcpSocket::new_v4()?;
/// socket.set_nodelay(true)?;
/// socket.bind("127.0.0.1:0".parse().unwrap())?; // a chosen local address
/// let stream = socket.connect("127.0.0.1:8080".parse().unwrap()).await?;
/// # Ok::<(), std::io::Error>(()) })?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct TcpSocket {
    socket: Socket,
}

impl TcpSocket {
    /// An IPv4 socket.
    pub fn new_v4() -> io::Result<TcpSocket> {
        Self::new(Domain::IPV4)
    }

    /// An IPv6 socket.
    pub fn new_v6() -> io::Result<TcpSocket> {
        Self::new(Domain::IPV6)
    }

    fn new(domain: Domain) -> io::Result<TcpSocket> {
        Ok(TcpSocket { socket: Socket::new(domain, Type::STREAM.nonblocking(), None)? })
    }

    /// Sets `SO_REUSEADDR`: bind to a local address still in `TIME_WAIT`.
    pub fn set_reuseaddr(&self, on: bool) -> io::Result<()> {
        self.socket.set_reuse_address(on)
    }

    /// Reads `SO_REUSEADDR`.
    pub fn reuseaddr(&self) -> io::Result<bool> {
        self.socket.reuse_address()
    }

    /// Sets `SO_REUSEPORT`: several sockets listen on one port, the kernel
    /// spreading connections among them.
    pub fn set_reuseport(&self, on: bool) -> io::Result<()> {
        self.socket.set_reuse_port(on)
    }

    /// Reads `SO_REUSEPORT`.
    pub fn reuseport(&self) -> io::Result<bool> {
        self.socket.reuse_port()
    }

    /// Sets `TCP_NODELAY` (inherited by the connections a listener accepts).
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.socket.set_tcp_nodelay(on)
    }

    /// Reads `TCP_NODELAY`.
    pub fn nodelay(&self) -> io::Result<bool> {
        self.socket.tcp_nodelay()
    }

    /// Sets `SO_KEEPALIVE` (the probing times: `TcpStream::set_keepalive`).
    pub fn set_keepalive(&self, on: bool) -> io::Result<()> {
        self.socket.set_keepalive(on)
    }

    /// Reads `SO_KEEPALIVE`.
    pub fn keepalive(&self) -> io::Result<bool> {
        self.socket.keepalive()
    }

    /// Sets `SO_LINGER`.
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        self.socket.set_linger(linger)
    }

    /// Reads `SO_LINGER`.
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        self.socket.linger()
    }

    /// Sets `SO_SNDBUF` (Linux doubles it and clamps it to
    /// `net.core.wmem_max`; [`send_buffer_size`](Self::send_buffer_size)
    /// reads back what it made of it).
    pub fn set_send_buffer_size(&self, bytes: u32) -> io::Result<()> {
        self.socket.set_send_buffer_size(bytes as usize)
    }

    /// Reads `SO_SNDBUF`.
    pub fn send_buffer_size(&self) -> io::Result<u32> {
        self.socket.send_buffer_size().map(|n| n.min(u32::MAX as usize) as u32)
    }

    /// Sets `SO_RCVBUF` (doubled and clamped to `net.core.rmem_max`).
    pub fn set_recv_buffer_size(&self, bytes: u32) -> io::Result<()> {
        self.socket.set_recv_buffer_size(bytes as usize)
    }

    /// Reads `SO_RCVBUF`.
    pub fn recv_buffer_size(&self) -> io::Result<u32> {
        self.socket.recv_buffer_size().map(|n| n.min(u32::MAX as usize) as u32)
    }

    /// Binds the socket to a local address.
    pub fn bind(&self, addr: SocketAddr) -> io::Result<()> {
        self.socket.bind(&SockAddr::from(addr))
    }

    /// The local address (after `bind`, or the kernel's choice).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not an IP socket address"))
    }

    /// Takes the socket's pending error (`SO_ERROR`).
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.socket.take_error()
    }

    /// Connects to `addr` on the current worker's driver.
    ///
    /// # Panics
    /// Outside a hotloop worker.
    pub async fn connect(self, addr: SocketAddr) -> io::Result<TcpStream> {
        TcpStream::connect_socket(self.socket.into(), addr).await
    }

    /// Listens with a backlog of `backlog` connections, on the current
    /// worker's driver. The listener's accept policy is
    /// [`ListenerOptions::default`]'s; its socket options are the ones set
    /// here (for `SO_REUSEPORT`, `TCP_DEFER_ACCEPT` and the rest in one
    /// call, use [`TcpListener::bind_with`]).
    ///
    /// # Panics
    /// Outside a hotloop worker.
    pub fn listen(self, backlog: u32) -> io::Result<TcpListener> {
        self.socket.listen(backlog.min(i32::MAX as u32) as i32)?;
        TcpListener::from_fd(self.socket.into(), ListenerOptions::default())
    }

    /// Wraps a socket made elsewhere (made non-blocking here).
    pub fn from_std_stream(stream: std::net::TcpStream) -> io::Result<TcpSocket> {
        stream.set_nonblocking(true)?;
        Ok(TcpSocket { socket: Socket::from(stream) })
    }
}

impl AsRawFd for TcpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

impl AsFd for TcpSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}
