//! Upgrades of `hotloop serve` without a failed request: a new process
//! started with the same `--upgrade-socket` takes the listening sockets,
//! and the old one drains and exits; under load (keep-alive clients and
//! one connection per request, plain and TLS) nothing fails. A successor
//! that cannot start, or is stopped while it starts, leaves the old process
//! serving (TCP and QUIC), and takes no connection from the shared queues;
//! one that never says it is ready is dropped after
//! `--upgrade-ready-timeout-ms`, and the next one takes over.
//! QUIC connections of the old process are closed with a reason, and
//! counted as cut; so they are when the old process is stopped while a
//! successor that has its sockets starts, and only the successor reads
//! them from then on. A QUIC successor with more workers than sockets says
//! so. A process
//! whose stderr is gone still drains and exits. systemd's `LISTEN_FDS`.
//! SIGHUP reloads the TLS certificate, and keeps the old one when the new
//! files are bad. Both drivers.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{Proc, TempDir};
use hotloop::tls::rustls;
use hotloop::DriverKind;
use rustls::pki_types::{CertificateDer, ServerName};

const LIMIT: Duration = Duration::from_secs(20);

/// A fresh upgrade socket path, in a directory that goes (the socket
/// with it) when the returned guard is dropped.
fn socket_path() -> (TempDir, PathBuf) {
    let dir = TempDir::new("upgrade");
    let path = dir.join("upgrade.sock");
    (dir, path)
}

fn serve_args<'a>(
    app: &'a str,
    driver: &'a str,
    workers: &'a str,
    path: &'a Path,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec!["serve", app, "--addr", "127.0.0.1:0", "--workers", workers];
    args.extend_from_slice(&["--driver", driver, "--upgrade-socket", path.to_str().unwrap()]);
    args.extend_from_slice(extra);
    args
}

/// Starts a successor with `args` and waits until it serves and `old` has
/// drained and exited.
fn upgrade(old: &mut Proc, args: &[&str]) -> Proc {
    let mut new = Proc::start(args);
    assert!(
        new.wait_for_line("took the", LIMIT),
        "the successor did not take over: {:?}",
        new.seen
    );
    let status = old.wait_exit(LIMIT).expect("the old process did not exit after the hand-over");
    assert!(status.success(), "{status}");
    old.collect_lines(Duration::from_millis(100));
    assert!(old.seen.iter().any(|l| l.contains("drained after handing over")), "{:?}", old.seen);
    assert!(old.seen.iter().any(|l| l.contains("(0 connections cut")), "{:?}", old.seen);
    new
}

/// One HTTP/1.1 exchange on `s`: the response head and body, or what went
/// wrong.
fn exchange(s: &mut (impl Read + Write), keep_alive: bool) -> Result<String, String> {
    let req: &[u8] = if keep_alive {
        b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"
    } else {
        b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    };
    s.write_all(req).map_err(|e| format!("write: {e}"))?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            other => {
                return Err(format!("head: {other:?} after {:?}", String::from_utf8_lossy(&head)))
            }
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let len: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(str::to_string))
        .map_or(0, |v| v.trim().parse().unwrap_or(0));
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).map_err(|e| format!("body: {e}"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head);
    }
    Ok(head)
}

/// Clients until `stop`: keep-alive ones (reconnecting when an answer says
/// `Connection: close`) and one connection per request, over TLS when
/// `cert` is given. Returns the requests answered and the failures.
fn load(
    addr: SocketAddr,
    cert: Option<PathBuf>,
    stop: Arc<AtomicBool>,
) -> Vec<thread::JoinHandle<(usize, Vec<String>)>> {
    (0..4)
        .map(|i| {
            let (stop, cert) = (stop.clone(), cert.clone());
            thread::spawn(move || {
                let keep_alive = i % 2 == 0;
                let (mut answered, mut failed) = (0, Vec::new());
                let connect = || -> Box<dyn ReadWrite> {
                    let tcp = TcpStream::connect(addr).unwrap();
                    tcp.set_read_timeout(Some(LIMIT)).unwrap();
                    match &cert {
                        Some(cert) => Box::new(common::tls_client_over(tcp, cert, &[])),
                        None => Box::new(tcp),
                    }
                };
                let mut conn: Option<Box<dyn ReadWrite>> = None;
                while !stop.load(Ordering::Relaxed) {
                    let s = conn.get_or_insert_with(connect);
                    match exchange(s, keep_alive) {
                        Ok(head) => {
                            answered += 1;
                            if !keep_alive
                                || head.to_ascii_lowercase().contains("connection: close")
                            {
                                conn = None;
                            }
                        }
                        Err(e) => {
                            failed.push(e);
                            conn = None;
                        }
                    }
                }
                (answered, failed)
            })
        })
        .collect()
}

trait ReadWrite: Read + Write + Send {}
impl<T: Read + Write + Send> ReadWrite for T {}

