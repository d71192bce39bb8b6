//! Clients that send and never read: the send timeout frees their
//! connections (nginx's `send_timeout`), and so does a shorter idle
//! timeout, since nothing moves on them either way; echo, http and hyper,
//! plain and TLS, on both drivers.

use crate::common;

use std::any::Any;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{stat, wait_until, Proc};
use hotloop::DriverKind;

/// A connected socket with a small receive buffer, so that the server's
/// replies fill it soon.
fn small_buffer_socket(addr: SocketAddr) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&addr.into()).unwrap();
    let s: TcpStream = sock.into();
    s.set_write_timeout(Some(Duration::from_millis(300))).unwrap();
    s
}

/// Sends `chunk` on `s` until the connection stalls (the server stopped
/// reading because its replies are not read) or fails.
fn write_until_stalled(s: &mut impl Write, chunk: &[u8]) {
    // Bounded: the kernel's buffers on both sides hold a few MiB at most.
    for _ in 0..(256 << 20) / chunk.len() {
        if s.write_all(chunk).and_then(|()| s.flush()).is_err() {
            break;
        }
    }
}

/// Connects (over TLS when `cert` is given) and sends `chunk` until the
/// connection stalls; returns the connection, still open, never read.
fn send_until_stalled(addr: SocketAddr, chunk: &[u8], cert: Option<&Path>) -> Box<dyn Any + Send> {
    let tcp = small_buffer_socket(addr);
    match cert {
        None => {
            let mut s = tcp;
            write_until_stalled(&mut s, chunk);
            Box::new(s)
        }
        Some(cert) => {
            let mut s = common::tls_client_over(tcp, cert, &[]);
            write_until_stalled(&mut s, chunk);
            Box::new(s)
        }
    }
}

/// Checks that one fresh connection is served: the echo or the answer.
fn served(addr: SocketAddr, app: &str, cert: Option<&Path>) {
    let (send, expect): (&[u8], &[u8]) = match app {
        "echo" => (b"ping", b"ping"),
        _ => (b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", b"HTTP/1.1 200 OK"),
    };
    let mut got = vec![0u8; expect.len()];
    match cert {
        None => {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(send).unwrap();
            s.read_exact(&mut got).unwrap();
        }
        Some(cert) => {
            let mut s = common::tls_client(addr, cert);
            s.write_all(send).unwrap();
            s.flush().unwrap();
            s.read_exact(&mut got).unwrap();
        }
    }
    assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(expect));
}

