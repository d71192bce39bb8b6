//! A socket on the io_uring driver and its operations, each a ring entry
//! that owns its buffer and its socket until its last completion.

use std::cell::{Cell, RefCell};
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use io_uring::{opcode, types};

use super::op::{is_retry, Op};
use super::write_behind::{Sock, WriteBehind};
use super::{Driver, SharedFd};
use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::driver::{not_running, AcceptMode};
use crate::slab::Key;
use crate::sys;

/// A socket owned by one io_uring driver. Its descriptor closes when the
/// source and every operation the kernel still holds on it are gone.
pub(crate) struct Source {
    pub(super) fd: SharedFd,
    pub(super) driver: Rc<Driver>,
    /// The accept queue, once the socket has been accepted on.
    listener: Cell<Option<Key>>,
    /// How many connections the owner will take (see `set_accept_room`).
    accept_room: Cell<usize>,
    /// The receive queue of the multishot receive behind pooled reads,
    /// once the socket has been read that way (with a buffer ring).
    stream: Cell<Option<Key>>,
    /// True when the last non-blocking read drained the socket: the next
    /// pooled read waits for readiness first instead of a `recv` that
    /// would fail (as epoll's readiness bit does).
    drained: Cell<bool>,
    /// Without a buffer ring: the `POLL_ADD` a read waits on, kept across
    /// polls of the poll-form reads.
    read_wait: RefCell<Option<Op<()>>>,
    /// The write-behind buffer of the borrowed-slice writes, made on first use.
    write_behind: RefCell<Option<Box<WriteBehind>>>,
    /// The readiness polls of a datagram socket's borrowed forms, made on first use.
    pub(super) datagram: RefCell<Option<Box<super::udp::DatagramWaits>>>,
}

impl Source {
    /// Wraps a connected or connecting socket.
    pub(crate) fn new(driver: &Rc<Driver>, fd: OwnedFd) -> io::Result<Source> {
        Ok(Source {
            fd: Rc::new(fd),
            driver: driver.clone(),
            listener: Cell::new(None),
            accept_room: Cell::new(usize::MAX),
            stream: Cell::new(None),
            drained: Cell::new(false),
            read_wait: RefCell::new(None),
            write_behind: RefCell::new(None),
            datagram: RefCell::new(None),
        })
    }

    /// Wraps a listening socket.
    pub(crate) fn new_listener(driver: &Rc<Driver>, fd: OwnedFd) -> io::Result<Source> {
        Self::new(driver, fd)
    }

