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
//! Stopping (SIGTERM, SIGINT): new connections are refused; a connection
//! with no stream (request) open closes at once, one with streams once
//! they are done (`h3` first sends GOAWAY, so the client opens no more),
//! each with [`CLOSE_STOPPING`] (`h3`: `H3_NO_ERROR`) and reason
//! "server stopping"; what is still open after `--grace-ms` (or at a second
//! signal) is closed the same way.

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

use hotloop::signal::ShutdownSignals;
use hotloop::time::timeout;
use hotloop::tls::rustls;
use hotloop::tls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use hotloop::Runtime;
use quinn::crypto::rustls::QuicServerConfig;
use quinn::{Endpoint, IdleTimeout, Incoming, RecvStream, SendStream, TransportConfig, VarInt};

use crate::serve::{millis_or_never, App, ServeArgs};
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

/// The most bytes taken from a stream per read (it is written back as it is).
const CHUNK_BYTES_MAX: usize = 64 * 1024;
/// The most streams of each client open at once.
const STREAMS_PER_CONNECTION_MAX: u32 = 1024;
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
    maxconn: Option<usize>,
    /// Connections open now (handshaking included), over all workers.
    active: AtomicUsize,
    accepted: AtomicU64,
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
    let (proto, alpn, close_code) = match args.app {
        App::H3 => {
            let body = bytes::Bytes::from(vec![b'x'; args.body_size]);
            (Proto::H3 { body }, ALPN_H3, CLOSE_STOPPING_H3)
        }
        _ => (Proto::Echo, ALPN, CLOSE_STOPPING),
    };
    let server_config = server_config(args, certs, key, alpn)?;
    let settings = Arc::new(Settings {
        proto,
        work_us: args.work_us,
        send_timeout: millis_or_never(args.send_timeout_ms),
        handshake_timeout: Duration::from_millis(args.handshake_timeout_ms),
        maxconn: args.runtime.maxconn,
        active: AtomicUsize::new(0),
        accepted: AtomicU64::new(0),
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
        "hotloop serve {:?} on {bound} | workers {workers} | driver {} ({}) | busy-poll {} | open-file limit {nofile} | ALPN {}",
        args.app,
        stats.info.driver,
        stats.info.reason,
        stats.info.busy_poll,
        String::from_utf8_lossy(alpn),
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
    let accepted = || settings.accepted.load(Ordering::Relaxed);
    let status = || format!("{} connections open, {} accepted", active(), accepted());
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
    let how = if stopped.forced { "stopped at once" } else { "stopped" };
    eprintln!(
        "hotloop serve: {how} ({} connections cut at the grace limit); {} accepted",
        stopped.cut,
        accepted()
    );
    Ok(())
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
/// and room for [`STREAMS_PER_CONNECTION_MAX`] bidirectional streams (and no
/// unidirectional ones, which nothing here would read).
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
    let mut transport = TransportConfig::default();
    transport.max_concurrent_bidi_streams(VarInt::from_u32(STREAMS_PER_CONNECTION_MAX));
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
    Ok(config)
}

/// Takes the worker's incoming connections, each to a task of its own,
/// until the runtime ends; refuses them once the server is stopping or
/// full.
async fn accept_loop(endpoint: Endpoint, settings: Arc<Settings>) {
    while let Some(incoming) = endpoint.accept().await {
        let full = settings.maxconn.is_some_and(|m| settings.active.load(Ordering::SeqCst) >= m);
        if drain::stopping() || full {
            incoming.refuse();
            continue;
        }
        settings.active.fetch_add(1, Ordering::SeqCst);
        settings.accepted.fetch_add(1, Ordering::Relaxed);
        let guard = Active(settings.clone());
        drop(hotloop::spawn(connection(incoming, guard)));
    }
}

/// Counts a connection as open until dropped.
struct Active(Arc<Settings>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One connection: handshake within the limit, then the protocol.
async fn connection(incoming: Incoming, active: Active) {
    let settings = active.0.clone();
    let conn = match timeout(settings.handshake_timeout, incoming.into_future()).await {
        Ok(Ok(conn)) => conn,
        // A failed handshake, or one past the limit (dropping it abandons the connection).
        _ => return,
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
