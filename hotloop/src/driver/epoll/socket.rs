//! A socket on the epoll driver and its operations: try the syscall, and
//! only when it would block, register (once) and park.

use std::cell::Cell;
use std::future::poll_fn;
use std::io;
use std::mem::ManuallyDrop;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use super::{bit, Driver, HANGUP};
use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::driver::{not_running, AcceptMode, Direction, Registration};
use crate::slab::Key;
use crate::sys;

/// A socket owned by one epoll driver, closed when dropped.
///
/// It remembers its registration, made lazily the first time an operation
/// has to wait (or at once in eager mode, and always for listeners), kept
/// until close.
pub(crate) struct Source {
    /// Taken out and closed by `Drop`.
    fd: ManuallyDrop<OwnedFd>,
    driver: Rc<Driver>,
    /// The epoll slot, once registered.
    token: Cell<Option<Key>>,
}

impl Source {
    /// Wraps a socket; in eager mode, registers it now.
    pub(crate) fn new(driver: &Rc<Driver>, fd: OwnedFd) -> io::Result<Source> {
        let src =
            Source { fd: ManuallyDrop::new(fd), driver: driver.clone(), token: Cell::new(None) };
        if driver.registration == Registration::Eager {
            src.register()?;
        }
        Ok(src)
    }

    /// Wraps a listening socket, which always ends up waiting: registers it now.
    pub(crate) fn new_listener(driver: &Rc<Driver>, fd: OwnedFd) -> io::Result<Source> {
        let src =
            Source { fd: ManuallyDrop::new(fd), driver: driver.clone(), token: Cell::new(None) };
        src.register()?;
        Ok(src)
    }

    fn register(&self) -> io::Result<Key> {
        let key = self.driver.poller.borrow_mut().register(self.fd.as_raw_fd())?;
        self.token.set(Some(key));
        Ok(key)
    }

    /// The raw descriptor.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The descriptor, borrowed.
    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// True unless the socket is registered and the last operation in
    /// `dir` drained it with no event since.
    pub(super) fn is_ready(&self, dir: Direction) -> bool {
        match self.token.get() {
            None => true,
            Some(key) => self.driver.poller.borrow_mut().slot(key).ready & bit(dir) != 0,
        }
    }

    /// Records that an operation in `dir` drained the socket (sticky after a hang-up).
    pub(super) fn clear_ready(&self, dir: Direction) {
        if let Some(key) = self.token.get() {
            let mut poller = self.driver.poller.borrow_mut();
            let slot = poller.slot(key);
            if slot.ready & HANGUP == 0 {
                slot.ready &= !bit(dir);
            }
        }
    }

    /// Parks the task until the socket is ready in `dir`, registering it
    /// first if this is its first wait.
    fn park<R>(&self, cx: &mut TaskContext<'_>, dir: Direction) -> Poll<io::Result<R>> {
        if !self.driver.entered.get() {
            return Poll::Ready(Err(not_running()));
        }
        let key = match self.token.get() {
            Some(k) => k,
            None => match self.register() {
                Ok(k) => k,
                Err(e) => return Poll::Ready(Err(e)),
            },
        };
        let mut poller = self.driver.poller.borrow_mut();
        let slot = poller.slot(key);
        if slot.ready & HANGUP == 0 {
            slot.ready &= !bit(dir);
        }
        match dir {
            Direction::Read => slot.readers.park(cx.waker()),
            Direction::Write => slot.writers.park(cx.waker()),
        }
        Poll::Pending
    }

    /// Ready once an event said the socket is ready in `dir` and no
    /// operation has drained it since; parks otherwise. An unregistered
    /// socket parks (and so registers): its caller just saw it would block.
    pub(super) fn poll_ready(
        &self,
        cx: &mut TaskContext<'_>,
        dir: Direction,
    ) -> Poll<io::Result<()>> {
        match self.token.get() {
            Some(_) if self.is_ready(dir) => Poll::Ready(Ok(())),
            _ => self.park(cx, dir),
        }
    }

