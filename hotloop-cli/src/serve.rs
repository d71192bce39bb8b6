//! `hotloop serve echo|http|hyper`: the runtime as a real server.
//!
//! `echo` and `http` are hand-written handlers on the owned-buffer API;
//! `hyper` runs the hyper service in `hotloop_proto::hyper_app` through
//! [`hotloop::hyper::serve_hyper`] (HTTP/1.1, and HTTP/2 by prior
//! knowledge), so hyper on hotloop can be compared with the same service on
//! tokio.

use std::future::{poll_fn, Future};
use std::io;
use std::net::Shutdown;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hotloop::buf::IoBuf;
use hotloop::hyper::serve_hyper;
use hotloop::net::{serve, PooledBuf, ReadPooled, TcpStream};
use hotloop::signal::ShutdownSignals;
use hotloop::time::{timeout, Sleep};

use crate::runtime_args::RuntimeArgs;
use crate::stats_server::{Extra, Kind, StatsServer};
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
    /// (HTTP/1.1, and HTTP/2 by prior knowledge).
    Hyper,
}

/// `hotloop serve` flags.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// echo, http or hyper.
    pub app: App,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: String,
    /// HTTP response body size in bytes.
    #[arg(long, default_value_t = 64)]
    pub body_size: usize,
    /// CPU work per request in microseconds, standing in for an application's own processing.
    #[arg(long, default_value_t = 0)]
    pub work_us: u64,
    /// Idle timeout (echo, http): close a connection when nothing has moved
    /// in either direction for this long, milliseconds (0: never).
    #[arg(long, default_value_t = 60_000)]
    pub idle_timeout_ms: u64,
    /// Header timeout (http): a request head must arrive whole within this
    /// long of its first byte (of the connection, for the first request),
    /// however slowly it trickles; then 408 and close. Milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub header_timeout_ms: u64,
    /// Send timeout (echo, http): close a connection when a write has made
    /// no progress for this long, because the client does not read
    /// (nginx's `send_timeout`), milliseconds (0: never).
    #[arg(long, default_value_t = 60_000)]
    pub send_timeout_ms: u64,
    /// HTTP: the most headers a request may carry; more gets 431.
    #[arg(long, default_value_t = proto::REQUEST_HEADERS_MAX,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
              .range(1..=proto::REQUEST_HEADERS_LIMIT_MAX as u64))]
    pub max_headers: usize,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

/// After an error reply, the most bytes read and thrown away, and for how
/// long, before closing (see [`reject`]).
const LINGER_BYTES_MAX: usize = 256 * 1024;
const LINGER_MAX: Duration = Duration::from_secs(2);

/// What every connection handler of one server shares.
struct Settings {
    /// Echo rather than HTTP.
    echo: bool,
    work_us: u64,
    idle_timeout: Option<Duration>,
    header_timeout: Duration,
    send_timeout: Option<Duration>,
    parse: ParseOptions,
    keep_alive_reply: Arc<[u8]>,
    close_reply: Arc<[u8]>,
    keep_alive_head_reply: Arc<[u8]>,
    close_head_reply: Arc<[u8]>,
}

