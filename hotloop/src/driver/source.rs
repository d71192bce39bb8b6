//! Sockets on a driver, one type per role: a listener, a byte stream, a
//! datagram socket, and a descriptor the driver only watches. Each is an
//! enum over the backends' sources of the same role, matched once per
//! operation.
//!
//! # Implementation notes
//! - Each role carries only its own state. On io_uring a stream has no
//!   accept queue and no datagram polls, a listener no receive queue or
//!   write-behind buffer (`uring/source.rs` holds the descriptor and the
//!   driver every role shares). On epoll every role is the same 24-byte
//!   core, its registration; the types still say which operations apply.
//! - A stream's state is what every idle connection pays for, so it is
//!   kept small: a unit test below bounds its size.

use std::future::Future;
use std::io;
use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use super::config::AcceptMode;
use super::udp::{RecvMeta, SendMeta, Transmit};
use super::{epoll, uring, Accepted, Driver};
use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::sys;

/// Calls `$body` with `$s` bound to the backend's source of a role enum.
macro_rules! each {
    ($role:ident, $src:expr, $s:ident => $body:expr) => {
        match $src {
            $role::Epoll($s) => $body,
            $role::Uring($s) => $body,
        }
    };
}

/// A listening socket owned by one worker's driver.
pub(crate) enum ListenerSource {
    /// On the epoll driver.
    Epoll(epoll::ListenerSource),
    /// On the io_uring driver.
    Uring(uring::ListenerSource),
}

impl ListenerSource {
    /// Wraps a listening socket.
    pub(crate) fn new(driver: &Driver, fd: OwnedFd) -> io::Result<ListenerSource> {
        Ok(match driver {
            Driver::Epoll(d) => ListenerSource::Epoll(epoll::ListenerSource::new(d, fd)?),
            Driver::Uring(d) => ListenerSource::Uring(uring::ListenerSource::new(d, fd)),
        })
    }

    /// The raw descriptor (for syscalls that never wait).
    pub(crate) fn fd(&self) -> RawFd {
        each!(ListenerSource, self, s => s.fd())
    }

    /// The descriptor, borrowed for as long as the source lives.
    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        each!(ListenerSource, self, s => s.as_fd())
    }

    /// Takes one connection, or parks the task until one comes.
    pub(crate) fn poll_accept(
        &self,
        cx: &mut TaskContext<'_>,
        mode: AcceptMode,
    ) -> Poll<io::Result<Accepted>> {
        match self {
            ListenerSource::Epoll(s) => s.poll_accept(cx, mode).map_ok(Accepted::Fd),
            ListenerSource::Uring(s) => s.poll_accept(cx, mode),
        }
    }

    /// Takes one connection only if one is ready now, never parking: for
    /// draining a listener's queue when a server stops.
    pub(crate) fn accept_now(&self, mode: AcceptMode) -> Option<io::Result<Accepted>> {
        match self {
            ListenerSource::Epoll(s) => s.accept_now(mode).map(|r| r.map(Accepted::Fd)),
            ListenerSource::Uring(s) => s.accept_now(mode),
        }
    }

    /// Ready once the driver holds no accept in the kernel for this
    /// listener (io_uring, after `set_accept_room(0)`; at once on epoll),
    /// so a socket another process also accepts on loses no connection to
    /// an accept nobody will take.
    pub(crate) fn poll_accept_settled(&self, cx: &mut TaskContext<'_>) -> Poll<()> {
        each!(ListenerSource, self, s => s.poll_accept_settled(cx))
    }

    /// Takes one connection the driver already accepted for this listener
    /// (io_uring's queue), never one from the socket's backlog.
    pub(crate) fn take_accepted(&self) -> Option<io::Result<Accepted>> {
        match self {
            ListenerSource::Epoll(s) => s.take_accepted().map(|r| r.map(Accepted::Fd)),
            ListenerSource::Uring(s) => s.take_accepted(),
        }
    }

    /// Sets how many connections the owner will take from now on
    /// (`usize::MAX`: all). The driver never accepts more than that ahead
    /// of the owner; the kernel's backlog holds the rest.
    pub(crate) fn set_accept_room(&self, room: usize) {
        each!(ListenerSource, self, s => s.set_accept_room(room))
    }
}

