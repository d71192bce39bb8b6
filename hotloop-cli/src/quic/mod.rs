//! `hotloop serve quic` and `hotloop serve h3`: a QUIC echo server and an
//! HTTP/3 server on quinn over hotloop's UDP sockets (`hotloop::quic`);
//! HTTP/3 is the `h3` crate through `h3-quinn`, which need no runtime of
//! their own.
//!
//! Every worker runs its own endpoint on the same UDP port
//! (`SO_REUSEPORT`: the kernel keeps each peer on one worker, and a
//! connection whose client's address changes is steered back to its
//! worker by its connection ID, `hotloop::quic::group_configs`). In `quic`,
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
//! still in its handshake, or with no stream (request) open, closes at
//! once (a client that never finishes its handshake holds no drain until
//! `--handshake-timeout-ms`), one with streams once
//! they are done (`h3` first sends GOAWAY, so the client opens no more),
//! each with [`CLOSE_STOPPING`] (`h3`: `H3_NO_ERROR`) and reason
//! "server stopping"; what is still open after `--drain-timeout-ms` (or at
//! a second signal) is closed the same way.
//!
//! Upgrades (`--upgrade-socket`): the successor receives the UDP sockets
//! (every member of the `SO_REUSEPORT` group), starts its endpoints on them
//! reading nothing yet (so what can fail in starting them fails before this
//! process hands over), and says it is ready; this process then stops
//! reading the sockets for good (`RecvGate::retire`: on io_uring its armed
//! receives are cancelled, and the few datagrams they had queued and
//! nobody had read yet are dropped, as a lost datagram is), closes every
//! connection at once, with the same code and the reason "server
//! upgrading" (the close packets go out while it drains: sending needs no
//! receive), and only then tells the successor to start reading; from then
//! on only the successor reads the sockets, so a new connection's Initial
//! is never refused by this process. Its connections are closed, not
//! finished: they would need this process to go on reading, and both
//! processes reading the same sockets split the datagrams between them
//! (a datagram of one process's connection read by the other is answered
//! with a stateless reset, a new connection's Initial read by the old
//! process is refused). Steering between processes needs an eBPF
//! program (`CAP_BPF`) or forwarding datagrams between the processes (as
//! Envoy's hot restart does). A client sees its connection closed with a
//! reason at once, never a timeout, and reconnects to the successor;
//! datagrams that arrive in between wait in the sockets' buffers. A stop
//! signal that comes while a successor has the sockets and has not said
//! it is ready does the same at once (`Handover::close` runs the
//! hand-over's stops): that successor serves them anyway (its ready finds
//! this process gone or silent), so this one must not read them during its
//! drain. The connections closed this way are counted in `drain_cut`.
//! A successor that received fewer sockets than it has workers runs an
//! endpoint on as many workers as sockets and says so after its banner; it
//! binds no more (new members of the group would take peers from the
//! inherited sockets, and go to later successors too), as a TCP server
//! given fewer listeners binds none.
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
//! connection), then this file (the mode: binding an endpoint per worker, stopping).

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

use hotloop::net::UdpOptions;
use hotloop::quic::RecvGate;
use hotloop::time::timeout;
use hotloop::{Handle, Runtime};
use quinn::{Endpoint, ServerConfig, VarInt};

use config::{identity, server_config, Identity};
use connection::accept_loop;
use release::MemoryReleaser;
use settings::{Proto, Settings, ALPN, ALPN_H3, CLOSE_FULL, CLOSE_FULL_H3, CLOSE_REASON};
use settings::{CLOSE_STOPPING, CLOSE_STOPPING_H3, CLOSE_UPGRADING_REASON, MAXCONN_DEFAULT};

use crate::mode::{Endpoints, Mode, Serving, Start};
use crate::runtime_args::RuntimeArgs;
use crate::serve_args::{millis_or_never, App, ServeArgs};
use crate::stats_server::{Count, Extra, ExtraFields, Kind};
use crate::stop;

/// After closing the endpoints, how long to let their close packets go out.
const CLOSE_FLUSH_MAX: Duration = Duration::from_millis(250);

/// `hotloop serve quic` or `hotloop serve h3`: a [`Mode`] on UDP.
pub struct Quic {
    args: ServeArgs,
    addr: SocketAddr,
    identity: Identity,
    /// Where the certificate came from, said after the banner.
    note: String,
    /// What the start found worth saying, after `note`.
    start_notes: Vec<String>,
    alpn: &'static [u8],
    /// The application close code at a stop or an upgrade.
    close_code: u32,
    server_config: ServerConfig,
    settings: Arc<Settings>,
}

