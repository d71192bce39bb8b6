//! A byte-stream socket on the epoll driver and its operations: try the
//! syscall, and only when it would block, register (once) and park.

use std::future::{poll_fn, Future};
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use super::source::SourceCore;
use super::{Direction, Driver};
use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::coop;
use crate::driver::contract::StreamOps;
use crate::sys;

/// A connected (or connecting) stream socket owned by one epoll driver,
/// closed when dropped.
pub(crate) struct StreamSource {
    core: SourceCore,
}

impl StreamSource {
    /// Wraps a socket; in eager mode, registers it now.
    pub(crate) fn new(driver: &Rc<Driver>, fd: OwnedFd) -> io::Result<StreamSource> {
        Ok(StreamSource { core: SourceCore::new(driver, fd)? })
    }

    /// Gives the descriptor up, open and out of the interest list: the
    /// kernel holds every byte not yet read, so nothing else is owed.
    pub(crate) fn into_fd(self) -> Result<OwnedFd, (StreamSource, io::Error)> {
        self.core.into_fd().map_err(|(core, e)| (StreamSource { core }, e))
    }

    /// Sends the initialised bytes of `buf`; may send fewer.
    pub(crate) fn send<B: IoBuf>(&self, buf: B) -> SendOwned<'_, B> {
        SendOwned { src: self, buf: Some(buf) }
    }
}

impl StreamOps for StreamSource {
    /// The raw descriptor.
    fn fd(&self) -> RawFd {
        self.core.fd()
    }

