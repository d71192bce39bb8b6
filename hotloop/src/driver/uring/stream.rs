//! A byte-stream socket on the io_uring driver and its operations, each a
//! ring entry that owns its buffer and its socket until its last
//! completion; reads take from the socket's one receive path.
//!
//! # Implementation notes
//! - Every idle connection holds one of these, so it carries only a
//!   stream's state, in 40 bytes: the core (descriptor and driver), one
//!   key, a flag and one pointer. The key names the receive queue where
//!   the driver has a buffer ring, and otherwise the `POLL_ADD` a read
//!   waits on: a driver has a ring for its whole life or never, so the
//!   two never meet. The write-behind buffer, which only the poll-form
//!   writes need, is boxed and made on first use.
//! - The write-behind buffer sits in a `Cell` (8 bytes; a `RefCell` would
//!   be 16): it is lent out for the length of one call, and put back by a
//!   guard even if that call unwinds.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Context as TaskContext, Poll};

use io_uring::opcode;

use super::op::{is_retry, Op, ParkedOp};
use super::shared::{SharedFile, SockFd};
use super::source::SourceCore;
use super::write_behind::WriteBehind;
use super::Driver;
use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::coop;
use crate::driver::contract::StreamOps;
use crate::driver::park::not_running;
use crate::slab::Key;
use crate::sys;

/// A look into a stream socket's kernel queues, made while the
/// stream lives and kept beside a read of it (see
/// [`StreamSource::probe`]). It holds neither the socket nor the driver:
/// a direct socket gets its plain descriptor only when a look is asked
/// for (at a drain), not for every connection that might be looked into.
pub(crate) struct StreamProbe {
    fd: Weak<SockFd>,
    driver: Weak<Driver>,
}

impl StreamProbe {
    /// True if the peer has sent bytes (or its end) that nobody has read,
    /// in the kernel; `NotConnected` once the socket has closed.
    pub(crate) fn input_pending(&self) -> io::Result<bool> {
        let (Some(fd), Some(driver)) = (self.fd.upgrade(), self.driver.upgrade()) else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        sys::input_pending(driver.plain_fd(&fd)?)
    }

    /// How long ago the peer's last data arrived, as the kernel counts
    /// it; `NotConnected` once the socket has closed.
    pub(crate) fn since_data_received(&self) -> io::Result<std::time::Duration> {
        let (Some(fd), Some(driver)) = (self.fd.upgrade(), self.driver.upgrade()) else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        sys::tcp_since_data_received(driver.plain_fd(&fd)?)
    }

    /// How long ago the peer's last acknowledgement arrived, as the kernel
    /// counts it; `NotConnected` once the socket has closed.
    pub(crate) fn since_ack_received(&self) -> io::Result<std::time::Duration> {
        let (Some(fd), Some(driver)) = (self.fd.upgrade(), self.driver.upgrade()) else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        sys::tcp_since_ack_received(driver.plain_fd(&fd)?)
    }

    /// The bytes in the kernel's send queue the peer has not acknowledged;
    /// `NotConnected` once the socket has closed. Bytes a borrowed-slice
    /// write left in the write-behind buffer are not there yet: a flush
    /// waits for them (see `write_behind.rs`).
    pub(crate) fn unacknowledged_output(&self) -> io::Result<usize> {
        let (Some(fd), Some(driver)) = (self.fd.upgrade(), self.driver.upgrade()) else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        sys::unacknowledged_output(driver.plain_fd(&fd)?)
    }
}

/// A connected (or connecting) stream socket owned by one io_uring driver.
/// Its descriptor closes when the source and every operation the kernel
/// still holds on it are gone.
pub(crate) struct StreamSource {
    pub(super) core: SourceCore,
    /// Where the driver has a buffer ring: the receive queue of the
    /// multishot receive behind every read, once the socket has been read.
    /// Without one: the `POLL_ADD` a read waits on, kept across polls.
    reads: Cell<Option<Key>>,
    /// True when the last non-blocking read drained the socket: the next
    /// read waits for readiness first instead of a `recv` that would fail
    /// (as epoll's readiness bit does). Only without a buffer ring.
    drained: Cell<bool>,
    /// The write-behind buffer of the borrowed-slice writes, made on first use.
    write_behind: Cell<Option<Box<WriteBehind>>>,
    /// Whether this socket's large owned writes go out zero-copy: not
    /// asked yet, yes, or no (the peer is local, or the kernel copied or
    /// refused a zero-copy send on it): plain sends from then on.
    zero_copy: Cell<ZeroCopy>,
    /// A Unix stream socket: never written behind (`write_behind.rs`).
    unix: bool,
}

/// Whether a stream's large owned writes go out as `SEND_ZC`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ZeroCopy {
    /// Not asked yet: the first large write looks at the peer.
    Unasked,
    /// The peer is remote, and no send was copied so far.
    Yes,
    /// Plain sends: the peer is local (the kernel would copy at delivery),
    /// or the kernel copied a zero-copy send after all, or refused one (a
    /// Unix socket).
    No,
}

/// The write-behind buffer, lent out of its stream's cell; put back on drop.
struct Lent<'a> {
    cell: &'a Cell<Option<Box<WriteBehind>>>,
    wb: Option<Box<WriteBehind>>,
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        self.cell.set(self.wb.take());
    }
}

