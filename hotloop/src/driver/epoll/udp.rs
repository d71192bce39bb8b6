//! UDP on the epoll driver: `recvmmsg`/`sendmmsg` and `recvmsg`/`sendmsg`
//! with ancillary data, tried first and parked on readiness only when they
//! would block (lazy registration, as for TCP).
//!
//! A batch that moved fewer datagrams than asked drained the receive
//! queue (or filled the send buffer), so the next one waits for an edge.
//! A single datagram says nothing about what is left, so it keeps the bit.

use std::cell::Cell;
use std::future::{pending, poll_fn};
use std::io::{self, IoSliceMut};
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use super::source::SourceCore;
use super::{Direction, Driver};
use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::driver::contract::DatagramOps;
use crate::driver::udp::{self, MsgBuf, RecvMeta, SendMeta, Transmit};
use crate::sys;

/// A datagram socket owned by one epoll driver, closed when dropped.
pub(crate) struct DatagramSource {
    core: SourceCore,
    /// Receives pend for good ([`DatagramOps::stop_receiving`]).
    stopped: Cell<bool>,
}

impl DatagramSource {
    /// Wraps a non-blocking datagram socket; in eager mode, registers it now.
    pub(crate) fn new(driver: &Rc<Driver>, fd: OwnedFd) -> io::Result<DatagramSource> {
        Ok(DatagramSource { core: SourceCore::new(driver, fd)?, stopped: Cell::new(false) })
    }
}

impl DatagramOps for DatagramSource {
    /// The raw descriptor.
    fn fd(&self) -> RawFd {
        self.core.fd()
    }

    /// Never: epoll has no ring to receive from.
    fn receives_from_ring(&self) -> bool {
        false
    }

    /// The descriptor, borrowed.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.core.as_fd()
    }

    /// Receives pend from now on; nothing is armed to cancel (a read is
    /// only ever made when a receive asks).
    fn stop_receiving(&self) {
        self.stopped.set(true);
    }

    /// Receives one datagram into `buf` (from its start up to its capacity).
    async fn recv_msg<B: IoBufMut>(&self, mut buf: B) -> BufResult<RecvMeta, B> {
        if self.stopped.get() {
            return pending().await;
        }
        let fd = self.fd();
        let res = poll_fn(|cx| {
            self.core.poll_io(cx, Direction::Read, || {
                let mut msg = MsgBuf::new();
                msg.prepare_recv(buf.stable_mut_ptr(), buf.bytes_total());
                // SAFETY: the header points at `msg` (live for the call) and at the buffer's
                // `bytes_total` writable bytes, owned by this future.
                let n = unsafe { sys::recvmsg(fd, &mut msg.hdr, libc::MSG_DONTWAIT) }?;
                Ok(msg.decode_recv(n))
            })
        })
        .await;
        if let Ok(meta) = &res {
            // SAFETY: the kernel wrote `len` bytes at the start of the buffer.
            unsafe { buf.set_init(meta.len) };
        }
        (res, buf)
    }

    /// Sends the initialised bytes of `buf` as one datagram (or a GSO train).
    async fn send_msg<B: IoBuf>(&self, buf: B, meta: SendMeta) -> BufResult<usize, B> {
        let fd = self.fd();
        let res = poll_fn(|cx| {
            self.core.poll_io(cx, Direction::Write, || {
                let mut msg = MsgBuf::new();
                msg.prepare_send(buf.stable_ptr(), buf.bytes_init(), &meta);
                // SAFETY: the header points at `msg` (live for the call) and at the buffer's
                // `bytes_init` bytes, owned by this future.
                unsafe { sys::sendmsg_hdr(fd, &msg.hdr, libc::MSG_DONTWAIT) }
            })
        })
        .await;
        (res, buf)
    }

    /// Receives a batch of datagrams into borrowed buffers (`recvmmsg`).
    fn poll_recv_batch(
        &self,
        cx: &mut TaskContext<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        if self.stopped.get() {
            return Poll::Pending;
        }
        let fd = self.fd();
        let asked = bufs.len().min(meta.len()).min(udp::BATCH_DATAGRAMS_MAX);
        let polled = self.core.poll_io(cx, Direction::Read, || udp::recv_batch(fd, bufs, meta));
        if let Poll::Ready(Ok(n)) = polled {
            if asked > 1 && n < asked {
                self.core.clear_ready(Direction::Read);
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
        let asked = transmits.len().min(udp::BATCH_DATAGRAMS_MAX);
        let polled = self.core.poll_io(cx, Direction::Write, || udp::send_batch(fd, transmits));
        if let Poll::Ready(Ok(n)) = polled {
            if n < asked {
                self.core.clear_ready(Direction::Write);
            }
        }
        polled
    }

    /// Sends one transmit now or says `WouldBlock` (and remembers that the
    /// send buffer is full, so [`DatagramSource::writable`] waits for room).
    fn try_send_one(&self, transmit: &Transmit<'_>) -> io::Result<usize> {
        if !self.core.is_ready(Direction::Write) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        loop {
            match udp::send_one(self.fd(), transmit) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.core.clear_ready(Direction::Write);
                    return Err(e);
                }
                r => return r,
            }
        }
    }

    /// Waits until the socket may have room to send.
    async fn writable(&self) -> io::Result<()> {
        poll_fn(|cx| self.core.poll_ready(cx, Direction::Write)).await
    }
}
