//! The stats endpoint under hostile clients: silent connections do not
//! keep scrapes out, a head must arrive within its deadline, methods other
//! than GET and HEAD get 405 and garbage 400, HEAD has no body, and
//! scrapes do not count as the served application's connections. Both
//! drivers.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{read_to_close, Proc};
use hotloop::DriverKind;

/// `hotloop serve echo` with a stats endpoint: the process, the echo
/// address and the stats address.
fn start(driver: &str) -> (Proc, SocketAddr, SocketAddr) {
    let mut p = Proc::start(&[
        "serve",
        "echo",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--driver",
        driver,
        "--stats-addr",
        "127.0.0.1:0",
    ]);
    let addr = p.addr_after(" on ");
    let stats = p.addr_after("stats on ");
    (p, addr, stats)
}

/// Sends `request` on a fresh connection and reads until the close.
fn exchange(stats: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(stats).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(request).unwrap();
    String::from_utf8_lossy(&read_to_close(&mut s).0).into_owned()
}

#[hotloop::test(driver = "all")]
fn scrapes_are_answered_while_silent_connections_are_open(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_p, _, stats) = start(driver);
    let mut silent: Vec<TcpStream> = (0..70).map(|_| TcpStream::connect(stats).unwrap()).collect();
    // Let the endpoint accept them all before the scrapes come.
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..10 {
        let reply = exchange(stats, b"GET /stats HTTP/1.1\r\nHost: t\r\n\r\n");
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{driver}: scrape {i}: {reply:?}");
        assert!(reply.contains("\"active_connections\":"), "{driver}: scrape {i}: {reply}");
    }
    // Every silent connection is closed without an answer: made room for
    // a scrape, or at the header deadline (2 s).
    let start = Instant::now();
    for s in &mut silent {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (got, _) = read_to_close(s);
        assert!(got.is_empty(), "{driver}: {}", String::from_utf8_lossy(&got));
    }
    assert!(start.elapsed() < Duration::from_secs(4), "{driver}: {:?}", start.elapsed());
}

#[hotloop::test(driver = "all")]
fn requests_other_than_get_and_head_get_their_status(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_p, _, stats) = start(driver);

    let reply = exchange(stats, b"POST /stats HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n");
    assert!(reply.starts_with("HTTP/1.1 405 "), "{driver}: {reply}");
    assert!(reply.contains("\r\nAllow: GET, HEAD\r\n"), "{driver}: {reply}");
    assert!(!reply.contains("\"accepted\""), "{driver}: {reply}");

    for garbage in [&b"hello\r\n\r\n"[..], b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n"]
    {
        let reply = exchange(stats, garbage);
        assert!(reply.starts_with("HTTP/1.1 400 "), "{driver}: {reply}");
        assert!(!reply.contains("\"accepted\""), "{driver}: {reply}");
    }

    let reply = exchange(stats, b"HEAD /stats HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{driver}: {reply}");
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    assert!(body.is_empty(), "{driver}: HEAD got a body: {body}");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map(|v| v.parse().unwrap())
        .unwrap();
    assert!(len > 0, "{driver}: {head}");

    let reply = exchange(stats, b"GET /nowhere HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(reply.starts_with("HTTP/1.1 404 "), "{driver}: {reply}");

    // Half a head, then silence: 408 at the header deadline.
    let start = Instant::now();
    let reply = exchange(stats, b"GET /stats HTTP/1.1\r\nHo");
    assert!(reply.starts_with("HTTP/1.1 408 "), "{driver}: {reply:?}");
    let took = start.elapsed();
    assert!(took > Duration::from_millis(1500) && took < Duration::from_secs(4), "{took:?}");
}

#[hotloop::test(driver = "all")]
fn scrapes_do_not_count_as_accepted_connections(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_p, addr, stats) = start(driver);
    for _ in 0..3 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
    }
    for _ in 0..4 {
        common::stats(stats);
    }
    let v = common::stats(stats);
    assert_eq!(v["accepted"], 3, "{driver}: {v}");
    assert_eq!(v["stats_scrapes"], 5, "{driver}: {v}");
    // The connection rate is the application's too.
    let prom = common::http_get(stats, "/metrics");
    let total: u64 = prom
        .lines()
        .filter(|l| l.starts_with("hotloop_accepted_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, 3, "{driver}: {prom}");
}

#[hotloop::test(driver = "all")]
fn each_workers_load_is_in_json_and_prometheus(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_p, addr, stats) = start(driver);
    // Three connections held open, each answered once so its handler holds it.
    let held: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(b"x").unwrap();
            let mut b = [0u8; 1];
            s.read_exact(&mut b).unwrap();
            s
        })
        .collect();
    let json = exchange(stats, b"GET /stats HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(json.matches("\"load_busy_permille\":").count(), 2, "{driver}: {json}");
    assert_eq!(json.matches("\"load_connections\":").count(), 2, "{driver}: {json}");
    // Two workers, and the `block_on` thread named apart from them.
    assert_eq!(json.matches("\"remote_wakeups\":").count(), 4, "{driver}: {json}");
    assert!(json.contains("\"block_on\":{"), "{driver}: {json}");
    let text = exchange(stats, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(text.contains("# TYPE hotloop_load_busy_permille gauge"), "{driver}: {text}");
    assert!(text.contains("hotloop_handoffs_out_total{worker=\"1\"}"), "{driver}: {text}");
    let connections: u64 = text
        .lines()
        .filter(|l| l.starts_with("hotloop_load_connections{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(connections, 3, "{driver}: {text}");
    drop(held);
}
