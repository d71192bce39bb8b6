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
//! [`serve_hyper`] bounds every connection by the deadlines of
//! [`HyperOptions`]: nothing moved either way for the idle timeout, a
//! write stalled for the send timeout (a client that does not read), and,
//! for HTTP/1.1, hyper's own header-read timeout. A client that ends its
//! side after a request (a TCP half-close, or a TLS close_notify) still
//! gets its answer.
//!
//! # Implementation notes
//!
//! - hyper hands reads an uninitialised cursor; it is filled in place (the
//!   `unsafe` for that lives in the buffer layer, `buf/`), and hotloop's
//!   `AsyncRead` impls read into a `ReadBuf`'s spare room without zeroing
//!   it, so a read is one copy from the kernel, as on tokio.
//! - The deadlines cost no timer per request. The I/O handed to hyper
//!   records, in a [`Cell`] it shares with the connection's task, when
//!   bytes last moved and since when a write has waited; the task keeps
//!   one timer, moved only earlier as it goes, and looks at the shared
//!   record when the timer fires, filing it again for the later deadline
//!   if bytes moved meanwhile (nginx keeps its timers the same way). A
//!   read moves the idle clock but not a waiting write's: a client that
//!   keeps sending and never reads still meets the send timeout.
//! - At the idle deadline hyper is asked to finish gracefully (an idle
//!   HTTP/1.1 connection closes at once; HTTP/2 sends GOAWAY), and the
//!   connection is cut [`IDLE_CLOSE_GRACE`] later if it has not ended; a
//!   stalled write is cut at once (a GOAWAY could not be sent anyway). A
//!   cut shuts the socket down both ways before the stream is dropped, so
//!   a write in flight on io_uring ends at once too.
//! - hyper's HTTP/1.1 server drops a connection whose read side ends while
//!   a request is being answered unless it allows half-closed connections
//!   (`half_close`), which it does here: the end of the client's side is
//!   then only an end of requests.

use std::cell::Cell;
use std::future::Future;
use std::net::Shutdown;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use hyper::body::{Body, Incoming};
use hyper::rt::ReadBufCursor;
use hyper::service::{HttpService, Service};
use hyper::{Request, Response};
use hyper_util::server::conn::auto;

use crate::net::{
    serve_with_stop, ListenerOptions, Server, ServerOptions, StopSignal, Stopping, TcpStream,
};
use crate::time::Sleep;
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

/// A hotloop [`Sleep`] as hyper's `Sleep`.
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

/// How long an idle connection that was asked to finish (HTTP/2: sent a
/// GOAWAY) may take to end before it is cut.
pub const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// How [`serve_hyper`] and `serve_hyper_tls` (feature `tls`) serve: the
/// listeners and connection limits, and the deadlines that bound every
/// connection.
///
/// A [`ServerOptions`] or a [`ListenerOptions`] converts into one with the
/// default deadlines.
#[derive(Debug, Clone)]
pub struct HyperOptions {
    /// The listeners and the connection limits.
    pub server: ServerOptions,
    /// Close a connection on which no byte has moved either way for this
    /// long, whatever it waits for: the next request, the rest of one, or
    /// a client that does not read its answer. HTTP/1.1 connections are
    /// closed (at once if no request is open), HTTP/2 ones are sent a
    /// GOAWAY, and either is cut [`IDLE_CLOSE_GRACE`] later if it has not
    /// ended. A service that takes longer than this to start its answer,
    /// with nothing else moving, loses its connection the same way: set it
    /// above the slowest answer. `None`: never. Default: 60 s.
    pub idle_timeout: Option<Duration>,
    /// Cut a connection whose write has made no progress for this long,
    /// because the client does not read (nginx's `send_timeout`); a
    /// shorter idle timeout cuts it sooner. `None`: never. Default: 60 s.
    pub send_timeout: Option<Duration>,
    /// HTTP/1.1: hyper's header-read timeout. A request head must arrive
    /// whole within this long of the start of its read (for a kept-alive
    /// connection, of the end of the previous answer); then the connection
    /// is closed. `None`: never. Default: 30 s (hyper's own default).
    pub header_timeout: Option<Duration>,
}

impl HyperOptions {
    /// The default idle timeout.
    pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
    /// The default send timeout.
    pub const SEND_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
    /// The default header-read timeout (hyper's).
    pub const HEADER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
}

impl Default for HyperOptions {
    fn default() -> Self {
        HyperOptions {
            server: ServerOptions::default(),
            idle_timeout: Some(Self::IDLE_TIMEOUT_DEFAULT),
            send_timeout: Some(Self::SEND_TIMEOUT_DEFAULT),
            header_timeout: Some(Self::HEADER_TIMEOUT_DEFAULT),
        }
    }
}