impl Quic {
    /// The server `args` describe: its certificate (made, or read) and
    /// quinn's configuration.
    pub fn new(args: &ServeArgs) -> io::Result<Quic> {
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
            header_timeout: millis_or_never(args.header_timeout_ms),
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
        let args = args.clone();
        Ok(Quic {
            args,
            addr,
            identity,
            note,
            start_notes: Vec::new(),
            alpn,
            close_code,
            server_config,
            settings,
        })
    }
}

impl Mode for Quic {
    const NAME: &'static str = "hotloop serve";
    const ACTIVE_HELP: &'static str = "QUIC connections open now, over all workers.";

    fn runtime_args(&self) -> &RuntimeArgs {
        &self.args.runtime
    }

    /// One endpoint per socket, reading once a predecessor has stopped
    /// reading them (closing its connections: see the module docs).
    fn start(&mut self, at: &Start<'_>) -> io::Result<Serving> {
        let sockets = at.udp_sockets(self.addr, &UdpOptions::quic())?;
        let bound = sockets[0].local_addr()?;
        let gate = at.recv_gate();
        let workers = at.rt.handle().workers();
        if sockets.len() < workers {
            // Binding more would add members to the group the successor
            // shares: the kernel would steer the new sockets' peers
            // afresh, and a later successor would get them too.
            self.start_notes.push(format!(
                "{} UDP sockets received for {workers} workers: QUIC runs on workers 0 to {} only, the others serve no QUIC connection (start the first process with more workers to use them all)",
                sockets.len(),
                sockets.len() - 1,
            ));
        }
        let endpoints = start_endpoints(at.rt, sockets, &self.server_config, &self.settings, gate)
            .map_err(|e| io::Error::new(e.kind(), format!("QUIC endpoint on {bound}: {e}")))?;
        {
            // A successor reads the sockets once this process no longer
            // does: run when it is ready, or at a stop while it starts.
            let (handle, endpoints, code, gate, settings) = (
                at.rt.handle().clone(),
                endpoints.clone(),
                self.close_code,
                gate.clone(),
                self.settings.clone(),
            );
            at.handover.on_hand_over(move || {
                hand_over(&handle, &endpoints, &gate, code, &settings);
            });
        }
        let releaser = Some(MemoryReleaser::start(self.settings.clone())?);
        let settings = self.settings.clone();
        let close_code = self.close_code;
        Ok(Serving::Udp(Box::new(QuicEndpoints {
            bound,
            endpoints,
            settings,
            close_code,
            releaser,
        })))
    }

    fn banner(&self, at: &Start<'_>, on: SocketAddr) -> String {
        let stats = at.rt.stats();
        format!(
            "hotloop serve {:?} on {on} | workers {} | driver {} ({}) | busy-poll {} | open-file limit {} | ALPN {} | maxconn {} | retry {:?}",
            self.args.app,
            at.rt.handle().workers(),
            stats.info.driver,
            stats.info.reason,
            stats.info.busy_poll,
            at.nofile,
            String::from_utf8_lossy(self.alpn),
            self.settings.maxconn,
            self.settings.retry,
        )
    }

    fn notes(&self) -> Vec<String> {
        let mut notes = vec![self.note.clone()];
        notes.extend(self.start_notes.iter().cloned());
        notes
    }

    /// The mode's counters: QUIC connections pass no listener, so the
    /// runtime's `accepted` never counts them.
    fn stats(&self) -> Option<ExtraFields> {
        let s = self.settings.clone();
        Some(Arc::new(move || {
            let counter = |name, help, value: &AtomicU64| Extra {
                name,
                help,
                kind: Kind::Counter,
                value: value.load(Ordering::Relaxed),
            };
            vec![
                counter(
                    "quic_accepted",
                    "QUIC connections accepted (handshakes let in).",
                    &s.accepted,
                ),
                counter("quic_retries", "Retry packets sent to unvalidated addresses.", &s.retries),
                counter("quic_refused", "QUIC connection attempts refused.", &s.refused),
                Extra {
                    name: "quic_unvalidated_handshakes",
                    help: "Handshakes in progress from addresses not validated yet.",
                    kind: Kind::Gauge,
                    value: s.unvalidated.load(Ordering::Relaxed) as u64,
                },
            ]
        }))
    }

    fn accepted(&self) -> Option<Count> {
        let s = self.settings.clone();
        Some(Arc::new(move || s.accepted.load(Ordering::Relaxed)))
    }

    fn status(&self, _: &Runtime, open: usize) -> String {
        let s = &self.settings;
        format!(
            "{open} connections open ({} handshaking from unvalidated addresses), {} accepted, {} Retry sent, {} refused",
            s.unvalidated.load(Ordering::Relaxed),
            s.accepted.load(Ordering::Relaxed),
            s.retries.load(Ordering::Relaxed),
            s.refused.load(Ordering::Relaxed),
        )
    }

