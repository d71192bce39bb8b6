//! The flags of `hotloop serve`, for every app (QUIC's included), and the
//! conversions of their values that more than one app uses.
//!
//! The lowest of the server's modules: it imports only the runtime's own
//! flags (`runtime_args.rs`), so every app can take [`ServeArgs`] without
//! importing another app.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use hotloop_proto as proto;

use crate::runtime_args::RuntimeArgs;

/// What the server speaks.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum App {
    /// Write back what is read.
    Echo,
    /// Answer every HTTP/1.1 request with a fixed body.
    Http,
    /// The same answer from a hyper service on hotloop's hyper integration
    /// (HTTP/1.1, and HTTP/2 by prior knowledge; over TLS, as ALPN picks).
    Hyper,
    /// QUIC: every bidirectional stream gets back what it sent (UDP).
    Quic,
    /// HTTP/3 over QUIC (UDP): every request gets the fixed body.
    H3,
    /// The files under --root over HTTP/1.1 (GET and HEAD, ranges, 304);
    /// regular files only (a FIFO, socket or device is 404).
    Static,
}

/// `hotloop serve` flags.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// echo, http, hyper, static, quic or h3.
    pub app: App,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: String,
    /// static: the directory whose files are served (a request for a
    /// directory gets its index.html; one without the trailing slash a 301
    /// to it). Only regular files are served: a
    /// FIFO, a socket or a device is 404. Each worker keeps files it served
    /// open for at most 1 s, all workers together at most a quarter of the
    /// open-file limit; every hit checks the kept file (fstat), so a file
    /// deleted, replaced or changed is opened again, and an accept or open
    /// that runs out of descriptors first closes the idle ones.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// HTTP response body size in bytes (http, hyper, h3).
    #[arg(long, default_value_t = 64)]
    pub body_size: usize,
    /// CPU work per request in microseconds, standing in for an application's own processing.
    #[arg(long, default_value_t = 0)]
    pub work_us: u64,
    /// echo: CPU work per byte received, in nanoseconds, on top of
    /// --work-us: connections that send more cost more, as a mix of heavy
    /// and light clients does.
    #[arg(long, default_value_t = 0)]
    pub work_ns_per_byte: u64,
    /// Idle timeout (echo, http, hyper, static; quic and h3: QUIC's idle
    /// timeout): close a connection when nothing has moved in either
    /// direction for this long, whether it waits to read or to write
    /// (hyper over HTTP/2: GOAWAY, then close; hyper: not while the
    /// service owes an answer), milliseconds (0: never).
    #[arg(long, default_value_t = 60_000)]
    pub idle_timeout_ms: u64,
    /// Header timeout (http, static; hyper over HTTP/1.1; h3): a request head must
    /// arrive whole within this long of its first byte (of the connection,
    /// for the first request; for hyper, of the end of the previous
    /// answer; for h3, of the request's stream), however slowly it trickles; then 408 and close (hyper
    /// closes; h3 resets the stream). Milliseconds (0: never; the idle timeout still applies).
    #[arg(long, default_value_t = 10_000)]
    pub header_timeout_ms: u64,
    /// Send timeout (echo, http, hyper, static; quic and h3 reset the stream): close a
    /// connection when a write has made no progress for this long, because
    /// the client does not read (nginx's `send_timeout`); a shorter idle
    /// timeout closes it sooner. hyper over HTTP/2: a stream whose answer
    /// has waited this long for flow-control window is reset. Milliseconds
    /// (0: never).
    #[arg(long, default_value_t = 60_000)]
    pub send_timeout_ms: u64,
    /// HTTP: the most headers a request may carry; more gets 431.
    #[arg(long, default_value_t = proto::REQUEST_HEADERS_MAX,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
              .range(1..=proto::REQUEST_HEADERS_LIMIT_MAX as u64))]
    pub max_headers: usize,
    /// TLS: the certificate chain, PEM (the server's certificate first).
    /// With --tls-key, echo, http, hyper and static are served over TLS; quic and
    /// h3 use it instead of a generated one.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS: the private key of --tls-cert, PEM (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// TLS and QUIC: a handshake not done within this long loses its
    /// connection, milliseconds.
    #[arg(long, default_value_t = 10_000,
          value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..))]
    pub handshake_timeout_ms: u64,
    /// quic and h3 without --tls-cert: write the generated self-signed certificate
    /// (PEM) here, for clients to trust.
    #[arg(long, value_name = "FILE", conflicts_with = "tls_cert")]
    pub write_cert: Option<PathBuf>,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    #[command(flatten)]
    pub quic: QuicArgs,
}

