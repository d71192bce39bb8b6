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

use std::cell::Cell;
use std::future::{poll_fn, Future, IntoFuture};
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Poll, Waker};
use std::time::Duration;

use hotloop::quic::AmplificationLimit;
use hotloop::signal::ShutdownSignals;
use hotloop::time::timeout;
use hotloop::tls::rustls;
use hotloop::tls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use hotloop::Runtime;
use quinn::crypto::rustls::QuicServerConfig;
use quinn::{Endpoint, IdleTimeout, Incoming, RecvStream, SendStream, TransportConfig, VarInt};

use crate::serve_args::{millis_or_never, App, RetryPolicy, ServeArgs};
use crate::stats_server::StatsServer;
use crate::{drain, stop};

/// The ALPN protocol id `serve quic` offers.
pub const ALPN: &[u8] = b"hotloop-echo";
/// The ALPN protocol id of HTTP/3.
pub const ALPN_H3: &[u8] = b"h3";

/// The application close code of a `quic` server that stops.
pub const CLOSE_STOPPING: u32 = 0;
/// The same for `h3`: HTTP/3's H3_NO_ERROR.
pub const CLOSE_STOPPING_H3: u32 = 0x100;
/// The reason sent with [`CLOSE_STOPPING`].
const CLOSE_REASON: &[u8] = b"server stopping";
/// The stream reset code when the client reads nothing for --send-timeout-ms.
pub const RESET_SEND_TIMEOUT: u32 = 1;

/// The application close code of a `quic` connection whose handshake
/// completed when every `--maxconn` slot was taken.
pub const CLOSE_FULL: u32 = 2;
/// The same for `h3`: HTTP/3's H3_EXCESSIVE_LOAD.
pub const CLOSE_FULL_H3: u32 = 0x107;
/// The reason sent with [`CLOSE_FULL`].
const CLOSE_FULL_REASON: &[u8] = b"server full";

/// The most bytes taken from a stream per read (it is written back as it
/// is, so a stream's echo holds at most this much of its own).
const CHUNK_BYTES_MAX: usize = 64 * 1024;
/// The connection limit when `--maxconn` is not given: with the default
/// windows (`serve_args.rs`), a connection makes the server hold at most
/// about 2 MiB.
pub const MAXCONN_DEFAULT: usize = 4096;
/// How long an abandoned unvalidated handshake's amplification limit stays
/// after it, while quinn sends the connection's close.
const AMPLIFICATION_LIMIT_LINGER: Duration = Duration::from_secs(1);
/// How often the server looks whether many connections have ended.
const RELEASE_CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// Connections that ended (net) since the last look for which the server
/// gives the allocator's free memory back to the kernel.
const RELEASE_CONNECTIONS_ENDED_MIN: usize = 64;
/// Looks after such a release that release again: quinn frees an ended
/// connection's state only after its draining period (three probe timeouts).
const RELEASE_FOLLOW_UPS: u32 = 2;
/// Connection attempts quinn queues per endpoint before the accept loop
/// takes them; beyond it new ones are dropped unanswered.
const INCOMING_PER_ENDPOINT_MAX: usize = 1024;
/// What quinn buffers for one queued attempt after its first datagram (more
/// Initial datagrams of a large ClientHello).
const INCOMING_BUFFER_BYTES: u64 = 16 * 1024;
/// The same over all queued attempts of one endpoint.
const INCOMING_BUFFERS_TOTAL_BYTES: u64 = 1024 * 1024;
/// After closing the endpoints, how long to let their close packets go out.
const CLOSE_FLUSH_MAX: Duration = Duration::from_millis(250);

/// What the connections speak.
enum Proto {
    /// Every bidirectional stream echoed.
    Echo,
    /// HTTP/3, answering every request with this body.
    H3 { body: bytes::Bytes },
}

/// What every connection of the server shares.
struct Settings {
    proto: Proto,
    work_us: u64,
    send_timeout: Option<Duration>,
    handshake_timeout: Duration,
    retry: RetryPolicy,
    unvalidated_max: usize,
    maxconn: usize,
    /// The close code of a connection that completes with no slot left.
    close_full: u32,
    /// Connections open now (handshaking included), over all workers.
    active: AtomicUsize,
    /// Connections holding a `--maxconn` slot: those whose address is
    /// validated (by a Retry, or by completing the handshake).
    slots: AtomicUsize,
    /// Handshakes in progress from addresses not validated.
    unvalidated: AtomicUsize,
    /// The most connections open at once since the memory releaser last looked.
    peak: AtomicUsize,
    accepted: AtomicU64,
    retries: AtomicU64,
    refused: AtomicU64,
}

