//! Name resolution runs on the blocking pool: `lookup_host`, connecting by
//! host name, and a resolver that blocks for two seconds while the same
//! single worker keeps serving another connection.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hotloop::net::{lookup_host, serve, ListenerOptions, TcpListener, TcpStream};
use hotloop::time::timeout;
use hotloop::{DriverKind, Runtime};

/// The host name the test resolver answers slowly.
const SLOW_HOST: &str = "slow.resolver.test";
/// How long it takes.
const SLOW_FOR: Duration = Duration::from_secs(2);

/// Answers `SLOW_HOST` with 127.0.0.1 after `SLOW_FOR`, as a stalled DNS
/// server would; other names go to the system resolver.
fn slow_resolver(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    if host == SLOW_HOST {
        std::thread::sleep(SLOW_FOR);
        return Ok(vec![SocketAddr::from(([127, 0, 0, 1], port))]);
    }
    std::net::ToSocketAddrs::to_socket_addrs(&(host, port)).map(Iterator::collect)
}

#[hotloop::test(driver = "all")]
async fn lookup_host_resolves_names_and_passes_addresses_through() {
    let addrs: Vec<_> = lookup_host("localhost:80").await.unwrap().collect();
    assert!(addrs.iter().all(|a| a.ip().is_loopback() && a.port() == 80), "{addrs:?}");
    assert!(!addrs.is_empty());
    let addrs: Vec<_> = lookup_host(("127.0.0.1", 81)).await.unwrap().collect();
    assert_eq!(addrs, vec![SocketAddr::from(([127, 0, 0, 1], 81))]);
    let before = hotloop::Handle::current().stats().blocking.completed;
    let addr = SocketAddr::from(([127, 0, 0, 1], 82));
    assert_eq!(lookup_host(addr).await.unwrap().collect::<Vec<_>>(), vec![addr]);
    assert_eq!(lookup_host("127.0.0.1:82").await.unwrap().collect::<Vec<_>>(), vec![addr]);
    assert_eq!(
        hotloop::Handle::current().stats().blocking.completed,
        before,
        "addresses need no trip to the pool"
    );
    assert!(lookup_host("no-port-here").await.is_err());
}

#[hotloop::test(driver = "all")]
async fn connect_by_host_name() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accept = hotloop::spawn(async move { listener.accept().await.map(|_| ()) });
    let stream = timeout(Duration::from_secs(10), TcpStream::connect(("localhost", port)))
        .await
        .expect("in time");
    // `localhost` may resolve to ::1 first, where nothing listens; connect
    // tries each address in turn.
    let stream = stream.unwrap();
    assert_eq!(stream.peer_addr().unwrap().port(), port);
    accept.await.unwrap().unwrap();
}

fn slow_resolver_does_not_stall_the_worker(driver: DriverKind) {
    hotloop::net::set_resolver(Some(slow_resolver));
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    // An echo server and the slow connect share worker 0.
    let server =
        serve(rt.handle(), "127.0.0.1:0", ListenerOptions::default(), common::echo).unwrap();
    let port = server.local_addr().port();
    let slow = rt.handle().spawn_on(0, move || async move {
        let start = Instant::now();
        let stream = TcpStream::connect(format!("{SLOW_HOST}:{port}")).await;
        (stream.map(|s| s.peer_addr().unwrap()), start.elapsed())
    });

    // While the resolver blocks, an existing connection keeps being served
    // by the same worker, round trip after round trip.
    let mut client = std::net::TcpStream::connect(server.local_addr()).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    let mut round_trips = 0u32;
    let mut slowest = Duration::ZERO;
    while start.elapsed() < SLOW_FOR - Duration::from_millis(500) {
        let t = Instant::now();
        client.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        client.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        slowest = slowest.max(t.elapsed());
        round_trips += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    let stats = rt.stats().blocking;
    assert_eq!(stats.running, 1, "the lookup is still on the pool: {stats:?}");
    assert!(!slow.is_finished(), "the slow connect is still waiting");
    assert!(round_trips >= 50, "only {round_trips} round trips while resolving");
    assert!(slowest < Duration::from_millis(200), "a round trip took {slowest:?}");

    let (peer, took) = slow.join().unwrap();
    assert_eq!(peer.unwrap().port(), port);
    assert!(took >= SLOW_FOR, "the connect waited for the resolver: {took:?}");
    assert!(took < SLOW_FOR + Duration::from_secs(2), "{took:?}");
    server.stop();
}

#[hotloop::test(driver = "all")]
fn a_slow_resolver_does_not_stall_the_worker(driver: DriverKind) {
    slow_resolver_does_not_stall_the_worker(driver);
}
