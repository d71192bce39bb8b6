//! Connections to backends, and each worker's pool of idle ones.
//!
//! A worker keeps its own pool (a thread-local, like everything a worker
//! owns): a connection is a hyper client state over a socket on that
//! worker's driver, and only that worker can use it. HTTP/1.1 connections
//! go back to the pool when an answer's body has been read to its end,
//! up to `pool_idle_max` per backend, and are closed once idle for
//! `pool_idle_timeout`; the most recently used is taken first, so the
//! pool's extra connections age out when load falls. An HTTP/2 backend
//! gets as few connections per worker as its streams need: each is shared
//! by the worker's requests up to the backend's limit on concurrent
//! streams (`SETTINGS_MAX_CONCURRENT_STREAMS`, read off its frames by
//! [`super::h2peer`]), counted per connection from the request's send to
//! its answer's end; with every one full (or going away after a `GOAWAY`)
//! another is opened, never a request queued behind the limit, where the
//! header timeout would count the wait against the backend. A connection
//! being opened is shared too: the requests that come meanwhile wait for
//! it rather than each dialing its own. Extra ones close once idle for
//! `pool_idle_timeout`; the first stays.
//!
//! A worker whose pool holds no idle HTTP/1.1 connection to a backend
//! first waits, at most `pool_borrow_ms`, for one of its own busy ones to
//! come back, when some are serving requests ([`await_return`]): under a
//! steady number of concurrent requests an empty pool mostly means an
//! answer whose connection is a moment from its checkin, and taking
//! another worker's idle connection then would only leave that worker
//! short (under HTTP/2 load, borrowing first moved a connection between
//! the workers about every 100 requests). With none of its own busy, it may
//! borrow one from another worker's (`pool_borrow_ms` above 0): each
//! backend keeps an index of how many idle connections each worker holds
//! (one relaxed counter per worker), and the borrower asks the worker
//! with the most. That worker takes one out of its pool and has the
//! connection's task stop: hyper gives the socket back
//! (`without_shutdown`) once its sender is dropped with nothing in flight,
//! with no bytes read ahead, and `TcpStream::into_std` takes it off the
//! worker's driver (on io_uring after its armed receive has completed), so
//! no byte the backend sends later goes anywhere but to the borrower. A
//! connection hyper does not find ready for a request (its last answer
//! said `Connection: close`), a socket the backend has closed meanwhile,
//! or one that holds bytes nobody asked for, is closed, not lent. Every
//! wait for a pooled connection to be ready is bounded ([`READY_WAIT`]). The borrower waits at most
//! `pool_borrow_ms`, then connects as without borrowing; a connection that
//! arrives later, or after the request was dropped (its client gone),
//! joins its pool. TLS and HTTP/2 connections never move.
//! Without borrowing, the backends see about the sum of each worker's
//! peak of concurrent requests as connections (`BENCHMARKS.md` counts
//! them).
//!
//! A connection to a TLS backend is a rustls client stream over the TCP
//! one ([`BackendIo`]); the handshake (SNI, the certificate checked for
//! the backend's server name) is part of the connect and its timeout.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hotloop::hyper::{HotloopExecutor, HotloopTimer, HyperIo};
use hotloop::net::TcpStream;
use hotloop::tls::ClientTlsStream;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::{http1, http2};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::config::{BackendTls, UpstreamProtocol};
use super::h2peer::{self, FrameWatch, Peer};
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
    /// The longest a request waits for an idle connection borrowed from
    /// another worker's pool, or for one of its own worker's to come back
    /// ([`await_return`]); zero: never waits.
    pub pool_borrow: Duration,
    /// How many idle HTTP/1.1 connections each worker's pool holds, once
    /// borrowing started ([`start_lending`]).
    pub idle_on: OnceLock<Box<[AtomicU32]>>,
    /// Its counters.
    pub stats: BackendStats,
}

impl Backend {
    /// True if its connections may move between workers: plain
    /// HTTP/1.1, with borrowing on.
    fn lendable(&self) -> bool {
        self.protocol == UpstreamProtocol::Http1
            && self.tls.is_none()
            && !self.pool_borrow.is_zero()
    }
}