impl From<ServerOptions> for HyperOptions {
    fn from(server: ServerOptions) -> Self {
        HyperOptions { server, ..Default::default() }
    }
}

impl From<ListenerOptions> for HyperOptions {
    fn from(listener: ListenerOptions) -> Self {
        ServerOptions::from(listener).into()
    }
}

/// A connection's deadlines, as each connection's task holds them.
#[derive(Debug, Clone, Copy)]
struct Deadlines {
    idle: Option<Duration>,
    send: Option<Duration>,
    header: Option<Duration>,
}

impl From<&HyperOptions> for Deadlines {
    fn from(o: &HyperOptions) -> Self {
        Deadlines { idle: o.idle_timeout, send: o.send_timeout, header: o.header_timeout }
    }
}

/// Serves `make_service()` on every worker of `handle`'s runtime: HTTP/1.1,
/// and HTTP/2 when the client starts with the HTTP/2 preface (prior
/// knowledge, `h2c`). Each worker calls `make_service` once per connection.
///
/// `options` is a [`HyperOptions`], or a [`ServerOptions`] or
/// [`ListenerOptions`] with the default deadlines (idle and send timeouts
/// of 60 s, hyper's header-read timeout of 30 s).
///
/// When the server stops ([`Server::stop`] or
/// [`Server::shutdown_blocking`]), every connection is told to finish
/// gracefully: HTTP/1.1 connections finish the request in flight and
/// close; HTTP/2 connections send `GOAWAY` and finish their open streams.
pub fn serve_hyper<M, S, B>(
    handle: impl AsRef<Handle>,
    addr: impl std::net::ToSocketAddrs,
    options: impl Into<HyperOptions>,
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
    let handle = handle.as_ref();
    let options = options.into();
    let deadlines = Deadlines::from(&options);
    serve_with_stop(handle, addr, options.server, move |stream: TcpStream, stop| {
        serve_connection(stream, make_service(), stop, deadlines)
    })
}

/// [`serve_hyper`] over TLS (feature `tls`): each connection is handshaken
/// by `acceptor` within its time limit, then served as HTTP/2 or HTTP/1.1.
/// The acceptor offers ALPN `h2` and `http/1.1` unless its configuration
/// already names protocols, so browsers and `curl` negotiate HTTP/2.
#[cfg(feature = "tls")]
pub fn serve_hyper_tls<M, S, B>(
    handle: impl AsRef<Handle>,
    addr: impl std::net::ToSocketAddrs,
    options: impl Into<HyperOptions>,
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
    let handle = handle.as_ref();
    use crate::tls::{ALPN_H2, ALPN_HTTP11};
    let acceptor = acceptor.with_default_alpn(&[ALPN_H2, ALPN_HTTP11]);
    let options = options.into();
    let deadlines = Deadlines::from(&options);
    crate::tls::serve_tls_with_stop(handle, addr, options.server, acceptor, move |tls, stop| {
        serve_connection(tls, make_service(), stop, deadlines)
    })
}

/// Serves one connection until the client is done, until a deadline
/// passes, or until the server stops, then lets hyper end it gracefully
/// (or cuts it: see the module notes).
///
/// A function that builds a named future rather than an `async fn`: an
/// `async fn` keeps its arguments beside what it moves them into
/// (rust-lang/rust#62958), so every connection's task held its stream
/// twice, and once more inside hyper's connection (for a TLS stream,
/// 1.2 KB each time). [`ServeConnection`] holds each piece once.
fn serve_connection<I, S, B>(
    io: I,
    service: S,
    stop: StopSignal,
    deadlines: Deadlines,
) -> ServeConnection<I, S>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Socket + Unpin + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = auto::Builder::new(HotloopExecutor);
    builder
        .http1()
        .timer(HotloopTimer)
        .keep_alive(true)
        .half_close(true)
        .header_read_timeout(deadlines.header);
    builder.http2().timer(HotloopTimer);
    let progress = Rc::new(Progress::new());
    let io = TimedIo { io, progress: progress.clone() };
    ServeConnection {
        // Owned, so the connection need not borrow a builder kept beside it.
        conn: builder.serve_connection(io, service).into_owned(),
        stopping: stop.stopping(),
        progress,
        watch: Watch::new(),
        deadlines,
        told: false,
    }
}

pin_project_lite::pin_project! {
    /// One connection's future (see [`serve_connection`]).
    struct ServeConnection<I, S>
    where
        I: Socket,
        S: HttpService<Incoming>,
    {
        #[pin]
        conn: auto::Connection<'static, TimedIo<I>, S, HotloopExecutor>,
        stopping: Stopping,
        progress: Rc<Progress>,
        watch: Watch,
        deadlines: Deadlines,
        // hyper was told to finish (the server stops, or the idle deadline passed).
        told: bool,
    }
}