fn upgrades_under_load(driver: DriverKind, app: &str, tls: bool) {
    let driver = common::driver_arg(driver);
    let (_dir, path) = socket_path();
    let cert = common::certificate();
    let (c, k) = (cert.path.to_str().unwrap(), cert.key.to_str().unwrap());
    let tls_args: Vec<&str> = if tls { vec!["--tls-cert", c, "--tls-key", k] } else { vec![] };
    let mut p = Proc::start(&serve_args(app, driver, "2", &path, &tls_args));
    let addr = p.addr_after(" on ");
    let stop = Arc::new(AtomicBool::new(false));
    let clients = load(addr, tls.then(|| cert.path.clone()), stop.clone());
    thread::sleep(Duration::from_millis(200));
    // Two upgrades, the worker count changing each time.
    for workers in ["1", "2"] {
        p = upgrade(&mut p, &serve_args(app, driver, workers, &path, &tls_args));
        thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    let mut answered = 0;
    for c in clients {
        let (n, failed) = c.join().unwrap();
        assert!(
            failed.is_empty(),
            "{driver} {app} tls {tls}: {} requests failed: {:?}",
            failed.len(),
            &failed[..failed.len().min(5)]
        );
        answered += n;
    }
    assert!(answered > 50, "{answered}");
    p.signal("TERM");
    assert!(p.wait_exit(LIMIT).expect("exit").success());
}

#[hotloop::test(driver = "all")]
fn http_upgrades_under_load_fail_no_request(driver: DriverKind) {
    upgrades_under_load(driver, "http", false);
}

#[hotloop::test(driver = "all")]
fn hyper_upgrades_under_load_fail_no_request(driver: DriverKind) {
    upgrades_under_load(driver, "hyper", false);
}

#[hotloop::test(driver = "all")]
fn tls_upgrades_under_load_fail_no_request(driver: DriverKind) {
    upgrades_under_load(driver, "http", true);
}

/// A successor that takes the sockets and then fails to start (its stats
/// address cannot be bound) leaves the old process serving, which says
/// so and counts it; a later successor takes over.
#[hotloop::test(driver = "all")]
fn a_successor_that_fails_to_start_leaves_the_old_one_serving(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_dir, path) = socket_path();
    let mut p =
        Proc::start(&serve_args("http", driver, "2", &path, &["--stats-addr", "127.0.0.1:0"]));
    let addr = p.addr_after(" on ");
    let stats = p.addr_after("stats on ");
    // 192.0.2.1 (TEST-NET-1) is not an address of this host: its bind fails.
    let mut failing =
        Proc::start(&serve_args("http", driver, "1", &path, &["--stats-addr", "192.0.2.1:9"]));
    let status = failing.wait_exit(LIMIT).expect("the failing successor did not exit");
    assert!(!status.success());
    assert!(p.wait_for_line("keeps serving", LIMIT), "{:?}", p.seen);
    assert_eq!(common::stat(stats, "upgrade_failures"), 1);
    assert_eq!(common::stat(stats, "upgrades_out"), 0);
    for _ in 0..10 {
        assert!(common::http_get(addr, "/").starts_with("HTTP/1.1 200"));
    }
    assert!(p.child.try_wait().unwrap().is_none(), "the old process stopped");
    let mut next = upgrade(&mut p, &serve_args("http", driver, "2", &path, &[]));
    assert!(common::http_get(addr, "/").starts_with("HTTP/1.1 200"));
    next.signal("TERM");
    assert!(next.wait_exit(LIMIT).expect("exit").success());
}

/// A successor that takes the sockets and then fails to start (its stats
/// address cannot be bound) accepts nothing from the queues it shares with
/// the old process, which holds its `--maxconn` of 1 while 20 connections
/// wait there: it fails before its accept loops start. Each has sent all of
/// its request head but the last line end, so one the successor had taken
/// would still be waiting when it exits, and be cut; the line ends follow
/// once it has exited. Once the old process has room, every one of them is
/// answered.
#[hotloop::test(driver = "all")]
fn a_successor_that_fails_to_start_takes_no_queued_connection(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_dir, path) = socket_path();
    let mut p = Proc::start(&serve_args("http", driver, "1", &path, &["--maxconn", "1"]));
    let addr = p.addr_after(" on ");
    let mut holder = TcpStream::connect(addr).unwrap();
    holder.set_read_timeout(Some(LIMIT)).unwrap();
    assert!(exchange(&mut holder, true).is_ok());
    let queued: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(LIMIT)).unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n").unwrap();
            s
        })
        .collect();
    let failing_args = ["--stats-addr", "192.0.2.1:9"];
    let mut failing = Proc::start(&serve_args("http", driver, "2", &path, &failing_args));
    let status = failing.wait_exit(LIMIT).expect("the failing successor did not exit");
    assert!(!status.success());
    assert!(p.wait_for_line("keeps serving", LIMIT), "{:?}", p.seen);
    for s in &queued {
        // A connection the successor cut may refuse this: its reply says so.
        let _ = (&*s).write_all(b"\r\n");
    }
    drop(holder);
    for (i, mut s) in queued.into_iter().enumerate() {
        let (got, _) = common::read_to_close(&mut s);
        let got = String::from_utf8_lossy(&got);
        assert!(got.starts_with("HTTP/1.1 200"), "{driver}: queued connection {i}: {got:?}");
    }
    p.signal("TERM");
    assert!(p.wait_exit(LIMIT).expect("exit").success());
}

/// True once process `pid` catches SIGTERM (its handler is installed).
fn catches_sigterm(pid: u32) -> bool {
    const SIGTERM: u32 = 15;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (SIGTERM - 1)) != 0)
}

/// A successor sent SIGTERM while it starts, before it serves, does not
/// take over: it stops without telling the old process to drain, and the
/// old process logs a failed successor and goes on serving. The successor
/// is held in its start-up while the old process is busy with another
/// successor (this test, which takes the sockets and then gives up).
#[hotloop::test(driver = "all")]
fn a_successor_stopped_while_it_starts_leaves_the_old_one_serving(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_dir, path) = socket_path();
    let stats_args = ["--stats-addr", "127.0.0.1:0"];
    let mut p = Proc::start(&serve_args("http", driver, "2", &path, &stats_args));
    let addr = p.addr_after(" on ");
    let stats = p.addr_after("stats on ");
    let busy = hotloop::net::Handover::open(&path).unwrap();
    let mut next = Proc::start(&serve_args("http", driver, "1", &path, &[]));
    let pid = next.child.id();
    assert!(common::wait_until(LIMIT, || catches_sigterm(pid)), "{:?}", next.seen);
    next.signal("TERM");
    // The old process turns to the next successor.
    drop(busy);
    let status = next.wait_exit(LIMIT).expect("the successor did not exit");
    assert!(status.success(), "{status}: {:?}", next.seen);
    let failed = common::wait_until(LIMIT, || common::stat(stats, "upgrade_failures") == 2);
    assert!(failed, "{driver}: {:?}", p.seen);
    assert_eq!(common::stat(stats, "upgrades_out"), 0);
    for _ in 0..5 {
        assert!(common::http_get(addr, "/").starts_with("HTTP/1.1 200"));
    }
    assert!(p.child.try_wait().unwrap().is_none(), "the old process stopped");
    p.signal("TERM");
    assert!(p.wait_exit(LIMIT).expect("exit").success());
}

