//! `hotloop serve hyper` under hostile clients: idle HTTP/2 connections
//! are sent a GOAWAY and closed at the idle timeout, an HTTP/2 client that
//! never reads is cut at the send timeout (HTTP/1.1 ones:
//! `never_reading.rs`), and a client that ends its side after its request
//! (a TCP half-close, or a TLS close_notify) still gets the answer; plain
//! and TLS, on both drivers.

use crate::common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{read_to_close, stat, wait_until, Certificate, Proc};
use hotloop::DriverKind;

/// `hotloop serve hyper` (over TLS with `tls`) with a stats endpoint:
/// the process, its address, the stats address and the certificate.
fn start(
    driver: &str,
    tls: bool,
    extra: &[&str],
) -> (Proc, SocketAddr, SocketAddr, Option<Certificate>) {
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
                let cert = cert.as_ref().map(|c| c.path.as_path());
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

/// Fifty clients at once each send a request and end their side: each
/// reads the whole answer.
fn half_closing(driver: &str, tls: bool) {
    let (_p, addr, _stats, cert) = start(driver, tls, &[]);
    let answers: Vec<String> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..50)
            .map(|_| {
                let cert = cert.as_ref().map(|c| c.path.as_path());
                scope.spawn(move || {
                    let tcp = TcpStream::connect(addr).unwrap();
                    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let request = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n";
                    let got = match cert {
                        None => {
                            let mut s = tcp;
                            s.write_all(request).unwrap();
                            s.shutdown(Shutdown::Write).unwrap();
                            read_to_close(&mut s).0
                        }
                        Some(cert) => {
                            let mut s = common::tls_client_over(tcp, cert, &[b"http/1.1"]);
                            s.write_all(request).unwrap();
                            s.conn.send_close_notify();
                            s.flush().unwrap();
                            s.sock.shutdown(Shutdown::Write).unwrap();
                            read_to_close(&mut s).0
                        }
                    };
                    String::from_utf8_lossy(&got).into_owned()
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let unanswered = answers
        .iter()
        .filter(|a| !(a.starts_with("HTTP/1.1 200 OK") && a.ends_with(&"x".repeat(64))))
        .count();
    assert_eq!(unanswered, 0, "{driver} (TLS: {tls}): {unanswered} of 50 unanswered");
}

#[hotloop::test(driver = "all")]
fn a_client_that_half_closes_after_its_request_gets_the_answer(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    half_closing(driver, false);
    half_closing(driver, true);
}

/// An HTTP/2 frame: its header (length, type, flags, stream) and payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut frame = len.to_be_bytes()[1..].to_vec();
    frame.extend_from_slice(&[kind, flags]);
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// An HTTP/2 client that lifts flow control, asks for a hundred 64 KiB
/// answers and never reads them, while it keeps sending PINGs: the
/// server's writes stall, and the send timeout cuts the connection.
#[hotloop::test(driver = "all")]
fn a_never_reading_http2_client_meets_the_send_timeout(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let limits =
        ["--send-timeout-ms", "300", "--idle-timeout-ms", "600000", "--body-size", "65536"];
    let (_p, addr, stats, _) = start(driver, false, &limits);
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&addr.into()).unwrap();
    let mut s: TcpStream = sock.into();
    s.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    // SETTINGS_INITIAL_WINDOW_SIZE at its largest, and the connection's window too.
    hello.extend(h2_frame(4, 0, 0, &[0, 4, 0x7f, 0xff, 0xff, 0xff]));
    hello.extend(h2_frame(8, 0, 0, &(0x7fff_ffffu32 - 65_535).to_be_bytes()));
    // GET / (:method GET, :scheme http, :path /, :authority t), END_STREAM | END_HEADERS.
    for stream in (1..200).step_by(2) {
        hello.extend(h2_frame(1, 0x5, stream, &[0x82, 0x86, 0x84, 0x41, 0x01, b't']));
    }
    s.write_all(&hello).unwrap();
    assert!(wait_until(Duration::from_secs(2), || stat(stats, "active_connections") == 1));
    let start = Instant::now();
    let mut closed = false;
    while start.elapsed() < Duration::from_secs(4) {
        if stat(stats, "active_connections") == 0 {
            closed = true;
            break;
        }
        if s.write_all(&h2_frame(6, 0, 0, &[0; 8])).is_err() {
            // The server cut it; the stats say so on the next round.
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(closed, "{driver}: still open after {:?}", start.elapsed());
}

/// `serve hyper`'s lingering close reads the client to its end as the
/// hand-written servers' does (`http_edges.rs`): 1 MiB of requests
/// pipelined behind a closing one, while the 8 MiB answer is read through
/// a 4 KiB receive buffer, and the answer arrives whole. Before, the
/// linger dropped 64 reads (256 KiB) and closed on the rest, and the
/// kernel's reset dropped the answer's unsent tail.
#[hotloop::test(driver = "all")]
fn a_lingering_close_reads_the_client_to_its_end(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_p, addr, _stats, _) = start(driver, false, &["--body-size", "8388608"]);
    let got = common::answer_with_a_megabyte_pipelined_behind(addr);
    assert_eq!(
        common::body_lengths(&got),
        (8 << 20, 8 << 20),
        "{driver}: the answer was cut short"
    );
}

/// An HTTP/2 client that gives no flow-control window and pings every
/// 200 ms: each stream whose answer has waited for window for the send
/// timeout is reset.
#[hotloop::test(driver = "all")]
fn a_stream_the_client_gives_no_window_is_reset_at_the_send_timeout(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let extra = ["--body-size", "1048576", "--send-timeout-ms", "500"];
    let (_p, addr, _stats, _) = start(driver, false, &extra);
    let (reset, _) = crate::http_proxy::windowless_h2_client(addr, 0, 4, || true);
    for (i, took) in reset.iter().enumerate() {
        let took = took.unwrap_or_else(|| panic!("{driver}: stream {} not reset", 2 * i + 1));
        assert!(
            took < Duration::from_secs(4),
            "{driver}: stream {} reset after {took:?}",
            2 * i + 1
        );
    }
}

/// An HTTP/2 client that gives one byte of flow-control window per stream
/// and pings every 200 ms: hyper took each 1 MiB answer whole as soon as
/// that byte was there and ended the stream's task, and h2 held the rest
/// with no deadline, for good. The answer's last byte is now held back
/// until the rest is sent, so each stream is reset at the send timeout.
#[hotloop::test(driver = "all")]
fn a_stream_the_client_gives_one_byte_of_window_is_reset_at_the_send_timeout(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let extra = ["--body-size", "1048576", "--send-timeout-ms", "500"];
    let (_p, addr, _stats, _) = start(driver, false, &extra);
    let (reset, _) = crate::http_proxy::windowless_h2_client(addr, 1, 4, || true);
    for (i, took) in reset.iter().enumerate() {
        let took = took.unwrap_or_else(|| panic!("{driver}: stream {} not reset", 2 * i + 1));
        assert!(
            took < Duration::from_secs(4),
            "{driver}: stream {} reset after {took:?}",
            2 * i + 1
        );
    }
}