/// A connected (or connecting) byte-stream socket owned by one worker's
/// driver, closed when the last of its holders (the source, or an
/// operation the kernel still has) lets go.
pub(crate) enum StreamSource {
    /// On the epoll driver.
    Epoll(epoll::StreamSource),
    /// On the io_uring driver.
    Uring(uring::StreamSource),
}

impl StreamSource {
    /// Wraps a connected or connecting socket.
    pub(crate) fn new(driver: &Driver, fd: OwnedFd) -> io::Result<StreamSource> {
        Ok(match driver {
            Driver::Epoll(d) => StreamSource::Epoll(epoll::StreamSource::new(d, fd)?),
            Driver::Uring(d) => StreamSource::Uring(uring::StreamSource::new(d, fd)),
        })
    }

    /// A stream over a connection a listener of `driver` accepted. A
    /// direct socket of another driver (or of none: the driver is epoll)
    /// gets a plain descriptor first.
    pub(crate) fn from_accepted(driver: &Driver, accepted: Accepted) -> io::Result<StreamSource> {
        match (driver, accepted) {
            (_, Accepted::Fd(fd)) => StreamSource::new(driver, fd),
            (Driver::Uring(d), Accepted::Direct(s)) if std::rc::Rc::ptr_eq(d, s.driver()) => {
                Ok(StreamSource::Uring(uring::StreamSource::from_direct(s)))
            }
            (_, direct) => StreamSource::new(driver, direct.into_fd().map_err(|(e, _)| e)?),
        }
    }

    /// The raw descriptor (for syscalls that never wait). A direct
    /// io_uring socket gets a plain descriptor installed on first use.
    pub(crate) fn fd(&self) -> RawFd {
        each!(StreamSource, self, s => s.fd())
    }

