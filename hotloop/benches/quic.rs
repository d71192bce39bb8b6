//! QUIC, side by side: a quinn server on hotloop (epoll, io_uring) against
//! the same quinn version on tokio (current-thread runtime), same crypto
//! provider (rustls with ring), one server thread each.
//!
//! ```sh
//! cargo bench -p hotloop --features quic --bench quic -- [HANDSHAKE_SECONDS] [BULK_MIB] [IDLE_CONNECTIONS]
//! ```
//!
//! - handshakes: a quinn client on tokio keeps 32 handshakes in flight,
//!   closing each connection once it is up; handshakes per second and
//!   server CPU per handshake.
//! - bulk: one connection, one stream, `BULK_MIB` MiB from the client to
//!   the server, which reads and drops them; MiB/s and server CPU per GiB.
//! - idle: `IDLE_CONNECTIONS` connections held open; the server sends a
//!   keep-alive on each every 2 s, so its timers run while the connections
//!   are otherwise idle; server CPU per second over 5 s (and, on hotloop,
//!   timers fired per second).
//!
//! Server CPU is the server thread's on-CPU time from
//! `/proc/self/task/TID/schedstat`. `QUIC_BENCH_SERVERS=epoll,uring,tokio`
//! picks the rows; `QUIC_BENCH_RCVBUF=BYTES` shrinks the server socket's
//! receive buffer (to compare how both runtimes ride out heavy loss).

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use quinn::{ClientConfig, Endpoint, ServerConfig, TransportConfig, VarInt};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

const LOCALHOST: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
/// Handshakes the client keeps in flight.
const HANDSHAKES_IN_FLIGHT: usize = 32;
/// Connections the idle scenario opens at once while setting up.
const IDLE_SETUP_IN_FLIGHT: usize = 16;
/// How long the idle scenario measures.
const IDLE_MEASURE: Duration = Duration::from_secs(5);
/// The server's keep-alive interval (its per-connection timer).
const KEEP_ALIVE: Duration = Duration::from_secs(2);
/// Bytes per client write in the bulk scenario.
const WRITE_BYTES: usize = 64 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Server {
    HotloopEpoll,
    HotloopUring,
    Tokio,
}

impl Server {
    fn name(self) -> &'static str {
        match self {
            Server::HotloopEpoll => "quinn on hotloop (epoll)",
            Server::HotloopUring => "quinn on hotloop (io_uring)",
            Server::Tokio => "quinn on tokio",
        }
    }
}

type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a running server hands back: its address, thread, endpoint (to
/// close it), and a timers-fired counter (hotloop only).
struct Running {
    addr: SocketAddr,
    tid: String,
    endpoint: Endpoint,
    timers_fired: Arc<AtomicU64>,
    thread: thread::JoinHandle<()>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let handshake_secs: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let bulk_mib: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let idle_connections: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let (server_config, client_config) = configs();
    let mut servers = vec![Server::HotloopEpoll, Server::HotloopUring, Server::Tokio];
    // QUIC_BENCH_SERVERS=epoll,uring,tokio picks rows (for profiling one).
    if let Ok(only) = std::env::var("QUIC_BENCH_SERVERS") {
        servers.retain(|s| {
            let key = match s {
                Server::HotloopEpoll => "epoll",
                Server::HotloopUring => "uring",
                Server::Tokio => "tokio",
            };
            only.split(',').any(|o| o == key)
        });
    }
    if let Err(why) = hotloop::runtime::uring_available() {
        eprintln!("io_uring row skipped: {why}");
        servers.retain(|s| *s != Server::HotloopUring);
    }
    let client_rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _guard = client_rt.enter();
    let mut client = Endpoint::client(LOCALHOST).unwrap();
    client.set_default_client_config(client_config);

    let me = my_tid();
    println!("| server | handshakes/s | server CPU ms per handshake | client CPU % | bulk MiB/s | server CPU s per GiB | client CPU % | idle: connections | idle: server CPU % | idle: timers fired/s |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for server in servers {
        let running = start(server, server_config.clone());
        // Handshakes.
        let cpu0 = thread_cpu(&running.tid);
        let client0 = thread_cpu(&me);
        let (handshakes, elapsed) =
            client_rt.block_on(handshakes(&client, running.addr, handshake_secs));
        let cpu = thread_cpu(&running.tid) - cpu0;
        let hs_per_s = handshakes as f64 / elapsed.as_secs_f64();
        let cpu_per_hs_ms = cpu.as_secs_f64() * 1e3 / handshakes.max(1) as f64;
        let hs_client = (thread_cpu(&me) - client0).as_secs_f64() / elapsed.as_secs_f64() * 100.0;
        eprintln!("{}: {handshakes} handshakes in {elapsed:?}", server.name());
        // Bulk.
        let cpu0 = thread_cpu(&running.tid);
        let client0 = thread_cpu(&me);
        let elapsed = client_rt.block_on(bulk(&client, running.addr, bulk_mib));
        let cpu = thread_cpu(&running.tid) - cpu0;
        let mib_per_s = bulk_mib as f64 / elapsed.as_secs_f64();
        let cpu_per_gib = cpu.as_secs_f64() / (bulk_mib as f64 / 1024.0);
        let bulk_client = (thread_cpu(&me) - client0).as_secs_f64() / elapsed.as_secs_f64() * 100.0;
        eprintln!("{}: {bulk_mib} MiB in {elapsed:?}", server.name());
        // Idle connections.
        let (held, idle_cpu, timers) =
            client_rt.block_on(idle(&client, &running, idle_connections));
        eprintln!("{}: {held} idle connections", server.name());
        println!(
            "| {} | {:.0} | {:.3} | {:.0} | {:.0} | {:.2} | {:.0} | {} | {:.1} | {} |",
            server.name(),
            hs_per_s,
            cpu_per_hs_ms,
            hs_client,
            mib_per_s,
            cpu_per_gib,
            bulk_client,
            held,
            idle_cpu,
            timers.map_or("n/a".to_string(), |t| format!("{t:.0}")),
        );
        running.endpoint.close(VarInt::from_u32(0), b"bench over");
        running.thread.join().unwrap();
    }
}

/// A self-signed certificate, and the configurations that use it: large
/// flow-control windows for bulk, a long idle timeout and the server's
/// keep-alive for the idle scenario.
fn configs() -> (ServerConfig, ClientConfig) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_der = CertificateDer::from(cert.cert);
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()));
    let mut server = ServerConfig::with_single_cert(vec![cert_der.clone()], key).unwrap();
    let mut transport = TransportConfig::default();
    transport
        .max_idle_timeout(Some(Duration::from_secs(60).try_into().unwrap()))
        .keep_alive_interval(Some(KEEP_ALIVE))
        .stream_receive_window(VarInt::from_u32(16 << 20))
        .receive_window(VarInt::from_u32(32 << 20))
        .send_window(32 << 20);
    server.transport_config(Arc::new(transport));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert_der).unwrap();
    let mut client = ClientConfig::with_root_certificates(Arc::new(roots)).unwrap();
    let mut transport = TransportConfig::default();
    transport
        .max_idle_timeout(Some(Duration::from_secs(60).try_into().unwrap()))
        .stream_receive_window(VarInt::from_u32(16 << 20))
        .receive_window(VarInt::from_u32(32 << 20))
        .send_window(32 << 20);
    client.transport_config(Arc::new(transport));
    (server, client)
}

