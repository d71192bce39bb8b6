//! hyper 1.x on hotloop: an executor that spawns on the current worker, a
//! timer on the worker's wheel, and [`serve_hyper`], which serves a hyper
//! `Service` (HTTP/1.1, and HTTP/2 by prior knowledge) on every worker.
//!
//! Connections speak hyper's I/O traits through [`HyperIo`], which sits on
//! the tokio I/O traits of [`TcpStream`] (or of a TLS stream over it) on
//! either driver. It needs no `hyper_util::rt::TokioIo`, so a server built
//! on this module links no tokio runtime code. With the `tls` feature,
//! `serve_hyper_tls` does the same over rustls, with ALPN.
//!
//! [`serve_hyper`] bounds every connection by the deadlines of
//! [`HyperOptions`]: nothing moved either way for the idle timeout (on
//! HTTP/2, no frame of a stream: PINGs do not count), a write stalled for
//! the send timeout (a client that does not read), and, for HTTP/1.1,
//! hyper's own header-read timeout; and by its limits: hyper's buffers,
//! HTTP/2's concurrent streams and send buffer per stream, and the streams
//! one HTTP/2 connection may start or have reset. A client that ends its
//! side after a request (a TCP half-close, or a TLS close_notify) still
//! gets its answer.
//!
//! # Implementation notes
//!
//! - hyper hands reads an uninitialised cursor; it is filled in place (the
//!   `unsafe` for that lives in the buffer layer, `buf/`), and hotloop's
//!   `AsyncRead` impls read into a `ReadBuf`'s spare room without zeroing
//!   it, so a read is one copy from the kernel, as on tokio.
//! - The deadlines cost no timer per request (`deadline.rs`): the I/O
//!   handed to hyper records when bytes last moved and since when a write
//!   has waited, and the connection's one timer reads that record when it
//!   fires. A read moves the idle clock but not a waiting write's: a
//!   client that keeps sending and never reads still meets the send
//!   timeout. On HTTP/2 only a stream's frames move it (`frames.rs` reads
//!   the frame headers as they pass): a client could otherwise keep a
//!   connection, and a stalled request body on it, open for good with a
//!   PING now and then.
//! - The idle timeout does not run while the service owes an answer and
//!   nothing waits on the client; an HTTP/2 stream whose answer waits for
//!   flow-control window for the send timeout is reset (`stream.rs`: each
//!   stream's task is wrapped by the connection's executor, and the
//!   answer's body tells it when hyper takes a frame). The body holds its
//!   last byte back until the rest is sent, so the end of an answer waits
//!   for window under that deadline too (hyper would hand h2 the whole
//!   last chunk and end the stream's task).
//! - An HTTP/2 connection that has started
//!   [`HyperOptions::http2_max_requests`] streams, or whose client has
//!   reset [`HyperOptions::http2_max_client_resets`] of them before their
//!   answer, is sent `GOAWAY`, and cut if it goes on opening streams
//!   (`limits.rs`, counted by the stream tasks).
//! - An HTTP/1.1 connection that sits between requests gives hyper's
//!   buffers back ([`HyperOptions::idle_release`], `connection.rs`), so an
//!   idle connection costs about what its socket and task do.
//! - At the idle deadline hyper is asked to finish gracefully (an idle
//!   HTTP/1.1 connection closes at once; HTTP/2 sends GOAWAY), and the
//!   connection is cut [`IDLE_CLOSE_GRACE`] later if it has not ended; a
//!   stalled write is cut at once (a GOAWAY could not be sent anyway). A
//!   cut shuts the socket down both ways before the stream is dropped, so
//!   a write in flight on io_uring ends at once too.
//! - hyper does not catch a panic of the service: it would end the
//!   connection's task and leave the client an empty reply. Every service
//!   is wrapped (`panic.rs`) so that its panic is answered `500`.
//! - hyper's HTTP/1.1 server drops a connection whose read side ends while
//!   a request is being answered unless it allows half-closed connections
//!   (`half_close`), which it does here: the end of the client's side is
//!   then only an end of requests.
//! - When hyper ends a connection itself (after `Connection: close` or an
//!   HTTP/1.0 request, or a GOAWAY), the close lingers, as nginx's
//!   `lingering_close`: the write side is shut (over TLS after a
//!   close_notify), and what the client still sends is read and dropped
//!   until its end, until it has sent nothing for 2 s, about 4 MiB at
//!   most (a drain lets it go on, up to the drain's deadline). Closing on
//!   unread bytes, such as the close_notify a TLS client sends after its
//!   last request, sends a reset that throws away the answer the client
//!   has not read yet.