    /// Runs `op` until it stops returning `WouldBlock`, parking in between.
    pub(super) fn poll_io<R>(
        &self,
        cx: &mut TaskContext<'_>,
        dir: Direction,
        mut op: impl FnMut() -> io::Result<R>,
    ) -> Poll<io::Result<R>> {
        // Registered and drained in this direction: wait for the next edge
        // without a syscall that would only say EAGAIN.
        if !self.is_ready(dir) {
            return self.park(cx, dir);
        }
        loop {
            match op() {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                r => return Poll::Ready(r),
            }
        }
        // The socket has nothing for us: only now does it need to be registered.
        self.park(cx, dir)
    }

    /// [`Source::poll_io`] for reads and writes of `asked` bytes: one that
    /// moves fewer bytes drained the socket's queue (or filled its send
    /// buffer), so the next one waits for an edge instead of trying.
    fn poll_io_bytes(
        &self,
        cx: &mut TaskContext<'_>,
        dir: Direction,
        asked: usize,
        op: impl FnMut() -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        let polled = self.poll_io(cx, dir, op);
        if let Poll::Ready(Ok(n)) = polled {
            if n > 0 && n < asked {
                self.clear_ready(dir);
            }
        }
        polled
    }

    /// Sends up to `len` bytes of `file` from `offset` with `sendfile(2)`,
    /// waiting for room when the socket has none; stops early at the
    /// file's end (a `sendfile` that returns 0). Returns the bytes sent,
    /// and the error that stopped it before `len`, if one did.
    pub(crate) async fn send_file(
        &self,
        file: &std::fs::File,
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
            match self.poll_io(cx, Direction::Write, || {
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
    pub(crate) async fn recv<B: IoBufMut>(&self, mut buf: B) -> BufResult<usize, B> {
        let fd = self.fd();
        let res = poll_fn(|cx| {
            let asked = buf.bytes_total();
            self.poll_io_bytes(cx, Direction::Read, asked, || {
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

    /// Sends the initialised bytes of `buf`; may send fewer.
    pub(crate) async fn send<B: IoBuf>(&self, buf: B) -> BufResult<usize, B> {
        let fd = self.fd();
        let res = poll_fn(|cx| {
            self.poll_io_bytes(cx, Direction::Write, buf.bytes_init(), || {
                // SAFETY: the buffer is owned by this future and has `bytes_init` readable bytes.
                unsafe { sys::send(fd, buf.stable_ptr(), buf.bytes_init()) }
            })
        })
        .await;
        (res, buf)
    }

    /// Sends the buffers in order in one call; may send fewer bytes than all.
    pub(crate) async fn send_vectored<B: IoBuf>(&self, bufs: Vec<B>) -> BufResult<usize, Vec<B>> {
        let fd = self.fd();
        let iov = crate::buf::iovecs(&bufs);
        let total: usize = iov.iter().map(|v| v.iov_len).sum();
        let res = poll_fn(|cx| {
            self.poll_io_bytes(cx, Direction::Write, total, || {
                // SAFETY: each iovec describes one of `bufs`, owned by this future until it returns.
                unsafe { sys::sendmsg(fd, &iov) }
            })
        })
        .await;
        (res, bufs)
    }

    /// Connects a fresh non-blocking socket to `addr`.
    pub(crate) async fn connect(&self, addr: SocketAddr) -> io::Result<()> {
        match socket2::SockRef::from(&*self.fd).connect(&socket2::SockAddr::from(addr)) {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(e),
        }
        // Writable means the handshake ended; SO_ERROR says how.
        let fd = self.fd();
        poll_fn(|cx| {
            self.poll_io(cx, Direction::Write, || {
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
    pub(crate) async fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        sys::shutdown(self.fd(), how)
    }

    /// The poll form of [`Source::readable`].
    pub(crate) fn poll_readable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        self.poll_ready(cx, Direction::Read)
    }

    /// Parks until the next read event (see [`crate::driver::Source::poll_next_readable`]).
    pub(crate) fn poll_next_readable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        self.poll_next(cx, Direction::Read)
    }

    /// Parks until the next write event.
    pub(crate) fn poll_next_writable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        self.poll_next(cx, Direction::Write)
    }

    fn poll_next(&self, cx: &mut TaskContext<'_>, dir: Direction) -> Poll<io::Result<()>> {
        if self.token.get().is_some() && self.is_ready(dir) {
            // An event came since the last wait: consume it.
            self.clear_ready(dir);
            return Poll::Ready(Ok(()));
        }
        self.park(cx, dir)
    }

    /// False when the last read drained the socket and no event came since.
    pub(crate) fn may_read_now(&self) -> bool {
        self.is_ready(Direction::Read)
    }

    /// Receives without waiting; a short read or `WouldBlock` records that
    /// the socket is drained.
    pub(crate) fn try_recv(&self, buf: &mut [MaybeUninit<u8>]) -> io::Result<usize> {
        // SAFETY: `buf` is a live slice of `len` writable bytes for the duration of the call.
        let res = unsafe { sys::recv_nowait(self.fd(), buf.as_mut_ptr().cast(), buf.len()) };
        match &res {
            Ok(n) if *n > 0 && *n < buf.len() => self.clear_ready(Direction::Read),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.clear_ready(Direction::Read),
            _ => {}
        }
        res
    }

    /// Takes one connection, or parks the task until one comes. Every
    /// accept mode is one `accept4` per connection on epoll.
    pub(crate) fn poll_accept(
        &self,
        cx: &mut TaskContext<'_>,
        _mode: AcceptMode,
    ) -> Poll<io::Result<OwnedFd>> {
        self.poll_io(cx, Direction::Read, || sys::accept(self.fd()))
    }

    /// Takes one connection only if one is ready now.
    pub(crate) fn accept_now(&self, _mode: AcceptMode) -> Option<io::Result<OwnedFd>> {
        // Straight to the syscall: an edge for a connection that just came
        // in may not have been polled yet.
        match sys::accept(self.fd()) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            other => Some(other),
        }
    }

    /// Nothing to do on epoll: a connection is accepted only when asked
    /// for, so the kernel's backlog holds the rest already.
    pub(crate) fn set_accept_room(&self, _room: usize) {}

    /// Reads into a borrowed slice that may be uninitialised; `Ok(n)`
    /// means its first `n` bytes were written.
    pub(crate) fn poll_read_uninit(
        &self,
        cx: &mut TaskContext<'_>,
        buf: &mut [MaybeUninit<u8>],
    ) -> Poll<io::Result<usize>> {
        let fd = self.fd();
        let asked = buf.len();
        // SAFETY: `buf` is a live, writable slice of `asked` bytes for the
        // duration of the call; `recv` writes only initialised bytes.
        self.poll_io_bytes(cx, Direction::Read, asked, || unsafe {
            sys::recv(fd, buf.as_mut_ptr().cast(), asked)
        })
    }

    /// Writes several borrowed slices with one `sendmsg`.
    pub(crate) fn poll_write_slices(
        &self,
        cx: &mut TaskContext<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let fd = self.fd();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if bufs.len() == 1 {
            let buf = &bufs[0];
            // SAFETY: `buf` is a live, readable slice for the duration of the call.
            return self.poll_io_bytes(cx, Direction::Write, total, || unsafe {
                sys::send(fd, buf.as_ptr(), buf.len())
            });
        }
        // SAFETY: std documents `IoSlice` as ABI-compatible with `iovec` on Unix.
        let iov: &[libc::iovec] =
            unsafe { std::slice::from_raw_parts(bufs.as_ptr().cast(), bufs.len()) };
        // SAFETY: every iovec describes one of `bufs`, live for the duration of the call.
        self.poll_io_bytes(cx, Direction::Write, total, || unsafe { sys::sendmsg(fd, iov) })
    }

    /// Nothing is buffered in user space on epoll: a write that returned is in the kernel.
    pub(crate) fn poll_flush(&self, _cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        // Closing the descriptor removes it from epoll's interest list;
        // events already queued for it carry a key that is stale from here
        // on and are dropped.
        if let Ok(mut poller) = self.driver.poller.try_borrow_mut() {
            poller.release(self.token.get());
        }
        // SAFETY: `fd` is taken once, here, and the source is not used again.
        let fd = unsafe { ManuallyDrop::take(&mut self.fd) };
        sys::close(fd);
    }
}
