//! Stopping: what each signal does to `hotloop serve`, and how long a
//! graceful stop takes. Both drivers.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{read_response, Proc};
use hotloop::DriverKind;

fn serve(driver: &str, app: &str, extra: &[&str]) -> (Proc, std::net::SocketAddr) {
    let mut args =
        vec!["serve", app, "--addr", "127.0.0.1:0", "--workers", "2", "--driver", driver];
    args.extend_from_slice(extra);
    let mut p = Proc::start(&args);
    let addr = p.addr_after(" on ");
    (p, addr)
}

fn keep_alive_request(s: &mut TcpStream) -> String {
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    read_response(s)
}

/// Idle keep-alive connections close at once; a request in flight is
/// answered with `Connection: close`; the process exits when it is done,
/// long before the grace period.
#[hotloop::test(driver = "all")]
fn sigterm_closes_idle_connections_at_once_and_exits_when_the_last_is_done(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (mut p, addr) =
        serve(driver, "http", &["--grace-ms", "20000", "--stats-addr", "127.0.0.1:0"]);
    let stats = p.addr_after("stats on ");
    let mut idle: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            assert!(keep_alive_request(&mut s).contains("Connection: keep-alive"));
            s
        })
        .collect();
    assert!(common::wait_until(Duration::from_secs(10), || common::stat(
        stats,
        "active_connections"
    ) == 3));
    let start = Instant::now();
    p.signal("TERM");
    let status = p.wait_exit(Duration::from_secs(15)).expect("hotloop did not exit");
    let took = start.elapsed();
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(3), "{driver}: exit took {took:?} with a 20 s grace period");
    for s in &mut idle {
        assert_eq!(s.read(&mut [0u8; 64]).unwrap(), 0, "an idle connection was not closed");
    }

    // 600 ms of work per request: one request in flight when the signal comes.
    let (mut p, addr) = serve(driver, "http", &["--grace-ms", "20000", "--work-us", "600000"]);
    let client = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let reply = keep_alive_request(&mut s);
        let after = s.read(&mut [0u8; 64]);
        (reply, after.ok())
    });
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    p.signal("TERM");
    let status = p.wait_exit(Duration::from_secs(15)).expect("hotloop did not exit");
    let took = start.elapsed();
    let (reply, after) = client.join().unwrap();
    assert!(status.success(), "{status}");
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
    assert!(
        reply.contains("Connection: close"),
        "{driver}: the last answer kept the connection: {reply}"
    );
    assert_eq!(after, Some(0), "the connection was not closed after its last answer");
    assert!(took < Duration::from_secs(4), "{driver}: exit took {took:?} with a 20 s grace period");
}

