//! `hotloop serve echo|http|hyper|quic|h3|static`: the runtime as a real server.
//!
//! `echo` and `http` are hand-written handlers on the owned-buffer API;
//! `hyper` runs the hyper service in `hotloop_proto::hyper_app` through
//! [`hotloop::hyper::serve_hyper`] (HTTP/1.1, and HTTP/2 by prior
//! knowledge), so hyper on hotloop can be compared with the same service on
//! tokio; the command's idle, send and header timeouts go to it as
//! [`HyperOptions`]. With `--tls-cert` and `--tls-key` all three run over TLS; `quic`
//! (in `quic.rs`) echoes QUIC streams, and `h3` answers HTTP/3 there;
//! `static` (in `static_files/`) serves the files under `--root` with the
//! same connection handling as `http`.
//!
//! The echo and http handlers are generic over [`Conn`], so the plain path
//! is compiled for [`TcpStream`] itself (owned pooled buffers, no dynamic
//! dispatch) and the TLS path separately for the TLS stream.

use std::future::Future;
use std::io;
use std::net::Shutdown;
use std::ops::Deref;
use std::path::PathBuf;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hotloop::buf::IoBuf;
use hotloop::buf::PooledBuf;
use hotloop::hyper::{serve_hyper, serve_hyper_tls, HyperOptions};
use hotloop::net::{serve, TcpStream};
use hotloop::signal::ShutdownSignals;
use hotloop::time::Sleep;
use hotloop::tls::{serve_tls, ALPN_H2, ALPN_HTTP11};

use crate::runtime_args::RuntimeArgs;
use crate::stats_server::StatsServer;
use crate::{drain, stop};
use hotloop_proto::{self as proto, hyper_app, Method, ParseOptions, Request};
use hyper::service::service_fn;

/// What the server speaks.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum App {
    /// Write back what is read.
    Echo,
    /// Answer every HTTP/1.1 request with a fixed body.
    Http,
    /// The same answer from a hyper service on hotloop's hyper integration
    /// (HTTP/1.1, and HTTP/2 by prior knowledge; over TLS, as ALPN picks).
    Hyper,
    /// QUIC: every bidirectional stream gets back what it sent (UDP).
    Quic,
    /// HTTP/3 over QUIC (UDP): every request gets the fixed body.
    H3,
    /// The files under --root over HTTP/1.1 (GET and HEAD, ranges, 304).
    Static,
}

/// `hotloop serve` flags.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// echo, http, hyper, quic or h3.
    pub app: App,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: String,
    /// static: the directory whose files are served (a request for a
    /// directory gets its index.html).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// HTTP response body size in bytes (http, hyper, h3).
    #[arg(long, default_value_t = 64)]
    pub body_size: usize,
    /// CPU work per request in microseconds, standing in for an application's own processing.
    #[arg(long, default_value_t = 0)]
    pub work_us: u64,
    /// echo: CPU work per byte received, in nanoseconds, on top of
    /// --work-us: connections that send more cost more, as a mix of heavy
    /// and light clients does.
    #[arg(long, default_value_t = 0)]
    pub work_ns_per_byte: u64,
    /// Idle timeout (echo, http, hyper; quic and h3: QUIC's idle
    /// timeout): close a connection when nothing has moved in either
    /// direction for this long, whether it waits to read or to write
    /// (hyper over HTTP/2: GOAWAY, then close), milliseconds (0: never).
    #[arg(long, default_value_t = 60_000)]
    pub idle_timeout_ms: u64,
    /// Header timeout (http; hyper over HTTP/1.1): a request head must
    /// arrive whole within this long of its first byte (of the connection,
    /// for the first request; for hyper, of the end of the previous
    /// answer), however slowly it trickles; then 408 and close (hyper
    /// closes). Milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub header_timeout_ms: u64,
    /// Send timeout (echo, http, hyper; quic resets the stream): close a
    /// connection when a write has made no progress for this long, because
    /// the client does not read (nginx's `send_timeout`); a shorter idle
    /// timeout closes it sooner. Milliseconds (0: never).
    #[arg(long, default_value_t = 60_000)]
    pub send_timeout_ms: u64,
    /// HTTP: the most headers a request may carry; more gets 431.
    #[arg(long, default_value_t = proto::REQUEST_HEADERS_MAX,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
              .range(1..=proto::REQUEST_HEADERS_LIMIT_MAX as u64))]
    pub max_headers: usize,
    /// TLS: the certificate chain, PEM (the server's certificate first).
    /// With --tls-key, echo, http and hyper are served over TLS; quic and
    /// h3 use it instead of a generated one.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS: the private key of --tls-cert, PEM (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// TLS and QUIC: a handshake not done within this long loses its
    /// connection, milliseconds.
    #[arg(long, default_value_t = 10_000,
          value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..))]
    pub handshake_timeout_ms: u64,
    /// quic and h3 without --tls-cert: write the generated self-signed certificate
    /// (PEM) here, for clients to trust.
    #[arg(long, value_name = "FILE", conflicts_with = "tls_cert")]
    pub write_cert: Option<PathBuf>,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    #[command(flatten)]
    pub quic: crate::quic::QuicArgs,
}