mod connection;
mod deadline;
mod frames;
mod limits;
mod panic;
mod rt;
mod stream;
mod tracked;
mod upgrade;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper::{Request, Response};

use self::connection::serve_connection;
use self::deadline::Deadlines;
pub use self::deadline::IDLE_CLOSE_GRACE;
use self::limits::Limits;
use self::panic::CatchPanic;
pub use self::rt::{HotloopExecutor, HotloopTimer, HyperIo, HyperSleep};
pub use self::upgrade::{OnUpgrade, Upgraded};
use crate::net::{serve_with_stop, ListenerOptions, Server, ServerOptions, TcpStream};
use crate::Handle;

/// Adapts a tower `Service` (an axum `Router`, a `ServiceBuilder` stack)
/// to the hyper `Service` that [`serve_hyper`] takes:
/// `serve_hyper(handle, addr, options, move || TowerToHyperService::new(router.clone()))`.
pub use hyper_util::service::TowerToHyperService;

/// How [`serve_hyper`] and `serve_hyper_tls` (feature `tls`) serve: the
/// listeners and connection limits, and the deadlines that bound every
/// connection.
///
/// A [`ServerOptions`] or a [`ListenerOptions`] converts into one with the
/// default deadlines.
#[derive(Debug, Clone)]
pub struct HyperOptions {
    /// The listeners and the connection limits.
    pub server: ServerOptions,
    /// Close a connection on which no byte has moved either way for this
    /// long while it waits on its client: for the next request, the rest
    /// of one, or a client that does not read its answer. On HTTP/2 only
    /// the frames of a stream (`HEADERS`, `CONTINUATION`, `DATA`) count,
    /// not the connection's own (a PING and its answer). HTTP/1.1
    /// connections are closed (at once if no request is open), HTTP/2 ones
    /// are sent a GOAWAY, and either is cut [`IDLE_CLOSE_GRACE`] later if
    /// it has not ended. It does not run while the service owes an answer
    /// and waits on nothing from the client (an HTTP/1.1 request taken and
    /// no read or write waiting; an HTTP/2 stream open whose request came whole): a slow service is
    /// bounded by its own deadlines. `None`: never. Default: 60 s.
    pub idle_timeout: Option<Duration>,
    /// Cut a connection whose write has made no progress for this long,
    /// because the client does not read (nginx's `send_timeout`); a
    /// shorter idle timeout cuts it sooner. HTTP/2: a stream whose answer
    /// has more to give and of which hyper has taken nothing for this
    /// long, because the client gives it no flow-control window, is reset
    /// (`RST_STREAM`) and its body dropped; the answer's end counts (its
    /// last byte is handed to hyper only after the rest). `None`: never.
    /// Default: 60 s.
    pub send_timeout: Option<Duration>,
    /// HTTP/1.1: hyper's header-read timeout. A request head must arrive
    /// whole within this long of the start of its read (for a kept-alive
    /// connection, of the end of the previous answer); then the connection
    /// is closed. `None`: never. Default: 30 s (hyper's own default).
    pub header_timeout: Option<Duration>,
    /// HTTP/1.1: hyper's state for a connection (two 8 KiB buffers) is
    /// released when the connection sits between requests, and built again
    /// when the client sends its next bytes, so an idle connection holds
    /// its socket and little else. The first release comes at once; a
    /// client that sends again within this long of its last bytes keeps
    /// its state from then on until it has sat between requests for this
    /// long, so a client that keeps sending pays for no rebuild. `None`:
    /// never release. Default: 500 ms.
    pub idle_release: Option<Duration>,
    /// HTTP/1.1: the most hyper buffers for one connection, its read
    /// buffer and what it queues to write. A request head must fit in it:
    /// a larger one is answered `431 Request Header Fields Too Large` and
    /// the connection closed (nginx reads a head into 1 KiB and four 8 KiB
    /// buffers at most, haproxy into 16 KiB). At least 8 KiB (less counts
    /// as 8 KiB). Default: 64 KiB (hyper's own: about 400 KiB).
    pub http1_max_buf_size: usize,
    /// HTTP/2: the streams a client may have open at once
    /// (`SETTINGS_MAX_CONCURRENT_STREAMS`). Default: 128 (hyper's: 200).
    pub http2_max_concurrent_streams: u32,
    /// HTTP/2: how much of one stream's answer hyper takes from the
    /// service ahead of what the client has read (h2's send buffer, per
    /// stream). With the concurrent streams it bounds what a client that
    /// reads nothing makes the server hold: 8 MiB per connection by
    /// default. Default: 64 KiB (hyper's: 400 KiB).
    pub http2_max_send_buf_size: usize,
    /// HTTP/2: the flow-control window each stream's request body is
    /// given (`SETTINGS_INITIAL_WINDOW_SIZE`), at most 2^31 - 1.
    /// Default: 1 MiB (hyper's).
    pub http2_initial_stream_window: u32,
    /// HTTP/2: the flow-control window of a connection's request bodies
    /// together, at most 2^31 - 1. Default: 1 MiB (hyper's).
    pub http2_initial_connection_window: u32,
    /// HTTP/2: the streams one connection may start. Past this many it is
    /// sent `GOAWAY` (its open streams finish; the client opens a new
    /// connection for more), as nginx's `keepalive_requests`; one that
    /// starts [`HyperOptions::http2_max_concurrent_streams`] more anyway
    /// is cut. `None`: no limit. Default: 1000.
    pub http2_max_requests: Option<u32>,
    /// HTTP/2: the streams the client may reset (`RST_STREAM`) on one
    /// connection before their answer was handed whole. Past this many it
    /// is sent `GOAWAY` and cut as for
    /// [`HyperOptions::http2_max_requests`]: each such stream cost the
    /// service a request (a proxy a backend exchange) that the client
    /// threw away, and a client that resets every stream it opens (a
    /// rapid reset) would otherwise have it do that without end. h2
    /// itself bounds only the streams reset before they are accepted.
    /// `None`: no limit. Default: 200.
    pub http2_max_client_resets: Option<u32>,
}