    /// The raw descriptor.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The descriptor, borrowed (the source's own reference keeps it open).
    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Queues `entry` with `data` as its storage.
    ///
    /// # Safety
    /// As [`Op::submit`]: every pointer in `entry` points into `data`'s
    /// stable heap memory (or nowhere), valid for the access made.
    pub(super) unsafe fn submit<T: 'static>(
        &self,
        entry: io_uring::squeue::Entry,
        data: T,
    ) -> Result<Op<T>, (io::Error, T)> {
        // SAFETY: forwarded from the caller; `self.fd` is the socket `entry` names.
        unsafe { Op::submit(&self.driver, &self.fd, entry, data) }
    }

    fn raw(&self) -> types::Fd {
        types::Fd(self.fd.as_raw_fd())
    }

    /// Receives into `buf` (from its start up to its capacity).
    ///
    /// Through the socket's one receive path, as every read style is
    /// ([`Source::poll_read_uninit`]): a read dropped while it waits has
    /// taken no bytes, and bytes another style queued come first.
    pub(crate) async fn recv<B: IoBufMut>(&self, mut buf: B) -> BufResult<usize, B> {
        let total = buf.bytes_total();
        let res = std::future::poll_fn(|cx| {
            // SAFETY: the buffer has `bytes_total` writable bytes at a fixed address, and it is
            // only written through this slice, within this poll.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(
                    buf.stable_mut_ptr().cast::<MaybeUninit<u8>>(),
                    total,
                )
            };
            self.poll_read_uninit(cx, dst)
        })
        .await;
        if let Ok(n) = res {
            // SAFETY: `poll_read_uninit` initialised the first `n` bytes.
            unsafe { buf.set_init(n) };
        }
        (res, buf)
    }

    /// Sends the initialised bytes of `buf`; may send fewer.
    pub(crate) async fn send<B: IoBuf>(&self, mut buf: B) -> BufResult<usize, B> {
        if let Err(e) = self.flush_written_behind().await {
            return (Err(e), buf);
        }
        loop {
            let len = buf.bytes_init().min(u32::MAX as usize) as u32;
            let entry = opcode::Send::new(self.raw(), buf.stable_ptr(), len)
                .flags(libc::MSG_NOSIGNAL)
                .build();
            // SAFETY: the entry points at `buf`'s `len` initialised bytes, which IoBuf keeps at a
            // fixed address while `buf` moves; the op owns `buf` until its last completion.
            let op = match unsafe { self.submit(entry, buf) } {
                Ok(op) => op,
                Err((e, b)) => return (Err(e), b),
            };
            let (cqe, b) = op.await;
            buf = b;
            match cqe.result() {
                Ok(n) => return (Ok(n as usize), buf),
                Err(e) if is_retry(&e) => {
                    if let Err(e) = self.poll_events(libc::POLLOUT).await {
                        return (Err(e), buf);
                    }
                }
                Err(e) => return (Err(e), buf),
            }
        }
    }

    /// Sends the buffers in order in one `sendmsg`; may send fewer bytes than all.
    pub(crate) async fn send_vectored<B: IoBuf>(&self, bufs: Vec<B>) -> BufResult<usize, Vec<B>> {
        if let Err(e) = self.flush_written_behind().await {
            return (Err(e), bufs);
        }
        let mut storage = MsgStorage::new(bufs);
        loop {
            let msg: *const libc::msghdr = &*storage.msg;
            let entry =
                opcode::SendMsg::new(self.raw(), msg).flags(libc::MSG_NOSIGNAL as u32).build();
            // SAFETY: the entry points at the boxed msghdr, which points at the iovec array (a
            // Vec's heap block), which points at the buffers' stable bytes; `storage` owns all
            // three and the op owns `storage` until its last completion.
            let op = match unsafe { self.submit(entry, storage) } {
                Ok(op) => op,
                Err((e, s)) => return (Err(e), s.bufs),
            };
            let (cqe, s) = op.await;
            storage = s;
            match cqe.result() {
                Ok(n) => return (Ok(n as usize), storage.bufs),
                Err(e) if is_retry(&e) => {
                    if let Err(e) = self.poll_events(libc::POLLOUT).await {
                        return (Err(e), storage.bufs);
                    }
                }
                Err(e) => return (Err(e), storage.bufs),
            }
        }
    }

    /// Connects a fresh socket to `addr`.
    pub(crate) async fn connect(&self, addr: SocketAddr) -> io::Result<()> {
        let (storage, len) = sys::std_to_sockaddr(&addr);
        let storage = Box::new(storage);
        let ptr: *const libc::sockaddr = (&*storage as *const libc::sockaddr_storage).cast();
        let entry = opcode::Connect::new(self.raw(), ptr, len).build();
        // SAFETY: the entry points at the boxed address (`len` bytes), owned by the op until its
        // last completion.
        let op = unsafe { self.submit(entry, storage) }.map_err(|(e, _)| e)?;
        let (cqe, _storage) = op.await;
        match cqe.result() {
            Ok(_) => Ok(()),
            // A non-blocking socket can report the handshake as under way; wait
            // for it to become writable and ask SO_ERROR how it ended.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINPROGRESS | libc::EALREADY | libc::EAGAIN)
                ) =>
            {
                self.poll_events(libc::POLLOUT).await?;
                match sys::getsockopt_int(self.fd(), libc::SOL_SOCKET, libc::SO_ERROR)? {
                    0 => Ok(()),
                    errno => Err(io::Error::from_raw_os_error(errno)),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Shuts down one or both directions of a connection.
    pub(crate) async fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        // A write-side shutdown comes after the bytes written behind (the
        // peer's end of stream follows the data, as on epoll). Shutting
        // down both sides is how a connection is cut, and waits for
        // nothing: a peer that never reads must not hold it.
        if how == std::net::Shutdown::Write {
            self.flush_written_behind().await?;
        }
        let how = match how {
            std::net::Shutdown::Read => libc::SHUT_RD,
            std::net::Shutdown::Write => libc::SHUT_WR,
            std::net::Shutdown::Both => libc::SHUT_RDWR,
        };
        let entry = opcode::Shutdown::new(self.raw(), how).build();
        // SAFETY: a shutdown entry points at no memory.
        let op = unsafe { self.submit(entry, ()) }.map_err(|(e, _)| e)?;
        let (cqe, ()) = op.await;
        cqe.result().map(drop)
    }

    /// Waits until the socket reports one of `events` (a one-shot `POLL_ADD`).
    pub(super) async fn poll_events(&self, events: i16) -> io::Result<()> {
        let op = self.submit_poll(events)?;
        let (cqe, ()) = op.await;
        cqe.result().map(drop)
    }

    /// Submits a one-shot `POLL_ADD` for `events`.
    pub(super) fn submit_poll(&self, events: i16) -> io::Result<Op<()>> {
        let entry = opcode::PollAdd::new(self.raw(), events as u32).build();
        // SAFETY: a poll entry points at no memory.
        unsafe { self.submit(entry, ()) }.map_err(|(e, ())| e)
    }

    /// Ready once the socket has bytes to read: with a buffer ring, ready
    /// once the multishot receive queued something; without one, a
    /// `POLL_ADD` kept in the source across polls (dropping it takes no
    /// bytes).
    pub(crate) fn poll_readable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        if self.driver.state.borrow().has_buf_ring() {
            return self.poll_stream_ready(cx);
        }
        let mut wait = self.read_wait.borrow_mut();
        let op = match wait.as_mut() {
            Some(op) => op,
            None => wait.insert(self.submit_poll(libc::POLLIN)?),
        };
        let (cqe, ()) = std::task::ready!(std::future::Future::poll(std::pin::Pin::new(op), cx));
        *wait = None;
        self.drained.set(false);
        Poll::Ready(cqe.result().map(drop))
    }

    /// Ready once a one-shot `POLL_ADD` for `POLLIN` completes (see
    /// [`crate::driver::Source::poll_next_readable`]); the entry is kept
    /// across polls, and a new one is made after each completion.
    pub(crate) fn poll_next_readable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        let mut wait = self.read_wait.borrow_mut();
        let op = match wait.as_mut() {
            Some(op) => op,
            None => wait.insert(self.submit_poll(libc::POLLIN)?),
        };
        let (cqe, ()) = std::task::ready!(std::future::Future::poll(std::pin::Pin::new(op), cx));
        *wait = None;
        Poll::Ready(cqe.result().map(drop))
    }

    /// Ready once the socket polls writable (a one-shot `POLL_ADD`).
    pub(crate) async fn next_writable(&self) -> io::Result<()> {
        self.poll_events(libc::POLLOUT).await
    }

    /// Ready once the multishot receive queued bytes, an end or an error.
    fn poll_stream_ready(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        if !self.driver.entered.get() {
            return Poll::Ready(Err(not_running()));
        }
        let mut key = self.stream.get();
        let ready = self.driver.state.borrow_mut().stream_ready(&mut key, &self.fd, cx.waker());
        self.stream.set(key);
        if ready {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    /// False when the last non-blocking read drained the socket and no
    /// readiness wait has completed since.
    pub(crate) fn may_read_now(&self) -> bool {
        !self.drained.get()
    }

    /// Receives without waiting. With a buffer ring, takes what the
    /// socket's multishot receive queued (arming it on first use);
    /// otherwise a `recv` with `MSG_DONTWAIT` (accepted sockets are
    /// blocking), where a short read or `WouldBlock` records that the
    /// socket is drained.
    pub(crate) fn try_recv(&self, buf: &mut [MaybeUninit<u8>]) -> io::Result<usize> {
        {
            let mut st = self.driver.state.borrow_mut();
            if st.has_buf_ring() {
                let mut key = self.stream.get();
                let res = st.stream_recv(&mut key, &self.fd, buf);
                self.stream.set(key);
                return res;
            }
        }
        // SAFETY: `buf` is a live slice of `len` writable bytes for the duration of the call.
        let res = unsafe { sys::recv_nowait(self.fd(), buf.as_mut_ptr().cast(), buf.len()) };
        match &res {
            Ok(n) if *n > 0 && *n < buf.len() => self.drained.set(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.drained.set(true),
            _ => {}
        }
        res
    }

    /// Takes one queued connection, or arms an accept and parks the task.
    pub(crate) fn poll_accept(
        &self,
        cx: &mut TaskContext<'_>,
        mode: AcceptMode,
    ) -> Poll<io::Result<OwnedFd>> {
        if !self.driver.entered.get() {
            return Poll::Ready(Err(not_running()));
        }
        let mut key = self.listener.get();
        let room = self.accept_room.get();
        let got = self.driver.state.borrow_mut().poll_accept(
            &mut key,
            &self.fd,
            mode,
            room,
            Some(cx.waker()),
        );
        self.listener.set(key);
        match got {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }

    /// Takes one connection only if one is ready now: from the accept
    /// queue, else straight from the kernel's backlog with a non-blocking
    /// `accept4` (the multishot may not have run since the connection came
    /// in). For draining a listener when a server stops.
    pub(crate) fn accept_now(&self, mode: AcceptMode) -> Option<io::Result<OwnedFd>> {
        let _ = mode; // every mode drains the same queue and backlog
        if let Some(key) = self.listener.get() {
            if let Some(r) = self.driver.state.borrow_mut().take_queued(key) {
                return Some(r);
            }
        }
        match sys::accept(self.fd()) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            other => Some(other),
        }
    }

    /// Sets how many connections the owner will take from now on: no more
    /// are accepted ahead into the queue, and at zero the armed accept stops.
    pub(crate) fn set_accept_room(&self, room: usize) {
        if self.accept_room.replace(room) != room {
            self.driver.state.borrow_mut().set_accept_room(self.listener.get(), room);
        }
    }

    /// Reads into a borrowed slice that may be uninitialised; `Ok(n)`
    /// means its first `n` bytes were written.
    ///
    /// Every read style (owned, pooled, tokio, futures, hyper) comes here
    /// or to [`Source::try_recv`], so the socket has one truth about its
    /// received bytes: the multishot receive's queue in the driver where
    /// there is a buffer ring, the kernel's socket buffer otherwise. The
    /// kernel never holds a read into memory of a future that may be
    /// dropped, so cancelling a read loses nothing.
    pub(crate) fn poll_read_uninit(
        &self,
        cx: &mut TaskContext<'_>,
        dst: &mut [MaybeUninit<u8>],
    ) -> Poll<io::Result<usize>> {
        if dst.is_empty() {
            return Poll::Ready(Ok(0));
        }
        loop {
            if self.may_read_now() {
                match self.try_recv(dst) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    r => return Poll::Ready(r),
                }
            }
            std::task::ready!(self.poll_readable(cx))?;
        }
    }

    /// Writes borrowed slices through the stream's write-behind buffer.
    pub(crate) fn poll_write_slices(
        &self,
        cx: &mut TaskContext<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut wb = self.write_behind.borrow_mut();
        wb.get_or_insert_with(Box::default).poll_write(self.sock(), cx, bufs)
    }

    /// Waits until every byte the borrowed-slice writes took is sent.
    pub(crate) fn poll_flush(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        match self.write_behind.borrow_mut().as_mut() {
            Some(wb) => wb.poll_flush(self.sock(), cx),
            None => Poll::Ready(Ok(())),
        }
    }

    /// The socket and its driver, for the write-behind buffer.
    fn sock(&self) -> Sock<'_> {
        Sock { driver: &self.driver, fd: &self.fd }
    }

    /// Waits for the borrowed-slice writes still in flight, so an
    /// owned-buffer write or a shutdown comes after them.
    pub(super) async fn flush_written_behind(&self) -> io::Result<()> {
        let writing = self.write_behind.borrow().as_ref().is_some_and(|wb| wb.is_writing());
        if writing {
            std::future::poll_fn(|cx| self.poll_flush(cx)).await?;
        }
        Ok(())
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        // A read's readiness wait is cancelled; a borrowed-slice write the
        // caller was told had been taken is finished by the driver (for a
        // while): see `write_behind`. It is handed to the kernel now, not
        // at the next loop turn: the caller may block before that turn.
        drop(self.read_wait.take());
        if let Some(wb) = self.write_behind.take() {
            let writing = wb.is_writing();
            (*wb).linger(self.sock());
            if writing {
                self.driver.submit_now();
            }
        }
        if let Ok(mut st) = self.driver.state.try_borrow_mut() {
            if let Some(key) = self.listener.get() {
                st.release_listener(key);
            }
            if let Some(key) = self.stream.get() {
                st.release_stream(key);
            }
            if let Some(key) = self.datagram.borrow().as_ref().and_then(|w| w.ring_key()) {
                st.release_dgrams(key);
            }
        }
        // `fd` closes now if no operation holds it, else at the last one's
        // end. Outside the runtime, push that end along so the socket
        // really closes (and a listener stops accepting) now.
        self.driver.settle();
    }
}

/// What a `sendmsg` keeps alive: the buffers, their iovecs and the header.
struct MsgStorage<B> {
    bufs: Vec<B>,
    _iov: Vec<libc::iovec>,
    msg: Box<libc::msghdr>,
}

impl<B: IoBuf> MsgStorage<B> {
    fn new(bufs: Vec<B>) -> Self {
        let iov = crate::buf::iovecs(&bufs);
        // SAFETY: msghdr is plain old data; all-zero is a valid, empty header.
        let mut msg: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = iov.len();
        MsgStorage { bufs, _iov: iov, msg }
    }
}