/// The sockets bound to `path` (`/proc/net/unix`): the upgrade socket
/// itself, and one more for each connection made to it, accepted or
/// still waiting in its backlog.
fn sockets_at(path: &Path) -> usize {
    let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let path = path.to_str().unwrap();
    table.lines().filter(|l| l.split_whitespace().nth(7) == Some(path)).count()
}

/// A successor that takes the sockets and never says it is ready holds
/// the old process only for `--upgrade-ready-timeout-ms`: a stand-in
/// that takes them and does nothing (this test, through the library),
/// then a real `hotloop serve` stopped (SIGSTOP) while it waits behind
/// that one. Each is dropped in turn, logged and counted; the stopped one,
/// continued, says ready too late, is refused, and exits with an error
/// without serving. The old process serves the load throughout, and a
/// successor started behind another stuck stand-in takes over within a
/// few seconds (before, the old process waited on the first for ever and
/// every later successor gave up after 30 s).
#[hotloop::test(driver = "all")]
fn a_successor_that_never_says_ready_is_dropped_and_the_next_takes_over(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_dir, path) = socket_path();
    let old_args = ["--stats-addr", "127.0.0.1:0", "--upgrade-ready-timeout-ms", "2000"];
    let mut p = Proc::start(&serve_args("http", driver, "2", &path, &old_args));
    let addr = p.addr_after(" on ");
    let stats = p.addr_after("stats on ");
    let stop = Arc::new(AtomicBool::new(false));
    let clients = load(addr, None, stop.clone());

    let stuck = hotloop::net::Handover::open(&path).unwrap();
    assert_eq!(sockets_at(&path), 2, "the upgrade socket and the stand-in's connection");
    let mut stopped = Proc::start(&serve_args("http", driver, "1", &path, &[]));
    // Stopped once it waits in the backlog, behind the stand-in.
    let queued = common::wait_until(LIMIT, || sockets_at(&path) >= 3);
    assert!(queued, "{driver}: the successor never connected: {:?}", stopped.seen);
    stopped.signal("STOP");
    assert!(p.wait_for_line("did not say it was ready", LIMIT), "{driver}: {:?}", p.seen);
    let both = common::wait_until(LIMIT, || common::stat(stats, "upgrade_failures") == 2);
    assert!(both, "{driver}: {:?}", p.seen);
    assert_eq!(common::stat(stats, "upgrades_out"), 0);
    assert!(common::http_get(addr, "/").starts_with("HTTP/1.1 200"));
    // Too late: refused, the stopped one exits without serving.
    stopped.signal("CONT");
    let status = stopped.wait_exit(LIMIT).expect("the late successor did not exit");
    stopped.collect_lines(Duration::from_millis(100));
    assert!(!status.success(), "{driver}: {:?}", stopped.seen);
    let said = stopped.seen.iter().any(|l| l.contains("stopped waiting for this process"));
    assert!(said, "{driver}: {:?}", stopped.seen);
    assert!(!stopped.seen.iter().any(|l| l.contains("took the")), "{:?}", stopped.seen);
    let refused = stuck.ready().unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::TimedOut, "{refused}");
    assert!(p.child.try_wait().unwrap().is_none(), "the old process stopped");
    assert!(common::http_get(addr, "/").starts_with("HTTP/1.1 200"));

    // A good successor behind another stand-in: it takes over once that
    // one is dropped.
    let _stuck = hotloop::net::Handover::open(&path).unwrap();
    let started = Instant::now();
    let mut next = upgrade(&mut p, &serve_args("http", driver, "2", &path, &[]));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "{driver}: the successor took over after {took:?}");
    thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let (n, failed) = c.join().unwrap();
        assert!(failed.is_empty(), "{driver}: {} failed: {:?}", failed.len(), &failed[..1]);
        assert!(n > 0);
    }
    next.signal("TERM");
    assert!(next.wait_exit(LIMIT).expect("exit").success());
}

/// `hotloop ARGS` with its stderr a pipe that is closed once the banner
/// has been read: every later line it writes fails (`EPIPE`), as when the
/// terminal or pipeline that started it went away. Its address.
fn start_then_close_stderr(args: &[&str]) -> (std::process::Child, SocketAddr) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_hotloop"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("no banner").unwrap();
        if let Some(rest) = line.split(" on ").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    drop(lines);
    (child, addr)
}

fn wait_child(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// A process whose stderr is gone still stops as it should: a SIGTERM
/// drains it (an idle keep-alive connection open) and it exits 0, and one
/// upgraded drains after the hand-over and exits 0 while its successor
/// serves. Its lines are lost, not the process.
#[hotloop::test(driver = "all")]
fn a_process_whose_stderr_is_gone_still_drains_and_exits(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let args = ["serve", "http", "--addr", "127.0.0.1:0", "--workers", "2", "--driver", driver];
    let (mut child, addr) = start_then_close_stderr(&args);
    let mut idle = TcpStream::connect(addr).unwrap();
    idle.set_read_timeout(Some(LIMIT)).unwrap();
    assert!(exchange(&mut idle, true).is_ok());
    let kill = Command::new("kill").args(["-s", "TERM", &child.id().to_string()]).status();
    assert!(kill.unwrap().success());
    let status = wait_child(&mut child, LIMIT).expect("it did not exit after SIGTERM");
    assert!(status.success(), "{driver}: after SIGTERM: {status}");

    let (_dir, path) = socket_path();
    let (mut child, addr) = start_then_close_stderr(&serve_args("http", driver, "2", &path, &[]));
    let mut next = Proc::start(&serve_args("http", driver, "1", &path, &[]));
    assert!(next.wait_for_line("took the", LIMIT), "{:?}", next.seen);
    let status = wait_child(&mut child, LIMIT).expect("it did not exit after the hand-over");
    assert!(status.success(), "{driver}: after the hand-over: {status}");
    assert!(common::http_get(addr, "/").starts_with("HTTP/1.1 200"));
    next.signal("TERM");
    assert!(next.wait_exit(LIMIT).expect("exit").success());
}

/// systemd's socket activation: `hotloop serve` started with a listening
/// socket at descriptor 3 and `LISTEN_FDS`/`LISTEN_PID` naming it serves
/// that socket, a connection made before it started included.
#[hotloop::test(driver = "all")]
fn socket_activation_serves_the_listen_fds_socket(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut early = TcpStream::connect(addr).unwrap();
    early.set_read_timeout(Some(LIMIT)).unwrap();
    early.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").unwrap();
    let sh = "exec 3<&0 0</dev/null; LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" \"$@\"";
    let addr_arg = addr.to_string();
    let mut p = Proc::start_with(
        Command::new("sh")
            .args(["-c", sh, env!("CARGO_BIN_EXE_hotloop")])
            .args(["serve", "http", "--addr", &addr_arg, "--workers", "2", "--driver", driver])
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(listener))),
    );
    assert_eq!(p.addr_after(" on "), addr);
    let mut reply = String::new();
    early.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(common::http_get(addr, "/").starts_with("HTTP/1.1 200"));
    p.signal("TERM");
    assert!(p.wait_exit(LIMIT).expect("exit").success());
}

