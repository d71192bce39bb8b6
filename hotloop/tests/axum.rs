//! axum on hotloop through `serve_hyper`: the example's `Router` answers a
//! raw HTTP/1.1 client and `wrk` (if installed) without errors, the
//! hotloop `TimeoutLayer` turns a slow handler into 408, and a stopping
//! server lets hyper finish requests in flight (HTTP/1.1 and HTTP/2)
//! instead of cutting them at the grace limit.

#[allow(dead_code)]
#[path = "../examples/axum.rs"]
mod example;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use hotloop::DriverKind;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::rt::TokioIo;

use hotloop::hyper::{serve_hyper, HotloopExecutor, TowerToHyperService};
use hotloop::net::{ListenerOptions, Server};
use hotloop::Runtime;

fn serve_router(driver: DriverKind, workers: usize, router: Router) -> (Runtime, Server) {
    let rt = Runtime::builder().workers(workers).driver(driver).build().unwrap();
    let server = serve_hyper(rt.handle(), "127.0.0.1:0", ListenerOptions::default(), move || {
        TowerToHyperService::new(router.clone())
    })
    .unwrap();
    (rt, server)
}

/// Sends one HTTP/1.1 request on `s` and reads one response (with a
/// `content-length` body): (status line, headers, body).
fn request(
    s: &mut std::net::TcpStream,
    method: &str,
    path: &str,
    body: &str,
) -> (String, String, String) {
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    let status = head.lines().next().unwrap().to_string();
    (status, head, String::from_utf8(body).unwrap())
}