/// After an error reply, the most bytes read and thrown away, and for how
/// long, before closing (see [`reject`]).
const LINGER_BYTES_MAX: usize = 256 * 1024;
pub(crate) const LINGER_MAX: Duration = Duration::from_secs(2);

/// What every connection handler of one server shares.
struct Settings {
    /// Echo rather than HTTP.
    echo: bool,
    work_us: u64,
    work_ns_per_byte: u64,
    idle_timeout: Option<Duration>,
    header_timeout: Duration,
    /// How long a write may wait without progress: the send timeout, or
    /// the idle timeout when that is shorter, since a connection on which
    /// nothing moves is idle whether it waits to read or to write.
    write_limit: Option<Duration>,
    parse: ParseOptions,
    keep_alive_reply: Arc<[u8]>,
    close_reply: Arc<[u8]>,
    keep_alive_head_reply: Arc<[u8]>,
    close_head_reply: Arc<[u8]>,
}

pub(crate) fn millis_or_never(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// The shorter of two optional limits (`None`: never).
pub(crate) fn shorter(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Runs the server until a stop signal (see `stop.rs` for each signal).
pub fn run(args: &ServeArgs) -> std::io::Result<()> {
    let signals = ShutdownSignals::block()?;
    let nofile = hotloop::raise_nofile_limit()?;
    let rt = args.runtime.build_runtime()?;
    if matches!(args.app, App::Quic | App::H3) {
        return crate::quic::run(args, &signals, &rt, nofile);
    }
    if args.root.is_some() != (args.app == App::Static) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--root DIR is what `serve static` serves, and only `serve static` takes it",
        ));
    }
    if args.write_cert.is_some() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--write-cert is for `serve quic` and `serve h3` (the other apps make no certificate)",
        ));
    }
    let alpn: &[&[u8]] = match args.app {
        App::Hyper => &[ALPN_H2, ALPN_HTTP11],
        App::Http | App::Static => &[ALPN_HTTP11],
        App::Echo | App::Quic | App::H3 => &[],
    };
    let tls = crate::tls::acceptor(args, alpn)?;
    let settings = Arc::new(Settings {
        echo: args.app == App::Echo,
        work_us: args.work_us,
        work_ns_per_byte: args.work_ns_per_byte,
        idle_timeout: millis_or_never(args.idle_timeout_ms),
        header_timeout: Duration::from_millis(args.header_timeout_ms.max(1)),
        write_limit: shorter(
            millis_or_never(args.send_timeout_ms),
            millis_or_never(args.idle_timeout_ms),
        ),
        parse: ParseOptions { max_headers: args.max_headers, allow_head: true },
        keep_alive_reply: proto::response_ok(args.body_size, false).into(),
        close_reply: proto::response_ok(args.body_size, true).into(),
        keep_alive_head_reply: proto::response_ok_head(args.body_size, false).into(),
        close_head_reply: proto::response_ok_head(args.body_size, true).into(),
    });
    let (addr, options) = (args.addr.as_str(), args.runtime.server_options());
    let server = match (args.app, tls) {
        (App::Static, tls) => {
            let site = crate::static_files::Site {
                root: hotloop::fs::Dir::open_blocking(
                    args.root.as_deref().unwrap_or(".".as_ref()),
                )?,
                idle_timeout: settings.idle_timeout,
                header_timeout: settings.header_timeout,
                write_limit: settings.write_limit,
                max_headers: args.max_headers,
            };
            crate::static_files::start(rt.handle(), addr, options, tls, site)?
        }
        (App::Hyper, tls) => {
            let body = hyper_app::body(args.body_size);
            let work_us = args.work_us;
            let make_service = move || {
                let body = body.clone();
                service_fn(move |req| hyper_app::respond(body.clone(), work_us, req))
            };
            let options = HyperOptions {
                server: options,
                idle_timeout: settings.idle_timeout,
                send_timeout: millis_or_never(args.send_timeout_ms),
                header_timeout: Some(settings.header_timeout),
            };
            match tls {
                None => serve_hyper(rt.handle(), addr, options, make_service)?,
                Some(tls) => serve_hyper_tls(rt.handle(), addr, options, tls, make_service)?,
            }
        }
        // Two instances of the handlers: the plain one on `TcpStream` as it was.
        (_, None) => serve(rt.handle(), addr, options, move |stream| {
            handle_connection(stream, settings.clone())
        })?,
        (_, Some(tls)) => serve_tls(rt.handle(), addr, options, tls, move |stream| {
            handle_connection(stream, settings.clone())
        })?,
    };
    let stats = rt.stats();
    eprintln!(
        "hotloop serve {:?}{} on {} | workers {} | driver {} ({}) | busy-poll {} | open-file limit {nofile}",
        args.app,
        if args.tls_cert.is_some() { " over TLS" } else { "" },
        server.local_addr(),
        rt.handle().workers(),
        stats.info.driver,
        stats.info.reason,
        stats.info.busy_poll,
    );
    let active = Arc::new(server.active_connections_reader());
    let _stats_server = {
        let active = active.clone();
        StatsServer::start_with_active(
            "hotloop serve",
            args.runtime.stats_addr.as_deref(),
            rt.handle().clone(),
            "Connections open now, over all workers.",
            move || active(),
        )?
    };
    let status =
        || format!("{} connections open, {} accepted", active(), rt.stats().total.accepted);
    let stopped = stop::run_until_stopped(
        "hotloop serve",
        &signals,
        &rt,
        server,
        args.runtime.grace(),
        &status,
    )?;
    let how = if stopped.forced { "stopped at once" } else { "stopped" };
    eprintln!(
        "hotloop serve: {how} ({} connections cut at the grace limit); {} accepted",
        stopped.cut,
        rt.stats().total.accepted
    );
    Ok(())
}

