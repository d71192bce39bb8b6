//! QUIC through quinn on hotloop, against quinn on tokio, on both drivers:
//! a tokio client talks to a hotloop server (handshake, many streams, a
//! large transfer, close, idle timeout), and a hotloop client talks to a
//! tokio server.

#[allow(dead_code)]
#[path = "../examples/quic_echo.rs"]
mod example;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use hotloop::{DriverKind, Runtime};
use quinn::{ClientConfig, ConnectionError, ServerConfig, TransportConfig, VarInt};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

const LOCALHOST: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
const LIMIT: Duration = Duration::from_secs(20);
/// Bytes of the large transfer.
const LARGE_BYTES: usize = 8 << 20;

/// A self-signed certificate for "localhost", and the configurations that use it.
fn configs(server_idle: Option<Duration>) -> (ServerConfig, ClientConfig) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_der = CertificateDer::from(cert.cert);
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()));
    let mut server = ServerConfig::with_single_cert(vec![cert_der.clone()], key).unwrap();
    let mut transport = TransportConfig::default();
    transport.max_concurrent_bidi_streams(VarInt::from_u32(256));
    transport.max_idle_timeout(server_idle.map(|d| d.try_into().unwrap()));
    server.transport_config(Arc::new(transport));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert_der).unwrap();
    let client = ClientConfig::with_root_certificates(Arc::new(roots)).unwrap();
    (server, client)
}

/// Echoes every bidirectional stream of every connection; reports each
/// connection's end on `ends`.
async fn echo_server(endpoint: quinn::Endpoint, ends: mpsc::Sender<ConnectionError>) {
    while let Some(incoming) = endpoint.accept().await {
        let ends = ends.clone();
        hotloop::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            loop {
                match conn.accept_bi().await {
                    Ok((mut send, mut recv)) => {
                        hotloop::spawn(async move {
                            let data = recv.read_to_end(usize::MAX).await.unwrap();
                            send.write_all(&data).await.unwrap();
                            send.finish().unwrap();
                            let _ = send.stopped().await;
                        });
                    }
                    Err(e) => {
                        let _ = ends.send(e);
                        return;
                    }
                }
            }
        });
    }
}

/// Starts a hotloop runtime on `driver` with one echo endpoint; returns
/// the runtime, its address, and the receiver of connection ends.
fn hotloop_server(
    driver: hotloop::DriverKind,
    server_config: ServerConfig,
) -> (Runtime, SocketAddr, mpsc::Receiver<ConnectionError>) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let (addr_tx, addr_rx) = mpsc::channel();
    let (end_tx, end_rx) = mpsc::channel();
    rt.handle().spawn_on(0, move || async move {
        let endpoint = hotloop::quic::endpoint(LOCALHOST, Some(server_config)).unwrap();
        addr_tx.send(endpoint.local_addr().unwrap()).unwrap();
        echo_server(endpoint, end_tx).await;
    });
    let addr = addr_rx.recv_timeout(LIMIT).unwrap();
    (rt, addr, end_rx)
}

fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

async fn echo_once(conn: &quinn::Connection, data: Vec<u8>) -> Vec<u8> {
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&data).await.unwrap();
    send.finish().unwrap();
    recv.read_to_end(usize::MAX).await.unwrap()
}

#[hotloop::test(driver = "all")]
fn tokio_client_hotloop_server(driver: DriverKind) {
    let (server_config, client_config) = configs(None);
    let (_rt, addr, ends) = hotloop_server(driver, server_config);
    tokio_rt().block_on(async {
        tokio::time::timeout(LIMIT, async {
            let mut client = quinn::Endpoint::client(LOCALHOST).unwrap();
            client.set_default_client_config(client_config);
            let conn = client.connect(addr, "localhost").unwrap().await.unwrap();
            // Many streams at once.
            let streams: Vec<_> = (0..100u32)
                .map(|i| {
                    let conn = conn.clone();
                    tokio::spawn(async move {
                        let msg = format!("stream {i}").into_bytes();
                        assert_eq!(echo_once(&conn, msg.clone()).await, msg);
                    })
                })
                .collect();
            for s in streams {
                s.await.unwrap();
            }
            // A large transfer.
            let large: Vec<u8> = (0..LARGE_BYTES).map(|i| (i % 251) as u8).collect();
            assert!(echo_once(&conn, large.clone()).await == large);
            // Close.
            conn.close(VarInt::from_u32(7), b"done");
            client.wait_idle().await;
        })
        .await
        .unwrap();
    });
    match ends.recv_timeout(LIMIT).unwrap() {
        ConnectionError::ApplicationClosed(close) => {
            assert_eq!(close.error_code, VarInt::from_u32(7))
        }
        other => panic!("the server saw {other:?}, not the client's close"),
    }
}