/// `hotloop ARGS` started as systemd starts a socket-activated service:
/// `listener` at descriptor 3, `LISTEN_FDS=1` and `LISTEN_PID` naming it.
fn activated(listener: socket2::Socket, args: &[&str]) -> Proc {
    let sh = "exec 3<&0 0</dev/null; LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" \"$@\"";
    Proc::start_with(
        Command::new("sh")
            .args(["-c", sh, env!("CARGO_BIN_EXE_hotloop")])
            .args(args)
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(listener))),
    )
}

/// systemd's `ListenStream=PORT` socket is `[::]:PORT` taking IPv4 too:
/// `--addr 0.0.0.0:PORT` serves it (a connection made before the start
/// included). Before, the socket was closed as unclaimed with a warning
/// and the bind of `0.0.0.0:PORT` beside it failed (`EADDRINUSE`). A
/// socket no server serves (`--addr` names another port) fails the start,
/// naming it, instead of being closed while systemd keeps queueing its
/// clients.
#[hotloop::test(driver = "all")]
fn socket_activation_serves_a_dual_stack_socket_for_the_ipv4_wildcard(driver: DriverKind) {
    use socket2::{Domain, Socket, Type};
    let driver = common::driver_arg(driver);
    let dual_stack = || {
        let s = Socket::new(Domain::IPV6, Type::STREAM, None).unwrap();
        s.set_only_v6(false).unwrap();
        s.bind(&"[::]:0".parse::<SocketAddr>().unwrap().into()).unwrap();
        s.listen(128).unwrap();
        let port = s.local_addr().unwrap().as_socket().unwrap().port();
        (s, port)
    };
    let (listener, port) = dual_stack();
    let v4 = SocketAddr::from(([127, 0, 0, 1], port));
    let mut early = TcpStream::connect(v4).unwrap();
    early.set_read_timeout(Some(LIMIT)).unwrap();
    early.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").unwrap();
    let addr_arg = format!("0.0.0.0:{port}");
    let args = ["serve", "http", "--addr", &addr_arg, "--workers", "2", "--driver", driver];
    let mut p = activated(listener, &args);
    assert_eq!(p.addr_after(" on "), SocketAddr::from(([0u16; 8], port)), "{:?}", p.seen);
    let mut reply = String::new();
    early.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{driver}: {reply:?}: {:?}", p.seen);
    assert!(common::http_get(v4, "/").starts_with("HTTP/1.1 200"));
    p.signal("TERM");
    assert!(p.wait_exit(LIMIT).expect("exit").success());

    let (listener, port) = dual_stack();
    let args = ["serve", "http", "--addr", "127.0.0.1:0", "--driver", driver];
    let mut p = activated(listener, &args);
    let status = p.wait_exit(LIMIT).expect("it did not exit");
    assert!(!status.success(), "{driver}: it served without the LISTEN_FDS socket");
    p.collect_lines(Duration::from_millis(100));
    let named = format!("tcp [::]:{port}");
    let said = p.seen.iter().any(|l| l.contains("LISTEN_FDS") && l.contains(&named));
    assert!(said, "{driver}: {:?}", p.seen);
}

/// A client that trusts every certificate in `certs` and reports which one
/// the server showed.
fn served_certificate(addr: SocketAddr, certs: &[&Path]) -> CertificateDer<'static> {
    let mut roots = rustls::RootCertStore::empty();
    for path in certs {
        for c in hotloop::tls::load_certs(path).unwrap() {
            roots.add(c).unwrap();
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("localhost").unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(LIMIT)).unwrap();
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).unwrap();
    }
    conn.peer_certificates().unwrap()[0].clone().into_owned()
}

