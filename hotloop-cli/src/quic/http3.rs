//! `serve h3`: HTTP/3 through `h3` and `h3-quinn`; every request gets
//! 200 and `--body-size` bytes. A request's HEADERS must come within
//! `--header-timeout-ms` of its stream, and each piece of its answer must
//! go out within `--send-timeout-ms`; past either the stream is reset. A
//! stopping server sends GOAWAY first.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use h3::error::Code;
use h3::quic::SendStream as _;
use h3_quinn::BidiStream;
use hotloop::time::timeout;
use quinn::VarInt;

use super::settings::{Settings, CLOSE_REASON, CLOSE_STOPPING_H3};
use super::streams::{streams_done, Open, Streams};
use crate::drain;

/// The most body bytes sent under one send-timeout clock: a stream whose
/// client reads slowly but reads is not reset.
const BODY_CHUNK_BYTES: usize = 64 * 1024;

/// A request before its head is read.
type Resolver = h3::server::RequestResolver<h3_quinn::Connection, Bytes>;
/// A request's stream once its head is read.
type RequestStream = h3::server::RequestStream<BidiStream<Bytes>, Bytes>;
/// A server connection.
type H3 = h3::server::Connection<h3_quinn::Connection, Bytes>;

/// HTTP/3: a task per request; when the server stops, GOAWAY, then the
/// requests in flight are answered and the connection closes.
pub(super) async fn h3_connection(conn: quinn::Connection, body: &Bytes, settings: &Arc<Settings>) {
    let mut h3 = match H3::new(h3_quinn::Connection::new(conn.clone())).await {
        Ok(h3) => h3,
        Err(_) => return,
    };
    let requests = Rc::new(Streams::default());
    loop {
        match drain::until_stop(h3.accept()).await {
            Some(Ok(Some(resolver))) => {
                let open = Open::new(requests.clone());
                drop(hotloop::spawn(h3_request(resolver, body.clone(), settings.clone(), open)));
            }
            // The client sent GOAWAY and its requests are done, or the connection ended.
            Some(Ok(None) | Err(_)) => return,
            None => break,
        }
    }
    // GOAWAY naming the stream after the last request accepted (h3 adds
    // the count given to the last accepted id): the client learns that
    // every request it sent so far is answered. Naming the last accepted
    // itself (`shutdown(0)`) told it that one was not processed (RFC 9114
    // section 5.2), and a client may send such a request elsewhere again.
    let in_flight = requests.open.get() > 0;
    if timeout(LINGER_MAX, h3.shutdown(1)).await.is_ok() {
        if !answered_refusing_later(&mut h3, &requests, &conn).await {
            return;
        }
        // h3 does not say when the client has acknowledged an answer's
        // last bytes (closing now could lose them): a client done with its
        // requests closes by itself, else it has this long.
        if in_flight && timeout(LINGER_MAX, conn.closed()).await.is_ok() {
            return;
        }
    }
    conn.close(VarInt::from_u32(CLOSE_STOPPING_H3), CLOSE_REASON);
}

/// h3 on a stop: how long sending GOAWAY may take, and how long a client
/// that had requests in flight has to close by itself once they are answered.
const LINGER_MAX: Duration = Duration::from_secs(1);

/// After GOAWAY: waits until the requests accepted are answered (`true`)
/// or the client closed the connection (`false`), accepting meanwhile so
/// that a request sent after GOAWAY is refused with H3_REQUEST_REJECTED
/// (the client may send it again elsewhere) rather than left unanswered
/// until the close. h3 refuses those past GOAWAY's id itself and lets the
/// one at it through, which is refused here: every request h3 yields now
/// is at or past that id, which GOAWAY said would not be processed.
async fn answered_refusing_later(
    h3: &mut H3,
    requests: &Streams,
    conn: &quinn::Connection,
) -> bool {
    loop {
        let next = {
            let mut done = pin!(streams_done(requests, conn));
            let mut accept = pin!(h3.accept());
            poll_fn(|cx| match done.as_mut().poll(cx) {
                Poll::Ready(done) => Poll::Ready(Err(done)),
                Poll::Pending => accept.as_mut().poll(cx).map(Ok),
            })
            .await
        };
        match next {
            Err(done) => return done,
            Ok(Ok(Some(mut resolver))) => refuse(&mut resolver, Code::H3_REQUEST_REJECTED),
            // The client sent GOAWAY too and every request is done.
            Ok(Ok(None)) => return true,
            Ok(Err(_)) => return false,
        }
    }
}

/// Resets a request's stream before its head is read (dropping the
/// resolver then stops the client's side). h3 0.0.8 offers no other way
/// to end a request before its HEADERS: its stream is the resolver's
/// `frame_stream`. Dropped unreset, the stream would be finished, an
/// empty answer the client takes for a broken one.
fn refuse(resolver: &mut Resolver, code: Code) {
    resolver.frame_stream.reset(code.value());
}

/// Runs `f` within `limit` (`None`: no limit); false if it failed or ran out.
async fn within<T, E>(limit: Option<Duration>, f: impl Future<Output = Result<T, E>>) -> bool {
    match limit {
        Some(limit) => matches!(timeout(limit, f).await, Ok(Ok(_))),
        None => f.await.is_ok(),
    }
}

/// One HTTP/3 request: 200 and the body (no body for HEAD). Its HEADERS
/// must come within the header timeout (then the stream is reset with
/// H3_REQUEST_REJECTED: it was not processed), and each piece of the
/// answer must go out within the send timeout (then H3_REQUEST_CANCELLED,
/// as `quic` resets an echo the client does not read): a client that
/// sends no HEADERS or reads nothing, and keeps its connection alive,
/// holds the request, its `--maxconn` slot and a drain no longer.
async fn h3_request(mut resolver: Resolver, body: Bytes, s: Arc<Settings>, _open: Open) {
    let head = poll_fn(|cx| resolver.frame_stream.poll_next(cx));
    let frame = match s.header_timeout {
        Some(limit) => match timeout(limit, head).await {
            Ok(frame) => frame,
            Err(_) => return refuse(&mut resolver, Code::H3_REQUEST_REJECTED),
        },
        None => head.await,
    };
    let Ok(resolved) = resolver.accept_with_frame(frame) else { return };
    // Resolving sends 431 for a head too large: an answer like any other.
    let resolve = resolved.resolve();
    let resolved = match s.send_timeout {
        Some(limit) => timeout(limit, resolve).await,
        None => Ok(resolve.await),
    };
    let Ok(Ok((request, mut stream))) = resolved else { return };
    hotloop_proto::spin_work(s.work_us);
    if !answer(&request, &mut stream, body, s.send_timeout).await {
        stream.stop_stream(Code::H3_REQUEST_CANCELLED);
        stream.stop_sending(Code::H3_REQUEST_CANCELLED);
    }
}

/// Sends the answer, each piece within `limit`; false if one failed or ran out.
async fn answer(
    request: &http::Request<()>,
    stream: &mut RequestStream,
    body: Bytes,
    limit: Option<Duration>,
) -> bool {
    let response = http::Response::builder()
        .status(http::StatusCode::OK)
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(());
    let Ok(response) = response else { return false };
    if !within(limit, stream.send_response(response)).await {
        return false;
    }
    if request.method() != http::Method::HEAD {
        let mut left = body;
        while !left.is_empty() {
            let piece = left.split_to(left.len().min(BODY_CHUNK_BYTES));
            if !within(limit, stream.send_data(piece)).await {
                return false;
            }
        }
    }
    within(limit, stream.finish()).await
}