impl HyperOptions {
    /// The default idle timeout.
    pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
    /// The default send timeout.
    pub const SEND_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
    /// The default header-read timeout (hyper's).
    pub const HEADER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
    /// The default release time of an idle HTTP/1.1 connection's hyper state.
    pub const IDLE_RELEASE_DEFAULT: Duration = Duration::from_millis(500);
    /// The default HTTP/1.1 buffer limit.
    pub const HTTP1_MAX_BUF_SIZE_DEFAULT: usize = 64 * 1024;
    /// The default limit of concurrent HTTP/2 streams.
    pub const HTTP2_MAX_CONCURRENT_STREAMS_DEFAULT: u32 = 128;
    /// The default HTTP/2 send buffer per stream.
    pub const HTTP2_MAX_SEND_BUF_SIZE_DEFAULT: usize = 64 * 1024;
    /// The default HTTP/2 flow-control windows (stream and connection).
    pub const HTTP2_INITIAL_WINDOW_DEFAULT: u32 = 1024 * 1024;
    /// The default limit of streams per HTTP/2 connection.
    pub const HTTP2_MAX_REQUESTS_DEFAULT: u32 = 1000;
    /// The default limit of streams an HTTP/2 client may reset.
    pub const HTTP2_MAX_CLIENT_RESETS_DEFAULT: u32 = 200;
}