impl<I, S, B> Future for ServeConnection<I, S>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Socket + Unpin + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Output = ();

    // Errors here are the client's (resets, bad requests): the connection just ends.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        let mut conn = this.conn;
        if !*this.told && Pin::new(&mut *this.stopping).poll(cx).is_ready() {
            *this.told = true;
            // Poll once before telling hyper: a connection accepted while
            // the server stops may have its request waiting in the kernel,
            // and hyper drops a connection whose first bytes it has not
            // read yet instead of serving it.
            if conn.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            conn.as_mut().graceful_shutdown();
        }
        if conn.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        loop {
            match this.watch.poll(cx, this.progress, this.deadlines) {
                None => return Poll::Pending,
                Some(Expiry::Idle) => {
                    *this.told = true;
                    conn.as_mut().graceful_shutdown();
                    // An idle HTTP/1.1 connection ends here and now; for
                    // the others the watch files the grace's deadline.
                    if conn.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(());
                    }
                }
                Some(Expiry::Cut) => {
                    this.progress.cut.set(true);
                    return Poll::Ready(());
                }
            }
        }
    }
}

/// A stream whose socket can be shut down while the stream is in use.
trait Socket {
    /// The socket under the stream.
    fn socket(&self) -> BorrowedFd<'_>;
}

impl Socket for TcpStream {
    fn socket(&self) -> BorrowedFd<'_> {
        self.as_fd()
    }
}

#[cfg(feature = "tls")]
impl Socket for crate::tls::ServerTlsStream {
    fn socket(&self) -> BorrowedFd<'_> {
        self.get_ref().0.as_fd()
    }
}

/// What a connection's I/O records for its deadlines (see the module
/// notes), in the loop's clock.
struct Progress {
    /// When a byte last moved either way.
    moved: Cell<Instant>,
    /// Since when a write (or a flush) has been waiting, while one is.
    write_waiting: Cell<Option<Instant>>,
    /// The last flush (or shutdown) had to wait.
    flush_waited: Cell<bool>,
    /// A deadline passed: the socket is shut down before it is closed.
    cut: Cell<bool>,
}

impl Progress {
    fn new() -> Self {
        Progress {
            moved: Cell::new(crate::time::now()),
            write_waiting: Cell::new(None),
            flush_waited: Cell::new(false),
            cut: Cell::new(false),
        }
    }

    /// A read moved bytes. A write that waits still waits: a client that
    /// sends and does not read is still bounded by the send timeout.
    fn read(&self) {
        self.moved.set(crate::time::now());
    }

    /// A write (or a flush) moved bytes.
    fn moved(&self) {
        self.moved.set(crate::time::now());
        self.write_waiting.set(None);
    }

    fn waiting(&self) {
        if self.write_waiting.get().is_none() {
            self.write_waiting.set(Some(crate::time::now()));
        }
    }

    /// Records the outcome of a write.
    fn wrote(&self, poll: &Poll<std::io::Result<usize>>) {
        match poll {
            Poll::Pending => self.waiting(),
            Poll::Ready(Ok(n)) if *n > 0 => self.moved(),
            Poll::Ready(_) => {}
        }
    }

    /// Records the outcome of a flush or a shutdown: progress only if it
    /// had to wait (one that has nothing to wait for, as on epoll, or
    /// nothing buffered, must not pass for progress).
    fn flushed(&self, poll: &Poll<std::io::Result<()>>) {
        match poll {
            Poll::Pending => {
                self.flush_waited.set(true);
                self.waiting();
            }
            Poll::Ready(result) => {
                if self.flush_waited.replace(false) && result.is_ok() {
                    self.moved();
                }
            }
        }
    }
}

/// The I/O hyper gets from [`serve_hyper`]: [`HyperIo`]'s, recording its
/// progress.
struct TimedIo<T: Socket> {
    io: T,
    progress: Rc<Progress>,
}

impl<T: Socket> Drop for TimedIo<T> {
    fn drop(&mut self) {
        if self.progress.cut.get() {
            // Ends a write in flight now (on io_uring a dropped stream's
            // write would otherwise linger), and the client reads a reset
            // or an end rather than waiting.
            let _ = socket2::SockRef::from(&self.io.socket()).shutdown(Shutdown::Both);
        }
    }
}

