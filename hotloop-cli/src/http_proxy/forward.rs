//! One request's trip: route it, pick a backend, send it on a pooled or new
//! connection, retry where that is safe, and stream the answer back.
//!
//! # Implementation notes
//!
//! - Bodies stream both ways frame by frame: hyper polls a body only when
//!   the other side can take more, so a client that reads slowly stops
//!   the proxy reading from the backend (and the reverse for uploads); the
//!   proxy never holds more than a frame of either.
//! - Backends take turns per worker (round robin over those up), with
//!   one exception: when the turn falls on a backend whose connections
//!   from this worker are all busy, and the worker holds an idle one to
//!   another backend of the group, the request goes there rather than
//!   open a connection. A backend whose connections are all busy is the
//!   slower one for now, so the exception leans towards the less loaded
//!   backend.
//! - A request is retried on another backend (up to the group's
//!   `retries`) when nothing of it reached a backend: the connect failed
//!   or timed out, or hyper handed the request back unsent (any method).
//!   An idempotent request without a body is also retried when its
//!   connection was lost before the answer's head: it can be sent again
//!   as it was. A pooled connection the backend had just closed costs one
//!   extra try on a new connection to the same backend, not a retry and
//!   not a failure: whether hyper found it closed before writing the
//!   request, or the backend's end (or reset) came after the request went
//!   out and before any byte of an answer (a keep-alive timeout racing
//!   the request; then only a request that can be sent again as it was).
//!   A stream an HTTP/2 backend refused unprocessed (`REFUSED_STREAM`, or
//!   above a `GOAWAY`'s last stream) costs one try on a new connection
//!   too, for any request without a body whatever its method (RFC 9113
//!   section 8.7), and is no failure either.
//! - A connect that found the proxy itself short of sockets (`EMFILE`,
//!   `ENFILE`, `ENOBUFS`, `ENOMEM`) is no backend's failure: `503` with
//!   `Retry-After: 1`, and no other backend is tried (it would fail alike).
//! - `Upgrade: h2c` is never tunnelled: `h2c` is taken out of the field,
//!   and a request that asked for nothing else goes as an ordinary one
//!   (an HTTP/2 connection to the backend would bypass the routes). A
//!   `101` to a request that asked for no upgrade is a `502`, its
//!   connection closed.
//! - The connection goes back to the worker's pool when the answer's body
//!   has been read to its end, its trailers included (or had none); an
//!   answer cut short, or framed both by chunks and by a length, closes it.
//! - A 5xx answer is the backend's answer, not its failure, unless the
//!   group says `fail_on_5xx`: any client can provoke one.
//! - The service's future is moved into place for every request (into
//!   the HTTP/2 stream's task, into hyper's HTTP/1.1 in-flight slot), so
//!   it is kept small: the request is taken apart before anything waits
//!   ([`handle`] is a plain function), the one future that waits answers
//!   with `Ok` itself, the exchange's state is used in place, the send is
//!   written out in it rather than in an `async fn` whose arguments would
//!   stay beside the wait, and the rare ways (a borrowed connection, a new
//!   one, a tunnel) are boxed. 1,784 bytes, where an `async fn` wrapping
//!   another came to 7,072.
//! - A request without a host (HTTP/1.0 without `Host`, HTTP/2 without
//!   `:authority` or `host`) reaches an HTTP/1.1 backend with the
//!   backend's address as its `Host`, as the health checks send it:
//!   HTTP/1.1 requires one, and hyper's client adds none.
//! - The proxy's own answers: 404 (no route), 400 (an HTTP/1.1 request
//!   without `Host`), 502 (no backend answered, or one switched protocols
//!   unasked), 503 with `Retry-After` (every backend of the group is down
//!   or ejected, or no socket for one), 504 (a connect or a
//!   response head not within its timeout), each with a one-line
//!   plain-text body that says which group and why.

use std::cell::RefCell;
use std::convert::Infallible;
use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hotloop::hyper::{OnUpgrade, Upgraded};
use hotloop::time::Sleep;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::http::uri::{Authority, PathAndQuery, Scheme};
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use smallvec::SmallVec;

use super::config::{GroupConfig, UpstreamProtocol};
use super::h2peer;
use super::headers::{self, Forwarding};
use super::health::Health;
use super::pool::{self, Backend, ConnectError, Sender, UpBody, Upload};
use super::routes::Routes;
use super::stats::ProxyStats;

/// What every request of one proxy shares.
pub struct Shared {
    /// The groups, as configured.
    pub groups: Vec<GroupConfig>,
    /// The backend ids of each group.
    pub members: Vec<Range<usize>>,
    /// The routes.
    pub routes: Routes,
    /// Every backend, by id.
    pub backends: Arc<[Backend]>,
    /// Their health.
    pub health: Arc<Health>,
    /// The proxy's counters.
    pub stats: ProxyStats,
    /// Whether clients come over TLS (`Forwarded: proto=https`).
    pub tls: bool,
}

