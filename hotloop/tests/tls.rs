//! TLS with real clients and broken ones: curl over HTTP/1.1 and HTTP/2
//! (ALPN h2), `openssl s_client`, a hyper client on hotloop through
//! `TlsConnector`; and garbage, a TLS 1.0-only hello and a client that
//! stalls mid-handshake, each of which loses only its own connection,
//! within the handshake limit, while other connections keep working.
//! Needs `curl` and `openssl` (the tests that use them skip without).

use crate::common::{self, Certificate};

use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hotloop::DriverKind;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use hotloop::hyper::{serve_hyper_tls, HotloopExecutor};
use hotloop::net::{ListenerOptions, Server};
use hotloop::tls::{serve_tls, TlsAcceptor, TlsConnector, ALPN_H2, ALPN_HTTP11};
use hotloop::Runtime;

/// The handshake limit every server here uses.
const HANDSHAKE_LIMIT: Duration = Duration::from_millis(500);

/// A self-signed certificate for `localhost` and 127.0.0.1.
fn certificate() -> Certificate {
    common::certificate(&["localhost", "127.0.0.1"])
}

async fn hello(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let version = req.version();
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    Ok(Response::new(Full::new(Bytes::from(format!("hello {} {version:?}", body.len())))))
}

struct HttpsServer {
    rt: Runtime,
    server: Server,
    addr: SocketAddr,
    cert: Certificate,
}

fn https_server(driver: DriverKind) -> HttpsServer {
    let cert = certificate();
    let acceptor = TlsAcceptor::from_pem_files(&cert.path, &cert.key)
        .unwrap()
        .handshake_timeout(HANDSHAKE_LIMIT);
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    // The handle by value (a clone); `rt.handle()` by reference works as well.
    let handle: hotloop::Handle = rt.handle().clone();
    let server =
        serve_hyper_tls(handle, "127.0.0.1:0", ListenerOptions::default(), acceptor, || {
            service_fn(hello)
        })
        .unwrap();
    let addr = server.local_addr();
    HttpsServer { rt, server, addr, cert }
}

fn have(tool: &str) -> bool {
    let ok = Command::new(tool).arg("version").output().is_ok()
        || Command::new(tool).arg("--version").output().is_ok();
    if !ok {
        eprintln!("skipped: `{tool}` is not installed (apt-get install {tool})");
    }
    ok
}

/// One HTTPS request from a hyper client on a hotloop runtime, through
/// `TlsConnector`, offering `alpn`; returns the body.
fn hyper_client_request(
    driver: DriverKind,
    addr: SocketAddr,
    cert: &PathBuf,
    alpn: &'static [u8],
) -> String {
    let connector = TlsConnector::from_root_pem_file(cert, &[alpn]).unwrap();
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    rt.block_on(async move {
        let tls = connector.connect_to(addr, "localhost").await.unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn));
        let io = TokioIo::new(tls);
        let req = Request::post("https://localhost/")
            .body(Full::new(Bytes::from_static(b"abcd")))
            .unwrap();
        let resp = if alpn == ALPN_H2 {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(HotloopExecutor, io).await.unwrap();
            hotloop::spawn(conn);
            sender.send_request(req).await.unwrap()
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            hotloop::spawn(conn);
            sender.send_request(req).await.unwrap()
        };
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    })
}

/// A raw client that sends `bytes` and reports how long the server took
/// to end the connection, and whether it did.
fn time_until_closed(addr: SocketAddr, bytes: &[u8]) -> Option<Duration> {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let start = Instant::now();
    s.write_all(bytes).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => continue, // an alert, then the close
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Some(start.elapsed())
            }
            Err(e) => {
                eprintln!("still open after {:?}: {e}", start.elapsed());
                return None;
            }
        }
    }
}

/// A TLS 1.0 ClientHello with no `supported_versions` extension: a client
/// that speaks nothing newer than TLS 1.0.
fn tls10_client_hello() -> Vec<u8> {
    let mut body = vec![0x03, 0x01]; // client_version TLS 1.0
    body.extend_from_slice(&[7u8; 32]); // random
    body.push(0); // no session id
    body.extend_from_slice(&[0x00, 0x02, 0x00, 0x2f]); // TLS_RSA_WITH_AES_128_CBC_SHA
    body.extend_from_slice(&[0x01, 0x00]); // null compression
    let mut hs = vec![0x01, 0, (body.len() >> 8) as u8, body.len() as u8];
    hs.extend_from_slice(&body);
    let mut record = vec![0x16, 0x03, 0x01, (hs.len() >> 8) as u8, hs.len() as u8];
    record.extend_from_slice(&hs);
    record
}