/// `--drain-idle-quiet-ms` at the drain timeout (haproxy's
/// `idle-close-on-response`): a drained keep-alive connection is kept past
/// the default quiet second for its next request, which is answered with
/// `Connection: close`; then the process exits. One whose client never
/// sends again is cut at the drain's deadline and counted. The hand-written
/// handlers (`serve http`), hyper's (`serve hyper`) and the file server's
/// (`serve static`).
#[hotloop::test(driver = "all")]
fn a_long_idle_quiet_keeps_idle_connections_for_their_next_request(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let root = common::TempDir::new("stop-static");
    std::fs::write(root.join("index.html"), "hello").unwrap();
    let serve = |driver, app, extra: &[&str]| {
        let static_root = ["--root", root.path().to_str().unwrap()];
        let root_arg: &[&str] = if app == "static" { &static_root } else { &[] };
        serve(driver, app, &[extra, root_arg].concat())
    };
    for app in ["http", "hyper", "static"] {
        let (mut p, addr) =
            serve(driver, app, &["--grace-ms", "20000", "--drain-idle-quiet-ms", "20000"]);
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let first = keep_alive_request(&mut s).to_ascii_lowercase();
        assert!(first.starts_with("http/1.1 200"), "{app}: {first}");
        assert!(!first.contains("connection: close"), "{app}: {first}");
        p.signal("TERM");
        // Past the default quiet time: still open, and still serving.
        assert!(p.wait_exit(Duration::from_millis(1500)).is_none(), "{app}: exited early");
        let start = Instant::now();
        let last = keep_alive_request(&mut s).to_ascii_lowercase();
        assert!(last.starts_with("http/1.1 200"), "{driver} {app}: {last}");
        assert!(last.contains("connection: close"), "{driver} {app}: {last}");
        assert_eq!(s.read(&mut [0u8; 64]).unwrap(), 0, "{app}: not closed after its last answer");
        let status = p.wait_exit(Duration::from_secs(15)).expect("hotloop did not exit");
        assert!(status.success(), "{app}: {status}");
        let took = start.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "{driver} {app}: exit took {took:?} after the last answer"
        );

        // A client that never sends again is cut at the drain's deadline,
        // and counted.
        let (mut p, addr) =
            serve(driver, app, &["--grace-ms", "1500", "--drain-idle-quiet-ms", "20000"]);
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        keep_alive_request(&mut s);
        let start = Instant::now();
        p.signal("TERM");
        let status = p.wait_exit(Duration::from_secs(15)).expect("hotloop did not exit");
        let took = start.elapsed();
        assert!(status.success(), "{app}: {status}");
        assert!(
            took >= Duration::from_millis(1400),
            "{driver} {app}: closed early, after {took:?}"
        );
        assert_eq!(s.read(&mut [0u8; 64]).unwrap_or(0), 0, "{app}: still open after the exit");
        let lines = p.collect_lines(Duration::from_millis(200)).join("\n");
        assert!(lines.contains("1 connections cut at the drain deadline"), "{app}: {lines}");
    }
}

/// `serve APP` for the drain tests below: `serve static` over a root
/// holding `big` (`body` bytes) and `index.html`, the others answering
/// `body` bytes; its address and the path to ask for.
fn serve_sized(
    driver: &str,
    app: &str,
    root: &common::TempDir,
    body: usize,
    extra: &[&str],
) -> (Proc, std::net::SocketAddr, &'static str) {
    let body = body.to_string();
    let root = root.join("");
    let (own, path): ([&str; 2], _) = if app == "static" {
        (["--root", root.to_str().unwrap()], "/big")
    } else {
        (["--body-size", &body], "/")
    };
    let (p, addr) = serve(driver, app, &[extra, &own[..]].concat());
    (p, addr, path)
}

/// Reads an answer's head, byte by byte (lowercased), and its length.
fn read_head(s: &mut TcpStream) -> (String, usize) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "{}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    (head, len)
}

/// A drained keep-alive connection whose last answer (1 MiB, in the
/// kernel's send queue when its last write returns) its client reads
/// slowly, with a small receive buffer: the drain's quiet time counts
/// from the client's acknowledgement of the answer's end, not from that
/// write. Counted from the write, it ran out while the client was still
/// reading, and the client's next request, sent as soon as it had read
/// the answer, met the close. It is answered, with `Connection: close`.
/// `serve http`, `serve hyper` and `serve static`.
#[hotloop::test(driver = "all")]
fn a_drain_lets_a_slow_reader_finish_its_answer_before_the_quiet_time_counts(driver: DriverKind) {
    const BODY: usize = 1 << 20;
    let driver = common::driver_arg(driver);
    let root = common::TempDir::new("stop-slow-reader");
    std::fs::write(root.join("big"), vec![b'x'; BODY]).unwrap();
    for app in ["http", "hyper", "static"] {
        let extra = ["--grace-ms", "20000", "--drain-idle-quiet-ms", "500"];
        let (mut p, addr, path) = serve_sized(driver, app, &root, BODY, &extra);
        // A small receive buffer: the answer waits in the server's kernel.
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.set_recv_buffer_size(16 * 1024).unwrap();
        sock.connect(&addr.into()).unwrap();
        let mut s = TcpStream::from(sock);
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n");
        s.write_all(request.as_bytes()).unwrap();
        let (head, len) = read_head(&mut s);
        assert!(head.starts_with("http/1.1 200"), "{app}: {head}");
        assert!(!head.contains("connection: close"), "{app}: {head}");
        assert_eq!(len, BODY, "{app}: {head}");
        p.signal("TERM");
        assert!(p.wait_for_line("draining", Duration::from_secs(10)), "{app}: {:?}", p.seen);
        // About 1 MiB/s: the answer takes twice the quiet time to read.
        let mut buf = vec![0u8; 16 * 1024];
        let mut left = len;
        while left > 0 {
            let n = s.read(&mut buf[..left.min(16 * 1024)]).unwrap();
            assert!(n > 0, "{driver} {app}: closed with {left} bytes of the answer unread");
            left -= n;
            std::thread::sleep(Duration::from_millis(15));
        }
        // At once, as a keep-alive client does.
        s.write_all(request.as_bytes()).unwrap();
        let (last, len) = read_head(&mut s);
        assert!(last.starts_with("http/1.1 200"), "{driver} {app}: the next request got {last:?}");
        assert!(last.contains("connection: close"), "{driver} {app}: {last}");
        let (rest, _) = common::read_to_close(&mut s);
        assert_eq!(rest.len(), len, "{driver} {app}: the last answer");
        let status = p.wait_exit(Duration::from_secs(15)).expect("hotloop did not exit");
        assert!(status.success(), "{app}: {status}");
    }
}