impl<T: tokio::io::AsyncRead + Socket + Unpin> hyper::rt::Read for TimedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        crate::buf::poll_read_hyper(buf, |rb| {
            let poll = Pin::new(&mut this.io).poll_read(cx, rb);
            if poll.is_ready() && !rb.filled().is_empty() {
                this.progress.read();
            }
            poll
        })
    }
}

impl<T: tokio::io::AsyncWrite + Socket + Unpin> hyper::rt::Write for TimedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.progress.wrote(&poll);
        poll
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.progress.wrote(&poll);
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // On io_uring the stream writes behind: a flush waits for the kernel.
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.progress.flushed(&poll);
        poll
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_shutdown(cx);
        self.progress.flushed(&poll);
        poll
    }
}

/// Which deadline passed.
enum Expiry {
    /// Nothing moved for the idle timeout, and no write is waiting: hyper
    /// is asked to finish.
    Idle,
    /// A write stalled past its limit, or the grace after [`Expiry::Idle`]
    /// ran out: the connection is cut.
    Cut,
}

/// A connection's one timer for its deadlines, moved only earlier as it
/// goes and brought up to date when it fires.
struct Watch {
    timer: Sleep,
    /// The waker the timer is filed with in the worker's wheel, while it
    /// is: a poll that finds its own task's waker there and the deadline
    /// still ahead need not touch the wheel (the usual case).
    filed: Option<Waker>,
    /// After [`Expiry::Idle`]: when the connection is cut if it has not ended.
    cut_at: Option<Instant>,
}

impl Watch {
    fn new() -> Self {
        Watch { timer: crate::time::sleep(Duration::MAX), filed: None, cut_at: None }
    }

    /// The earliest deadline now, and what passing it means.
    fn due(&self, progress: &Progress, d: &Deadlines) -> Option<(Instant, Expiry)> {
        let waiting = progress.write_waiting.get();
        let send = waiting.zip(d.send).map(|(since, t)| (since + t, Expiry::Cut));
        let idle = match (d.idle, self.cut_at) {
            (Some(t), None) => {
                // A write stalled that long is cut: a GOAWAY could not go out.
                let expiry = if waiting.is_some() { Expiry::Cut } else { Expiry::Idle };
                Some((progress.moved.get() + t, expiry))
            }
            _ => None,
        };
        let grace = self.cut_at.map(|at| (at, Expiry::Cut));
        [send, idle, grace].into_iter().flatten().min_by_key(|(at, _)| *at)
    }

    /// Whether a deadline passed; registers `cx` to be woken at the next
    /// one otherwise.
    fn poll(&mut self, cx: &mut Context<'_>, progress: &Progress, d: &Deadlines) -> Option<Expiry> {
        let (due, _) = self.due(progress, d)?;
        if due < self.timer.deadline() {
            Pin::new(&mut self.timer).reset(due);
            // A reset may take the timer out of the wheel.
            self.filed = None;
        }
        let filed = self.filed.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if filed && crate::time::now() < self.timer.deadline() {
            return None;
        }
        while Pin::new(&mut self.timer).poll(cx).is_ready() {
            self.filed = None;
            // Bytes may have moved since the timer was set: look again.
            let (due, expiry) = self.due(progress, d)?;
            if crate::time::now() >= due {
                if let Expiry::Idle = expiry {
                    self.cut_at = Some(crate::time::now() + IDLE_CLOSE_GRACE);
                }
                return Some(expiry);
            }
            Pin::new(&mut self.timer).reset(due);
        }
        // Pending: the timer is in the wheel with this task's waker.
        self.filed = Some(cx.waker().clone());
        None
    }
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use std::convert::Infallible;
    use std::future::{ready, Ready};
    use std::mem::size_of;

    use super::*;

    struct Empty;

    impl Service<Request<Incoming>> for Empty {
        type Response = Response<String>;
        type Error = Infallible;
        type Future = Ready<Result<Response<String>, Infallible>>;
        fn call(&self, _: Request<Incoming>) -> Self::Future {
            ready(Ok(Response::new(String::new())))
        }
    }

    /// Every connection's task is as large as this future: a TLS stream
    /// (1.2 KB) is held once, inside hyper's connection (the `async fn`
    /// it replaced held it three times: 4,464 bytes against 2,096 over
    /// plain TCP).
    #[test]
    fn a_connection_holds_its_stream_once() {
        let tls = size_of::<ServeConnection<crate::tls::ServerTlsStream, Empty>>();
        let plain = size_of::<ServeConnection<TcpStream, Empty>>();
        let stream = size_of::<crate::tls::ServerTlsStream>() - size_of::<TcpStream>();
        assert!(tls <= plain + stream + 64, "over TLS {tls} B, plain {plain} B, stream {stream} B");
    }
}
