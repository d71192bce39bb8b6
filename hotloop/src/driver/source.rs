//! Sockets on a driver, one type per role: a listener, a byte stream, a
//! datagram socket, and a descriptor the driver only watches. Each is an
//! enum over the backends' sources of the same role, matched once per
//! operation.
//!
//! The calls each role forwards to its backend are generated from the
//! role's list in `contract.rs` (the same list makes the trait each
//! backend implements); written here by hand are only the constructors,
//! the accepts (io_uring's may hand back a direct descriptor, epoll's a
//! plain one, so each backend returns its own type),
//! a stream's `into_fd` (it consumes the source, and a refusal hands it
//! back), the owned `send` with its named future, and the calls made of
//! other calls, the same on every backend (the borrowed-slice forms).
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
use super::contract::{
    datagram_calls, define_face, listener_calls, readiness_calls, stream_calls, DatagramOps,
    ListenerOps, ReadinessOps, StreamOps,
};
use super::udp::{RecvMeta, SendMeta, Transmit};
use super::{epoll, uring, Accepted, Driver};
use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::sys;

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

    /// Takes one connection the driver already accepted for this listener
    /// (io_uring's queue), never one from the socket's backlog.
    pub(crate) fn take_accepted(&self) -> Option<io::Result<Accepted>> {
        match self {
            ListenerSource::Epoll(s) => s.take_accepted().map(|r| r.map(Accepted::Fd)),
            ListenerSource::Uring(s) => s.take_accepted(),
        }
    }
}

// Every call of the role's contract, forwarded to the backend in use.
listener_calls!(define_face);

/// A look into a stream socket's kernel queues, made from its source and
/// used later, beside a read that borrows the source.
pub(crate) enum StreamProbe {
    /// The descriptor of an epoll stream (a look after the stream closed
    /// fails with `EBADF`, or looks into whatever took the number).
    Epoll(RawFd),
    /// An io_uring stream, held weakly.
    Uring(uring::StreamProbe),
}

impl StreamProbe {
    /// True if the peer has sent bytes (or its end) that nobody has read.
    pub(crate) fn input_pending(&self) -> io::Result<bool> {
        match self {
            StreamProbe::Epoll(fd) => sys::input_pending(*fd),
            StreamProbe::Uring(p) => p.input_pending(),
        }
    }

    /// How long ago the peer's last data arrived, as the kernel counts it
    /// (see [`sys::tcp_since_data_received`]).
    pub(crate) fn since_data_received(&self) -> io::Result<std::time::Duration> {
        match self {
            StreamProbe::Epoll(fd) => sys::tcp_since_data_received(*fd),
            StreamProbe::Uring(p) => p.since_data_received(),
        }
    }

    /// How long ago the peer's last acknowledgement arrived (see
    /// [`sys::tcp_since_ack_received`]).
    pub(crate) fn since_ack_received(&self) -> io::Result<std::time::Duration> {
        match self {
            StreamProbe::Epoll(fd) => sys::tcp_since_ack_received(*fd),
            StreamProbe::Uring(p) => p.since_ack_received(),
        }
    }

    /// The bytes written to the socket that the peer has not acknowledged
    /// (see [`sys::unacknowledged_output`]).
    pub(crate) fn unacknowledged_output(&self) -> io::Result<usize> {
        match self {
            StreamProbe::Epoll(fd) => sys::unacknowledged_output(*fd),
            StreamProbe::Uring(p) => p.unacknowledged_output(),
        }
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

    /// Tells the source its socket is a Unix stream (on io_uring: never
    /// written behind, never sent zero-copy; see `uring/write_behind.rs`).
    pub(crate) fn mark_unix(&mut self) {
        if let StreamSource::Uring(s) = self {
            s.mark_unix();
        }
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

    /// Gives the descriptor up, open, out of this driver, once nothing the
    /// driver holds on it can take a byte the next owner should read; on a
    /// refusal the source comes back as it was (see the backends'
    /// `into_fd`).
    pub(crate) async fn into_fd(self) -> Result<OwnedFd, (StreamSource, io::Error)> {
        match self {
            StreamSource::Epoll(s) => s.into_fd().map_err(|(s, e)| (StreamSource::Epoll(s), e)),
            StreamSource::Uring(s) => {
                s.into_fd().await.map_err(|(s, e)| (StreamSource::Uring(s), e))
            }
        }
    }

    /// Shuts the socket down (`how`) at once: `shutdown(2)` never blocks
    /// (a direct io_uring socket runs a ring entry instead, rather than
    /// get a descriptor for it).
    pub(crate) fn shutdown_now(&self, how: std::net::Shutdown) -> io::Result<()> {
        match self {
            StreamSource::Epoll(s) => sys::shutdown(s.fd(), how),
            StreamSource::Uring(s) => s.shutdown_now(how),
        }
    }

    /// Sets `SO_LINGER` where the socket has no descriptor (a direct
    /// io_uring socket: a ring entry, so that no descriptor has to be
    /// installed for it); `None`: set it through the descriptor.
    pub(crate) fn set_linger_direct(
        &self,
        linger: Option<std::time::Duration>,
    ) -> Option<io::Result<()>> {
        match self {
            StreamSource::Epoll(_) => None,
            StreamSource::Uring(s) => s.set_linger_direct(linger),
        }
    }

    /// Shuts the write side once the bytes the poll-form writes took are
    /// sent, without waiting for them here (io_uring hands a send in
    /// flight to the driver, bounded by its send deadline; epoll holds
    /// none, and shuts down at once).
    pub(crate) fn shut_write_when_sent(&self) -> io::Result<()> {
        match self {
            StreamSource::Epoll(s) => sys::shutdown(s.fd(), std::net::Shutdown::Write),
            StreamSource::Uring(s) => s.shut_write_when_sent(),
        }
    }

    /// True if the driver holds bytes (or the end) of the peer's that no
    /// read has taken (io_uring's receive queue; epoll holds none).
    pub(crate) fn holds_input(&self) -> bool {
        match self {
            StreamSource::Epoll(_) => false,
            StreamSource::Uring(s) => s.holds_input(),
        }
    }

    /// A probe of the socket's kernel receive queue that does not hold
    /// the socket (a direct io_uring socket gets a plain descriptor only
    /// when the probe is used).
    pub(crate) fn probe(&self) -> StreamProbe {
        match self {
            StreamSource::Epoll(s) => StreamProbe::Epoll(s.fd()),
            StreamSource::Uring(s) => StreamProbe::Uring(s.probe()),
        }
    }

    /// Sends the initialised bytes of `buf`; may send fewer.
    pub(crate) fn send<B: IoBuf>(&self, buf: B) -> SendOwned<'_, B> {
        match self {
            StreamSource::Epoll(s) => SendOwned::Epoll(s.send(buf)),
            StreamSource::Uring(s) => SendOwned::Uring(s.send(buf)),
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
        self.poll_write_slices(cx, &[io::IoSlice::new(buf)])
    }
}

// Every call of the role's contract, forwarded to the backend in use.
stream_calls!(define_face);

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
}

// Every call of the role's contract, forwarded to the backend in use.
datagram_calls!(define_face);

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
}

// Every call of the role's contract, forwarded to the backend in use.
readiness_calls!(define_face);

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
