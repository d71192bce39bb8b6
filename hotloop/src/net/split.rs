//! A [`TcpStream`]'s read and write halves, as tokio's `into_split` and
//! `split` give them.
//!
//! # Implementation notes
//! Every stream operation takes `&self`, so the halves need no lock and
//! no second descriptor: the owned halves share the stream through an
//! `Rc` (a stream never leaves its worker, so neither do they), and the
//! borrowed halves are references. Each half offers only its direction.
//! Dropping the owned write half shuts the write side down, as tokio's
//! does: at once if nothing it wrote is still on its way, else (io_uring's
//! write-behind) by the driver once the bytes are out, so the peer never
//! sees the end before the data, within the driver's send deadline (a
//! peer that never reads gets a reset then, as a dropped stream's does).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::task::{Context, Poll};

use super::TcpStream;
use crate::buf::{BufResult, IoBuf, IoBufMut};

/// The read half of a [`TcpStream`], from [`TcpStream::into_split`].
pub struct OwnedReadHalf {
    stream: Rc<TcpStream>,
}

/// The write half of a [`TcpStream`], from [`TcpStream::into_split`].
/// Dropping it shuts the stream's write side down.
pub struct OwnedWriteHalf {
    stream: Rc<TcpStream>,
    /// False once `forget` or `reunite` took the half apart.
    shutdown_on_drop: bool,
}

/// The error of [`OwnedReadHalf::reunite`]: the halves came from two
/// streams; they are given back.
pub struct ReuniteError(pub OwnedReadHalf, pub OwnedWriteHalf);

pub(super) fn into_split(stream: TcpStream) -> (OwnedReadHalf, OwnedWriteHalf) {
    let stream = Rc::new(stream);
    (OwnedReadHalf { stream: stream.clone() }, OwnedWriteHalf { stream, shutdown_on_drop: true })
}

impl OwnedReadHalf {
    /// The stream again, if `write` is its other half.
    pub fn reunite(self, mut write: OwnedWriteHalf) -> Result<TcpStream, ReuniteError> {
        if !Rc::ptr_eq(&self.stream, &write.stream) {
            return Err(ReuniteError(self, write));
        }
        write.shutdown_on_drop = false;
        drop(write);
        // The only holder left: the two halves were the stream's only holders.
        Ok(Rc::try_unwrap(self.stream).unwrap_or_else(|_| unreachable!("a third holder")))
    }

    /// See [`TcpStream::read_owned`].
    pub async fn read_owned<B: IoBufMut>(&self, buf: B) -> BufResult<usize, B> {
        self.stream.read_owned(buf).await
    }

    /// See [`TcpStream::read_pooled`].
    pub fn read_pooled(&self) -> super::ReadPooled<'_> {
        self.stream.read_pooled()
    }

    /// See [`TcpStream::readable`].
    pub async fn readable(&self) -> io::Result<()> {
        self.stream.readable().await
    }

    /// See [`TcpStream::poll_read_ready`].
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream.poll_read_ready(cx)
    }

    /// See [`TcpStream::try_read`].
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.try_read(buf)
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.stream.peer_addr()
    }
}

impl OwnedWriteHalf {
    /// The stream again, if `read` is its other half.
    pub fn reunite(self, read: OwnedReadHalf) -> Result<TcpStream, ReuniteError> {
        read.reunite(self)
    }

    /// Drops the half without shutting the write side down.
    pub fn forget(mut self) {
        self.shutdown_on_drop = false;
    }

    /// See [`TcpStream::write_owned`].
    pub async fn write_owned<B: IoBuf>(&self, buf: B) -> BufResult<usize, B> {
        self.stream.write_owned(buf).await
    }

    /// See [`TcpStream::write_all_owned`].
    pub async fn write_all_owned<B: IoBuf>(&self, buf: B) -> BufResult<(), B> {
        self.stream.write_all_owned(buf).await
    }

    /// See [`TcpStream::write_vectored_owned`].
    pub async fn write_vectored_owned<B: IoBuf>(&self, bufs: Vec<B>) -> BufResult<usize, Vec<B>> {
        self.stream.write_vectored_owned(bufs).await
    }

