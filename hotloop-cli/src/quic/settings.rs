//! What every connection of the server shares: the protocol it speaks,
//! its ALPN ids and close codes, the limits from the command line, and the
//! counters (open, holding a slot, handshaking unvalidated, accepted,
//! retried, refused) that admission, the stats endpoint and the memory
//! releaser read.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::serve_args::RetryPolicy;

/// The ALPN protocol id `serve quic` offers.
pub(super) const ALPN: &[u8] = b"hotloop-echo";
/// The ALPN protocol id of HTTP/3.
pub(super) const ALPN_H3: &[u8] = b"h3";

/// The application close code of a `quic` server that stops.
pub(super) const CLOSE_STOPPING: u32 = 0;
/// The same for `h3`: HTTP/3's H3_NO_ERROR.
pub(super) const CLOSE_STOPPING_H3: u32 = 0x100;
/// The reason sent with [`CLOSE_STOPPING`].
pub(super) const CLOSE_REASON: &[u8] = b"server stopping";
/// The reason sent with [`CLOSE_STOPPING`] when a successor took the
/// sockets over (see `quic/mod.rs` for why the connections are closed).
pub(super) const CLOSE_UPGRADING_REASON: &[u8] = b"server upgrading";
/// The stream reset code when the client reads nothing for --send-timeout-ms.
pub(super) const RESET_SEND_TIMEOUT: u32 = 1;

/// The application close code of a `quic` connection whose handshake
/// completed when every `--maxconn` slot was taken.
pub(super) const CLOSE_FULL: u32 = 2;
/// The same for `h3`: HTTP/3's H3_EXCESSIVE_LOAD.
pub(super) const CLOSE_FULL_H3: u32 = 0x107;
/// The reason sent with [`CLOSE_FULL`].
pub(super) const CLOSE_FULL_REASON: &[u8] = b"server full";
/// The connection limit when `--maxconn` is not given: with the default
/// windows (`serve_args.rs`), a connection makes the server hold at most
/// about 2 MiB.
pub(super) const MAXCONN_DEFAULT: usize = 4096;

/// What the connections speak.
pub(super) enum Proto {
    /// Every bidirectional stream echoed.
    Echo,
    /// HTTP/3, answering every request with this body.
    H3 { body: bytes::Bytes },
}

/// What every connection of the server shares.
pub(super) struct Settings {
    pub(super) proto: Proto,
    pub(super) work_us: u64,
    pub(super) send_timeout: Option<Duration>,
    /// How long an HTTP/3 request's HEADERS may take after its stream opened.
    pub(super) header_timeout: Option<Duration>,
    pub(super) handshake_timeout: Duration,
    pub(super) retry: RetryPolicy,
    pub(super) unvalidated_max: usize,
    pub(super) maxconn: usize,
    /// The close code of a connection that completes with no slot left.
    pub(super) close_full: u32,
    /// Connections open now (handshaking included), over all workers.
    pub(super) active: AtomicUsize,
    /// Connections holding a `--maxconn` slot: those whose address is
    /// validated (by a Retry, or by completing the handshake).
    pub(super) slots: AtomicUsize,
    /// Handshakes in progress from addresses not validated.
    pub(super) unvalidated: AtomicUsize,
    /// The most connections open at once since the memory releaser last looked.
    pub(super) peak: AtomicUsize,
    pub(super) accepted: AtomicU64,
    pub(super) retries: AtomicU64,
    pub(super) refused: AtomicU64,
}

impl Settings {
    /// The application close code of a connection closed for a stop.
    pub(super) fn close_stopping(&self) -> u32 {
        match self.proto {
            Proto::Echo => CLOSE_STOPPING,
            Proto::H3 { .. } => CLOSE_STOPPING_H3,
        }
    }

    /// Takes one of `count`'s `max` places, if one is left.
    pub(super) fn take(count: &AtomicUsize, max: usize) -> bool {
        count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max).then_some(n + 1))
            .is_ok()
    }
}
