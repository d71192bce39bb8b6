//! Socket options of [`TcpStream`] and [`UnixStream`], each a setter and a
//! getter that reads the kernel's value back.
//!
//! They go through `socket2::SockRef` on the stream's borrowed descriptor,
//! so none of them needs `unsafe`. None is on the per-request path: each is
//! one `setsockopt`/`getsockopt` when called.

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use socket2::{Domain, SockRef};

use super::{TcpStream, UnixStream};

/// TCP keepalive probing: after `idle` without traffic the kernel sends a
/// probe every `interval`, and gives the connection up (the next read or
/// write fails with `ETIMEDOUT`) after `retries` unanswered ones.
///
/// A field left `None` keeps the kernel's value: the system default
/// (`net.ipv4.tcp_keepalive_time`, `_intvl`, `_probes`: 7200 s, 75 s and 9
/// unless changed) or what was set before. Times are whole seconds; a
/// fraction rounds up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpKeepalive {
    /// Quiet time before the first probe (`TCP_KEEPIDLE`), 1 s to [`TcpKeepalive::SECS_MAX`].
    pub idle: Option<Duration>,
    /// Time between probes (`TCP_KEEPINTVL`), 1 s to [`TcpKeepalive::SECS_MAX`].
    pub interval: Option<Duration>,
    /// Unanswered probes before the connection is dropped (`TCP_KEEPCNT`),
    /// 1 to [`TcpKeepalive::RETRIES_MAX`].
    pub retries: Option<u32>,
}

impl TcpKeepalive {
    /// The longest `idle` or `interval` Linux takes (`MAX_TCP_KEEPIDLE`, `MAX_TCP_KEEPINTVL`).
    pub const SECS_MAX: u64 = 32_767;
    /// The most `retries` Linux takes (`MAX_TCP_KEEPCNT`).
    pub const RETRIES_MAX: u32 = 127;

    /// Checks the fields against the kernel's bounds and converts them,
    /// so a bad value is an `InvalidInput` that names the field, not a bare `EINVAL`.
    fn to_socket2(self) -> io::Result<socket2::TcpKeepalive> {
        let mut ka = socket2::TcpKeepalive::new();
        if let Some(d) = self.idle {
            ka = ka.with_time(whole_secs(d, "idle")?);
        }
        if let Some(d) = self.interval {
            ka = ka.with_interval(whole_secs(d, "interval")?);
        }
        if let Some(n) = self.retries {
            if !(1..=Self::RETRIES_MAX).contains(&n) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("keepalive retries must be 1 to {}, not {n}", Self::RETRIES_MAX),
                ));
            }
            ka = ka.with_retries(n);
        }
        Ok(ka)
    }
}

/// `d` rounded up to whole seconds, within 1 s to [`TcpKeepalive::SECS_MAX`].
fn whole_secs(d: Duration, field: &str) -> io::Result<Duration> {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    if !(1..=TcpKeepalive::SECS_MAX).contains(&secs) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("keepalive {field} must be 1 s to {} s, not {d:?}", TcpKeepalive::SECS_MAX),
        ));
    }
    Ok(Duration::from_secs(secs))
}

