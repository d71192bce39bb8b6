//! The proxy's idle timeout covers both directions together (haproxy's
//! `timeout tunnel`): one-way streams outlive it, and a cut reaches both
//! peers as a reset, never as a clean end of stream. Both drivers.

use crate::common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::Proc;
use hotloop::DriverKind;

const PIECE: usize = 1024;
const PIECES: usize = 15;
/// Between pieces: well under the idle timeout, and the whole stream well over it.
const GAP: Duration = Duration::from_millis(100);
const IDLE_MS: &str = "500";

/// A backend: the first connection streams to its silent client, the
/// second counts what its client uploads and answers with the count, the
/// third stays silent and reports how its read ended.
fn backend(l: TcpListener, silent_end: mpsc::Sender<std::io::Result<usize>>) {
    let mut conns = l.incoming();
    let mut s = conns.next().unwrap().unwrap();
    for _ in 0..PIECES {
        s.write_all(&[b'd'; PIECE]).unwrap();
        std::thread::sleep(GAP);
    }
    s.shutdown(Shutdown::Write).unwrap();
    let _ = s.read(&mut [0u8; 16]);

    let mut s = conns.next().unwrap().unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    s.write_all(got.len().to_string().as_bytes()).unwrap();
    drop(s);

    let mut s = conns.next().unwrap().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = silent_end.send(s.read(&mut [0u8; 16]));
}

fn run_proxy(driver: &str) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let backend_addr = l.local_addr().unwrap().to_string();
    let (tx, silent_end) = mpsc::channel();
    std::thread::spawn(move || backend(l, tx));
    let mut p = Proc::start(&[
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--backend",
        &backend_addr,
        "--workers",
        "1",
        "--driver",
        driver,
        "--idle-timeout-ms",
        IDLE_MS,
    ]);
    let addr = p.addr_after(" on ");

    // Download to a client that sends nothing: all of it, then a clean end.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = Vec::new();
    let end = s.read_to_end(&mut got);
    assert!(end.is_ok(), "the stream ended with {end:?} after {} bytes", got.len());
    assert_eq!(got.len(), PIECE * PIECES, "{driver}: a one-way download was truncated");
    drop(s);

    // Upload to a backend that says nothing until the end.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    for _ in 0..PIECES {
        s.write_all(&[b'u'; PIECE]).unwrap();
        std::thread::sleep(GAP);
    }
    s.shutdown(Shutdown::Write).unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert_eq!(reply, (PIECE * PIECES).to_string(), "{driver}: a one-way upload was cut");
    drop(s);

    // Both silent: cut at the idle timeout, as a reset on both sides.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let start = Instant::now();
    let client_end = s.read(&mut [0u8; 16]);
    let took = start.elapsed();
    assert!(
        matches!(&client_end, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "{driver}: the client saw {client_end:?}, not a reset"
    );
    assert!(took >= Duration::from_millis(400) && took < Duration::from_secs(10), "{took:?}");
    let backend_end = silent_end.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(
        matches!(&backend_end, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "{driver}: the backend saw {backend_end:?}, not a reset"
    );
}

#[hotloop::test(driver = "all")]
fn one_way_streams_outlive_the_idle_timeout_and_cuts_are_resets(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    run_proxy(driver);
}
