//! A request body the server has no use for, read and dropped before
//! the answer ([`discard_body`]): a `GET` or `HEAD` may carry one, and
//! nginx serves such a request, dropping the body.

use std::pin::pin;
use std::time::{Duration, Instant};

use hotloop_proto::{Body, BodySkip};

use super::{Conn, ConnTimer, Pending};

/// How a [`discard_body`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Discarded {
    /// The body is read; what came after it is in `pending`.
    Done,
    /// Answer with this status and close: `400` for a chunked coding that
    /// is not one, `413` for a body over the limit, `408` for one that
    /// stopped coming.
    Refuse(u16),
    /// The client ended the connection, or a read failed.
    Cut,
}

/// Reads and drops a request body framed as `body`, starting with the
/// bytes in `pending` (all that came after the head); the bytes after
/// its end stay in `pending` for the next request. Each read waits at
/// most `idle_timeout` (nginx's `client_body_timeout` bounds each read of
/// a body too); the body itself is bounded by
/// [`hotloop_proto::REQUEST_BODY_MAX_BYTES`].
///
/// Read before the answer rather than after it: the connection reads and
/// writes in turn, so a client that sends its whole body before it reads
/// would otherwise wait on a server writing a large answer while the
/// server waits on the client to read it.
pub(crate) async fn discard_body<S: Conn>(
    stream: &mut S,
    timer: &mut ConnTimer,
    body: Body,
    pending: &mut Pending,
    idle_timeout: Option<Duration>,
) -> Discarded {
    let mut skip = BodySkip::new(body);
    let at_hand = pending.bytes().len();
    match skip.feed(pending.bytes()) {
        Ok(Some(n)) => {
            pending.consume(n);
            return Discarded::Done;
        }
        Ok(None) => pending.consume(at_hand),
        Err(status) => return Discarded::Refuse(status),
    }
    loop {
        let deadline = idle_timeout.map(|t| hotloop::time::now() + t);
        let got = {
            let read = pin!(stream.read_some());
            timer.read(read, deadline, false).await
        };
        let Some(buf) = got else {
            // The clock itself: the deadline fires by it (the turn's reading may lag).
            return match deadline {
                Some(d) if Instant::now() >= d => Discarded::Refuse(408),
                _ => Discarded::Cut,
            };
        };
        match skip.feed(&buf) {
            Ok(Some(n)) => {
                pending.extend_from_slice(&buf[n..]);
                return Discarded::Done;
            }
            Ok(None) => {}
            Err(status) => return Discarded::Refuse(status),
        }
    }
}