/// Starts `server` on its own thread.
fn start(server: Server, config: ServerConfig) -> Running {
    let (tx, rx) = mpsc::channel();
    let timers_fired = Arc::new(AtomicU64::new(0));
    let thread = {
        let timers_fired = timers_fired.clone();
        thread::spawn(move || match server {
            Server::HotloopEpoll | Server::HotloopUring => {
                let driver = if server == Server::HotloopEpoll {
                    hotloop::DriverKind::Epoll
                } else {
                    hotloop::DriverKind::Uring
                };
                let rt = hotloop::Runtime::builder().workers(1).driver(driver).build().unwrap();
                let handle = rt.handle().clone();
                rt.block_on(async move {
                    // QUIC_BENCH_RCVBUF=BYTES shrinks the server's receive buffer (a loss experiment).
                    let options = hotloop::net::UdpOptions {
                        recv_buffer_bytes: std::env::var("QUIC_BENCH_RCVBUF")
                            .ok()
                            .and_then(|v| v.parse().ok()),
                        ..hotloop::net::UdpOptions::quic()
                    };
                    let endpoint = hotloop::quic::endpoint_with(
                        LOCALHOST,
                        quinn::EndpointConfig::default(),
                        Some(config),
                        &options,
                    )
                    .unwrap();
                    tx.send((endpoint.local_addr().unwrap(), my_tid(), endpoint.clone())).unwrap();
                    // Report the wheel's counter once a second.
                    let counter = timers_fired.clone();
                    hotloop::spawn(async move {
                        loop {
                            counter.store(handle.stats().total.timers_fired, Ordering::Relaxed);
                            hotloop::time::sleep(Duration::from_millis(100)).await;
                        }
                    });
                    accept_loop(endpoint, |f| drop(hotloop::spawn(f))).await;
                });
            }
            Server::Tokio => {
                let rt =
                    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async move {
                    let socket = std::net::UdpSocket::bind(LOCALHOST).unwrap();
                    if let Some(bytes) =
                        std::env::var("QUIC_BENCH_RCVBUF").ok().and_then(|v| v.parse::<i32>().ok())
                    {
                        use std::os::fd::AsRawFd;
                        // SAFETY: passes a live i32 and its exact size.
                        let rc = unsafe {
                            libc::setsockopt(
                                socket.as_raw_fd(),
                                libc::SOL_SOCKET,
                                libc::SO_RCVBUF,
                                (&bytes as *const i32).cast(),
                                std::mem::size_of::<i32>() as libc::socklen_t,
                            )
                        };
                        assert_eq!(rc, 0);
                    }
                    let endpoint = Endpoint::new(
                        quinn::EndpointConfig::default(),
                        Some(config),
                        socket,
                        Arc::new(quinn::TokioRuntime),
                    )
                    .unwrap();
                    tx.send((endpoint.local_addr().unwrap(), my_tid(), endpoint.clone())).unwrap();
                    accept_loop(endpoint, |f| drop(tokio::spawn(f))).await;
                });
            }
        })
    };
    let (addr, tid, endpoint) = rx.recv_timeout(Duration::from_secs(10)).expect("server started");
    Running { addr, tid, endpoint, timers_fired, thread }
}