/// `--drain-idle-quiet-ms` at the drain timeout keeps a connection that
/// was idle for longer than that before the stop: it is not closed before
/// the drain's deadline, and its next request is answered with
/// `Connection: close`. The quiet time counted from when the connection
/// fell idle, so it was over at the stop, and the connection was closed
/// at once. `serve http`, `serve hyper` and `serve static`.
#[hotloop::test(driver = "all")]
fn a_quiet_time_at_the_drain_timeout_keeps_connections_idle_since_before_the_stop(
    driver: DriverKind,
) {
    let driver = common::driver_arg(driver);
    let root = common::TempDir::new("stop-idle-before");
    std::fs::write(root.join("index.html"), "hello").unwrap();
    for app in ["http", "hyper", "static"] {
        let extra = ["--grace-ms", "1000", "--drain-idle-quiet-ms", "1000"];
        let (mut p, addr, _) = serve_sized(driver, app, &root, 5, &extra);
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let first = keep_alive_request(&mut s).to_ascii_lowercase();
        assert!(first.starts_with("http/1.1 200"), "{app}: {first}");
        assert!(!first.contains("connection: close"), "{app}: {first}");
        // Idle for longer than the quiet time, then the stop.
        std::thread::sleep(Duration::from_millis(1300));
        p.signal("TERM");
        assert!(p.wait_for_line("draining", Duration::from_secs(10)), "{app}: {:?}", p.seen);
        std::thread::sleep(Duration::from_millis(100));
        s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        let (last, _) = common::read_to_close(&mut s);
        let last = String::from_utf8_lossy(&last).to_ascii_lowercase();
        assert!(last.starts_with("http/1.1 200"), "{driver} {app}: the request got {last:?}");
        assert!(last.contains("connection: close"), "{driver} {app}: {last}");
        let status = p.wait_exit(Duration::from_secs(15)).expect("hotloop did not exit");
        assert!(status.success(), "{app}: {status}");
    }
}

/// The TLS bytes of `request` as `tls`'s client sends them, not yet sent:
/// a test writes them to the socket in parts of its choosing.
fn sealed(tls: &mut common::TlsClient, request: &[u8]) -> Vec<u8> {
    tls.conn.writer().write_all(request).unwrap();
    let mut out = Vec::new();
    while tls.conn.wants_write() {
        tls.conn.write_tls(&mut out).unwrap();
    }
    out
}

/// Sleeps until `since + at`.
fn sleep_until(since: Instant, at: Duration) {
    if let Some(left) = (since + at).checked_duration_since(Instant::now()) {
        std::thread::sleep(left);
    }
}