    /// See [`TcpStream::writable`].
    pub async fn writable(&self) -> io::Result<()> {
        self.stream.writable().await
    }

    /// See [`TcpStream::poll_write_ready`].
    pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream.poll_write_ready(cx)
    }

    /// See [`TcpStream::try_write`].
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.stream.try_write(buf)
    }

    /// Shuts the write side down now (after the bytes written are out).
    pub async fn shutdown(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.stream.poll_shutdown_write(cx)).await
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.stream.peer_addr()
    }
}

impl Drop for OwnedWriteHalf {
    fn drop(&mut self) {
        if !self.shutdown_on_drop {
            return;
        }
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if self.stream.poll_shutdown_write(&mut cx).is_ready() {
            return;
        }
        // A write is still on its way: the driver shuts the write side
        // after it, within its send deadline, so no task is left waiting
        // on a peer that may never read (one would hold the socket for as
        // long). Off a worker the driver cannot be reached; the stream's
        // close ends it.
        if crate::runtime::current::on_worker() {
            let _ = self.stream.core().shut_write_when_sent();
        }
    }
}

impl fmt::Debug for OwnedReadHalf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("OwnedReadHalf").field(&*self.stream).finish()
    }
}

impl fmt::Debug for OwnedWriteHalf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("OwnedWriteHalf").field(&*self.stream).finish()
    }
}

impl fmt::Debug for ReuniteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReuniteError(..)")
    }
}

impl fmt::Display for ReuniteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tried to reunite halves that are not from the same stream")
    }
}

impl std::error::Error for ReuniteError {}

/// The read half of a borrowed [`TcpStream`], from [`TcpStream::split`].
#[derive(Debug)]
pub struct ReadHalf<'a> {
    stream: &'a TcpStream,
}

/// The write half of a borrowed [`TcpStream`], from [`TcpStream::split`].
#[derive(Debug)]
pub struct WriteHalf<'a> {
    stream: &'a TcpStream,
}

pub(super) fn split(stream: &TcpStream) -> (ReadHalf<'_>, WriteHalf<'_>) {
    (ReadHalf { stream }, WriteHalf { stream })
}

impl ReadHalf<'_> {
    /// The stream both halves borrow, for its other methods.
    pub fn stream(&self) -> &TcpStream {
        self.stream
    }
}

impl WriteHalf<'_> {
    /// The stream both halves borrow, for its other methods.
    pub fn stream(&self) -> &TcpStream {
        self.stream
    }
}

#[cfg(feature = "tokio-io")]
mod tokio_impls {
    use super::*;
    use std::pin::Pin;
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

    macro_rules! halves {
        ($read:ty, $write:ty) => {
            impl AsyncRead for $read {
                fn poll_read(
                    self: Pin<&mut Self>,
                    cx: &mut Context<'_>,
                    buf: &mut ReadBuf<'_>,
                ) -> Poll<io::Result<()>> {
                    self.stream.core().source().poll_read_buf(cx, buf)
                }
            }

            impl AsyncWrite for $write {
                fn poll_write(
                    self: Pin<&mut Self>,
                    cx: &mut Context<'_>,
                    buf: &[u8],
                ) -> Poll<io::Result<usize>> {
                    self.stream.poll_write_slice(cx, buf)
                }

                fn poll_write_vectored(
                    self: Pin<&mut Self>,
                    cx: &mut Context<'_>,
                    bufs: &[io::IoSlice<'_>],
                ) -> Poll<io::Result<usize>> {
                    self.stream.poll_write_slices(cx, bufs)
                }

                fn is_write_vectored(&self) -> bool {
                    true
                }

                fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                    self.stream.poll_flush_writes(cx)
                }

                /// Shuts the write side down (after the bytes written are out).
                fn poll_shutdown(
                    self: Pin<&mut Self>,
                    cx: &mut Context<'_>,
                ) -> Poll<io::Result<()>> {
                    self.stream.poll_shutdown_write(cx)
                }
            }
        };
    }

    halves!(OwnedReadHalf, OwnedWriteHalf);
    halves!(ReadHalf<'_>, WriteHalf<'_>);
}
