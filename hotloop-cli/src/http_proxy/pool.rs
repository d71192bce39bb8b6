//! Connections to backends, and each worker's pool of idle ones.
//!
//! A worker keeps its own pool (a thread-local, like everything a worker
//! owns): a connection is a hyper client state over a socket on that
//! worker's driver, and only that worker can use it. HTTP/1.1 connections
//! go back to the pool when an answer's body has been read to its end,
//! up to `pool_idle_max` per backend, and are closed once idle for
//! `pool_idle_timeout`; the most recently used is taken first, so the
//! pool's extra connections age out when load falls. An HTTP/2 backend
//! gets one connection per worker, shared by every request.
//!
//! A worker does not borrow another worker's idle connection when its own
//! pool is empty: the connection's socket is registered with the other
//! worker's driver and its hyper state is driven by a task there, so a
//! borrowed connection would have to be moved (its descriptor, after the
//! other driver's receive on it has been cancelled and has completed, and
//! its buffered state) or used through the other worker, a cross-thread
//! round trip per request. The backends therefore see about the sum of
//! each worker's peak of concurrent requests as connections
//! (`BENCHMARKS.md` counts them).
//!
//! A connection to a TLS backend is a rustls client stream over the TCP
//! one ([`BackendIo`]); the handshake (SNI, the certificate checked for
//! the backend's server name) is part of the connect and its timeout.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hotloop::hyper::{HotloopExecutor, HotloopTimer, HyperIo};
use hotloop::net::TcpStream;
use hotloop::tls::ClientTlsStream;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::{http1, http2};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::config::{BackendTls, UpstreamProtocol};
use super::stats::BackendStats;

/// One backend, as every worker sees it.
#[derive(Debug)]
pub struct Backend {
    /// Its address.
    pub addr: SocketAddr,
    /// The index of its group.
    pub group: usize,
    /// How the proxy speaks to it.
    pub protocol: UpstreamProtocol,
    /// TLS to it, if its connections are encrypted.
    pub tls: Option<BackendTls>,
    /// Idle connections kept per worker.
    pub pool_idle_max: usize,
    /// An idle connection older than this is closed.
    pub pool_idle_timeout: Duration,
    /// Its counters.
    pub stats: BackendStats,
}

/// A request body on its way to a backend: the client's, or none (a
/// health check, or a replayed request that had none).
#[derive(Debug)]
pub enum UpBody {
    /// The client's body, streamed as it arrives.
    Client(Incoming),
    /// No body.
    Empty,
}

impl Body for UpBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            UpBody::Client(b) => Pin::new(b).poll_frame(cx),
            UpBody::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpBody::Client(b) => b.is_end_stream(),
            UpBody::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpBody::Client(b) => b.size_hint(),
            UpBody::Empty => SizeHint::with_exact(0),
        }
    }
}

/// The sending half of a connection to a backend.
pub enum Sender {
    /// HTTP/1.1: one request at a time.
    H1(http1::SendRequest<UpBody>),
    /// HTTP/2: shared by every request of the worker.
    H2(http2::SendRequest<UpBody>),
}

/// A connection lent to one request.
pub struct Lease {
    /// The sender.
    pub sender: Sender,
    /// The backend's id.
    pub backend: usize,
    /// Whether it served a request before.
    pub reused: bool,
}

/// One backend's idle connections on this worker.
#[derive(Default)]
struct BackendPool {
    /// Idle HTTP/1.1 connections and since when, oldest first.
    idle: Vec<(http1::SendRequest<UpBody>, Instant)>,
    /// The worker's HTTP/2 connection and whether it served a request.
    h2: Option<(http2::SendRequest<UpBody>, bool)>,
    /// Connections open from this worker, idle or busy.
    open: usize,
}

thread_local! {
    /// This worker's pools, by backend id.
    static POOLS: RefCell<Vec<BackendPool>> = const { RefCell::new(Vec::new()) };
}

fn with_pool<R>(backend: usize, f: impl FnOnce(&mut BackendPool) -> R) -> R {
    POOLS.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() <= backend {
            p.resize_with(backend + 1, BackendPool::default);
        }
        f(&mut p[backend])
    })
}

/// Why no connection could be made.
#[derive(Debug)]
pub enum ConnectError {
    /// Not within the connect timeout.
    TimedOut,
    /// Refused, unreachable, or the HTTP/2 handshake failed.
    Failed(std::io::Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::TimedOut => f.write_str("connect timed out"),
            ConnectError::Failed(e) => write!(f, "connect failed: {e}"),
        }
    }
}