#[hotloop::test(driver = "all")]
fn curl_speaks_http1_and_http2_over_tls(driver: DriverKind) {
    if !have("curl") {
        return;
    }
    let s = https_server(driver);
    let url = format!("https://localhost:{}/x", s.addr.port());
    let resolve = format!("localhost:{}:127.0.0.1", s.addr.port());
    let features =
        String::from_utf8_lossy(&Command::new("curl").arg("--version").output().unwrap().stdout)
            .to_string();
    let mut flags = vec![("--http1.1", "hello 3 HTTP/1.1 1.1")];
    if features.contains("HTTP2") {
        flags.push(("--http2", "hello 3 HTTP/2.0 2"));
    } else {
        eprintln!("this curl has no HTTP/2: only HTTP/1.1 checked");
    }
    for (flag, expected) in flags {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", "--cacert"])
            .arg(&s.cert.path)
            .args(["--resolve", &resolve, "-w", " %{http_version}", flag, "-d", "abc", &url])
            .output()
            .unwrap();
        assert!(out.status.success(), "curl {flag}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected, "curl {flag}");
    }
    drop(s.rt);
}

#[hotloop::test(driver = "all")]
fn openssl_s_client_verifies_and_negotiates_alpn(driver: DriverKind) {
    if !have("openssl") {
        return;
    }
    let s = https_server(driver);
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &s.addr.to_string(), "-servername", "localhost"])
        .args(["-verify_return_error", "-alpn", "http/1.1", "-ign_eof", "-CAfile"])
        .arg(&s.cert.path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let pid = child.id();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(15));
        // The pid is our own child's; it is gone (and this a no-op) once it exited.
        let _ = Command::new("kill").arg(pid.to_string()).status();
    });
    let out = child.wait_with_output().unwrap();
    drop(killer);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Verify return code: 0 (ok)"), "{text}");
    assert!(text.contains("ALPN protocol: http/1.1"), "{text}");
    assert!(text.contains("hello 0 HTTP/1.1"), "{text}");
}

#[hotloop::test(driver = "all")]
fn hyper_client_on_hotloop_over_tls_h2_and_http1(driver: DriverKind) {
    let s = https_server(driver);
    assert_eq!(hyper_client_request(driver, s.addr, &s.cert.path, ALPN_H2), "hello 4 HTTP/2.0");
    assert_eq!(hyper_client_request(driver, s.addr, &s.cert.path, ALPN_HTTP11), "hello 4 HTTP/1.1");
}

#[hotloop::test(driver = "all")]
fn failed_handshakes_end_within_the_limit_and_nothing_else(driver: DriverKind) {
    let s = https_server(driver);
    // Clients that stall halfway through a hello, held open throughout.
    let hello = tls10_client_hello();
    let stalled: Vec<_> = (0..20)
        .map(|_| {
            let mut c = std::net::TcpStream::connect(s.addr).unwrap();
            c.write_all(&hello[..10]).unwrap();
            c
        })
        .collect();

    // Garbage and a TLS 1.0-only hello are refused at once.
    let garbage = time_until_closed(s.addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").expect("closed");
    assert!(garbage < HANDSHAKE_LIMIT, "garbage took {garbage:?}");
    let old = time_until_closed(s.addr, &hello).expect("closed");
    assert!(old < HANDSHAKE_LIMIT, "a TLS 1.0 hello took {old:?}");

    // A good client is served while the stalled ones wait.
    assert_eq!(hyper_client_request(driver, s.addr, &s.cert.path, ALPN_H2), "hello 4 HTTP/2.0");

    // Each stalled client is cut at the handshake limit.
    let stalled_for = time_until_closed(s.addr, &hello[..10]).expect("a stalled handshake is cut");
    assert!(stalled_for >= HANDSHAKE_LIMIT - Duration::from_millis(50), "{stalled_for:?}");
    assert!(stalled_for < HANDSHAKE_LIMIT + Duration::from_secs(1), "{stalled_for:?}");
    let deadline = Instant::now() + Duration::from_secs(3);
    while s.server.active_connections() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(s.server.active_connections(), 0, "every stalled handshake ended");
    drop(stalled);
    assert_eq!(hyper_client_request(driver, s.addr, &s.cert.path, ALPN_HTTP11), "hello 4 HTTP/1.1");
}

#[hotloop::test(driver = "all")]
fn serve_tls_echo_with_the_tls_connector(driver: DriverKind) {
    let cert = certificate();
    let acceptor = TlsAcceptor::from_pem_files(&cert.path, &cert.key).unwrap();
    let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
    let server = serve_tls(
        rt.handle(),
        "127.0.0.1:0",
        ListenerOptions::default(),
        acceptor,
        |mut tls| async move {
            let mut buf = [0u8; 1024];
            while let Ok(n @ 1..) = tls.read(&mut buf).await {
                if tls.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        },
    )
    .unwrap();
    let addr = server.local_addr();
    let connector = TlsConnector::from_root_pem_file(&cert.path, &[]).unwrap();
    let got = rt.block_on(async move {
        let mut tls = connector.connect_to(("localhost", addr.port()), "localhost").await.unwrap();
        let mut out = Vec::new();
        for i in 0..10u8 {
            let msg = vec![i; 1000 + i as usize];
            tls.write_all(&msg).await.unwrap();
            let mut back = vec![0u8; msg.len()];
            tls.read_exact(&mut back).await.unwrap();
            out.push(back == msg);
        }
        out
    });
    assert!(got.iter().all(|ok| *ok));
    // A certificate for another name is refused by the connector.
    let connector = TlsConnector::from_root_pem_file(&cert.path, &[]).unwrap();
    let err =
        rt.block_on(async move { connector.connect_to(addr, "example.com").await.map(|_| ()) });
    assert!(err.is_err());
}
