//! `hotloop-bench load` against the floor server, over loopback, in every mode.
//!
//! Each test starts its own floor server on an ephemeral port and stops it
//! with SIGTERM by pid; every child process runs under a deadline.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_hotloop-bench");

/// The longest any child process may run in these tests.
const CHILD_DEADLINE: Duration = Duration::from_secs(30);

/// A floor server child, stopped with SIGTERM on drop.
struct Floor {
    child: Child,
    addr: SocketAddr,
}

impl Floor {
    fn start(app: &str) -> Floor {
        Floor::start_with(app, &[], None)
    }

    /// Starts the server; `nofile` caps its open-file limit (soft and hard).
    fn start_with(app: &str, extra: &[&str], nofile: Option<u64>) -> Floor {
        Floor::start_kind("floor", app, extra, nofile)
    }

    /// Starts `peer KIND` (`floor`, or `floor-uring`) like [`Floor::start_with`].
    fn start_kind(kind: &str, app: &str, extra: &[&str], nofile: Option<u64>) -> Floor {
        let mut cmd = Command::new(BIN);
        cmd.args(["peer", kind, app, "--addr", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(n) = nofile {
            // SAFETY: the closure only calls setrlimit(2), which is
            // async-signal-safe, on a stack value.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit { rlim_cur: n, rlim_max: n };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().expect("start the floor server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("read the banner");
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("unexpected banner {line:?}"));
        Floor { child, addr }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Descriptors the server holds open now.
    fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).unwrap().count()
    }

    /// Sends SIGTERM and checks the server exits cleanly and promptly.
    fn stop(mut self) {
        // SAFETY: kill(2) on our own child's pid has no memory-safety
        // preconditions.
        assert_eq!(unsafe { libc::kill(self.pid(), libc::SIGTERM) }, 0);
        let status = wait_with_deadline(&mut self.child, Duration::from_secs(5));
        assert!(status.success(), "floor exited with {status}");
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn wait_with_deadline(child: &mut Child, deadline: Duration) -> std::process::ExitStatus {
    let until = Instant::now() + deadline;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("child {} still running after {deadline:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `hotloop-bench load --json` with `args` and returns its report.
fn load(addr: SocketAddr, args: &[&str]) -> Value {
    let started = Instant::now();
    let mut child = Command::new(BIN)
        .args(["load", "--json", "--addr", &addr.to_string()])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start hotloop-bench load");
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let status = wait_with_deadline(&mut child, CHILD_DEADLINE);
    assert!(status.success(), "hotloop-bench load {args:?} exited with {status}");
    assert!(started.elapsed() < CHILD_DEADLINE);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("bad JSON {out:?}: {e}"))
}

fn assert_clean(r: &Value, completed: u64) {
    assert_eq!(r["errors"]["total"], 0, "{r}");
    assert_eq!(r["completed"], completed, "{r}");
    assert!(r["rate_per_s"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["latency_us"]["p50"].as_f64().unwrap() >= 1.0, "{r}");
    let counted: u64 =
        r["histogram_us"].as_array().unwrap().iter().map(|p| p[1].as_u64().unwrap()).sum();
    assert_eq!(counted, completed, "{r}");
}

#[test]
fn http_every_mode() {
    let floor = Floor::start("http");
    let r = load(floor.addr, &["--mode", "serial", "-n", "200"]);
    assert_clean(&r, 200);
    assert_eq!(r["mode"], "serial");
    assert_eq!(r["connections"], 1);
    assert_eq!(r["stopped_by"], "requests");
    assert_clean(&load(floor.addr, &["--mode", "keepalive", "-c", "4", "-n", "500"]), 500);
    assert_clean(&load(floor.addr, &["--mode", "churn", "-c", "8", "-n", "300"]), 300);
    let r = load(
        floor.addr,
        &["--mode", "churn", "-c", "6", "-n", "60", "--sources", "3", "--pin", "0"],
    );
    assert_clean(&r, 60);
    assert_eq!(r["sources"], 3);
    let r = load(floor.addr, &["--mode", "burst", "-c", "100"]);
    assert_clean(&r, 100);
    assert_eq!(r["max_in_flight"], 100);
    floor.stop();
}

#[test]
fn echo_every_mode() {
    // Two workers, two SO_REUSEPORT listeners on one ephemeral port.
    let floor = Floor::start_with("echo", &["--workers", "2"], None);
    assert_clean(&load(floor.addr, &["--proto", "echo", "--mode", "serial", "-n", "100"]), 100);
    assert_clean(
        &load(floor.addr, &["--proto", "echo", "--mode", "keepalive", "-c", "3", "-n", "300"]),
        300,
    );
    assert_clean(
        &load(floor.addr, &["--proto", "echo", "--mode", "churn", "-c", "5", "-n", "200"]),
        200,
    );
    let r = load(floor.addr, &["--proto", "echo", "--mode", "burst", "-c", "200", "--size", "128"]);
    assert_clean(&r, 200);
    assert_eq!(r["proto"], "echo");
    // A payload larger than the socket buffers crosses many reads.
    assert_clean(
        &load(
            floor.addr,
            &["--proto", "echo", "--mode", "keepalive", "-n", "5", "--size", "8000000"],
        ),
        5,
    );
    floor.stop();
}

#[test]
fn open_loop_and_time_bound() {
    let floor = Floor::start("http");
    let r = load(floor.addr, &["--mode", "keepalive", "-c", "2", "--rate", "1000", "-n", "100"]);
    assert_clean(&r, 100);
    assert_eq!(r["target_rate_per_s"], 1000.0);
    // 100 requests at 1000/s take about 0.1 s, however fast the server is.
    let elapsed = r["elapsed_s"].as_f64().unwrap();
    assert!((0.08..2.0).contains(&elapsed), "{r}");
    let r =
        load(floor.addr, &["--mode", "churn", "-c", "2", "--duration", "0.3", "--warmup", "0.1"]);
    assert_eq!(r["stopped_by"], "duration");
    assert_eq!(r["errors"]["total"], 0, "{r}");
    assert!((0.29..0.5).contains(&r["elapsed_s"].as_f64().unwrap()), "{r}");
    floor.stop();
}

#[test]
fn an_open_loop_that_falls_behind_counts_the_starts_it_did_not_send() {
    // 5 ms of work per request and two connections: at most 400 of the
    // 1,000 starts a second can go out; the rest wait for a connection.
    let floor = Floor::start_with("http", &["--work-us", "5000"], None);
    let r =
        load(floor.addr, &["--mode", "churn", "-c", "2", "--rate", "1000", "--duration", "0.5"]);
    assert_eq!(r["stopped_by"], "duration");
    let offered = r["offered"].as_u64().unwrap();
    let not_sent = r["not_sent"].as_u64().unwrap();
    let done = r["completed"].as_u64().unwrap() + r["errors"]["total"].as_u64().unwrap();
    assert!((495..=505).contains(&offered), "{r}");
    assert!(not_sent >= 250, "{r}");
    // Every due start is accounted for: answered, failed, cut off by the
    // end, or never sent.
    let unfinished = r["unfinished"].as_u64().unwrap();
    assert!(done + unfinished + not_sent >= offered - 1, "{r}");
    // Each start not sent is in the latencies, at its age when the run ended.
    let samples: u64 =
        r["histogram_us"].as_array().unwrap().iter().map(|b| b[1].as_u64().unwrap()).sum();
    assert_eq!(samples, r["completed"].as_u64().unwrap() + not_sent, "{r}");
    // A generator that keeps up leaves none.
    let r =
        load(floor.addr, &["--mode", "keepalive", "-c", "8", "--rate", "50", "--duration", "0.3"]);
    assert!(r["not_sent"].as_u64().unwrap() <= 1, "{r}");
    floor.stop();
}

#[test]
fn closed_port_reports_connect_errors() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    for mode in ["serial", "churn", "keepalive", "burst"] {
        let started = Instant::now();
        let r = load(port, &["--mode", mode, "-c", "5", "-n", "20", "--duration", "5"]);
        assert_eq!(r["completed"], 0, "{r}");
        let want = if mode == "burst" { 5 } else { 20 };
        assert_eq!(r["errors"]["connect"], want, "{mode}: {r}");
        assert_eq!(r["errors"]["total"], want, "{mode}: {r}");
        assert!(started.elapsed() < Duration::from_secs(3), "{mode} took {:?}", started.elapsed());
    }
}

#[test]
fn unanswered_requests_time_out() {
    // A listener that accepts (in the kernel backlog) but never answers.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let r = load(
        l.local_addr().unwrap(),
        &["--mode", "churn", "-c", "3", "--timeout", "200", "--duration", "2"],
    );
    assert_eq!(r["completed"], 0, "{r}");
    assert!(r["errors"]["timeout"].as_u64().unwrap() >= 3, "{r}");
}

#[test]
fn refuses_non_loopback_address() {
    let out =
        Command::new(BIN).args(["load", "--addr", "192.0.2.1:80", "-n", "1"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a loopback address"));
}

fn read_to_end_with_timeout(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("the server should close, not stall");
    out
}

#[test]
fn floor_answers_bad_requests_and_survives_abuse() {
    let floor = Floor::start("http");
    let baseline = floor.open_fds();

    let mut s = TcpStream::connect(floor.addr).unwrap();
    s.write_all(b"\x00\x01 not http\r\n\r\n").unwrap();
    let reply = read_to_end_with_timeout(&mut s);
    assert!(reply.starts_with(b"HTTP/1.1 400"), "{:?}", String::from_utf8_lossy(&reply));

    // Two pipelined requests, the second asking to close, split mid-head.
    let mut s = TcpStream::connect(floor.addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\nConn").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    s.write_all(b"ection: close\r\n\r\n").unwrap();
    let reply = String::from_utf8(read_to_end_with_timeout(&mut s)).unwrap();
    assert_eq!(reply.matches("HTTP/1.1 200 OK").count(), 2, "{reply}");
    assert!(reply.contains("Connection: close"));

    // Half-close after a request: the reply still arrives, then EOF.
    let mut s = TcpStream::connect(floor.addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert!(read_to_end_with_timeout(&mut s).starts_with(b"HTTP/1.1 200"));

    // Resets, mid-request and idle.
    for partial in [&b"GET / HT"[..], b""] {
        let s = socket2::Socket::from(TcpStream::connect(floor.addr).unwrap());
        s.set_linger(Some(Duration::ZERO)).unwrap();
        (&s).write_all(partial).unwrap();
        drop(s);
    }
    // An oversized head gets 431.
    let mut s = TcpStream::connect(floor.addr).unwrap();
    let _ = s.write_all(format!("GET /{} HTTP/1.1\r\n", "a".repeat(9000)).as_bytes());
    assert!(read_to_end_with_timeout(&mut s).starts_with(b"HTTP/1.1 431"));

    let r = load(floor.addr, &["--mode", "serial", "-n", "50"]);
    assert_clean(&r, 50);
    // Every connection above is closed on both sides now.
    let until = Instant::now() + Duration::from_secs(2);
    while floor.open_fds() != baseline && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(floor.open_fds(), baseline, "the server leaked descriptors");
    floor.stop();
}

#[test]
fn floor_echo_half_close_and_big_writes() {
    let floor = Floor::start("echo");
    let mut s = TcpStream::connect(floor.addr).unwrap();
    let payload: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
    let writer = {
        let mut w = s.try_clone().unwrap();
        let p = payload.clone();
        std::thread::spawn(move || {
            w.write_all(&p).unwrap();
            w.shutdown(Shutdown::Write).unwrap();
        })
    };
    let got = read_to_end_with_timeout(&mut s);
    writer.join().unwrap();
    assert_eq!(got.len(), payload.len());
    assert!(got == payload);
    floor.stop();
}

#[test]
fn floor_pauses_accepting_at_the_descriptor_limit() {
    // Few descriptors: most of the 40 connections wait in the backlog.
    let floor = Floor::start_with("http", &[], Some(24));
    let r = load(
        floor.addr,
        &["--mode", "keepalive", "-c", "40", "--duration", "0.5", "--timeout", "200", "-q"],
    );
    assert!(r["completed"].as_u64().unwrap() > 0, "{r}");
    // The server recovers once those clients are gone.
    let r = load(floor.addr, &["--mode", "serial", "-n", "20"]);
    assert_clean(&r, 20);
    floor.stop();
}

#[test]
fn floor_uring_pauses_accepting_at_the_descriptor_limit() {
    // Few descriptors: most of the 40 connections wait in the backlog.
    let floor = Floor::start_kind("floor-uring", "http", &[], Some(24));
    let r = load(
        floor.addr,
        &["--mode", "keepalive", "-c", "40", "--duration", "0.5", "--timeout", "200", "-q"],
    );
    assert!(r["completed"].as_u64().unwrap() > 0, "{r}");
    // The server recovers once those clients are gone.
    let r = load(floor.addr, &["--mode", "serial", "-n", "20"]);
    assert_clean(&r, 20);
    floor.stop();
}

#[test]
fn load_reports_its_own_descriptor_limit() {
    let floor = Floor::start("http");
    let mut child = Command::new(BIN);
    child
        .args(["load", "--json", "-q", "--addr", &floor.addr.to_string()])
        .args(["--mode", "churn", "-c", "100", "-n", "400"])
        .stdout(Stdio::piped());
    // SAFETY: the closure only calls setrlimit(2), which is
    // async-signal-safe, on a stack value.
    unsafe {
        child.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: 40, rlim_max: 40 };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = child.spawn().unwrap();
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(wait_with_deadline(&mut child, CHILD_DEADLINE).success());
    let r: Value = serde_json::from_str(out.trim()).unwrap();
    assert!(r["errors"]["fd_limit"].as_u64().unwrap() >= 1, "{r}");
    assert_eq!(r["errors"]["total"], r["errors"]["fd_limit"], "{r}");
    let done = r["completed"].as_u64().unwrap() + r["errors"]["total"].as_u64().unwrap();
    assert_eq!(done, 400, "{r}");
    assert!(r["max_in_flight"].as_u64().unwrap() < 40, "{r}");
    floor.stop();
}