/// A TLS request whose record comes in two segments, the second after the
/// quiet time (`--drain-idle-quiet-ms`): the server's TLS layer reads the
/// first from the socket and has no plaintext to show for it, so the
/// socket is empty and nothing reached the handler. The connection was
/// closed over the request when the quiet time ran out (the stop came
/// first), or at once (the first segment came first, after a quiet
/// longer than the quiet time); the request is answered, with
/// `Connection: close`. `serve http` (the hand-written handlers) and
/// `serve hyper`.
#[hotloop::test(driver = "all")]
fn a_tls_request_split_over_the_quiet_time_is_answered_at_a_stop(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let quiet = Duration::from_millis(800);
    let quiet_ms = quiet.as_millis().to_string();
    let request = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n";
    for app in ["http", "hyper"] {
        for stop_first in [true, false] {
            let what = format!("{driver} {app}, stop first: {stop_first}");
            let extra = ["--grace-ms", "20000", "--drain-idle-quiet-ms", &quiet_ms];
            let (mut p, addr, cert) = common::serve_tls(driver, app, &extra);
            let mut tls = common::tls_client(addr, &cert.path);
            tls.sock.set_nodelay(true).unwrap();
            tls.write_all(request).unwrap();
            let first = read_response(&mut tls).to_ascii_lowercase();
            assert!(first.starts_with("http/1.1 200"), "{what}: {first}");
            assert!(!first.contains("connection: close"), "{what}: {first}");
            let answered = Instant::now();
            let record = sealed(&mut tls, request);
            let (head, rest) = record.split_at(record.len() / 2);
            let stop = |p: &mut Proc| {
                p.signal("TERM");
                assert!(p.wait_for_line("draining", Duration::from_secs(10)), "{what}");
            };
            if stop_first {
                // Stopped within the quiet time; the first segment, then
                // the rest once the quiet time has run out.
                stop(&mut p);
                sleep_until(answered, quiet / 4);
                tls.sock.write_all(head).unwrap();
                sleep_until(answered, quiet + quiet / 4);
            } else {
                // The first segment after a longer quiet, then the stop,
                // then the rest.
                sleep_until(answered, quiet + quiet / 4);
                tls.sock.write_all(head).unwrap();
                std::thread::sleep(Duration::from_millis(150));
                stop(&mut p);
                std::thread::sleep(Duration::from_millis(100));
            }
            tls.sock.write_all(rest).unwrap();
            let (reply, _) = common::read_to_close(&mut tls);
            let reply = String::from_utf8_lossy(&reply).to_ascii_lowercase();
            assert!(reply.starts_with("http/1.1 200"), "{what}: the request got {reply:?}");
            assert!(reply.contains("connection: close"), "{what}: {reply}");
            let status = p.wait_exit(Duration::from_secs(15)).expect("hotloop did not exit");
            assert!(status.success(), "{what}: {status}");
        }
    }
}

/// A second SIGTERM, or SIGQUIT, stops at once, whatever is open; what
/// it cuts is counted in `drain_cut`, as its event says.
#[hotloop::test(driver = "all")]
fn a_second_sigterm_or_sigquit_stops_at_once(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    for (first, second) in [("TERM", Some("TERM")), ("INT", Some("QUIT")), ("QUIT", None)] {
        // An echo connection has no request boundary: a graceful stop waits for it.
        let (mut p, addr) = serve(driver, "echo", &["--grace-ms", "30000"]);
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"hi").unwrap();
        s.read_exact(&mut [0u8; 2]).unwrap();
        p.signal(first);
        if let Some(second) = second {
            assert!(p.wait_for_line("no longer accepting", Duration::from_secs(10)));
            assert!(
                p.wait_exit(Duration::from_millis(300)).is_none(),
                "SIG{first} did not wait for the open connection"
            );
            p.signal(second);
        }
        let start = Instant::now();
        let status = p.wait_exit(Duration::from_secs(15)).expect("hotloop did not exit");
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "SIG{first} then {second:?} took {:?}",
            start.elapsed()
        );
        assert!(status.success(), "{status}");
        p.collect_lines(Duration::from_millis(200));
        assert!(p.seen.iter().any(|l| l.contains("stopped at once")), "{:?}", p.seen);
        // Counted in `drain_cut`, whose event says so.
        let counted = p.seen.iter().any(|l| {
            l.starts_with("hotloop: ") && l.contains("1 connections cut by a forced stop")
        });
        assert!(counted, "{driver}: SIG{first} then {second:?}: no drain_cut event: {:?}", p.seen);
    }
}