impl StreamSource {
    /// Wraps a connected or connecting socket.
    pub(crate) fn new(driver: &Rc<Driver>, fd: OwnedFd) -> StreamSource {
        StreamSource::with_core(SourceCore::new(driver, fd))
    }

    /// Wraps a connection `driver` accepted as a direct socket.
    pub(crate) fn from_direct(socket: super::listener::DirectSocket) -> StreamSource {
        let (driver, fd) = socket.into_parts();
        StreamSource::with_core(SourceCore::from_shared(&driver, fd))
    }

    /// Shuts the socket down (`how`) at once, without waiting for a
    /// completion (see [`Driver::shutdown_now`]).
    pub(crate) fn shutdown_now(&self, how: std::net::Shutdown) -> io::Result<()> {
        self.core.driver.shutdown_now(&self.core.fd, how)
    }

    /// Sets `SO_LINGER` on a direct socket with no descriptor made (see
    /// [`Driver::set_linger_direct`]); `None`: through the descriptor.
    pub(crate) fn set_linger_direct(
        &self,
        linger: Option<std::time::Duration>,
    ) -> Option<io::Result<()>> {
        self.core.driver.set_linger_direct(&self.core.fd, linger)
    }

    /// Shuts the write side once every byte the poll-form writes took is
    /// sent, without waiting here: a send still in flight goes to the
    /// driver, which shuts the write side after its last byte, within the
    /// send deadline (a peer that never reads then gets a reset, rather
    /// than holding the socket for ever); with none in flight, at once.
    pub(crate) fn shut_write_when_sent(&self) -> io::Result<()> {
        if self.hand_over_written_behind() {
            return Ok(());
        }
        self.shutdown_now(std::net::Shutdown::Write)
    }

    /// Tells the source its socket is a Unix stream: its borrowed-slice
    /// writes are direct sends, never written behind (a Unix socket cannot
    /// be reset, so bytes reported written and still in user space could
    /// only be delivered or silently cut), and its owned writes are never
    /// zero-copy (the kernel refuses them).
    pub(crate) fn mark_unix(&mut self) {
        self.unix = true;
        self.zero_copy.set(ZeroCopy::No);
    }

    /// True if the driver's receive queue holds bytes (or the end) of the
    /// peer's that no read has taken: the multishot receive moves what
    /// arrives out of the kernel's queue, where a peek no longer sees it.
    pub(crate) fn holds_input(&self) -> bool {
        let Some(key) = self.reads.get() else { return false };
        // Inside the driver (never from a task's poll) the queue is not
        // looked at: nothing calls this there.
        self.core.driver.state.try_borrow_mut().is_ok_and(|mut st| st.stream_holds_input(key))
    }

    /// A probe of this socket's receive queue that does not hold it.
    pub(crate) fn probe(&self) -> StreamProbe {
        StreamProbe { fd: Rc::downgrade(&self.core.fd), driver: Rc::downgrade(&self.core.driver) }
    }

    fn with_core(core: SourceCore) -> StreamSource {
        StreamSource {
            core,
            reads: Cell::new(None),
            drained: Cell::new(false),
            write_behind: Cell::new(None),
            zero_copy: Cell::new(ZeroCopy::Unasked),
            unix: false,
        }
    }

    /// Gives the descriptor up, open, once nothing the driver holds on it
    /// can take a byte the next owner should read: the bytes written behind
    /// are sent first, and the multishot receive (or the `POLL_ADD` a read
    /// waits on) is ended, its last completion awaited. Refused, with the
    /// source back unchanged, while received bytes wait in the driver
    /// (`InvalidData`: read them first) or after an error the receive
    /// already reported (that error). A clean end the driver saw stays in
    /// the socket: the next owner's reads return 0.
    ///
    /// Another operation still in flight (a write whose future was dropped,
    /// a zero-copy send's notification) keeps the old descriptor open until
    /// it completes; the next owner then gets a duplicate.
    pub(crate) async fn into_fd(self) -> Result<OwnedFd, (StreamSource, io::Error)> {
        if let Err(e) = std::future::poll_fn(|cx| self.poll_flush(cx)).await {
            return Err((self, e));
        }
        let driver = self.core.driver.clone();
        if driver.reads_from_ring {
            if let Some(key) = self.reads.get() {
                let ended = std::future::poll_fn(|cx| {
                    if !driver.entered.get() {
                        return Poll::Ready(Err(not_running()));
                    }
                    driver.state.borrow_mut().detach_stream(key, cx.waker())
                })
                .await;
                if let Err(e) = ended {
                    return Err((self, e));
                }
                self.reads.set(None);
            }
        } else {
            // A poll takes no bytes: cancelled, it only holds the old
            // descriptor until its completion.
            self.core.cancel_kept(&self.reads);
        }
        // Flushed: nothing for the drop below to hand the driver.
        drop(self.write_behind.take());
        // A direct socket leaves with a plain descriptor, installed now
        // (`FIXED_FD_INSTALL`); its slot is given back as the socket drops.
        if let Err(e) = driver.plain_fd(&self.core.fd) {
            return Err((self, e));
        }
        // The next owner gets a non-blocking socket, as from epoll and as
        // tokio's `from_std` requires: the driver's accepts make blocking
        // ones (its ring operations do not mind), and a blocking one would
        // stall a thread that expects `WouldBlock`. The flag is the open
        // file's, so a duplicate below has it too.
        if let Err(e) = sys::set_nonblocking(self.core.fd(), true) {
            return Err((self, e));
        }
        if Rc::strong_count(&self.core.fd) > 1 {
            // An operation still holds the descriptor: it closes at that
            // operation's end, and the next owner gets its own.
            let owned = self.core.fd.owned().expect("a plain descriptor was installed above");
            let dup = match owned.try_clone() {
                Ok(dup) => dup,
                Err(e) => return Err((self, e)),
            };
            drop(self);
            return Ok(dup);
        }
        let fd = Rc::clone(&self.core.fd);
        drop(self);
        match Rc::try_unwrap(fd).ok().and_then(SockFd::into_plain) {
            Some(fd) => Ok(fd),
            None => unreachable!("a stream's descriptor gained a holder while it was given up"),
        }
    }