/// SIGHUP reloads the certificate for new handshakes while a connection
/// made before it goes on; a bad file is refused and the certificate in use
/// stays. Counted in the stats.
#[hotloop::test(driver = "all")]
fn sighup_reloads_the_certificate_and_keeps_it_when_the_new_one_is_bad(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (one, two) = (common::certificate(), common::certificate());
    let (cert, key) = (&one.path, &one.key);
    let (second_cert, second_key) = (&two.path, &two.key);
    let first = hotloop::tls::load_certs(cert).unwrap().remove(0);
    let second = hotloop::tls::load_certs(second_cert).unwrap().remove(0);
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let mut p = Proc::start(&[
        "serve",
        "http",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--driver",
        driver,
        "--tls-cert",
        c,
        "--tls-key",
        k,
        "--stats-addr",
        "127.0.0.1:0",
    ]);
    let addr = p.addr_after(" on ");
    let stats = p.addr_after("stats on ");
    // The files the server reads change below: the client trusts copies.
    let first_copy = cert.with_extension("first.pem");
    std::fs::copy(cert, &first_copy).unwrap();
    let trusted = [first_copy.as_path(), second_cert.as_path()];
    assert_eq!(served_certificate(addr, &trusted), first);
    let mut before = common::tls_client(addr, &first_copy);
    assert!(exchange(&mut before, true).unwrap().starts_with("HTTP/1.1 200"));

    std::fs::copy(second_cert, cert).unwrap();
    std::fs::copy(second_key, key).unwrap();
    p.signal("HUP");
    assert!(p.wait_for_line("reloaded the TLS certificate", LIMIT), "{:?}", p.seen);
    assert_eq!(served_certificate(addr, &trusted), second, "{driver}: new handshakes");
    assert!(exchange(&mut before, true).is_ok(), "the connection made before the reload");

    std::fs::write(cert, "not a certificate").unwrap();
    p.signal("HUP");
    assert!(p.wait_for_line("reload refused", LIMIT), "{:?}", p.seen);
    assert_eq!(served_certificate(addr, &trusted), second, "{driver}: after a bad file");
    assert_eq!(common::stat(stats, "tls_reloads"), 1);
    assert_eq!(common::stat(stats, "tls_reload_failures"), 1);
    p.signal("TERM");
    assert!(p.wait_exit(LIMIT).expect("exit").success());
}

/// `serve quic` upgraded: the old process closes its connections at once
/// with the reason "server upgrading" (never left to time out), counts and
/// logs them as cut (`drain_cut`), and a new connection reaches the
/// successor.
#[hotloop::test(driver = "all")]
fn quic_upgrade_closes_the_old_connections_with_a_reason(driver: DriverKind) {
    use quinn::ConnectionError;

    let driver = common::driver_arg(driver);
    let (_dir, path) = socket_path();
    let cert = common::certificate();
    let (c, k) = (cert.path.to_str().unwrap(), cert.key.to_str().unwrap());
    let args = |workers| {
        serve_args(
            "quic",
            driver,
            workers,
            &path,
            &["--tls-cert", c, "--tls-key", k, "--idle-timeout-ms", "30000"],
        )
    };
    let mut p = Proc::start(&args("2"));
    let addr = p.addr_after(" on ");
    let config = common::quic_client_config(&cert.path, b"hotloop-echo");
    let rt = hotloop::Runtime::builder().workers(1).driver(DriverKind::Epoll).build().unwrap();
    let echo = |conn: quinn::Connection| async move {
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(b"hi").await.unwrap();
        send.finish().unwrap();
        recv.read_to_end(64).await.unwrap()
    };
    let (client, old) = rt.block_on(async {
        let client = hotloop::quic::endpoint("127.0.0.1:0".parse().unwrap(), None).unwrap();
        let old = client.connect_with(config.clone(), addr, "localhost").unwrap().await.unwrap();
        assert_eq!(echo(old.clone()).await, b"hi");
        (client, old)
    });
    let start = Instant::now();
    let mut next = upgrade(&mut p, &args("1"));
    // Counted in `drain_cut` as cut, and logged as a drain's cut is.
    let counted = p.seen.iter().any(|l| l.contains("1 connections cut by the hand-over"));
    assert!(counted, "{driver}: the closed connection is not counted: {:?}", p.seen);
    rt.block_on(async {
        hotloop::time::timeout(LIMIT, async {
            match old.closed().await {
                ConnectionError::ApplicationClosed(close) => {
                    assert_eq!(&close.reason[..], b"server upgrading");
                }
                other => panic!("{driver}: the old connection ended with {other:?}"),
            }
            assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
            let fresh = client.connect_with(config, addr, "localhost").unwrap().await.unwrap();
            assert_eq!(echo(fresh.clone()).await, b"hi");
            fresh.close(0u32.into(), b"done");
            client.wait_idle().await;
        })
        .await
        .unwrap();
    });
    next.signal("TERM");
    assert!(next.wait_exit(LIMIT).expect("exit").success());
}

/// `serve quic` upgraded while new clients keep coming: from the moment
/// the old connection is told of the upgrade, while the old process still
/// drains, 20 connections, 10 ms apart and each from a socket of its own,
/// all handshake with the successor and echo. The old process reads the
/// handed-over sockets no more: none of them is refused by its closed
/// endpoints, nor loses datagrams to it.
#[hotloop::test(driver = "all")]
fn new_quic_connections_during_a_hand_over_all_reach_the_successor(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_dir, path) = socket_path();
    let cert = common::certificate();
    let (c, k) = (cert.path.to_str().unwrap(), cert.key.to_str().unwrap());
    let args = serve_args(
        "quic",
        driver,
        "2",
        &path,
        &["--tls-cert", c, "--tls-key", k, "--idle-timeout-ms", "30000"],
    );
    let mut p = Proc::start(&args);
    let addr = p.addr_after(" on ");
    let config = common::quic_client_config(&cert.path, b"hotloop-echo");
    let rt = hotloop::Runtime::builder().workers(1).driver(DriverKind::Epoll).build().unwrap();
    let echo = quic_echo;
    let (client, old) = rt.block_on(async {
        let client = hotloop::quic::endpoint("127.0.0.1:0".parse().unwrap(), None).unwrap();
        let old = client.connect_with(config.clone(), addr, "localhost").unwrap().await.unwrap();
        assert_eq!(echo(old.clone()).await.unwrap(), b"hi");
        (client, old)
    });
    let mut next = Proc::start(&args);
    let results = rt.block_on(async {
        hotloop::time::timeout(LIMIT, async {
            old.closed().await;
            let results = fresh_quic_echoes(&config, addr, 20).await;
            client.wait_idle().await;
            results
        })
        .await
        .expect("the new connections did not finish in time")
    });
    let failed: Vec<_> = results.iter().filter(|r| r.as_deref() != Ok(&b"hi"[..])).collect();
    assert!(failed.is_empty(), "{driver}: {} of 20 failed: {failed:?}", failed.len());
    assert!(next.wait_for_line("took the", LIMIT), "{:?}", next.seen);
    let status = p.wait_exit(LIMIT).expect("the old process did not exit after the hand-over");
    assert!(status.success(), "{status}");
    next.signal("TERM");
    assert!(next.wait_exit(LIMIT).expect("exit").success());
}

