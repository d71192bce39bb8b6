//! UDP sockets: owned-buffer datagrams, batched borrowed-buffer forms, and
//! the offloads and ancillary data a QUIC stack needs.
//!
//! A socket belongs to the worker that made it, like a `TcpStream`. For a
//! thread-per-core server, bind one socket per worker to the same address
//! with [`UdpOptions::reuse_port`]: the kernel spreads senders over them by
//! a hash of their address, so each peer talks to one worker.

use std::cell::Cell;
use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::task::{Context as TaskContext, Poll};

use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::driver::udp::gso_segments_max;
pub use crate::driver::udp::{EcnCodepoint, RecvMeta, SendMeta, Transmit, BATCH_DATAGRAMS_MAX};
use crate::driver::DatagramSource;
use crate::runtime::current;
use crate::sys;

/// The most datagrams the kernel coalesces into one GRO receive.
pub const GRO_SEGMENTS_MAX: usize = 64;

/// How a [`UdpSocket`] is set up.
#[derive(Debug, Clone, Default)]
pub struct UdpOptions {
    /// `SO_REUSEPORT`: several sockets on one address, one per worker.
    /// Default: off.
    pub reuse_port: bool,
    /// `UDP_GRO`: the kernel may coalesce datagrams of one size from one
    /// sender into one receive; [`RecvMeta::stride`] says the size. Give
    /// receives room for [`GRO_SEGMENTS_MAX`] datagrams. Default: off.
    pub gro: bool,
    /// `IP_RECVTOS`/`IPV6_RECVTCLASS`: report each datagram's ECN
    /// codepoint in [`RecvMeta::ecn`]. Default: off.
    pub recv_ecn: bool,
    /// `IP_PKTINFO`/`IPV6_RECVPKTINFO`: report each datagram's destination
    /// address in [`RecvMeta::dst_ip`]. Default: off.
    pub recv_dst_addr: bool,
    /// Set the don't-fragment bit (`IP_PMTUDISC_PROBE`, `IPV6_DONTFRAG`),
    /// as QUIC's path MTU discovery needs. Default: off.
    pub dont_fragment: bool,
    /// `IPV6_V6ONLY` for a v6 socket (`None`: the system's default).
    pub only_v6: Option<bool>,
    /// `SO_RCVBUF` in bytes (`None`: the system's default).
    pub recv_buffer_bytes: Option<usize>,
    /// `SO_SNDBUF` in bytes (`None`: the system's default).
    pub send_buffer_bytes: Option<usize>,
}

impl UdpOptions {
    /// Everything a QUIC endpoint wants: `SO_REUSEPORT`, GRO, ECN,
    /// destination addresses and don't-fragment.
    pub fn quic() -> UdpOptions {
        UdpOptions {
            reuse_port: true,
            gro: true,
            recv_ecn: true,
            recv_dst_addr: true,
            dont_fragment: true,
            ..UdpOptions::default()
        }
    }
}

/// A UDP socket owned by one worker.
///
/// Operations take `&self`: one task may receive while another sends.
pub struct UdpSocket {
    src: DatagramSource,
    gro: Cell<bool>,
}

