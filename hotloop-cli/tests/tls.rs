//! `hotloop serve --tls-cert --tls-key`: curl over HTTP/1.1 and HTTP/2
//! against the hyper app, curl against the http app, `openssl s_client`
//! against echo; clients that send garbage or stall mid-handshake lose
//! their connection within the handshake limit while others are served;
//! TLS connections follow the header and idle timeouts and the graceful
//! stop; a client that ends its side after a `Connection: close` request
//! reads the whole answer (hyper, http and static); a connection the
//! server gives up on gives its descriptor back at once; a bad
//! certificate or key is a startup error naming the file. Both drivers. Needs `curl` and `openssl` (the tests that use them skip
//! without).

use crate::common;

use hotloop::DriverKind;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{certificate, serve_tls, tls_client};

fn have(tool: &str) -> bool {
    let ok = Command::new(tool).arg("version").output().is_ok_and(|o| o.status.success())
        || Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: `{tool}` is not installed (apt-get install {tool})");
    }
    ok
}

/// `curl --cacert CERT ARGS URL...`: its output, after checking it succeeded.
fn curl(cert: &Path, args: &[&str], urls: &[String]) -> String {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert", cert.to_str().unwrap()])
        .args(args)
        .args(urls)
        .output()
        .unwrap();
    assert!(out.status.success(), "curl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Waits for the plain TCP connection to be closed by the server, within `limit`.
fn closed_within(s: &mut TcpStream, limit: Duration) -> Duration {
    s.set_read_timeout(Some(limit)).unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return start.elapsed(),
            // An alert before the close is fine.
            Ok(_) => continue,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                panic!("not closed within {limit:?}")
            }
            Err(_) => return start.elapsed(),
        }
    }
}

/// ALPN gives curl HTTP/2 when it asks for it, HTTP/1.1 when it does not.
#[hotloop::test(driver = "all")]
fn curl_speaks_http1_and_http2_to_the_hyper_app(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    if !have("curl") {
        return;
    }
    let (mut p, addr, cert) = serve_tls(driver, "hyper", &["--body-size", "5"]);
    let url = format!("https://localhost:{}/", addr.port());
    let out =
        curl(&cert.path, &["--http1.1", "-w", " %{http_version}"], std::slice::from_ref(&url));
    assert_eq!(out, "xxxxx 1.1", "{driver}");
    let features =
        String::from_utf8_lossy(&Command::new("curl").arg("--version").output().unwrap().stdout)
            .to_string();
    if features.contains("HTTP2") {
        let out = curl(&cert.path, &["--http2", "-w", " %{http_version}"], &[url]);
        assert_eq!(out, "xxxxx 2", "{driver}");
    } else {
        eprintln!("this curl has no HTTP/2: only HTTP/1.1 checked");
    }
    p.signal("TERM");
    assert!(p.wait_exit(Duration::from_secs(10)).expect("exit").success());
}

/// The http app over TLS: keep-alive works, and ALPN offers only
/// http/1.1, so a curl asking for HTTP/2 gets HTTP/1.1.
#[hotloop::test(driver = "all")]
fn curl_speaks_http1_to_the_http_app(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    if !have("curl") {
        return;
    }
    let (mut p, addr, cert) = serve_tls(driver, "http", &["--body-size", "3"]);
    let url = format!("https://127.0.0.1:{}/", addr.port());
    let out = curl(
        &cert.path,
        &["-w", " %{http_version} %{num_connects}\n"],
        &[url.clone(), url.clone()],
    );
    // Two answers over one connection.
    assert_eq!(out, "xxx 1.1 1\nxxx 1.1 0\n", "{driver}");
    let out = curl(&cert.path, &["--http2", "-w", " %{http_version}"], &[url]);
    assert_eq!(out, "xxx 1.1", "{driver}");
    p.signal("TERM");
    assert!(p.wait_exit(Duration::from_secs(10)).expect("exit").success());
}

/// `openssl s_client`, verifying the certificate, gets its lines echoed.
#[hotloop::test(driver = "all")]
fn openssl_s_client_is_echoed(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    if !have("openssl") {
        return;
    }
    let (mut p, addr, cert) = serve_tls(driver, "echo", &[]);
    let mut client = Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string(), "-servername", "localhost"])
        .args(["-CAfile", cert.path.to_str().unwrap(), "-verify_return_error", "-quiet"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = client.stdin.take().unwrap();
    let stdout = client.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        (lines.next(), lines.next())
    });
    stdin.write_all(b"hello over tls\nand again\n").unwrap();
    stdin.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !reader.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = client.kill();
    let _ = client.wait();
    let (first, second) = reader.join().unwrap();
    assert_eq!(first.and_then(Result::ok).as_deref(), Some("hello over tls"), "{driver}");
    assert_eq!(second.and_then(Result::ok).as_deref(), Some("and again"), "{driver}");
    p.signal("TERM");
    assert!(p.wait_exit(Duration::from_secs(10)).expect("exit").success());
}