thread_local! {
    /// Each worker's round-robin position in each group.
    static NEXT: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// A request's backends in the order to try them: inline for a group of up
/// to 8, so a request allocates nothing for it.
type Order = SmallVec<[usize; 8]>;

/// The group's backends that take requests now, starting with the next in
/// this worker's turn.
fn candidates(shared: &Shared, group: usize) -> Order {
    let range = shared.members[group].clone();
    let n = range.len();
    let start = NEXT.with(|next| {
        let mut next = next.borrow_mut();
        if next.len() <= group {
            next.resize(group + 1, 0);
        }
        let s = next[group];
        next[group] = s.wrapping_add(1);
        s
    });
    (0..n).map(|i| range.start + (start + i) % n).filter(|&id| shared.health.usable(id)).collect()
}

/// Moves to the front of `order` the first backend this worker holds an
/// idle connection to, when the first (the one whose turn it is) has
/// connections from this worker and every one of them is busy. Without
/// it a worker opened a new connection to a busy backend while it held
/// idle ones to another backend of the group, and each connection opened
/// for a moment's peak stayed pooled: the pools grew to the sum of each
/// backend's peak instead of the worker's. A backend this worker has no
/// connection to keeps its turn, so every backend gets requests however
/// light the load.
fn prefer_pooled(order: &mut [usize]) {
    match order.first().map(|&id| pool::held(id)) {
        Some((open, false)) if open > 0 => {}
        _ => return,
    }
    if let Some(i) = order.iter().position(|&id| pool::held(id).1) {
        order[..=i].rotate_right(1);
    }
}

/// The host a request names: its URI's authority (HTTP/2, or an absolute
/// target), else its `Host` field. Both hold shared bytes, so keeping it
/// past the request's parts copies nothing.
enum Host {
    Authority(Authority),
    Field(HeaderValue),
}

impl Host {
    fn of(req: &Request<Incoming>) -> Option<Host> {
        if let Some(a) = req.uri().authority() {
            return Some(Host::Authority(a.clone()));
        }
        let v = req.headers().get(header::HOST)?;
        v.to_str().is_ok().then(|| Host::Field(v.clone()))
    }

    fn as_str(&self) -> &str {
        match self {
            Host::Authority(a) => a.as_str(),
            // Checked to be text when made.
            Host::Field(v) => v.to_str().unwrap_or_default(),
        }
    }
}

/// The service: one request in, one answer out (never an error: the
/// proxy's failures are answers).
///
/// Not an `async fn`: hyper moves the service's future into place for
/// every request (into the HTTP/2 stream's task, through the executor),
/// so its size is paid in copies per request. The request is taken apart
/// here, before any wait, and only what the exchange needs goes into the
/// one future that waits ([`exchange`]), which answers with `Ok` itself
/// (an `async fn` that awaited another to wrap its answer would hold the
/// inner future twice).
pub fn handle(
    shared: Arc<Shared>,
    client: Rc<Forwarding>,
    req: Request<Incoming>,
) -> impl Future<Output = Result<Response<DownBody>, Infallible>> {
    shared.stats.requests.fetch_add(1, Relaxed);
    let next = prepare(&shared, &client, req);
    exchange(shared, client, next)
}

/// What a request turns into before anything waits.
// The large variant is the common one: boxing it would cost every request
// an allocation to spare the rare answers some bytes.
#[allow(clippy::large_enum_variant)]
enum Next {
    /// The proxy's own answer (no route, a bad request).
    Answer(Response<DownBody>),
    /// An upgrade, tunnelled on a connection of its own.
    Tunnel(Box<TunnelRequest>),
    /// A request for a backend of the group.
    Forward(Outgoing),
}

/// An upgrade request and what its tunnel needs.
struct TunnelRequest {
    group: usize,
    host: Option<Host>,
    req: Request<Incoming>,
    on: OnUpgrade,
}

/// A request rewritten for the group's backends.
struct Outgoing {
    group: usize,
    /// The request; taken while it is being sent, handed back when hyper
    /// gives it back unsent.
    req: Option<Request<UpBody>>,
    /// A copy of the request to send again (one without a body): if its
    /// HTTP/2 stream was refused unprocessed, or, idempotent, if its
    /// connection is lost after sending.
    replay: Option<(Method, Uri, HeaderMap)>,
    /// How far the request's body got, if it has one.
    upload: Option<Rc<Upload>>,
    /// The request names no host: each try gets its backend's address as
    /// `Host` (HTTP/1.1 backends).
    host_from_backend: bool,
}

/// Routes a request and rewrites it for its backends (or answers it).
fn prepare(shared: &Shared, client: &Forwarding, mut req: Request<Incoming>) -> Next {
    let version = req.version();
    let host = Host::of(&req);
    if host.is_none() && version == Version::HTTP_11 {
        return Next::Answer(fixed(
            StatusCode::BAD_REQUEST,
            "an HTTP/1.1 request needs a Host header\n".into(),
        ));
    }
    if req.headers().get_all(header::HOST).iter().nth(1).is_some() {
        // RFC 9112 section 3.2: which host was meant is ambiguous.
        return Next::Answer(fixed(StatusCode::BAD_REQUEST, "more than one Host header\n".into()));
    }
    if req.method() == Method::CONNECT {
        return Next::Answer(fixed(
            StatusCode::METHOD_NOT_ALLOWED,
            "CONNECT is not proxied\n".into(),
        ));
    }
    let host_str = host.as_ref().map(Host::as_str);
    let Some(group) = shared.routes.pick(host_str, req.uri().path()) else {
        shared.stats.no_route.fetch_add(1, Relaxed);
        return Next::Answer(fixed(
            StatusCode::NOT_FOUND,
            "no route for this host and path\n".into(),
        ));
    };
    let g = &shared.groups[group];
    strip_h2c(req.headers_mut());
    if let Some(&on) = req.extensions().get::<OnUpgrade>() {
        if wants_upgrade(req.headers()) {
            // Boxed: the rare path's state lives apart from the common one.
            return Next::Tunnel(Box::new(TunnelRequest { group, host, req, on }));
        }
    }
    let (mut parts, body) = req.into_parts();
    headers::remove_hop_by_hop(&mut parts.headers, true, false);
    // hyper answers `Expect: 100-continue` itself when the body is first read.
    parts.headers.remove(header::EXPECT);
    headers::add_forwarding(&mut parts.headers, version, client, host_str);
    let path =
        parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
    match g.protocol {
        UpstreamProtocol::Http1 => {
            parts.uri = Uri::from(path);
            parts.version = Version::HTTP_11;
            set_host(&mut parts.headers, client, host.as_ref());
            headers::join_cookies(&mut parts.headers);
            chunk_unsized(&mut parts.headers, &body);
        }
        UpstreamProtocol::H2 => {
            let authority = host_str.and_then(|h| h.parse::<Authority>().ok());
            // `:scheme` says how the proxy reached the backend (RFC 9113
            // section 8.3.1); a group's backends are alike in practice.
            let first = &shared.backends[shared.members[group].start];
            let scheme = if first.tls.is_some() { Scheme::HTTPS } else { Scheme::HTTP };
            let mut uri = Uri::builder().scheme(scheme).path_and_query(path);
            if let Some(a) = authority {
                uri = uri.authority(a);
            } else {
                uri = uri.authority(first.addr.to_string());
            }
            if let Ok(u) = uri.build() {
                parts.uri = u;
            }
            parts.version = Version::HTTP_2;
            parts.headers.remove(header::HOST);
        }
    }
    // Kept even without retries: a pooled connection the backend closed
    // as the request went out costs a try on a new one, not a retry; and
    // a stream an HTTP/2 backend refused is sent again whatever its method.
    let replay = body
        .is_end_stream()
        .then(|| (parts.method.clone(), parts.uri.clone(), parts.headers.clone()));
    let host_from_backend =
        g.protocol == UpstreamProtocol::Http1 && !parts.headers.contains_key(header::HOST);
    let upload = (!body.is_end_stream()).then(Upload::new);
    let req = Some(Request::from_parts(parts, UpBody::Client(body, upload.clone())));
    Next::Forward(Outgoing { group, req, replay, upload, host_from_backend })
}

/// A request's exchange with its backends: a connection, the request sent,
/// retries where they are safe, and the answer's head (its body streams
/// after, through [`DownBody`]).
async fn exchange(
    shared: Arc<Shared>,
    client: Rc<Forwarding>,
    mut next: Next,
) -> Result<Response<DownBody>, Infallible> {
    // Used in place: a moved copy would be a second one in the future.
    let out = match &mut next {
        Next::Forward(out) => out,
        _ => {
            return Ok(match next {
                Next::Answer(r) => r,
                Next::Tunnel(t) => {
                    let TunnelRequest { group, host, req, on } = *t;
                    Box::pin(tunnel(&shared, &client, group, host.as_ref(), req, on)).await
                }
                Next::Forward(_) => unreachable!("matched above"),
            })
        }
    };
    let shared = &shared;
    let g = &shared.groups[out.group];
    let group = out.group;
    let mut order = candidates(shared, group);
    prefer_pooled(&mut order);
    if order.is_empty() {
        return Ok(unavailable(shared, group));
    }
    let mut order = order.into_iter();
    let mut id = order.next().expect("not empty");
    let mut moves = 0;
    let mut fresh_only = false;
    let mut stale_tried = false;
    let mut refused_tried = false;
    let failure: Failure = loop {
        let b = &shared.backends[id];
        // A connection: this worker's idle one, else one of this worker's
        // busy ones as it comes back, else one borrowed from another
        // worker's pool, else a new one.
        let pooled = if fresh_only { None } else { pool::acquire(&shared.backends, id).await };
        fresh_only = false;
        let lease = match pooled {
            Some(lease) => lease,
            None => match Box::pin(pool::connect(&shared.backends, id, g.connect_timeout)).await {
                Ok(lease) => lease,
                // Nothing was sent: any request may move on.
                Err(e) => match after_connect_failure(shared, g, id, e, &mut order, &mut moves) {
                    Ok(next) => {
                        id = next;
                        continue;
                    }
                    Err(f) => break f,
                },
            },
        };
        b.stats.requests.fetch_add(1, Relaxed);
        if lease.reused {
            b.stats.reused.fetch_add(1, Relaxed);
        }
        let started = Instant::now();
        let reused = lease.reused;
        // HTTP/2: the stream counted against the backend's limit, until
        // the answer's body ends (or this try gives up).
        let stream = lease.stream;
        let req = out.req.take().expect("handed back after every try");
        // (Moved through a function, not changed in place: a local
        // borrowed here would be kept in this future across the wait.)
        let req = if out.host_from_backend { with_host(req, b) } else { req };
        // hyper queues the request on the connection as it is handed over;
        // the wait is for the answer's head. (Written out here rather than
        // in an `async fn`, whose arguments would stay in this future
        // beside the wait.)
        let upload = out.upload.as_deref();
        // `read_before`: what the connection had read before this request;
        // the same after a loss means no byte of an answer came.
        let (sent, h1, read_before) = match lease.sender {
            Sender::H1(mut s) => {
                let read_before = s.bytes_read();
                let head = s.try_send_request(req);
                (HeadWait::new(head, upload, g).await, Some(s), read_before)
            }
            Sender::H2(mut s, _) => {
                let head = s.try_send_request(req);
                (HeadWait::new(head, upload, g).await, None, 0)
            }
        };
        match sent_outcome(sent) {
            Ok(response) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
                // A switch nobody asked for (the request had no `Upgrade`,
                // or its `h2c` was taken out): the backend's connection now
                // speaks something else, so it is not kept, and a 101
                // passed on would end the client's connection.
                drop(h1);
                note_failure(shared, id);
                break Failure::Lost("the backend switched protocols unasked".into());
            }
            Ok(response) => {
                let upload = out.upload.take();
                return Ok(answer(shared, g, id, response, h1, stream, upload, started));
            }
            Err(SendError::NotSent(back)) => {
                // The connection closed before the request was written.
                out.req = Some(*back);
                if reused && !stale_tried {
                    stale_tried = true;
                    fresh_only = true;
                    shared.stats.retries.fetch_add(1, Relaxed);
                    continue;
                }
                note_failure(shared, id);
                match next_backend(shared, g, &mut order, &mut moves) {
                    Some(next) => id = next,
                    None => {
                        break Failure::Lost(
                            "the connection closed before the request was sent".into(),
                        )
                    }
                }
            }
            Err(SendError::Lost(e)) if e.is_user() => {
                // The client's body failed (a bad chunk size, a reset): the
                // backend is not to blame, and the request cannot be sent again.
                break Failure::ClientBody(e.to_string());
            }
            Err(SendError::Lost(e)) => {
                let again = out.replay.as_ref().map(|(m, u, h)| {
                    let mut r = Request::new(UpBody::Empty);
                    *r.method_mut() = m.clone();
                    *r.uri_mut() = u.clone();
                    *r.headers_mut() = h.clone();
                    *r.version_mut() = if g.protocol == UpstreamProtocol::H2 {
                        Version::HTTP_2
                    } else {
                        Version::HTTP_11
                    };
                    r
                });
                // An HTTP/2 stream the backend refused (`REFUSED_STREAM`,
                // or above the last one a `GOAWAY` let through) was not
                // processed (RFC 9113 section 8.7): sent again as it was,
                // whatever its method, once, on a new connection, and not
                // the backend's failure (a `GOAWAY`'s connection has left
                // the pool).
                if !refused_tried && unprocessed(&e) {
                    if let Some(again) = again {
                        out.req = Some(again);
                        refused_tried = true;
                        fresh_only = true;
                        shared.stats.retries.fetch_add(1, Relaxed);
                        continue;
                    }
                }
                let again = again.filter(|r| idempotent(r.method()));
                // A pooled connection the backend closed as the request
                // went out (its keep-alive timeout): nothing of an answer
                // came, so one more try on a new connection, as when
                // hyper finds it closed first (nginx retries a cached
                // connection's failure once too, and does not count it).
                let unanswered = h1.as_ref().is_some_and(|s| s.bytes_read() == read_before);
                if reused && !stale_tried && unanswered && closed_by_backend(&e) {
                    if let Some(again) = again {
                        out.req = Some(again);
                        stale_tried = true;
                        fresh_only = true;
                        shared.stats.retries.fetch_add(1, Relaxed);
                        continue;
                    }
                }
                note_failure(shared, id);
                let Some(again) = again else { break Failure::Lost(e.to_string()) };
                match next_backend(shared, g, &mut order, &mut moves) {
                    Some(next) => {
                        out.req = Some(again);
                        id = next;
                    }
                    None => break Failure::Lost(e.to_string()),
                }
            }
            Err(SendError::TimedOut(Stall::Header)) => {
                note_failure(shared, id);
                break Failure::HeaderTimeout;
            }
            Err(SendError::TimedOut(Stall::BackendUpload)) => {
                note_failure(shared, id);
                break Failure::UploadStalled;
            }
            Err(SendError::TimedOut(Stall::ClientUpload)) => break Failure::ClientUploadStalled,
        }
    };
    Ok(failure_answer(shared, g, failure))
}