impl Settings {
    /// Takes one of `count`'s `max` places, if one is left.
    fn take(count: &AtomicUsize, max: usize) -> bool {
        count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max).then_some(n + 1))
            .is_ok()
    }
}

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

/// A thread that gives the allocator's free memory back to the kernel once
/// many connections have ended (a flood of handshakes, a crowd of clients
/// gone): glibc keeps what they freed for reuse, so the resident size would
/// otherwise stay at its peak. It runs beside the workers, so the release's
/// walk of the heap holds up no connection's loop. Stopped when dropped.
struct MemoryReleaser {
    stop: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MemoryReleaser {
    fn start(settings: Arc<Settings>) -> io::Result<MemoryReleaser> {
        let stop = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let flag = stop.clone();
        let thread =
            std::thread::Builder::new().name("hotloop-release".into()).spawn(move || {
                let mut follow_ups = 0;
                loop {
                    let (lock, wake) = &*flag;
                    let stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
                    let (stopped, _) = wake
                        .wait_timeout_while(stopped, RELEASE_CHECK_INTERVAL, |stopped| !*stopped)
                        .unwrap_or_else(|e| e.into_inner());
                    if *stopped {
                        return;
                    }
                    drop(stopped);
                    let open = settings.active.load(Ordering::SeqCst);
                    let peak = settings.peak.swap(open, Ordering::Relaxed).max(open);
                    if peak - open >= RELEASE_CONNECTIONS_ENDED_MIN {
                        follow_ups = RELEASE_FOLLOW_UPS;
                    } else if follow_ups == 0 {
                        continue;
                    } else {
                        follow_ups -= 1;
                    }
                    hotloop::release_free_memory();
                }
            })?;
        Ok(MemoryReleaser { stop, thread: Some(thread) })
    }
}

impl Drop for MemoryReleaser {
    fn drop(&mut self) {
        let (lock, wake) = &*self.stop;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The certificate chain and key to serve, and a line for the operator
/// saying where they came from.
fn identity(
    args: &ServeArgs,
    addr: SocketAddr,
) -> io::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>, String)> {
    if let Some((certs, key)) = crate::tls::load_identity(args)? {
        let path = args.tls_cert.as_deref().unwrap_or(std::path::Path::new(""));
        return Ok((certs, key, format!("certificate from {}", path.display())));
    }
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    if !addr.ip().is_unspecified() && !names.contains(&addr.ip().to_string()) {
        names.push(addr.ip().to_string());
    }
    let made = rcgen::generate_simple_self_signed(names.clone())
        .map_err(|e| io::Error::other(format!("making a self-signed certificate: {e}")))?;
    let der = CertificateDer::from(made.cert.der().to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.key_pair.serialize_der()));
    let fingerprint = sha256_hex(&der);
    let note = match &args.write_cert {
        Some(path) => {
            std::fs::write(path, made.cert.pem()).map_err(|e| {
                io::Error::new(e.kind(), format!("writing the certificate to {}: {e}", path.display()))
            })?;
            format!(
                "self-signed certificate for {} written to {} (SHA-256 {fingerprint})",
                names.join(", "),
                path.display()
            )
        }
        None => format!(
            "self-signed certificate for {} (SHA-256 {fingerprint}), not saved: pass --write-cert FILE for clients to trust it",
            names.join(", ")
        ),
    };
    Ok((vec![der], key, note))
}

/// The SHA-256 of `data` as colon-separated hex, as `openssl x509 -fingerprint` prints it.
fn sha256_hex(data: &[u8]) -> String {
    let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
    let Some(tls13) = suite.tls13() else { return String::from("unavailable") };
    let digest = tls13.common.hash_provider.hash(data);
    digest.as_ref().iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":")
}