/// The default of `--quic-max-streams`: bidirectional streams of each client
/// open at once. quinn keeps the state of every stream a client may open
/// from the start of the handshake (about 130 bytes each), so this also
/// sizes what a half-open connection costs.
pub const STREAMS_PER_CONNECTION_MAX: u32 = 100;
/// The most `--quic-max-streams` may be.
const STREAMS_PER_CONNECTION_LIMIT_MAX: u32 = 10_000;
/// The default of `--quic-receive-window-bytes`: what one connection may have
/// sent that the server has not read yet, all streams together.
pub const RECEIVE_WINDOW_BYTES: u32 = 1024 * 1024;
/// The default of `--quic-stream-receive-window-bytes`: the same for one stream.
pub const STREAM_RECEIVE_WINDOW_BYTES: u32 = 256 * 1024;
/// The default of `--quic-send-window-bytes`: what one connection may have
/// written that the client has not acknowledged yet, all streams together.
pub const SEND_WINDOW_BYTES: u32 = 1024 * 1024;
/// The default of `--quic-unvalidated-max`: handshakes from addresses not yet
/// validated in progress at once over all workers; beyond it `auto` answers
/// with a Retry. Each holds about 50 KB until it completes or times out.
pub const UNVALIDATED_HANDSHAKES_MAX: usize = 256;

/// `serve quic` and `serve h3` flags: address validation and what one
/// connection may hold.
#[derive(Args, Debug, Clone)]
pub struct QuicArgs {
    /// quic and h3: answer a new connection from an address not yet
    /// validated with a Retry, which the client must answer from that
    /// address (one more round trip; a spoofed address never answers):
    /// `auto` once --quic-unvalidated-max such handshakes are in progress,
    /// `always`, or `never` (refuse beyond that bound instead).
    #[arg(long, value_enum, default_value = "auto")]
    pub quic_retry: RetryPolicy,
    /// quic and h3: the most handshakes from unvalidated addresses in
    /// progress at once, over all workers. They hold no --maxconn slot
    /// until they complete.
    #[arg(long, default_value_t = UNVALIDATED_HANDSHAKES_MAX)]
    pub quic_unvalidated_max: usize,
    /// quic and h3: the most bidirectional streams a client may have open at
    /// once on one connection (h3: requests).
    #[arg(long, default_value_t = STREAMS_PER_CONNECTION_MAX,
          value_parser = clap::builder::RangedU64ValueParser::<u32>::new()
              .range(1..=STREAMS_PER_CONNECTION_LIMIT_MAX as u64))]
    pub quic_max_streams: u32,
    /// quic and h3: the most bytes a client may have sent on one connection
    /// that the server has not read yet, all streams together.
    #[arg(long, default_value_t = RECEIVE_WINDOW_BYTES,
          value_parser = clap::builder::RangedU64ValueParser::<u32>::new().range(1..))]
    pub quic_receive_window_bytes: u32,
    /// quic and h3: the same for one stream.
    #[arg(long, default_value_t = STREAM_RECEIVE_WINDOW_BYTES,
          value_parser = clap::builder::RangedU64ValueParser::<u32>::new().range(1..))]
    pub quic_stream_receive_window_bytes: u32,
    /// quic and h3: the most bytes the server keeps written on one
    /// connection that the client has not acknowledged, all streams
    /// together; a stream's writes wait beyond it.
    #[arg(long, default_value_t = SEND_WINDOW_BYTES,
          value_parser = clap::builder::RangedU64ValueParser::<u32>::new().range(1..))]
    pub quic_send_window_bytes: u32,
}

/// When a new connection from an unvalidated address is sent a Retry.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryPolicy {
    /// Once --quic-unvalidated-max handshakes from unvalidated addresses are in progress.
    Auto,
    /// Every one.
    Always,
    /// None: beyond --quic-unvalidated-max, refused.
    Never,
}

/// A duration flag's milliseconds; 0 means never.
pub(crate) fn millis_or_never(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// The shorter of two optional limits (`None`: never).
pub(crate) fn shorter(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