/// A request body on its way to a backend: the client's, or none (a
/// health check, or a replayed request that had none).
#[derive(Debug)]
pub enum UpBody {
    /// The client's body, streamed as it arrives, and how far it got.
    Client(Incoming, Option<Rc<Upload>>),
    /// No body.
    Empty,
}

/// How far a request's body has gone to its backend. The request's wait
/// for the answer's head reads it (its header timeout counts from the
/// body's end; until then each pause of the body is bounded), and so does
/// the answer's end (a connection whose request body is not all sent is
/// not pooled: the backend answered early, and the connection is busy
/// with the rest of the upload for as long as the client takes).
#[derive(Debug)]
pub struct Upload {
    /// The body's end was handed to the connection.
    done: Cell<bool>,
    /// When the last frame was handed over (or the body ended).
    last: Cell<Instant>,
    /// The body's last poll found nothing yet: the client is the slow side.
    waiting_on_client: Cell<bool>,
}

impl Upload {
    /// A body about to be sent.
    pub fn new() -> Rc<Upload> {
        Rc::new(Upload {
            done: Cell::new(false),
            last: Cell::new(hotloop::time::now()),
            waiting_on_client: Cell::new(false),
        })
    }

    /// Whether the body's end was handed to the connection.
    pub fn done(&self) -> bool {
        self.done.get()
    }

    /// When the last frame was handed over (or the body ended).
    pub fn last(&self) -> Instant {
        self.last.get()
    }

    /// Whether the body waits for the client's bytes (rather than for the
    /// connection to take them).
    pub fn waiting_on_client(&self) -> bool {
        self.waiting_on_client.get()
    }

    fn ended(&self) {
        if !self.done.get() {
            self.done.set(true);
            self.last.set(hotloop::time::now());
        }
    }
}

impl Body for UpBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            UpBody::Client(b, None) => Pin::new(b).poll_frame(cx),
            UpBody::Client(b, Some(up)) => {
                let polled = Pin::new(&mut *b).poll_frame(cx);
                up.waiting_on_client.set(polled.is_pending());
                match &polled {
                    Poll::Ready(Some(Ok(frame))) => {
                        up.last.set(hotloop::time::now());
                        // A body of known length ends with its last byte:
                        // hyper asks `is_end_stream` rather than poll again.
                        // Trailers are a body's last frame, and hyper drops
                        // the body after them, never asking again.
                        if frame.is_trailers() || b.is_end_stream() {
                            up.ended();
                        }
                    }
                    Poll::Ready(None) => up.ended(),
                    _ => {}
                }
                polled
            }
            UpBody::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpBody::Client(b, up) => {
                let end = b.is_end_stream();
                if let (true, Some(up)) = (end, up) {
                    up.ended();
                }
                end
            }
            UpBody::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpBody::Client(b, _) => b.size_hint(),
            UpBody::Empty => SizeHint::with_exact(0),
        }
    }
}

/// The sending half of an HTTP/1.1 connection, and how its connection's
/// task is asked to give the socket up for another worker.
pub struct H1 {
    send: http1::SendRequest<UpBody>,
    handover: Rc<Handover>,
    /// Bytes read from the connection so far ([`Watched`]).
    read: Rc<Cell<u64>>,
}

impl H1 {
    /// The bytes read from the connection so far: unchanged across a
    /// request lost on it, no byte of an answer came.
    pub fn bytes_read(&self) -> u64 {
        self.read.get()
    }
}

impl std::ops::Deref for H1 {
    type Target = http1::SendRequest<UpBody>;

    fn deref(&self) -> &Self::Target {
        &self.send
    }
}

impl std::ops::DerefMut for H1 {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.send
    }
}

/// Between an idle connection's pool entry and its connection's task: set
/// `wanted` and drop the sender, and the task leaves the socket here
/// when hyper lets it go.
#[derive(Default)]
struct Handover {
    wanted: Cell<bool>,
    /// The socket, if the connection ended idle with nothing read ahead.
    io: Cell<Option<TcpStream>>,
    /// True once the connection's task ended.
    done: Cell<bool>,
    waiter: Cell<Option<Waker>>,
}

