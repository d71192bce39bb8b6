//! `hotloop serve` and `hotloop proxy` as a user runs them: real processes
//! on loopback, stopped by pid.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A server process, killed on drop if still running.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    /// Starts `hotloop ARGS` and collects its stderr lines.
    fn start(args: &[&str]) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hotloop"))
            .args(args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start hotloop");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc { child, lines: rx }
    }

    /// Waits for a stderr line containing `marker` and returns the address after `after`.
    fn addr_after(&self, after: &str) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(100)) {
                if let Some(rest) = line.split(after).nth(1) {
                    let token = rest.split_whitespace().next().unwrap();
                    let token = token.trim_start_matches("http://").trim_end_matches("/stats");
                    return token.parse().unwrap();
                }
            }
        }
        panic!("no line with `{after}` from hotloop");
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "hotloop did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    if let Err(e) = s.read_to_string(&mut out) {
        panic!("reading the reply to GET {path} failed after {out:?}: {e}");
    }
    out
}

#[test]
fn serve_http_answers_and_rejects_bad_requests() {
    let p = Proc::start(&[
        "serve",
        "http",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--body-size",
        "100",
        "--header-timeout-ms",
        "300",
    ]);
    let addr = p.addr_after(" on ");
    let ok = http_get(addr, "/");
    assert!(ok.starts_with("HTTP/1.1 200 OK"));
    assert!(ok.ends_with(&"x".repeat(100)));

    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"\x00\x01 not http\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");

    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let huge = format!("GET / HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n", "a".repeat(10_000));
    let _ = s.write_all(huge.as_bytes());
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 431"), "{reply}");
}

#[test]
fn serve_http_closes_a_slowloris_client_at_the_header_timeout() {
    let p = Proc::start(&[
        "serve",
        "http",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--header-timeout-ms",
        "300",
    ]);
    let addr = p.addr_after(" on ");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let start = Instant::now();
    let mut reply = Vec::new();
    // One byte every 50 ms: it never finishes its head.
    for b in b"GET / HTTP/1.1\r\nX-Slow: ".iter().cycle().take(200) {
        if s.write_all(&[*b]).is_err() {
            break;
        }
        let mut buf = [0u8; 256];
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
        if start.elapsed() > Duration::from_secs(5) {
            break;
        }
    }
    let took = start.elapsed();
    assert!(
        String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 408"),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "closed after {took:?}"
    );
}

#[test]
fn stats_endpoint_serves_json_and_prometheus() {
    let p = Proc::start(&[
        "serve",
        "echo",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--stats-addr",
        "127.0.0.1:0",
    ]);
    let addr = p.addr_after(" on ");
    let stats = p.addr_after("stats on ");
    for _ in 0..5 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
    }
    let json = http_get(stats, "/stats");
    // The endpoint runs on the runtime, but its connections are not the
    // application's: they do not count in `accepted`.
    let field = |name: &str| -> u64 {
        let v: serde_json::Value =
            serde_json::from_str(json.split_once("\r\n\r\n").unwrap().1).unwrap();
        v[name].as_u64().unwrap_or_else(|| panic!("no {name} in {json}"))
    };
    assert_eq!(field("accepted"), 5, "{json}");
    assert_eq!(field("stats_scrapes"), 1, "{json}");
    assert!(json.contains("\"driver\":"));
    assert!(json.contains("\"active_connections\":"));
    assert!(json.contains("\"workers\":[{"));
    let prom = http_get(stats, "/metrics");
    assert!(prom.contains("# TYPE hotloop_accepted_total counter"), "{prom}");
    assert!(prom.contains("hotloop_accepted_total{worker=\"0\"}"));
    let body = prom.split_once("\r\n\r\n").expect("a head and a body").1;
    check_prometheus_text(body);
    promtool_check(body);
}

