//! `hotloop serve quic`: a quinn client (on hotloop, epoll) trusts the
//! certificate the server wrote with `--write-cert`, negotiates ALPN
//! `hotloop-echo`, has several streams and a 1 MiB one echoed; SIGTERM
//! lets a stream in flight finish, closes connections with code 0, and the
//! process exits 0 within the grace period; the idle timeout closes a
//! silent connection. `hotloop serve h3`: an HTTP/3 client (h3 over
//! h3-quinn) has requests answered, and SIGTERM closes its connection with
//! H3_NO_ERROR. The server runs on both drivers.

use crate::common;

use hotloop::DriverKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use common::Proc;
use hotloop::Runtime;
use quinn::{ClientConfig, ConnectionError, VarInt};

const LIMIT: Duration = Duration::from_secs(20);
const ALPN: &[u8] = b"hotloop-echo";

/// `hotloop serve quic` on `driver` with two workers, its certificate
/// written for the client; the process, its address and the client's
/// configuration.
fn serve_quic(driver: &str, extra: &[&str]) -> (Proc, SocketAddr, ClientConfig) {
    serve_app("quic", ALPN, driver, extra)
}

/// `hotloop serve APP` as [`serve_quic`] does, the client offering `alpn`.
fn serve_app(
    app: &str,
    alpn: &[u8],
    driver: &str,
    extra: &[&str],
) -> (Proc, SocketAddr, ClientConfig) {
    let dir = common::TempDir::new("quic");
    let cert = dir.join("cert.pem");
    let mut args =
        vec!["serve", app, "--addr", "127.0.0.1:0", "--workers", "2", "--driver", driver];
    args.extend_from_slice(&["--write-cert", cert.to_str().unwrap()]);
    args.extend_from_slice(extra);
    let mut p = Proc::start(&args);
    let addr = p.addr_after(" on ");
    assert!(p.wait_for_line("written to", LIMIT), "{:?}", p.seen);
    // The client's configuration holds the certificate; the file and its
    // directory go when this returns.
    (p, addr, common::quic_client_config(&cert, alpn))
}

/// The client's runtime: one worker on epoll, whatever the server's driver.
fn client_rt() -> Runtime {
    Runtime::builder().workers(1).driver(hotloop::DriverKind::Epoll).build().unwrap()
}

async fn echo_once(conn: &quinn::Connection, data: &[u8]) -> Vec<u8> {
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(data).await.unwrap();
    send.finish().unwrap();
    recv.read_to_end(usize::MAX).await.unwrap()
}

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// One HTTP/3 request: the status and the body.
async fn h3_get(
    send: &mut h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>,
    method: http::Method,
) -> (http::StatusCode, Vec<u8>) {
    let request =
        http::Request::builder().method(method).uri("https://localhost/").body(()).unwrap();
    let mut stream = send.send_request(request).await.unwrap();
    stream.finish().await.unwrap();
    let response = stream.recv_response().await.unwrap();
    let mut body = Vec::new();
    while let Some(mut chunk) = stream.recv_data().await.unwrap() {
        let n = chunk.remaining();
        body.extend_from_slice(&chunk.copy_to_bytes(n));
    }
    (response.status(), body)
}

/// Several streams at once, then 1 MiB; the client closes; SIGTERM
/// then stops the idle server at once.
#[hotloop::test(driver = "all")]
fn streams_are_echoed(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (mut p, addr, config) = serve_quic(driver, &[]);
    client_rt().block_on(async move {
        hotloop::time::timeout(LIMIT, async {
            let client = hotloop::quic::endpoint(localhost(), None).unwrap();
            let conn = client.connect_with(config, addr, "localhost").unwrap().await.unwrap();
            let alpn = conn
                .handshake_data()
                .unwrap()
                .downcast::<quinn::crypto::rustls::HandshakeData>()
                .unwrap()
                .protocol;
            assert_eq!(alpn.as_deref(), Some(ALPN));
            let streams: Vec<_> = (0..8u32)
                .map(|i| {
                    let conn = conn.clone();
                    hotloop::spawn(async move {
                        let msg = format!("stream {i} ").repeat(100 * i as usize + 1).into_bytes();
                        assert_eq!(echo_once(&conn, &msg).await, msg);
                    })
                })
                .collect();
            for s in streams {
                s.await.unwrap();
            }
            let large: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
            assert!(echo_once(&conn, &large).await == large);
            conn.close(VarInt::from_u32(9), b"done");
            client.wait_idle().await;
        })
        .await
        .unwrap();
    });
    let start = Instant::now();
    p.signal("TERM");
    let status = p.wait_exit(LIMIT).expect("hotloop did not exit");
    assert!(status.success(), "{status}");
    assert!(start.elapsed() < Duration::from_secs(3), "{driver}: exit took {:?}", start.elapsed());
}

