//! `hotloop proxy --mode http`: an HTTP reverse proxy on hyper's server and
//! client, thread-per-core.
//!
//! Clients speak HTTP/1.1 or HTTP/2 (by prior knowledge, or by ALPN over
//! TLS), served by `hotloop::hyper::serve_hyper_with_peer` with the same
//! deadlines, limits and drain as `serve hyper`. Each request is routed by
//! host and path to a group of backends (`routes.rs`), sent on a
//! connection from the worker's own pool or a new one (`pool.rs`), retried
//! where that is safe (`forward.rs`), to a backend that the health checks
//! and the passive ejection hold up (`health.rs`), with the hop-by-hop
//! headers removed and the forwarding ones added (`headers.rs`), and
//! counted per backend (`stats.rs`). `config.rs` reads the groups and
//! routes.
//!
//! Modules name only those before them: `config`, `stats`, `headers`,
//! `routes`, `h2peer`, `pool`, `health`, `forward`, then this one.

mod config;
mod forward;
mod h2peer;
mod headers;
mod health;
mod pool;
mod routes;
mod stats;

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use hotloop::hyper::{serve_hyper_tls_with_peer, serve_hyper_with_peer, HyperOptions};
use hotloop::tls::{CertReloader, TlsAcceptor, ALPN_H2, ALPN_HTTP11};
use hotloop::Runtime;
use hyper::service::service_fn;

use self::config::{Config, UpstreamProtocol};
use self::forward::Shared;
use self::headers::Forwarding;
use self::pool::Backend;
use crate::mode::{Mode, Serving, Start};
use crate::proxy::{BackendProtocol, ProxyArgs};
use crate::runtime_args::RuntimeArgs;
use crate::stats_server::ExtraFields;

/// How often each worker closes its pooled connections idle past their timeout.
const POOL_SWEEP_MAX: Duration = Duration::from_secs(1);