impl Default for HyperOptions {
    fn default() -> Self {
        HyperOptions {
            server: ServerOptions::default(),
            idle_timeout: Some(Self::IDLE_TIMEOUT_DEFAULT),
            send_timeout: Some(Self::SEND_TIMEOUT_DEFAULT),
            header_timeout: Some(Self::HEADER_TIMEOUT_DEFAULT),
            idle_release: Some(Self::IDLE_RELEASE_DEFAULT),
            http1_max_buf_size: Self::HTTP1_MAX_BUF_SIZE_DEFAULT,
            http2_max_concurrent_streams: Self::HTTP2_MAX_CONCURRENT_STREAMS_DEFAULT,
            http2_max_send_buf_size: Self::HTTP2_MAX_SEND_BUF_SIZE_DEFAULT,
            http2_initial_stream_window: Self::HTTP2_INITIAL_WINDOW_DEFAULT,
            http2_initial_connection_window: Self::HTTP2_INITIAL_WINDOW_DEFAULT,
            http2_max_requests: Some(Self::HTTP2_MAX_REQUESTS_DEFAULT),
            http2_max_client_resets: Some(Self::HTTP2_MAX_CLIENT_RESETS_DEFAULT),
        }
    }
}

impl From<ServerOptions> for HyperOptions {
    fn from(server: ServerOptions) -> Self {
        HyperOptions { server, ..Default::default() }
    }
}

impl From<ListenerOptions> for HyperOptions {
    fn from(listener: ListenerOptions) -> Self {
        ServerOptions::from(listener).into()
    }
}

impl From<&HyperOptions> for Deadlines {
    fn from(o: &HyperOptions) -> Self {
        Deadlines::new(o.idle_timeout, o.send_timeout, o.header_timeout, o.idle_release)
    }
}

/// Serves `make_service()` on every worker of `handle`'s runtime: HTTP/1.1,
/// and HTTP/2 when the client starts with the HTTP/2 preface (prior
/// knowledge, `h2c`). Each worker calls `make_service` once per connection.
///
/// `options` is a [`HyperOptions`], or a [`ServerOptions`] or
/// [`ListenerOptions`] with the default deadlines (idle and send timeouts
/// of 60 s, hyper's header-read timeout of 30 s).
///
/// When the server stops ([`Server::stop`] or
/// [`Server::shutdown_blocking`]), every connection is told to finish
/// gracefully: HTTP/1.1 connections finish the request in flight and
/// close; HTTP/2 connections send `GOAWAY` and finish their open streams.
///
/// A service that panics before it answers gets its request answered
/// `500 Internal Server Error` (empty body), and the connection goes on
/// serving; a panic while the body is sent ends that response only. The
/// panic is logged.
pub fn serve_hyper<M, S, B>(
    handle: impl AsRef<Handle>,
    addr: impl std::net::ToSocketAddrs,
    options: impl Into<HyperOptions>,
    make_service: M,
) -> std::io::Result<Server>
where
    M: Fn() -> S + Send + Sync + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // Not through `serve_hyper_with_peer`: asking each connection for its
    // peer is a system call that a service without a use for it should
    // not pay for.
    serve_hyper_on(handle, addr, options, move |_: &TcpStream| make_service())
}

/// [`serve_hyper`] with the client's address: each worker calls
/// `make_service(peer)` once per connection, so a service can say whom it
/// serves (a proxy's `X-Forwarded-For`, a log line). A connection whose
/// address can no longer be read (the client already reset it) is given
/// the unspecified address `0.0.0.0:0`.
pub fn serve_hyper_with_peer<M, S, B>(
    handle: impl AsRef<Handle>,
    addr: impl std::net::ToSocketAddrs,
    options: impl Into<HyperOptions>,
    make_service: M,
) -> std::io::Result<Server>
where
    M: Fn(SocketAddr) -> S + Send + Sync + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve_hyper_on(handle, addr, options, move |stream: &TcpStream| {
        make_service(stream.peer_addr().unwrap_or(UNKNOWN_PEER))
    })
}