/// This worker's connections to `backend`: how many are open (idle or
/// serving a request; an upgraded one is not counted) and whether one
/// is idle (it may yet turn out to have been closed by the backend when
/// taken).
pub fn held(backend: usize) -> (usize, bool) {
    POOLS.with(|p| {
        p.borrow()
            .get(backend)
            .map_or((0, false), |p| (p.open, !p.idle.is_empty() || p.h2.is_some()))
    })
}

/// An idle connection to `backend` from this worker's pool, if one is
/// still open; closed and expired ones met on the way are dropped.
pub async fn checkout(backends: &Arc<[Backend]>, backend: usize) -> Option<Lease> {
    let b = &backends[backend];
    if b.protocol == UpstreamProtocol::H2 {
        let sender = with_pool(backend, |p| match &mut p.h2 {
            Some((s, _)) if s.is_closed() => {
                p.h2 = None;
                None
            }
            Some((s, used)) => {
                let reused = *used;
                *used = true;
                Some((s.clone(), reused))
            }
            None => None,
        })?;
        return Some(Lease { sender: Sender::H2(sender.0), backend, reused: sender.1 });
    }
    let now = hotloop::time::now();
    loop {
        let (mut sender, since) = with_pool(backend, |p| p.idle.pop())?;
        b.stats.pool_idle.fetch_sub(1, Relaxed);
        if sender.is_closed() || now.saturating_duration_since(since) >= b.pool_idle_timeout {
            continue;
        }
        // An answer's end reaches the body before hyper's connection task
        // has marked the connection idle; it is ready within that task's
        // next poll, or closed.
        if sender.ready().await.is_ok() {
            return Some(Lease { sender: Sender::H1(sender), backend, reused: true });
        }
    }
}

/// Puts an HTTP/1.1 connection whose answer was read to its end back in
/// this worker's pool, if it is open and the pool has room.
pub fn checkin(backends: &Arc<[Backend]>, backend: usize, sender: http1::SendRequest<UpBody>) {
    let b = &backends[backend];
    if sender.is_closed() || b.pool_idle_max == 0 {
        return;
    }
    let kept = with_pool(backend, |p| {
        if p.idle.len() >= b.pool_idle_max {
            // Full: the oldest goes, the warm one stays.
            p.idle.remove(0);
            b.stats.pool_idle.fetch_sub(1, Relaxed);
        }
        p.idle.push((sender, hotloop::time::now()));
        true
    });
    if kept {
        b.stats.pool_idle.fetch_add(1, Relaxed);
    }
}

/// Closes this worker's idle connections that have waited past their
/// backend's idle timeout.
pub fn expire_idle(backends: &Arc<[Backend]>) {
    let now = hotloop::time::now();
    POOLS.with(|p| {
        for (id, pool) in p.borrow_mut().iter_mut().enumerate() {
            let limit = backends[id].pool_idle_timeout;
            let before = pool.idle.len();
            pool.idle.retain(|(s, since)| {
                !s.is_closed() && now.saturating_duration_since(*since) < limit
            });
            let gone = before - pool.idle.len();
            backends[id].stats.pool_idle.fetch_sub(gone as i64, Relaxed);
        }
    });
}

/// Opens a new connection to `backend` within its group's connect timeout.
pub async fn connect(
    backends: &Arc<[Backend]>,
    backend: usize,
    limit: Duration,
) -> Result<Lease, ConnectError> {
    let b = &backends[backend];
    let sender = open(b, limit, Some(backends.clone()), backend).await?;
    b.stats.connects.fetch_add(1, Relaxed);
    if let Sender::H2(s) = &sender {
        with_pool(backend, |p| p.h2 = Some((s.clone(), true)));
    }
    Ok(Lease { sender, backend, reused: false })
}

/// A connection to a backend: plain TCP, or TLS over it.
pub enum BackendIo {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS (boxed: the TLS state is large, and most backends are plain).
    Tls(Box<ClientTlsStream>),
}