/// After an upgrade the successor holds the same sockets in the same
/// order, so connection IDs still name the right one: a client of the
/// successor (one worker running the two endpoints of its predecessor's
/// two sockets) moves to a new local port 8 times and is echoed each time.
#[hotloop::test(driver = "all")]
fn a_client_that_changes_address_after_an_upgrade_keeps_its_connection(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_dir, path) = socket_path();
    let cert = common::certificate();
    let (c, k) = (cert.path.to_str().unwrap(), cert.key.to_str().unwrap());
    let args =
        |workers| serve_args("quic", driver, workers, &path, &["--tls-cert", c, "--tls-key", k]);
    let mut p = Proc::start(&args("2"));
    let addr = p.addr_after(" on ");
    let mut next = upgrade(&mut p, &args("1"));
    let config = common::quic_client_config(&cert.path, b"hotloop-echo");
    let rt = hotloop::Runtime::builder().workers(1).driver(DriverKind::Epoll).build().unwrap();
    let moved = rt.block_on(async {
        hotloop::time::timeout(LIMIT, crate::quic::echo_across_address_changes(addr, config, 8))
            .await
            .expect("the moves did not finish in time")
    });
    assert_eq!(moved, Ok(8), "{driver}");
    next.signal("TERM");
    assert!(next.wait_exit(LIMIT).expect("exit").success());
}

/// `serve quic` whose successor takes the UDP sockets and then fails to
/// start (its stats address cannot be bound) goes on serving: it never
/// hands over, since the successor fails before it says it is ready. The
/// connection made before answers still, a new one is served, and the
/// failure is counted.
#[hotloop::test(driver = "all")]
fn a_quic_successor_that_fails_to_start_leaves_the_old_one_serving(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_dir, path) = socket_path();
    let cert = common::certificate();
    let (c, k) = (cert.path.to_str().unwrap(), cert.key.to_str().unwrap());
    let args = |workers, stats| {
        let extra = ["--tls-cert", c, "--tls-key", k, "--idle-timeout-ms", "30000"];
        serve_args("quic", driver, workers, &path, &[&extra[..], &["--stats-addr", stats]].concat())
    };
    let mut p = Proc::start(&args("2", "127.0.0.1:0"));
    let addr = p.addr_after(" on ");
    let stats = p.addr_after("stats on ");
    let config = common::quic_client_config(&cert.path, b"hotloop-echo");
    let rt = hotloop::Runtime::builder().workers(1).driver(DriverKind::Epoll).build().unwrap();
    let echo = quic_echo;
    let (client, old) = rt.block_on(async {
        let client = hotloop::quic::endpoint("127.0.0.1:0".parse().unwrap(), None).unwrap();
        let old = client.connect_with(config.clone(), addr, "localhost").unwrap().await.unwrap();
        assert_eq!(echo(old.clone()).await.unwrap(), b"hi");
        (client, old)
    });
    let mut failing = Proc::start(&args("1", "192.0.2.1:9"));
    let status = failing.wait_exit(LIMIT).expect("the failing successor did not exit");
    assert!(!status.success());
    assert!(p.wait_for_line("keeps serving", LIMIT), "{driver}: {:?}", p.seen);
    assert_eq!(common::stat(stats, "upgrade_failures"), 1);
    assert_eq!(common::stat(stats, "upgrades_out"), 0);
    rt.block_on(async {
        hotloop::time::timeout(LIMIT, async {
            assert_eq!(echo(old.clone()).await, Ok(b"hi".to_vec()), "{driver}: the old connection");
            let fresh = client.connect_with(config, addr, "localhost").unwrap().await.unwrap();
            assert_eq!(echo(fresh.clone()).await, Ok(b"hi".to_vec()), "{driver}: a new one");
            fresh.close(0u32.into(), b"done");
            old.close(0u32.into(), b"done");
            client.wait_idle().await;
        })
        .await
        .unwrap();
    });
    assert!(p.child.try_wait().unwrap().is_none(), "the old process stopped");
    p.signal("TERM");
    assert!(p.wait_exit(LIMIT).expect("exit").success());
}

/// A `serve quic` drain shows as every other server's does: the stats
/// endpoint counts it (`drains`) while it runs, and the connection still
/// open at its deadline is cut and logged (the `drain_cut` event).
#[hotloop::test(driver = "all")]
fn a_quic_drain_is_counted_and_its_cut_logged(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let cert = common::certificate();
    let (c, k) = (cert.path.to_str().unwrap(), cert.key.to_str().unwrap());
    let mut p = Proc::start(&[
        "serve",
        "quic",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--driver",
        driver,
        "--tls-cert",
        c,
        "--tls-key",
        k,
        "--stats-addr",
        "127.0.0.1:0",
        "--drain-timeout-ms",
        "1000",
    ]);
    let addr = p.addr_after(" on ");
    let stats = p.addr_after("stats on ");
    let config = common::quic_client_config(&cert.path, b"hotloop-echo");
    let rt = hotloop::Runtime::builder().workers(1).driver(DriverKind::Epoll).build().unwrap();
    // A stream left open: the connection is busy until the deadline.
    let (_conn, _send) = rt.block_on(async {
        let client = hotloop::quic::endpoint("127.0.0.1:0".parse().unwrap(), None).unwrap();
        let conn = client.connect_with(config, addr, "localhost").unwrap().await.unwrap();
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(b"hi").await.unwrap();
        let mut echoed = [0u8; 2];
        recv.read_exact(&mut echoed).await.unwrap();
        (conn, send)
    });
    let before = common::stat(stats, "drains");
    p.signal("TERM");
    assert!(p.wait_for_line("draining", LIMIT), "{:?}", p.seen);
    // Counted just after that line is written.
    let counted = common::wait_until(LIMIT, || common::stat(stats, "drains") == before + 1);
    assert!(counted, "{driver}: the drain is not in the stats: {:?}", p.seen);
    assert!(p.wait_exit(LIMIT).expect("exit").success());
    p.collect_lines(Duration::from_millis(100));
    assert!(
        p.seen
            .iter()
            .any(|l| l.contains("1 connections cut at the drain deadline")
                && l.starts_with("hotloop: ")),
        "{driver}: no drain_cut event: {:?}",
        p.seen
    );
}

