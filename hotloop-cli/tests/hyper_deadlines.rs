//! `hotloop serve hyper` under hostile clients: idle HTTP/2 connections
//! are sent a GOAWAY and closed at the idle timeout (clients that never
//! read: `never_reading.rs`); plain and TLS, on both drivers.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{read_to_close, stat, wait_until, Proc};
use hotloop::DriverKind;

/// `hotloop serve hyper` (over TLS with `tls`) with a stats endpoint:
/// the process, its address, the stats address and the certificate.
fn start(
    driver: &str,
    tls: bool,
    extra: &[&str],
) -> (Proc, SocketAddr, SocketAddr, Option<PathBuf>) {
    let stats_args = ["--stats-addr", "127.0.0.1:0"];
    let (mut p, addr, cert) = if tls {
        let (p, addr, cert) =
            common::serve_tls(driver, "hyper", &[extra, &stats_args[..]].concat());
        (p, addr, Some(cert))
    } else {
        let mut args = vec!["serve", "hyper", "--addr", "127.0.0.1:0", "--workers", "2"];
        args.extend_from_slice(&["--driver", driver]);
        args.extend_from_slice(extra);
        args.extend_from_slice(&stats_args);
        let mut p = Proc::start(&args);
        let addr = p.addr_after(" on ");
        (p, addr, None)
    };
    let stats = p.addr_after("stats on ");
    (p, addr, stats, cert)
}

/// A connection to `addr`, over TLS (offering `alpn`) when `cert` is given.
fn connect(addr: SocketAddr, cert: Option<&Path>, alpn: &[&[u8]]) -> Box<dyn ReadWrite> {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    match cert {
        None => Box::new(tcp),
        Some(cert) => Box::new(common::tls_client_over(tcp, cert, alpn)),
    }
}

trait ReadWrite: Read + Write + Send {}
impl<T: Read + Write + Send> ReadWrite for T {}

/// The HTTP/2 client preface and an empty SETTINGS frame.
const H2_PREFACE_AND_SETTINGS: &[u8] =
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
/// An HTTP/2 GOAWAY frame's type.
const H2_GOAWAY: u8 = 7;

/// The types of the HTTP/2 frames in `data`, in order.
fn frame_types(data: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    let mut at = 0;
    while at + 9 <= data.len() {
        let len = u32::from_be_bytes([0, data[at], data[at + 1], data[at + 2]]) as usize;
        types.push(data[at + 3]);
        at += 9 + len;
    }
    types
}

/// Four HTTP/2 connections open their session and go silent: each is sent
/// a GOAWAY and closed soon after the idle timeout.
fn idle_http2(driver: &str, tls: bool) {
    let (_p, addr, stats, cert) = start(driver, tls, &["--idle-timeout-ms", "300"]);
    let start = Instant::now();
    let ends: Vec<(Vec<u8>, Duration)> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..4)
            .map(|_| {
                let cert = cert.as_deref();
                scope.spawn(move || {
                    let mut s = connect(addr, cert, &[b"h2"]);
                    s.write_all(H2_PREFACE_AND_SETTINGS).unwrap();
                    s.flush().unwrap();
                    read_to_close(&mut s)
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    for (got, took) in ends {
        let types = frame_types(&got);
        assert!(types.contains(&H2_GOAWAY), "{driver} (TLS: {tls}): frames {types:?}");
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(4),
            "{driver} (TLS: {tls}): closed after {took:?}"
        );
    }
    assert!(
        wait_until(Duration::from_secs(2), || stat(stats, "active_connections") == 0),
        "{driver} (TLS: {tls}): {} connections still open after {:?}",
        stat(stats, "active_connections"),
        start.elapsed()
    );
}

#[hotloop::test(driver = "all")]
fn idle_http2_connections_get_a_goaway_and_close_at_the_idle_timeout(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    idle_http2(driver, false);
    idle_http2(driver, true);
}