impl AsyncRead for BackendIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            BackendIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            BackendIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for BackendIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            BackendIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            BackendIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            BackendIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            BackendIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            BackendIo::Plain(s) => s.is_write_vectored(),
            BackendIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            BackendIo::Plain(s) => Pin::new(s).poll_flush(cx),
            BackendIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            BackendIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            BackendIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Connects to `b` and, if it speaks TLS, makes the handshake (SNI and
/// the certificate checked for its server name), all by `deadline`.
async fn dial(b: &Backend, limit: Duration, deadline: Instant) -> Result<BackendIo, ConnectError> {
    let stream = match TcpStream::connect_timeout(b.addr, limit).await {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return Err(ConnectError::TimedOut),
        Err(e) => return Err(ConnectError::Failed(e)),
    };
    // Requests are small writes whose answers are waited for: no Nagle.
    let _ = stream.set_nodelay(true);
    let Some(tls) = &b.tls else { return Ok(BackendIo::Plain(stream)) };
    let handshake = tls.connector.connect(&tls.server_name, stream);
    match hotloop::time::timeout_at(deadline, handshake).await {
        Ok(Ok(s)) => Ok(BackendIo::Tls(Box::new(s))),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::TimedOut => Err(ConnectError::TimedOut),
        Ok(Err(e)) => Err(ConnectError::Failed(std::io::Error::new(
            e.kind(),
            format!("TLS with {} ({}): {e}", b.addr, tls.server_name),
        ))),
        Err(_) => Err(ConnectError::TimedOut),
    }
}

/// Connects to `b` and starts hyper's client state for its protocol; its
/// connection task runs on this worker until the connection ends. With
/// `backends`, the backend's `open` gauge follows the connection.
pub async fn open(
    b: &Backend,
    limit: Duration,
    backends: Option<Arc<[Backend]>>,
    backend: usize,
) -> Result<Sender, ConnectError> {
    let deadline = hotloop::time::now() + limit;
    let io = HyperIo::new(dial(b, limit, deadline).await?);
    let open_gauge = backends.map(|bs| guard(bs, backend, true));
    let sender = match b.protocol {
        UpstreamProtocol::Http1 => {
            let (sender, conn) = http1::Builder::new()
                .handshake(io)
                .await
                .map_err(|e| ConnectError::Failed(std::io::Error::other(e)))?;
            drop(hotloop::spawn(async move {
                let _open = open_gauge;
                let _ = conn.await;
            }));
            Sender::H1(sender)
        }
        UpstreamProtocol::H2 => {
            let handshake = http2::Builder::new(HotloopExecutor).timer(HotloopTimer).handshake(io);
            let (sender, conn) = match hotloop::time::timeout_at(deadline, handshake).await {
                Ok(Ok(pair)) => pair,
                Ok(Err(e)) => return Err(ConnectError::Failed(std::io::Error::other(e))),
                Err(_) => return Err(ConnectError::TimedOut),
            };
            drop(hotloop::spawn(async move {
                let _open = open_gauge;
                let _ = conn.await;
            }));
            Sender::H2(sender)
        }
    };
    Ok(sender)
}

/// The backend's side of an upgrade: its connection and the bytes it sent
/// after its `101`, once hyper has stopped (`None`: it did not upgrade).
pub type UpgradedBackend = hotloop::JoinHandle<Option<(BackendIo, Bytes)>>;

/// Opens a connection to `backend` for one request that asks for an
/// upgrade: never pooled; if the answer is `101`, the connection comes
/// back from hyper through the returned handle.
pub async fn open_upgradable(
    backends: &Arc<[Backend]>,
    backend: usize,
    limit: Duration,
) -> Result<(http1::SendRequest<UpBody>, UpgradedBackend), ConnectError> {
    let b = &backends[backend];
    let io = dial(b, limit, hotloop::time::now() + limit).await?;
    b.stats.connects.fetch_add(1, Relaxed);
    let (sender, conn) = http1::Builder::new()
        .handshake(HyperIo::new(io))
        .await
        .map_err(|e| ConnectError::Failed(std::io::Error::other(e)))?;
    let open_gauge = guard(backends.clone(), backend, false);
    let upgraded = hotloop::spawn(async move {
        let _open = open_gauge;
        let parts = conn.without_shutdown().await.ok()?;
        Some((parts.io.0, parts.read_buf))
    });
    Ok((sender, upgraded))
}

/// Counts a connection in its backend's `open` gauge while it lives, and
/// a poolable one in its worker's count too (the connection's task, which
/// holds the guard, runs on the worker that opened it).
struct Guard(Arc<[Backend]>, usize, bool);

impl Guard {
    fn stats(&self) -> &BackendStats {
        &self.0[self.1].stats
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.stats().open.fetch_sub(1, Relaxed);
        if self.2 {
            with_pool(self.1, |p| p.open -= 1);
        }
    }
}

/// Makes a guard, counting the connection in (in this worker's count too
/// if it may be pooled).
fn guard(backends: Arc<[Backend]>, backend: usize, poolable: bool) -> Guard {
    let g = Guard(backends, backend, poolable);
    g.stats().open.fetch_add(1, Relaxed);
    if poolable {
        with_pool(backend, |p| p.open += 1);
    }
    g
}