fn millis_or_never(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// Runs the server until a stop signal (see `stop.rs` for each signal).
pub fn run(args: &ServeArgs) -> std::io::Result<()> {
    let signals = ShutdownSignals::block()?;
    let nofile = hotloop::raise_nofile_limit()?;
    let rt = args.runtime.build_runtime()?;
    let settings = Arc::new(Settings {
        echo: args.app == App::Echo,
        work_us: args.work_us,
        idle_timeout: millis_or_never(args.idle_timeout_ms),
        header_timeout: Duration::from_millis(args.header_timeout_ms.max(1)),
        send_timeout: millis_or_never(args.send_timeout_ms),
        parse: ParseOptions { max_headers: args.max_headers, allow_head: true },
        keep_alive_reply: proto::response_ok(args.body_size, false).into(),
        close_reply: proto::response_ok(args.body_size, true).into(),
        keep_alive_head_reply: proto::response_ok_head(args.body_size, false).into(),
        close_head_reply: proto::response_ok_head(args.body_size, true).into(),
    });
    let server = match args.app {
        App::Hyper => {
            let body = hyper_app::body(args.body_size);
            let work_us = args.work_us;
            serve_hyper(
                rt.handle(),
                args.addr.as_str(),
                args.runtime.server_options(),
                move || {
                    let body = body.clone();
                    service_fn(move |req| hyper_app::respond(body.clone(), work_us, req))
                },
            )?
        }
        App::Echo | App::Http => {
            serve(rt.handle(), args.addr.as_str(), args.runtime.server_options(), move |stream| {
                handle_connection(stream, settings.clone())
            })?
        }
    };
    let stats = rt.stats();
    eprintln!(
        "hotloop serve {:?} on {} | workers {} | driver {} ({}) | busy-poll {} | open-file limit {nofile}",
        args.app,
        server.local_addr(),
        rt.handle().workers(),
        stats.info.driver,
        stats.info.reason,
        stats.info.busy_poll,
    );
    let active = Arc::new(server.active_connections_reader());
    let _stats_server = match &args.runtime.stats_addr {
        Some(addr) => {
            let active = active.clone();
            Some(StatsServer::start(
                addr,
                rt.handle().clone(),
                Arc::new(move || {
                    vec![Extra {
                        name: "active_connections",
                        help: "Connections open now, over all workers.",
                        kind: Kind::Gauge,
                        value: active() as u64,
                    }]
                }),
            )?)
        }
        None => None,
    };
    if let Some(st) = &_stats_server {
        eprintln!("hotloop serve: stats on http://{}/stats", st.local_addr());
    }
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

async fn handle_connection(stream: TcpStream, settings: Arc<Settings>) {
    if settings.echo {
        echo(stream, &settings).await
    } else {
        http(stream, &settings).await
    }
}

/// A connection's read deadline (idle or header) on one timer that is moved
/// only when it fires: a request costs a store of the loop's clock, not a
/// timer inserted and cancelled (nginx keeps its timers the same way).
///
/// It also carries the connection's registration for a graceful stop, so
/// an idle wait ends when the server stops without a wrapper future
/// around each read.
struct ReadDeadline {
    timer: Sleep,
    stop: drain::StopWatch,
}

impl ReadDeadline {
    fn new() -> Self {
        ReadDeadline { timer: hotloop::time::sleep(Duration::MAX), stop: Default::default() }
    }

    /// Reads into a buffer from the worker's pool (an idle connection holds
    /// none) until `due`; `None` when `due` passed, the peer closed, the
    /// read failed, or (`idle`) the server began to stop while it waited.
    /// What is ready at once is still taken after a stop.
    fn read<'a>(
        &'a mut self,
        stream: &'a TcpStream,
        due: Option<Instant>,
        idle: bool,
    ) -> DeadlineRead<'a> {
        if let Some(due) = due {
            // Only ever moved earlier here; a later deadline is taken up
            // when the timer fires.
            if self.timer.deadline() > due {
                Pin::new(&mut self.timer).reset(due);
            }
        }
        DeadlineRead { read: stream.read_pooled(), deadline: self, due, idle }
    }
}

/// The future of [`ReadDeadline::read`]: one poll function over the read,
/// the stop and the timer (an `async fn` here would add a state machine
/// of its own to every request's path).
struct DeadlineRead<'a> {
    read: ReadPooled<'a>,
    deadline: &'a mut ReadDeadline,
    due: Option<Instant>,
    idle: bool,
}

impl Future for DeadlineRead<'_> {
    type Output = Option<PooledBuf>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        // Every field is `Unpin` (`Sleep` included): no pin projection needed.
        let this = &mut *self;
        if let Poll::Ready(r) = Pin::new(&mut this.read).poll(cx) {
            return Poll::Ready(r.ok().filter(|b| !b.is_empty()));
        }
        if this.idle && this.deadline.stop.poll_stopped(cx.waker()) {
            return Poll::Ready(None);
        }
        let Some(due) = this.due else { return Poll::Pending };
        let mut timer = Pin::new(&mut this.deadline.timer);
        while timer.as_mut().poll(cx).is_ready() {
            if hotloop::time::now() >= due {
                return Poll::Ready(None);
            }
            // The timer was set for an earlier request: move it on.
            timer.as_mut().reset(due);
        }
        Poll::Pending
    }
}

/// Writes all of `buf`, giving up when one write has made no progress for
/// `limit` (the client does not read); `Err` means the connection is done.
///
/// The usual case, one write that takes the whole buffer at once, arms no
/// timer and keeps only that write in the connection's future; a write
/// that must wait, or a short one, continues on the heap, so its timer and
/// loop do not grow every connection's state.
async fn send<B: IoBuf>(stream: &TcpStream, buf: B, limit: Option<Duration>) -> io::Result<()> {
    let total = buf.bytes_init();
    let mut write = pin!(stream.write(buf));
    let (res, buf) = match poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx))).await {
        Poll::Ready(done) => done,
        Poll::Pending => Box::pin(wait_write(write.as_mut(), limit)).await?,
    };
    match res? {
        0 if total > 0 => Err(io::ErrorKind::WriteZero.into()),
        n if n >= total => Ok(()),
        n => Box::pin(send_rest(stream, buf, n, limit)).await,
    }
}