/// `hotloop proxy` and `hotloop serve static` take `--upgrade-socket` too:
/// a successor takes the listening socket over and serves, and the old
/// process drains and exits.
#[hotloop::test(driver = "all")]
fn proxy_and_static_files_are_upgraded_too(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (mut backend, backend_addr) = {
        let mut p = Proc::start(&["serve", "http", "--addr", "127.0.0.1:0", "--driver", driver]);
        let addr = p.addr_after(" on ");
        (p, addr)
    };
    let (_dir, path) = socket_path();
    let backend_arg = backend_addr.to_string();
    let proxy_args = |workers| {
        vec![
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--backend",
            &backend_arg,
            "--workers",
            workers,
            "--driver",
            driver,
            "--upgrade-socket",
            path.to_str().unwrap(),
        ]
    };
    let mut p = Proc::start(&proxy_args("2"));
    let addr = p.addr_after("proxy on ");
    assert!(common::http_get(addr, "/").starts_with("HTTP/1.1 200"));
    let mut next = upgrade(&mut p, &proxy_args("1"));
    assert!(common::http_get(addr, "/").starts_with("HTTP/1.1 200"));
    next.signal("TERM");
    assert!(next.wait_exit(LIMIT).expect("exit").success());
    backend.signal("TERM");
    assert!(backend.wait_exit(LIMIT).expect("exit").success());

    let root = TempDir::new("upgrade-static");
    std::fs::write(root.join("index.html"), "hello").unwrap();
    let (_dir, path) = socket_path();
    let root_arg = root.path().to_str().unwrap();
    let mut p = Proc::start(&serve_args("static", driver, "2", &path, &["--root", root_arg]));
    let addr = p.addr_after(" on ");
    assert!(common::http_get(addr, "/").ends_with("hello"));
    let mut next =
        upgrade(&mut p, &serve_args("static", driver, "1", &path, &["--root", root_arg]));
    assert!(common::http_get(addr, "/").ends_with("hello"));
    next.signal("TERM");
    assert!(next.wait_exit(LIMIT).expect("exit").success());
}

/// After a hand-over the old process drains, and the SIGTERM that a
/// supervisor or a deploy script sends it then does not cut what it
/// still serves: the first only says that it is already draining (a
/// second, or SIGQUIT, would stop it at once). A request whose head was
/// unfinished at the hand-over and at the signal is answered, with
/// `Connection: close`, and the old process says it drained.
#[hotloop::test(driver = "all")]
fn sigterm_to_a_process_draining_after_a_hand_over_does_not_cut_it(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_dir, path) = socket_path();
    let mut p = Proc::start(&serve_args("http", driver, "2", &path, &["--grace-ms", "20000"]));
    let addr = p.addr_after(" on ");
    let mut held = TcpStream::connect(addr).unwrap();
    held.set_read_timeout(Some(LIMIT)).unwrap();
    held.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n").unwrap();
    let mut next = Proc::start(&serve_args("http", driver, "1", &path, &[]));
    assert!(next.wait_for_line("took the", LIMIT), "{:?}", next.seen);
    assert!(p.wait_for_line("handed over to pid", LIMIT), "{driver}: {:?}", p.seen);
    p.signal("TERM");
    assert!(p.wait_for_line("already draining", LIMIT), "{driver}: {:?}", p.seen);
    held.write_all(b"\r\n").unwrap();
    let reply = common::read_response(&mut held);
    assert!(reply.starts_with("HTTP/1.1 200"), "{driver}: {reply:?}: {:?}", p.seen);
    assert!(reply.contains("Connection: close"), "{driver}: {reply}");
    let status = p.wait_exit(LIMIT).expect("the old process did not exit");
    assert!(status.success(), "{status}");
    p.collect_lines(Duration::from_millis(100));
    let drained = p.seen.iter().any(|l| l.contains("drained after handing over"));
    assert!(drained, "{driver}: {:?}", p.seen);
    assert!(common::http_get(addr, "/").starts_with("HTTP/1.1 200"));
    next.signal("TERM");
    assert!(next.wait_exit(LIMIT).expect("exit").success());
}

/// `n` new clients, each from an endpoint of its own, 10 ms apart: each
/// connects to `addr`, echoes once ([`quic_echo`]) and closes; what each
/// got, in order.
async fn fresh_quic_echoes(
    config: &quinn::ClientConfig,
    addr: std::net::SocketAddr,
    n: usize,
) -> Vec<Result<Vec<u8>, String>> {
    let mut fresh = Vec::new();
    for _ in 0..n {
        let config = config.clone();
        fresh.push(hotloop::spawn(async move {
            let own = hotloop::quic::endpoint("127.0.0.1:0".parse().unwrap(), None)
                .map_err(|e| e.to_string())?;
            let conn = own
                .connect_with(config, addr, "localhost")
                .map_err(|e| e.to_string())?
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            let got = quic_echo(conn.clone()).await;
            conn.close(0u32.into(), b"done");
            own.wait_idle().await;
            got
        }));
        hotloop::time::sleep(Duration::from_millis(10)).await;
    }
    let mut results = Vec::new();
    for f in fresh {
        results.push(f.await.expect("a client task"));
    }
    results
}

/// "hi" sent on a new bidirectional stream of `conn`; what came back.
async fn quic_echo(conn: quinn::Connection) -> Result<Vec<u8>, String> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    send.write_all(b"hi").await.map_err(|e| e.to_string())?;
    send.finish().map_err(|e| e.to_string())?;
    recv.read_to_end(64).await.map_err(|e| e.to_string())
}

