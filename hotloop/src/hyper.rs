//! hyper 1.x on hotloop: an executor that spawns on the current worker, a
//! timer on the worker's wheel, and [`serve_hyper`], which serves a hyper
//! `Service` (HTTP/1.1, and HTTP/2 by prior knowledge) on every worker.
//!
//! Connections speak hyper's I/O traits through [`HyperIo`], which sits on
//! [`TcpStream`]'s poll-form reads and writes on either driver. It needs
//! neither tokio's traits nor `hyper_util`'s `TokioIo`, so a server built on
//! this module links no tokio runtime code.
//!
//! # Implementation notes
//!
//! hyper hands reads an uninitialised cursor. Filling it in place needs
//! `unsafe`, which hotloop keeps to its buffer and driver layers, so a read
//! lands in a zeroed stack chunk of [`READ_CHUNK_BYTES`] first and is
//! copied out. `TokioIo` zeroes the whole cursor on every read instead
//! (`ReadBuf::initialize_unfilled`), which costs about the same.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Incoming};
use hyper::rt::ReadBufCursor;
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::server::conn::auto;

use crate::net::{serve, Server, ServerOptions, TcpStream};
use crate::Handle;

/// hyper's executor: spawns onto the current hotloop worker. Futures need
/// not be `Send`.
#[derive(Debug, Clone, Copy, Default)]
pub struct HotloopExecutor;

impl<F> hyper::rt::Executor<F> for HotloopExecutor
where
    F: Future + 'static,
    F::Output: 'static,
{
    fn execute(&self, future: F) {
        drop(crate::spawn(future));
    }
}

/// hyper's timer: sleeps on the current worker's timer wheel.
#[derive(Debug, Clone, Copy, Default)]
pub struct HotloopTimer;

/// A hotloop [`Sleep`](crate::time::Sleep) as hyper's `Sleep`.
pub struct HyperSleep(crate::time::Sleep);

impl Future for HyperSleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl hyper::rt::Sleep for HyperSleep {}

impl hyper::rt::Timer for HotloopTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(HyperSleep(crate::time::sleep(duration)))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(HyperSleep(crate::time::sleep_until(deadline)))
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        match sleep.as_mut().downcast_mut_pin::<HyperSleep>() {
            Some(mut s) => s.0.reset(new_deadline),
            None => *sleep = self.sleep_until(new_deadline),
        }
    }
}

/// The most bytes one [`HyperIo`] read takes from the socket.
pub const READ_CHUNK_BYTES: usize = 8 * 1024;

/// A [`TcpStream`] as hyper's `Read` and `Write`.
#[derive(Debug)]
pub struct HyperIo(pub TcpStream);

impl HyperIo {
    /// Wraps `stream`.
    pub fn new(stream: TcpStream) -> Self {
        HyperIo(stream)
    }
}

impl hyper::rt::Read for HyperIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let mut chunk = [0u8; READ_CHUNK_BYTES];
        let want = buf.remaining().min(READ_CHUNK_BYTES);
        match self.0.poll_read_slice(cx, &mut chunk[..want]) {
            Poll::Ready(Ok(n)) => {
                buf.put_slice(&chunk[..n]);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl hyper::rt::Write for HyperIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.0.poll_write_slice(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.0.poll_write_slices(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // Writes go straight to the socket (or its ring operation): nothing is buffered here.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.0.poll_shutdown_write(cx)
    }
}

/// Serves `make_service()` on every worker of `handle`'s runtime: HTTP/1.1,
/// and HTTP/2 when the client starts with the HTTP/2 preface (prior
/// knowledge, `h2c`). Each worker calls `make_service` once per connection.
pub fn serve_hyper<M, S, B>(
    handle: &Handle,
    addr: impl std::net::ToSocketAddrs,
    options: impl Into<ServerOptions>,
    make_service: M,
) -> std::io::Result<Server>
where
    M: Fn() -> S + Send + Sync + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve(handle, addr, options, move |stream: TcpStream| {
        let service = make_service();
        async move {
            let mut builder = auto::Builder::new(HotloopExecutor);
            builder.http1().timer(HotloopTimer).keep_alive(true);
            builder.http2().timer(HotloopTimer);
            // Errors here are the client's (resets, bad requests): the connection just ends.
            let _ = builder.serve_connection(HyperIo::new(stream), service).await;
        }
    })
}
