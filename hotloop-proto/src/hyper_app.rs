//! The hyper service every `hyper` server in the bench runs: a fixed body
//! per request, after `--work-us` of work, so hotloop and tokio are compared
//! under the same service.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};

/// The response body: `size` bytes of `'x'`.
pub fn body(size: usize) -> Bytes {
    Bytes::from(vec![b'x'; size])
}

/// Answers one request with `body`.
pub async fn respond(
    body: Bytes,
    work_us: u64,
    _req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    crate::spin_work(work_us);
    Ok(Response::new(Full::new(body)))
}
