//! UDP on the io_uring driver.
//!
//! # Implementation notes
//! - Owned-buffer sends and receives are `SENDMSG`/`RECVMSG` ring
//!   operations whose storage (the buffer, the boxed header with its
//!   address and control space) the operation owns until its last
//!   completion. The socket is blocking, so the kernel waits for data
//!   inside the operation instead of answering `EAGAIN`.
//! - The borrowed forms (`poll_recv_batch`, `poll_send_batch`,
//!   `try_send_one`) cannot hand a borrowed slice to the kernel past the
//!   call, so they make the same non-blocking `recvmmsg`/`sendmmsg` calls as
//!   on epoll, and wait for readiness with a one-shot `POLL_ADD` (kept in
//!   the socket, one per direction) only when the call would block. A
//!   receive batch that came back short drained the queue, so the next
//!   receive arms its poll at once instead of first failing with `EAGAIN`.
//! - Where the kernel has multishot `RECVMSG` (Linux 6.0), every receive,
//!   owned or borrowed, takes from the socket's queue that one multishot
//!   fills from the socket's own buffer ring (`dgram.rs`) instead: no system
//!   call per datagram or batch, and no poll. The other forms stay as the
//!   fallback where a ring cannot be had.

use std::cell::{Cell, RefCell};
use std::future::{pending, poll_fn, Future};
use std::io::{self, IoSliceMut};
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use io_uring::{opcode, types};

use super::op::{is_retry, Op};
use super::source::SourceCore;
use super::Driver;
use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::coop;
use crate::driver::contract::DatagramOps;
use crate::driver::park::not_running;
use crate::driver::udp::{self, MsgBuf, RecvMeta, SendMeta, Transmit};
use crate::slab::Key;

/// A datagram socket owned by one io_uring driver.
pub(crate) struct DatagramSource {
    core: SourceCore,
    /// The readiness polls of the borrowed forms and the receive queue,
    /// made on first use.
    waits: RefCell<Option<Box<DatagramWaits>>>,
    /// The last `try_send_one` found the send buffer full: `writable`
    /// waits on a `POLL_ADD` only then, and answers at once otherwise.
    send_full: Cell<bool>,
}

/// The readiness polls of a datagram socket's borrowed forms.
#[derive(Default)]
struct DatagramWaits {
    recv: Option<Op<()>>,
    send: Option<Op<()>>,
    /// The last receive batch came back short: the queue was empty then,
    /// so the next receive arms its poll without a `recvmmsg` that would
    /// only say `EAGAIN` (as epoll's readiness bit does).
    recv_drained: bool,
    /// Whether receives take from a multishot `RECVMSG`'s queue.
    ring: RingMode,
}

/// How a datagram socket receives on io_uring, decided at its first receive.
#[derive(Default, Clone, Copy)]
enum RingMode {
    /// Not received on yet.
    #[default]
    Undecided,
    /// From the queue of the driver's `dgrams` slot.
    Ring(Key),
    /// With `RECVMSG` and `recvmmsg` (no multishot `RECVMSG` here).
    Plain,
    /// Not at all any more ([`DatagramOps::stop_receiving`]).
    Stopped,
}

impl DatagramWaits {
    /// The socket's datagram queue, if it receives through one.
    fn ring_key(&self) -> Option<Key> {
        match self.ring {
            RingMode::Ring(key) => Some(key),
            RingMode::Undecided | RingMode::Plain | RingMode::Stopped => None,
        }
    }
}

/// Copies a queued datagram's `payload` into the `cap` bytes at `dst`,
/// reporting truncation as `recvmsg` does: `len` is what was copied, and
/// `truncated` is set when the datagram did not fit.
///
/// # Safety
/// `dst` must point at `cap` writable bytes that do not overlap `payload`.
unsafe fn copy_datagram(payload: &[u8], meta: RecvMeta, dst: *mut u8, cap: usize) -> RecvMeta {
    let n = payload.len().min(cap);
    // SAFETY: the caller vouches for `cap` writable bytes at `dst`, apart from `payload`.
    unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), dst, n) };
    RecvMeta { len: n, truncated: meta.truncated || payload.len() > cap, ..meta }
}

