//! A hyper service on hotloop, on every core: HTTP/1.1, and HTTP/2 by
//! prior knowledge (cleartext).
//!
//! ```text
//! cargo run --release --features hyper --example hyper_server -- 127.0.0.1:3000
//! curl http://127.0.0.1:3000/hello
//! curl --http2-prior-knowledge http://127.0.0.1:3000/hello
//! ```

use std::convert::Infallible;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};

use hotloop::hyper::serve_hyper;
use hotloop::net::ListenerOptions;
use hotloop::Runtime;

/// Answers every request with a greeting that names the path and the protocol version.
async fn hello(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = format!("hello from hotloop: {} over {:?}\n", req.uri().path(), req.version());
    Ok(Response::new(Full::new(Bytes::from(body))))
}

fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:3000".into());
    let rt = Runtime::builder().build()?;
    let server =
        serve_hyper(rt.handle(), addr.as_str(), ListenerOptions::default(), || service_fn(hello))?;
    println!("hyper on hotloop at http://{}", server.local_addr());
    rt.block_on(server.stopped())
}