/// Whether an HTTP/2 backend refused the request's stream unprocessed:
/// `REFUSED_STREAM`, or a `GOAWAY` whose last stream came before it (h2
/// gives a remote `GOAWAY`'s error only to those streams, and to those
/// sent after it; the ones it let through that the connection's end cut
/// get an I/O error).
fn unprocessed(e: &hyper::Error) -> bool {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(h2) = c.downcast_ref::<h2::Error>() {
            return h2.is_remote()
                && (h2.is_go_away() || h2.reason() == Some(h2::Reason::REFUSED_STREAM));
        }
        cause = c.source();
    }
    false
}

/// Whether a request's connection was lost the way a backend's close
/// loses it: its end of stream, or a reset (not a malformed answer).
fn closed_by_backend(e: &hyper::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
    if e.is_incomplete_message() {
        return true;
    }
    let io = std::error::Error::source(e).and_then(|c| c.downcast_ref::<std::io::Error>());
    io.is_some_and(|io| matches!(io.kind(), ConnectionReset | BrokenPipe | ConnectionAborted))
}

/// `req`, which names no host, with the backend's address as `Host`, as
/// the health checks send it.
fn with_host(mut req: Request<UpBody>, b: &Backend) -> Request<UpBody> {
    // An address's text is always a valid field value.
    if let Ok(v) = HeaderValue::from_str(&b.addr.to_string()) {
        req.headers_mut().insert(header::HOST, v);
    }
    req
}

