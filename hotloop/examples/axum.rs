//! An axum application on hotloop: the same `Router` you would hand to
//! `axum::serve` on tokio, served by `serve_hyper` on every core.
//!
//! ```text
//! cargo run --release --features hyper,tower --example axum -- 127.0.0.1:3000
//! curl http://127.0.0.1:3000/
//! curl http://127.0.0.1:3000/users/7
//! curl -d 'ping' http://127.0.0.1:3000/echo
//! curl -i http://127.0.0.1:3000/slow        # 408 after one second
//! curl http://127.0.0.1:3000/banner/22       # the first bytes 127.0.0.1:22 sends
//! curl http://127.0.0.1:3000/uptime          # read with hotloop::fs
//! ```
//!
//! Stop it with Ctrl-C: the server stops accepting, lets each connection
//! finish the request it is serving, and exits.
//!
//! What changes from tokio: handlers and layers run on a hotloop worker.
//! `hotloop::time` works in them as it is, and so does `tokio::time` (the
//! default feature `tokio-time`); the timeout layer here is
//! `hotloop::tower::TimeoutLayer`, on the worker's own timers. hotloop's
//! sockets, files and processes belong to their worker, so their futures
//! are not `Send`, which axum demands of a handler's: a handler runs them
//! through `hotloop::task::run_local` (see `banner` and `uptime`). A
//! handler that panics is answered `500`.

use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use tower::ServiceBuilder;

use hotloop::hyper::{serve_hyper, TowerToHyperService};
use hotloop::net::ListenerOptions;
use hotloop::signal::ShutdownSignals;
use hotloop::tower::TimeoutLayer;
use hotloop::Runtime;

#[derive(Serialize)]
struct User {
    id: u64,
    name: String,
}

async fn index() -> &'static str {
    "hello from axum on hotloop\n"
}

async fn user(Path(id): Path<u64>) -> Json<User> {
    Json(User { id, name: format!("user {id}") })
}

async fn echo(body: String) -> String {
    body
}

/// Takes longer than the timeout below allows.
async fn slow() -> &'static str {
    hotloop::time::sleep(Duration::from_secs(5)).await;
    "too late\n"
}

/// hotloop I/O from a handler. axum wants every handler's future to be
/// `Send`, and a hotloop `TcpStream` is not (it belongs to its worker), so
/// `run_local` runs the I/O as a task of this worker and hands back a
/// `Send` future of its result (a panic in it comes back as an
/// `io::Error`). When the timeout drops that future, the task is aborted.
async fn banner(Path(port): Path<u16>) -> Result<Vec<u8>, (StatusCode, String)> {
    let io = hotloop::task::run_local(async move {
        let stream = hotloop::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let (res, buf) = stream.read_owned(Vec::with_capacity(256)).await;
        res.map(|_| buf)
    });
    match hotloop::time::timeout(Duration::from_millis(500), io).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => Err((StatusCode::BAD_GATEWAY, format!("127.0.0.1:{port}: {e}\n"))),
        Err(_) => Err((StatusCode::GATEWAY_TIMEOUT, format!("127.0.0.1:{port} sent nothing\n"))),
    }
}

/// A file read with `hotloop::fs` (a ring operation on io_uring), through
/// `run_local` for the same reason.
async fn uptime() -> Result<String, StatusCode> {
    hotloop::task::run_local(hotloop::fs::read_to_string("/proc/uptime"))
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)
}

/// The application: routes, then a one-second limit on every request.
pub fn app() -> Router {
    Router::new()
        .route("/", get(index))
        .route("/users/{id}", get(user))
        .route("/echo", post(echo))
        .route("/slow", get(slow))
        .route("/banner/{port}", get(banner))
        .route("/uptime", get(uptime))
        .layer(
            ServiceBuilder::new()
                // Turns the timeout's error into a response.
                .layer(HandleErrorLayer::new(|_: hotloop::tower::BoxError| async {
                    StatusCode::REQUEST_TIMEOUT
                }))
                .layer(TimeoutLayer::new(Duration::from_secs(1))),
        )
}

fn main() -> std::io::Result<()> {
    // Take SIGINT/SIGTERM from now on, so `wait` below gets them.
    let signals = ShutdownSignals::block()?;
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:3000".into());

    let rt = Runtime::builder().build()?;
    let router = app();
    // One `Router` clone per connection (a reference count), adapted from
    // tower's `Service` trait to hyper's.
    let server = serve_hyper(rt.handle(), addr.as_str(), ListenerOptions::default(), move || {
        TowerToHyperService::new(router.clone())
    })?;
    println!(
        "axum on hotloop at http://{} ({} workers)",
        server.local_addr(),
        rt.handle().workers()
    );

    // The workers serve on their own threads; this one waits for Ctrl-C.
    let signal = signals.wait()?;
    println!("{signal:?}: finishing requests in flight");
    let cut = server.shutdown_blocking(Duration::from_secs(10));
    println!("stopped ({cut} connections cut at the grace limit)");
    Ok(())
}