/// TCP socket options.
impl TcpStream {
    /// Sets `TCP_NODELAY` (on by default for accepted connections: see
    /// [`ListenerOptions::nodelay`](super::ListenerOptions::nodelay)).
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        SockRef::from(&self.borrowed()?).set_tcp_nodelay(on)
    }

    /// Reads `TCP_NODELAY`.
    pub fn nodelay(&self) -> io::Result<bool> {
        SockRef::from(&self.borrowed()?).tcp_nodelay()
    }

    /// Sets `SO_LINGER`. `Some(Duration::ZERO)` makes closing the stream
    /// reset the connection (the peer reads `ECONNRESET`, not a clean end
    /// of stream), which is how a proxy passes on a cut; `None` restores
    /// the default (close sends a FIN after the unsent data). The kernel
    /// keeps whole seconds.
    ///
    /// A direct io_uring socket (`HOTLOOP_URING_DIRECT_FDS=1`) takes it
    /// from a ring entry (Linux 6.7), with no descriptor installed, so a
    /// cut still resets when the process is out of descriptors; on an
    /// older kernel a descriptor is installed for it, and when that fails
    /// the error (`EMFILE`) says the option is not set.
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        if let Some(res) = self.core().set_linger_direct(linger) {
            return res;
        }
        SockRef::from(&self.borrowed()?).set_linger(linger)
    }

    /// Reads `SO_LINGER`.
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        SockRef::from(&self.borrowed()?).linger()
    }

    /// Turns keepalive probing on with `keepalive`'s timings (`SO_KEEPALIVE`
    /// and `TCP_KEEPIDLE`/`TCP_KEEPINTVL`/`TCP_KEEPCNT`), or off with `None`.
    /// A value outside the kernel's bounds is an `InvalidInput` error and
    /// changes nothing.
    pub fn set_keepalive(&self, keepalive: Option<TcpKeepalive>) -> io::Result<()> {
        match keepalive {
            Some(ka) => SockRef::from(&self.borrowed()?).set_tcp_keepalive(&ka.to_socket2()?),
            None => SockRef::from(&self.borrowed()?).set_keepalive(false),
        }
    }

    /// Reads keepalive back: `None` when it is off, else the timings in force
    /// (every field `Some`).
    pub fn keepalive(&self) -> io::Result<Option<TcpKeepalive>> {
        let fd = self.borrowed()?;
        let sock = SockRef::from(&fd);
        if !sock.keepalive()? {
            return Ok(None);
        }
        Ok(Some(TcpKeepalive {
            idle: Some(sock.tcp_keepalive_time()?),
            interval: Some(sock.tcp_keepalive_interval()?),
            retries: Some(sock.tcp_keepalive_retries()?),
        }))
    }

    /// Sets `SO_SNDBUF`. Linux doubles the value (the extra half is its
    /// bookkeeping) and clamps it to `net.core.wmem_max`, so
    /// [`send_buffer_size`](Self::send_buffer_size) reads back what the
    /// kernel made of it.
    pub fn set_send_buffer_size(&self, bytes: usize) -> io::Result<()> {
        set_send_buffer_size(self.borrowed()?, bytes)
    }

    /// Reads `SO_SNDBUF`.
    pub fn send_buffer_size(&self) -> io::Result<usize> {
        SockRef::from(&self.borrowed()?).send_buffer_size()
    }

    /// Sets `SO_RCVBUF` (doubled and clamped to `net.core.rmem_max`, as
    /// [`set_send_buffer_size`](Self::set_send_buffer_size)). Setting it
    /// turns off the kernel's receive-buffer autotuning for this socket.
    pub fn set_recv_buffer_size(&self, bytes: usize) -> io::Result<()> {
        set_recv_buffer_size(self.borrowed()?, bytes)
    }

    /// Reads `SO_RCVBUF`.
    pub fn recv_buffer_size(&self) -> io::Result<usize> {
        SockRef::from(&self.borrowed()?).recv_buffer_size()
    }

    /// Sets `TCP_QUICKACK`: on, acknowledgements go out at once instead of
    /// being delayed. The kernel leaves quick-ack mode by itself as traffic
    /// goes on (tcp(7): "not permanent"), so a server that wants it sets it
    /// after each read.
    pub fn set_quickack(&self, on: bool) -> io::Result<()> {
        SockRef::from(&self.borrowed()?).set_tcp_quickack(on)
    }

    /// Reads `TCP_QUICKACK` (whether the socket is in quick-ack mode now).
    pub fn quickack(&self) -> io::Result<bool> {
        SockRef::from(&self.borrowed()?).tcp_quickack()
    }

    /// The CPU that last processed a packet of this connection in the
    /// kernel (`SO_INCOMING_CPU`), `None` before any arrived. A server
    /// steering connections to the worker pinned to that CPU reads it after
    /// the first request.
    pub fn incoming_cpu(&self) -> io::Result<Option<usize>> {
        let cpu = SockRef::from(&self.borrowed()?).cpu_affinity()?;
        // The kernel keeps -1 until a packet arrives; socket2 hands it over as an usize.
        Ok((cpu as i32 >= 0).then_some(cpu))
    }

    /// Sets the time-to-live of outgoing packets: `IP_TTL` on an IPv4
    /// socket, the hop limit (`IPV6_UNICAST_HOPS`) on an IPv6 one.
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        let fd = self.borrowed()?;
        let sock = SockRef::from(&fd);
        if sock.domain()? == Domain::IPV6 {
            sock.set_unicast_hops_v6(ttl)
        } else {
            sock.set_ttl_v4(ttl)
        }
    }

    /// Reads the time-to-live (see [`set_ttl`](Self::set_ttl)).
    pub fn ttl(&self) -> io::Result<u32> {
        let fd = self.borrowed()?;
        let sock = SockRef::from(&fd);
        if sock.domain()? == Domain::IPV6 {
            sock.unicast_hops_v6()
        } else {
            sock.ttl_v4()
        }
    }

    /// The descriptor, borrowed for socket2's calls. A direct io_uring socket
    /// gets its plain descriptor installed here; when that fails (`EMFILE`)
    /// the option's call returns the error, as a `setsockopt` would.
    fn borrowed(&self) -> io::Result<BorrowedFd<'_>> {
        self.core().try_as_fd()
    }
}

/// Unix socket options: the buffer sizes (the TCP options have no meaning here).
impl UnixStream {
    /// Sets `SO_SNDBUF`: for a Unix stream socket, how many bytes may wait
    /// unread in the peer before writes block. Linux doubles the value and
    /// clamps it to `net.core.wmem_max`; [`send_buffer_size`](Self::send_buffer_size)
    /// reads back the result.
    pub fn set_send_buffer_size(&self, bytes: usize) -> io::Result<()> {
        set_send_buffer_size(self.core().as_fd(), bytes)
    }

    /// Reads `SO_SNDBUF`.
    pub fn send_buffer_size(&self) -> io::Result<usize> {
        SockRef::from(&self.core().as_fd()).send_buffer_size()
    }

    /// Sets `SO_RCVBUF` (doubled and clamped to `net.core.rmem_max`). Linux
    /// sizes a Unix stream's queue by the sender's `SO_SNDBUF`, so this
    /// mostly matters to what `recv_buffer_size` reports.
    pub fn set_recv_buffer_size(&self, bytes: usize) -> io::Result<()> {
        set_recv_buffer_size(self.core().as_fd(), bytes)
    }

    /// Reads `SO_RCVBUF`.
    pub fn recv_buffer_size(&self) -> io::Result<usize> {
        SockRef::from(&self.core().as_fd()).recv_buffer_size()
    }
}

fn set_send_buffer_size(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<()> {
    SockRef::from(&fd).set_send_buffer_size(buffer_bytes(bytes)?)
}

fn set_recv_buffer_size(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<()> {
    SockRef::from(&fd).set_recv_buffer_size(buffer_bytes(bytes)?)
}

/// `bytes`, if the kernel's `int` option can hold it (socket2 would
/// silently truncate a larger one).
fn buffer_bytes(bytes: usize) -> io::Result<usize> {
    if bytes > i32::MAX as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a socket buffer size must be at most {} bytes, not {bytes}", i32::MAX),
        ));
    }
    Ok(bytes)
}
