//! hyper on hotloop with real clients: curl over HTTP/1.1 and HTTP/2 prior
//! knowledge, a hyper client on hotloop against a tokio server, and a hyper
//! client on tokio against hotloop.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Command;

use bytes::Bytes;
use hotloop::DriverKind;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use hotloop::hyper::{serve_hyper, HotloopExecutor, HyperIo};
use hotloop::net::{ListenerOptions, Server};
use hotloop::Runtime;

async fn hello(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    Ok(Response::new(Full::new(Bytes::from(format!("hello {}", body.len())))))
}

fn hotloop_hyper_server(driver: DriverKind) -> (Runtime, Server, SocketAddr) {
    let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
    let server =
        serve_hyper(rt.handle(), "127.0.0.1:0", ListenerOptions::default(), || service_fn(hello))
            .unwrap();
    let addr = server.local_addr();
    (rt, server, addr)
}

#[hotloop::test(driver = "all")]
fn curl_speaks_http1_and_http2_prior_knowledge(driver: DriverKind) {
    if Command::new("curl").arg("--version").output().is_err() {
        eprintln!("skipped: curl is not installed");
        return;
    }
    let (_rt, _server, addr) = hotloop_hyper_server(driver);
    let url = format!("http://{addr}/x");
    for flag in ["--http1.1", "--http2-prior-knowledge"] {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", "-w", " %{http_version}", flag, "-d", "abc", &url])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "curl {flag}: {}", String::from_utf8_lossy(&out.stderr));
        let expected_version = if flag == "--http1.1" { "1.1" } else { "2" };
        assert_eq!(text, format!("hello 3 {expected_version}"), "curl {flag}");
    }
}

#[hotloop::test(driver = "all")]
fn hyper_client_on_tokio_against_hotloop(driver: DriverKind) {
    let (_rt, _server, addr) = hotloop_hyper_server(driver);
    let tokio_rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let body = tokio_rt.block_on(async move {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        let mut bodies = Vec::new();
        for i in 0..3 {
            let req = Request::post("/").body(Full::new(Bytes::from(vec![b'a'; i * 10]))).unwrap();
            let resp = sender.send_request(req).await.unwrap();
            bodies.push(resp.into_body().collect().await.unwrap().to_bytes());
        }
        bodies
    });
    assert_eq!(
        body,
        vec![Bytes::from("hello 0"), Bytes::from("hello 10"), Bytes::from("hello 20")]
    );
}

#[hotloop::test(driver = "all")]
fn hyper_client_on_hotloop_against_tokio(driver: DriverKind) {
    // A hyper server on a tokio current-thread runtime, in its own thread.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), service_fn(hello))
                        .await;
                });
            }
        });
    });
    let addr = rx.recv().unwrap();
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let got = rt.block_on(async move {
        let stream = hotloop::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(HyperIo::new(stream)).await.unwrap();
        hotloop::spawn(conn);
        let req = Request::post("/").body(Full::new(Bytes::from_static(b"12345"))).unwrap();
        let resp = sender.send_request(req).await.unwrap();
        resp.into_body().collect().await.unwrap().to_bytes()
    });
    assert_eq!(got, Bytes::from("hello 5"));
    let _ = HotloopExecutor; // the executor type is public for hyper's builders
}

/// hyper's header-read timeout runs on hotloop's timer (`HotloopTimer`,
/// whose `now` is the loop's reading of the turn): a client that never
/// finishes its request head is cut off once the timeout passes, and not
/// before.
#[hotloop::test(driver = "all")]
async fn hypers_header_timeout_cuts_off_a_client_that_never_finishes_its_head() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

    let listener = hotloop::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let client = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let start = Instant::now();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        (start.elapsed(), String::from_utf8_lossy(&rest).to_string())
    });
    let (stream, _) = listener.accept().await.unwrap();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(hotloop::hyper::HotloopTimer).header_read_timeout(Duration::from_millis(300));
    let served = builder.serve_connection(HyperIo::new(stream), service_fn(hello)).await;
    assert!(served.is_err(), "hyper ended the connection without a timeout error");
    let (took, reply) = hotloop::spawn_blocking(move || client.join().unwrap()).await.unwrap();
    // hyper counts from the loop's reading of the turn in which it began
    // the head, which may come before the client's own clock reading by a
    // turn; a loaded machine makes that turn longer.
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(4),
        "closed after {took:?}"
    );
    // hyper answers a header timeout with 408 where it can, or just closes.
    assert!(reply.is_empty() || reply.starts_with("HTTP/1.1 408"), "{reply}");
}

