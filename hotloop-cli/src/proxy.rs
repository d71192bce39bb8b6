//! `hotloop proxy`: a TCP forwarder (haproxy's `mode tcp`) on the runtime,
//! the default `--mode tcp`; `--mode http` is the HTTP reverse proxy of
//! `http_proxy/`, which takes its flags from here too.
//!
//! Each client connection goes to the next backend round-robin; if the
//! connect fails or times out, the next backend is tried, until every
//! backend has been tried once. Bytes then flow both ways until each side
//! closes; a half-close is passed on as a half-close.
//!
//! A proxied connection is idle only when neither direction has moved (a
//! read or a write finishing) for the idle timeout, as haproxy's `timeout
//! tunnel`: a backend streaming to a silent client, or a client uploading
//! to a silent backend, is never cut. A write blocked because its reader
//! does not read makes no progress, so it counts as idle too.
//!
//! A cut (the idle timeout, a reset or an error on either side) is passed
//! on as a reset (`SO_LINGER` 0, then close), never as a clean end of
//! stream, so neither peer can take a truncated transfer for a complete
//! one. haproxy does the same when it aborts a stream (its "nolinger"
//! close); unlike haproxy, hotloop also resets on the idle timeout, where
//! haproxy sends a FIN. When one side fails, the other still gets every
//! byte already forwarded to it before its reset (see `forward.rs`).

use std::cell::Cell;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use hotloop::net::{serve, TcpStream};
use hotloop::Runtime;

use crate::mode::{self, Serving, Start};
use crate::runtime_args::RuntimeArgs;
use crate::stats_server::{Extra, ExtraFields, Kind};

mod forward;
use forward::forward;

/// What `hotloop proxy` forwards.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// TCP connections, byte for byte, round-robin (the default).
    Tcp,
    /// HTTP requests (HTTP/1.1 and HTTP/2), routed by host and path to
    /// backend groups, over pooled keep-alive connections.
    Http,
}

/// How `--mode http` speaks to `--backend`s (a `--config` file says it per group).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendProtocol {
    /// HTTP/1.1 with keep-alive.
    Http1,
    /// HTTP/2 by prior knowledge.
    H2,
}

/// `hotloop proxy` flags.
#[derive(Args, Debug, Clone)]
pub struct ProxyArgs {
    /// tcp: forward connections; http: forward requests (see the notes below).
    #[arg(long, value_enum, default_value = "tcp")]
    pub mode: Mode,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub listen: String,
    /// Backend addresses, comma-separated (http: one group serving every
    /// host and path; --config instead for routes).
    #[arg(
        long,
        value_delimiter = ',',
        required_unless_present = "config",
        conflicts_with = "config"
    )]
    pub backend: Vec<String>,
    /// http: the groups and routes file (TOML; see README.md for every key).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// http with --backend: HTTP/1.1 or HTTP/2 (prior knowledge) to the backends.
    #[arg(long, value_enum, default_value = "http1")]
    pub backend_protocol: BackendProtocol,
    /// Connect timeout: give up on one backend after this long and try the
    /// next, milliseconds (http with --config: each group's `connect_timeout_ms`).
    #[arg(long, default_value_t = 1000)]
    pub connect_timeout_ms: u64,
    /// http with --backend: the longest a request waits for an idle
    /// connection, one of its own worker's coming back from a request or
    /// one borrowed from another worker's pool, when its worker has none,
    /// milliseconds (0: never wait or borrow; default: as a group's
    /// `pool_borrow_ms`, 1; with --config: each group's `pool_borrow_ms`).
    #[arg(long)]
    pub pool_borrow_ms: Option<u64>,
    /// Idle timeout: cut a proxied connection (a reset to both sides) when
    /// no byte has moved in either direction for this long, writes blocked
    /// on a peer that does not read included (haproxy's `timeout tunnel`),
    /// milliseconds (0: never). http: a client connection with nothing
    /// moving for this long is closed, but not while a backend owes one of
    /// its requests the answer (the group's timeouts bound that).
    #[arg(long, default_value_t = 60_000)]
    pub idle_timeout_ms: u64,
    /// http: a client's request head must arrive whole within this long,
    /// milliseconds (0: never).
    #[arg(long, default_value_t = 10_000)]
    pub header_timeout_ms: u64,
    /// http: cut a client connection whose write has made no progress for
    /// this long (the client does not read); an HTTP/2 stream whose answer
    /// has waited this long for flow-control window is reset and its
    /// backend connection closed. Milliseconds (0: never).
    #[arg(long, default_value_t = 60_000)]
    pub send_timeout_ms: u64,
    /// http: serve clients over TLS with this certificate chain (PEM), ALPN h2 and http/1.1.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// http: the private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// http over TLS: a client's handshake must finish within this long, milliseconds.
    #[arg(long, default_value_t = 10_000,
          value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..))]
    pub handshake_timeout_ms: u64,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

/// The proxy's own counters, shared by every worker.
#[derive(Default, Debug)]
pub struct ProxyCounters {
    /// Client connections forwarded to a backend.
    pub forwarded: AtomicU64,
    /// Backend connects that failed or timed out.
    pub backend_connect_failures: AtomicU64,
    /// Connections retried on another backend.
    pub retries: AtomicU64,
    /// Client connections closed because no backend could be reached.
    pub no_backend: AtomicU64,
    /// Bytes from clients to backends.
    pub bytes_up: AtomicU64,
    /// Bytes from backends to clients.
    pub bytes_down: AtomicU64,
}