/// Accepts connections; on each stream, reads everything and answers one byte.
async fn accept_loop(endpoint: Endpoint, spawn: impl Fn(BoxFuture)) {
    while let Some(incoming) = endpoint.accept().await {
        spawn(Box::pin(async move {
            let conn = match incoming.await {
                Ok(conn) => conn,
                Err(e) => return eprintln!("server: handshake failed: {e}"),
            };
            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                // Streams are served one after another: the bench opens one at a time.
                while let Ok(Some(_chunk)) = recv.read_chunk(usize::MAX, true).await {}
                let _ = send.write_all(b"k").await;
                let _ = send.finish();
            }
        }));
    }
}

/// Opens and closes connections for `seconds`, [`HANDSHAKES_IN_FLIGHT`] at a time.
async fn handshakes(client: &Endpoint, addr: SocketAddr, seconds: f64) -> (u64, Duration) {
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..HANDSHAKES_IN_FLIGHT)
        .map(|_| {
            let (client, done) = (client.clone(), done.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let conn = client.connect(addr, "localhost").unwrap().await.unwrap();
                    conn.close(VarInt::from_u32(0), b"");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed();
    client.wait_idle().await;
    (done.load(Ordering::Relaxed), elapsed)
}

/// Sends `mib` MiB over one stream and waits for the server's answer.
async fn bulk(client: &Endpoint, addr: SocketAddr, mib: usize) -> Duration {
    let conn = client.connect(addr, "localhost").unwrap().await.unwrap();
    let chunk = bytes::Bytes::from(vec![0x5a; WRITE_BYTES]);
    let start = Instant::now();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    for _ in 0..(mib << 20) / WRITE_BYTES {
        send.write_chunk(chunk.clone()).await.unwrap();
    }
    send.finish().unwrap();
    let answer = recv.read_to_end(16).await.unwrap();
    let elapsed = start.elapsed();
    assert_eq!(answer, b"k");
    conn.close(VarInt::from_u32(0), b"");
    elapsed
}

/// Holds `count` connections open and measures the server while they idle.
/// Returns the connections held, the server's CPU % and hotloop's timers
/// fired per second.
async fn idle(client: &Endpoint, running: &Running, count: usize) -> (usize, f64, Option<f64>) {
    let addr = running.addr;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let next = Arc::new(AtomicU64::new(0));
    let setups: Vec<_> = (0..IDLE_SETUP_IN_FLIGHT)
        .map(|_| {
            let (client, tx, next) = (client.clone(), tx.clone(), next.clone());
            tokio::spawn(async move {
                while (next.fetch_add(1, Ordering::Relaxed) as usize) < count {
                    match client.connect(addr, "localhost").unwrap().await {
                        Ok(conn) => {
                            let _ = tx.send(conn);
                        }
                        Err(e) => eprintln!("idle setup: {e}"),
                    }
                }
            })
        })
        .collect();
    drop(tx);
    for s in setups {
        s.await.unwrap();
    }
    let mut conns = Vec::with_capacity(count);
    while let Ok(c) = rx.try_recv() {
        conns.push(c);
    }
    // Let the setup's last packets settle, then measure.
    tokio::time::sleep(Duration::from_millis(500)).await;
    eprintln!("idle: measuring {} connections (server thread {})", conns.len(), running.tid);
    let cpu0 = thread_cpu(&running.tid);
    let timers0 = running.timers_fired.load(Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(IDLE_MEASURE).await;
    let elapsed = start.elapsed();
    let cpu = thread_cpu(&running.tid) - cpu0;
    let timers = running.timers_fired.load(Ordering::Relaxed) - timers0;
    let held = conns.iter().filter(|c| c.close_reason().is_none()).count();
    for c in &conns {
        c.close(VarInt::from_u32(0), b"");
    }
    client.wait_idle().await;
    let hotloop = running.timers_fired.load(Ordering::Relaxed) > 0;
    (
        held,
        cpu.as_secs_f64() / elapsed.as_secs_f64() * 100.0,
        hotloop.then(|| timers as f64 / elapsed.as_secs_f64()),
    )
}

/// The on-CPU time of thread `tid` of this process so far.
fn thread_cpu(tid: &str) -> Duration {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap_or_default();
    Duration::from_nanos(s.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0))
}

/// The calling thread's id, as `/proc/self/task` names it.
fn my_tid() -> String {
    let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    link.file_name().unwrap().to_string_lossy().into_owned()
}
