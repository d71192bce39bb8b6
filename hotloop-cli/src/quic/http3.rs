//! `serve h3`: HTTP/3 through `h3` and `h3-quinn`; every request gets
//! 200 and `--body-size` bytes. A stopping server sends GOAWAY first.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use hotloop::time::timeout;
use quinn::VarInt;

use super::settings::{Settings, CLOSE_REASON, CLOSE_STOPPING_H3};
use super::streams::{streams_done, Open, Streams};
use crate::drain;

/// HTTP/3: a task per request; when the server stops, GOAWAY, then the
/// requests in flight are answered and the connection closes.
pub(super) async fn h3_connection(
    conn: quinn::Connection,
    body: &bytes::Bytes,
    settings: &Arc<Settings>,
) {
    let mut h3 = match h3::server::Connection::<_, bytes::Bytes>::new(h3_quinn::Connection::new(
        conn.clone(),
    ))
    .await
    {
        Ok(h3) => h3,
        Err(_) => return,
    };
    let requests = Rc::new(Streams::default());
    loop {
        match drain::until_stop(h3.accept()).await {
            Some(Ok(Some(resolver))) => {
                let open = Open::new(requests.clone());
                drop(hotloop::spawn(h3_request(resolver, body.clone(), settings.work_us, open)));
            }
            // The client sent GOAWAY and its requests are done, or the connection ended.
            Some(Ok(None) | Err(_)) => return,
            None => break,
        }
    }
    // GOAWAY: the requests accepted so far are answered, no more are taken.
    let in_flight = requests.open.get() > 0;
    if timeout(LINGER_MAX, h3.shutdown(0)).await.is_ok() {
        if !streams_done(&requests, &conn).await {
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

/// One HTTP/3 request: 200 and the body (no body for HEAD).
async fn h3_request<C>(
    resolver: h3::server::RequestResolver<C, bytes::Bytes>,
    body: bytes::Bytes,
    work_us: u64,
    _open: Open,
) where
    C: h3::quic::Connection<bytes::Bytes>,
{
    let Ok((request, mut stream)) = resolver.resolve_request().await else { return };
    hotloop_proto::spin_work(work_us);
    let response = http::Response::builder()
        .status(http::StatusCode::OK)
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(());
    let Ok(response) = response else { return };
    if stream.send_response(response).await.is_err() {
        return;
    }
    if request.method() != http::Method::HEAD
        && !body.is_empty()
        && stream.send_data(body).await.is_err()
    {
        return;
    }
    let _ = stream.finish().await;
}
