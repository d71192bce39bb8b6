//! `hotloop serve quic` and `hotloop serve h3`: a QUIC echo server and an
//! HTTP/3 server on quinn over hotloop's UDP sockets (`hotloop::quic`);
//! HTTP/3 is the `h3` crate through `h3-quinn`, which need no runtime of
//! their own.
//!
//! Every worker runs its own endpoint on the same UDP port
//! (`SO_REUSEPORT`: the kernel keeps each peer on one worker). In `quic`,
//! every bidirectional stream a client opens gets back what it sends, until
//! the client finishes the stream; then the server finishes its side. In
//! `h3`, every request gets 200 and `--body-size` bytes.
//!
//! The TLS identity is `--tls-cert`/`--tls-key`, or a self-signed
//! certificate made at start for `localhost`, 127.0.0.1, ::1 and the
//! address served (written to `--write-cert` for clients to trust). ALPN is
//! [`ALPN`] (`quic`; a client offering none is served too) or `h3`.
//!
//! Admission: a handshake from an address quinn has not validated holds no
//! `--maxconn` slot, and its replies are held to three times what the
//! address sent (`hotloop::quic::limit_amplification`); it takes a slot
//! when it completes. With `--quic-retry auto` (the default), once
//! `--quic-unvalidated-max` such handshakes are in progress, a new one gets
//! a Retry instead (the client has to echo a token from its own address, so
//! a spoofed one never comes back); `always` sends one to every new
//! address, `never` refuses beyond the bound. A connection from a validated
//! address takes its slot at once. Each connection's flow-control windows
//! and stream count are bounded ([`QuicArgs`]), and so is the memory it can
//! make the server hold; once many connections have ended, what they held
//! goes back to the kernel ([`MemoryReleaser`]).
//!
//! Stopping (SIGTERM, SIGINT): new connections are refused; a connection
//! with no stream (request) open closes at once, one with streams once
//! they are done (`h3` first sends GOAWAY, so the client opens no more),
//! each with [`CLOSE_STOPPING`] (`h3`: `H3_NO_ERROR`) and reason
//! "server stopping"; what is still open after `--grace-ms` (or at a second
//! signal) is closed the same way.
//!
//! [`QuicArgs`]: crate::serve_args::QuicArgs
//!
//! # Modules
//! Imports among them run one way, each naming only those before it:
//! `settings` (the protocol, limits and counters every connection shares),
//! `config` (quinn's server configuration and the TLS identity),
//! `release` (the memory releaser), `admission` (Retry, refusal and the
//! slot guards), `streams` (a connection's open streams), `echo` and
//! `http3` (the two protocols), `connection` (the accept loop and one
//! connection), then this file (binding an endpoint per worker, stopping).

mod admission;
mod config;
mod connection;
mod echo;
mod http3;
mod release;
mod settings;
mod streams;

use std::io;
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use hotloop::signal::ShutdownSignals;
use hotloop::time::timeout;
use hotloop::Runtime;
use quinn::VarInt;

use config::{identity, server_config};
use connection::accept_loop;
use release::MemoryReleaser;
use settings::{Proto, Settings, ALPN, ALPN_H3, CLOSE_FULL, CLOSE_FULL_H3, CLOSE_REASON};
use settings::{CLOSE_STOPPING, CLOSE_STOPPING_H3, MAXCONN_DEFAULT};

use crate::serve_args::{millis_or_never, App, ServeArgs};
use crate::stats_server::StatsServer;
use crate::stop;

/// After closing the endpoints, how long to let their close packets go out.
const CLOSE_FLUSH_MAX: Duration = Duration::from_millis(250);