/// What every connection of one proxy shares.
pub struct ProxyConfig {
    /// Backend addresses.
    pub backends: Vec<SocketAddr>,
    /// Per-backend connect timeout.
    pub connect_timeout: Duration,
    /// Idle timeout (None: never).
    pub idle_timeout: Option<Duration>,
    /// Counters.
    pub counters: ProxyCounters,
}

/// `hotloop proxy --mode tcp`: a [`mode::Mode`] forwarding each connection.
pub struct TcpProxy {
    args: ProxyArgs,
    config: Arc<ProxyConfig>,
}

impl TcpProxy {
    /// The forwarder `args` describe, its backends resolved.
    pub fn new(args: &ProxyArgs) -> io::Result<TcpProxy> {
        if args.config.is_some() || args.tls_cert.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "--config and --tls-cert need --mode http",
            ));
        }
        let mut backends = Vec::new();
        for b in &args.backend {
            backends.extend(b.to_socket_addrs()?);
        }
        if backends.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no backend address resolved"));
        }
        let config = Arc::new(ProxyConfig {
            backends,
            connect_timeout: Duration::from_millis(args.connect_timeout_ms.max(1)),
            idle_timeout: (args.idle_timeout_ms > 0)
                .then(|| Duration::from_millis(args.idle_timeout_ms)),
            counters: ProxyCounters::default(),
        });
        Ok(TcpProxy { args: args.clone(), config })
    }
}

impl mode::Mode for TcpProxy {
    const NAME: &'static str = "hotloop proxy";
    const ACTIVE_HELP: &'static str = "Client connections open now, over all workers.";

    fn runtime_args(&self) -> &RuntimeArgs {
        &self.args.runtime
    }

    /// Proxied connections have no request boundary: a drain lets them run
    /// until they end or the drain timeout does, as haproxy's `hard-stop-after`.
    fn start(&mut self, at: &Start<'_>) -> io::Result<Serving> {
        let config = self.config.clone();
        let server = serve(at.rt.handle(), self.args.listen.as_str(), at.server_options(), {
            move |client| forward(client, config.clone())
        })?;
        Ok(Serving::Tcp(server))
    }

    fn banner(&self, at: &Start<'_>, on: SocketAddr) -> String {
        format!(
            "hotloop proxy on {on} -> {:?} | workers {} | driver {}",
            self.config.backends,
            at.rt.handle().workers(),
            at.rt.stats().info.driver
        )
    }

    fn stats(&self) -> Option<ExtraFields> {
        let c = self.config.clone();
        Some(Arc::new(move || {
            let k = &c.counters;
            let counter = |name, help, value: &AtomicU64| Extra {
                name,
                help,
                kind: Kind::Counter,
                value: value.load(Relaxed),
            };
            vec![
                counter("forwarded", "Client connections forwarded to a backend.", &k.forwarded),
                counter(
                    "backend_connect_failures",
                    "Backend connects that failed or timed out.",
                    &k.backend_connect_failures,
                ),
                counter("retries", "Connections retried on another backend.", &k.retries),
                counter(
                    "no_backend",
                    "Client connections closed because no backend could be reached.",
                    &k.no_backend,
                ),
                counter("bytes_up", "Bytes forwarded from clients to backends.", &k.bytes_up),
                counter("bytes_down", "Bytes forwarded from backends to clients.", &k.bytes_down),
            ]
        }))
    }

    fn status(&self, _: &Runtime, open: usize) -> String {
        format!(
            "{open} connections open, {} forwarded",
            self.config.counters.forwarded.load(Relaxed)
        )
    }

    fn farewell(&self) -> Option<String> {
        Some(format!("{} forwarded", self.config.counters.forwarded.load(Relaxed)))
    }
}

thread_local! {
    /// Each worker's round-robin position.
    static NEXT_BACKEND: Cell<usize> = const { Cell::new(0) };
}

/// Connects to a backend, trying each once starting from the next in turn.
async fn connect_backend(config: &ProxyConfig) -> Option<TcpStream> {
    let n = config.backends.len();
    let start = NEXT_BACKEND.with(|c| {
        let v = c.get();
        c.set(v.wrapping_add(1));
        v
    });
    for attempt in 0..n {
        let addr = config.backends[(start + attempt) % n];
        if attempt > 0 {
            config.counters.retries.fetch_add(1, Relaxed);
        }
        match connect_within(addr, config.connect_timeout).await {
            Ok(s) => return Some(s),
            Err(_) => {
                config.counters.backend_connect_failures.fetch_add(1, Relaxed);
            }
        }
    }
    None
}

/// The first wait for a descriptor when the process has none left; each
/// further wait doubles, up to [`DESCRIPTOR_WAIT_MAX`].
const DESCRIPTOR_WAIT_FIRST: Duration = Duration::from_millis(5);
/// The longest single wait for a descriptor.
const DESCRIPTOR_WAIT_MAX: Duration = Duration::from_millis(100);

/// Connects to `addr` within `limit`. Out of descriptors (the client's
/// socket may have taken the last one), it waits for one to free, backing
/// off, for the rest of the limit: at the descriptor limit a client waits
/// for its connect timeout like any other, not cut at once.
async fn connect_within(addr: SocketAddr, limit: Duration) -> std::io::Result<TcpStream> {
    let deadline = Instant::now() + limit;
    let mut wait = DESCRIPTOR_WAIT_FIRST;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(addr, left).await {
            Err(e) if out_of_descriptors(&e) && left > wait => {
                hotloop::time::sleep(wait).await;
                wait = (wait * 2).min(DESCRIPTOR_WAIT_MAX);
            }
            result => return result,
        }
    }
}

fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}