    /// The write-behind buffer, lent until the guard drops.
    fn lend_write_behind(&self) -> Lent<'_> {
        Lent { cell: &self.write_behind, wb: self.write_behind.take() }
    }

    /// Sends the initialised bytes of `buf`; may send fewer.
    pub(crate) fn send<B: IoBuf>(&self, buf: B) -> SendOwned<'_, B> {
        SendOwned { src: self, state: SendState::Start(buf) }
    }

    /// Sends the initialised bytes of `buf` with a non-blocking `send(2)`,
    /// as the epoll driver writes: when the socket has room, the bytes are
    /// in the kernel when the write's first poll returns, with no ring
    /// entry, no completion and no second poll of the task. `EAGAIN`
    /// (no room) leaves the write to a `SEND` entry.
    /// A direct socket without a plain descriptor answers `WouldBlock`
    /// (its writes go through the ring).
    fn try_send<B: IoBuf>(&self, buf: &B) -> io::Result<usize> {
        let Some(fd) = self.core.fd.raw_fd() else {
            return Err(io::Error::from_raw_os_error(libc::EAGAIN));
        };
        // SAFETY: `buf` keeps `bytes_init` initialised bytes at `stable_ptr`
        // for the length of this call, which only reads them.
        unsafe { sys::send_nowait(fd, buf.stable_ptr(), buf.bytes_init()) }
    }

    /// Submits a `SEND` of the initialised bytes of `buf`.
    fn submit_send<B: IoBuf>(&self, buf: B) -> Result<Op<B>, (io::Error, B)> {
        let len = buf.bytes_init().min(u32::MAX as usize) as u32;
        let entry = self.core.fd.entry(|t| {
            opcode::Send::new(t, buf.stable_ptr(), len).flags(libc::MSG_NOSIGNAL).build()
        });
        // SAFETY: the entry points at `buf`'s `len` initialised bytes, which IoBuf keeps at a
        // fixed address while `buf` moves; the op owns `buf` until its last completion.
        unsafe { self.core.submit(entry, buf) }
    }

    /// True if an owned write of `buf` goes out zero-copy: the driver
    /// sends writes that large zero-copy, the buffer can give another
    /// handle on its bytes ([`IoBuf::share`]) to keep them alive after the
    /// write returns, the peer is not local, and the kernel has neither
    /// copied nor refused a zero-copy send on this socket.
    fn sends_zero_copy<B: IoBuf>(&self, buf: &B) -> bool {
        let driver = &self.core.driver;
        if driver.send_zc_min_bytes.is_none_or(|min| buf.bytes_init() < min) {
            return false;
        }
        let keep_when_copied = driver.switches.send_zc_when_copied;
        if driver.take_copied_mark(self.core.fd.mark()) && !keep_when_copied {
            self.zero_copy.set(ZeroCopy::No);
        }
        if self.zero_copy.get() == ZeroCopy::Unasked {
            // A local peer's kernel copies the pages at delivery, into a
            // page per fragment charged to the receiver's buffer: a peer
            // with a small receive buffer then advertises a window of a
            // few hundred bytes, and the stream crawls at the pace of the
            // sender's window probes (8 MiB to a 4 KiB buffer: 10 KiB/s,
            // against 0.06 s copied). Asked once, before the first such
            // write, since the notification that reports the copy comes
            // only once that write is acknowledged.
            let local = self.core.fd.raw_fd().is_some_and(sys::peer_is_local);
            let plain = local && !keep_when_copied;
            self.zero_copy.set(if plain { ZeroCopy::No } else { ZeroCopy::Yes });
        }
        self.zero_copy.get() == ZeroCopy::Yes && buf.share().is_some()
    }

    /// Submits a `SEND_ZC` of the initialised bytes of `buf`, asking the
    /// kernel to report whether it copied them after all.
    fn submit_send_zc<B: IoBuf>(&self, buf: B) -> Result<Op<B>, (io::Error, B)> {
        let len = buf.bytes_init().min(u32::MAX as usize) as u32;
        let entry = self.core.fd.entry(|t| {
            opcode::SendZc::new(t, buf.stable_ptr(), len)
                .flags(libc::MSG_NOSIGNAL)
                .zc_flags(SEND_ZC_REPORT_USAGE)
                .build()
        });
        // SAFETY: the entry points at `buf`'s `len` initialised bytes, which IoBuf keeps at a
        // fixed address while `buf` moves; the op owns `buf` until its last completion, which
        // for a zero-copy send is the notification that the kernel no longer reads it.
        unsafe { self.core.submit(entry, buf) }
    }

    /// Submits the send of an owned write: `SEND_ZC` if `zero_copy`
    /// (see [`StreamSource::sends_zero_copy`]), else `SEND`.
    fn submit_owned<B: IoBuf>(&self, buf: B, zero_copy: bool) -> Result<Op<B>, (io::Error, B)> {
        if zero_copy {
            self.submit_send_zc(buf)
        } else {
            self.submit_send(buf)
        }
    }

    /// Ready once the multishot receive queued bytes, an end or an error.
    fn poll_stream_ready(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        let driver = &self.core.driver;
        if !driver.entered.get() {
            return Poll::Ready(Err(not_running()));
        }
        let mut key = self.reads.get();
        let ready = driver.state.borrow_mut().stream_ready(&mut key, &self.core.fd, cx.waker());
        self.reads.set(key);
        if ready {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    /// Ready once the socket has bytes to read (see
    /// [`StreamOps::poll_readable`]), outside the task's budget: for the
    /// reads that wait here and charge the read itself.
    fn poll_read_wait(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        if self.core.driver.reads_from_ring {
            return self.poll_stream_ready(cx);
        }
        let cqe = std::task::ready!(self.core.poll_kept(&self.reads, libc::POLLIN, cx))?;
        self.drained.set(false);
        Poll::Ready(cqe.result().map(drop))
    }

    /// Hands a borrowed-slice write still in flight to the driver, which
    /// shuts the write side after it (see [`WriteBehind::hand_over`]);
    /// false if none was in flight.
    fn hand_over_written_behind(&self) -> bool {
        self.lend_write_behind().wb.as_mut().is_some_and(|wb| wb.hand_over(&self.core))
    }

    /// True while a borrowed-slice write is in flight.
    fn is_writing_behind(&self) -> bool {
        self.lend_write_behind().wb.as_ref().is_some_and(|wb| wb.is_writing())
    }

    /// Waits for the borrowed-slice writes still in flight, so an
    /// owned-buffer write or a shutdown comes after them.
    pub(super) async fn flush_written_behind(&self) -> io::Result<()> {
        if self.is_writing_behind() {
            std::future::poll_fn(|cx| self.poll_flush(cx)).await?;
        }
        Ok(())
    }
}

impl StreamOps for StreamSource {
    /// The raw descriptor.
    fn fd(&self) -> RawFd {
        self.core.fd()
    }

    /// The descriptor, borrowed (the source's own reference keeps it open).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.core.as_fd()
    }

    /// The descriptor, borrowed; a direct socket gets one installed.
    fn try_as_fd(&self) -> io::Result<BorrowedFd<'_>> {
        self.core.try_as_fd()
    }

    /// The descriptor if one is installed, and the slot if direct.
    fn ids_now(&self) -> (Option<RawFd>, Option<u32>) {
        (self.core.fd.raw_fd(), self.core.fd.slot())
    }

    /// Receives into `buf` (from its start up to its capacity).
    ///
    /// Through the socket's one receive path, as every read style is
    /// ([`StreamSource::poll_read_uninit`]): a read dropped while it waits has
    /// taken no bytes, and bytes another style queued come first.
    async fn recv<B: IoBufMut>(&self, mut buf: B) -> BufResult<usize, B> {
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

    /// Sends the buffers in order in one `sendmsg`; may send fewer bytes than all.
    async fn send_vectored<B: IoBuf>(&self, bufs: Vec<B>) -> BufResult<usize, Vec<B>> {
        if let Err(e) = self.flush_written_behind().await {
            return (Err(e), bufs);
        }
        let mut storage = MsgStorage::new(bufs);
        loop {
            let msg: *const libc::msghdr = &*storage.msg;
            let entry = self
                .core
                .fd
                .entry(|t| opcode::SendMsg::new(t, msg).flags(libc::MSG_NOSIGNAL as u32).build());
            // SAFETY: the entry points at the boxed msghdr, which points at the iovec array (a
            // Vec's heap block), which points at the buffers' stable bytes; `storage` owns all
            // three and the op owns `storage` until its last completion.
            let op = match unsafe { self.core.submit(entry, storage) } {
                Ok(op) => op,
                Err((e, s)) => return (Err(e), s.bufs),
            };
            let (cqe, s) = op.await;
            storage = s;
            match cqe.result() {
                Ok(n) => return (Ok(n as usize), storage.bufs),
                Err(e) if is_retry(&e) => {
                    if let Err(e) = self.core.poll_events(libc::POLLOUT).await {
                        return (Err(e), storage.bufs);
                    }
                }
                Err(e) => return (Err(e), storage.bufs),
            }
        }
    }

    /// Connects a fresh socket to `addr`.
    async fn connect(&self, addr: SocketAddr) -> io::Result<()> {
        let (storage, len) = sys::std_to_sockaddr(&addr);
        let storage = Box::new(storage);
        let ptr: *const libc::sockaddr = (&*storage as *const libc::sockaddr_storage).cast();
        let entry = self.core.fd.entry(|t| opcode::Connect::new(t, ptr, len).build());
        // SAFETY: the entry points at the boxed address (`len` bytes), owned by the op until its
        // last completion.
        let op = unsafe { self.core.submit(entry, storage) }.map_err(|(e, _)| e)?;
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
                self.core.poll_events(libc::POLLOUT).await?;
                match sys::getsockopt_int(self.fd(), libc::SOL_SOCKET, libc::SO_ERROR)? {
                    0 => Ok(()),
                    errno => Err(io::Error::from_raw_os_error(errno)),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Shuts down one or both directions of a connection.
    async fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        let how = match how {
            // The end of stream comes after the bytes written behind, as on
            // epoll, where the kernel holds them.
            std::net::Shutdown::Write => {
                self.flush_written_behind().await?;
                libc::SHUT_WR
            }
            // Shutting down both sides is how a connection is cut: it waits
            // for no peer, and cuts nothing either. A send still in flight
            // goes to the driver, which shuts the write side after its last
            // byte (as the kernel sends its buffered bytes before the FIN),
            // within the send deadline; only the read side is shut now.
            std::net::Shutdown::Both if self.hand_over_written_behind() => libc::SHUT_RD,
            std::net::Shutdown::Both => libc::SHUT_RDWR,
            std::net::Shutdown::Read => libc::SHUT_RD,
        };
        let entry = self.core.fd.entry(|t| opcode::Shutdown::new(t, how).build());
        // SAFETY: a shutdown entry points at no memory.
        let op = unsafe { self.core.submit(entry, ()) }.map_err(|(e, _)| e)?;
        let (cqe, ()) = op.await;
        cqe.result().map(drop)
    }

    /// Ready once the socket has bytes to read: with a buffer ring, ready
    /// once the multishot receive queued something; without one, a
    /// `POLL_ADD` kept in the source across polls (dropping it takes no
    /// bytes).
    fn poll_readable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        coop::poll_budgeted(cx, |cx| self.poll_read_wait(cx))
    }

    /// False when the last non-blocking read drained the socket and no
    /// readiness wait has completed since.
    fn may_read_now(&self) -> bool {
        !self.drained.get()
    }

    /// Receives without waiting. With a buffer ring, takes what the
    /// socket's multishot receive queued (arming it on first use);
    /// otherwise a `recv` with `MSG_DONTWAIT` (accepted sockets are
    /// blocking), where a short read or `WouldBlock` records that the
    /// socket is drained.
    fn try_recv(&self, buf: &mut [MaybeUninit<u8>]) -> io::Result<usize> {
        if self.core.driver.reads_from_ring {
            let mut key = self.reads.get();
            let res = self.core.driver.state.borrow_mut().stream_recv(&mut key, &self.core.fd, buf);
            self.reads.set(key);
            return res;
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

    /// Reads into a borrowed slice that may be uninitialised; `Ok(n)`
    /// means its first `n` bytes were written.
    ///
    /// Every read style (owned, pooled, tokio, futures, hyper) comes here
    /// or to [`StreamSource::try_recv`], so the socket has one truth about
    /// its received bytes: the multishot receive's queue in the driver
    /// where there is a buffer ring, the kernel's socket buffer otherwise.
    /// The kernel never holds a read into memory of a future that may be
    /// dropped, so cancelling a read loses nothing.
    fn poll_read_uninit(
        &self,
        cx: &mut TaskContext<'_>,
        dst: &mut [MaybeUninit<u8>],
    ) -> Poll<io::Result<usize>> {
        if dst.is_empty() {
            return Poll::Ready(Ok(0));
        }
        loop {
            if self.may_read_now() {
                // No byte is taken once the task's budget is spent (`coop.rs`).
                std::task::ready!(coop::poll_proceed(cx));
                match self.try_recv(dst) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    r => {
                        coop::spend();
                        return Poll::Ready(r);
                    }
                }
            }
            std::task::ready!(self.poll_read_wait(cx))?;
        }
    }

    /// Writes borrowed slices through the stream's write-behind buffer,
    /// which takes them at once while it has room: under the task's
    /// budget, so a write loop gives way (`coop.rs`).
    fn poll_write_slices(
        &self,
        cx: &mut TaskContext<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        coop::poll_budgeted(cx, |cx| {
            let mut lent = self.lend_write_behind();
            let unix = self.unix;
            lent.wb
                .get_or_insert_with(|| Box::new(WriteBehind::new(unix)))
                .poll_write(&self.core, cx, bufs)
        })
    }

    /// Through the write-behind buffer, which looks at the send in flight
    /// without parking a waker: one that wakes nobody would take the place
    /// of a task waiting on that send.
    fn try_write_slices(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let mut lent = self.lend_write_behind();
        let unix = self.unix;
        lent.wb.get_or_insert_with(|| Box::new(WriteBehind::new(unix))).try_write(&self.core, bufs)
    }

    /// Waits until every byte the borrowed-slice writes took is sent.
    fn poll_flush(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        match self.lend_write_behind().wb.as_mut() {
            Some(wb) => wb.poll_flush(&self.core, cx),
            None => Poll::Ready(Ok(())),
        }
    }

    /// A borrowed-slice write waits only for the write-behind send in
    /// flight: then the buffer takes bytes again. A Unix stream's, never
    /// written behind, waits for room once a write found none (ready until
    /// then, as epoll's readiness).
    fn poll_writable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        coop::poll_budgeted(cx, |cx| {
            if self.unix {
                return match self.lend_write_behind().wb.as_mut() {
                    Some(wb) => wb.poll_room(cx),
                    None => Poll::Ready(Ok(())),
                };
            }
            self.poll_flush(cx)
        })
    }

    /// `sendfile(2)` from the worker (`file.rs`).
    async fn send_file(&self, file: &SharedFile, offset: u64, len: u64) -> (u64, io::Result<()>) {
        self.send_file_from_worker(file, offset, len).await
    }

    /// Drops the write-behind buffer, kept between writes for the next
    /// one, unless a write is in flight: for a connection about to idle.
    #[cfg(feature = "hyper")]
    fn release_idle_buffers(&self) {
        let mut lent = self.lend_write_behind();
        if lent.wb.as_ref().is_some_and(|wb| !wb.is_writing()) {
            lent.wb = None;
        }
    }
}