/// A connection the echo and http handlers serve: plain TCP, or TLS over it.
/// The handlers read and write in turn, never both at once, hence `&mut`.
///
/// The methods return `impl Future` rather than being `async fn`s so that
/// the `TcpStream` impl hands back the stream's own futures, with no
/// wrapper around them.
pub(crate) trait Conn {
    /// What a read returns.
    type Buf: IoBuf + Deref<Target = [u8]> + Default;

    /// Reads what has arrived; empty when the peer closed its side.
    /// Dropping the future loses no data the caller has not seen.
    fn read_some(&mut self) -> impl Future<Output = io::Result<Self::Buf>>;

    /// Writes all of `buf`, giving up with `TimedOut` when the writes make
    /// no progress for `limit` (the client does not read). `timer` is the
    /// connection's, which a write that has to wait may use.
    fn send<B: IoBuf + Deref<Target = [u8]>>(
        &mut self,
        buf: B,
        limit: Option<Duration>,
        timer: &mut ConnTimer,
    ) -> impl Future<Output = io::Result<()>>;

    /// Sends `len` bytes of `file` from `offset`, giving up as [`Conn::send`]
    /// does; `UnexpectedEof` when the file ends first (it shrank).
    fn send_file(
        &mut self,
        file: &hotloop::fs::File,
        offset: u64,
        len: u64,
        limit: Option<Duration>,
        timer: &mut ConnTimer,
    ) -> impl Future<Output = io::Result<()>>;

