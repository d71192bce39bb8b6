//! `hotloop serve quic`: a quinn client (on hotloop, epoll) trusts the
//! certificate the server wrote with `--write-cert`, negotiates ALPN
//! `hotloop-echo`, has several streams and a 1 MiB one echoed; SIGTERM
//! lets a stream in flight finish, closes connections with code 0, and the
//! process exits 0 within the grace period; the idle timeout closes a
//! silent connection. The server runs on both drivers.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Proc;
use hotloop::tls::rustls;
use hotloop::Runtime;
use quinn::crypto::rustls::QuicClientConfig;
use quinn::{ClientConfig, ConnectionError, VarInt};

const LIMIT: Duration = Duration::from_secs(20);
const ALPN: &[u8] = b"hotloop-echo";

/// A fresh path for the server's certificate.
fn cert_path() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "hotloop-cli-quic-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("cert.pem")
}

/// `hotloop serve quic` on `driver` with two workers, its certificate
/// written for the client; the process, its address and the client's
/// configuration.
fn serve_quic(driver: &str, extra: &[&str]) -> (Proc, SocketAddr, ClientConfig) {
    let cert = cert_path();
    let mut args =
        vec!["serve", "quic", "--addr", "127.0.0.1:0", "--workers", "2", "--driver", driver];
    args.extend_from_slice(&["--write-cert", cert.to_str().unwrap()]);
    args.extend_from_slice(extra);
    let mut p = Proc::start(&args);
    let addr = p.addr_after(" on ");
    assert!(p.wait_for_line("written to", LIMIT), "{:?}", p.seen);
    (p, addr, client_config(&cert))
}

fn client_config(cert: &std::path::Path) -> ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for c in hotloop::tls::load_certs(cert).unwrap() {
        roots.add(c).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).unwrap()))
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

test_all_drivers! {
    /// Several streams at once, then 1 MiB; the client closes; SIGTERM
    /// then stops the idle server at once.
    fn streams_are_echoed(driver: &str) {
        let (mut p, addr, config) = serve_quic(driver, &[]);
        client_rt().block_on(async move {
            hotloop::time::timeout(LIMIT, async {
                let client = hotloop::quic::endpoint(localhost(), None).unwrap();
                let conn = client.connect_with(config, addr, "localhost").unwrap().await.unwrap();
                let alpn = conn.handshake_data().unwrap().downcast::<quinn::crypto::rustls::HandshakeData>().unwrap().protocol;
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

    /// SIGTERM: a connection with no stream open is closed at once with
    /// code 0; one with a stream in flight gets the whole echo, then the
    /// same close; the process exits 0 long before the grace period.
    fn sigterm_finishes_streams_in_flight_then_closes(driver: &str) {
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
                assert!(start.elapsed() < Duration::from_secs(3), "{driver}: idle close took {:?}", start.elapsed());
                // The stream in flight is finished.
                send.write_all(b"second half").await.unwrap();
                send.finish().unwrap();
                let rest = recv.read_to_end(usize::MAX).await.unwrap();
                assert_eq!(rest, b"second half");
                match busy.closed().await {
                    ConnectionError::ApplicationClosed(c) => assert_eq!(c.error_code, VarInt::from_u32(0)),
                    other => panic!("{driver}: the busy connection ended with {other:?}"),
                }
                client.close(VarInt::from_u32(0), b"");
            })
            .await
            .unwrap();
        });
        let status = p.wait_exit(LIMIT).expect("hotloop did not exit");
        assert!(status.success(), "{status}");
        assert!(start.elapsed() < Duration::from_secs(5), "{driver}: exit took {:?} with a 20 s grace", start.elapsed());
        assert!(p.wait_for_line("stopped (0 connections cut", LIMIT), "{:?}", p.seen);
    }

    /// A silent connection is closed by the server at --idle-timeout-ms.
    fn the_idle_timeout_closes_a_silent_connection(driver: &str) {
        let (mut p, addr, config) = serve_quic(driver, &["--idle-timeout-ms", "300", "--stats-addr", "127.0.0.1:0"]);
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
        assert!(common::wait_until(Duration::from_secs(10), || common::stat(stats, "active_connections") == 0));
        let took = start.elapsed();
        assert!(took < Duration::from_secs(5), "{driver}: idle close after {took:?}");
        drop(conn);
        p.signal("TERM");
        assert!(p.wait_exit(LIMIT).expect("exit").success());
    }
}