/// Marks a request body of no known length as chunked for an HTTP/1.1
/// backend. The hop-by-hop removal took the client's `Transfer-Encoding`,
/// and hyper's client frames a `GET`, `HEAD` or `CONNECT` whose body has
/// no length as bodiless and never reads the body: the backend would get
/// the request without it, and the body, never read to its end, would
/// keep the connection from the pool. With the field set, hyper sends the
/// body chunked. A body of known length keeps its `Content-Length`.
fn chunk_unsized(headers: &mut HeaderMap, body: &Incoming) {
    if !body.is_end_stream() && body.size_hint().exact().is_none() {
        headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    }
}

/// The `Host` a backend gets over HTTP/1.1: the request's authority where
/// it has one (an absolute target, an HTTP/2 `:authority`), replacing a
/// `Host` field that may name another host (RFC 9112 section 3.2.2: the
/// route was picked by the authority, and a backend serving several hosts
/// must see the same one); else the client's `Host`, as it came.
fn set_host(headers: &mut HeaderMap, client: &Forwarding, host: Option<&Host>) {
    let authority = match host {
        Some(Host::Authority(a)) => a.as_str(),
        Some(Host::Field(_)) => return,
        None => return,
    };
    if let Some(v) = client.host_field(authority) {
        headers.insert(header::HOST, v);
    }
}