#[hotloop::test(driver = "all")]
fn idle_timeout(driver: DriverKind) {
    let (server_config, client_config) = configs(Some(Duration::from_millis(300)));
    let (_rt, addr, ends) = hotloop_server(driver, server_config);
    let rt = tokio_rt();
    let (_client, _conn) = rt.block_on(async {
        let mut client = quinn::Endpoint::client(LOCALHOST).unwrap();
        client.set_default_client_config(client_config);
        let conn = client.connect(addr, "localhost").unwrap().await.unwrap();
        assert_eq!(echo_once(&conn, b"hi".to_vec()).await, b"hi");
        (client, conn)
    });
    // The tokio runtime is not driven from here on: the client goes silent.
    let start = std::time::Instant::now();
    match ends.recv_timeout(LIMIT).unwrap() {
        ConnectionError::TimedOut => {}
        other => panic!("the server saw {other:?}, not an idle timeout"),
    }
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(5), "{waited:?}");
}

#[hotloop::test(driver = "all")]
fn hotloop_client_tokio_server(driver: DriverKind) {
    let (server_config, client_config) = configs(None);
    let tokio = tokio_rt();
    let server = {
        let _guard = tokio.enter();
        quinn::Endpoint::server(server_config, LOCALHOST).unwrap()
    };
    let addr = server.local_addr().unwrap();
    let server_thread = std::thread::spawn(move || {
        tokio.block_on(async move {
            let conn = server.accept().await.unwrap().await.unwrap();
            for _ in 0..20 {
                let (mut send, mut recv) = conn.accept_bi().await.unwrap();
                let data = recv.read_to_end(usize::MAX).await.unwrap();
                send.write_all(&data).await.unwrap();
                send.finish().unwrap();
            }
            conn.closed().await
        })
    });
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    rt.block_on(async move {
        hotloop::time::timeout(LIMIT, async {
            let client = hotloop::quic::endpoint(LOCALHOST, None).unwrap();
            let conn =
                client.connect_with(client_config, addr, "localhost").unwrap().await.unwrap();
            for i in 0..19 {
                let msg = vec![i as u8; 1000 * i];
                assert_eq!(echo_once(&conn, msg.clone()).await, msg);
            }
            let large: Vec<u8> = (0..LARGE_BYTES).map(|i| (i % 253) as u8).collect();
            assert!(echo_once(&conn, large.clone()).await == large);
            conn.close(VarInt::from_u32(3), b"bye");
            client.wait_idle().await;
        })
        .await
        .unwrap();
    });
    match server_thread.join().unwrap() {
        ConnectionError::ApplicationClosed(close) => {
            assert_eq!(close.error_code, VarInt::from_u32(3))
        }
        other => panic!("the tokio server saw {other:?}"),
    }
}

#[hotloop::test(driver = "all")]
fn one_endpoint_per_worker(driver: DriverKind) {
    let (server_config, client_config) = configs(None);
    let port = std::net::UdpSocket::bind(LOCALHOST).unwrap().local_addr().unwrap().port();
    let addr = SocketAddr::new(LOCALHOST.ip(), port);
    let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
    let served = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    {
        let served = served.clone();
        let handle = rt.handle().clone();
        std::thread::spawn(move || {
            for worker in 0..2 {
                let (server_config, served) = (server_config.clone(), served.clone());
                handle.spawn_on(worker, move || async move {
                    let endpoint = hotloop::quic::endpoint(addr, Some(server_config)).unwrap();
                    while let Some(incoming) = endpoint.accept().await {
                        let served = served.clone();
                        hotloop::spawn(async move {
                            let Ok(conn) = incoming.await else { return };
                            served[worker].fetch_add(1, Ordering::Relaxed);
                            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                                let data = recv.read_to_end(1024).await.unwrap();
                                send.write_all(&data).await.unwrap();
                                send.finish().unwrap();
                            }
                        });
                    }
                });
            }
        });
    }
    std::thread::sleep(Duration::from_millis(100));
    tokio_rt().block_on(async {
        tokio::time::timeout(LIMIT, async {
            // Each client endpoint has its own port, so the kernel's
            // SO_REUSEPORT hash spreads them over the workers' sockets.
            for i in 0..20u8 {
                let mut client = quinn::Endpoint::client(LOCALHOST).unwrap();
                client.set_default_client_config(client_config.clone());
                let conn = client.connect(addr, "localhost").unwrap().await.unwrap();
                assert_eq!(echo_once(&conn, vec![i; 100]).await, vec![i; 100]);
                conn.close(VarInt::from_u32(0), b"");
                client.wait_idle().await;
            }
        })
        .await
        .unwrap();
    });
    let counts = [served[0].load(Ordering::Relaxed), served[1].load(Ordering::Relaxed)];
    assert_eq!(counts[0] + counts[1], 20);
    assert!(counts[0] > 0 && counts[1] > 0, "every worker serves connections: {counts:?}");
}