/// Six clients (three over TLS) send on `app` and never read; every
/// connection must be closed within `within`, and the server must still
/// serve. `limits` are
/// the timeout flags.
fn check(driver: &str, app: &str, chunk: &[u8], tls: bool, limits: &[&str], within: Duration) {
    let stats_args = ["--stats-addr", "127.0.0.1:0"];
    let (mut p, addr, cert) = if tls {
        let (p, addr, cert) = common::serve_tls(driver, app, &[limits, &stats_args[..]].concat());
        (p, addr, Some(cert))
    } else {
        let mut args = vec!["serve", app, "--addr", "127.0.0.1:0", "--workers", "2"];
        args.extend_from_slice(&["--driver", driver]);
        args.extend_from_slice(limits);
        args.extend_from_slice(&stats_args);
        let mut p = Proc::start(&args);
        let addr = p.addr_after(" on ");
        (p, addr, None)
    };
    let stats = p.addr_after("stats on ");
    let cert_path = cert.as_ref().map(|c| c.path.as_path());
    let held: Vec<_> = std::thread::scope(|scope| {
        // Fewer over TLS: each stalls only after megabytes of records,
        // which a debug build encrypts slowly.
        let clients: Vec<_> = (0..if tls { 3 } else { 6 })
            .map(|_| scope.spawn(|| send_until_stalled(addr, chunk, cert_path)))
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    // Every stalled connection is closed in time (the clients still hold
    // theirs open and never read).
    let start = Instant::now();
    let freed = wait_until(within, || stat(stats, "active_connections") == 0);
    assert!(
        freed,
        "{app} (TLS: {tls}) on {driver} with {limits:?}: {} never-reading connections still open after {:?}",
        stat(stats, "active_connections"),
        start.elapsed()
    );
    served(addr, app, cert_path);
    drop(held);
}

const ECHO_CHUNK: &[u8] = &[b'e'; 64 * 1024];
const PIPELINED: &[u8] = b"GET / HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n";

/// The send timeout alone: the idle timeout is far away.
const SEND_TIMEOUT: &[&str] = &["--send-timeout-ms", "300", "--idle-timeout-ms", "600000"];
/// The idle timeout alone: the send timeout is left at its default (60 s).
const IDLE_TIMEOUT: &[&str] = &["--idle-timeout-ms", "300"];

#[hotloop::test(driver = "all")]
fn echo_clients_that_never_read_are_closed_at_the_send_timeout(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    check(driver, "echo", ECHO_CHUNK, false, SEND_TIMEOUT, Duration::from_secs(15));
}

#[hotloop::test(driver = "all")]
fn http_clients_that_pipeline_and_never_read_are_closed_at_the_send_timeout(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    check(driver, "http", PIPELINED, false, SEND_TIMEOUT, Duration::from_secs(15));
}

/// A write that waits on a client that never reads is a connection on
/// which nothing moves: the idle timeout closes it, not only the send
/// timeout (60 s by default).
#[hotloop::test(driver = "all")]
fn clients_that_never_read_are_closed_at_the_idle_timeout(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    for (app, chunk) in [("echo", ECHO_CHUNK), ("http", PIPELINED)] {
        check(driver, app, chunk, false, IDLE_TIMEOUT, Duration::from_secs(5));
    }
}

/// The same over TLS.
#[hotloop::test(driver = "all")]
fn tls_clients_that_never_read_are_closed_at_the_idle_timeout(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    for (app, chunk) in [("echo", ECHO_CHUNK), ("http", PIPELINED)] {
        check(driver, app, chunk, true, IDLE_TIMEOUT, Duration::from_secs(5));
    }
}

/// `serve hyper`: hyper's HTTP/1.1 connections follow the send timeout and
/// the idle timeout too.
#[hotloop::test(driver = "all")]
fn hyper_clients_that_never_read_are_closed_at_the_send_and_idle_timeouts(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    check(driver, "hyper", PIPELINED, false, SEND_TIMEOUT, Duration::from_secs(5));
    check(driver, "hyper", PIPELINED, false, IDLE_TIMEOUT, Duration::from_secs(5));
}

/// The same over TLS.
#[hotloop::test(driver = "all")]
fn hyper_tls_clients_that_never_read_are_closed_at_the_send_and_idle_timeouts(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    check(driver, "hyper", PIPELINED, true, SEND_TIMEOUT, Duration::from_secs(5));
    check(driver, "hyper", PIPELINED, true, IDLE_TIMEOUT, Duration::from_secs(5));
}

/// `serve hyper` at an open-file limit of 256 under 260 clients that each
/// pipeline 200 requests for 64 KiB answers and never read (more clients
/// than descriptors: the last ones wait in the backlog): the idle timeout
/// frees their descriptors, so 20 new clients after them are all served.
#[hotloop::test(driver = "all")]
fn hyper_at_the_descriptor_limit_serves_new_clients_after_never_reading_ones(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let args = [
        "serve",
        "hyper",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--driver",
        driver,
        "--idle-timeout-ms",
        "1000",
        "--header-timeout-ms",
        "1000",
        "--body-size",
        "65536",
    ];
    let mut p = Proc::start_with_nofile(256, &args);
    let addr = p.addr_after(" on ");
    let pipelined = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n".repeat(200);
    let held: Vec<TcpStream> = (0..260)
        .filter_map(|_| {
            let mut s = small_buffer_socket(addr);
            s.write_all(&pipelined).ok().map(|()| s)
        })
        .collect();
    assert!(held.len() > 256, "only {} clients got their requests out", held.len());
    let start = Instant::now();
    for n in 0..20 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").unwrap();
        let mut head = [0u8; 15];
        let got = s.read_exact(&mut head);
        assert!(
            got.is_ok() && &head == b"HTTP/1.1 200 OK",
            "{driver}: new client {n} not served {:?} after the never-reading ones: {got:?} ({} descriptors open)",
            start.elapsed(),
            p.fds()
        );
    }
    drop(held);
}