/// quinn's server configuration: TLS 1.3 with `alpn`, the idle timeout,
/// the flow-control windows and bidirectional stream count of [`QuicArgs`]
/// (and no unidirectional streams for echo, which nothing would read), and
/// bounds on the connection attempts quinn queues.
///
/// [`QuicArgs`]: crate::serve_args::QuicArgs
fn server_config(
    args: &ServeArgs,
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    alpn: &[u8],
) -> io::Result<quinn::ServerConfig> {
    let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| invalid(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| match (&args.tls_cert, &args.tls_key) {
            (Some(c), Some(k)) => crate::tls::identity_error(c, k, invalid(e.to_string())),
            _ => invalid(format!("the generated certificate is unusable: {e}")),
        })?;
    tls.alpn_protocols = vec![alpn.to_vec()];
    let crypto = QuicServerConfig::try_from(tls).map_err(|e| invalid(e.to_string()))?;
    let q = &args.quic;
    let mut transport = TransportConfig::default();
    transport.max_concurrent_bidi_streams(VarInt::from_u32(q.quic_max_streams));
    // quinn's defaults are sized for one fast stream (1.25 MB a stream, no
    // bound for the connection, 10 MB to send): a client that opens many
    // streams and reads nothing would make the server hold 1.4 MB each.
    transport.receive_window(VarInt::from_u32(q.quic_receive_window_bytes));
    transport.stream_receive_window(VarInt::from_u32(q.quic_stream_receive_window_bytes));
    transport.send_window(u64::from(q.quic_send_window_bytes));
    // HTTP/3 opens three unidirectional streams (control, QPACK encoder
    // and decoder); echo has no use for any.
    let uni = if alpn == ALPN_H3 { 8 } else { 0 };
    transport.max_concurrent_uni_streams(VarInt::from_u32(uni));
    let idle = match millis_or_never(args.idle_timeout_ms) {
        Some(d) => Some(IdleTimeout::try_from(d).map_err(|_| {
            invalid(format!("--idle-timeout-ms {} is too long", args.idle_timeout_ms))
        })?),
        None => None,
    };
    transport.max_idle_timeout(idle);
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    config.max_incoming(INCOMING_PER_ENDPOINT_MAX);
    config.incoming_buffer_size(INCOMING_BUFFER_BYTES);
    config.incoming_buffer_size_total(INCOMING_BUFFERS_TOTAL_BYTES);
    Ok(config)
}

/// Takes the worker's incoming connections, each to a task of its own,
/// until the runtime ends; sends a Retry or refuses as [`admit`] says.
async fn accept_loop(endpoint: Endpoint, settings: Arc<Settings>) {
    while let Some(incoming) = endpoint.accept().await {
        let admitted = match admit(&incoming, &settings) {
            Admit::Refuse => {
                settings.refused.fetch_add(1, Ordering::Relaxed);
                incoming.refuse();
                continue;
            }
            Admit::Retry => {
                settings.retries.fetch_add(1, Ordering::Relaxed);
                // `admit` sends a Retry only where quinn may.
                if let Err(e) = incoming.retry() {
                    e.into_incoming().refuse();
                }
                continue;
            }
            Admit::Slot => Admitted::Slot(Slot(settings.clone())),
            Admit::Unvalidated => {
                let pending = Unvalidated(settings.clone());
                match hotloop::quic::limit_amplification(&endpoint, incoming.remote_address()) {
                    Ok(limit) => Admitted::Unvalidated(pending, limit),
                    Err(_) => {
                        incoming.ignore();
                        continue;
                    }
                }
            }
        };
        let open = settings.active.fetch_add(1, Ordering::SeqCst) + 1;
        settings.peak.fetch_max(open, Ordering::Relaxed);
        settings.accepted.fetch_add(1, Ordering::Relaxed);
        let guard = Active(settings.clone());
        drop(hotloop::spawn(connection(incoming, admitted, guard)));
    }
}

/// What to do with a connection attempt.
enum Admit {
    Refuse,
    Retry,
    /// Its address is validated and it has taken a `--maxconn` slot.
    Slot,
    /// Its address is not validated; it has taken a place among the
    /// unvalidated handshakes and takes a slot when it completes.
    Unvalidated,
}