/// `503` for a group none of whose backends takes requests now, with the
/// seconds until one may (`Retry-After`).
fn unavailable(shared: &Shared, group: usize) -> Response<DownBody> {
    let g = &shared.groups[group];
    shared.stats.unavailable.fetch_add(1, Relaxed);
    let ids = shared.members[group].clone();
    // A backend the checks hold down comes back after `rise` passes in a
    // row, one per interval.
    let check = g.health.as_ref().map(|h| h.interval.saturating_mul(h.rise.max(1)));
    let after = shared.health.retry_after_secs(ids, check);
    let mut r = fixed(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("no backend of group {} is up; retry after {after} s\n", g.name),
    );
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(after));
    r
}

/// Why the wait for an answer's head gave up.
enum Stall {
    /// No head within the header timeout after the request was all sent.
    Header,
    /// The request's body stopped going out for the body timeout, the
    /// backend not taking it.
    BackendUpload,
    /// The request's body stopped for the body timeout, the client not
    /// sending it.
    ClientUpload,
}

pin_project_lite::pin_project! {
    /// The wait for an answer's head. The header timeout counts from the
    /// end of the request's body, not from its start: a client uploading
    /// slowly is not the backend's fault (nginx's `proxy_read_timeout`
    /// starts once the request is sent). While the body is going out, each
    /// pause of it is bounded by the body timeout instead (nginx's
    /// `proxy_send_timeout`, an inactivity timer), and blamed on the side
    /// that paused.
    struct HeadWait<'a, F> {
        #[pin]
        wait: hotloop::time::Timeout<F>,
        upload: Option<&'a Upload>,
        g: &'a GroupConfig,
    }
}

impl<'a, F: Future> HeadWait<'a, F> {
    fn new(head: F, upload: Option<&'a Upload>, g: &'a GroupConfig) -> Self {
        let first = match upload {
            None => g.header_timeout,
            Some(_) => g.header_timeout.min(g.body_timeout),
        };
        HeadWait { wait: hotloop::time::timeout(first, head), upload, g }
    }
}

impl<F: Future> Future for HeadWait<'_, F> {
    type Output = Result<F::Output, Stall>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.wait.as_mut().poll(cx) {
                Poll::Ready(Ok(out)) => return Poll::Ready(Ok(out)),
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => {}
            }
            // The timer fired: see which deadline is due now. The timer is
            // never set past a deadline that may come due meanwhile: the
            // body's end, unknown yet, starts the header timeout no earlier
            // than now.
            let now = hotloop::time::now();
            let next = match this.upload {
                None => return Poll::Ready(Err(Stall::Header)),
                Some(up) if up.done() => {
                    let due = up.last() + this.g.header_timeout;
                    if now >= due {
                        return Poll::Ready(Err(Stall::Header));
                    }
                    due
                }
                Some(up) => {
                    let due = up.last() + this.g.body_timeout;
                    if now >= due {
                        return Poll::Ready(Err(if up.waiting_on_client() {
                            Stall::ClientUpload
                        } else {
                            Stall::BackendUpload
                        }));
                    }
                    due.min(now + this.g.header_timeout)
                }
            };
            this.wait.as_mut().reset(next);
        }
    }
}