    fn reload(&self) -> Option<String> {
        match &self.identity {
            Identity::Files(certs) => Some(stop::reload_certificate(certs)),
            Identity::Generated(..) => None,
        }
    }
}

/// Starts an endpoint on each socket: socket `i` on worker `i % workers`,
/// so a worker may run several endpoints (a predecessor had more workers)
/// or none (it had fewer). Each reads once `gate` opens, and runs until the
/// runtime is dropped. They share a stateless-reset key, and a client whose
/// address changes stays on the endpoint that owns its connection
/// (`hotloop::quic::group_configs`).
fn start_endpoints(
    rt: &Runtime,
    sockets: Vec<std::net::UdpSocket>,
    server_config: &ServerConfig,
    settings: &Arc<Settings>,
    gate: &RecvGate,
) -> io::Result<Vec<(usize, Endpoint)>> {
    let workers = rt.handle().workers();
    // In the group's order: a migrating client's datagrams are steered to
    // the socket, and so the endpoint, that owns its connection.
    let configs = hotloop::quic::group_configs(&sockets)?;
    let mut endpoints = Vec::with_capacity(sockets.len());
    for (i, (socket, endpoint_config)) in sockets.into_iter().zip(configs).enumerate() {
        let worker = i % workers;
        let (tx, rx) = mpsc::channel();
        let (config, settings, gate) = (server_config.clone(), settings.clone(), gate.clone());
        // Detached: the task runs the endpoint until the runtime is dropped.
        drop(rt.handle().spawn_on(worker, move || async move {
            match hotloop::quic::endpoint_on_gated(socket, endpoint_config, Some(config), gate) {
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
            .map_err(|_| io::Error::other("a worker stopped before starting its endpoint"))??;
        endpoints.push((worker, endpoint));
    }
    Ok(endpoints)
}

/// The running endpoints, and the memory releaser beside them.
struct QuicEndpoints {
    bound: SocketAddr,
    endpoints: Vec<(usize, Endpoint)>,
    settings: Arc<Settings>,
    close_code: u32,
    /// Stopped once the endpoints are closed.
    releaser: Option<MemoryReleaser>,
}

impl Endpoints for QuicEndpoints {
    fn local_addr(&self) -> SocketAddr {
        self.bound
    }

    fn active(&self) -> Arc<dyn Fn() -> usize + Send + Sync> {
        let settings = self.settings.clone();
        Arc::new(move || settings.active.load(Ordering::SeqCst))
    }

    fn accepted(&self) -> u64 {
        self.settings.accepted.load(Ordering::Relaxed)
    }

    /// What is left is closed, and the close packets are given a moment to
    /// go out. The accept loops refuse new connections already: `drain`
    /// says stopping.
    fn close(&mut self, rt: &Runtime) {
        let code = self.close_code;
        let closes: Vec<_> = std::mem::take(&mut self.endpoints)
            .into_iter()
            .map(|(worker, endpoint)| {
                rt.handle().spawn_on(worker, move || async move {
                    endpoint.close(VarInt::from_u32(code), CLOSE_REASON);
                    let _ = timeout(CLOSE_FLUSH_MAX, endpoint.wait_idle()).await;
                })
            })
            .collect();
        for close in closes {
            let _ = close.join();
        }
        self.releaser.take();
    }
}

/// A successor serves the UDP sockets (it said it is ready, or it has
/// them and this process stops meanwhile): every endpoint stops reading
/// them for good (`gate` retired, on each endpoint's worker, so io_uring's
/// armed receives are cancelled before this returns), then closes its
/// connections (code `close_code`, reason "server upgrading"), counted in
/// `drain_cut`; their close packets go out during the drain, since sending
/// needs no receive. Returns once done on every worker, and nothing here
/// takes a datagram from the sockets after that.
fn hand_over(
    handle: &Handle,
    endpoints: &[(usize, Endpoint)],
    gate: &RecvGate,
    close_code: u32,
    settings: &Settings,
) {
    // Cut as a drain's deadline cuts: each is closed with a reason, not
    // finished (counted first: the closed ones end while this waits).
    let cut = settings.active.load(Ordering::SeqCst);
    let closes: Vec<_> = endpoints
        .iter()
        .map(|(worker, endpoint)| {
            let (endpoint, gate) = (endpoint.clone(), gate.clone());
            handle.spawn_on(*worker, move || async move {
                // First: a closed endpoint refuses every new connection whose
                // Initial it reads, and those are the successor's now.
                gate.retire();
                endpoint.close(VarInt::from_u32(close_code), CLOSE_UPGRADING_REASON);
            })
        })
        .collect();
    for close in closes {
        let _ = close.join();
    }
    hotloop::stats::record_cut(
        <Quic as Mode>::NAME,
        cut,
        "by the hand-over (QUIC connections are closed for the successor)",
    );
}