/// [`serve_hyper`] and [`serve_hyper_with_peer`]: `make_service` sees each
/// accepted stream before its service is made.
fn serve_hyper_on<M, S, B>(
    handle: impl AsRef<Handle>,
    addr: impl std::net::ToSocketAddrs,
    options: impl Into<HyperOptions>,
    make_service: M,
) -> std::io::Result<Server>
where
    M: Fn(&TcpStream) -> S + Send + Sync + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let handle = handle.as_ref();
    let options = options.into();
    let deadlines = Deadlines::from(&options);
    let limits = Arc::new(Limits::from(&options));
    serve_with_stop(handle, addr, options.server, move |stream: TcpStream, stop| {
        let service = make_service(&stream);
        serve_connection(stream, CatchPanic::new(service), stop, deadlines, limits.clone())
    })
}

/// The address a service is given when its client's can no longer be read.
const UNKNOWN_PEER: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);

/// [`serve_hyper`] over TLS (feature `tls`): each connection is handshaken
/// by `acceptor` within its time limit, then served as HTTP/2 or HTTP/1.1.
/// The acceptor offers ALPN `h2` and `http/1.1` unless its configuration
/// already names protocols, so browsers and `curl` negotiate HTTP/2.
#[cfg(feature = "tls")]
pub fn serve_hyper_tls<M, S, B>(
    handle: impl AsRef<Handle>,
    addr: impl std::net::ToSocketAddrs,
    options: impl Into<HyperOptions>,
    acceptor: crate::tls::TlsAcceptor,
    make_service: M,
) -> std::io::Result<Server>
where
    M: Fn() -> S + Send + Sync + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve_hyper_tls_on(handle, addr, options, acceptor, move |_: &TcpStream| make_service())
}

/// [`serve_hyper_tls`] with the client's address, as [`serve_hyper_with_peer`].
#[cfg(feature = "tls")]
pub fn serve_hyper_tls_with_peer<M, S, B>(
    handle: impl AsRef<Handle>,
    addr: impl std::net::ToSocketAddrs,
    options: impl Into<HyperOptions>,
    acceptor: crate::tls::TlsAcceptor,
    make_service: M,
) -> std::io::Result<Server>
where
    M: Fn(SocketAddr) -> S + Send + Sync + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve_hyper_tls_on(handle, addr, options, acceptor, move |stream: &TcpStream| {
        make_service(stream.peer_addr().unwrap_or(UNKNOWN_PEER))
    })
}

/// [`serve_hyper_tls`] and [`serve_hyper_tls_with_peer`]: `make_service`
/// sees each accepted stream before its service is made.
#[cfg(feature = "tls")]
fn serve_hyper_tls_on<M, S, B>(
    handle: impl AsRef<Handle>,
    addr: impl std::net::ToSocketAddrs,
    options: impl Into<HyperOptions>,
    acceptor: crate::tls::TlsAcceptor,
    make_service: M,
) -> std::io::Result<Server>
where
    M: Fn(&TcpStream) -> S + Send + Sync + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let handle = handle.as_ref();
    use crate::tls::{ALPN_H2, ALPN_HTTP11};
    let acceptor = acceptor.with_default_alpn(&[ALPN_H2, ALPN_HTTP11]);
    let options = options.into();
    let deadlines = Deadlines::from(&options);
    let limits = Arc::new(Limits::from(&options));
    crate::tls::serve_tls_with_stop(handle, addr, options.server, acceptor, move |tls, stop| {
        let service = make_service(tls.get_ref().0);
        serve_connection(tls, CatchPanic::new(service), stop, deadlines, limits.clone())
    })
}
