//! `UnixDatagram`: Unix domain datagram sockets, bound to a path,
//! connected, or unnamed.
//!
//! # Implementation notes
//! Datagrams move through the non-blocking system calls std makes
//! (`send_to`, `recv_from`) on the descriptor the driver holds, and the
//! driver only says when to try again: epoll waits for the next edge,
//! io_uring for a one-shot `POLL_ADD`. So the API takes borrowed slices,
//! as tokio's does, and every call is cancel-safe: nothing is taken from
//! the socket until the call returns it.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::SocketAddr;
use std::path::Path;

use crate::driver::ReadinessSource;
use crate::runtime::current;
use crate::sys;

/// A Unix domain datagram socket on the current worker, as tokio's
/// `UnixDatagram`. Message boundaries are kept; a datagram larger than
/// the buffer is cut to it.
pub struct UnixDatagram {
    src: ReadinessSource,
}

impl UnixDatagram {
    /// Binds a socket to `path` (which must not exist yet; a path starting
    /// with a NUL byte names one in Linux's abstract namespace). Nothing
    /// removes the file on drop.
    pub fn bind(path: impl AsRef<Path>) -> io::Result<UnixDatagram> {
        let path = path.as_ref();
        let socket = address(path)
            .and_then(|a| std::os::unix::net::UnixDatagram::bind_addr(&a))
            .map_err(|e| io::Error::new(e.kind(), format!("bind {}: {e}", path.display())))?;
        Self::from_std(socket)
    }

    /// A socket bound to no address: it can send to a bound socket (and
    /// be answered only if it binds or is connected from a pair).
    pub fn unbound() -> io::Result<UnixDatagram> {
        Self::from_std(std::os::unix::net::UnixDatagram::unbound()?)
    }

    /// Two sockets connected to each other (`socketpair(2)`).
    pub fn pair() -> io::Result<(UnixDatagram, UnixDatagram)> {
        let (a, b) = std::os::unix::net::UnixDatagram::pair()?;
        Ok((Self::from_std(a)?, Self::from_std(b)?))
    }

    /// Wraps a std socket (made non-blocking here) on the current worker.
    ///
    /// # Panics
    /// Outside a hotloop worker.
    pub fn from_std(socket: std::os::unix::net::UnixDatagram) -> io::Result<UnixDatagram> {
        socket.set_nonblocking(true)?;
        let fd = OwnedFd::from(socket);
        let src = current::with_driver(|d| ReadinessSource::new(d, fd))?;
        Ok(UnixDatagram { src })
    }

    /// Sets the default destination of `send` and the only source `recv`
    /// takes datagrams from.
    pub fn connect(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let path = path.as_ref();
        address(path)
            .and_then(|a| self.std(|s| s.connect_addr(&a)))
            .map_err(|e| io::Error::new(e.kind(), format!("connect to {}: {e}", path.display())))
    }

    /// Sends `buf` as one datagram to the connected peer.
    pub async fn send(&self, buf: &[u8]) -> io::Result<usize> {
        self.write_with(|s| s.send(buf)).await
    }

    /// Sends `buf` as one datagram to the socket bound at `path`.
    pub async fn send_to(&self, buf: &[u8], path: impl AsRef<Path>) -> io::Result<usize> {
        let to = address(path.as_ref())?;
        self.write_with(|s| s.send_to_addr(buf, &to)).await
    }

    /// Receives one datagram into `buf`; returns its length (cut to `buf`).
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_with(|s| s.recv(buf)).await
    }

    /// Receives one datagram into `buf`; returns its length and its sender.
    pub async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.read_with(|s| s.recv_from(buf)).await
    }

    /// The address this socket is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.std(|s| s.local_addr())
    }

    /// The address of the connected peer.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.std(|s| s.peer_addr())
    }

    /// Shuts down reading, writing or both.
    pub fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        self.std(|s| s.shutdown(how))
    }

    /// The error pending on the socket (`SO_ERROR`), if any.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.std(|s| s.take_error())
    }

    fn std<R>(&self, f: impl FnOnce(&std::os::unix::net::UnixDatagram) -> R) -> R {
        sys::with_unix_datagram(self.src.as_fd(), f)
    }

    /// Tries `f` until it does not say `WouldBlock`, waiting for the
    /// socket to turn readable in between.
    async fn read_with<R>(
        &self,
        mut f: impl FnMut(&std::os::unix::net::UnixDatagram) -> io::Result<R>,
    ) -> io::Result<R> {
        loop {
            // Each try takes a unit of the task's budget, made only while
            // one is left (`coop.rs`): a peer that floods the socket does
            // not hold the worker.
            crate::coop::step().await;
            match self.std(&mut f) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                done => return done,
            }
            std::future::poll_fn(|cx| self.src.poll_next_readable(cx)).await?;
        }
    }

    /// Tries `f` until it does not say `WouldBlock` (the peer's queue is
    /// full), waiting for the socket to turn writable in between.
    async fn write_with<R>(
        &self,
        mut f: impl FnMut(&std::os::unix::net::UnixDatagram) -> io::Result<R>,
    ) -> io::Result<R> {
        let mut refused = 0u32;
        loop {
            // As a read's try (see `read_with`).
            crate::coop::step().await;
            match self.std(&mut f) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                done => return done,
            }
            refused += 1;
            if refused > 2 {
                // An unconnected socket turns writable with room in its own
                // buffer, which says nothing of the receiver's full queue
                // (the refusal): without a pause this would try again as
                // fast as the poller answers (io_uring's `POLL_ADD` at once;
                // on epoll the refused send's own buffer, freed, signals the
                // socket writable, since the kernel wakes only a connected
                // sender when the receiver's queue drains).
                let pause = std::time::Duration::from_micros(500 << (refused - 3).min(6));
                crate::time::sleep(pause).await;
            }
            self.src.next_writable().await?;
        }
    }
}

/// The socket address `path` names: a file, or with a leading NUL byte a
/// name in Linux's abstract namespace (which std's path-taking calls
/// refuse, a NUL not being allowed in a path).
fn address(path: &Path) -> io::Result<SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    match path.as_os_str().as_bytes() {
        [0, name @ ..] => SocketAddr::from_abstract_name(name),
        _ => SocketAddr::from_pathname(path),
    }
}

impl std::fmt::Debug for UnixDatagram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnixDatagram").field("local", &self.local_addr().ok()).finish()
    }
}

/// The credentials of the process at the other end of a Unix stream, as
/// `SO_PEERCRED` reports them (taken when it connected, or made the pair).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UCred {
    pid: i32,
    uid: u32,
    gid: u32,
}

impl UCred {
    pub(crate) fn of(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<UCred> {
        let (pid, uid, gid) = sys::peer_cred(fd)?;
        Ok(UCred { pid, uid, gid })
    }

    /// The peer's user id.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The peer's group id.
    pub fn gid(&self) -> u32 {
        self.gid
    }

    /// The peer's process id (`None` if the kernel gave none, as for a
    /// peer in another pid namespace).
    pub fn pid(&self) -> Option<i32> {
        (self.pid != 0).then_some(self.pid)
    }
}