/// Runs `hotloop serve quic` or `hotloop serve h3` until a stop signal.
pub fn run(
    args: &ServeArgs,
    signals: &ShutdownSignals,
    rt: &Runtime,
    nofile: u64,
) -> io::Result<()> {
    let addr = args.addr.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("`{}` names no address", args.addr))
    })?;
    let (certs, key, note) = identity(args, addr)?;
    let (proto, alpn, close_code, close_full) = match args.app {
        App::H3 => {
            let body = bytes::Bytes::from(vec![b'x'; args.body_size]);
            (Proto::H3 { body }, ALPN_H3, CLOSE_STOPPING_H3, CLOSE_FULL_H3)
        }
        _ => (Proto::Echo, ALPN, CLOSE_STOPPING, CLOSE_FULL),
    };
    let server_config = server_config(args, certs, key, alpn)?;
    let settings = Arc::new(Settings {
        proto,
        work_us: args.work_us,
        send_timeout: millis_or_never(args.send_timeout_ms),
        handshake_timeout: Duration::from_millis(args.handshake_timeout_ms),
        retry: args.quic.quic_retry,
        unvalidated_max: args.quic.quic_unvalidated_max,
        maxconn: args.runtime.maxconn.unwrap_or(MAXCONN_DEFAULT),
        close_full,
        active: AtomicUsize::new(0),
        slots: AtomicUsize::new(0),
        unvalidated: AtomicUsize::new(0),
        peak: AtomicUsize::new(0),
        accepted: AtomicU64::new(0),
        retries: AtomicU64::new(0),
        refused: AtomicU64::new(0),
    });

    // Worker 0 binds first, so that port 0 becomes one port every worker binds.
    let workers = rt.handle().workers();
    let mut endpoints = Vec::with_capacity(workers);
    let mut bound = addr;
    for worker in 0..workers {
        let (tx, rx) = mpsc::channel();
        let (config, settings) = (server_config.clone(), settings.clone());
        // Detached: the task runs the endpoint until the runtime is dropped.
        drop(rt.handle().spawn_on(worker, move || async move {
            match hotloop::quic::endpoint(bound, Some(config)) {
                Ok(endpoint) => {
                    let _ = tx.send(Ok(endpoint.clone()));
                    accept_loop(endpoint, settings).await;
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        }));
        let endpoint = rx
            .recv()
            .map_err(|_| io::Error::other("a worker stopped before binding its endpoint"))?
            .map_err(|e| io::Error::new(e.kind(), format!("binding UDP {bound}: {e}")))?;
        bound = endpoint.local_addr()?;
        endpoints.push(endpoint);
    }

    let stats = rt.stats();
    eprintln!(
        "hotloop serve {:?} on {bound} | workers {workers} | driver {} ({}) | busy-poll {} | open-file limit {nofile} | ALPN {} | maxconn {} | retry {:?}",
        args.app,
        stats.info.driver,
        stats.info.reason,
        stats.info.busy_poll,
        String::from_utf8_lossy(alpn),
        settings.maxconn,
        settings.retry,
    );
    eprintln!("hotloop serve: {note}");
    let active = {
        let settings = settings.clone();
        move || settings.active.load(Ordering::SeqCst)
    };
    let _stats_server = StatsServer::start_with_active(
        "hotloop serve",
        args.runtime.stats_addr.as_deref(),
        rt.handle().clone(),
        "QUIC connections open now, over all workers.",
        active.clone(),
    )?;
    let releaser = MemoryReleaser::start(settings.clone())?;
    let accepted = || settings.accepted.load(Ordering::Relaxed);
    let status = || {
        format!(
            "{} connections open ({} handshaking from unvalidated addresses), {} accepted, {} Retry sent, {} refused",
            active(),
            settings.unvalidated.load(Ordering::Relaxed),
            accepted(),
            settings.retries.load(Ordering::Relaxed),
            settings.refused.load(Ordering::Relaxed),
        )
    };
    // The accept loops refuse new connections once `drain` says stopping.
    let stopped = stop::run_until_stopped_with(
        "hotloop serve",
        signals,
        rt,
        &active,
        args.runtime.grace(),
        &status,
        || {},
    )?;
    // What is left is closed, and the close packets are given a moment to go out.
    let closes: Vec<_> = endpoints
        .into_iter()
        .enumerate()
        .map(|(worker, endpoint)| {
            rt.handle().spawn_on(worker, move || async move {
                endpoint.close(VarInt::from_u32(close_code), CLOSE_REASON);
                let _ = timeout(CLOSE_FLUSH_MAX, endpoint.wait_idle()).await;
            })
        })
        .collect();
    for close in closes {
        let _ = close.join();
    }
    drop(releaser);
    let how = if stopped.forced { "stopped at once" } else { "stopped" };
    eprintln!(
        "hotloop serve: {how} ({} connections cut at the grace limit); {} accepted",
        stopped.cut,
        accepted()
    );
    Ok(())
}