fn connect(addr: SocketAddr) -> std::net::TcpStream {
    let s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// True once the peer has closed `s` (EOF or reset) within `limit`.
fn closed_within(s: &mut std::net::TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

#[hotloop::test(driver = "all")]
fn the_example_router_answers_on_one_keep_alive_connection(driver: DriverKind) {
    let (_rt, server) = serve_router(driver, 2, example::app());
    let mut s = connect(server.local_addr());
    let (status, _, body) = request(&mut s, "GET", "/", "");
    assert_eq!(
        (status.as_str(), body.as_str()),
        ("http/1.1 200 ok", "hello from axum on hotloop\n")
    );
    let (status, head, body) = request(&mut s, "GET", "/users/7", "");
    assert_eq!(status, "http/1.1 200 ok");
    assert!(head.contains("content-type: application/json"), "{head}");
    assert_eq!(body, r#"{"id":7,"name":"user 7"}"#);
    let (_, _, body) = request(&mut s, "POST", "/echo", "ping");
    assert_eq!(body, "ping");
    let (status, _, _) = request(&mut s, "GET", "/missing", "");
    assert_eq!(status, "http/1.1 404 not found");
    // The hotloop timeout layer: /slow sleeps 5 s, the limit is 1 s.
    let start = Instant::now();
    let (status, _, _) = request(&mut s, "GET", "/slow", "");
    assert_eq!(status, "http/1.1 408 request timeout");
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(990) && took < Duration::from_secs(3), "{took:?}");
}

/// A `Send` handler does hotloop I/O (a socket, a file) through `run_local`.
#[hotloop::test(driver = "all")]
fn a_handler_awaits_hotloop_io_through_run_local(driver: DriverKind) {
    let (_rt, server) = serve_router(driver, 1, example::app());
    let banner = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = banner.local_addr().unwrap().port();
    let greeter = std::thread::spawn(move || {
        let (mut peer, _) = banner.accept().unwrap();
        peer.write_all(b"SSH-2.0-test\r\n").unwrap();
    });
    let mut s = connect(server.local_addr());
    let (status, _, body) = request(&mut s, "GET", &format!("/banner/{port}"), "");
    assert_eq!((status.as_str(), body.as_str()), ("http/1.1 200 ok", "SSH-2.0-test\r\n"));
    greeter.join().unwrap();
    let (status, _, body) = request(&mut s, "GET", "/uptime", "");
    assert_eq!(status, "http/1.1 200 ok");
    assert_eq!(body.split_whitespace().count(), 2, "{body}");
}

#[hotloop::test(driver = "all")]
fn wrk_keep_alive_has_no_errors(driver: DriverKind) {
    if Command::new("wrk").arg("--version").output().is_err() {
        eprintln!("skipped: `wrk` is not installed (apt-get install wrk)");
        return;
    }
    let (_rt, server) = serve_router(driver, 2, example::app());
    let url = format!("http://{}/users/1", server.local_addr());
    let out = Command::new("wrk")
        .args(["-t1", "-c16", "-d2s", "--timeout", "2s", &url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("Socket errors"), "{text}");
    assert!(!text.contains("Non-2xx"), "{text}");
    let requests: u64 = text
        .lines()
        .find_map(|l| l.trim().split_once(" requests in "))
        .map(|(n, _)| n.trim().parse().unwrap())
        .unwrap_or(0);
    assert!(requests > 100, "{text}");
}

#[hotloop::test(driver = "all")]
fn graceful_stop_finishes_http1_requests_in_flight(driver: DriverKind) {
    let router = Router::new().route("/", get(|| async { "quick" })).route(
        "/slow",
        get(|| async {
            hotloop::time::sleep(Duration::from_millis(500)).await;
            "finished"
        }),
    );
    let (_rt, server) = serve_router(driver, 1, router);
    let addr = server.local_addr();
    // An idle keep-alive connection and one with a request in flight.
    let mut idle = connect(addr);
    assert_eq!(request(&mut idle, "GET", "/", "").2, "quick");
    let busy = std::thread::spawn(move || {
        let mut s = connect(addr);
        let reply = request(&mut s, "GET", "/slow", "");
        (reply, closed_within(&mut s, Duration::from_secs(2)))
    });
    std::thread::sleep(Duration::from_millis(150));

    let start = Instant::now();
    let cut = server.shutdown_blocking(Duration::from_secs(10));
    let took = start.elapsed();
    assert_eq!(cut, 0, "no connection was cut at the grace limit");
    assert!(took < Duration::from_secs(3), "shutdown waited {took:?}, not for the grace limit");
    let ((status, head, body), closed) = busy.join().unwrap();
    assert_eq!((status.as_str(), body.as_str()), ("http/1.1 200 ok", "finished"));
    assert!(head.contains("connection: close"), "told the client it ends: {head}");
    assert!(closed, "the busy connection closed after its response");
    assert!(closed_within(&mut idle, Duration::from_secs(1)), "the idle connection was closed");
}

#[hotloop::test(driver = "all")]
fn graceful_stop_finishes_http2_streams_in_flight(driver: DriverKind) {
    let router = Router::new().route(
        "/slow",
        get(|| async {
            hotloop::time::sleep(Duration::from_millis(500)).await;
            "finished"
        }),
    );
    let (_rt, server) = serve_router(driver, 1, router);
    let addr = server.local_addr();
    let client = std::thread::spawn(move || {
        let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
        rt.block_on(async move {
            let stream = hotloop::net::TcpStream::connect(addr).await.unwrap();
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(HotloopExecutor, TokioIo::new(stream))
                    .await
                    .unwrap();
            let conn = hotloop::spawn(conn);
            let req = Request::get("http://t/slow").body(Empty::<Bytes>::new()).unwrap();
            let resp = sender.send_request(req).await.unwrap();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            // The server's GOAWAY ends the connection once the stream is done.
            let ended = hotloop::time::timeout(Duration::from_secs(2), conn).await.is_ok();
            (body, ended)
        })
    });
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    assert_eq!(server.shutdown_blocking(Duration::from_secs(10)), 0);
    assert!(start.elapsed() < Duration::from_secs(3));
    let (body, ended) = client.join().unwrap();
    assert_eq!(body, Bytes::from("finished"));
    assert!(ended, "the HTTP/2 connection ended after GOAWAY");
}

/// A handler bug: it panics before it answers.
async fn panics() -> &'static str {
    panic!("a handler bug")
}

/// A handler that panics is answered 500, not with an empty reply, and its
/// connection goes on serving: the next request on an HTTP/1.1 connection,
/// the other streams of an HTTP/2 one.
#[hotloop::test(driver = "all")]
fn a_panicking_handler_is_answered_500_and_its_connection_lives_on(driver: DriverKind) {
    let router = Router::new().route("/", get(|| async { "fine" })).route("/panic", get(panics));
    let (_rt, server) = serve_router(driver, 1, router);
    let addr = server.local_addr();
    let mut s = connect(addr);
    let (status, _, body) = request(&mut s, "GET", "/panic", "");
    assert_eq!((status.as_str(), body.as_str()), ("http/1.1 500 internal server error", ""));
    let (status, _, body) = request(&mut s, "GET", "/", "");
    assert_eq!((status.as_str(), body.as_str()), ("http/1.1 200 ok", "fine"));

    let client = std::thread::spawn(move || {
        let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
        rt.block_on(async move {
            let stream = hotloop::net::TcpStream::connect(addr).await.unwrap();
            let (sender, conn) =
                hyper::client::conn::http2::handshake(HotloopExecutor, TokioIo::new(stream))
                    .await
                    .unwrap();
            drop(hotloop::spawn(conn));
            let get = |path: &'static str| {
                let mut sender = sender.clone();
                async move {
                    let req = Request::get(format!("http://t{path}"))
                        .body(Empty::<Bytes>::new())
                        .unwrap();
                    let resp = sender.send_request(req).await.unwrap();
                    let status = resp.status().as_u16();
                    let body = resp.into_body().collect().await.unwrap().to_bytes();
                    (status, body)
                }
            };
            // Both streams at once on one connection, then one more after.
            let (bad, good) = futures_util::future::join(get("/panic"), get("/")).await;
            let after = get("/").await;
            (bad, good, after)
        })
    });
    let (bad, good, after) = client.join().unwrap();
    assert_eq!(bad, (500, Bytes::new()));
    assert_eq!(good, (200, Bytes::from("fine")));
    assert_eq!(after, (200, Bytes::from("fine")));
}

/// What a handler reaches of tokio works: `tokio::time` in an axum
/// handler answers, rather than panicking with "no reactor running".
#[cfg(feature = "tokio-time")]
#[hotloop::test(driver = "all")]
fn a_handler_calling_tokio_time_answers(driver: DriverKind) {
    let router = Router::new().route(
        "/deadline",
        get(|| async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            match tokio::time::timeout(Duration::from_millis(50), std::future::pending::<()>())
                .await
            {
                Ok(()) => "never",
                Err(_) => "timed out",
            }
        }),
    );
    let (_rt, server) = serve_router(driver, 2, router);
    let mut s = connect(server.local_addr());
    for _ in 0..3 {
        let (status, _, body) = request(&mut s, "GET", "/deadline", "");
        assert_eq!((status.as_str(), body.as_str()), ("http/1.1 200 ok", "timed out"));
    }
}