/// Takes `h2c` out of a request's `Upgrade` (the field goes when nothing is
/// left, and `HTTP2-Settings` with it): an `h2c` upgrade tunnelled would
/// let the client speak HTTP/2 to the backend past the proxy's routing
/// and checks (h2c smuggling), and the proxy speaks HTTP/2 to clients
/// itself. Without another protocol asked for, the request goes on as an
/// ordinary one. A field that is not text is no valid upgrade: it goes.
fn strip_h2c(h: &mut HeaderMap) {
    let Some(first) = h.get(header::UPGRADE) else { return };
    let h2c = |t: &str| t.split('/').next().is_some_and(|p| p.trim().eq_ignore_ascii_case("h2c"));
    let many = h.get_all(header::UPGRADE).iter().nth(1).is_some();
    if !many && first.to_str().is_ok_and(|v| !v.split(',').any(h2c)) {
        return;
    }
    let mut kept = Vec::new();
    for v in h.get_all(header::UPGRADE) {
        let Ok(v) = v.to_str() else {
            kept.clear();
            break;
        };
        kept.extend(v.split(',').map(str::trim).filter(|t| !t.is_empty() && !h2c(t)));
    }
    let kept = kept.join(", ");
    h.remove(header::UPGRADE);
    h.remove("http2-settings");
    if let Ok(v) = HeaderValue::from_str(&kept) {
        if !kept.is_empty() {
            h.insert(header::UPGRADE, v);
        }
    }
}

/// Whether a request asks to switch protocols (`Connection: upgrade` and
/// an `Upgrade` field).
fn wants_upgrade(h: &HeaderMap) -> bool {
    h.contains_key(header::UPGRADE)
        && h.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str().is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")))
        })
}

/// A request that asks for an upgrade (WebSocket): sent on a connection of
/// its own, retried on another backend only if the connect failed; if the
/// backend answers `101`, the client's and the backend's connections are
/// joined byte for byte until both ends close (or the client connection's
/// idle or send timeout, or a drain's end, cuts them).
async fn tunnel(
    shared: &Arc<Shared>,
    client: &Forwarding,
    group: usize,
    host: Option<&Host>,
    req: Request<Incoming>,
    on: OnUpgrade,
) -> Response<DownBody> {
    let g = &shared.groups[group];
    if g.protocol != UpstreamProtocol::Http1 {
        return fixed(
            StatusCode::NOT_IMPLEMENTED,
            format!("group {}: an upgrade needs HTTP/1.1 backends\n", g.name),
        );
    }
    let version = req.version();
    let (mut parts, body) = req.into_parts();
    headers::remove_hop_by_hop(&mut parts.headers, false, true);
    headers::add_forwarding(&mut parts.headers, version, client, host.map(Host::as_str));
    set_host(&mut parts.headers, client, host);
    parts.uri = Uri::from(
        parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/")),
    );
    let upload = (!body.is_end_stream()).then(Upload::new);
    let mut req = Some(Request::from_parts(parts, UpBody::Client(body, upload.clone())));
    let mut order = candidates(shared, group).into_iter();
    let Some(mut id) = order.next() else {
        return unavailable(shared, group);
    };
    let mut moves = 0;
    let failure = loop {
        let (mut sender, upgraded) =
            match pool::open_upgradable(&shared.backends, id, g.connect_timeout).await {
                Ok(pair) => pair,
                Err(e) => match after_connect_failure(shared, g, id, e, &mut order, &mut moves) {
                    Ok(next) => {
                        id = next;
                        continue;
                    }
                    Err(f) => break f,
                },
            };
        shared.backends[id].stats.requests.fetch_add(1, Relaxed);
        let started = Instant::now();
        let mut request = req.take().expect("sent once");
        if !request.headers().contains_key(header::HOST) {
            request = with_host(request, &shared.backends[id]);
        }
        let head = sender.send_request(request);
        let sent = HeadWait::new(head, upload.as_deref(), g).await;
        let response = match sent {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                note_failure(shared, id);
                break Failure::Lost(e.to_string());
            }
            Err(Stall::Header) => {
                note_failure(shared, id);
                break Failure::HeaderTimeout;
            }
            Err(Stall::BackendUpload) => {
                note_failure(shared, id);
                break Failure::UploadStalled;
            }
            Err(Stall::ClientUpload) => break Failure::ClientUploadStalled,
        };
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            // Refused: an ordinary answer, on a connection not kept.
            return answer(shared, g, id, response, None, None, None, started);
        }
        shared.health.success(id);
        drop(sender);
        let Some((backend_io, backend_buf)) = upgraded.await.ok().flatten() else {
            note_failure(shared, id);
            break Failure::Lost("the backend's connection ended at its 101".into());
        };
        let (mut parts, _) = response.into_parts();
        headers::remove_hop_by_hop(&mut parts.headers, false, true);
        headers::add_via(&mut parts.headers, parts.version);
        parts.version = Version::HTTP_11;
        let stats = shared.clone();
        let joined = on.run(move |client| async move {
            stats.stats.upgrades.fetch_add(1, Relaxed);
            join(client, backend_io, backend_buf).await;
            stats.backends[id].stats.record_latency(started.elapsed());
        });
        if joined.is_err() {
            break Failure::Lost("the upgrade could not be taken over".into());
        }
        return Response::from_parts(parts, DownBody(Down::Fixed(None)));
    };
    failure_answer(shared, g, failure)
}

/// Copies both ways between an upgraded client connection and its backend
/// (after the bytes the backend sent with its `101`) until both directions
/// have ended; an error on either side ends both.
async fn join(mut client: Upgraded, mut backend: pool::BackendIo, first: Bytes) {
    use tokio::io::AsyncWriteExt;
    if !first.is_empty() && client.write_all(&first).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut backend).await;
}