/// Checks the Prometheus text exposition format (version 0.0.4): every
/// family has one `# HELP` then one `# TYPE` before its samples, names and
/// label names are valid, values parse, counters end in `_total`, and no
/// family appears twice.
fn check_prometheus_text(text: &str) {
    fn valid_name(n: &str) -> bool {
        let mut chars = n.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }
    let mut seen = std::collections::HashSet::new();
    let (mut help, mut kind): (Option<String>, Option<(String, String)>) = (None, None);
    let mut samples = 0;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, doc) = rest.split_once(' ').expect("HELP has a name and a text");
            assert!(valid_name(name) && !doc.trim().is_empty(), "bad HELP: {line}");
            assert!(seen.insert(name.to_string()), "family {name} appears twice");
            help = Some(name.to_string());
            kind = None;
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, t) = rest.split_once(' ').expect("TYPE has a name and a type");
            assert_eq!(help.as_deref(), Some(name), "TYPE without its HELP first: {line}");
            assert!(["counter", "gauge"].contains(&t), "unexpected type: {line}");
            if t == "counter" {
                assert!(name.ends_with("_total"), "a counter's name ends in _total: {line}");
            }
            kind = Some((name.to_string(), t.to_string()));
        } else if line.starts_with('#') || line.is_empty() {
            panic!("unexpected line: {line:?}");
        } else {
            let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
            value.parse::<f64>().unwrap_or_else(|_| panic!("bad value: {line}"));
            let name = series.split('{').next().unwrap();
            let family = kind.as_ref().map(|(n, _)| n.as_str());
            assert_eq!(family, Some(name), "sample outside its family: {line}");
            if let Some(labels) = series.strip_prefix(name).filter(|l| !l.is_empty()) {
                let inner = labels.strip_prefix('{').and_then(|l| l.strip_suffix('}'));
                let inner = inner.unwrap_or_else(|| panic!("bad labels: {line}"));
                for pair in inner.split(',') {
                    let (k, v) = pair.split_once('=').expect("label=value");
                    assert!(valid_name(k) && v.starts_with('"') && v.ends_with('"'), "{line}");
                }
            }
            samples += 1;
        }
    }
    assert!(samples > 20 && seen.len() > 20, "{text}");
}

/// `promtool check metrics` on `text`, when promtool is installed.
fn promtool_check(text: &str) {
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        eprintln!("skipped promtool: not installed (apt-get install prometheus)");
        return;
    };
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let report =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && report.trim().is_empty(), "promtool check metrics: {report}");
}

#[test]
fn a_stalled_scrape_does_not_hold_up_the_next() {
    let p = Proc::start(&[
        "serve",
        "echo",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--stats-addr",
        "127.0.0.1:0",
    ]);
    let stats = p.addr_after("stats on ");
    // Connected, half a request, then silence.
    let mut stalled: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(stats).unwrap()).collect();
    for s in &mut stalled {
        s.write_all(b"GET /stats HTTP/1.1\r\n").unwrap();
    }
    let start = Instant::now();
    for _ in 0..5 {
        assert!(http_get(stats, "/stats").contains("\"accepted\":"));
    }
    assert!(start.elapsed() < Duration::from_millis(1500), "took {:?}", start.elapsed());
    // The stalled ones are closed at the request timeout (2 s), not held forever.
    let mut b = [0u8; 256];
    stalled[0].set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let n = stalled[0].read(&mut b).unwrap_or(0);
    let text = String::from_utf8_lossy(&b[..n]);
    assert!(n == 0 || text.starts_with("HTTP/1.1"), "{text}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn sigterm_lets_in_flight_requests_finish() {
    // 300 ms of work per request: the requests are in flight when SIGTERM arrives.
    let mut p = Proc::start(&[
        "serve",
        "http",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--work-us",
        "300000",
        "--grace-ms",
        "10000",
    ]);
    let addr = p.addr_after(" on ");
    let clients: Vec<_> = (0..6).map(|_| std::thread::spawn(move || http_get(addr, "/"))).collect();
    std::thread::sleep(Duration::from_millis(150));
    let status = p.terminate();
    assert!(status.success(), "exit status {status}");
    for c in clients {
        let reply = c.join().unwrap();
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "an in-flight request was lost: {reply:?}");
    }
}