    /// The descriptor, borrowed for as long as the source lives (for
    /// socket options through safe wrappers such as `socket2::SockRef`).
    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        each!(StreamSource, self, s => s.as_fd())
    }

    /// Receives into `buf` (from its start up to its capacity).
    pub(crate) async fn recv<B: IoBufMut>(&self, buf: B) -> BufResult<usize, B> {
        each!(StreamSource, self, s => s.recv(buf).await)
    }

    /// Sends the initialised bytes of `buf`; may send fewer.
    pub(crate) fn send<B: IoBuf>(&self, buf: B) -> SendOwned<'_, B> {
        match self {
            StreamSource::Epoll(s) => SendOwned::Epoll(s.send(buf)),
            StreamSource::Uring(s) => SendOwned::Uring(s.send(buf)),
        }
    }

    /// Sends the buffers in order in one call; may send fewer bytes than all.
    pub(crate) async fn send_vectored<B: IoBuf>(&self, bufs: Vec<B>) -> BufResult<usize, Vec<B>> {
        each!(StreamSource, self, s => s.send_vectored(bufs).await)
    }

    /// Connects a fresh non-blocking socket to `addr`.
    pub(crate) async fn connect(&self, addr: SocketAddr) -> io::Result<()> {
        each!(StreamSource, self, s => s.connect(addr).await)
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
        each!(StreamSource, self, s => s.send_file(file, offset, len).await)
    }

    /// Shuts down one or both directions of a connection.
    pub(crate) async fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        each!(StreamSource, self, s => s.shutdown(how).await)
    }

    /// Ready once the socket may have bytes to read (or an end or error to
    /// report); then [`StreamSource::try_recv`] says whether it has. Holds
    /// no buffer while it waits.
    pub(crate) fn poll_readable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        each!(StreamSource, self, s => s.poll_readable(cx))
    }

    /// Ready once a borrowed-slice write may take bytes without waiting
    /// (it may still find the socket full): on epoll once the socket is
    /// writable, on io_uring once the write-behind send in flight is done.
    pub(crate) fn poll_writable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        match self {
            StreamSource::Epoll(s) => s.poll_writable(cx),
            StreamSource::Uring(s) => s.poll_flush(cx),
        }
    }

    /// Receives into a borrowed slice without waiting;
    /// `ErrorKind::WouldBlock` when there is nothing.
    pub(crate) fn try_recv_slice(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `[u8]` and `[MaybeUninit<u8>]` share a layout, and the
        // backends write only initialised bytes, so `buf` stays initialised.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<MaybeUninit<u8>>(), buf.len())
        };
        self.try_recv(dst)
    }

    /// Drops what the stream keeps between writes (io_uring: the
    /// write-behind buffer) unless a write is in flight.
    #[cfg(feature = "hyper")]
    pub(crate) fn release_idle_buffers(&self) {
        each!(StreamSource, self, s => s.release_idle_buffers())
    }

    /// False when the last read drained the socket and nothing new has
    /// been signalled since: waiting first saves a syscall that would fail.
    pub(crate) fn may_read_now(&self) -> bool {
        each!(StreamSource, self, s => s.may_read_now())
    }

    /// Receives at most `buf.len()` bytes without waiting.
    /// `ErrorKind::WouldBlock` when there are none.
    pub(crate) fn try_recv(&self, buf: &mut [MaybeUninit<u8>]) -> io::Result<usize> {
        each!(StreamSource, self, s => s.try_recv(buf))
    }

    /// Receives into the spare capacity of `buf` without waiting, growing
    /// its length by what was received.
    pub(crate) fn try_recv_into(&self, buf: &mut Vec<u8>) -> io::Result<usize> {
        let n = self.try_recv(buf.spare_capacity_mut())?;
        // SAFETY: `try_recv` initialised the first `n` bytes of the spare capacity.
        unsafe { buf.set_len(buf.len() + n) };
        Ok(n)
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
            std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<MaybeUninit<u8>>(), buf.len())
        };
        self.poll_read_uninit(cx, dst)
    }

    /// Reads into a borrowed slice that may be uninitialised (a tokio
    /// `ReadBuf`'s or hyper's spare room, which need not be zeroed first);
    /// `Ok(n)` means the first `n` bytes of `buf` were written.
    pub(crate) fn poll_read_uninit(
        &self,
        cx: &mut TaskContext<'_>,
        buf: &mut [MaybeUninit<u8>],
    ) -> Poll<io::Result<usize>> {
        each!(StreamSource, self, s => s.poll_read_uninit(cx, buf))
    }

    /// Reads into the unfilled part of a tokio `ReadBuf` without zeroing
    /// it first (the `AsyncRead` impls: zeroing the caller's spare room on
    /// every read would cost more than the read's copy). Here, beside the
    /// backends, because its `unsafe` rests on what they promise.
    #[cfg(feature = "tokio-io")]
    pub(crate) fn poll_read_buf(
        &self,
        cx: &mut TaskContext<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // SAFETY: both backends write only initialised bytes into `dst`
        // and never de-initialise any, as `unfilled_mut` requires.
        let dst = unsafe { buf.unfilled_mut() };
        let n = std::task::ready!(self.poll_read_uninit(cx, dst))?;
        // SAFETY: `poll_read_uninit` returned `n`: it wrote the first `n`
        // bytes of the unfilled part.
        unsafe { buf.assume_init(n) };
        buf.advance(n);
        Poll::Ready(Ok(()))
    }

    /// Writes from a borrowed slice, for the poll-based I/O traits.
    pub(crate) fn poll_write_slice(
        &self,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        each!(StreamSource, self, s => s.poll_write_slices(cx, &[io::IoSlice::new(buf)]))
    }

    /// Writes several borrowed slices with one call, for the poll-based I/O traits.
    pub(crate) fn poll_write_slices(
        &self,
        cx: &mut TaskContext<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(StreamSource, self, s => s.poll_write_slices(cx, bufs))
    }

    /// Waits until every byte a borrowed-slice write accepted is in the
    /// kernel (io_uring writes behind; on epoll there is nothing to wait for).
    pub(crate) fn poll_flush(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        each!(StreamSource, self, s => s.poll_flush(cx))
    }
}

