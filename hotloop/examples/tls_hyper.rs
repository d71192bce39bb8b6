//! HTTPS with HTTP/2 and HTTP/1.1 on hotloop: a hyper service behind
//! rustls, on every core.
//!
//! ```text
//! # with your own certificate and key (PEM):
//! cargo run --release --features tls,hyper --example tls_hyper -- 127.0.0.1:8443 cert.pem key.pem
//! # or let the example make a self-signed one for `localhost`:
//! cargo run --release --features tls,hyper --example tls_hyper
//! curl --cacert <printed path> https://localhost:8443/hello          # HTTP/2 (ALPN h2)
//! curl --cacert <printed path> --http1.1 https://localhost:8443/hello
//! ```
//!
//! The acceptor offers ALPN `h2` and `http/1.1`; hyper serves whichever
//! the client picked. A handshake that does not finish within five seconds
//! (garbage, an old TLS version, a client that stalls) ends that
//! connection and nothing else.

use std::convert::Infallible;
use std::path::PathBuf;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};

use hotloop::hyper::serve_hyper_tls;
use hotloop::net::ListenerOptions;
use hotloop::tls::TlsAcceptor;
use hotloop::Runtime;

/// Answers with the path and the HTTP version the client negotiated.
async fn hello(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = format!("hello over TLS: {} as {:?}\n", req.uri().path(), req.version());
    Ok(Response::new(Full::new(Bytes::from(body))))
}

/// Writes a self-signed certificate for `localhost` and 127.0.0.1 to the
/// temporary directory and returns the paths of the certificate and key.
fn self_signed() -> std::io::Result<(PathBuf, PathBuf)> {
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let cert = rcgen::generate_simple_self_signed(names).map_err(std::io::Error::other)?;
    let dir = std::env::temp_dir().join(format!("hotloop-tls-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_path, cert.cert.pem())?;
    std::fs::write(&key_path, cert.key_pair.serialize_pem())?;
    Ok((cert_path, key_path))
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:8443".into());
    let (cert, key) = match (args.next(), args.next()) {
        (Some(cert), Some(key)) => (cert.into(), key.into()),
        _ => {
            let paths = self_signed()?;
            println!("self-signed certificate: {}", paths.0.display());
            paths
        }
    };

    let acceptor =
        TlsAcceptor::from_pem_files(&cert, &key)?.handshake_timeout(Duration::from_secs(5));
    let rt = Runtime::builder().build()?;
    let server =
        serve_hyper_tls(rt.handle(), addr.as_str(), ListenerOptions::default(), acceptor, || {
            service_fn(hello)
        })?;
    println!("https://{} (h2 and http/1.1)", server.local_addr());
    rt.block_on(server.stopped())
}