/// A client whose address changes (connection migration, a NAT giving it
/// a new port) keeps its connection on a server with several workers: it
/// moves to a new local port 8 times and is echoed each time within a
/// second or so. Each new address hashes to any worker's socket; the
/// group steers datagrams by connection ID to the worker that owns the
/// connection (before, half the moves went to a worker that did not know
/// it, whose stateless reset the client could not recognise, and the
/// connection hung until its idle timeout).
#[hotloop::test(driver = "all")]
fn a_client_that_changes_address_keeps_its_connection(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (mut p, addr, config) = serve_quic(driver, &[]);
    let moved = client_rt().block_on(echo_across_address_changes(addr, config, 8));
    assert_eq!(moved, Ok(8), "{driver}");
    p.signal("TERM");
    assert!(p.wait_exit(LIMIT).expect("exit").success());
}

/// Connects to `addr`, then `times` times moves the client to a new local
/// port and has a stream echoed there (each within 3 s); how many moves
/// were echoed, or what failed.
pub async fn echo_across_address_changes(
    addr: SocketAddr,
    config: ClientConfig,
    times: usize,
) -> Result<usize, String> {
    const EACH: Duration = Duration::from_secs(3);
    let client = hotloop::quic::endpoint(localhost(), None).unwrap();
    let conn = client.connect_with(config, addr, "localhost").unwrap().await.unwrap();
    assert_eq!(echo_once(&conn, b"first").await, b"first");
    let mut moved = 0;
    for i in 0..times {
        let socket = std::net::UdpSocket::bind(localhost()).unwrap();
        let port = socket.local_addr().unwrap().port();
        client.rebind(socket).map_err(|e| format!("rebind: {e}"))?;
        let msg = format!("from port {port}").into_bytes();
        match hotloop::time::timeout(EACH, echo_once(&conn, &msg)).await {
            Ok(got) if got == msg => moved += 1,
            Ok(got) => return Err(format!("move {i}: echoed {got:?}")),
            Err(_) => return Err(format!("move {i} (port {port}): no echo within {EACH:?}")),
        }
    }
    conn.close(VarInt::from_u32(0), b"done");
    let _ = hotloop::time::timeout(EACH, client.wait_idle()).await;
    Ok(moved)
}