/// SIGHUP, SIGUSR1 and SIGUSR2 do not stop the server (they used to kill it).
#[hotloop::test(driver = "all")]
fn sighup_and_the_user_signals_are_answered_not_fatal(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (mut p, addr) = serve(driver, "http", &[]);
    for sig in ["HUP", "USR1", "USR2"] {
        p.signal(sig);
    }
    assert!(p.wait_for_line("SIGHUP ignored", Duration::from_secs(10)), "{:?}", p.seen);
    assert!(p.wait_for_line("connections open", Duration::from_secs(10)), "{:?}", p.seen);
    assert!(p.wait_for_line("User2 ignored", Duration::from_secs(10)), "{:?}", p.seen);
    assert!(p.child.try_wait().unwrap().is_none(), "a signal stopped the server");
    assert!(common::http_get(addr, "/").starts_with("HTTP/1.1 200 OK"));
}

/// Every mode runs the same skeleton (`mode.rs`): the banner with its
/// address, the stats endpoint with the mode's gauge, SIGUSR1's status
/// line, SIGHUP answered without TLS, a SIGTERM drain and the farewell,
/// for `serve` over TCP and QUIC and for both proxies.
#[hotloop::test(driver = "all")]
fn every_mode_starts_answers_signals_and_stops_the_same_way(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let common = ["--driver", driver, "--workers", "2", "--stats-addr", "127.0.0.1:0"];
    // No client connects: the proxies' backend is never dialled.
    let modes: [(&[&str], Option<&str>); 4] = [
        (&["serve", "echo", "--addr", "127.0.0.1:0"], None),
        (&["serve", "quic", "--addr", "127.0.0.1:0"], None),
        (&["proxy", "--listen", "127.0.0.1:0", "--backend", "127.0.0.1:9"], Some("0 forwarded")),
        (
            &["proxy", "--mode", "http", "--listen", "127.0.0.1:0", "--backend", "127.0.0.1:9"],
            Some("0 requests"),
        ),
    ];
    for (args, farewell) in modes {
        let mut p = Proc::start(&[args, &common[..]].concat());
        let name = format!("hotloop {}", args[0]);
        let addr = p.addr_after(" on ");
        assert_eq!(addr.ip(), std::net::Ipv4Addr::LOCALHOST, "{args:?}: {:?}", p.seen);
        let stats = p.addr_after("stats on ");
        assert_eq!(common::stat(stats, "active_connections"), 0, "{args:?}");
        p.signal("USR1");
        p.signal("HUP");
        let status = format!("{name}: 0 connections open");
        assert!(p.wait_for_line(&status, Duration::from_secs(10)), "{args:?}: {:?}", p.seen);
        let hup = format!("{name}: SIGHUP ignored");
        assert!(p.wait_for_line(&hup, Duration::from_secs(10)), "{args:?}: {:?}", p.seen);
        p.signal("TERM");
        let exit = p.wait_exit(Duration::from_secs(15)).expect("hotloop did not exit");
        assert!(exit.success(), "{args:?}: {exit}");
        let stopped = format!("{name}: stopped (0 connections cut at the drain deadline)");
        assert!(p.wait_for_line(&stopped, Duration::from_secs(5)), "{args:?}: {:?}", p.seen);
        if let Some(last) = farewell {
            let last = format!("{name}: {last}");
            assert!(p.wait_for_line(&last, Duration::from_secs(5)), "{args:?}: {:?}", p.seen);
        }
    }
}