    /// Ends the writing side (after all that was sent).
    fn shutdown_write(&mut self) -> impl Future<Output = io::Result<()>>;

    /// Called once the handler is done with the connection, before it is
    /// closed; `limit` bounds any last write.
    fn finish(&mut self, limit: Option<Duration>) -> impl Future<Output = ()>;
}

impl Conn for TcpStream {
    type Buf = PooledBuf;

    fn read_some(&mut self) -> impl Future<Output = io::Result<PooledBuf>> {
        self.read_pooled()
    }

    fn send<B: IoBuf + Deref<Target = [u8]>>(
        &mut self,
        buf: B,
        limit: Option<Duration>,
        timer: &mut ConnTimer,
    ) -> impl Future<Output = io::Result<()>> {
        send(self, buf, limit, timer)
    }

    fn send_file(
        &mut self,
        file: &hotloop::fs::File,
        offset: u64,
        len: u64,
        limit: Option<Duration>,
        timer: &mut ConnTimer,
    ) -> impl Future<Output = io::Result<()>> {
        crate::static_files::send_file_tcp(self, file, offset, len, limit, timer)
    }

    fn shutdown_write(&mut self) -> impl Future<Output = io::Result<()>> {
        self.shutdown_with(Shutdown::Write)
    }

    /// Nothing to do: closing the descriptor is the end.
    fn finish(&mut self, _limit: Option<Duration>) -> impl Future<Output = ()> {
        std::future::ready(())
    }
}

/// One connection, start to end. A block rather than an `async fn`: an
/// `async fn` moves its arguments into its body's locals, so the stream
/// and settings would be stored twice in every connection's future.
#[allow(clippy::manual_async_fn)]
fn handle_connection<S: Conn>(mut stream: S, settings: Arc<Settings>) -> impl Future<Output = ()> {
    async move {
        if settings.echo {
            echo(&mut stream, &settings).await
        } else {
            http(&mut stream, &settings).await
        }
        stream.finish(settings.write_limit).await;
    }
}

/// A connection's deadlines (idle, header, send) on one timer that is
/// moved only when it fires: a request costs a store of the loop's clock,
/// not a timer inserted and cancelled (nginx keeps its timers the same
/// way). A write that has to wait (on io_uring, every write waits for its
/// completion) uses it too, so no timer is filed per response.
///
/// It also carries the connection's registration for a graceful stop, so
/// an idle wait ends when the server stops without a wrapper future
/// around each read.
pub(crate) struct ConnTimer {
    timer: Sleep,
    /// The waker the timer is filed with in the worker's wheel, while it
    /// is: a wait that finds its own task's waker there and the deadline
    /// still ahead needs nothing from the wheel (the usual case: the
    /// connection's task parks again after every request).
    filed: Option<Waker>,
    stop: drain::StopWatch,
}

impl ConnTimer {
    pub(crate) fn new() -> Self {
        ConnTimer {
            timer: hotloop::time::sleep(Duration::MAX),
            filed: None,
            stop: Default::default(),
        }
    }