/// What a `RECVMSG`/`SENDMSG` keeps alive: the buffer and the header.
struct MsgStorage<B> {
    buf: B,
    msg: Box<MsgBuf>,
}

impl DatagramSource {
    /// Wraps a (blocking) datagram socket.
    pub(crate) fn new(driver: &Rc<Driver>, fd: OwnedFd) -> DatagramSource {
        DatagramSource {
            core: SourceCore::new(driver, fd),
            waits: RefCell::new(None),
            send_full: Cell::new(false),
        }
    }

    /// The socket's datagram queue if it receives through a multishot
    /// `RECVMSG`; decided (and the ring registered) at the first call.
    fn recv_ring(&self) -> Option<Key> {
        let mut waits = self.waits.borrow_mut();
        let waits = waits.get_or_insert_with(Box::default);
        match waits.ring {
            RingMode::Ring(key) => Some(key),
            RingMode::Plain | RingMode::Stopped => None,
            // Outside its runtime the receive fails with the not-running
            // error; the ring is registered from the worker's thread only.
            RingMode::Undecided if !self.core.driver.entered.get() => None,
            RingMode::Undecided => {
                let key = self.core.driver.state.borrow_mut().open_dgrams();
                waits.ring = key.map_or(RingMode::Plain, RingMode::Ring);
                key
            }
        }
    }

    /// True once receives pend for good.
    fn stopped(&self) -> bool {
        self.waits.borrow().as_ref().is_some_and(|w| matches!(w.ring, RingMode::Stopped))
    }

    /// Takes up to `max` datagrams from the queue `key`, or parks the task.
    fn poll_ring(
        &self,
        cx: &mut TaskContext<'_>,
        key: Key,
        max: usize,
        deliver: impl FnMut(usize, &[u8], RecvMeta),
    ) -> Poll<io::Result<usize>> {
        if !self.core.driver.entered.get() {
            return Poll::Ready(Err(not_running()));
        }
        // Datagrams the multishot receive queued are taken without
        // waiting: under the task's budget (`coop.rs`).
        coop::poll_budgeted(cx, |cx| {
            self.core.driver.state.borrow_mut().poll_dgrams(
                key,
                &self.core.fd,
                cx.waker(),
                max,
                deliver,
            )
        })
    }

    /// Runs the non-blocking `call` until it stops saying `WouldBlock`,
    /// waiting on a `POLL_ADD` for `events` in between.
    fn poll_datagram<R>(
        &self,
        cx: &mut TaskContext<'_>,
        events: i16,
        mut call: impl FnMut() -> io::Result<R>,
    ) -> Poll<io::Result<R>> {
        let recv = events == libc::POLLIN;
        // The call may complete without waiting: under the task's budget,
        // checked before it is made (`coop.rs`).
        std::task::ready!(coop::poll_proceed(cx));
        loop {
            let skip_call = {
                let mut waits = self.waits.borrow_mut();
                let waits = waits.get_or_insert_with(Box::default);
                let slot = if recv { &mut waits.recv } else { &mut waits.send };
                if let Some(op) = slot.as_mut() {
                    match Pin::new(op).poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready((cqe, ())) => {
                            *slot = None;
                            if recv {
                                waits.recv_drained = false;
                            }
                            if let Err(e) = cqe.result() {
                                return Poll::Ready(Err(e));
                            }
                        }
                    }
                }
                recv && std::mem::take(&mut waits.recv_drained)
            };
            if !skip_call {
                match call() {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    r => {
                        coop::spend();
                        return Poll::Ready(r);
                    }
                }
            }
            // Fails with the not-running error outside the socket's runtime.
            let op = match self.core.submit_poll(events) {
                Ok(op) => op,
                Err(e) => return Poll::Ready(Err(e)),
            };
            let mut waits = self.waits.borrow_mut();
            let waits = waits.get_or_insert_with(Box::default);
            if recv {
                waits.recv = Some(op);
            } else {
                waits.send = Some(op);
            }
        }
    }
}