impl Drop for StreamSource {
    fn drop(&mut self) {
        // A read's readiness wait is cancelled; a borrowed-slice write the
        // caller was told had been taken is finished by the driver (for a
        // while): see `write_behind`. It is handed to the kernel now, not
        // at the next loop turn: the caller may block before that turn.
        let driver = &self.core.driver;
        if !driver.reads_from_ring {
            self.core.cancel_kept(&self.reads);
        }
        if let Some(wb) = self.write_behind.take() {
            let writing = wb.is_writing();
            (*wb).linger(&self.core);
            if writing {
                driver.submit_now();
            }
        }
        if driver.reads_from_ring {
            if let Some(key) = self.reads.get() {
                if let Ok(mut st) = driver.state.try_borrow_mut() {
                    st.release_stream(key, Some(&self.core.fd));
                }
            }
        }
        driver.take_copied_mark(self.core.fd.mark());
        // The core settles last: outside the runtime the socket closes now.
    }
}

/// `IORING_SEND_ZC_REPORT_USAGE` (`<linux/io_uring.h>`): the notification
/// says whether the kernel copied the bytes after all.
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;

/// The future of [`StreamSource::send`]: one state at a time (the buffer,
/// then the `SEND` that owns it, or the wait for room beside it), not a
/// chain of nested state machines that each keep their own copy.
#[must_use = "futures do nothing unless polled"]
pub(crate) struct SendOwned<'a, B: 'static> {
    src: &'a StreamSource,
    state: SendState<B>,
}