    /// Runs `read` (a connection's read, pinned by the caller) until `due`;
    /// the result is `None` when `due` passed, the peer closed, the read
    /// failed, or (`idle`) the server began to stop while it waited. What
    /// is ready at once is still taken after a stop.
    pub(crate) fn read<'a, F>(
        &'a mut self,
        read: Pin<&'a mut F>,
        due: Option<Instant>,
        idle: bool,
    ) -> DeadlineRead<'a, F> {
        if let Some(due) = due {
            self.bring_forward(due);
        }
        DeadlineRead { read, timer: self, due, idle }
    }

    /// Runs `write` (pinned by the caller); once it has to wait, for at
    /// most `limit`.
    pub(crate) fn write<'a, W: Future>(
        &'a mut self,
        write: Pin<&'a mut W>,
        limit: Option<Duration>,
    ) -> DeadlineWrite<'a, W> {
        DeadlineWrite { write, timer: self, limit, due: None }
    }

    /// Makes the timer fire no later than `due`. Only ever moved earlier
    /// here; a later deadline is taken up when the timer fires.
    fn bring_forward(&mut self, due: Instant) {
        if self.timer.deadline() > due {
            Pin::new(&mut self.timer).reset(due);
            // A reset may take the timer out of the wheel.
            self.filed = None;
        }
    }

    /// Whether `due` has passed, as far as the timer knows; registers
    /// `cx` to be woken when it fires otherwise. A timer set for an
    /// earlier deadline that has since moved on is moved to `due`.
    fn poll_expired(&mut self, cx: &mut std::task::Context<'_>, due: Instant) -> bool {
        if self.filed_with(cx.waker()) && hotloop::time::now() < self.timer.deadline() {
            return false;
        }
        let mut timer = Pin::new(&mut self.timer);
        while timer.as_mut().poll(cx).is_ready() {
            self.filed = None;
            if hotloop::time::now() >= due {
                return true;
            }
            timer.as_mut().reset(due);
        }
        // Pending: the timer is in the wheel with this task's waker.
        if !self.filed_with(cx.waker()) {
            self.filed = Some(cx.waker().clone());
        }
        false
    }

    /// Whether the timer is in the wheel with `waker` (or one that wakes
    /// the same task).
    fn filed_with(&self, waker: &Waker) -> bool {
        self.filed.as_ref().is_some_and(|w| w.will_wake(waker))
    }
}

/// The future of [`ConnTimer::read`]: one poll function over the read,
/// the stop and the timer (an `async fn` here would add a state machine
/// of its own to every request's path).
pub(crate) struct DeadlineRead<'a, F> {
    read: Pin<&'a mut F>,
    timer: &'a mut ConnTimer,
    due: Option<Instant>,
    idle: bool,
}

impl<F, B> Future for DeadlineRead<'_, F>
where
    F: Future<Output = io::Result<B>>,
    B: Deref<Target = [u8]>,
{
    type Output = Option<B>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        // Every field is `Unpin` (`Sleep` included): no pin projection needed.
        let this = &mut *self;
        if let Poll::Ready(r) = this.read.as_mut().poll(cx) {
            return Poll::Ready(r.ok().filter(|b| !b.is_empty()));
        }
        if this.idle && this.timer.stop.poll_stopped(cx.waker()) {
            return Poll::Ready(None);
        }
        match this.due {
            Some(due) if this.timer.poll_expired(cx, due) => Poll::Ready(None),
            _ => Poll::Pending,
        }
    }
}

/// The future of [`ConnTimer::write`]: the write, and once it has had to
/// wait, the connection's timer. `Err(TimedOut)` when `limit` passed with
/// the write still waiting.
pub(crate) struct DeadlineWrite<'a, W> {
    write: Pin<&'a mut W>,
    timer: &'a mut ConnTimer,
    limit: Option<Duration>,
    /// When the wait runs out, set at the first poll that had to wait.
    due: Option<Instant>,
}

impl<W: Future> Future for DeadlineWrite<'_, W> {
    type Output = io::Result<W::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        // Every field is `Unpin`: no pin projection needed.
        let this = &mut *self;
        if let Poll::Ready(out) = this.write.as_mut().poll(cx) {
            return Poll::Ready(Ok(out));
        }
        let Some(limit) = this.limit else { return Poll::Pending };
        let due = match this.due {
            Some(due) => due,
            None => {
                let due = hotloop::time::now() + limit;
                this.timer.bring_forward(due);
                *this.due.insert(due)
            }
        };
        if this.timer.poll_expired(cx, due) {
            return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
        }
        Poll::Pending
    }
}