/// Garbage loses its connection at once, a client stalled mid-handshake
/// at the handshake limit; meanwhile another client is served.
#[hotloop::test(driver = "all")]
fn garbage_and_stalled_handshakes_lose_only_their_connection(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (mut p, addr, cert) = serve_tls(driver, "http", &["--handshake-timeout-ms", "600"]);
    // The first 5 bytes of a ClientHello record, announcing more that never comes.
    let mut stalled = TcpStream::connect(addr).unwrap();
    stalled.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).unwrap();
    let stall_start = Instant::now();
    // Plain HTTP on the TLS port.
    let mut garbage = TcpStream::connect(addr).unwrap();
    garbage.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let took = closed_within(&mut garbage, Duration::from_secs(5));
    assert!(took < Duration::from_millis(500), "{driver}: garbage took {took:?} to be dropped");
    // Another client, while the stalled one is open.
    let mut tls = tls_client(addr, &cert.path);
    tls.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").unwrap();
    let (reply, _) = common::read_to_close(&mut tls);
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{driver}: {reply}");
    closed_within(&mut stalled, Duration::from_secs(5));
    let took = stall_start.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(4),
        "{driver}: stalled handshake cut after {took:?}"
    );
    p.signal("TERM");
    assert!(p.wait_exit(Duration::from_secs(10)).expect("exit").success());
}

/// After the handshake a TLS connection follows the app's timeouts: an
/// http request head that does not come gets 408, an idle echo
/// connection is closed.
#[hotloop::test(driver = "all")]
fn a_tls_connection_follows_the_header_and_idle_timeouts(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (mut p, addr, cert) = serve_tls(driver, "http", &["--header-timeout-ms", "300"]);
    let mut tls = tls_client(addr, &cert.path);
    tls.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    let (reply, took) = common::read_to_close(&mut tls);
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 408"), "{driver}: {reply}");
    assert!(took < Duration::from_secs(3), "{driver}: 408 after {took:?}");
    p.signal("TERM");
    assert!(p.wait_exit(Duration::from_secs(10)).expect("exit").success());

    let (mut p, addr, cert) = serve_tls(driver, "echo", &["--idle-timeout-ms", "300"]);
    let mut tls = tls_client(addr, &cert.path);
    tls.write_all(b"ping").unwrap();
    let mut got = [0u8; 4];
    tls.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
    let (rest, took) = common::read_to_close(&mut tls);
    assert!(rest.is_empty(), "{driver}: {rest:?}");
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_secs(3),
        "{driver}: idle close after {took:?}"
    );
    p.signal("TERM");
    assert!(p.wait_exit(Duration::from_secs(10)).expect("exit").success());
}

