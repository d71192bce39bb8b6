//! The byte-stream core that [`TcpStream`](super::TcpStream) and
//! [`UnixStream`](super::UnixStream) share.
//!
//! # Implementation notes
//! The driver's socket source works on any connected stream descriptor, so
//! both stream types hold a `StreamCore` and forward to it. The owned-buffer
//! forwarders return the core's futures instead of wrapping them in an
//! `async fn` of their own: the future a caller awaits is the driver's
//! operation with no extra state machine around it, so a TCP read or write
//! costs what it did before the core was shared.

use std::future::Future;
use std::io;
use std::net::Shutdown;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::task::{Context, Poll};

use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::driver::{Accepted, StreamSource};
use crate::runtime::current;

/// The bytes read and written per step when a file is sent by copying.
const COPY_CHUNK_BYTES: usize = 64 * 1024;

/// True for the errors with which `sendfile` or `splice` refuse a file or
/// a socket (as opposed to a failed connection): copying still works.
fn refused_by_kernel(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP | libc::ESPIPE))
}

/// A connected stream socket on one worker's driver.
pub(crate) struct StreamCore {
    src: StreamSource,
}

impl StreamCore {
    /// Wraps a connected (or connecting) socket on the current worker's driver.
    pub(crate) fn new(fd: OwnedFd) -> io::Result<StreamCore> {
        let src = current::with_driver(|d| StreamSource::new(d, fd))?;
        Ok(StreamCore { src })
    }

    /// The same core, told that its socket is a Unix stream (see
    /// [`StreamSource::mark_unix`]).
    pub(crate) fn into_unix(mut self) -> StreamCore {
        self.src.mark_unix();
        self
    }

    /// Wraps a connection a listener of the current worker accepted (a
    /// direct io_uring socket stays one).
    pub(crate) fn from_accepted(accepted: Accepted) -> io::Result<StreamCore> {
        let src = current::with_driver(|d| StreamSource::from_accepted(d, accepted))?;
        Ok(StreamCore { src })
    }

    /// Gives the descriptor up, open, out of this worker's driver (see
    /// [`TcpStream::into_std`](super::TcpStream::into_std)); on a refusal
    /// the core comes back as it was.
    pub(crate) async fn into_fd(self) -> Result<OwnedFd, (StreamCore, io::Error)> {
        self.src.into_fd().await.map_err(|(src, e)| (StreamCore { src }, e))
    }