/// Writes all of `buf`, giving up when one write has made no progress for
/// `limit` (the client does not read); `Err` means the connection is done.
///
/// The usual case, one write that takes the whole buffer (at once on
/// epoll, at its completion on io_uring), files no timer of its own: a
/// wait runs on the connection's timer. A short write continues on the
/// heap, so its loop does not grow every connection's state.
///
/// A block rather than an `async fn`, so its arguments are not stored
/// twice in every connection's future.
#[allow(clippy::manual_async_fn)]
fn send<'s, 't, B: IoBuf>(
    stream: &'s TcpStream,
    buf: B,
    limit: Option<Duration>,
    timer: &'t mut ConnTimer,
) -> impl Future<Output = io::Result<()>> + use<'s, 't, B> {
    async move {
        let total = buf.bytes_init();
        let write = pin!(stream.write_owned(buf));
        let (res, buf) = timer.write(write, limit).await?;
        match res? {
            0 if total > 0 => Err(io::ErrorKind::WriteZero.into()),
            n if n >= total => Ok(()),
            n => Box::pin(send_rest(stream, buf, n, limit, timer)).await,
        }
    }
}

/// The rest of [`send`] after a short write: `done` bytes of `buf` are sent.
async fn send_rest<B: IoBuf>(
    stream: &TcpStream,
    mut buf: B,
    mut done: usize,
    limit: Option<Duration>,
    timer: &mut ConnTimer,
) -> io::Result<()> {
    let total = buf.bytes_init();
    while done < total {
        // Each write returns as soon as it moved any bytes, so the limit
        // runs from the last progress.
        let write = pin!(stream.write_owned(buf.slice(done..)));
        let (res, slice) = timer.write(write, limit).await?;
        buf = slice.into_inner();
        match res? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => done += n,
        }
    }
    Ok(())
}

async fn echo<S: Conn>(stream: &mut S, s: &Settings) {
    let mut timer = ConnTimer::new();
    loop {
        // Set after the last write finished: the idle clock counts time
        // with no progress either way.
        let deadline = s.idle_timeout.map(|t| hotloop::time::now() + t);
        let got = {
            let read = pin!(stream.read_some());
            timer.read(read, deadline, false).await
        };
        let Some(buf) = got else { return };
        proto::spin_work(s.work_us + buf.len() as u64 * s.work_ns_per_byte / 1000);
        if stream.send(buf, s.write_limit, &mut timer).await.is_err() {
            return;
        }
    }
}