/// The future of [`StreamSource::send`], a named one per backend: every
/// answer a connection writes waits in it, inside the connection's future,
/// so it holds one state (the buffer, or the operation that owns it), not
/// the arguments and each nested `async fn`'s state besides (192 bytes
/// before, as nested `async fn`s).
#[must_use = "futures do nothing unless polled"]
pub(crate) enum SendOwned<'a, B: 'static> {
    /// On the epoll driver.
    Epoll(epoll::SendOwned<'a, B>),
    /// On the io_uring driver.
    Uring(uring::SendOwned<'a, B>),
}

impl<B: IoBuf> Future for SendOwned<'_, B> {
    type Output = BufResult<usize, B>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        // Both backends' futures are `Unpin`.
        match self.get_mut() {
            SendOwned::Epoll(f) => Pin::new(f).poll(cx),
            SendOwned::Uring(f) => Pin::new(f).poll(cx),
        }
    }
}

/// A datagram socket owned by one worker's driver.
pub(crate) enum DatagramSource {
    /// On the epoll driver.
    Epoll(epoll::DatagramSource),
    /// On the io_uring driver.
    Uring(uring::DatagramSource),
}

impl DatagramSource {
    /// Wraps a datagram socket: non-blocking on epoll, blocking on io_uring
    /// (so a receive operation waits in the kernel instead of failing with
    /// `EAGAIN`; the direct calls pass `MSG_DONTWAIT`).
    pub(crate) fn new(driver: &Driver, fd: OwnedFd) -> io::Result<DatagramSource> {
        sys::set_nonblocking(fd.as_raw_fd(), matches!(driver, Driver::Epoll(_)))?;
        Ok(match driver {
            Driver::Epoll(d) => DatagramSource::Epoll(epoll::DatagramSource::new(d, fd)?),
            Driver::Uring(d) => DatagramSource::Uring(uring::DatagramSource::new(d, fd)),
        })
    }

    /// The raw descriptor (for syscalls that never wait).
    pub(crate) fn fd(&self) -> RawFd {
        each!(DatagramSource, self, s => s.fd())
    }

    /// The descriptor, borrowed for as long as the source lives.
    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        each!(DatagramSource, self, s => s.as_fd())
    }

    /// Receives one datagram into `buf` (from its start up to its capacity),
    /// with what the kernel said about it.
    pub(crate) async fn recv_msg<B: IoBufMut>(&self, buf: B) -> BufResult<RecvMeta, B> {
        each!(DatagramSource, self, s => s.recv_msg(buf).await)
    }

    /// Sends the initialised bytes of `buf` as one datagram, or as a train
    /// of `meta.segment_size` datagrams (GSO).
    pub(crate) async fn send_msg<B: IoBuf>(&self, buf: B, meta: SendMeta) -> BufResult<usize, B> {
        each!(DatagramSource, self, s => s.send_msg(buf, meta).await)
    }

    /// Receives up to [`super::udp::BATCH_DATAGRAMS_MAX`] datagrams into
    /// borrowed buffers, one per buffer, or parks the task until one comes.
    pub(crate) fn poll_recv_batch(
        &self,
        cx: &mut TaskContext<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        each!(DatagramSource, self, s => s.poll_recv_batch(cx, bufs, meta))
    }

    /// Sends up to [`super::udp::BATCH_DATAGRAMS_MAX`] transmits from
    /// borrowed buffers, or parks the task until the socket has room.
    /// Returns how many the kernel took.
    pub(crate) fn poll_send_batch(
        &self,
        cx: &mut TaskContext<'_>,
        transmits: &[Transmit<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(DatagramSource, self, s => s.poll_send_batch(cx, transmits))
    }

    /// Sends one transmit now, or fails with `WouldBlock`; then
    /// [`DatagramSource::writable`] waits for room.
    pub(crate) fn try_send_one(&self, transmit: &Transmit<'_>) -> io::Result<usize> {
        each!(DatagramSource, self, s => s.try_send_one(transmit))
    }

    /// Waits until the socket may have room to send.
    pub(crate) async fn writable(&self) -> io::Result<()> {
        each!(DatagramSource, self, s => s.writable().await)
    }

    /// True once the socket's receives take from an io_uring multishot
    /// `RECVMSG` (never on epoll).
    pub(crate) fn receives_from_ring(&self) -> bool {
        matches!(self, DatagramSource::Uring(s) if s.receives_from_ring())
    }
}

