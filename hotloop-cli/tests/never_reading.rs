//! Clients that send and never read: the send timeout frees their
//! connections (nginx's `send_timeout`), on both drivers.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{stat, wait_until, Proc};
use hotloop::DriverKind;

/// Connects with a small receive buffer and sends `chunk` until the
/// connection stalls (the server stopped reading because its replies are
/// not read) or fails; returns the stream, still open, never read.
fn send_until_stalled(addr: SocketAddr, chunk: &[u8]) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&addr.into()).unwrap();
    let mut s: TcpStream = sock.into();
    s.set_write_timeout(Some(Duration::from_millis(300))).unwrap();
    // Bounded: the kernel's buffers on both sides hold a few MiB at most.
    for _ in 0..(256 << 20) / chunk.len() {
        if s.write_all(chunk).is_err() {
            break;
        }
    }
    s
}

fn check(driver: &str, app: &str, chunk: &'static [u8]) {
    let mut p = Proc::start(&[
        "serve",
        app,
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--driver",
        driver,
        "--send-timeout-ms",
        "300",
        // The idle timeout alone would never fire: the clients keep sending
        // until their own buffers fill, and then the server is writing, not reading.
        "--idle-timeout-ms",
        "600000",
        "--stats-addr",
        "127.0.0.1:0",
    ]);
    let addr = p.addr_after(" on ");
    let stats = p.addr_after("stats on ");
    let clients: Vec<_> =
        (0..6).map(|_| std::thread::spawn(move || send_until_stalled(addr, chunk))).collect();
    let held: Vec<TcpStream> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    // Every stalled connection is closed within a few send timeouts (the
    // clients still hold theirs open and never read).
    let freed = wait_until(Duration::from_secs(15), || stat(stats, "active_connections") == 0);
    assert!(freed, "{app} on {driver}: {} never-reading connections still open", {
        stat(stats, "active_connections")
    });
    // The server still serves.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    if app == "echo" {
        s.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
    } else {
        let reply = common::http_get(addr, "/");
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
    }
    drop(held);
}

const ECHO_CHUNK: &[u8] = &[b'e'; 64 * 1024];
const PIPELINED: &[u8] = b"GET / HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n";

#[hotloop::test(driver = "all")]
fn echo_clients_that_never_read_are_closed_at_the_send_timeout(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    check(driver, "echo", ECHO_CHUNK);
}

#[hotloop::test(driver = "all")]
fn http_clients_that_pipeline_and_never_read_are_closed_at_the_send_timeout(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    check(driver, "http", PIPELINED);
}