/// SIGTERM: a connection with no stream open is closed at once with
/// code 0; one with a stream in flight gets the whole echo, then the
/// same close; the process exits 0 long before the grace period.
#[hotloop::test(driver = "all")]
fn sigterm_finishes_streams_in_flight_then_closes(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (mut p, addr, config) = serve_quic(driver, &["--grace-ms", "20000"]);
    let rt = client_rt();
    let (client, idle, busy, mut send, mut recv) = rt.block_on(async {
        let client = hotloop::quic::endpoint(localhost(), None).unwrap();
        let idle = client.connect_with(config.clone(), addr, "localhost").unwrap().await.unwrap();
        assert_eq!(echo_once(&idle, b"hi").await, b"hi");
        let busy = client.connect_with(config, addr, "localhost").unwrap().await.unwrap();
        let (mut send, mut recv) = busy.open_bi().await.unwrap();
        send.write_all(b"first half, ").await.unwrap();
        // The stream is open on the server once its first bytes come back.
        let mut got = [0u8; 12];
        recv.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"first half, ");
        (client, idle, busy, send, recv)
    });
    let start = Instant::now();
    p.signal("TERM");
    rt.block_on(async {
        hotloop::time::timeout(LIMIT, async {
            match idle.closed().await {
                ConnectionError::ApplicationClosed(c) => {
                    assert_eq!(c.error_code, VarInt::from_u32(0));
                    assert_eq!(&c.reason[..], b"server stopping");
                }
                other => panic!("{driver}: the idle connection ended with {other:?}"),
            }
            assert!(
                start.elapsed() < Duration::from_secs(3),
                "{driver}: idle close took {:?}",
                start.elapsed()
            );
            // The stream in flight is finished.
            send.write_all(b"second half").await.unwrap();
            send.finish().unwrap();
            let rest = recv.read_to_end(usize::MAX).await.unwrap();
            assert_eq!(rest, b"second half");
            match busy.closed().await {
                ConnectionError::ApplicationClosed(c) => {
                    assert_eq!(c.error_code, VarInt::from_u32(0))
                }
                other => panic!("{driver}: the busy connection ended with {other:?}"),
            }
            client.close(VarInt::from_u32(0), b"");
        })
        .await
        .unwrap();
    });
    let status = p.wait_exit(LIMIT).expect("hotloop did not exit");
    assert!(status.success(), "{status}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{driver}: exit took {:?} with a 20 s grace",
        start.elapsed()
    );
    assert!(p.wait_for_line("stopped (0 connections cut", LIMIT), "{:?}", p.seen);
}

/// A silent connection is closed by the server at --idle-timeout-ms.
#[hotloop::test(driver = "all")]
fn the_idle_timeout_closes_a_silent_connection(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (mut p, addr, config) =
        serve_quic(driver, &["--idle-timeout-ms", "300", "--stats-addr", "127.0.0.1:0"]);
    let stats = p.addr_after("stats on ");
    let rt = client_rt();
    let (_client, conn) = rt.block_on(async {
        let client = hotloop::quic::endpoint(localhost(), None).unwrap();
        let conn = client.connect_with(config, addr, "localhost").unwrap().await.unwrap();
        assert_eq!(echo_once(&conn, b"hi").await, b"hi");
        (client, conn)
    });
    assert_eq!(common::stat(stats, "active_connections"), 1);
    // The client's runtime is not driven from here on: it goes silent.
    let start = Instant::now();
    assert!(common::wait_until(Duration::from_secs(10), || common::stat(
        stats,
        "active_connections"
    ) == 0));
    let took = start.elapsed();
    assert!(took < Duration::from_secs(5), "{driver}: idle close after {took:?}");
    drop(conn);
    p.signal("TERM");
    assert!(p.wait_exit(LIMIT).expect("exit").success());
}

/// HTTP/3: requests at once on one connection get 200 and the body
/// (none for HEAD); SIGTERM then sends GOAWAY and closes the idle
/// connection with H3_NO_ERROR, and the process exits 0 at once.
#[hotloop::test(driver = "all")]
fn h3_requests_are_answered_and_sigterm_closes_with_no_error(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (mut p, addr, config) =
        serve_app("h3", b"h3", driver, &["--body-size", "3000", "--grace-ms", "20000"]);
    let rt = client_rt();
    let (client, conn, _send) = rt.block_on(async {
        hotloop::time::timeout(LIMIT, async {
            let client = hotloop::quic::endpoint(localhost(), None).unwrap();
            let conn = client.connect_with(config, addr, "localhost").unwrap().await.unwrap();
            let (mut driver_h3, send) =
                h3::client::new(h3_quinn::Connection::new(conn.clone())).await.unwrap();
            drop(hotloop::spawn(async move {
                std::future::poll_fn(|cx| driver_h3.poll_close(cx)).await;
            }));
            let requests: Vec<_> = (0..6)
                .map(|_| {
                    let mut send = send.clone();
                    hotloop::spawn(async move { h3_get(&mut send, http::Method::GET).await })
                })
                .collect();
            for r in requests {
                let (status, body) = r.await.unwrap();
                assert_eq!(status, http::StatusCode::OK);
                assert_eq!(body, vec![b'x'; 3000]);
            }
            let (status, body) = h3_get(&mut send.clone(), http::Method::HEAD).await;
            assert_eq!(status, http::StatusCode::OK);
            assert!(body.is_empty());
            // Kept: the client's h3 connection closes once its last sender is dropped.
            (client, conn, send)
        })
        .await
        .unwrap()
    });
    let start = Instant::now();
    p.signal("TERM");
    rt.block_on(async {
        match hotloop::time::timeout(LIMIT, conn.closed()).await.unwrap() {
            ConnectionError::ApplicationClosed(c) => {
                assert_eq!(c.error_code, VarInt::from_u32(0x100), "{driver}");
                assert_eq!(&c.reason[..], b"server stopping");
            }
            other => panic!("{driver}: the connection ended with {other:?}"),
        }
        client.close(VarInt::from_u32(0), b"");
    });
    let status = p.wait_exit(LIMIT).expect("hotloop did not exit");
    assert!(status.success(), "{status}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{driver}: exit took {:?} with a 20 s grace",
        start.elapsed()
    );
}

