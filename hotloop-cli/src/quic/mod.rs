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
//! "server stopping"; what is still open after `--drain-timeout-ms` (or at
//! a second signal) is closed the same way.
//!
//! Upgrades (`--upgrade-socket`): the successor receives the UDP sockets
//! (every member of the `SO_REUSEPORT` group) and says it is ready before
//! it starts its endpoints; this process then closes every connection at
//! once, with the same code and the reason "server upgrading", lets the
//! close packets go out ([`CLOSE_SEND_WAIT`]), moves its endpoints to
//! sockets of their own, and only then tells the successor to start
//! reading. Its connections are closed, not finished: both processes would
//! read the same sockets, the kernel gives each datagram to one of them,
//! and a datagram of one process's connection read by the other is
//! answered with a stateless reset (or a new connection's Initial read by
//! the old process is refused). Steering by connection ID needs an eBPF
//! program (`CAP_BPF`) or forwarding datagrams between the processes (as
//! Envoy's hot restart does). A client sees its connection closed with a
//! reason at once, never a timeout, and reconnects to the successor;
//! datagrams that arrive in between wait in the sockets' buffers.
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
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use hotloop::signal::ShutdownSignals;
use hotloop::time::timeout;
use hotloop::Runtime;
use quinn::VarInt;

use config::{identity, server_config, Identity};
use connection::accept_loop;
use hotloop::net::UdpOptions;
use release::MemoryReleaser;
use settings::{Proto, Settings, ALPN, ALPN_H3, CLOSE_FULL, CLOSE_FULL_H3, CLOSE_REASON};
use settings::{CLOSE_STOPPING, CLOSE_STOPPING_H3, CLOSE_UPGRADING_REASON, MAXCONN_DEFAULT};

use crate::serve_args::{millis_or_never, App, ServeArgs};
use crate::stats_server::StatsServer;
use crate::stop;

/// After closing the endpoints, how long to let their close packets go out.
const CLOSE_FLUSH_MAX: Duration = Duration::from_millis(250);

/// At a hand-over, how long the closing endpoints keep the shared sockets
/// to send their close packets before they stop reading them: the
/// successor reads nothing meanwhile (what arrives waits in the socket).
const CLOSE_SEND_WAIT: Duration = Duration::from_millis(50);

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
    let (identity, note) = identity(args, addr)?;
    let (proto, alpn, close_code, close_full) = match args.app {
        App::H3 => {
            let body = bytes::Bytes::from(vec![b'x'; args.body_size]);
            (Proto::H3 { body }, ALPN_H3, CLOSE_STOPPING_H3, CLOSE_FULL_H3)
        }
        _ => (Proto::Echo, ALPN, CLOSE_STOPPING, CLOSE_FULL),
    };
    let server_config = server_config(args, &identity, alpn)?;
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

    // The sockets of a predecessor (or systemd), or new ones: one per
    // worker on one port (SO_REUSEPORT).
    let workers = rt.handle().workers();
    let handover = args.runtime.handover()?;
    let sockets = handover
        .udp_sockets(addr, workers, &UdpOptions::quic())
        .map_err(|e| io::Error::new(e.kind(), format!("binding UDP {addr}: {e}")))?;
    let bound = sockets[0].local_addr()?;
    // A predecessor stops reading the sockets (closing its connections) before
    // this process starts its endpoints on them: see the module docs.
    handover.ready()?;
    if let Some(pid) = handover.predecessor() {
        eprintln!("hotloop serve: took the UDP sockets over from pid {pid}");
    }
    // Socket `i` goes to worker `i % workers`; a worker may run several
    // endpoints (a predecessor had more workers) or none (it had fewer).
    let mut endpoints = Vec::with_capacity(sockets.len());
    for (i, socket) in sockets.into_iter().enumerate() {
        let worker = i % workers;
        let (tx, rx) = mpsc::channel();
        let (config, settings) = (server_config.clone(), settings.clone());
        // Detached: the task runs the endpoint until the runtime is dropped.
        drop(rt.handle().spawn_on(worker, move || async move {
            match hotloop::quic::endpoint_on(socket, Some(config)) {
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
            .map_err(|_| io::Error::other("a worker stopped before starting its endpoint"))?
            .map_err(|e| io::Error::new(e.kind(), format!("QUIC endpoint on {bound}: {e}")))?;
        endpoints.push((worker, endpoint));
    }
    {
        // A successor reads the sockets once this process no longer does.
        let (handle, endpoints) = (rt.handle().clone(), endpoints.clone());
        handover.on_hand_over(move || hand_over(&handle, &endpoints, close_code));
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
    let reload = || match &identity {
        Identity::Files(certs) => Some(stop::reload_certificate(certs)),
        Identity::Generated(..) => None,
    };
    let control = stop::Control {
        name: "hotloop serve",
        signals,
        handover: &handover,
        drain_timeout: args.runtime.drain_timeout(),
        status: &status,
        reload: &reload,
    };
    // The accept loops refuse new connections once `drain` says stopping.
    let stopped = stop::run_until_stopped_with(&control, rt, &active, || {})?;
    // What is left is closed, and the close packets are given a moment to go out.
    let closes: Vec<_> = endpoints
        .into_iter()
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
    stop::say_stopped("hotloop serve", &stopped, accepted());
    Ok(())
}

/// A successor serves the UDP sockets: every endpoint closes its
/// connections (code `close_code`, reason "server upgrading"), gives the
/// close packets a moment to go out, and moves to a socket of its own, so
/// nothing here reads the handed-over sockets again. Returns once done on
/// every worker.
fn hand_over(handle: &hotloop::Handle, endpoints: &[(usize, quinn::Endpoint)], close_code: u32) {
    let closes: Vec<_> = endpoints
        .iter()
        .map(|(worker, endpoint)| {
            let endpoint = endpoint.clone();
            handle.spawn_on(*worker, move || async move {
                endpoint.close(VarInt::from_u32(close_code), CLOSE_UPGRADING_REASON);
                let _ = timeout(CLOSE_SEND_WAIT, endpoint.wait_idle()).await;
                let here = endpoint.local_addr().map(|a| SocketAddr::new(a.ip(), 0));
                match here.and_then(std::net::UdpSocket::bind) {
                    Ok(own) => {
                        if let Err(e) = endpoint.rebind(own) {
                            eprintln!("hotloop serve: moving a QUIC endpoint off the handed-over socket: {e}");
                        }
                    }
                    Err(e) => eprintln!("hotloop serve: a socket for a closing QUIC endpoint: {e}"),
                }
            })
        })
        .collect();
    for close in closes {
        let _ = close.join();
    }
}
