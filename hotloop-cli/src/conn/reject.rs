//! The error reply (400, 405, 408, 431, 501, 505) and the lingering close
//! after it.

use std::time::Duration;

use hotloop_proto as proto;

use super::linger::{linger, LINGER_QUIET};
use super::{Conn, ConnTimer};

/// Answers with an error status and closes gracefully: shut down writing
/// (the client reads the reply, then the end of stream), then read and
/// drop what the client still sends ([`linger()`]). The handler then ends
/// with [`super::Ending::Lingered`]: nothing is left to do at the close.
pub(crate) async fn reject<S: Conn>(stream: &mut S, status: u16, write_limit: Option<Duration>) {
    answer_and_linger(stream, proto::response_error(status), write_limit).await
}

/// [`reject`] with a reply of the caller's (one that closes the
/// connection, such as `serve static`'s 405 with its `Allow` field).
pub(crate) async fn answer_and_linger<S, B>(stream: &mut S, reply: B, write_limit: Option<Duration>)
where
    S: Conn,
    B: hotloop::buf::IoBuf + std::ops::Deref<Target = [u8]>,
{
    let mut timer = ConnTimer::new();
    if stream.send(reply, write_limit, &mut timer).await.is_err() {
        return;
    }
    // Bounded as the reply was: over TLS the end is a close_notify record,
    // which waits for room in the socket like any write.
    let limit = write_limit.unwrap_or(LINGER_QUIET);
    if !matches!(hotloop::time::timeout(limit, stream.shutdown_write()).await, Ok(Ok(()))) {
        return;
    }
    linger(stream, &mut timer).await
}