/// The stats endpoint counts QUIC connections, which pass no listener
/// and so never count in the runtime's `accepted`: `quic_accepted` (and
/// the Retry, refusal and unvalidated-handshake counts beside it), and the
/// connection rate. Before, the endpoint said 0 connections accepted and a
/// rate of 0 however many came.
#[hotloop::test(driver = "all")]
fn the_stats_count_quic_connections(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (mut p, addr, config) = serve_quic(driver, &["--stats-addr", "127.0.0.1:0"]);
    let stats = p.addr_after("stats on ");
    client_rt().block_on(async move {
        let client = hotloop::quic::endpoint(localhost(), None).unwrap();
        for _ in 0..5 {
            let conn =
                client.connect_with(config.clone(), addr, "localhost").unwrap().await.unwrap();
            assert_eq!(echo_once(&conn, b"hi").await, b"hi");
            conn.close(VarInt::from_u32(0), b"");
        }
        let _ = hotloop::time::timeout(Duration::from_secs(1), client.wait_idle()).await;
    });
    assert_eq!(common::stat(stats, "quic_accepted"), 5, "{driver}");
    for name in ["quic_retries", "quic_refused", "quic_unvalidated_handshakes"] {
        assert_eq!(common::stat(stats, name), 0, "{driver}: {name}");
    }
    // The rate is sampled once a second.
    let rated = common::wait_until(Duration::from_secs(3), || {
        common::stat(stats, "connection_rate_peak_per_second") > 0
    });
    assert!(rated, "{driver}: no connection rate");
    let metrics = common::http_get(stats, "/metrics");
    assert!(metrics.contains("\nhotloop_quic_accepted_total 5\n"), "{driver}: {metrics}");
    p.signal("TERM");
    assert!(p.wait_exit(LIMIT).expect("exit").success());
}

/// With --tls-cert and --tls-key the server uses that certificate.
#[hotloop::test(driver = "all")]
fn a_given_certificate_is_served(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let names = vec!["localhost".to_string()];
    let made = rcgen::generate_simple_self_signed(names).unwrap();
    let dir = common::TempDir::new("quic");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
    let mut p = Proc::start(&[
        "serve",
        "quic",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--driver",
        driver,
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]);
    let addr = p.addr_after(" on ");
    let config = common::quic_client_config(&cert, ALPN);
    client_rt().block_on(async move {
        hotloop::time::timeout(LIMIT, async {
            let client = hotloop::quic::endpoint(localhost(), None).unwrap();
            let conn = client.connect_with(config, addr, "localhost").unwrap().await.unwrap();
            assert_eq!(echo_once(&conn, b"given").await, b"given");
            conn.close(VarInt::from_u32(0), b"");
            client.wait_idle().await;
        })
        .await
        .unwrap();
    });
    p.signal("TERM");
    assert!(p.wait_exit(LIMIT).expect("exit").success());
}
