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
//! `routes`, `pool`, `health`, `forward`, then this one.

mod config;
mod forward;
mod headers;
mod health;
mod pool;
mod routes;
mod stats;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use hotloop::hyper::{serve_hyper_tls_with_peer, serve_hyper_with_peer, HyperOptions};
use hotloop::signal::ShutdownSignals;
use hotloop::tls::{ALPN_H2, ALPN_HTTP11};
use hyper::service::service_fn;

use self::config::{Config, UpstreamProtocol};
use self::forward::Shared;
use self::pool::Backend;
use crate::proxy::{BackendProtocol, ProxyArgs};
use crate::stats_server::{Extra, Kind, StatsServer};

/// How often each worker closes its pooled connections idle past their timeout.
const POOL_SWEEP_MAX: Duration = Duration::from_secs(1);

fn millis_or_never(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

fn invalid(e: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
}

/// Runs the HTTP proxy until a stop signal (see `stop.rs` for each signal).
pub fn run(args: &ProxyArgs) -> std::io::Result<()> {
    let signals = ShutdownSignals::block()?;
    hotloop::raise_nofile_limit()?;
    let config: Config = match &args.config {
        Some(path) => config::load(path).map_err(invalid)?,
        None => {
            let protocol = match args.backend_protocol {
                BackendProtocol::Http1 => UpstreamProtocol::Http1,
                BackendProtocol::H2 => UpstreamProtocol::H2,
            };
            let connect = Duration::from_millis(args.connect_timeout_ms.max(1));
            config::from_backends(&args.backend, protocol, connect).map_err(invalid)?
        }
    };
    let tls = crate::tls::acceptor_from(
        args.tls_cert.as_deref(),
        args.tls_key.as_deref(),
        args.handshake_timeout_ms,
        &[ALPN_H2, ALPN_HTTP11],
    )?;
    let shared = Arc::new(shared(config, tls.is_some()));

    let rt = args.runtime.build_runtime()?;
    let handover = args.runtime.handover()?;
    let options = HyperOptions {
        server: args.runtime.server_options(&handover),
        idle_timeout: millis_or_never(args.idle_timeout_ms),
        send_timeout: millis_or_never(args.send_timeout_ms),
        header_timeout: millis_or_never(args.header_timeout_ms),
        idle_release: Some(HyperOptions::IDLE_RELEASE_DEFAULT),
    };
    let service_shared = shared.clone();
    let make_service = move |peer| {
        let shared = service_shared.clone();
        service_fn(move |req| forward::handle(shared.clone(), peer, req))
    };
    let listen = args.listen.as_str();
    let (server, certs) = match tls {
        None => (serve_hyper_with_peer(rt.handle(), listen, options, make_service)?, None),
        Some((acceptor, certs)) => (
            serve_hyper_tls_with_peer(rt.handle(), listen, options, acceptor, make_service)?,
            Some(certs),
        ),
    };
    start_background(&rt, &shared);
    let groups: Vec<String> = shared
        .groups
        .iter()
        .map(|g| {
            let addrs: Vec<&str> = g.backends.iter().map(|(s, _)| s.as_str()).collect();
            format!("{} [{}]", g.name, addrs.join(", "))
        })
        .collect();
    eprintln!(
        "hotloop proxy (http{}) on {} -> {} | workers {} | driver {}",
        if certs.is_some() { " over TLS" } else { "" },
        server.local_addr(),
        groups.join("; "),
        rt.handle().workers(),
        rt.stats().info.driver
    );
    let _stats = match &args.runtime.stats_addr {
        Some(addr) => {
            let (s, active) = (shared.clone(), server.active_connections_reader());
            let names = backend_names(&shared);
            let st = StatsServer::start(
                addr,
                rt.handle().clone(),
                Arc::new(move || {
                    let mut out = vec![Extra {
                        name: "active_connections",
                        help: "Client connections open now, over all workers.",
                        kind: Kind::Gauge,
                        value: active() as u64,
                    }];
                    let backends: Vec<_> = names
                        .iter()
                        .zip(s.backends.iter())
                        .map(|(&(prefix, help), b)| (prefix, help, &b.stats))
                        .collect();
                    out.extend(stats::fields(&s.stats, &backends));
                    out
                }),
            )?;
            eprintln!("hotloop proxy: stats on http://{}/stats", st.local_addr());
            Some(st)
        }
        None => None,
    };
    let active = server.active_connections_reader();
    let status = || {
        format!(
            "{} connections open, {} requests, {} retried",
            active(),
            shared.stats.requests.load(Relaxed),
            shared.stats.retries.load(Relaxed)
        )
    };
    handover.ready()?;
    if let Some(pid) = handover.predecessor() {
        eprintln!("hotloop proxy: took the listening socket over from pid {pid}, which drains");
    }
    let reload = || certs.as_ref().map(|c| crate::stop::reload_certificate(c));
    let control = crate::stop::Control {
        name: "hotloop proxy",
        signals: &signals,
        handover: &handover,
        drain_timeout: args.runtime.drain_timeout(),
        status: &status,
        reload: &reload,
    };
    let stopped = crate::stop::run_until_stopped(&control, &rt, server)?;
    crate::stop::say_stopped("hotloop proxy", &stopped, rt.stats().total.accepted);
    eprintln!("hotloop proxy: {} requests", shared.stats.requests.load(Relaxed));
    Ok(())
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
                stats: Default::default(),
            });
            fails.push((g.max_fails, g.fail_timeout));
        }
        members.push(start..backends.len());
    }
    Shared {
        routes: routes::Routes::new(config.routes),
        groups: config.groups,
        members,
        backends: backends.into(),
        health: Arc::new(health::Health::new(fails.into_iter())),
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
            let prefix = format!("backend_{}_{index}", sanitize(&g.name));
            let help = format!("Backend {} of group {}.", b.addr, g.name);
            (&*Box::leak(prefix.into_boxed_str()), &*Box::leak(help.into_boxed_str()))
        })
        .collect()
}

/// A group name as it may appear in a metric's name.
fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

/// Starts the active health checks (on worker 0) and each worker's pool sweeper.
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
    for worker in 0..rt.handle().workers() {
        let backends = shared.backends.clone();
        drop(rt.handle().spawn_on(worker, move || async move {
            let mut tick = hotloop::time::interval(sweep);
            while crate::drain::until_stop(tick.tick()).await.is_some() {
                pool::expire_idle(&backends);
            }
        }));
    }
}
