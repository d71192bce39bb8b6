//! What one connection may take: hyper's buffer and HTTP/2 settings from
//! [`HyperOptions`], and the stream counts past which an HTTP/2 connection
//! is sent away or cut.

use hyper::server::conn::{http1, http2};

use super::stream::{StreamExecutor, Streams};
use super::HyperOptions;

/// The smallest buffer hyper's HTTP/1.1 server takes (it panics below).
const HTTP1_MIN_BUF_SIZE: usize = 8 * 1024;

/// The limits of [`HyperOptions`] that hyper's state is built with, shared
/// by a server's connections.
#[derive(Debug, Clone)]
pub(super) struct Limits {
    http1_max_buf_size: usize,
    max_concurrent_streams: u32,
    max_send_buf_size: usize,
    stream_window: u32,
    connection_window: u32,
    max_requests: Option<u32>,
    max_client_resets: Option<u32>,
}

impl From<&HyperOptions> for Limits {
    fn from(o: &HyperOptions) -> Self {
        Limits {
            http1_max_buf_size: o.http1_max_buf_size.max(HTTP1_MIN_BUF_SIZE),
            max_concurrent_streams: o.http2_max_concurrent_streams,
            // hyper takes no more than `u32::MAX`.
            max_send_buf_size: o.http2_max_send_buf_size.min(u32::MAX as usize),
            stream_window: o.http2_initial_stream_window,
            connection_window: o.http2_initial_connection_window,
            max_requests: o.http2_max_requests,
            max_client_resets: o.http2_max_client_resets,
        }
    }
}

/// What an HTTP/2 connection's stream counts call for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Overrun {
    /// Past a limit: `GOAWAY`, and the open streams finish.
    GoAway,
    /// Past a limit by more than the streams a client may have open at
    /// once: it went on after the `GOAWAY` (h2 takes new streams until the
    /// client answers the `GOAWAY`'s PING, which it need not do).
    Cut,
}

impl Limits {
    /// Sets hyper's HTTP/1.1 buffer limit, and the same limit on a
    /// request head: hyper checks its buffer against the limit only
    /// between reads, and one read may take more than the limit into a
    /// buffer that happened to have the room (a whole head already in the
    /// socket, as on io_uring), so the head's own limit is what holds.
    pub(super) fn http1(&self, builder: &mut http1::Builder) {
        builder.max_buf_size(self.http1_max_buf_size).max_header_size(self.http1_max_buf_size);
    }

    /// hyper's HTTP/2 builder, its streams run by `exec`.
    pub(super) fn http2(&self, exec: StreamExecutor) -> http2::Builder<StreamExecutor> {
        let mut builder = http2::Builder::new(exec);
        builder
            .max_concurrent_streams(self.max_concurrent_streams)
            .max_send_buf_size(self.max_send_buf_size)
            .initial_stream_window_size(self.stream_window)
            .initial_connection_window_size(self.connection_window);
        builder
    }

    /// Whether `streams` are past a limit, and how far.
    pub(super) fn overrun(&self, streams: &Streams) -> Option<Overrun> {
        let slack = self.max_concurrent_streams;
        let judge = |n: u32, max: Option<u32>| {
            let max = max?;
            if n > max.saturating_add(slack) {
                Some(Overrun::Cut)
            } else {
                (n >= max).then_some(Overrun::GoAway)
            }
        };
        let requests = judge(streams.started(), self.max_requests);
        let resets = judge(streams.cut_short(), self.max_client_resets);
        requests.max(resets)
    }
}