/// A service answers an `Upgrade` request `101` and registers its protocol
/// with the request's `OnUpgrade`: after the answer the connection runs it
/// (here an echo that first says hello), with the bytes the client sent
/// right after its request first; the server's peer-aware variant tells
/// the service its client's address.
#[hotloop::test(driver = "all")]
fn an_upgrade_runs_the_services_protocol_on_the_connection(driver: DriverKind) {
    use std::io::{Read, Write};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let make = |peer: SocketAddr| {
        service_fn(move |req: Request<Incoming>| async move {
            let Some(on) = req.extensions().get::<hotloop::hyper::OnUpgrade>().copied() else {
                return Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                    "plain {}",
                    peer.ip()
                )))));
            };
            let echo = |mut io: hotloop::hyper::Upgraded| async move {
                let _ = io.write_all(b"hi;").await;
                let mut buf = [0u8; 64];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = io.shutdown().await;
            };
            assert!(on.run(echo).is_ok());
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = hyper::StatusCode::SWITCHING_PROTOCOLS;
            r.headers_mut().insert("upgrade", "echo".parse().unwrap());
            r.headers_mut().insert("connection", "upgrade".parse().unwrap());
            Ok(r)
        })
    };
    let server = hotloop::hyper::serve_hyper_with_peer(
        rt.handle(),
        "127.0.0.1:0",
        ListenerOptions::default(),
        make,
    )
    .unwrap();
    let mut s = std::net::TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").unwrap();
    let mut plain = String::new();
    s.read_to_string(&mut plain).unwrap();
    assert!(plain.ends_with("plain 127.0.0.1"), "{plain}");

    let mut s = std::net::TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nearly")
        .unwrap();
    let mut got = Vec::new();
    let want = b"hi;early";
    let mut buf = [0u8; 256];
    while !got.ends_with(want) {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "ended after {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got).to_string();
    assert!(text.starts_with("HTTP/1.1 101"), "{text}");
    s.write_all(b"more").unwrap();
    let mut back = [0u8; 4];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"more");
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    drop(server);
}

/// HTTP/2: a stream whose request body the client never sends (HEADERS
/// without END_STREAM, then nothing) holds a service that waits for the
/// body, and the idle timeout still ends the connection: only a stream
/// whose request came whole keeps the idle timeout waiting while the
/// service answers.
#[hotloop::test(driver = "all")]
fn http2_idle_timeout_ends_a_connection_whose_client_stopped_sending_a_body(driver: DriverKind) {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let options = hotloop::hyper::HyperOptions {
        idle_timeout: Some(Duration::from_millis(300)),
        ..hotloop::hyper::HyperOptions::from(ListenerOptions::default())
    };
    let server = serve_hyper(rt.handle(), "127.0.0.1:0", options, || {
        service_fn(|req: Request<Incoming>| async move {
            let n = req.into_body().collect().await.map_or(0, |b| b.to_bytes().len());
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(n.to_string()))))
        })
    })
    .unwrap();
    let mut s = std::net::TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    // An empty SETTINGS frame, then HEADERS on stream 1 with END_HEADERS
    // and no END_STREAM: `:method POST`, `:scheme http`, `:path /` from
    // HPACK's static table.
    s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
    s.write_all(&[0, 0, 3, 1, 4, 0, 0, 0, 1, 0x83, 0x86, 0x84]).unwrap();
    let started = Instant::now();
    let mut sink = [0u8; 4096];
    loop {
        match s.read(&mut sink) {
            Ok(0) | Err(_) if started.elapsed() < Duration::from_secs(7) => break,
            Ok(0) | Err(_) => panic!("the connection was still open after {:?}", started.elapsed()),
            Ok(_) => {}
        }
    }
    drop(server);
}
