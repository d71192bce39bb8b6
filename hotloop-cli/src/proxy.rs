//! `hotloop proxy`: a TCP forwarder (haproxy's `mode tcp`) on the runtime.
//!
//! Each client connection goes to the next backend round-robin; if the
//! connect fails or times out, the next backend is tried, until every
//! backend has been tried once. Bytes then flow both ways until each side
//! closes; a half-close is passed on as a half-close.

use std::cell::Cell;
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use hotloop::net::{serve, TcpStream};
use hotloop::signal::ShutdownSignals;
use hotloop::spawn;

use crate::runtime_args::RuntimeArgs;
use crate::stats_server::{Extra, Kind, StatsServer};

/// `hotloop proxy` flags.
#[derive(Args, Debug, Clone)]
pub struct ProxyArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub listen: String,
    /// Backend addresses, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub backend: Vec<String>,
    /// Give up connecting to one backend after this long (milliseconds).
    #[arg(long, default_value_t = 1000)]
    pub connect_timeout_ms: u64,
    /// Close a connection when neither side has sent anything for this long (milliseconds; 0: never).
    #[arg(long, default_value_t = 60_000)]
    pub idle_timeout_ms: u64,
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

/// Runs the proxy until SIGINT or SIGTERM.
pub fn run(args: &ProxyArgs) -> std::io::Result<()> {
    let signals = ShutdownSignals::block()?;
    hotloop::raise_nofile_limit()?;
    let mut backends = Vec::new();
    for b in &args.backend {
        backends.extend(b.to_socket_addrs()?);
    }
    if backends.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "no backend address resolved",
        ));
    }
    let config = Arc::new(ProxyConfig {
        backends,
        connect_timeout: Duration::from_millis(args.connect_timeout_ms.max(1)),
        idle_timeout: (args.idle_timeout_ms > 0)
            .then(|| Duration::from_millis(args.idle_timeout_ms)),
        counters: ProxyCounters::default(),
    });
    let rt = args.runtime.build_runtime()?;
    let cfg = config.clone();
    let server =
        serve(rt.handle(), args.listen.as_str(), args.runtime.server_options(), move |client| {
            forward(client, cfg.clone())
        })?;
    eprintln!(
        "hotloop proxy on {} -> {:?} | workers {} | driver {}",
        server.local_addr(),
        config.backends,
        rt.handle().workers(),
        rt.stats().info.driver
    );
    let _stats = match &args.runtime.stats_addr {
        Some(addr) => {
            let (c, active) = (config.clone(), server.active_connections_reader());
            Some(StatsServer::start(
                addr,
                rt.handle().clone(),
                Arc::new(move || {
                    let k = &c.counters;
                    let counter = |name, help, value: &AtomicU64| Extra {
                        name,
                        help,
                        kind: Kind::Counter,
                        value: value.load(Relaxed),
                    };
                    vec![
                        Extra {
                            name: "active_connections",
                            help: "Client connections open now, over all workers.",
                            kind: Kind::Gauge,
                            value: active() as u64,
                        },
                        counter(
                            "forwarded",
                            "Client connections forwarded to a backend.",
                            &k.forwarded,
                        ),
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
                        counter(
                            "bytes_up",
                            "Bytes forwarded from clients to backends.",
                            &k.bytes_up,
                        ),
                        counter(
                            "bytes_down",
                            "Bytes forwarded from backends to clients.",
                            &k.bytes_down,
                        ),
                    ]
                }),
            )?)
        }
        None => None,
    };
    if let Some(st) = &_stats {
        eprintln!("hotloop proxy: stats on http://{}/stats", st.local_addr());
    }
    signals.wait()?;
    let left = server.shutdown_blocking(args.runtime.grace());
    eprintln!(
        "hotloop proxy: stopped ({left} connections cut at the grace limit); {} forwarded",
        config.counters.forwarded.load(Relaxed)
    );
    Ok(())
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
        match TcpStream::connect_timeout(addr, config.connect_timeout).await {
            Ok(s) => return Some(s),
            Err(_) => {
                config.counters.backend_connect_failures.fetch_add(1, Relaxed);
            }
        }
    }
    None
}

/// Forwards one client connection.
pub async fn forward(client: TcpStream, config: Arc<ProxyConfig>) {
    let Some(backend) = connect_backend(&config).await else {
        config.counters.no_backend.fetch_add(1, Relaxed);
        return; // dropping the client closes it cleanly
    };
    config.counters.forwarded.fetch_add(1, Relaxed);
    let client = Rc::new(client);
    let backend = Rc::new(backend);
    let up = spawn(copy(client.clone(), backend.clone(), config.clone(), true));
    copy(backend, client, config, false).await;
    let _ = up.await;
}

/// Copies `from` to `to` until EOF, then half-closes `to`.
async fn copy(from: Rc<TcpStream>, to: Rc<TcpStream>, config: Arc<ProxyConfig>, upstream: bool) {
    let counter = if upstream { &config.counters.bytes_up } else { &config.counters.bytes_down };
    let mut buf = Vec::with_capacity(16 * 1024);
    loop {
        let read = match config.idle_timeout {
            Some(t) => match hotloop::time::timeout(t, from.read(buf)).await {
                Ok(r) => r,
                Err(_) => {
                    // Idle too long: end both directions.
                    let _ = to.shutdown(Shutdown::Both).await;
                    let _ = from.shutdown(Shutdown::Both).await;
                    return;
                }
            },
            None => from.read(buf).await,
        };
        let (res, b) = read;
        match res {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write).await;
                return;
            }
            Ok(n) => {
                counter.fetch_add(n as u64, Relaxed);
                let (res, b) = to.write_all(b).await;
                if res.is_err() {
                    let _ = from.shutdown(Shutdown::Both).await;
                    return;
                }
                buf = b;
            }
            Err(_) => {
                // Reset or error: pass it on as a full close.
                let _ = to.shutdown(Shutdown::Both).await;
                return;
            }
        }
    }
}