#[test]
fn proxy_forwards_and_skips_a_dead_backend() {
    let backend = Proc::start(&["serve", "echo", "--addr", "127.0.0.1:0", "--workers", "1"]);
    let backend_addr = backend.addr_after(" on ");
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let backends = format!("{dead},{backend_addr}");
    let proxy = Proc::start(&[
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--backend",
        &backends,
        "--workers",
        "1",
        "--stats-addr",
        "127.0.0.1:0",
    ]);
    let addr = proxy.addr_after(" on ");
    let stats = proxy.addr_after("stats on ");
    for i in 0..4 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let msg = format!("hello through the proxy {i}");
        s.write_all(msg.as_bytes()).unwrap();
        let mut back = vec![0u8; msg.len()];
        s.read_exact(&mut back).unwrap();
        assert_eq!(back, msg.as_bytes());
    }
    let json = http_get(stats, "/stats");
    assert!(json.contains("\"forwarded\":4"), "{json}");
    assert!(!json.contains("\"retries\":0"), "the dead backend was retried past: {json}");
}

#[test]
fn proxy_with_every_backend_down_closes_the_client_cleanly() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let proxy = Proc::start(&[
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--backend",
        &dead.to_string(),
        "--workers",
        "1",
    ]);
    let addr = proxy.addr_after(" on ");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 16];
    let n = s.read(&mut buf).expect("a clean close, not a reset or a hang");
    assert_eq!(n, 0);
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[test]
fn sigterm_under_load_answers_every_accepted_request() {
    let mut p = Proc::start(&[
        "serve",
        "http",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--grace-ms",
        "10000",
    ]);
    let addr = p.addr_after(" on ");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Closed-loop clients: one `Connection: close` request per connection.
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let (mut ok, mut refused, mut cut) = (0u64, 0u64, 0u64);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Ok(mut s) = TcpStream::connect(addr) else {
                        refused += 1;
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
                    let mut reply = String::new();
                    match s.read_to_string(&mut reply) {
                        Ok(_) if reply.starts_with("HTTP/1.1 200 OK") => ok += 1,
                        _ => cut += 1,
                    }
                }
                (ok, refused, cut)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let status = p.terminate();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut ok, mut cut) = (0, 0);
    for c in clients {
        let (o, _refused, x) = c.join().unwrap();
        ok += o;
        cut += x;
    }
    assert!(status.success(), "exit status {status}");
    // The server's last line says how many connections it accepted.
    let mut accepted = None;
    while let Ok(line) = p.lines.recv_timeout(Duration::from_secs(2)) {
        if let Some(rest) = line.split("cut at the drain deadline); ").nth(1) {
            accepted = rest.split_whitespace().next().and_then(|n| n.parse::<u64>().ok());
        }
    }
    let accepted = accepted.expect("the server reported its accepted count");
    assert!(ok > 100, "the load ran: {ok} answered");
    // Every connection the server accepted got its answer; connections it
    // never accepted (reset when the listener closed) are the only ones cut.
    assert_eq!(ok, accepted, "answered {ok}, accepted {accepted}, cut {cut}");
}

#[test]
fn serve_http_answers_unsupported_requests_with_a_clear_status() {
    let p = Proc::start(&["serve", "http", "--addr", "127.0.0.1:0", "--workers", "1"]);
    let addr = p.addr_after(" on ");
    for (request, status) in [
        ("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc", "405"),
        ("GET / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n", "501"),
        ("GET / HTTP/2.0\r\n\r\n", "505"),
    ] {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with(&format!("HTTP/1.1 {status}")), "{request:?} -> {reply:?}");
    }
}