/// The operations are parked between polls: `src` has their driver.
enum SendState<B: 'static> {
    /// Not submitted: bytes written behind go first.
    Start(B),
    /// The `SEND` (a `SEND_ZC` if `zero_copy`) is queued or in the
    /// kernel; it owns the buffer.
    Sending { op: ParkedOp<B>, zero_copy: bool },
    /// The kernel said `EAGAIN`: a `POLL_ADD` waits for room, then the
    /// buffer is sent again. The poll is kept as its key (`Op::into_key`):
    /// it points at no memory, and `src` holds the socket it names.
    Room(Key, B),
    /// Returned.
    Done,
}

// Nothing here is pinned: the kernel sees only the buffer's heap bytes.
impl<B> Unpin for SendOwned<'_, B> {}

impl<B: 'static> Drop for SendOwned<'_, B> {
    fn drop(&mut self) {
        // Dropped while an operation waits: as its future, it withdraws or
        // cancels it, the slot keeping the buffer until the kernel is done.
        match std::mem::replace(&mut self.state, SendState::Done) {
            SendState::Sending { op, .. } => drop(op.resume(&self.src.core.driver)),
            SendState::Room(wait, _buf) => {
                drop(Op::resume(&self.src.core.driver, &self.src.core.fd, wait));
            }
            SendState::Start(_) | SendState::Done => {}
        }
    }
}

