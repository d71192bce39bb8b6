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

use super::compat::StreamBuffers;
use super::op::{OnDrop, Op};
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
    /// The owned buffers behind the borrowed-slice forms, made on first use.
    compat: RefCell<Option<Box<StreamBuffers>>>,
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
            compat: RefCell::new(None),
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
        on_drop: OnDrop,
    ) -> Result<Op<T>, (io::Error, T)> {
        // SAFETY: forwarded from the caller; `self.fd` is the socket `entry` names.
        unsafe { Op::submit(&self.driver, &self.fd, entry, data, on_drop) }
    }

    fn raw(&self) -> types::Fd {
        types::Fd(self.fd.as_raw_fd())
    }

    /// Receives into `buf` (from its start up to its capacity).
    pub(crate) async fn recv<B: IoBufMut>(&self, mut buf: B) -> BufResult<usize, B> {
        if self.reads_through_queue() {
            let total = buf.bytes_total();
            let res = loop {
                // SAFETY: the buffer has `bytes_total` writable bytes at a fixed address, and it
                // is only written through this slice while this future runs.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(
                        buf.stable_mut_ptr().cast::<MaybeUninit<u8>>(),
                        total,
                    )
                };
                match self.try_recv(dst) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    r => break r,
                }
                if let Err(e) = self.readable().await {
                    break Err(e);
                }
            };
            if let Ok(n) = res {
                // SAFETY: `try_recv` initialised the first `n` bytes.
                unsafe { buf.set_init(n) };
            }
            return (res, buf);
        }
        loop {
            let len = buf.bytes_total().min(u32::MAX as usize) as u32;
            let entry = opcode::Recv::new(self.raw(), buf.stable_mut_ptr(), len).build();
            // SAFETY: the entry points at `buf`'s `len` writable bytes, which IoBufMut keeps at a
            // fixed address while `buf` moves; the op owns `buf` until its last completion.
            let op = match unsafe { self.submit(entry, buf, OnDrop::Cancel) } {
                Ok(op) => op,
                Err((e, b)) => return (Err(e), b),
            };
            let (cqe, b) = op.await;
            buf = b;
            match cqe.result() {
                Ok(n) => {
                    // SAFETY: the kernel wrote `n` bytes at the start of the buffer.
                    unsafe { buf.set_init(n as usize) };
                    return (Ok(n as usize), buf);
                }
                Err(e) if is_retry(&e) => {
                    if let Err(e) = self.poll_events(libc::POLLIN).await {
                        return (Err(e), buf);
                    }
                }
                Err(e) => return (Err(e), buf),
            }
        }
    }

    /// Sends the initialised bytes of `buf`; may send fewer.
    pub(crate) async fn send<B: IoBuf>(&self, mut buf: B) -> BufResult<usize, B> {
        loop {
            let len = buf.bytes_init().min(u32::MAX as usize) as u32;
            let entry = opcode::Send::new(self.raw(), buf.stable_ptr(), len)
                .flags(libc::MSG_NOSIGNAL)
                .build();
            // SAFETY: the entry points at `buf`'s `len` initialised bytes, which IoBuf keeps at a
            // fixed address while `buf` moves; the op owns `buf` until its last completion.
            let op = match unsafe { self.submit(entry, buf, OnDrop::Cancel) } {
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
        let mut storage = MsgStorage::new(bufs);
        loop {
            let msg: *const libc::msghdr = &*storage.msg;
            let entry =
                opcode::SendMsg::new(self.raw(), msg).flags(libc::MSG_NOSIGNAL as u32).build();
            // SAFETY: the entry points at the boxed msghdr, which points at the iovec array (a
            // Vec's heap block), which points at the buffers' stable bytes; `storage` owns all
            // three and the op owns `storage` until its last completion.
            let op = match unsafe { self.submit(entry, storage, OnDrop::Cancel) } {
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
        let op = unsafe { self.submit(entry, storage, OnDrop::Cancel) }.map_err(|(e, _)| e)?;
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
        let how = match how {
            std::net::Shutdown::Read => libc::SHUT_RD,
            std::net::Shutdown::Write => libc::SHUT_WR,
            std::net::Shutdown::Both => libc::SHUT_RDWR,
        };
        let entry = opcode::Shutdown::new(self.raw(), how).build();
        // SAFETY: a shutdown entry points at no memory.
        let op = unsafe { self.submit(entry, (), OnDrop::Cancel) }.map_err(|(e, _)| e)?;
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
        unsafe { self.submit(entry, (), OnDrop::Cancel) }.map_err(|(e, ())| e)
    }

    /// Waits until the socket has bytes to read (a `POLL_ADD`, which holds
    /// no buffer while it waits).
    pub(crate) async fn readable(&self) -> io::Result<()> {
        if self.driver.state.borrow().has_buf_ring() {
            return std::future::poll_fn(|cx| self.poll_stream_ready(cx)).await;
        }
        self.poll_events(libc::POLLIN).await?;
        self.drained.set(false);
        Ok(())
    }

    /// The poll form of [`Source::readable`] with a buffer ring; `None`
    /// without one (the wait is then a `POLL_ADD` operation: use `readable`).
    pub(crate) fn poll_readable(&self, cx: &mut TaskContext<'_>) -> Option<Poll<io::Result<()>>> {
        if self.driver.state.borrow().has_buf_ring() {
            Some(self.poll_stream_ready(cx))
        } else {
            None
        }
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

    /// True once pooled reads gave the socket a receive queue: every read
    /// then goes through it, so bytes keep their order.
    fn reads_through_queue(&self) -> bool {
        self.stream.get().is_some()
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
    /// means its first `n` bytes were written. Through the multishot
    /// receive's queue where there is one, else the stream's owned buffer.
    pub(crate) fn poll_read_uninit(
        &self,
        cx: &mut TaskContext<'_>,
        dst: &mut [MaybeUninit<u8>],
    ) -> Poll<io::Result<usize>> {
        if self.reads_through_queue() {
            loop {
                match self.try_recv(dst) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    r => return Poll::Ready(r),
                }
                std::task::ready!(self.poll_stream_ready(cx))?;
            }
        }
        let mut compat = self.compat.borrow_mut();
        compat.get_or_insert_with(Box::default).poll_read(self, cx, dst)
    }

    /// Writes borrowed slices through the stream's owned buffer.
    pub(crate) fn poll_write_slices(
        &self,
        cx: &mut TaskContext<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut compat = self.compat.borrow_mut();
        compat.get_or_insert_with(Box::default).poll_write(self, cx, bufs)
    }

    /// Waits until every byte the borrowed-slice writes took is sent.
    pub(crate) fn poll_flush(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        match self.compat.borrow_mut().as_mut() {
            Some(sb) => sb.poll_flush(self, cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        // In-flight borrowed-slice reads are cancelled, and a write they
        // took is left to finish (for a while): see `compat`. That write is
        // handed to the kernel now, not at the next loop turn: the caller
        // was told it had been written, and may block before that turn.
        let compat = self.compat.take();
        let writing = compat.as_ref().is_some_and(|c| c.is_writing());
        drop(compat);
        if writing {
            self.driver.submit_now();
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

/// True for results that mean "not now": the operation ran without
/// waiting (a non-blocking socket handled by a kernel worker) and should
/// wait for readiness and run again.
pub(super) fn is_retry(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR))
}