impl Handover {
    /// The connection's task ended, leaving `io` if it was wanted.
    fn finish(&self, io: Option<TcpStream>) {
        self.io.set(io);
        self.done.set(true);
        if let Some(w) = self.waiter.take() {
            w.wake();
        }
    }

    /// The socket, once the connection's task ended (`None`: it closed).
    async fn taken(&self) -> Option<TcpStream> {
        std::future::poll_fn(|cx| {
            if self.done.get() {
                return Poll::Ready(self.io.take());
            }
            self.waiter.set(Some(cx.waker().clone()));
            Poll::Pending
        })
        .await
    }
}

/// The sending half of a connection to a backend.
pub enum Sender {
    /// HTTP/1.1: one request at a time.
    H1(H1),
    /// HTTP/2: shared by the worker's requests, and what its peer said.
    H2(http2::SendRequest<UpBody>, Rc<Peer>),
}

/// A connection lent to one request.
pub struct Lease {
    /// The sender.
    pub sender: Sender,
    /// Whether it served a request before.
    pub reused: bool,
    /// On HTTP/2, the request's stream, counted against the backend's
    /// limit until the answer's body ends (or the exchange gives up).
    pub stream: Option<h2peer::Stream>,
}

/// One of this worker's HTTP/2 connections to a backend.
struct H2Conn {
    send: http2::SendRequest<UpBody>,
    peer: Rc<Peer>,
    /// Whether it served a request before.
    used: bool,
}

/// An HTTP/2 connection being opened: the requests that find every open
/// one full wait for it rather than dial their own.
#[derive(Default)]
struct Opening {
    done: Cell<bool>,
    waiters: RefCell<Vec<Waker>>,
}

impl Opening {
    fn finish(&self) {
        self.done.set(true);
        for w in self.waiters.take() {
            w.wake();
        }
    }