/// A descriptor whose I/O is made elsewhere (a pidfd; a Unix datagram
/// socket through std's non-blocking calls): the driver only says when to
/// try again.
pub(crate) enum ReadinessSource {
    /// On the epoll driver.
    Epoll(epoll::ReadinessSource),
    /// On the io_uring driver.
    Uring(uring::ReadinessSource),
}

impl ReadinessSource {
    /// Wraps a descriptor as it is (its blocking mode unchanged).
    pub(crate) fn new(driver: &Driver, fd: OwnedFd) -> io::Result<ReadinessSource> {
        Ok(match driver {
            Driver::Epoll(d) => ReadinessSource::Epoll(epoll::ReadinessSource::new(d, fd)?),
            Driver::Uring(d) => ReadinessSource::Uring(uring::ReadinessSource::new(d, fd)),
        })
    }

    /// The descriptor, borrowed for as long as the source lives.
    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        each!(ReadinessSource, self, s => s.as_fd())
    }

    /// Ready when the descriptor next polls readable: for a pidfd,
    /// readable once its process has exited. It never answers from
    /// remembered readiness, since its caller has just looked and found
    /// nothing: epoll waits for the next event (registration reports a
    /// descriptor readable already), io_uring keeps a one-shot `POLL_ADD`
    /// across polls.
    pub(crate) fn poll_next_readable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        each!(ReadinessSource, self, s => s.poll_next_readable(cx))
    }

    /// Ready when the descriptor next polls writable; as
    /// [`ReadinessSource::poll_next_readable`], never from remembered
    /// readiness.
    pub(crate) async fn next_writable(&self) -> io::Result<()> {
        match self {
            ReadinessSource::Epoll(s) => std::future::poll_fn(|cx| s.poll_next_writable(cx)).await,
            ReadinessSource::Uring(s) => s.next_writable().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::mem::size_of;

    use super::*;

    /// Every idle connection holds a stream source: its size is watched.
    /// (Before the sources were split by role: 128 bytes on io_uring, 24
    /// on epoll.)
    #[test]
    fn a_stream_source_stays_small() {
        assert!(size_of::<epoll::StreamSource>() <= 24, "{}", size_of::<epoll::StreamSource>());
        assert!(size_of::<uring::StreamSource>() <= 40, "{}", size_of::<uring::StreamSource>());
        assert!(size_of::<StreamSource>() <= 40, "{}", size_of::<StreamSource>());
    }

    /// A connection's future holds a send while it writes, and is as
    /// large as its largest state: the send's size is watched (56 bytes
    /// when the io_uring send kept its operation's driver).
    #[test]
    fn an_owned_send_stays_small() {
        type Send = SendOwned<'static, std::sync::Arc<[u8]>>;
        assert!(size_of::<Send>() <= 48, "{}", size_of::<Send>());
    }
}