impl UdpSocket {
    /// Binds a socket to the first address of `addr` that works, with
    /// default options, on the current worker.
    ///
    /// # Panics
    /// Outside a hotloop worker.
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<UdpSocket> {
        let mut last_err = None;
        for addr in addr.to_socket_addrs()? {
            match Self::bind_with(addr, &UdpOptions::default()) {
                Ok(s) => return Ok(s),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "no address to bind to")
        }))
    }

    /// Binds a socket to `addr` as `options` say, on the current worker.
    ///
    /// # Panics
    /// Outside a hotloop worker.
    pub fn bind_with(addr: SocketAddr, options: &UdpOptions) -> io::Result<UdpSocket> {
        let fd = sys::udp_socket(&addr)?;
        let raw = fd.as_raw_fd();
        if options.reuse_port {
            sys::setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
        }
        if let (SocketAddr::V6(_), Some(only)) = (addr, options.only_v6) {
            sys::setsockopt_int(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, only as i32)?;
        }
        socket2::SockRef::from(&fd).bind(&socket2::SockAddr::from(addr))?;
        let socket = Self::from_fd(fd)?;
        socket.configure(addr.is_ipv6(), options)?;
        Ok(socket)
    }

    /// Wraps a bound std socket on the current worker's driver.
    ///
    /// # Panics
    /// Outside a hotloop worker.
    pub fn from_std(socket: std::net::UdpSocket) -> io::Result<UdpSocket> {
        Self::from_fd(OwnedFd::from(socket))
    }

    fn from_fd(fd: OwnedFd) -> io::Result<UdpSocket> {
        let src = current::with_driver(|d| DatagramSource::new(d, fd))?;
        Ok(UdpSocket { src, gro: Cell::new(false) })
    }

    /// Applies the options that may follow `bind`: all but `reuse_port`
    /// and `only_v6`, which this ignores. `v6` says whether the socket is
    /// an IPv6 one.
    pub fn configure(&self, v6: bool, options: &UdpOptions) -> io::Result<()> {
        let fd = self.src.fd();
        if let Some(bytes) = options.recv_buffer_bytes {
            sys::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, clamp_int(bytes))?;
        }
        if let Some(bytes) = options.send_buffer_bytes {
            sys::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, clamp_int(bytes))?;
        }
        if options.gro {
            self.set_gro(true)?;
        }
        if options.recv_ecn {
            if v6 {
                sys::setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)?;
                // A dual-stack socket's v4 datagrams carry IP_TOS; ignore the
                // error on a v6-only socket.
                let _ = sys::setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, 1);
            } else {
                sys::setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)?;
            }
        }
        if options.recv_dst_addr {
            if v6 {
                sys::setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)?;
                let _ = sys::setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_PKTINFO, 1);
            } else {
                sys::setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_PKTINFO, 1)?;
            }
        }
        if options.dont_fragment {
            if v6 {
                sys::setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, 1)?;
                let _ = sys::setsockopt_int(
                    fd,
                    libc::IPPROTO_IP,
                    libc::IP_MTU_DISCOVER,
                    libc::IP_PMTUDISC_PROBE,
                );
            } else {
                sys::setsockopt_int(
                    fd,
                    libc::IPPROTO_IP,
                    libc::IP_MTU_DISCOVER,
                    libc::IP_PMTUDISC_PROBE,
                )?;
            }
        }
        Ok(())
    }

    /// Sets the default destination and accepts datagrams from it only.
    /// Errors the network reports for it (an ICMP port unreachable, as
    /// `ConnectionRefused`) then come back from the next receive.
    pub fn connect(&self, addr: impl ToSocketAddrs) -> io::Result<()> {
        let mut last_err = None;
        for addr in addr.to_socket_addrs()? {
            match socket2::SockRef::from(&self.src.as_fd()).connect(&socket2::SockAddr::from(addr))
            {
                Ok(()) => return Ok(()),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "no address to connect to")
        }))
    }

    /// Sends the initialised bytes of `buf` as one datagram to `addr`.
    pub async fn send_to<B: IoBuf>(&self, buf: B, addr: SocketAddr) -> BufResult<usize, B> {
        let meta = SendMeta { destination: Some(addr), ..SendMeta::default() };
        self.src.send_msg(buf, meta).await
    }

    /// Receives one datagram into `buf` (up to its capacity; the rest of a
    /// longer datagram is discarded, see [`UdpSocket::recv_msg`]).
    pub async fn recv_from<B: IoBufMut>(&self, buf: B) -> BufResult<(usize, SocketAddr), B> {
        let (res, buf) = self.src.recv_msg(buf).await;
        (res.map(|m| (m.len, m.addr)), buf)
    }

    /// Sends the initialised bytes of `buf` as one datagram to the
    /// connected address.
    pub async fn send<B: IoBuf>(&self, buf: B) -> BufResult<usize, B> {
        self.src.send_msg(buf, SendMeta::default()).await
    }

    /// Receives one datagram from the connected address into `buf`.
    pub async fn recv<B: IoBufMut>(&self, buf: B) -> BufResult<usize, B> {
        let (res, buf) = self.src.recv_msg(buf).await;
        (res.map(|m| m.len), buf)
    }

    /// Sends the initialised bytes of `buf` as `meta` says: to a
    /// destination, with an ECN codepoint, from a source address, and cut
    /// into `segment_size` datagrams by the kernel (GSO, at most
    /// [`UdpSocket::max_gso_segments`] of them).
    pub async fn send_msg<B: IoBuf>(&self, buf: B, meta: SendMeta) -> BufResult<usize, B> {
        self.src.send_msg(buf, meta).await
    }

    /// Receives one datagram (or with GRO, a train of them) into `buf`,
    /// with its sender, segment size, ECN codepoint, destination address
    /// and whether it was truncated.
    pub async fn recv_msg<B: IoBufMut>(&self, buf: B) -> BufResult<RecvMeta, B> {
        self.src.recv_msg(buf).await
    }

    /// Receives one datagram into a borrowed buffer, or parks the task
    /// until one comes.
    pub fn poll_recv_from(
        &self,
        cx: &mut TaskContext<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<(usize, SocketAddr)>> {
        let mut meta = [RecvMeta::default()];
        let mut bufs = [IoSliceMut::new(buf)];
        self.src.poll_recv_batch(cx, &mut bufs, &mut meta).map_ok(|_| (meta[0].len, meta[0].addr))
    }

    /// Sends `buf` as one datagram to `addr`, or parks the task until the
    /// socket has room.
    pub fn poll_send_to(
        &self,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
        addr: SocketAddr,
    ) -> Poll<io::Result<usize>> {
        let t = Transmit {
            destination: addr,
            ecn: None,
            contents: buf,
            segment_size: None,
            src_ip: None,
        };
        self.src.poll_send_batch(cx, std::slice::from_ref(&t)).map_ok(|_| buf.len())
    }

    /// Receives up to [`BATCH_DATAGRAMS_MAX`] datagrams, one per buffer
    /// (`recvmmsg`), filling `meta` alike; returns how many. Parks the task
    /// if none is there.
    pub fn poll_recv_msgs(
        &self,
        cx: &mut TaskContext<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.src.poll_recv_batch(cx, bufs, meta)
    }

    /// Sends up to [`BATCH_DATAGRAMS_MAX`] transmits with one call
    /// (`sendmmsg`); returns how many the kernel took. Parks the task if
    /// the socket has no room.
    pub fn poll_send_msgs(
        &self,
        cx: &mut TaskContext<'_>,
        transmits: &[Transmit<'_>],
    ) -> Poll<io::Result<usize>> {
        self.src.poll_send_batch(cx, transmits)
    }

    /// Sends one transmit now, or fails with `ErrorKind::WouldBlock` when
    /// the send buffer is full; then [`UdpSocket::writable`] waits for room.
    pub fn try_send_msg(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        self.src.try_send_one(transmit).map(drop)
    }

    /// Waits until the socket may have room to send.
    pub async fn writable(&self) -> io::Result<()> {
        self.src.writable().await
    }

    /// True once this socket's receives come from an io_uring multishot
    /// `RECVMSG` filling a buffer ring of its own (decided at its first
    /// receive: the io_uring driver on Linux 6.0+, unless
    /// `HOTLOOP_URING_MULTISHOT_RECVMSG=0`); false on epoll and on the
    /// fallback path. For diagnostics and tests.
    pub fn receives_from_ring(&self) -> bool {
        self.src.receives_from_ring()
    }

    /// Stops receiving on this socket for good, for a socket whose
    /// datagrams another process now reads (a successor, at an upgrade):
    /// every receive after it pends for ever, and on io_uring the armed
    /// multishot `RECVMSG` is cancelled at once and the datagrams it had
    /// queued are dropped, so none is taken from the socket after this
    /// returns. Sends go on (a closing QUIC endpoint's close packets).
    pub fn stop_receiving(&self) {
        self.src.stop_receiving();
    }

    /// Turns receive coalescing (`UDP_GRO`) on or off.
    pub fn set_gro(&self, on: bool) -> io::Result<()> {
        sys::setsockopt_int(self.src.fd(), libc::SOL_UDP, libc::UDP_GRO, on as i32)?;
        self.gro.set(on);
        Ok(())
    }

    /// The most datagrams one send may carry with `segment_size` (GSO):
    /// 1 on kernels without `UDP_SEGMENT`.
    pub fn max_gso_segments(&self) -> usize {
        gso_segments_max()
    }

    /// The most datagrams one receive may return coalesced: 1 unless GRO is on.
    pub fn max_gro_segments(&self) -> usize {
        if self.gro.get() {
            GRO_SEGMENTS_MAX
        } else {
            1
        }
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        sys::local_addr(self.src.fd())
    }

    /// The connected address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        sys::peer_addr(self.src.fd())
    }

    /// Takes the pending socket error (`SO_ERROR`), if any.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        match sys::getsockopt_int(self.src.fd(), libc::SOL_SOCKET, libc::SO_ERROR)? {
            0 => Ok(None),
            errno => Ok(Some(io::Error::from_raw_os_error(errno))),
        }
    }
}

fn clamp_int(bytes: usize) -> i32 {
    bytes.min(i32::MAX as usize) as i32
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.src.fd()
    }
}

impl std::fmt::Debug for UdpSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpSocket").field("fd", &self.src.fd()).finish()
    }
}