async fn http<S: Conn>(stream: &mut S, s: &Settings) {
    // `buf` takes each read; bytes of a request split across reads gather
    // in `pending`, which stays empty (and unallocated) in the common case.
    let mut buf = S::Buf::default();
    let mut pending: Vec<u8> = Vec::new();
    // Bytes of `buf` already answered.
    let mut consumed = 0;
    let mut timer = ConnTimer::new();
    // The first request's head must arrive within the header timeout.
    let mut head_deadline = Some(hotloop::time::now() + s.header_timeout);
    loop {
        let unparsed: &[u8] = if pending.is_empty() { &buf[consumed..] } else { &pending };
        // Nothing left to parse (the usual case after an answer): read.
        let parsed = if unparsed.is_empty() {
            (Request::Partial, Method::Get)
        } else {
            proto::parse_request_with(unparsed, s.parse)
        };
        match parsed {
            (Request::Complete { len, close }, method) => {
                if pending.is_empty() {
                    consumed += len;
                } else {
                    pending.drain(..len);
                }
                proto::spin_work(s.work_us);
                // Stopping: this answer is the connection's last.
                let close = close || drain::stopping();
                let reply = match (method, close) {
                    (Method::Get, false) => s.keep_alive_reply.clone(),
                    (Method::Get, true) => s.close_reply.clone(),
                    (Method::Head, false) => s.keep_alive_head_reply.clone(),
                    (Method::Head, true) => s.close_head_reply.clone(),
                };
                if stream.send(reply, s.write_limit, &mut timer).await.is_err() || close {
                    return;
                }
                // Between requests the idle timeout applies, until a byte of the next one arrives.
                head_deadline = None;
                continue;
            }
            (Request::Partial, _) => {
                if pending.is_empty() && consumed < buf.len() {
                    pending.extend_from_slice(&buf[consumed..]);
                }
            }
            (Request::Malformed, _) => return reject_boxed(stream, 400, s).await,
            (Request::TooLarge, _) => return reject_boxed(stream, 431, s).await,
            (Request::Unsupported(status), _) => return reject_boxed(stream, status, s).await,
        }
        if !pending.is_empty() && head_deadline.is_none() {
            head_deadline = Some(hotloop::time::now() + s.header_timeout);
        }
        // The idle timeout runs from now whatever is awaited, a request
        // head included: a head also has to be whole by its own deadline.
        let idle_deadline = s.idle_timeout.map(|t| hotloop::time::now() + t);
        let deadline = match (head_deadline, idle_deadline) {
            (Some(h), Some(i)) => Some(h.min(i)),
            (h, i) => h.or(i),
        };
        // Back to the pool before waiting.
        drop(std::mem::take(&mut buf));
        // An idle keep-alive connection (answered, no next request begun)
        // closes at once when the server stops, as nginx's do. A new
        // connection waiting for its first request is not idle (its request
        // may be on the way: nginx waits for it too), and its header timeout
        // bounds it; one partway through a request gets its answer, with
        // `Connection: close`.
        let idle = head_deadline.is_none();
        let got = {
            let read = pin!(stream.read_some());
            timer.read(read, deadline, idle).await
        };
        match got {
            Some(b) => {
                buf = b;
                consumed = 0;
                if !pending.is_empty() {
                    pending.extend_from_slice(&buf);
                    consumed = buf.len();
                }
            }
            None => {
                // A head left unfinished at a deadline (its own or the
                // idle one) is answered; a close or an error is not.
                if !pending.is_empty() && deadline.is_some_and(|d| hotloop::time::now() >= d) {
                    reject_boxed(stream, 408, s).await;
                }
                return;
            }
        }
    }
}

/// [`reject`] on the heap: an error reply is rare, and boxing it keeps
/// its state (a write, a timer, a read) out of every connection's future,
/// which is copied once per connection when it is spawned.
async fn reject_boxed<S: Conn>(stream: &mut S, status: u16, s: &Settings) {
    Box::pin(reject(stream, status, s.write_limit)).await
}

/// Answers with an error status and closes gracefully: shut down writing
/// (the client reads the reply, then the end of stream), then read and
/// drop what the client still sends, up to [`LINGER_BYTES_MAX`] within
/// [`LINGER_MAX`], before closing. Closing with unread bytes would send a
/// reset, which can destroy the reply before the client reads it (RFC 9112
/// section 9.6; nginx's `lingering_close`, with a shorter bound: 2 s rather
/// than nginx's 30 s, to free the descriptor sooner).
pub(crate) async fn reject<S: Conn>(stream: &mut S, status: u16, write_limit: Option<Duration>) {
    let mut timer = ConnTimer::new();
    if stream.send(proto::response_error(status), write_limit, &mut timer).await.is_err() {
        return;
    }
    if stream.shutdown_write().await.is_err() {
        return;
    }
    let until = Instant::now() + LINGER_MAX;
    let mut drained = 0;
    while drained < LINGER_BYTES_MAX {
        let got = {
            let read = pin!(stream.read_some());
            timer.read(read, Some(until), false).await
        };
        match got {
            Some(b) => drained += b.len(),
            None => return,
        }
    }
}