/// Waits for a write that could not complete at once, for at most `limit`
/// (each write returns as soon as it moved any bytes, so the clock runs
/// from the last progress).
async fn wait_write<W: Future>(
    write: Pin<&mut W>,
    limit: Option<Duration>,
) -> io::Result<W::Output> {
    match limit {
        Some(t) => timeout(t, write).await.map_err(|_| io::Error::from(io::ErrorKind::TimedOut)),
        None => Ok(write.await),
    }
}

/// The rest of [`send`] after a short write: `done` bytes of `buf` are sent.
async fn send_rest<B: IoBuf>(
    stream: &TcpStream,
    mut buf: B,
    mut done: usize,
    limit: Option<Duration>,
) -> io::Result<()> {
    let total = buf.bytes_init();
    while done < total {
        let mut write = pin!(stream.write(buf.slice(done..)));
        let (res, slice) = wait_write(write.as_mut(), limit).await?;
        buf = slice.into_inner();
        match res? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => done += n,
        }
    }
    Ok(())
}

async fn echo(stream: TcpStream, s: &Settings) {
    let mut reader = ReadDeadline::new();
    loop {
        // Set after the last write finished: the idle clock counts time
        // with no progress either way.
        let deadline = s.idle_timeout.map(|t| hotloop::time::now() + t);
        let Some(buf) = reader.read(&stream, deadline, false).await else { return };
        proto::spin_work(s.work_us);
        if send(&stream, buf, s.send_timeout).await.is_err() {
            return;
        }
    }
}

async fn http(stream: TcpStream, s: &Settings) {
    // `buf` takes each read; bytes of a request split across reads gather
    // in `pending`, which stays empty (and unallocated) in the common case.
    let mut buf = PooledBuf::default();
    let mut pending: Vec<u8> = Vec::new();
    // Bytes of `buf` already answered.
    let mut consumed = 0;
    let mut reader = ReadDeadline::new();
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
                if send(&stream, reply, s.send_timeout).await.is_err() || close {
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
            (Request::Malformed, _) => return reject_boxed(&stream, 400, s).await,
            (Request::TooLarge, _) => return reject_boxed(&stream, 431, s).await,
            (Request::Unsupported(status), _) => return reject_boxed(&stream, status, s).await,
        }
        if !pending.is_empty() && head_deadline.is_none() {
            head_deadline = Some(hotloop::time::now() + s.header_timeout);
        }
        let deadline = head_deadline.or(s.idle_timeout.map(|t| hotloop::time::now() + t));
        // Back to the pool before waiting.
        drop(std::mem::take(&mut buf));
        // An idle keep-alive connection (answered, no next request begun)
        // closes at once when the server stops, as nginx's do. A new
        // connection waiting for its first request is not idle (its request
        // may be on the way: nginx waits for it too), and its header timeout
        // bounds it; one partway through a request gets its answer, with
        // `Connection: close`.
        let idle = head_deadline.is_none();
        match reader.read(&stream, deadline, idle).await {
            Some(b) => {
                buf = b;
                consumed = 0;
                if !pending.is_empty() {
                    pending.extend_from_slice(&buf);
                    consumed = buf.len();
                }
            }
            None => {
                if !pending.is_empty() && head_deadline.is_some_and(|d| hotloop::time::now() >= d) {
                    reject_boxed(&stream, 408, s).await;
                }
                return;
            }
        }
    }
}

/// [`reject`] on the heap: an error reply is rare, and boxing it keeps
/// its state (a write, a timer, a read) out of every connection's future,
/// which is copied once per connection when it is spawned.
async fn reject_boxed(stream: &TcpStream, status: u16, s: &Settings) {
    Box::pin(reject(stream, status, s)).await
}

/// Answers with an error status and closes gracefully: shut down writing
/// (the client reads the reply, then the end of stream), then read and
/// drop what the client still sends, up to [`LINGER_BYTES_MAX`] within
/// [`LINGER_MAX`], before closing. Closing with unread bytes would send a
/// reset, which can destroy the reply before the client reads it (RFC 9112
/// section 9.6; nginx's `lingering_close`, with a shorter bound: 2 s rather
/// than nginx's 30 s, to free the descriptor sooner).
async fn reject(stream: &TcpStream, status: u16, s: &Settings) {
    if send(stream, proto::response_error(status), s.send_timeout).await.is_err() {
        return;
    }
    if stream.shutdown(Shutdown::Write).await.is_err() {
        return;
    }
    let until = Instant::now() + LINGER_MAX;
    let mut drained = 0;
    let mut reader = ReadDeadline::new();
    while drained < LINGER_BYTES_MAX {
        match reader.read(stream, Some(until), false).await {
            Some(b) => drained += b.len(),
            None => return,
        }
    }
}