/// Decides on a connection attempt (and takes its slot or its place): a
/// stopping or full server refuses; a validated address takes a slot; an
/// unvalidated one is sent a Retry or takes a place as `--quic-retry` and
/// `--quic-unvalidated-max` say. A spoofed address can hold a place, never a
/// slot, so a flood of them cannot take the server's slots from clients.
fn admit(incoming: &Incoming, s: &Settings) -> Admit {
    if drain::stopping() || s.slots.load(Ordering::SeqCst) >= s.maxconn {
        return Admit::Refuse;
    }
    if incoming.remote_address_validated() {
        return match Settings::take(&s.slots, s.maxconn) {
            true => Admit::Slot,
            false => Admit::Refuse,
        };
    }
    if s.retry == RetryPolicy::Always {
        return Admit::Retry;
    }
    if Settings::take(&s.unvalidated, s.unvalidated_max) {
        return Admit::Unvalidated;
    }
    match s.retry {
        RetryPolicy::Never => Admit::Refuse,
        _ => Admit::Retry,
    }
}

/// Counts a connection as open until dropped.
struct Active(Arc<Settings>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A `--maxconn` slot, given back when dropped.
struct Slot(Arc<Settings>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.slots.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A place among the unvalidated handshakes, given back when dropped.
struct Unvalidated(Arc<Settings>);

impl Drop for Unvalidated {
    fn drop(&mut self) {
        self.0.unvalidated.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How a connection was let in.
enum Admitted {
    Slot(Slot),
    /// Handshaking from an unvalidated address, its replies held to the
    /// amplification limit.
    Unvalidated(Unvalidated, AmplificationLimit),
}

/// One connection: handshake within the limit, then the protocol.
async fn connection(incoming: Incoming, admitted: Admitted, active: Active) {
    let settings = active.0.clone();
    let conn = match timeout(settings.handshake_timeout, incoming.into_future()).await {
        Ok(Ok(conn)) => conn,
        // A failed handshake, or one past the limit (dropping it abandons the connection).
        _ => {
            if let Admitted::Unvalidated(place, limit) = admitted {
                drop((place, active));
                // quinn sends its close once the handshake is dropped: that
                // datagram too is held to the amplification limit.
                hotloop::time::sleep(AMPLIFICATION_LIMIT_LINGER).await;
                drop(limit);
            }
            return;
        }
    };
    // A completed handshake has validated the address: its place and its
    // amplification limit are given back, and it needs a slot now.
    let _slot = match admitted {
        Admitted::Slot(slot) => slot,
        Admitted::Unvalidated(place, limit) => {
            drop((place, limit));
            if !Settings::take(&settings.slots, settings.maxconn) {
                conn.close(VarInt::from_u32(settings.close_full), CLOSE_FULL_REASON);
                return;
            }
            Slot(settings.clone())
        }
    };
    match &settings.proto {
        Proto::Echo => echo_connection(conn, &settings).await,
        Proto::H3 { body } => h3_connection(conn, body, &settings).await,
    }
}

/// Waits until the connection's streams are done (`true`) or the client
/// closed it (`false`).
async fn streams_done(streams: &Streams, conn: &quinn::Connection) -> bool {
    let mut closed = pin!(conn.closed());
    let mut done = pin!(streams.all_done());
    poll_fn(|cx| match done.as_mut().poll(cx) {
        Poll::Ready(()) => Poll::Ready(true),
        Poll::Pending => closed.as_mut().poll(cx).map(|_| false),
    })
    .await
}

/// A task per stream; when the server stops, the open streams finish and
/// the connection closes.
async fn echo_connection(conn: quinn::Connection, settings: &Arc<Settings>) {
    let streams = Rc::new(Streams::default());
    loop {
        match drain::until_stop(conn.accept_bi()).await {
            Some(Ok((send, recv))) => {
                let open = Open::new(streams.clone());
                drop(hotloop::spawn(echo_stream(send, recv, open, settings.clone())));
            }
            // Closed by the client, timed out or lost.
            Some(Err(_)) => return,
            None => break,
        }
    }
    // Stopping: the streams in flight are answered, then the connection closes.
    if streams_done(&streams, &conn).await {
        conn.close(VarInt::from_u32(CLOSE_STOPPING), CLOSE_REASON);
    }
    // The endpoint sends the close; `conn` going out of scope does not undo it.
}

/// HTTP/3: a task per request; when the server stops, GOAWAY, then the
/// requests in flight are answered and the connection closes.
async fn h3_connection(conn: quinn::Connection, body: &bytes::Bytes, settings: &Arc<Settings>) {
    let mut h3 = match h3::server::Connection::<_, bytes::Bytes>::new(h3_quinn::Connection::new(
        conn.clone(),
    ))
    .await
    {
        Ok(h3) => h3,
        Err(_) => return,
    };
    let requests = Rc::new(Streams::default());
    loop {
        match drain::until_stop(h3.accept()).await {
            Some(Ok(Some(resolver))) => {
                let open = Open::new(requests.clone());
                drop(hotloop::spawn(h3_request(resolver, body.clone(), settings.work_us, open)));
            }
            // The client sent GOAWAY and its requests are done, or the connection ended.
            Some(Ok(None) | Err(_)) => return,
            None => break,
        }
    }
    // GOAWAY: the requests accepted so far are answered, no more are taken.
    let in_flight = requests.open.get() > 0;
    if timeout(LINGER_MAX, h3.shutdown(0)).await.is_ok() {
        if !streams_done(&requests, &conn).await {
            return;
        }
        // h3 does not say when the client has acknowledged an answer's
        // last bytes (closing now could lose them): a client done with its
        // requests closes by itself, else it has this long.
        if in_flight && timeout(LINGER_MAX, conn.closed()).await.is_ok() {
            return;
        }
    }
    conn.close(VarInt::from_u32(CLOSE_STOPPING_H3), CLOSE_REASON);
}

/// h3 on a stop: how long sending GOAWAY may take, and how long a client
/// that had requests in flight has to close by itself once they are answered.
const LINGER_MAX: Duration = Duration::from_secs(1);

/// One HTTP/3 request: 200 and the body (no body for HEAD).
async fn h3_request<C>(
    resolver: h3::server::RequestResolver<C, bytes::Bytes>,
    body: bytes::Bytes,
    work_us: u64,
    _open: Open,
) where
    C: h3::quic::Connection<bytes::Bytes>,
{
    let Ok((request, mut stream)) = resolver.resolve_request().await else { return };
    hotloop_proto::spin_work(work_us);
    let response = http::Response::builder()
        .status(http::StatusCode::OK)
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(());
    let Ok(response) = response else { return };
    if stream.send_response(response).await.is_err() {
        return;
    }
    if request.method() != http::Method::HEAD
        && !body.is_empty()
        && stream.send_data(body).await.is_err()
    {
        return;
    }
    let _ = stream.finish().await;
}

/// Echoes one stream until the client finishes it, then finishes ours and
/// waits until the client has everything.
async fn echo_stream(mut send: SendStream, mut recv: RecvStream, _open: Open, s: Arc<Settings>) {
    loop {
        match recv.read_chunk(CHUNK_BYTES_MAX, true).await {
            Ok(Some(chunk)) => {
                hotloop_proto::spin_work(s.work_us);
                let write = send.write_chunk(chunk.bytes);
                let written = match s.send_timeout {
                    Some(t) => matches!(timeout(t, write).await, Ok(Ok(()))),
                    None => write.await.is_ok(),
                };
                if !written {
                    let _ = send.reset(VarInt::from_u32(RESET_SEND_TIMEOUT));
                    let _ = recv.stop(VarInt::from_u32(RESET_SEND_TIMEOUT));
                    return;
                }
            }
            Ok(None) => break,
            // Reset by the client, or the connection is gone.
            Err(_) => return,
        }
    }
    if send.finish().is_ok() {
        // Until the client has acknowledged it all: a stop closing the
        // connection now would lose the end of the echo.
        let _ = send.stopped().await;
    }
}

/// A connection's open streams, and the task waiting for them to end.
#[derive(Default)]
struct Streams {
    open: Cell<usize>,
    waiter: Cell<Option<Waker>>,
}

impl Streams {
    /// Completes when no stream is open.
    async fn all_done(&self) {
        poll_fn(|cx| {
            if self.open.get() == 0 {
                return Poll::Ready(());
            }
            self.waiter.set(Some(cx.waker().clone()));
            Poll::Pending
        })
        .await
    }
}

/// One open stream of [`Streams`], counted until dropped.
struct Open(Rc<Streams>);

impl Open {
    fn new(streams: Rc<Streams>) -> Self {
        streams.open.set(streams.open.get() + 1);
        Open(streams)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let left = self.0.open.get() - 1;
        self.0.open.set(left);
        if left == 0 {
            if let Some(w) = self.0.waiter.take() {
                w.wake();
            }
        }
    }
}