impl<B: IoBuf> Future for SendOwned<'_, B> {
    type Output = BufResult<usize, B>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let src = this.src;
        loop {
            match std::mem::replace(&mut this.state, SendState::Done) {
                SendState::Start(buf) => {
                    // A send that may complete at once is made under the
                    // task's budget (`coop.rs`); with none left, not at all.
                    if coop::poll_proceed(cx).is_pending() {
                        this.state = SendState::Start(buf);
                        return Poll::Pending;
                    }
                    // An owned write comes after the borrowed-slice writes
                    // still in flight, and reports their failure.
                    if src.is_writing_behind() {
                        match src.poll_flush(cx) {
                            Poll::Pending => {
                                this.state = SendState::Start(buf);
                                return Poll::Pending;
                            }
                            Poll::Ready(Err(e)) => return Poll::Ready((Err(e), buf)),
                            Poll::Ready(Ok(())) => {}
                        }
                    }
                    // A direct send copies: a write that can go zero-copy
                    // goes through the ring even on a quiet worker, as does
                    // one on a direct socket without a plain descriptor.
                    let zero_copy = src.sends_zero_copy(&buf);
                    if !zero_copy && src.core.fd.raw_fd().is_some() {
                        if let Some(res) = src.core.driver.send_directly(|| src.try_send(&buf)) {
                            coop::spend();
                            return Poll::Ready((res, buf));
                        }
                    }
                    match src.submit_owned(buf, zero_copy) {
                        Ok(op) => this.state = SendState::Sending { op: op.park(), zero_copy },
                        Err((e, buf)) => return Poll::Ready((Err(e), buf)),
                    }
                }
                SendState::Sending { op, zero_copy } => {
                    let driver = &src.core.driver;
                    let mut op = op.resume(driver);
                    let user_data = op.user_data();
                    let Poll::Ready((cqe, buf)) = Pin::new(&mut op).poll(cx) else {
                        this.state = SendState::Sending { op: op.park(), zero_copy };
                        return Poll::Pending;
                    };
                    if zero_copy {
                        // The buffer goes back now; its bytes stay alive
                        // in the driver while the kernel may read them.
                        if cqe.more {
                            let Some(keep) = buf.share() else {
                                // The buffer broke `IoBuf`'s contract: it
                                // cannot be handed back (the kernel may
                                // read it), so it is leaked.
                                std::mem::forget(buf);
                                panic!("IoBuf::share gave no handle at a zero-copy send's result");
                            };
                            driver.keep_until_notified(user_data, keep, &src.core.fd);
                        }
                        if cqe.zc_copied && !driver.switches.send_zc_when_copied {
                            src.zero_copy.set(ZeroCopy::No);
                        }
                        // A socket that cannot send zero-copy (`EOPNOTSUPP`:
                        // a Unix socket) sent nothing: plain sends from now on.
                        if cqe.res == -libc::EOPNOTSUPP {
                            src.zero_copy.set(ZeroCopy::No);
                            this.state = SendState::Start(buf);
                            continue;
                        }
                    }
                    match cqe.result() {
                        Ok(n) => return Poll::Ready((Ok(n as usize), buf)),
                        Err(e) if is_retry(&e) => match src.core.submit_poll(libc::POLLOUT) {
                            Ok(wait) => this.state = SendState::Room(wait.into_key(), buf),
                            Err(e) => return Poll::Ready((Err(e), buf)),
                        },
                        Err(e) => return Poll::Ready((Err(e), buf)),
                    }
                }
                SendState::Room(wait, buf) => {
                    let mut wait = Op::resume(&src.core.driver, &src.core.fd, wait);
                    let Poll::Ready((cqe, ())) = Pin::new(&mut wait).poll(cx) else {
                        this.state = SendState::Room(wait.into_key(), buf);
                        return Poll::Pending;
                    };
                    if let Err(e) = cqe.result() {
                        return Poll::Ready((Err(e), buf));
                    }
                    let zero_copy = src.sends_zero_copy(&buf);
                    match src.submit_owned(buf, zero_copy) {
                        Ok(op) => this.state = SendState::Sending { op: op.park(), zero_copy },
                        Err((e, buf)) => return Poll::Ready((Err(e), buf)),
                    }
                }
                SendState::Done => panic!("a send polled after it completed"),
            }
        }
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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;
    use std::task::{Context, Waker};
    use std::time::Duration;

    use super::*;
    use crate::driver::config::{DriverConfig, DriverKind, Registration, UringSwitches};
    use crate::driver::park::Park;
    use crate::driver::wake::Unpark;
    use crate::stats::WorkerStats;

    /// A driver with `switches`, entered.
    fn driver_with(switches: UringSwitches) -> Option<Rc<Driver>> {
        if crate::runtime::uring_available().is_err() {
            eprintln!("skipped: io_uring is not available");
            return None;
        }
        let config = DriverConfig {
            kind: DriverKind::Uring,
            registration: Registration::Lazy,
            events_per_poll_max: 64,
            uring_entries: 64,
            kernel_busy_poll: None,
            uring_switches: switches,
        };
        let unpark = Arc::new(Unpark::new().unwrap());
        let (driver, _, _) =
            Driver::new(&config, unpark, Arc::new(WorkerStats::default())).unwrap();
        driver.entered.set(true);
        Some(driver)
    }

    /// A driver without a buffer ring (as before Linux 6.0), entered.
    fn driver_without_buf_ring() -> Option<Rc<Driver>> {
        let driver =
            driver_with(UringSwitches { multishot_recv: false, ..UringSwitches::from_env() })?;
        assert!(!driver.reads_from_ring);
        Some(driver)
    }

    /// Operations in the driver's slab.
    fn ops(driver: &Driver) -> usize {
        driver.state.borrow().ops.len()
    }

    /// Turns the ring until no operation is left (at most a second).
    fn drain(driver: &Driver) {
        for _ in 0..1000 {
            driver.poll(Park::Skip).unwrap();
            if ops(driver) == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Without a buffer ring a read waits on a `POLL_ADD` the stream keeps
    /// by its key: the wait completes when bytes come, and the next one is
    /// a new entry.
    #[test]
    fn a_read_wait_kept_by_key_completes_and_is_made_again() {
        let Some(driver) = driver_without_buf_ring() else { return };
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let src = StreamSource::new(&driver, OwnedFd::from(ours));
        let mut cx = Context::from_waker(Waker::noop());
        let mut buf = [MaybeUninit::uninit(); 8];
        assert_eq!(src.try_recv(&mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        assert!(!src.may_read_now());
        assert!(src.poll_readable(&mut cx).is_pending());
        assert!(src.reads.get().is_some() && ops(&driver) == 1);
        // Polled again, the same entry: nothing new is submitted.
        assert!(src.poll_readable(&mut cx).is_pending());
        assert_eq!(ops(&driver), 1);
        peer.write_all(b"hi").unwrap();
        let mut ready = src.poll_readable(&mut cx);
        for _ in 0..1000 {
            if ready.is_ready() {
                break;
            }
            driver.poll(Park::Skip).unwrap();
            std::thread::sleep(Duration::from_millis(1));
            ready = src.poll_readable(&mut cx);
        }
        assert!(matches!(ready, Poll::Ready(Ok(()))));
        assert!(src.reads.get().is_none() && src.may_read_now());
        assert_eq!(ops(&driver), 0);
        assert_eq!(src.try_recv(&mut buf).unwrap(), 2);
    }

    /// Counts its wakes.
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Two tasks waiting to read one stream without a buffer ring share
    /// its kept `POLL_ADD`: its completion wakes both, not only the last
    /// to poll (which may have given up).
    #[test]
    fn a_read_wait_kept_by_key_wakes_every_task_waiting() {
        let Some(driver) = driver_without_buf_ring() else { return };
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let src = StreamSource::new(&driver, OwnedFd::from(ours));
        let counts: Vec<Arc<Count>> =
            (0..2).map(|_| Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)))).collect();
        let wakers: Vec<Waker> = counts.iter().map(|c| Waker::from(c.clone())).collect();
        for w in &wakers {
            assert!(src.poll_readable(&mut Context::from_waker(w)).is_pending());
        }
        assert_eq!(ops(&driver), 1, "one wait for both");
        peer.write_all(b"hi").unwrap();
        let woken = |c: &Arc<Count>| c.0.load(std::sync::atomic::Ordering::Relaxed);
        for _ in 0..1000 {
            driver.poll(Park::Skip).unwrap();
            if counts.iter().all(|c| woken(c) > 0) {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(counts.iter().map(woken).collect::<Vec<_>>(), [1, 1]);
        assert!(src.poll_readable(&mut Context::from_waker(&wakers[0])).is_ready());
    }

    /// Streams dropped outside the runtime's turn each wait for their own
    /// cancelled read wait only: a cancelled operation of another socket
    /// that the kernel never ends costs them nothing (it cost each drop
    /// the whole settle bound, 100 ms), and each socket still closes at once.
    #[test]
    fn streams_dropped_off_turn_wait_only_for_their_own_operations() {
        let Some(driver) = driver_without_buf_ring() else { return };
        let stuck = driver.state.borrow_mut().ops.insert_stuck();
        let mut cx = Context::from_waker(Waker::noop());
        let mut pairs = Vec::new();
        for _ in 0..10 {
            let (ours, peer) = UnixStream::pair().unwrap();
            let src = StreamSource::new(&driver, OwnedFd::from(ours));
            assert!(src.poll_readable(&mut cx).is_pending());
            pairs.push((src, peer));
        }
        // The kernel has every wait; then the runtime leaves the thread.
        driver.poll(Park::Skip).unwrap();
        driver.entered.set(false);
        let started = std::time::Instant::now();
        let peers: Vec<UnixStream> = pairs
            .into_iter()
            .map(|(src, peer)| {
                drop(src);
                peer
            })
            .collect();
        let took = started.elapsed();
        for mut peer in peers {
            peer.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            assert_eq!(peer.read(&mut [0; 8]).unwrap(), 0, "a dropped stream stayed open");
        }
        assert!(took < Duration::from_millis(400), "10 drops took {took:?}");
        driver.state.borrow_mut().ops.remove(stuck);
    }

    /// A stream dropped while its read waits cancels the wait, and the
    /// descriptor stays open until the cancel's last completion, then
    /// closes: the peer sees the end.
    #[test]
    fn a_read_wait_kept_by_key_is_cancelled_with_its_stream() {
        let Some(driver) = driver_without_buf_ring() else { return };
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let src = StreamSource::new(&driver, OwnedFd::from(ours));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(src.poll_readable(&mut cx).is_pending());
        // The kernel has the entry.
        driver.poll(Park::Skip).unwrap();
        let fd = Rc::downgrade(&src.core.fd);
        drop(src);
        assert!(fd.upgrade().is_some(), "closed while the kernel may still poll it");
        drain(&driver);
        assert_eq!(ops(&driver), 0, "the wait was not cancelled");
        assert!(fd.upgrade().is_none(), "the descriptor outlived its last operation");
        peer.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        assert_eq!(peer.read(&mut [0; 8]).unwrap(), 0);
    }
}
