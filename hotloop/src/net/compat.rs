//! `TcpStream` and `UnixStream` as tokio's and futures' `AsyncRead`/
//! `AsyncWrite`, so the libraries written for them (hyper, tower, tonic,
//! ...) run on hotloop.
//!
//! These sit on the same driver paths as the owned-buffer API, so read and
//! write styles can be mixed on one stream: on epoll a read goes straight
//! into the caller's slice; on io_uring it copies from the socket's
//! receive queue, which every read style shares (the kernel never writes
//! into the caller's slice, which may be gone before it would). Writes on
//! io_uring are written behind and flushed by `poll_flush`. Both stream
//! types forward to their shared core (`stream_core.rs`); one macro per
//! trait family writes the identical impls for each type.

use std::io;
use std::task::{Context, Poll};

use super::{TcpStream, UnixStream};

/// The poll forms, the same on both stream types.
macro_rules! poll_forms {
    ($ty:ident) => {
        impl $ty {
            /// Reads into `buf` (the poll form behind the `AsyncRead` impls).
            pub fn poll_read_slice(
                &self,
                cx: &mut Context<'_>,
                buf: &mut [u8],
            ) -> Poll<io::Result<usize>> {
                self.core().poll_read_slice(cx, buf)
            }

            /// Writes from `buf` (the poll form behind the `AsyncWrite` impls).
            pub fn poll_write_slice(
                &self,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                self.core().poll_write_slice(cx, buf)
            }

            /// Writes from several slices at once.
            pub fn poll_write_slices(
                &self,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                self.core().poll_write_slices(cx, bufs)
            }

            /// Waits until every byte the poll-form writes accepted is in the
            /// kernel (the poll form behind `poll_flush`). On io_uring those writes
            /// are written behind; on epoll they are in the kernel already.
            pub fn poll_flush_writes(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                self.core().poll_flush(cx)
            }

            /// Flushes, then shuts down the write half (the poll form behind
            /// `poll_shutdown`/`poll_close`).
            pub fn poll_shutdown_write(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                self.core().poll_shutdown_write(cx)
            }
        }
    };
}

poll_forms!(TcpStream);
poll_forms!(UnixStream);

#[cfg(feature = "tokio-io")]
mod tokio_impls {
    use super::*;
    use std::pin::Pin;
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

    macro_rules! tokio_io {
        ($ty:ident) => {
            impl AsyncRead for $ty {
                fn poll_read(
                    self: Pin<&mut Self>,
                    cx: &mut Context<'_>,
                    buf: &mut ReadBuf<'_>,
                ) -> Poll<io::Result<()>> {
                    // Into the spare room as it is: no zeroing first.
                    self.core().source().poll_read_buf(cx, buf)
                }
            }

            impl AsyncWrite for $ty {
                fn poll_write(
                    self: Pin<&mut Self>,
                    cx: &mut Context<'_>,
                    buf: &[u8],
                ) -> Poll<io::Result<usize>> {
                    self.poll_write_slice(cx, buf)
                }

                fn poll_write_vectored(
                    self: Pin<&mut Self>,
                    cx: &mut Context<'_>,
                    bufs: &[io::IoSlice<'_>],
                ) -> Poll<io::Result<usize>> {
                    self.poll_write_slices(cx, bufs)
                }

                fn is_write_vectored(&self) -> bool {
                    true
                }

                fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                    self.poll_flush_writes(cx)
                }

                fn poll_shutdown(
                    self: Pin<&mut Self>,
                    cx: &mut Context<'_>,
                ) -> Poll<io::Result<()>> {
                    self.poll_shutdown_write(cx)
                }
            }
        };
    }

    tokio_io!(TcpStream);
    tokio_io!(UnixStream);
}

#[cfg(feature = "futures-io")]
mod futures_impls {
    use super::*;
    use futures_io::{AsyncRead, AsyncWrite};
    use std::pin::Pin;

    macro_rules! futures_io {
        ($ty:ident) => {
            impl AsyncRead for $ty {
                fn poll_read(
                    self: Pin<&mut Self>,
                    cx: &mut Context<'_>,
                    buf: &mut [u8],
                ) -> Poll<io::Result<usize>> {
                    self.poll_read_slice(cx, buf)
                }
            }

            impl AsyncWrite for $ty {
                fn poll_write(
                    self: Pin<&mut Self>,
                    cx: &mut Context<'_>,
                    buf: &[u8],
                ) -> Poll<io::Result<usize>> {
                    self.poll_write_slice(cx, buf)
                }

                fn poll_write_vectored(
                    self: Pin<&mut Self>,
                    cx: &mut Context<'_>,
                    bufs: &[io::IoSlice<'_>],
                ) -> Poll<io::Result<usize>> {
                    self.poll_write_slices(cx, bufs)
                }

                fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                    self.poll_flush_writes(cx)
                }

                fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                    self.poll_shutdown_write(cx)
                }
            }
        };
    }

    futures_io!(TcpStream);
    futures_io!(UnixStream);
}