fn millis_or_never(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

fn invalid(e: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
}

/// `hotloop proxy --mode http`: a [`Mode`] serving hyper with a
/// forwarding service.
pub struct HttpProxy {
    args: ProxyArgs,
    shared: Arc<Shared>,
    /// Taken when it starts.
    tls: Option<TlsAcceptor>,
    /// The certificate SIGHUP reloads.
    certs: Option<Arc<CertReloader>>,
}

impl HttpProxy {
    /// The proxy `args` describe: its groups and routes, and TLS.
    pub fn new(args: &ProxyArgs) -> std::io::Result<HttpProxy> {
        let config: Config = match &args.config {
            Some(path) => config::load(path).map_err(invalid)?,
            None => {
                let protocol = match args.backend_protocol {
                    BackendProtocol::Http1 => UpstreamProtocol::Http1,
                    BackendProtocol::H2 => UpstreamProtocol::H2,
                };
                let connect = Duration::from_millis(args.connect_timeout_ms.max(1));
                let mut config =
                    config::from_backends(&args.backend, protocol, connect).map_err(invalid)?;
                if let Some(ms) = args.pool_borrow_ms {
                    for g in &mut config.groups {
                        g.pool_borrow = Duration::from_millis(ms);
                    }
                }
                config
            }
        };
        let tls = crate::tls::acceptor_from(
            args.tls_cert.as_deref(),
            args.tls_key.as_deref(),
            args.handshake_timeout_ms,
            &[ALPN_H2, ALPN_HTTP11],
        )?;
        let shared = Arc::new(shared(config, tls.is_some()));
        let (tls, certs) = tls.map_or((None, None), |(a, c)| (Some(a), Some(c)));
        Ok(HttpProxy { args: args.clone(), shared, tls, certs })
    }
}

impl Mode for HttpProxy {
    const NAME: &'static str = "hotloop proxy";
    const ACTIVE_HELP: &'static str = "Client connections open now, over all workers.";

    fn runtime_args(&self) -> &RuntimeArgs {
        &self.args.runtime
    }

    fn start(&mut self, at: &Start<'_>) -> std::io::Result<Serving> {
        let args = &self.args;
        let options = HyperOptions {
            server: at.server_options(),
            idle_timeout: millis_or_never(args.idle_timeout_ms),
            send_timeout: millis_or_never(args.send_timeout_ms),
            header_timeout: millis_or_never(args.header_timeout_ms),
            idle_release: Some(HyperOptions::IDLE_RELEASE_DEFAULT),
            ..HyperOptions::default()
        };
        let service_shared = self.shared.clone();
        let make_service = move |peer| {
            let shared = service_shared.clone();
            let client = Rc::new(Forwarding::new(peer, shared.tls));
            service_fn(move |req| forward::handle(shared.clone(), client.clone(), req))
        };
        let (rt, listen) = (at.rt.handle(), args.listen.as_str());
        let server = match self.tls.take() {
            None => serve_hyper_with_peer(rt, listen, options, make_service)?,
            Some(tls) => serve_hyper_tls_with_peer(rt, listen, options, tls, make_service)?,
        };
        start_background(at.rt, &self.shared);
        Ok(Serving::Tcp(server))
    }

    fn banner(&self, at: &Start<'_>, on: SocketAddr) -> String {
        let groups: Vec<String> = self
            .shared
            .groups
            .iter()
            .map(|g| {
                let addrs: Vec<&str> = g.backends.iter().map(|(s, _)| s.as_str()).collect();
                format!("{} [{}]", g.name, addrs.join(", "))
            })
            .collect();
        format!(
            "hotloop proxy (http{}) on {on} -> {} | workers {} | driver {}",
            if self.certs.is_some() { " over TLS" } else { "" },
            groups.join("; "),
            at.rt.handle().workers(),
            at.rt.stats().info.driver
        )
    }

    fn stats(&self) -> Option<ExtraFields> {
        let (s, names) = (self.shared.clone(), backend_names(&self.shared));
        Some(Arc::new(move || {
            let backends: Vec<_> = names
                .iter()
                .zip(s.backends.iter())
                .map(|(&(prefix, help), b)| (prefix, help, &b.stats))
                .collect();
            stats::fields(&s.stats, &backends)
        }))
    }

    fn status(&self, _: &Runtime, open: usize) -> String {
        let stats = &self.shared.stats;
        format!(
            "{open} connections open, {} requests, {} retried",
            stats.requests.load(Relaxed),
            stats.retries.load(Relaxed)
        )
    }

    fn reload(&self) -> Option<String> {
        self.certs.as_ref().map(|c| crate::stop::reload_certificate(c))
    }

    fn farewell(&self) -> Option<String> {
        Some(format!("{} requests", self.shared.stats.requests.load(Relaxed)))
    }
}

/// The shared state for `config`.
fn shared(config: Config, tls: bool) -> Shared {
    let mut backends = Vec::new();
    let mut members = Vec::new();
    let mut fails = Vec::new();
    for (gi, g) in config.groups.iter().enumerate() {
        let start = backends.len();
        for (&(_, addr), tls) in g.backends.iter().zip(&g.tls) {
            backends.push(Backend {
                addr,
                group: gi,
                protocol: g.protocol,
                tls: tls.clone(),
                pool_idle_max: g.pool_idle_max,
                pool_idle_timeout: g.pool_idle_timeout,
                pool_borrow: g.pool_borrow,
                idle_on: Default::default(),
                stats: Default::default(),
            });
            fails.push((g.max_fails, g.fail_timeout));
        }
        members.push(start..backends.len());
    }
    let health = Arc::new(health::Health::new(fails.into_iter(), &members));
    Shared {
        routes: routes::Routes::new(config.routes),
        groups: config.groups,
        members,
        backends: backends.into(),
        health,
        stats: Default::default(),
        tls,
    }
}

/// Each backend's field-name prefix and help text, made once at start
/// (the endpoint's names are `&'static str`; the backends never change).
fn backend_names(shared: &Shared) -> Vec<(&'static str, &'static str)> {
    shared
        .backends
        .iter()
        .enumerate()
        .map(|(id, b)| {
            let g = &shared.groups[b.group];
            let index = id - shared.members[b.group].start;
            let prefix = format!("backend_{}_{index}", config::metric_name(&g.name));
            let help = format!("Backend {} of group {}.", b.addr, g.name);
            (&*Box::leak(prefix.into_boxed_str()), &*Box::leak(help.into_boxed_str()))
        })
        .collect()
}

/// Starts the active health checks (on worker 0) and each worker's pool
/// sweeper, which also closes the worker's idle backend connections when
/// it runs out of descriptors and at a stop.
fn start_background(rt: &hotloop::Runtime, shared: &Arc<Shared>) {
    for (gi, g) in shared.groups.iter().enumerate() {
        let Some(h) = &g.health else { continue };
        for id in shared.members[gi].clone() {
            let (health, backends, h) = (shared.health.clone(), shared.backends.clone(), h.clone());
            let name = format!("{}[{}]", g.name, id - shared.members[gi].start);
            drop(
                rt.handle().spawn_on(0, move || health::check_loop(health, backends, id, h, name)),
            );
        }
    }
    let sweep = shared
        .groups
        .iter()
        .map(|g| g.pool_idle_timeout / 2)
        .min()
        .unwrap_or(POOL_SWEEP_MAX)
        .clamp(Duration::from_millis(10), POOL_SWEEP_MAX);
    pool::start_lending(&shared.backends, rt.handle().workers());
    for worker in 0..rt.handle().workers() {
        let backends = shared.backends.clone();
        drop(rt.handle().spawn_on(worker, move || async move {
            pool::note_worker(worker);
            let reclaim = backends.clone();
            hotloop::net::on_descriptor_shortage(move || pool::close_idle(&reclaim));
            let mut tick = hotloop::time::interval(sweep);
            while crate::drain::until_stop(tick.tick()).await.is_some() {
                pool::expire_idle(&backends);
            }
            // Stopping: no request will take them, and the backends need
            // not wait for their idle timeouts to see them go.
            pool::close_idle(&backends);
        }));
    }
}
