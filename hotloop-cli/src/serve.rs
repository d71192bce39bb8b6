//! `hotloop serve echo|http|hyper`: the runtime as a real server.
//!
//! `echo` and `http` are hand-written handlers on the owned-buffer API;
//! `hyper` runs the hyper service in `hotloop_proto::hyper_app` through
//! [`hotloop::hyper::serve_hyper`] (HTTP/1.1, and HTTP/2 by prior
//! knowledge), so hyper on hotloop can be compared with the same service on
//! tokio.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hotloop::hyper::serve_hyper;
use hotloop::net::{serve, PooledBuf, TcpStream};
use hotloop::signal::ShutdownSignals;
use hotloop::time::timeout_at;

use crate::runtime_args::RuntimeArgs;
use crate::stats_server::{Extra, Kind, StatsServer};
use hotloop_proto::{self as proto, hyper_app, Request};
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
    /// Close a connection that has sent nothing for this long (milliseconds; 0: never).
    #[arg(long, default_value_t = 60_000)]
    pub idle_timeout_ms: u64,
    /// HTTP: the whole request head must arrive within this time (milliseconds), however slowly it trickles.
    #[arg(long, default_value_t = 10_000)]
    pub header_timeout_ms: u64,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

/// What every connection handler of one server shares.
struct Settings {
    /// Echo rather than HTTP.
    echo: bool,
    work_us: u64,
    idle_timeout: Option<Duration>,
    header_timeout: Duration,
    keep_alive_reply: Arc<[u8]>,
    close_reply: Arc<[u8]>,
}

/// Runs the server until SIGINT or SIGTERM.
pub fn run(args: &ServeArgs) -> std::io::Result<()> {
    let signals = ShutdownSignals::block()?;
    let nofile = hotloop::raise_nofile_limit()?;
    let rt = args.runtime.build_runtime()?;
    let settings = Arc::new(Settings {
        echo: args.app == App::Echo,
        work_us: args.work_us,
        idle_timeout: (args.idle_timeout_ms > 0)
            .then(|| Duration::from_millis(args.idle_timeout_ms)),
        header_timeout: Duration::from_millis(args.header_timeout_ms.max(1)),
        keep_alive_reply: proto::response_ok(args.body_size, false).into(),
        close_reply: proto::response_ok(args.body_size, true).into(),
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
    let _stats_server = match &args.runtime.stats_addr {
        Some(addr) => {
            let active = server.active_connections_reader();
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
    let sig = signals.wait()?;
    eprintln!(
        "hotloop serve: {sig:?}: no longer accepting; waiting up to {:?} for connections",
        args.runtime.grace()
    );
    let left = server.shutdown_blocking(args.runtime.grace());
    eprintln!(
        "hotloop serve: stopped ({left} connections cut at the grace limit); {} accepted",
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

/// Reads with the connection's deadline into a buffer from the worker's
/// pool (an idle connection holds none); `None` when the deadline passed,
/// the peer closed or the read failed.
async fn read_by(stream: &TcpStream, deadline: Option<Instant>) -> Option<PooledBuf> {
    let res = match deadline {
        Some(d) => timeout_at(d, stream.read_pooled()).await.ok()?,
        None => stream.read_pooled().await,
    };
    res.ok().filter(|b| !b.is_empty())
}

async fn echo(stream: TcpStream, s: &Settings) {
    loop {
        let deadline = s.idle_timeout.map(|t| Instant::now() + t);
        let Some(buf) = read_by(&stream, deadline).await else { return };
        proto::spin_work(s.work_us);
        let (res, _buf) = stream.write_all(buf).await;
        if res.is_err() {
            return;
        }
    }
}

async fn http(stream: TcpStream, s: &Settings) {
    // `buf` takes each read; bytes of a request split across reads gather
    // in `pending`, which stays empty (and unallocated) in the common case.
    let mut buf = PooledBuf::default();
    let mut pending: Vec<u8> = Vec::new();
    let mut consumed = 0; // bytes of `buf` already answered
                          // The first request's head must arrive within the header timeout.
    let mut head_deadline = Some(Instant::now() + s.header_timeout);
    loop {
        let unparsed: &[u8] = if pending.is_empty() { &buf[consumed..] } else { &pending };
        match proto::parse_request(unparsed) {
            Request::Complete { len, close } => {
                if pending.is_empty() {
                    consumed += len;
                } else {
                    pending.drain(..len);
                }
                proto::spin_work(s.work_us);
                let reply = if close { s.close_reply.clone() } else { s.keep_alive_reply.clone() };
                let (res, _) = stream.write_all(reply).await;
                if res.is_err() || close {
                    return;
                }
                // Between requests the idle timeout applies, until a byte of the next one arrives.
                head_deadline = None;
                continue;
            }
            Request::Partial => {
                if pending.is_empty() && consumed < buf.len() {
                    pending.extend_from_slice(&buf[consumed..]);
                }
            }
            Request::Malformed => return reject(&stream, 400).await,
            Request::TooLarge => return reject(&stream, 431).await,
            Request::Unsupported(status) => return reject(&stream, status).await,
        }
        if !pending.is_empty() && head_deadline.is_none() {
            head_deadline = Some(Instant::now() + s.header_timeout);
        }
        let deadline = head_deadline.or(s.idle_timeout.map(|t| Instant::now() + t));
        drop(std::mem::take(&mut buf)); // back to the pool before waiting
        match read_by(&stream, deadline).await {
            Some(b) => {
                buf = b;
                consumed = 0;
                if !pending.is_empty() {
                    pending.extend_from_slice(&buf);
                    consumed = buf.len();
                }
            }
            None => {
                if !pending.is_empty() && head_deadline.is_some_and(|d| Instant::now() >= d) {
                    reject(&stream, 408).await;
                }
                return;
            }
        }
    }
}

async fn reject(stream: &TcpStream, status: u16) {
    let _ = stream.write_all(proto::response_error(status)).await;
}