/// A backend that accepts and resets at once, and one that never accepts
/// (its backlog full, so connects stall): the proxy closes the client cleanly
/// or moves on to the next backend within its connect timeout.
#[test]
fn proxy_survives_resetting_and_stalling_backends() {
    // Resets every connection it accepts.
    let resetter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let reset_addr = resetter.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in resetter.incoming().flatten() {
            let s = socket2::Socket::from(s);
            let _ = s.set_linger(Some(Duration::ZERO));
            drop(s);
        }
    });
    let proxy = Proc::start(&[
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--backend",
        &reset_addr.to_string(),
        "--workers",
        "1",
    ]);
    let addr = proxy.addr_after(" on ");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(b"hello");
    let mut buf = [0u8; 16];
    match s.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("got {n} bytes from a resetting backend"),
        Err(e) => {
            assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "the client was left hanging")
        }
    }

    // Never accepts: a listener with a tiny backlog, filled first.
    let staller = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    staller.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into()).unwrap();
    staller.listen(0).unwrap();
    let stall_addr = staller.local_addr().unwrap().as_socket().unwrap();
    let _fill: Vec<_> = (0..4)
        .filter_map(|_| TcpStream::connect_timeout(&stall_addr, Duration::from_millis(50)).ok())
        .collect();
    let backend = Proc::start(&["serve", "echo", "--addr", "127.0.0.1:0", "--workers", "1"]);
    let backend_addr = backend.addr_after(" on ");
    let backends = format!("{stall_addr},{backend_addr}");
    let proxy = Proc::start(&[
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--backend",
        &backends,
        "--workers",
        "1",
        "--connect-timeout-ms",
        "300",
    ]);
    let addr = proxy.addr_after(" on ");
    let start = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"ping").unwrap();
    let mut back = [0u8; 4];
    s.read_exact(&mut back).expect("the next backend answered");
    assert_eq!(&back, b"ping");
    assert!(start.elapsed() < Duration::from_secs(3), "took {:?}", start.elapsed());
    drop(staller);
}

/// Whether `program --version` runs; prints why a test skips when not.
fn have(program: &str) -> bool {
    let ok = Command::new(program).arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: `{program}` is not installed (apt-get install curl nghttp2-client)");
    }
    ok
}

#[test]
fn serve_hyper_runs_hyper_over_http1_and_h2c() {
    for driver in ["epoll", "uring"] {
        let p = Proc::start(&[
            "serve",
            "hyper",
            "--addr",
            "127.0.0.1:0",
            "--workers",
            "1",
            "--driver",
            driver,
            "--body-size",
            "5",
        ]);
        let addr = p.addr_after(" on ");
        // hyper answers with its own headers: no `Server: hotloop`, which the hand-written handler sends.
        let reply = http_get(addr, "/");
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
        assert!(reply.ends_with("xxxxx"), "{reply}");
        assert!(!reply.contains("Server: hotloop"), "the hand-written handler answered: {reply}");
        if have("curl") {
            let url = format!("http://{addr}/");
            for (flag, version) in [("--http1.1", "1.1"), ("--http2-prior-knowledge", "2")] {
                let out = Command::new("curl")
                    .args(["-sS", "--max-time", "10", "-w", " %{http_version}", flag, &url])
                    .output()
                    .unwrap();
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(
                    out.status.success(),
                    "curl {flag}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                assert_eq!(text, format!("xxxxx {version}"), "curl {flag} on {driver}");
            }
        }
        if have("h2load") {
            let out = Command::new("h2load")
                .args(["-n", "2000", "-c", "4", "-m", "8", "-T", "10", &format!("http://{addr}/")])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "h2load: {text}");
            assert!(
                text.contains("2000 succeeded, 0 failed, 0 errored"),
                "h2load over h2c on {driver}: {text}"
            );
        }
    }
}

/// A proxied download still flowing when a stop's drain deadline passes is
/// cut with a reset, never a clean end of stream that the client would take
/// for the whole of it.
#[hotloop::test(driver = "all")]
fn a_drain_deadline_cuts_a_proxied_stream_with_a_reset(driver: hotloop::DriverKind) {
    let source = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let source_addr = source.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in source.incoming().flatten() {
            std::thread::spawn(move || {
                let chunk = [b'x'; 1024];
                while s.write_all(&chunk).is_ok() {
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
        }
    });
    let mut proxy = crate::common::Proc::start(&[
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--backend",
        &source_addr.to_string(),
        "--workers",
        "1",
        "--driver",
        crate::common::driver_arg(driver),
        "--drain-timeout-ms",
        "300",
    ]);
    let addr = proxy.addr_after(" on ");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 4096];
    s.read_exact(&mut buf[..1024]).expect("the stream flows");
    proxy.signal("TERM");
    let end = loop {
        match s.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(_) => continue,
            Err(e) => break Err(e),
        }
    };
    assert!(
        matches!(&end, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the cut reached the client as {end:?}, not a reset"
    );
    assert!(proxy.wait_exit(Duration::from_secs(5)).is_some(), "the proxy did not exit");
}