    async fn wait(&self) {
        std::future::poll_fn(|cx| {
            if self.done.get() {
                return Poll::Ready(());
            }
            self.waiters.borrow_mut().push(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}

/// Ends an [`Opening`] however its open ends (done, failed, or the request
/// that opened it dropped): its waiters look at the pool again.
struct OpeningGuard(usize, Option<Rc<Opening>>);

impl Drop for OpeningGuard {
    fn drop(&mut self) {
        let Some(o) = self.1.take() else { return };
        with_pool(self.0, |p| {
            if p.h2_opening.as_ref().is_some_and(|x| Rc::ptr_eq(x, &o)) {
                p.h2_opening = None;
            }
        });
        o.finish();
    }
}

/// An idle HTTP/1.1 connection in a worker's pool.
struct Idle {
    conn: H1,
    since: Instant,
    /// The worker it is counted on in its backend's `idle_on`, if any.
    counted_on: Option<usize>,
}

/// One backend's idle connections on this worker.
#[derive(Default)]
struct BackendPool {
    /// Idle HTTP/1.1 connections, oldest first.
    idle: Vec<Idle>,
    /// The worker's HTTP/2 connections, oldest first.
    h2: Vec<H2Conn>,
    /// The HTTP/2 connection being opened, if any.
    h2_opening: Option<Rc<Opening>>,
    /// Connections open from this worker, idle or busy.
    open: usize,
    /// Requests waiting for one of the busy ones to come back
    /// ([`await_return`]), oldest first; a wait that ended is a dead
    /// reference, skipped.
    waiting: VecDeque<Weak<Returned>>,
}

thread_local! {
    /// This worker's pools, by backend id.
    static POOLS: RefCell<Vec<BackendPool>> = const { RefCell::new(Vec::new()) };
    /// This worker's index in the runtime, once [`start_lending`] told it:
    /// until then it neither lends nor borrows.
    static WORKER: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Starts borrowing between the runtime's `workers` workers: each backend
/// gets its index of idle connections per worker.
pub fn start_lending(backends: &[Backend], workers: usize) {
    for b in backends {
        let _ = b.idle_on.set((0..workers).map(|_| AtomicU32::new(0)).collect());
    }
}

/// Tells this thread it is worker `worker` (called on it, from the task
/// that sweeps its pools).
pub fn note_worker(worker: usize) {
    WORKER.with(|w| w.set(Some(worker)));
}

/// An HTTP/1.1 connection goes into this worker's pool: counted in the
/// backend's gauge and, where borrowing is on, in its index.
fn count_in(b: &Backend) -> Option<usize> {
    b.stats.pool_idle.fetch_add(1, Relaxed);
    let on = WORKER.with(Cell::get)?;
    b.idle_on.get()?.get(on)?.fetch_add(1, Relaxed);
    Some(on)
}

/// An idle connection leaves this worker's pool.
fn count_out(b: &Backend, idle: &Idle) {
    b.stats.pool_idle.fetch_sub(1, Relaxed);
    if let (Some(on), Some(index)) = (idle.counted_on, b.idle_on.get()) {
        index[on].fetch_sub(1, Relaxed);
    }
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
    /// The proxy itself is short of a resource for a socket (descriptors,
    /// buffer memory): not the backend's failure.
    Local(std::io::Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::TimedOut => f.write_str("connect timed out"),
            ConnectError::Failed(e) => write!(f, "connect failed: {e}"),
            ConnectError::Local(e) => write!(f, "no socket for the backend: {e}"),
        }
    }
}

/// This worker's connections to `backend`: how many are open (idle or
/// serving a request; an upgraded one is not counted) and whether one
/// is idle (it may yet turn out to have been closed by the backend when
/// taken).
pub fn held(backend: usize) -> (usize, bool) {
    POOLS.with(|p| {
        p.borrow().get(backend).map_or((0, false), |p| {
            (p.open, !p.idle.is_empty() || p.h2.iter().any(|c| c.peer.has_room()))
        })
    })
}

/// An idle connection to `backend` from this worker's pool, if one is
/// still open; closed and expired ones met on the way are dropped.
pub async fn checkout(backends: &Arc<[Backend]>, backend: usize) -> Option<Lease> {
    let b = &backends[backend];
    if b.protocol == UpstreamProtocol::H2 {
        return checkout_h2(backend).await;
    }
    let now = hotloop::time::now();
    loop {
        let idle = with_pool(backend, |p| p.idle.pop())?;
        count_out(b, &idle);
        let mut conn = idle.conn;
        if conn.is_closed() || now.saturating_duration_since(idle.since) >= b.pool_idle_timeout {
            continue;
        }
        // An answer's end reaches the body before hyper's connection task
        // has marked the connection idle; it is ready within that task's
        // next poll, or closed.
        if ready(&mut conn).await {
            return Some(Lease { sender: Sender::H1(conn), reused: true, stream: None });
        }
    }
}

/// A stream on one of this worker's HTTP/2 connections to `backend` that
/// has room for one, waiting for the one being opened if every open one
/// is full; `None`: connect. Closed connections and those going away
/// leave the pool here (their streams go on).
async fn checkout_h2(backend: usize) -> Option<Lease> {
    loop {
        let found = with_pool(backend, |p| {
            p.h2.retain(|c| !c.send.is_closed() && !c.peer.going_away());
            if let Some(c) = p.h2.iter_mut().find(|c| c.peer.has_room()) {
                let reused = std::mem::replace(&mut c.used, true);
                let stream = Some(c.peer.take_stream());
                let sender = Sender::H2(c.send.clone(), c.peer.clone());
                return Some(Ok(Lease { sender, reused, stream }));
            }
            p.h2_opening.clone().map(Err)
        })?;
        match found {
            Ok(lease) => return Some(lease),
            // Then the pool again: it may have room now, or the open failed.
            Err(opening) => opening.wait().await,
        }
    }
}

/// How long a pooled connection may take to be ready for a request: its
/// connection task's next poll, normally at once. One not ready by then
/// is dropped (closed), and the next one or a new connection is used,
/// rather than the request waiting on it with no limit.
const READY_WAIT: Duration = Duration::from_millis(100);

/// Whether `conn` is ready for a request within [`READY_WAIT`] (false:
/// closed, or not ready in time).
async fn ready(conn: &mut H1) -> bool {
    matches!(hotloop::time::timeout(READY_WAIT, conn.ready()).await, Ok(Ok(())))
}

/// A pooled connection to `backend` for one request: this worker's idle
/// one ([`checkout`]), else one of this worker's busy ones as it comes
/// back ([`await_return`]), else one borrowed from another worker's pool
/// ([`borrow`], boxed: it is the rare way, and its state would otherwise
/// weigh on every request's future); `None`: connect.
pub async fn acquire(backends: &Arc<[Backend]>, backend: usize) -> Option<Lease> {
    if let Some(lease) = checkout(backends, backend).await {
        return Some(lease);
    }
    if let Some(lease) = await_return(backends, backend).await {
        return Some(lease);
    }
    Box::pin(borrow(backends, backend)).await
}

/// When this worker's pool holds no idle connection to `backend` but some
/// of its connections to it are serving requests: waits up to
/// `pool_borrow` for one of them to come back, handed over by [`checkin`]
/// (`None` when none is busy, as many requests wait already as are busy,
/// none came in time, or waiting is off). Under a steady number of
/// concurrent requests the connection of an answer just sent is often a
/// moment from its checkin (its body's end has not yet been polled) when
/// the next request arrives; connecting then would open one more
/// connection than the load needs.
pub async fn await_return(backends: &Arc<[Backend]>, backend: usize) -> Option<Lease> {
    let b = &backends[backend];
    if b.protocol != UpstreamProtocol::Http1 || b.pool_borrow.is_zero() {
        return None;
    }
    let slot = with_pool(backend, |p| {
        p.waiting.retain(|w| w.strong_count() > 0);
        let busy = p.open.saturating_sub(p.idle.len());
        (busy > p.waiting.len()).then(|| {
            let slot = Rc::new(Returned::default());
            p.waiting.push_back(Rc::downgrade(&slot));
            slot
        })
    })?;
    let wait = WaitReturn { slot, backends, backend };
    let mut conn = hotloop::time::timeout(b.pool_borrow, wait).await.ok()??;
    // Handed over at its checkin: ready within its task's next poll, as in
    // `checkout`, or closed.
    if ready(&mut conn).await {
        return Some(Lease { sender: Sender::H1(conn), reused: true, stream: None });
    }
    None
}

/// Where [`checkin`] hands a connection to a request waiting in
/// [`await_return`], or [`borrow`]'s receiving task one borrowed.
#[derive(Default)]
struct Returned {
    conn: Cell<Option<H1>>,
    /// Set when the wait should end empty (the busy connections closed,
    /// or the borrow brought none).
    given_up: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Returned {
    fn wake(&self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

/// The wait of [`await_return`] and [`borrow`]; a connection handed over
/// but not taken before the wait ended (its timeout fired first, or the
/// request was dropped) goes back through [`checkin`].
struct WaitReturn<'a> {
    slot: Rc<Returned>,
    backends: &'a Arc<[Backend]>,
    backend: usize,
}

impl Future for WaitReturn<'_> {
    type Output = Option<H1>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<H1>> {
        if let Some(conn) = self.slot.conn.take() {
            return Poll::Ready(Some(conn));
        }
        if self.slot.given_up.get() {
            return Poll::Ready(None);
        }
        self.slot.waker.set(Some(cx.waker().clone()));
        Poll::Pending
    }
}

impl Drop for WaitReturn<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.slot.conn.take() {
            checkin(self.backends, self.backend, conn);
        }
    }
}

/// An idle connection to `backend` borrowed from another worker's pool,
/// when this worker has none (see the module notes): `None` when borrowing
/// is off for it, no other worker holds one, or none came within
/// `pool_borrow`. Every way out leaves the lent connection somewhere: with
/// the request, or (it came late, or the request was dropped while it
/// waited) in this worker's pool.
pub async fn borrow(backends: &Arc<[Backend]>, backend: usize) -> Option<Lease> {
    let b = &backends[backend];
    if !b.lendable() {
        return None;
    }
    let me = WORKER.with(Cell::get)?;
    let lender = b
        .idle_on
        .get()?
        .iter()
        .enumerate()
        .filter(|&(w, _)| w != me)
        .map(|(w, n)| (w, n.load(Relaxed)))
        .max_by_key(|&(_, n)| n)
        .filter(|&(_, n)| n > 0)?
        .0;
    let from = backends.clone();
    let lent = hotloop::Handle::current().spawn_on(lender, move || lend(from, backend));
    // The connection comes to a task of this worker's rather than to this
    // future, and from there to the request through `slot`: one that
    // arrives after the request stopped waiting (its wait ran out, or its
    // client went away and the request's future was dropped) joins this
    // worker's pool instead of being closed with the join handle.
    let slot = Rc::new(Returned::default());
    let to = Rc::downgrade(&slot);
    let home = backends.clone();
    drop(hotloop::spawn(async move {
        let conn = match lent.await {
            Ok(Some(stream)) => adopt(&home, backend, stream).await,
            _ => None,
        };
        match (to.upgrade(), conn) {
            (Some(waiting), conn) => {
                waiting.given_up.set(conn.is_none());
                waiting.conn.set(conn);
                waiting.wake();
            }
            (None, Some(conn)) => checkin(&home, backend, conn),
            (None, None) => {}
        }
    }));
    // Dropped with a connection handed over but not yet taken, the wait
    // checks it in too.
    let wait = WaitReturn { slot, backends, backend };
    let conn = hotloop::time::timeout(b.pool_borrow, wait).await.ok()??;
    Some(Lease { sender: Sender::H1(conn), reused: true, stream: None })
}

/// On the lending worker: one of its idle connections to `backend`, taken
/// off its driver, or `None` if it has none open (or the one it took
/// turned out closed, or holds bytes nobody asked for).
async fn lend(backends: Arc<[Backend]>, backend: usize) -> Option<std::net::TcpStream> {
    let b = &backends[backend];
    let now = hotloop::time::now();
    let idle = loop {
        let mut idle = with_pool(backend, |p| p.idle.pop())?;
        count_out(b, &idle);
        if idle.conn.is_closed() || now.saturating_duration_since(idle.since) >= b.pool_idle_timeout
        {
            continue;
        }
        // Ready for another request, as `checkout` asks too: hyper's state
        // says whether the last answer let the connection be kept (one
        // that said `Connection: close` is not, whether or not the
        // backend's end has arrived for the peek below to see).
        if ready(&mut idle.conn).await {
            break idle;
        }
    };
    let H1 { send, handover, .. } = idle.conn;
    handover.wanted.set(true);
    // With its sender gone and nothing in flight, hyper's connection ends
    // and its task leaves the socket in `handover`.
    drop(send);
    let stream = handover.taken().await?;
    let stream = stream.into_std().await.ok()?;
    // The backend may have closed it, or sent what nobody asked for, while
    // it was idle (not yet seen by hyper): such a connection is not lent.
    match stream.peek(&mut [0; 1]) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        _ => return None,
    }
    b.stats.lent.fetch_add(1, Relaxed);
    Some(stream)
}

/// On the borrowing worker: hyper's client state over a socket another
/// worker lent, its task on this worker.
async fn adopt(
    backends: &Arc<[Backend]>,
    backend: usize,
    stream: std::net::TcpStream,
) -> Option<H1> {
    let stream = TcpStream::from_std(stream).ok()?;
    let gauge = Some(guard(backends.clone(), backend, true));
    let (io, read) = Watched::counting(BackendIo::Plain(stream));
    let (send, conn) = http1::Builder::new().handshake(HyperIo::new(io)).await.ok()?;
    backends[backend].stats.borrowed.fetch_add(1, Relaxed);
    Some(H1 { send, handover: run_h1(conn, gauge), read })
}

/// Runs an HTTP/1.1 connection's task on this worker until the connection
/// ends; a plain one asked to ([`Handover::wanted`]) leaves its socket in
/// the returned handover.
fn run_h1(conn: http1::Connection<HyperIo<Watched>, UpBody>, gauge: Option<Guard>) -> Rc<Handover> {
    let handover = Rc::new(Handover::default());
    let h = handover.clone();
    drop(hotloop::spawn(async move {
        let _open = gauge;
        let parts = conn.without_shutdown().await;
        let io = match parts {
            Ok(p) if h.wanted.get() && p.read_buf.is_empty() => match p.io.0.io {
                BackendIo::Plain(s) => Some(s),
                BackendIo::Tls(_) => None,
            },
            _ => None,
        };
        h.finish(io);
    }));
    handover
}

/// Puts an HTTP/1.1 connection whose answer was read to its end back in
/// this worker's pool, if it is open and the pool has room.
pub fn checkin(backends: &Arc<[Backend]>, backend: usize, conn: H1) {
    let b = &backends[backend];
    // Stopping: the pools were closed, and no later request may need it.
    if conn.is_closed() || b.pool_idle_max == 0 || crate::drain::stopping() {
        return;
    }
    // A request waiting for it takes it first.
    let (waiter, conn) = with_pool(backend, |p| {
        while let Some(w) = p.waiting.pop_front() {
            if let Some(w) = w.upgrade() {
                w.conn.set(Some(conn));
                return (Some(w), None);
            }
        }
        (None, Some(conn))
    });
    let Some(conn) = conn else {
        // Woken outside the pool's borrow.
        waiter.expect("handed over").wake();
        return;
    };
    let counted_on = count_in(b);
    let gone = with_pool(backend, |p| {
        // Full: the oldest goes, the warm one stays.
        let gone = (p.idle.len() >= b.pool_idle_max).then(|| p.idle.remove(0));
        p.idle.push(Idle { conn, since: hotloop::time::now(), counted_on });
        gone
    });
    if let Some(gone) = gone {
        count_out(b, &gone);
    }
}

/// Closes this worker's idle connections that have waited past their
/// backend's idle timeout.
pub fn expire_idle(backends: &Arc<[Backend]>) {
    let now = hotloop::time::now();
    POOLS.with(|p| {
        for (id, pool) in p.borrow_mut().iter_mut().enumerate() {
            let limit = backends[id].pool_idle_timeout;
            let (keep, gone): (Vec<Idle>, Vec<Idle>) =
                std::mem::take(&mut pool.idle).into_iter().partition(|i| {
                    !i.conn.is_closed() && now.saturating_duration_since(i.since) < limit
                });
            pool.idle = keep;
            for i in &gone {
                count_out(&backends[id], i);
            }
            // HTTP/2: the first open one stays; extra ones go once idle.
            let mut first = true;
            pool.h2.retain(|c| {
                if c.send.is_closed() || c.peer.going_away() {
                    return false;
                }
                let keep = first
                    || c.peer.open_streams() > 0
                    || now.saturating_duration_since(c.peer.idle_since()) < limit;
                first = false;
                keep
            });
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
    // The requests that find every HTTP/2 connection full meanwhile wait
    // for this one ([`checkout_h2`]).
    let _opening = (b.protocol == UpstreamProtocol::H2).then(|| {
        let o = with_pool(backend, |p| {
            p.h2_opening.is_none().then(|| {
                let o = Rc::new(Opening::default());
                p.h2_opening = Some(o.clone());
                o
            })
        });
        OpeningGuard(backend, o)
    });
    let sender = open(b, limit, Some(backends.clone()), backend).await?;
    b.stats.connects.fetch_add(1, Relaxed);
    let stream = match &sender {
        Sender::H2(s, peer) => {
            let conn = H2Conn { send: s.clone(), peer: peer.clone(), used: true };
            with_pool(backend, |p| p.h2.push(conn));
            Some(peer.take_stream())
        }
        Sender::H1(_) => None,
    };
    Ok(Lease { sender, reused: false, stream })
}

/// Closes this worker's idle connections: the pooled HTTP/1.1 ones, and
/// the HTTP/2 ones with no stream open; returns how many. At a stop (the
/// backends need not wait for their idle timeouts to see them go), and
/// when the worker runs out of descriptors (registered with
/// `hotloop::net::on_descriptor_shortage`). Each closes once its
/// connection's task runs, within the worker's next turn.
pub fn close_idle(backends: &Arc<[Backend]>) -> usize {
    POOLS.with(|p| {
        let Ok(mut pools) = p.try_borrow_mut() else { return 0 };
        let mut closed = 0;
        for (id, pool) in pools.iter_mut().enumerate() {
            for i in std::mem::take(&mut pool.idle) {
                count_out(&backends[id], &i);
                closed += 1;
            }
            let before = pool.h2.len();
            pool.h2.retain(|c| c.peer.open_streams() > 0);
            closed += before - pool.h2.len();
        }
        closed
    })
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

/// A backend connection's socket, and what its reads are watched for.
pub struct Watched {
    io: BackendIo,
    watch: Watch,
}

/// What a backend connection's reads are watched for.
enum Watch {
    /// HTTP/1.1: the bytes read ([`H1::bytes_read`]): a request lost on a
    /// reused connection that read nothing more got no byte of an answer,
    /// the mark of a backend that closed the connection as the request
    /// went out.
    Count(Rc<Cell<u64>>),
    /// HTTP/2: the peer's frames, for its stream limit and `GOAWAY`.
    Frames(FrameWatch),
}

impl Watched {
    /// `io`, counting its reads; and the count.
    fn counting(io: BackendIo) -> (Watched, Rc<Cell<u64>>) {
        let read = Rc::new(Cell::new(0));
        (Watched { io, watch: Watch::Count(read.clone()) }, read)
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(res) = &polled {
            let got = &buf.filled()[before..];
            match &mut this.watch {
                Watch::Count(read) => read.set(read.get() + got.len() as u64),
                Watch::Frames(frames) => frames.read(res.is_ok(), got),
            }
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Connects to `b` and, if it speaks TLS, makes the handshake (SNI and
/// the certificate checked for its server name), all by `deadline`.
async fn dial(b: &Backend, limit: Duration, deadline: Instant) -> Result<BackendIo, ConnectError> {
    let stream = match TcpStream::connect_timeout(b.addr, limit).await {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return Err(ConnectError::TimedOut),
        Err(e) if short_of_resources(&e) => return Err(ConnectError::Local(e)),
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

/// Whether a socket could not be made for want of the proxy's own
/// resources: descriptors (`EMFILE`, `ENFILE`) or kernel memory
/// (`ENOBUFS`, `ENOMEM`). Any backend would fail alike, so it is no
/// verdict on this one.
fn short_of_resources(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
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
    let io = dial(b, limit, deadline).await?;
    let open_gauge = backends.map(|bs| guard(bs, backend, true));
    let sender = match b.protocol {
        UpstreamProtocol::Http1 => {
            let (io, read) = Watched::counting(io);
            let (send, conn) = http1::Builder::new()
                .handshake(HyperIo::new(io))
                .await
                .map_err(|e| ConnectError::Failed(std::io::Error::other(e)))?;
            Sender::H1(H1 { send, handover: run_h1(conn, open_gauge), read })
        }
        UpstreamProtocol::H2 => {
            let peer = Peer::new();
            let io =
                HyperIo::new(Watched { io, watch: Watch::Frames(FrameWatch::new(peer.clone())) });
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
            // Its limit on streams comes in its first frame: known before
            // the connection takes more streams than it allows (a peer
            // silent until the deadline is assumed to allow the default).
            let _ = hotloop::time::timeout_at(deadline, peer.settled()).await;
            if sender.is_closed() {
                return Err(ConnectError::Failed(std::io::Error::other(
                    "the HTTP/2 connection closed at its start",
                )));
            }
            Sender::H2(sender, peer)
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
            // More requests waiting than busy connections left: the
            // newest waits end now, empty (they connect).
            let surplus: Vec<Rc<Returned>> = with_pool(self.1, |p| {
                p.open -= 1;
                p.waiting.retain(|w| w.strong_count() > 0);
                let busy = p.open.saturating_sub(p.idle.len());
                let keep = p.waiting.len().min(busy);
                p.waiting.drain(keep..).filter_map(|w| w.upgrade()).collect()
            });
            for w in surplus {
                w.given_up.set(true);
                w.wake();
            }
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
