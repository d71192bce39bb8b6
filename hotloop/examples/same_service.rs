//! The servers behind the TLS and axum figures in BENCHMARKS.md: the same
//! hyper service over rustls, and the same axum `Router`, on hotloop (one
//! worker, either driver) and on a tokio current-thread runtime.
//! `scripts/bench_tls_axum.sh` starts them and drives them with `wrk` and
//! `h2load`.
//!
//! ```text
//! tls_axum_peers tls hotloop epoll|uring ADDR CERT KEY
//! tls_axum_peers tls tokio ADDR CERT KEY
//! tls_axum_peers axum hotloop epoll|uring ADDR
//! tls_axum_peers axum tokio ADDR
//! tls_axum_peers cert DIR        # writes DIR/cert.pem and DIR/key.pem
//! ```
//!
//! Both sides use the same rustls configuration
//! (`hotloop::tls::server_config`, ring, ALPN h2 and http/1.1), the same
//! hyper connection builder (`hyper_util`'s auto builder) and `TCP_NODELAY`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Path;
use axum::routing::get;
use axum::{Json, Router};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use serde::Serialize;

use hotloop::hyper::{serve_hyper, serve_hyper_tls, TowerToHyperService};
use hotloop::net::ListenerOptions;
use hotloop::tls::{
    load_certs, load_private_key, server_config, TlsAcceptor, ALPN_H2, ALPN_HTTP11,
};
use hotloop::{DriverKind, Runtime};

const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

#[derive(Serialize)]
struct User {
    id: u64,
    name: String,
}

fn router() -> Router {
    Router::new().route("/", get(|| async { "hello world\n" })).route(
        "/users/{id}",
        get(|Path(id): Path<u64>| async move { Json(User { id, name: format!("user {id}") }) }),
    )
}

fn tls_config(cert: &str, key: &str) -> hotloop::tls::rustls::ServerConfig {
    server_config(
        load_certs(cert).unwrap(),
        load_private_key(key).unwrap(),
        &[ALPN_H2, ALPN_HTTP11],
    )
    .unwrap()
}

fn hotloop_runtime(driver: &str) -> Runtime {
    let driver: DriverKind = driver.parse().unwrap();
    Runtime::builder().workers(1).driver(driver).build().unwrap()
}

fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Serves `make_service()` per connection on tokio, TLS first if `tls` is set.
fn tokio_serve<S, F>(addr: &str, tls: Option<tokio_rustls::TlsAcceptor>, make_service: F) -> !
where
    F: Fn() -> S + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = Response<axum::body::Body>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let rt = tokio_runtime();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        println!("listening on {}", listener.local_addr().unwrap());
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            let service = make_service();
            let tls = tls.clone();
            tokio::spawn(async move {
                let mut builder = auto::Builder::new(TokioExecutor::new());
                builder.http1().timer(TokioTimer::new()).keep_alive(true);
                builder.http2().timer(TokioTimer::new());
                match tls {
                    Some(acceptor) => {
                        let Ok(Ok(tls)) =
                            tokio::time::timeout(HANDSHAKE_LIMIT, acceptor.accept(stream)).await
                        else {
                            return;
                        };
                        let _ = builder.serve_connection(TokioIo::new(tls), service).await;
                    }
                    None => {
                        let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                    }
                }
            });
        }
    });
    unreachable!("the accept loop never ends")
}

/// A fixed 12-byte answer, with the body type the axum services use, so one
/// tokio server function serves both.
fn hello_boxed() -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<axum::body::Body>,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<Response<axum::body::Body>, Infallible>> + Send,
> + Send {
    fixed_body(bytes::Bytes::from_static(b"hello world\n"))
}

/// A fixed answer of `body`'s bytes (cloned, not copied, per request).
fn fixed_body(
    body: bytes::Bytes,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<axum::body::Body>,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<Response<axum::body::Body>, Infallible>> + Send,
> + Send {
    service_fn(move |_req: Request<Incoming>| {
        let body = body.clone();
        async move { Ok::<_, Infallible>(Response::new(axum::body::Body::from(body))) }
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a.as_slice() {
        ["hyper", "hotloop", driver, addr, size] => {
            let rt = hotloop_runtime(driver);
            let body = bytes::Bytes::from(vec![b'x'; size.parse().unwrap()]);
            let server = serve_hyper(rt.handle(), *addr, ListenerOptions::default(), move || {
                fixed_body(body.clone())
            })
            .unwrap();
            println!("listening on {}", server.local_addr());
            rt.block_on(server.stopped()).unwrap();
        }
        ["hyper", "tokio", addr, size] => {
            let body = bytes::Bytes::from(vec![b'x'; size.parse().unwrap()]);
            tokio_serve(addr, None, move || fixed_body(body.clone()));
        }
        ["axum-tls", "hotloop", driver, addr, cert, key] => {
            let rt = hotloop_runtime(driver);
            let acceptor =
                TlsAcceptor::new(tls_config(cert, key)).handshake_timeout(HANDSHAKE_LIMIT);
            let app = router();
            let server = serve_hyper_tls(
                rt.handle(),
                *addr,
                ListenerOptions::default(),
                acceptor,
                move || TowerToHyperService::new(app.clone()),
            )
            .unwrap();
            println!("listening on {}", server.local_addr());
            rt.block_on(server.stopped()).unwrap();
        }
        ["axum-tls", "tokio", addr, cert, key] => {
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls_config(cert, key)));
            let app = router();
            tokio_serve(addr, Some(acceptor), move || TowerToHyperService::new(app.clone()));
        }
        ["cert", dir] => {
            let cert =
                rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
                    .unwrap();
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(format!("{dir}/cert.pem"), cert.cert.pem()).unwrap();
            std::fs::write(format!("{dir}/key.pem"), cert.key_pair.serialize_pem()).unwrap();
        }
        ["tls", "hotloop", driver, addr, cert, key] => {
            let rt = hotloop_runtime(driver);
            let acceptor =
                TlsAcceptor::new(tls_config(cert, key)).handshake_timeout(HANDSHAKE_LIMIT);
            let server = serve_hyper_tls(
                rt.handle(),
                *addr,
                ListenerOptions::default(),
                acceptor,
                hello_boxed,
            )
            .unwrap();
            println!("listening on {}", server.local_addr());
            rt.block_on(server.stopped()).unwrap();
        }
        ["tls", "tokio", addr, cert, key] => {
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls_config(cert, key)));
            tokio_serve(addr, Some(acceptor), hello_boxed);
        }
        ["axum", "hotloop", driver, addr] => {
            let rt = hotloop_runtime(driver);
            let app = router();
            let server = serve_hyper(rt.handle(), *addr, ListenerOptions::default(), move || {
                TowerToHyperService::new(app.clone())
            })
            .unwrap();
            println!("listening on {}", server.local_addr());
            rt.block_on(server.stopped()).unwrap();
        }
        ["axum", "tokio", addr] => {
            let app = router();
            tokio_serve(addr, None, move || TowerToHyperService::new(app.clone()));
        }
        _ => {
            eprintln!("usage: see the module documentation of examples/tls_axum_peers.rs");
            std::process::exit(2);
        }
    }
}