/// The next backend to try, if the group's retries allow one more.
fn next_backend(
    shared: &Shared,
    g: &GroupConfig,
    order: &mut smallvec::IntoIter<[usize; 8]>,
    moves: &mut usize,
) -> Option<usize> {
    if *moves >= g.retries {
        return None;
    }
    let next = order.next()?;
    *moves += 1;
    shared.stats.retries.fetch_add(1, Relaxed);
    Some(next)
}

/// A connect to backend `id` failed (nothing was sent): the failure is
/// counted against it, and the next backend to try is given, or the
/// failure to answer with when none is left. The proxy's own shortage
/// (no descriptor for a socket) is no backend's failure, and every other
/// backend would meet it too: answered at once, nothing counted.
fn after_connect_failure(
    shared: &Shared,
    g: &GroupConfig,
    id: usize,
    e: ConnectError,
    order: &mut smallvec::IntoIter<[usize; 8]>,
    moves: &mut usize,
) -> Result<usize, Failure> {
    if let ConnectError::Local(e) = e {
        return Err(Failure::Local(e.to_string()));
    }
    note_failure(shared, id);
    let failure = Failure::from(e);
    next_backend(shared, g, order, moves).ok_or(failure)
}

fn note_failure(shared: &Shared, id: usize) {
    shared.backends[id].stats.errors.fetch_add(1, Relaxed);
    if shared.health.failure(id) {
        shared.backends[id].stats.ejections.fetch_add(1, Relaxed);
    }
}

/// Methods whose repetition has the effect of one request (RFC 9110 section 9.2.2).
fn idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Why no backend answered.
enum Failure {
    Connect(String),
    ConnectTimeout,
    Lost(String),
    HeaderTimeout,
    /// The backend took none of the request's body for the body timeout.
    UploadStalled,
    /// The client sent none of its body for the body timeout.
    ClientUploadStalled,
    ClientBody(String),
    /// The proxy had no descriptor (or socket memory) for a connection.
    Local(String),
}

impl From<ConnectError> for Failure {
    fn from(e: ConnectError) -> Failure {
        match e {
            ConnectError::TimedOut => Failure::ConnectTimeout,
            ConnectError::Failed(e) => Failure::Connect(e.to_string()),
            ConnectError::Local(e) => Failure::Local(e.to_string()),
        }
    }
}

fn failure_answer(shared: &Shared, g: &GroupConfig, f: Failure) -> Response<DownBody> {
    let (status, why) = match f {
        Failure::Connect(e) => (StatusCode::BAD_GATEWAY, format!("could not connect: {e}")),
        Failure::Lost(e) => (StatusCode::BAD_GATEWAY, format!("no answer: {e}")),
        Failure::ConnectTimeout => (
            StatusCode::GATEWAY_TIMEOUT,
            format!("no connection within {} ms", g.connect_timeout.as_millis()),
        ),
        Failure::HeaderTimeout => (
            StatusCode::GATEWAY_TIMEOUT,
            format!("no answer within {} ms", g.header_timeout.as_millis()),
        ),
        Failure::UploadStalled => (
            StatusCode::GATEWAY_TIMEOUT,
            format!("the backend took none of the body for {} ms", g.body_timeout.as_millis()),
        ),
        Failure::Local(e) => {
            // Descriptors come back as connections end: soon, so a retry
            // in a second may well get through.
            shared.stats.unavailable.fetch_add(1, Relaxed);
            let mut r = fixed(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "group {}: the proxy is short of sockets for its backends ({e}); \
                     retry after 1 s\n",
                    g.name
                ),
            );
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(1));
            return r;
        }
        Failure::ClientBody(e) => {
            return fixed(
                StatusCode::BAD_REQUEST,
                format!("the request's body is malformed: {e}\n"),
            )
        }
        Failure::ClientUploadStalled => {
            // The client's fault, not the backend's: nothing is counted
            // against it, and the connection closes after this answer
            // (hyper does not keep one whose request body is unread).
            return fixed(
                StatusCode::REQUEST_TIMEOUT,
                format!("no byte of the request's body for {} ms\n", g.body_timeout.as_millis()),
            );
        }
    };
    match status {
        StatusCode::BAD_GATEWAY => shared.stats.bad_gateway.fetch_add(1, Relaxed),
        _ => shared.stats.gateway_timeout.fetch_add(1, Relaxed),
    };
    fixed(status, format!("group {}: {why}\n", g.name))
}

enum SendError {
    /// hyper gave the request back: nothing of it was written.
    NotSent(Box<Request<UpBody>>),
    /// Sent, at least in part, and no answer came.
    Lost(hyper::Error),
    /// No answer's head in time, or the request's body stalled.
    TimedOut(Stall),
}

/// What came of a request handed to a backend connection: the answer's
/// head, or why not.
fn sent_outcome(
    sent: Result<
        Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<UpBody>>>,
        Stall,
    >,
) -> Result<Response<Incoming>, SendError> {
    match sent {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(mut e)) => match e.take_message() {
            Some(back) => Err(SendError::NotSent(Box::new(back))),
            None => Err(SendError::Lost(e.into_error())),
        },
        Err(stall) => Err(SendError::TimedOut(stall)),
    }
}