    pub(crate) fn source(&self) -> &StreamSource {
        &self.src
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.src.fd()
    }

    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        self.src.as_fd()
    }

    /// Sets `SO_LINGER` without a descriptor on a socket that has none
    /// (see `StreamSource::set_linger_direct`); `None`: through the descriptor.
    pub(crate) fn set_linger_direct(
        &self,
        linger: Option<std::time::Duration>,
    ) -> Option<io::Result<()>> {
        self.src.set_linger_direct(linger)
    }

    /// The descriptor, borrowed, or why none can be had (see
    /// `StreamOps::try_as_fd`).
    pub(crate) fn try_as_fd(&self) -> io::Result<BorrowedFd<'_>> {
        self.src.try_as_fd()
    }

    /// The descriptor and direct slot the socket has now, installing
    /// neither (see `StreamOps::ids_now`).
    pub(crate) fn ids_now(&self) -> (Option<RawFd>, Option<u32>) {
        self.src.ids_now()
    }

    /// See [`TcpStream::read_owned`](super::TcpStream::read_owned).
    #[inline]
    pub(crate) fn read<B: IoBufMut>(
        &self,
        buf: B,
    ) -> impl Future<Output = BufResult<usize, B>> + '_ {
        self.src.recv(buf)
    }

    /// See [`TcpStream::read_pooled`](super::TcpStream::read_pooled).
    #[inline]
    pub(crate) fn read_pooled(&self) -> super::ReadPooled<'_> {
        super::pool::ReadPooled::new(&self.src)
    }

    /// See [`TcpStream::write_owned`](super::TcpStream::write_owned).
    #[inline]
    pub(crate) fn write<B: IoBuf>(&self, buf: B) -> impl Future<Output = BufResult<usize, B>> + '_ {
        self.src.send(buf)
    }

    /// Writes all of `buf`.
    pub(crate) async fn write_all<B: IoBuf>(&self, buf: B) -> BufResult<(), B> {
        let total = buf.bytes_init();
        let mut slice = buf.slice(..);
        let mut done = 0;
        while done < total {
            let (res, s) = self.src.send(slice).await;
            let buf = s.into_inner();
            match res {
                Ok(0) => return (Err(io::ErrorKind::WriteZero.into()), buf),
                Ok(n) => done += n,
                Err(e) => return (Err(e), buf),
            }
            slice = buf.slice(done..);
        }
        (Ok(()), slice.into_inner())
    }

    /// See [`TcpStream::write_vectored_owned`](super::TcpStream::write_vectored_owned).
    #[inline]
    pub(crate) fn write_vectored<B: IoBuf>(
        &self,
        bufs: Vec<B>,
    ) -> impl Future<Output = BufResult<usize, Vec<B>>> + '_ {
        self.src.send_vectored(bufs)
    }

    /// See [`TcpStream::send_file`](super::TcpStream::send_file).
    pub(crate) async fn send_file(
        &self,
        file: &crate::fs::File,
        offset: u64,
        len: u64,
    ) -> io::Result<u64> {
        let (sent, res) = self.src.send_file(file.shared(), offset, len).await;
        match res {
            Ok(()) => Ok(sent),
            Err(e) if refused_by_kernel(&e) => {
                let more = self.send_file_copying(file, offset + sent, len - sent).await?;
                Ok(sent + more)
            }
            Err(e) => Err(e),
        }
    }

    /// [`send_file`](Self::send_file) by reading and writing, for files the
    /// kernel will not splice or `sendfile` (some pseudo file systems).
    async fn send_file_copying(
        &self,
        file: &crate::fs::File,
        offset: u64,
        len: u64,
    ) -> io::Result<u64> {
        let mut buf = Vec::with_capacity(COPY_CHUNK_BYTES.min(len as usize));
        let mut sent = 0;
        while sent < len {
            buf.clear();
            buf.reserve(COPY_CHUNK_BYTES.min((len - sent) as usize));
            let (res, b) = file.read_at(buf, offset + sent).await;
            let mut chunk = b;
            let n = res?;
            if n == 0 {
                break;
            }
            chunk.truncate(n.min((len - sent) as usize));
            let (res, b) = self.write_all(chunk).await;
            res?;
            sent += b.len() as u64;
            buf = b;
        }
        Ok(sent)
    }

    /// Shuts down the read half, the write half or both.
    #[inline]
    pub(crate) fn shutdown(&self, how: Shutdown) -> impl Future<Output = io::Result<()>> + '_ {
        self.src.shutdown(how)
    }

    /// See [`TcpStream::poll_read_ready`](super::TcpStream::poll_read_ready).
    pub(crate) fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.src.poll_readable(cx)
    }

    /// See [`TcpStream::poll_write_ready`](super::TcpStream::poll_write_ready).
    pub(crate) fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.src.poll_writable(cx)
    }

    /// See [`TcpStream::try_read`](super::TcpStream::try_read).
    pub(crate) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.src.try_recv_slice(buf)
    }

    /// See [`TcpStream::try_write`](super::TcpStream::try_write): the
    /// poll-form write without waiting, which parks no waker (the caller
    /// waits with `writable`, which files its own, and another task's
    /// wait keeps its wake-up).
    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.src.try_write_slices(&[io::IoSlice::new(buf)])
    }

    /// Drops what the stream keeps between poll-form writes, unless a
    /// write is in flight: for a connection about to idle.
    #[cfg(feature = "hyper")]
    pub(crate) fn release_idle_buffers(&self) {
        self.src.release_idle_buffers()
    }

    /// Reads into a borrowed slice (the poll form behind `AsyncRead`).
    pub(crate) fn poll_read_slice(
        &self,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.src.poll_read_slice(cx, buf)
    }

    /// Writes from a borrowed slice (the poll form behind `AsyncWrite`).
    pub(crate) fn poll_write_slice(
        &self,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.src.poll_write_slice(cx, buf)
    }

    /// Writes from several borrowed slices with one call.
    pub(crate) fn poll_write_slices(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.src.poll_write_slices(cx, bufs)
    }

    /// Waits until every byte the poll-form writes accepted is in the kernel.
    pub(crate) fn poll_flush(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.src.poll_flush(cx)
    }

    /// Shuts down the write half once the bytes the poll-form writes took
    /// are sent, without waiting for them (see
    /// `StreamSource::shut_write_when_sent`).
    pub(crate) fn shut_write_when_sent(&self) -> io::Result<()> {
        match self.src.shut_write_when_sent() {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            other => other,
        }
    }

    /// Flushes, then shuts down the write half.
    pub(crate) fn poll_shutdown_write(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.src.poll_flush(cx))?;
        // shutdown(2) never blocks, so the poll form shuts down at once on either driver.
        match self.src.shutdown_now(Shutdown::Write) {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Poll::Ready(Ok(())),
            other => Poll::Ready(other),
        }
    }
}