impl DatagramOps for DatagramSource {
    /// The raw descriptor.
    fn fd(&self) -> RawFd {
        self.core.fd()
    }

    /// The descriptor, borrowed.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.core.as_fd()
    }

    /// True once receives on this socket take from a multishot `RECVMSG`.
    fn receives_from_ring(&self) -> bool {
        self.waits.borrow().as_ref().is_some_and(|w| w.ring_key().is_some())
    }

    /// The armed multishot `RECVMSG` is cancelled and its queue dropped (or
    /// the borrowed forms' receive poll cancelled), so nothing here takes
    /// a datagram from the socket again.
    fn stop_receiving(&self) {
        {
            let mut waits = self.waits.borrow_mut();
            let waits = waits.get_or_insert_with(Box::default);
            if let RingMode::Ring(key) = std::mem::replace(&mut waits.ring, RingMode::Stopped) {
                self.core.driver.state.borrow_mut().release_dgrams(key);
            }
            // Dropping the poll cancels it.
            waits.recv = None;
        }
        // The cancel goes to the kernel now, not at the loop's next enter:
        // until then the armed receive would go on taking datagrams that
        // another process is about to read.
        self.core.driver.submit_now();
    }

    /// Receives one datagram into `buf` (from its start up to its capacity).
    async fn recv_msg<B: IoBufMut>(&self, mut buf: B) -> BufResult<RecvMeta, B> {
        if self.stopped() {
            return pending().await;
        }
        if let Some(key) = self.recv_ring() {
            let (dst, cap) = (buf.stable_mut_ptr(), buf.bytes_total());
            let mut got = RecvMeta::default();
            let res = poll_fn(|cx| {
                self.poll_ring(cx, key, 1, |_, payload, meta| {
                    // SAFETY: `buf` has `cap` writable bytes at `dst`, a fixed address while it
                    // moves, and the driver's ring buffer is not part of it.
                    got = unsafe { copy_datagram(payload, meta, dst, cap) };
                })
            })
            .await;
            return match res {
                Ok(_) => {
                    // SAFETY: `copy_datagram` wrote `got.len` bytes at the start of the buffer.
                    unsafe { buf.set_init(got.len) };
                    (Ok(got), buf)
                }
                Err(e) => (Err(e), buf),
            };
        }
        let mut msg = Box::new(MsgBuf::new());
        loop {
            msg.prepare_recv(buf.stable_mut_ptr(), buf.bytes_total());
            let hdr: *mut libc::msghdr = &mut msg.hdr;
            let entry = opcode::RecvMsg::new(types::Fd(self.fd()), hdr).build();
            let storage = MsgStorage { buf, msg };
            // SAFETY: the entry points at the boxed header, which points at the box's own address
            // and control space and at the buffer's `bytes_total` stable writable bytes; the op
            // owns all of it until its last completion.
            let op = match unsafe { self.core.submit(entry, storage) } {
                Ok(op) => op,
                Err((e, s)) => return (Err(e), s.buf),
            };
            let (cqe, s) = op.await;
            (buf, msg) = (s.buf, s.msg);
            match cqe.result() {
                Ok(n) => {
                    let meta = msg.decode_recv(n as usize);
                    // SAFETY: the kernel wrote `n` bytes at the start of the buffer.
                    unsafe { buf.set_init(meta.len) };
                    return (Ok(meta), buf);
                }
                Err(e) if is_retry(&e) => {
                    if let Err(e) = self.core.poll_events(libc::POLLIN).await {
                        return (Err(e), buf);
                    }
                }
                Err(e) => return (Err(e), buf),
            }
        }
    }

    /// Sends the initialised bytes of `buf` as one datagram (or a GSO train).
    async fn send_msg<B: IoBuf>(&self, mut buf: B, meta: SendMeta) -> BufResult<usize, B> {
        let mut msg = Box::new(MsgBuf::new());
        loop {
            msg.prepare_send(buf.stable_ptr(), buf.bytes_init(), &meta);
            let hdr: *const libc::msghdr = &msg.hdr;
            let entry = opcode::SendMsg::new(types::Fd(self.fd()), hdr)
                .flags(libc::MSG_NOSIGNAL as u32)
                .build();
            let storage = MsgStorage { buf, msg };
            // SAFETY: the entry points at the boxed header, which points at the box's own address
            // and control data and at the buffer's `bytes_init` stable bytes; the op owns all of
            // it until its last completion.
            let op = match unsafe { self.core.submit(entry, storage) } {
                Ok(op) => op,
                Err((e, s)) => return (Err(e), s.buf),
            };
            let (cqe, s) = op.await;
            (buf, msg) = (s.buf, s.msg);
            match cqe.result() {
                Ok(n) => return (Ok(n as usize), buf),
                Err(e) if is_retry(&e) => {
                    if let Err(e) = self.core.poll_events(libc::POLLOUT).await {
                        return (Err(e), buf);
                    }
                }
                Err(e) => return (Err(e), buf),
            }
        }
    }

    /// Receives a batch of datagrams into borrowed buffers (`recvmmsg`).
    fn poll_recv_batch(
        &self,
        cx: &mut TaskContext<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let fd = self.fd();
        let asked = bufs.len().min(meta.len()).min(udp::BATCH_DATAGRAMS_MAX);
        if self.stopped() {
            return Poll::Pending;
        }
        if asked == 0 {
            return Poll::Ready(Ok(0));
        }
        if let Some(key) = self.recv_ring() {
            return self.poll_ring(cx, key, asked, |i, payload, m| {
                let dst = &mut bufs[i];
                // SAFETY: `dst` is a live, writable borrowed slice, apart from the ring buffer.
                meta[i] = unsafe { copy_datagram(payload, m, dst.as_mut_ptr(), dst.len()) };
            });
        }
        let polled = self.poll_datagram(cx, libc::POLLIN, || udp::recv_batch(fd, bufs, meta));
        if let Poll::Ready(Ok(n)) = polled {
            if asked > 1 && n < asked {
                if let Some(waits) = self.waits.borrow_mut().as_mut() {
                    waits.recv_drained = true;
                }
            }
        }
        polled
    }

    /// Sends a batch of transmits from borrowed buffers (`sendmmsg`).
    fn poll_send_batch(
        &self,
        cx: &mut TaskContext<'_>,
        transmits: &[Transmit<'_>],
    ) -> Poll<io::Result<usize>> {
        let fd = self.fd();
        self.poll_datagram(cx, libc::POLLOUT, || udp::send_batch(fd, transmits))
    }

    /// Sends one transmit now or says `WouldBlock` (and remembers that the
    /// send buffer is full, so [`DatagramSource::writable`] waits for room).
    fn try_send_one(&self, transmit: &Transmit<'_>) -> io::Result<usize> {
        loop {
            match udp::send_one(self.fd(), transmit) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.send_full.set(true);
                    return Err(e);
                }
                r => return r,
            }
        }
    }

    /// Waits until the socket may have room to send: at once unless the
    /// last send found the buffer full, else on a one-shot `POLL_ADD`.
    /// quinn asks before every transmit, and a `POLL_ADD` each time made
    /// every transmit wait for the loop's next enter.
    async fn writable(&self) -> io::Result<()> {
        if !self.send_full.get() {
            // Ready without waiting: under the task's budget, as on epoll (`coop.rs`).
            coop::step().await;
            return Ok(());
        }
        self.core.poll_events(libc::POLLOUT).await?;
        self.send_full.set(false);
        Ok(())
    }
}

impl Drop for DatagramSource {
    fn drop(&mut self) {
        // The receive queue is dropped and its multishot cancelled (it keeps
        // the socket and the ring until its last completion); the polls of
        // the borrowed forms are cancelled as the box drops, and the core
        // then settles.
        let ring = self.waits.get_mut().as_ref().and_then(|w| w.ring_key());
        if let Some(key) = ring {
            if let Ok(mut st) = self.core.driver.state.try_borrow_mut() {
                st.release_dgrams(key);
            }
        }
    }
}