/// `serve quic` sent SIGTERM while its successor has the UDP sockets and
/// has not said it is ready (held by SIGSTOP, behind a stand-in that holds
/// the hand-over first): the successor serves them anyway once it goes on,
/// so the old process stops reading them at the signal and closes its
/// connection (one with a stream open, which its drain would otherwise
/// wait for) with "server upgrading", counted as cut. 20 new connections
/// made once the successor serves all reach it (before, the old process
/// read the sockets until its drain's deadline and refused some), and the
/// old process exits well within its drain timeout.
#[hotloop::test(driver = "all")]
fn sigterm_while_a_quic_successor_starts_leaves_it_the_sockets(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_dir, path) = socket_path();
    let cert = common::certificate();
    let (c, k) = (cert.path.to_str().unwrap(), cert.key.to_str().unwrap());
    let tls = ["--tls-cert", c, "--tls-key", k, "--idle-timeout-ms", "30000"];
    let drain = Duration::from_secs(8);
    let old_args = [&tls[..], &["--drain-timeout-ms", "8000"]].concat();
    let mut p = Proc::start(&serve_args("quic", driver, "2", &path, &old_args));
    let addr = p.addr_after(" on ");
    let config = common::quic_client_config(&cert.path, b"hotloop-echo");
    let rt = hotloop::Runtime::builder().workers(1).driver(DriverKind::Epoll).build().unwrap();
    // A stream left open: the old process's drain would last to its deadline.
    let (client, held, _send) = rt.block_on(async {
        let client = hotloop::quic::endpoint("127.0.0.1:0".parse().unwrap(), None).unwrap();
        let conn = client.connect_with(config.clone(), addr, "localhost").unwrap().await.unwrap();
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(b"hi").await.unwrap();
        let mut echoed = [0u8; 2];
        recv.read_exact(&mut echoed).await.unwrap();
        (client, conn, send)
    });
    let busy = hotloop::net::Handover::open(&path).unwrap();
    let mut next = Proc::start(&serve_args("quic", driver, "2", &path, &tls));
    let queued = common::wait_until(LIMIT, || sockets_at(&path) >= 3);
    assert!(queued, "{driver}: the successor never connected: {:?}", next.seen);
    next.signal("STOP");
    drop(busy);
    // The old process turns to it at once, sends it the sockets and waits
    // for its ready (the send is logged at the info level only).
    assert!(p.wait_for_line("failed before it served", LIMIT), "{driver}: {:?}", p.seen);
    thread::sleep(Duration::from_millis(500));
    let stopped_at = Instant::now();
    p.signal("TERM");
    assert!(p.wait_for_line("draining", LIMIT), "{driver}: {:?}", p.seen);
    // Continued once the old process's hand-over thread has seen the stop
    // (it looks every 100 ms): a ready it read before would be taken as
    // an ordinary hand-over.
    thread::sleep(Duration::from_millis(500));
    next.signal("CONT");
    assert!(next.wait_for_line("took the", LIMIT), "{driver}: {:?}", next.seen);
    let results = rt.block_on(async {
        hotloop::time::timeout(LIMIT, async {
            let results = fresh_quic_echoes(&config, addr, 20).await;
            let ended = match held.closed().await {
                quinn::ConnectionError::ApplicationClosed(close) => close.reason.to_vec(),
                other => format!("{other:?}").into_bytes(),
            };
            client.wait_idle().await;
            (results, ended)
        })
        .await
        .expect("the new connections did not finish in time")
    });
    let (results, ended) = results;
    let failed: Vec<_> = results.iter().filter(|r| r.as_deref() != Ok(&b"hi"[..])).collect();
    assert!(failed.is_empty(), "{driver}: {} of 20 failed: {failed:?}", failed.len());
    let ended = String::from_utf8_lossy(&ended);
    assert_eq!(ended, "server upgrading", "{driver}: how the old connection ended");
    let status = p.wait_exit(LIMIT).expect("the old process did not exit");
    let took = stopped_at.elapsed();
    assert!(status.success(), "{status}");
    assert!(took < drain, "{driver}: the old process exited {took:?} after SIGTERM");
    p.collect_lines(Duration::from_millis(100));
    let counted = p.seen.iter().any(|l| l.contains("1 connections cut by the hand-over"));
    assert!(counted, "{driver}: {:?}", p.seen);
    next.signal("TERM");
    assert!(next.wait_exit(LIMIT).expect("exit").success());
}

/// A `serve quic` successor with more workers than the UDP sockets it
/// received (its predecessor ran one) binds no more: it says after its
/// banner that QUIC runs on one worker only, and serves.
#[hotloop::test(driver = "all")]
fn a_quic_successor_with_more_workers_than_sockets_says_so(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_dir, path) = socket_path();
    let cert = common::certificate();
    let (c, k) = (cert.path.to_str().unwrap(), cert.key.to_str().unwrap());
    let args =
        |workers| serve_args("quic", driver, workers, &path, &["--tls-cert", c, "--tls-key", k]);
    let mut p = Proc::start(&args("1"));
    let addr = p.addr_after(" on ");
    assert!(!p.seen.iter().any(|l| l.contains("UDP sockets received")), "{:?}", p.seen);
    let mut next = upgrade(&mut p, &args("3"));
    let said = "1 UDP sockets received for 3 workers: QUIC runs on workers 0 to 0 only";
    assert!(next.wait_for_line(said, LIMIT), "{driver}: {:?}", next.seen);
    let config = common::quic_client_config(&cert.path, b"hotloop-echo");
    let rt = hotloop::Runtime::builder().workers(1).driver(DriverKind::Epoll).build().unwrap();
    rt.block_on(async {
        hotloop::time::timeout(LIMIT, async {
            let client = hotloop::quic::endpoint("127.0.0.1:0".parse().unwrap(), None).unwrap();
            let conn = client.connect_with(config, addr, "localhost").unwrap().await.unwrap();
            assert_eq!(quic_echo(conn.clone()).await, Ok(b"hi".to_vec()), "{driver}");
            conn.close(0u32.into(), b"done");
            client.wait_idle().await;
        })
        .await
        .unwrap();
    });
    next.signal("TERM");
    assert!(next.wait_exit(LIMIT).expect("exit").success());
}