/// A TLS client that sends and never reads is cut at the send timeout.
#[hotloop::test(driver = "all")]
fn a_tls_connection_follows_the_send_timeout(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (mut p, addr, cert) = serve_tls(driver, "echo", &["--send-timeout-ms", "300"]);
    let mut tls = tls_client(addr, &cert.path);
    tls.sock.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let chunk = vec![7u8; 64 * 1024];
    let start = Instant::now();
    let err = loop {
        if let Err(e) = tls.write_all(&chunk) {
            break e;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{driver}: never cut");
    };
    let kind = err.kind();
    assert!(
        !matches!(kind, std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        "{driver}: the server did not close: {err}"
    );
    p.signal("TERM");
    assert!(p.wait_exit(Duration::from_secs(10)).expect("exit").success());
}

/// SIGTERM closes an idle keep-alive TLS connection at once (with
/// close_notify) and the process exits long before the grace period.
#[hotloop::test(driver = "all")]
fn sigterm_closes_idle_tls_connections_at_once(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (mut p, addr, cert) =
        serve_tls(driver, "http", &["--grace-ms", "20000", "--body-size", "2"]);
    let mut tls = tls_client(addr, &cert.path);
    tls.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\nxx") {
        tls.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    assert!(String::from_utf8_lossy(&head).contains("keep-alive"));
    let start = Instant::now();
    p.signal("TERM");
    let status = p.wait_exit(Duration::from_secs(15)).expect("hotloop did not exit");
    assert!(status.success(), "{status}");
    assert!(start.elapsed() < Duration::from_secs(3), "{driver}: exit took {:?}", start.elapsed());
    let mut rest = Vec::new();
    // close_notify: a clean end of stream, not an error.
    tls.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
}

/// SIGTERM with a connection that has sent nothing (no ClientHello yet):
/// it is closed once silent for the drain's quiet time (1 s), as an idle
/// plain connection is, not counted as cut, and the process exits within
/// about that, for `http` and `hyper` over TLS. Before, its handshake ran
/// on until the handshake limit (10 s), past the drain's 5 s deadline, which
/// cut it.
#[hotloop::test(driver = "all")]
fn sigterm_closes_a_silent_tls_handshake_once_quiet(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    for app in ["http", "hyper"] {
        let (mut p, addr, _cert) = serve_tls(driver, app, &["--drain-timeout-ms", "5000"]);
        let mut silent = TcpStream::connect(addr).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let start = Instant::now();
        p.signal("TERM");
        let status = p.wait_exit(Duration::from_secs(15)).expect("hotloop did not exit");
        let took = start.elapsed();
        assert!(status.success(), "{status}");
        assert!(took < Duration::from_secs(3), "{driver} {app}: exit took {took:?}");
        assert!(p.wait_for_line("(0 connections cut", LIMIT_LINES), "{driver} {app}: {:?}", p.seen);
        closed_within(&mut silent, Duration::from_secs(1));
    }
}

/// How long to wait for a line the process printed before it exited.
const LIMIT_LINES: Duration = Duration::from_secs(5);

/// The body of the answers in [`close_notify_after_a_closing_request`]:
/// larger than the socket buffers take at once, so a reset at the
/// server's close would throw part of it away.
const LARGE_BODY_BYTES: usize = 1 << 20;

/// Twenty TLS clients each ask for a large answer with `Connection:
/// close`, and while it comes (100 ms later) end their side as a TLS
/// client does: a close_notify, then the TCP write side. Each must read
/// the whole answer. The server closes when the answer is written; it
/// closed on the unread close_notify, which made the kernel send a reset
/// and drop what the client had not read yet.
/// Returns a line for each client that read less than the whole answer.
fn close_notify_after_a_closing_request(driver: &str, app: &str, extra: &[&str]) -> Vec<String> {
    let (_p, addr, cert) = serve_tls(driver, app, extra);
    let got: Vec<(usize, Option<usize>)> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..20)
            .map(|_| {
                let cert = &cert.path;
                scope.spawn(move || {
                    let sock =
                        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                            .unwrap();
                    sock.set_recv_buffer_size(4096).unwrap();
                    sock.connect(&addr.into()).unwrap();
                    let tcp: TcpStream = sock.into();
                    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    let mut s = common::tls_client_over(tcp, cert, &[b"http/1.1"]);
                    s.write_all(b"GET /large HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                        .unwrap();
                    s.flush().unwrap();
                    std::thread::sleep(Duration::from_millis(100));
                    s.conn.send_close_notify();
                    let _ = s.flush();
                    let _ = s.sock.shutdown(std::net::Shutdown::Write);
                    let reply = common::read_to_close(&mut s).0;
                    let split = reply.windows(4).position(|w| w == b"\r\n\r\n");
                    let promised = split.and_then(|at| {
                        let head = String::from_utf8_lossy(&reply[..at]).into_owned();
                        head.lines()
                            .find_map(|l| {
                                l.split_once(':')
                                    .filter(|(name, _)| name.eq_ignore_ascii_case("content-length"))
                            })
                            .and_then(|(_, v)| v.trim().parse().ok())
                    });
                    (reply.len() - split.map_or(0, |at| at + 4), promised)
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    got.iter()
        .filter(|&&(body, promised)| promised != Some(body) || body != LARGE_BODY_BYTES)
        .map(|(body, promised)| format!("{app}: {body} bytes of body, {promised:?} promised"))
        .collect()
}

#[hotloop::test(driver = "all")]
fn a_client_that_ends_its_side_after_a_closing_request_reads_the_whole_answer(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let body = LARGE_BODY_BYTES.to_string();
    let mut short = Vec::new();
    for app in ["hyper", "http"] {
        short.extend(close_notify_after_a_closing_request(driver, app, &["--body-size", &body]));
    }
    let root = common::TempDir::new("tls-root");
    std::fs::write(root.join("large"), vec![b'x'; LARGE_BODY_BYTES]).unwrap();
    let root_arg = ["--root", root.path().to_str().unwrap()];
    short.extend(close_notify_after_a_closing_request(driver, "static", &root_arg));
    assert!(short.is_empty(), "{driver}: {} of 60 clients short: {short:#?}", short.len());
}

/// An error reply over TLS closes lingeringly once: a client that keeps
/// its connection open and sends nothing is closed at the linger bound
/// (2 s) after its 400. The reply lingered, and then the end of the
/// connection sent close_notify again and lingered a second time (4 s).
#[hotloop::test(driver = "all")]
fn an_error_reply_lingers_once(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let root = common::TempDir::new("tls-linger");
    let root_arg = root.join("");
    let stats_args = ["--stats-addr", "127.0.0.1:0"];
    for (app, extra) in [("http", vec![]), ("static", vec!["--root", root_arg.to_str().unwrap()])] {
        let (mut p, addr, cert) = serve_tls(driver, app, &[&extra[..], &stats_args[..]].concat());
        let stats = p.addr_after("stats on ");
        let mut tls = tls_client(addr, &cert.path);
        tls.write_all(b"\x00garbage\r\n\r\n").unwrap();
        // Up to the server's close_notify; the socket stays open.
        let (reply, _) = common::read_to_close(&mut tls);
        let start = Instant::now();
        let reply = String::from_utf8_lossy(&reply);
        assert!(reply.starts_with("HTTP/1.1 400"), "{driver} {app}: {reply}");
        let closed = common::wait_until(Duration::from_secs(8), || {
            common::stat(stats, "active_connections") == 0
        });
        let took = start.elapsed();
        assert!(closed, "{driver} {app}: still open after {took:?}");
        assert!(took < Duration::from_millis(3200), "{driver} {app}: closed after {took:?}");
        drop(tls);
    }
}

/// A TLS client with a small receive buffer that pipelines requests and
/// never reads, until the server stops taking them (a write makes no
/// progress for 200 ms) or ends the connection; the connection, held open.
fn pipeline_until_stalled(addr: std::net::SocketAddr, cert: &Path) -> common::TlsClient {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&addr.into()).unwrap();
    let tcp: TcpStream = sock.into();
    tcp.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut tls = common::tls_client_over(tcp, cert, &[b"http/1.1"]);
    let requests = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n".repeat(64);
    // Bounded: the kernel's buffers on both sides hold a few MiB of answers.
    for _ in 0..(64 << 20) / requests.len() {
        if tls.write_all(&requests).and_then(|()| tls.flush()).is_err() {
            break;
        }
    }
    tls
}

/// Twenty TLS clients pipeline requests and never read: the server gives
/// up on each at the send timeout (a TLS error reply whose close_notify
/// finds no room is given up on the same way: `conn/reject.rs`), and its
/// descriptors are back to what they were within about that. The give-up
/// shut the connection down through the stream, which on io_uring hands
/// the bytes written behind to the driver, and the driver kept sending to
/// a client that reads nothing for its write linger (5 s), holding the
/// descriptor (17 to 20 of the 20).
#[hotloop::test(driver = "all")]
fn connections_given_up_on_give_their_descriptors_back_at_once(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let extra = ["--send-timeout-ms", "300", "--body-size", "65536"];
    let (p, addr, cert) = serve_tls(driver, "http", &extra);
    let baseline = p.fds();
    let held: Vec<_> = std::thread::scope(|scope| {
        let clients: Vec<_> =
            (0..20).map(|_| scope.spawn(|| pipeline_until_stalled(addr, &cert.path))).collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let start = Instant::now();
    // The send timeout, and room for a busy machine: well before the
    // write linger.
    let back = common::wait_until(Duration::from_millis(2500), || p.fds() <= baseline);
    let took = start.elapsed();
    assert!(back, "{driver}: {} descriptors, {baseline} before, after {took:?}", p.fds());
    drop(held);
}

/// A file that is not a certificate, a missing key, a key that does not
/// match: each stops the start with an error naming the file.
#[test]
fn a_bad_certificate_or_key_is_a_startup_error_naming_the_file() {
    let (made, other) = (certificate(), certificate());
    let (cert, key, other_key) = (&made.path, &made.key, &other.key);
    let dir = cert.parent().unwrap();
    let junk = dir.join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let missing = dir.join("missing.pem");
    let cases = [
        (junk.clone(), key.clone(), junk.clone()),
        (cert.clone(), missing.clone(), missing.clone()),
        (cert.clone(), cert.clone(), cert.clone()),
        (cert.clone(), other_key.clone(), other_key.clone()),
    ];
    for (c, k, named) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_hotloop"))
            .args(["serve", "http", "--addr", "127.0.0.1:0", "--tls-cert"])
            .arg(&c)
            .arg("--tls-key")
            .arg(&k)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{c:?} {k:?}: started");
        assert!(
            err.contains(named.to_str().unwrap()),
            "{c:?} {k:?}: the error does not name {named:?}: {err}"
        );
    }
}