/// The example server sets an ALPN (QUIC requires one): a client offering
/// it gets its stream echoed, one offering another protocol is refused.
#[hotloop::test(driver = "all")]
fn the_example_server_speaks_its_alpn(driver: DriverKind) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_der = CertificateDer::from(cert.cert);
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()));
    let server_config = example::server_config(cert_der.clone(), key).unwrap();
    let (_rt, addr, _ends) = hotloop_server(driver, server_config);
    let client_config = |alpn: &[u8]| {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert_der.clone()).unwrap();
        let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        tls.alpn_protocols = vec![alpn.to_vec()];
        ClientConfig::new(Arc::new(quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap()))
    };
    tokio_rt().block_on(async {
        tokio::time::timeout(LIMIT, async {
            let mut client = quinn::Endpoint::client(LOCALHOST).unwrap();
            client.set_default_client_config(client_config(example::ALPN));
            let conn = client.connect(addr, "localhost").unwrap().await.unwrap();
            assert_eq!(
                conn.handshake_data()
                    .unwrap()
                    .downcast::<quinn::crypto::rustls::HandshakeData>()
                    .unwrap()
                    .protocol
                    .as_deref(),
                Some(example::ALPN)
            );
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            send.write_all(b"alpn").await.unwrap();
            send.finish().unwrap();
            let mut buf = [0u8; 4];
            recv.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"alpn");
            client.set_default_client_config(client_config(b"h3"));
            let refused = client.connect(addr, "localhost").unwrap().await;
            assert!(refused.is_err(), "a client offering another protocol got in");
        })
        .await
        .unwrap();
    });
}

/// A bulk transfer from a hotloop server to a client: quinn asks whether
/// the socket is writable before every transmit, and the answer comes from
/// what the last send said (a `POLL_ADD` only once a send found the
/// buffer full). A `POLL_ADD` per ask made every transmit wait for the
/// loop's next `io_uring_enter`: the server's worker submitted at least as
/// many ring entries as it made sends. `QUIC_BULK_MIB` sets the size (16
/// MiB; the time is printed, for measuring).
#[hotloop::test(driver = "all")]
fn a_bulk_send_waits_on_no_poll_per_transmit(driver: DriverKind) {
    let mib: usize = std::env::var("QUIC_BULK_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(16);
    let (server_config, client_config) = configs(None);
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let (addr_tx, addr_rx) = mpsc::channel();
    let (sent_tx, sent_rx) = mpsc::channel();
    rt.handle().spawn_on(0, move || async move {
        let endpoint = hotloop::quic::endpoint(LOCALHOST, Some(server_config)).unwrap();
        addr_tx.send(endpoint.local_addr().unwrap()).unwrap();
        let conn = endpoint.accept().await.unwrap().await.unwrap();
        let before = hotloop::Handle::current().stats().total.submissions;
        let ios_before = conn.stats().udp_tx.ios;
        let mut send = conn.open_uni().await.unwrap();
        let chunk = vec![7u8; 1 << 20];
        for _ in 0..mib {
            send.write_all(&chunk).await.unwrap();
        }
        send.finish().unwrap();
        let _ = send.stopped().await;
        let submissions = hotloop::Handle::current().stats().total.submissions - before;
        sent_tx.send((submissions, conn.stats().udp_tx.ios - ios_before)).unwrap();
        conn.closed().await;
    });
    let addr = addr_rx.recv_timeout(LIMIT).unwrap();
    let elapsed = tokio_rt().block_on(async {
        tokio::time::timeout(LIMIT, async {
            let mut client = quinn::Endpoint::client(LOCALHOST).unwrap();
            client.set_default_client_config(client_config);
            let conn = client.connect(addr, "localhost").unwrap().await.unwrap();
            let start = std::time::Instant::now();
            let mut recv = conn.accept_uni().await.unwrap();
            let got = recv.read_to_end(usize::MAX).await.unwrap();
            let elapsed = start.elapsed();
            assert_eq!(got.len(), mib << 20);
            conn.close(VarInt::from_u32(0), b"done");
            client.wait_idle().await;
            elapsed
        })
        .await
        .unwrap()
    });
    let (submissions, sends) = sent_rx.recv_timeout(LIMIT).unwrap();
    println!("{driver:?}: {mib} MiB server to client in {elapsed:?}, {sends} sends, {submissions} ring entries");
    assert!(sends > 1000, "{sends} sends");
    assert!(submissions * 10 < sends, "{driver:?}: {submissions} ring entries for {sends} sends");
}
