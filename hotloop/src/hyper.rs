//! hyper 1.x on hotloop: an executor that spawns on the current worker, a
//! timer on the worker's wheel, and [`serve_hyper`], which serves a hyper
//! `Service` (HTTP/1.1, and HTTP/2 by prior knowledge) on every worker.
//!
//! Connections speak hyper's I/O traits through [`HyperIo`], which sits on
//! the tokio I/O traits of [`TcpStream`] (or of a TLS stream over it) on
//! either driver. It needs no `hyper_util::rt::TokioIo`, so a server built
//! on this module links no tokio runtime code. With the `tls` feature,
//! `serve_hyper_tls` does the same over rustls, with ALPN.
//!
//! # Implementation notes
//!
//! hyper hands reads an uninitialised cursor; it is filled in place (the
//! `unsafe` for that lives in the buffer layer, `buf.rs`), and hotloop's
//! `AsyncRead` impls read into a `ReadBuf`'s spare room without zeroing
//! it, so a read is one copy from the kernel, as on tokio.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Incoming};
use hyper::rt::ReadBufCursor;
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::server::conn::auto;

use crate::net::{serve_with_stop, Server, ServerOptions, StopSignal, TcpStream};
use crate::Handle;

/// Adapts a tower `Service` (an axum `Router`, a `ServiceBuilder` stack)
/// to the hyper `Service` that [`serve_hyper`] takes:
/// `serve_hyper(handle, addr, options, move || TowerToHyperService::new(router.clone()))`.
pub use hyper_util::service::TowerToHyperService;

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

    /// The worker loop's reading of this turn ([`crate::time::now`]), not
    /// a clock reading: hyper asks for it on every request to start its
    /// header-read timeout, and a turn's precision is ample for a timeout
    /// of seconds.
    fn now(&self) -> Instant {
        crate::time::now()
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        match sleep.as_mut().downcast_mut_pin::<HyperSleep>() {
            Some(mut s) => s.0.reset(new_deadline),
            None => *sleep = self.sleep_until(new_deadline),
        }
    }
}

/// A stream with tokio's I/O traits ([`TcpStream`], or a TLS stream over
/// it) as hyper's `Read` and `Write`.
#[derive(Debug)]
pub struct HyperIo<T>(pub T);

impl<T> HyperIo<T> {
    /// Wraps `stream`.
    pub fn new(stream: T) -> Self {
        HyperIo(stream)
    }
}

impl<T: tokio::io::AsyncRead + Unpin> hyper::rt::Read for HyperIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        crate::buf::poll_read_hyper(buf, |rb| Pin::new(&mut self.0).poll_read(cx, rb))
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> hyper::rt::Write for HyperIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // On io_uring the stream writes behind: a flush waits for the kernel.
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Serves `make_service()` on every worker of `handle`'s runtime: HTTP/1.1,
/// and HTTP/2 when the client starts with the HTTP/2 preface (prior
/// knowledge, `h2c`). Each worker calls `make_service` once per connection.
///
/// When the server stops ([`Server::stop`] or
/// [`Server::shutdown_blocking`]), every connection is told to finish
/// gracefully: HTTP/1.1 connections finish the request in flight and
/// close; HTTP/2 connections send `GOAWAY` and finish their open streams.
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
    serve_with_stop(handle, addr, options, move |stream: TcpStream, stop| {
        serve_connection(stream, make_service(), stop)
    })
}

/// [`serve_hyper`] over TLS (feature `tls`): each connection is handshaken
/// by `acceptor` within its time limit, then served as HTTP/2 or HTTP/1.1.
/// The acceptor offers ALPN `h2` and `http/1.1` unless its configuration
/// already names protocols, so browsers and `curl` negotiate HTTP/2.
#[cfg(feature = "tls")]
pub fn serve_hyper_tls<M, S, B>(
    handle: &Handle,
    addr: impl std::net::ToSocketAddrs,
    options: impl Into<ServerOptions>,
    acceptor: crate::tls::TlsAcceptor,
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
    use crate::tls::{ALPN_H2, ALPN_HTTP11};
    let acceptor = acceptor.with_default_alpn(&[ALPN_H2, ALPN_HTTP11]);
    crate::tls::serve_tls_with_stop(handle, addr, options, acceptor, move |tls, stop| {
        serve_connection(tls, make_service(), stop)
    })
}

/// Serves one connection until the client is done, or until the server
/// stops, then lets hyper end it gracefully.
async fn serve_connection<I, S, B>(io: I, service: S, stop: StopSignal)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = auto::Builder::new(HotloopExecutor);
    builder.http1().timer(HotloopTimer).keep_alive(true);
    builder.http2().timer(HotloopTimer);
    let mut conn = pin!(builder.serve_connection(HyperIo::new(io), service));
    let mut stopping = pin!(stop.stopping());
    let mut told = false;
    // Errors here are the client's (resets, bad requests): the connection just ends.
    let _ = poll_fn(|cx| {
        if !told && stopping.as_mut().poll(cx).is_ready() {
            told = true;
            // Poll once before telling hyper: a connection accepted while
            // the server stops may have its request waiting in the kernel,
            // and hyper drops a connection whose first bytes it has not
            // read yet instead of serving it.
            if let Poll::Ready(out) = conn.as_mut().poll(cx) {
                return Poll::Ready(out);
            }
            conn.as_mut().graceful_shutdown();
        }
        conn.as_mut().poll(cx)
    })
    .await;
}