    /// The descriptor, borrowed.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.core.as_fd()
    }

    /// The descriptor, borrowed (always there on epoll).
    fn try_as_fd(&self) -> io::Result<BorrowedFd<'_>> {
        Ok(self.core.as_fd())
    }

    /// The plain descriptor (an epoll socket has no other).
    fn ids_now(&self) -> (Option<RawFd>, Option<u32>) {
        (Some(self.core.fd()), None)
    }

    /// Sends up to `len` bytes of `file` from `offset` with `sendfile(2)`,
    /// waiting for room when the socket has none; stops early at the
    /// file's end (a `sendfile` that returns 0). Returns the bytes sent,
    /// and the error that stopped it before `len`, if one did.
    async fn send_file(
        &self,
        file: &std::sync::Arc<std::fs::File>,
        offset: u64,
        len: u64,
    ) -> (u64, io::Result<()>) {
        use std::os::fd::AsRawFd;
        let (sock, file) = (self.fd(), file.as_raw_fd());
        let mut sent = 0u64;
        let res = poll_fn(|cx| loop {
            if sent >= len {
                return Poll::Ready(Ok(()));
            }
            let want = usize::try_from(len - sent).unwrap_or(usize::MAX);
            // A short count may mean the file ended rather than a full
            // socket: the next call tells (0, or `EAGAIN`), so readiness is
            // not cleared here.
            match self.core.poll_io(cx, Direction::Write, || {
                sys::sendfile(sock, file, offset.saturating_add(sent), want)
            }) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(n)) => sent += n as u64,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        })
        .await;
        (sent, res)
    }

    /// Receives into `buf` (from its start up to its capacity).
    async fn recv<B: IoBufMut>(&self, mut buf: B) -> BufResult<usize, B> {
        let fd = self.fd();
        let res = poll_fn(|cx| {
            let asked = buf.bytes_total();
            self.core.poll_io_bytes(cx, Direction::Read, asked, || {
                // SAFETY: the buffer is owned by this future and has `bytes_total` writable bytes.
                unsafe { sys::recv(fd, buf.stable_mut_ptr(), asked) }
            })
        })
        .await;
        if let Ok(n) = res {
            // SAFETY: the kernel wrote `n` bytes at the start of the buffer.
            unsafe { buf.set_init(n) };
        }
        (res, buf)
    }

    /// Sends the buffers in order in one call; may send fewer bytes than all.
    async fn send_vectored<B: IoBuf>(&self, bufs: Vec<B>) -> BufResult<usize, Vec<B>> {
        let fd = self.fd();
        let iov = crate::buf::iovecs(&bufs);
        let total: usize = iov.iter().map(|v| v.iov_len).sum();
        let res = poll_fn(|cx| {
            self.core.poll_io_bytes(cx, Direction::Write, total, || {
                // SAFETY: each iovec describes one of `bufs`, owned by this future until it returns.
                unsafe { sys::sendmsg(fd, &iov) }
            })
        })
        .await;
        (res, bufs)
    }

    /// Connects a fresh non-blocking socket to `addr`.
    async fn connect(&self, addr: SocketAddr) -> io::Result<()> {
        match socket2::SockRef::from(&self.as_fd()).connect(&socket2::SockAddr::from(addr)) {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(e),
        }
        // Writable means the handshake ended; SO_ERROR says how.
        let fd = self.fd();
        poll_fn(|cx| {
            self.core.poll_io(cx, Direction::Write, || {
                match sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR)? {
                    0 => match sys::peer_addr(fd) {
                        Ok(_) => Ok(()),
                        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                            Err(io::ErrorKind::WouldBlock.into())
                        }
                        Err(e) => Err(e),
                    },
                    errno => Err(io::Error::from_raw_os_error(errno)),
                }
            })
        })
        .await
    }

    /// Shuts down one or both directions (`shutdown(2)` never blocks).
    async fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        sys::shutdown(self.fd(), how)
    }

    /// Ready once the socket may have bytes to read: at once unless the
    /// last read drained it and no event came since.
    fn poll_readable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        self.core.poll_ready(cx, Direction::Read)
    }

    /// Ready once the socket may take bytes: at once unless the last write
    /// found it full and no event came since (a socket no write has found
    /// full is taken as writable, unregistered).
    fn poll_writable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        if self.core.is_ready(Direction::Write) {
            return coop::poll_budgeted(cx, |_| Poll::Ready(Ok(())));
        }
        self.core.poll_ready(cx, Direction::Write)
    }

    /// Keeps nothing between writes: poll-form writes go straight to the
    /// socket.
    #[cfg(feature = "hyper")]
    fn release_idle_buffers(&self) {}

    /// False when the last read drained the socket and no event came since.
    fn may_read_now(&self) -> bool {
        self.core.is_ready(Direction::Read)
    }

    /// Receives without waiting; a short read or `WouldBlock` records that
    /// the socket is drained.
    fn try_recv(&self, buf: &mut [MaybeUninit<u8>]) -> io::Result<usize> {
        // SAFETY: `buf` is a live slice of `len` writable bytes for the duration of the call.
        let res = unsafe { sys::recv_nowait(self.fd(), buf.as_mut_ptr().cast(), buf.len()) };
        match &res {
            Ok(n) if *n > 0 && *n < buf.len() => self.core.clear_ready(Direction::Read),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.core.clear_ready(Direction::Read)
            }
            _ => {}
        }
        res
    }

    /// Reads into a borrowed slice that may be uninitialised; `Ok(n)`
    /// means its first `n` bytes were written.
    fn poll_read_uninit(
        &self,
        cx: &mut TaskContext<'_>,
        buf: &mut [MaybeUninit<u8>],
    ) -> Poll<io::Result<usize>> {
        let fd = self.fd();
        let asked = buf.len();
        // SAFETY: `buf` is a live, writable slice of `asked` bytes for the
        // duration of the call; `recv` writes only initialised bytes.
        self.core.poll_io_bytes(cx, Direction::Read, asked, || unsafe {
            sys::recv(fd, buf.as_mut_ptr().cast(), asked)
        })
    }

    /// Writes several borrowed slices with one `sendmsg`.
    fn poll_write_slices(
        &self,
        cx: &mut TaskContext<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let fd = self.fd();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if bufs.len() == 1 {
            let buf = &bufs[0];
            // SAFETY: `buf` is a live, readable slice for the duration of the call.
            return self.core.poll_io_bytes(cx, Direction::Write, total, || unsafe {
                sys::send(fd, buf.as_ptr(), buf.len())
            });
        }
        // SAFETY: std documents `IoSlice` as ABI-compatible with `iovec` on Unix.
        let iov: &[libc::iovec] =
            unsafe { std::slice::from_raw_parts(bufs.as_ptr().cast(), bufs.len()) };
        // SAFETY: every iovec describes one of `bufs`, live for the duration of the call.
        self.core.poll_io_bytes(cx, Direction::Write, total, || unsafe { sys::sendmsg(fd, iov) })
    }

    /// The poll form with a waker that wakes nobody: it records the
    /// socket's readiness as the poll form does, and the slot parks it
    /// beside any task waiting to write, never in its place.
    fn try_write_slices(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let mut cx = TaskContext::from_waker(std::task::Waker::noop());
        // A try answers now: the budget, whose refusal would wake nobody, does not apply.
        match coop::exempt(|| self.poll_write_slices(&mut cx, bufs)) {
            Poll::Ready(res) => res,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Nothing is buffered in user space on epoll: a write that returned is in the kernel.
    fn poll_flush(&self, _cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The future of [`StreamSource::send`]: the socket and the buffer, and
/// nothing else (the readiness a wait needs is in the socket's slot), so
/// a connection waiting to write holds 24 bytes here.
#[must_use = "futures do nothing unless polled"]
pub(crate) struct SendOwned<'a, B> {
    src: &'a StreamSource,
    /// `None` once the future returned it.
    buf: Option<B>,
}

// The buffer is never pinned: the kernel reads only its heap bytes, during
// the call.
impl<B> Unpin for SendOwned<'_, B> {}

impl<B: IoBuf> Future for SendOwned<'_, B> {
    type Output = BufResult<usize, B>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let buf = this.buf.as_ref().expect("a send polled after it completed");
        let (fd, ptr, len) = (this.src.fd(), buf.stable_ptr(), buf.bytes_init());
        let res = std::task::ready!(this.src.core.poll_io_bytes(cx, Direction::Write, len, || {
            // SAFETY: the buffer is owned by this future and has `len` readable bytes at `ptr`.
            unsafe { sys::send(fd, ptr, len) }
        }));
        Poll::Ready((res, this.buf.take().expect("taken only here")))
    }
}