// Each argument is a part of the exchange the answer's body carries on.
#[allow(clippy::too_many_arguments)]
fn answer(
    shared: &Arc<Shared>,
    g: &GroupConfig,
    id: usize,
    response: Response<Incoming>,
    mut h1: Option<pool::H1>,
    stream: Option<h2peer::Stream>,
    upload: Option<Rc<Upload>>,
    started: Instant,
) -> Response<DownBody> {
    let (mut parts, body) = response.into_parts();
    if g.fail_on_5xx && parts.status.is_server_error() {
        note_failure(shared, id);
    } else {
        shared.health.success(id);
    }
    if body.size_hint().exact().is_none() && parts.headers.contains_key(header::CONTENT_LENGTH) {
        // A body hyper reads by its chunks with a length beside them: the
        // length is not the body's (RFC 9112 section 6.3), and would frame
        // the client's copy. (A body read by its length has an exact size,
        // and then no field is looked up.) The message is an error to be
        // handled as one: its connection is not kept (hyper closes it once
        // this body is read, its sender gone), since what the backend
        // meant to follow the body is not known.
        parts.headers.remove(header::CONTENT_LENGTH);
        h1 = None;
    }
    headers::remove_hop_by_hop(&mut parts.headers, false, false);
    headers::add_via(&mut parts.headers, parts.version);
    headers::add_date(&mut parts.headers);
    parts.version = Version::HTTP_11;
    let streaming = Streaming {
        body,
        sender: h1,
        stream,
        upload,
        backend: id,
        shared: shared.clone(),
        started,
        timeout: g.body_timeout,
        last: hotloop::time::now(),
        sleep: None,
        done: false,
    };
    Response::from_parts(parts, DownBody(Down::Upstream(Box::new(streaming))))
}

/// An answer made by the proxy itself.
fn fixed(status: StatusCode, text: String) -> Response<DownBody> {
    let mut r = Response::new(DownBody(Down::Fixed(Some(Bytes::from(text)))));
    *r.status_mut() = status;
    let h: &mut HeaderMap = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// An answer's body on its way to the client.
pub struct DownBody(Down);

enum Down {
    Fixed(Option<Bytes>),
    Upstream(Box<Streaming>),
}

/// A backend's answer body, streamed, with the body timeout; at its end the
/// connection goes back to the pool and the latency is recorded.
struct Streaming {
    body: Incoming,
    sender: Option<pool::H1>,
    /// The HTTP/2 stream, counted against the backend's limit until the
    /// body ends (or is dropped).
    stream: Option<h2peer::Stream>,
    /// The request's body, if it had one: until all of it is sent, the
    /// connection is not free for another request.
    upload: Option<Rc<Upload>>,
    backend: usize,
    shared: Arc<Shared>,
    started: Instant,
    timeout: Duration,
    /// When the last frame came.
    last: Instant,
    /// Armed only while a frame is awaited.
    sleep: Option<Pin<Box<Sleep>>>,
    done: bool,
}

impl Streaming {
    fn finish(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        let b = &self.shared.backends[self.backend];
        b.stats.record_latency(self.started.elapsed());
        self.stream = None;
        let sender = self.sender.take();
        // An answer that came before the request's body was all sent (an
        // early 401 or 413): the connection is busy with the rest of the
        // upload for as long as the client takes, so it is not pooled; it
        // closes once the upload ends (nginx does not keep it either).
        if let (Some(sender), true) = (sender, self.upload.as_ref().is_none_or(|u| u.done())) {
            pool::checkin(&self.shared.backends, self.backend, sender);
        }
    }

    fn fail(&mut self) {
        self.done = true;
        self.sender = None;
        self.stream = None;
        note_failure(&self.shared, self.backend);
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        // A body hyper knew to be empty (a 204, a HEAD's answer, a length
        // of 0) is never polled: its connection is still good.
        if !self.done && self.body.is_end_stream() {
            self.finish();
        }
    }
}

/// A backend that stopped sending in the middle of a body.
#[derive(Debug)]
struct BodyTimeout(Duration);

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the backend sent nothing of its body for {} ms", self.0.as_millis())
    }
}

impl std::error::Error for BodyTimeout {}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Body for DownBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().0 {
            Down::Fixed(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Down::Upstream(s) => {
                if s.done {
                    return Poll::Ready(None);
                }
                match Pin::new(&mut s.body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        s.last = hotloop::time::now();
                        if frame.is_trailers() {
                            // The body's last frame: hyper polls no more
                            // after it (it drops the body), and a chunked
                            // body never says it ended.
                            s.finish();
                        }
                        Poll::Ready(Some(Ok(frame)))
                    }
                    Poll::Ready(Some(Err(e))) => {
                        s.fail();
                        Poll::Ready(Some(Err(e.into())))
                    }
                    Poll::Ready(None) => {
                        s.finish();
                        Poll::Ready(None)
                    }
                    Poll::Pending => {
                        let due = s.last + s.timeout;
                        let sleep = s
                            .sleep
                            .get_or_insert_with(|| Box::pin(hotloop::time::sleep_until(due)));
                        while sleep.as_mut().poll(cx).is_ready() {
                            if hotloop::time::now() >= s.last + s.timeout {
                                s.fail();
                                return Poll::Ready(Some(Err(Box::new(BodyTimeout(s.timeout)))));
                            }
                            sleep.as_mut().reset(s.last + s.timeout);
                        }
                        Poll::Pending
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Down::Fixed(b) => b.is_none(),
            Down::Upstream(s) => s.done || s.body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Down::Fixed(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Down::Fixed(None) => SizeHint::with_exact(0),
            Down::Upstream(s) => s.body.size_hint(),
        }
    }
}
