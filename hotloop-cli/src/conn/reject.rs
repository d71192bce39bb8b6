//! The error reply (400, 405, 408, 431, 501, 505) and the lingering close
//! after it.

use std::pin::pin;
use std::time::{Duration, Instant};

use hotloop_proto as proto;

use super::{Conn, ConnTimer};

/// After an error reply, the most bytes read and thrown away, and for how
/// long, before closing (see [`reject`]).
const LINGER_BYTES_MAX: usize = 256 * 1024;
pub(crate) const LINGER_MAX: Duration = Duration::from_secs(2);

/// Answers with an error status and closes gracefully: shut down writing
/// (the client reads the reply, then the end of stream), then read and
/// drop what the client still sends, up to [`LINGER_BYTES_MAX`] within
/// [`LINGER_MAX`], before closing. Closing with unread bytes would send a
/// reset, which can destroy the reply before the client reads it (RFC 9112
/// section 9.6; nginx's `lingering_close`, with a shorter bound: 2 s rather
/// than nginx's 30 s, to free the descriptor sooner).
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
    if stream.shutdown_write().await.is_err() {
        return;
    }
    let until = Instant::now() + LINGER_MAX;
    let mut drained = 0;
    while drained < LINGER_BYTES_MAX {
        let got = {
            let read = pin!(stream.read_some());
            timer.read(read, Some(until), false).await
        };
        match got {
            Some(b) => drained += b.len(),
            None => return,
        }
    }
}
