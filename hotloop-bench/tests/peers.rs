//! The peer servers answer like hotloop's own: echo, HTTP keep-alive,
//! `Connection: close`, 400 on garbage, and a clean exit on SIGTERM; the
//! io_uring floor also under back-pressure and on SIGINT; the floors also
//! with `--busy-poll`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_hotloop-bench");
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a load generator run may take.
const LOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// The io_uring floor's switches to its fallback paths and its ring size.
const FALLBACK_ENV: &str = "HOTLOOP_FLOOR_URING_FALLBACK";
const BUFFERS_ENV: &str = "HOTLOOP_FLOOR_URING_BUFFERS";
const EXIT_TIMEOUT: Duration = Duration::from_secs(5);

/// A peer server process, stopped by pid when dropped.
struct Peer {
    child: Child,
    addr: SocketAddr,
    /// The line it printed at start.
    banner: String,
}

impl Peer {
    fn start(kind: &str, proto: &str, body_size: usize) -> Peer {
        Peer::start_with(kind, proto, body_size, &[])
    }

    /// Starts a peer with `env` set; its standard error is kept when `env`
    /// is not empty, for [`Peer::stderr`].
    fn start_with(kind: &str, proto: &str, body_size: usize, env: &[(&str, &str)]) -> Peer {
        Peer::start_args(kind, proto, body_size, env, &["--workers", "2"])
    }

    /// [`Peer::start_with`] with `args` after the common ones (`--workers`
    /// among them).
    fn start_args(
        kind: &str,
        proto: &str,
        body_size: usize,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Peer {
        let mut child = Command::new(BIN)
            .args(["peer", kind, proto, "--addr", "127.0.0.1:0"])
            .args(["--body-size", &body_size.to_string(), "--work-us", "1"])
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(if env.is_empty() { Stdio::null() } else { Stdio::piped() })
            .spawn()
            .expect("start the hotloop binary");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        // `listening on ADDR`, or the floors' `floor APP listening on ADDR (...)`.
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("{kind} printed {line:?} instead of its address"));
        Peer { child, addr, banner: line }
    }

    fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(self.addr).unwrap();
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        stream
    }

    /// Sends SIGTERM and returns the exit status, failing after a bound.
    fn terminate(mut self) -> std::process::ExitStatus {
        signal(self.child.id(), libc::SIGTERM);
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the peer ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            signal(self.child.id(), libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own
    // child, which has not been reaped yet, so it cannot name another process.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// Reads one HTTP response with a Content-Length body; returns head and body.
fn read_response(stream: &mut TcpStream) -> (String, Vec<u8>) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).expect("a response head");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).unwrap();
    (head, body)
}

fn assert_closed(stream: &mut TcpStream) {
    let mut rest = Vec::new();
    // A reset after close also counts as closed.
    let _ = stream.read_to_end(&mut rest);
    assert!(rest.is_empty(), "bytes after the last response: {rest:?}");
}

fn check_http(kind: &str) {
    check_http_with(kind, &[]);
}

fn check_http_with(kind: &str, env: &[(&str, &str)]) {
    check_http_on(kind, Peer::start_with(kind, "http", 100, env));
}

/// The HTTP checks against `peer`, a `kind` server started with a
/// 100-byte body; then SIGTERM.
fn check_http_on(kind: &str, peer: Peer) {
    let mut s = peer.connect();
    for _ in 0..3 {
        s.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        let (head, body) = read_response(&mut s);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{kind}: {head}");
        assert!(head.contains("Connection: keep-alive"), "{kind}: {head}");
        assert_eq!(body, vec![b'x'; 100]);
    }
    // Two pipelined requests in one write, the second one closing.
    s.write_all(
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    assert!(read_response(&mut s).0.contains("keep-alive"));
    assert!(read_response(&mut s).0.contains("Connection: close"));
    assert_closed(&mut s);

    // A request split across writes.
    let mut s = peer.connect();
    s.write_all(b"GET / HT").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    s.write_all(b"TP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").unwrap();
    assert!(read_response(&mut s).0.starts_with("HTTP/1.1 200"));
    assert_closed(&mut s);

    let mut s = peer.connect();
    s.write_all(b"\x00\x01 not http\r\n\r\n").unwrap();
    assert!(read_response(&mut s).0.starts_with("HTTP/1.1 400"), "{kind}: no 400");
    assert_closed(&mut s);

    // A reset mid-request must not hurt the server.
    let s = peer.connect();
    socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO)).unwrap();
    (&s).write_all(b"GET / HTTP/1.1\r\n").unwrap();
    drop(s);
    let mut s = peer.connect();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    assert!(read_response(&mut s).0.contains("Connection: close"));

    let status = peer.terminate();
    assert!(status.success(), "{kind} exited with {status}");
}

fn check_echo(kind: &str) {
    check_echo_with(kind, &[]);
}

fn check_echo_with(kind: &str, env: &[(&str, &str)]) {
    let peer = Peer::start_with(kind, "echo", 0, env);
    let mut s = peer.connect();
    let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    let mut echoed = vec![0u8; data.len()];
    // Small enough to fit the socket buffers, so writing all first is safe.
    s.write_all(&data).unwrap();
    s.read_exact(&mut echoed).unwrap();
    assert_eq!(echoed, data);
    s.write_all(b"again").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"again");

    let status = peer.terminate();
    assert!(status.success(), "{kind} exited with {status}");
}

#[test]
fn tokio_http() {
    check_http("tokio");
}

#[test]
fn tokio_echo() {
    check_echo("tokio");
}

#[test]
fn monoio_http() {
    check_http("monoio");
}

#[test]
fn monoio_echo() {
    check_echo("monoio");
}

#[test]
fn sigint_also_stops_a_peer() {
    let mut peer = Peer::start("tokio", "echo", 0);
    signal(peer.child.id(), libc::SIGINT);
    let status = peer.child.wait().unwrap();
    assert!(status.success());
}

#[test]
fn floor_http() {
    check_http("floor");
}

#[test]
fn floor_echo() {
    check_echo("floor");
}

#[test]
fn floor_uring_http() {
    check_http("floor-uring");
}

#[test]
fn floor_uring_echo() {
    check_echo("floor-uring");
}

/// Three keep-alive requests on one connection, one split across two
/// writes, an echo round trip, then SIGINT: the io_uring floor exits with 0.
#[test]
fn floor_uring_keepalive_echo_and_sigint() {
    let http = Peer::start("floor-uring", "http", 13);
    let mut s = http.connect();
    let request: &[u8] = b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n";
    for i in 0..3 {
        if i == 1 {
            s.write_all(&request[..9]).unwrap();
            s.flush().unwrap();
            thread::sleep(Duration::from_millis(20));
            s.write_all(&request[9..]).unwrap();
        } else {
            s.write_all(request).unwrap();
        }
        let (head, body) = read_response(&mut s);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "request {i}: {head}");
        assert!(head.contains("Connection: keep-alive"), "request {i}: {head}");
        assert_eq!(body, vec![b'x'; 13]);
    }
    let mut http = http;
    signal(http.child.id(), libc::SIGINT);
    let status = wait_exit(&mut http.child);
    assert!(status.success(), "floor-uring http exited with {status}");
    // The open keep-alive connection was closed by the exit.
    assert_closed(&mut s);

    let mut echo = Peer::start("floor-uring", "echo", 0);
    let mut s = echo.connect();
    s.write_all(b"ping across the ring").unwrap();
    let mut back = [0u8; 20];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"ping across the ring");
    signal(echo.child.id(), libc::SIGINT);
    let status = wait_exit(&mut echo.child);
    assert!(status.success(), "floor-uring echo exited with {status}");
}

/// A client that writes far more than the socket buffers hold before it
/// reads: the floors pause reading while their replies are stuck, and every
/// byte still comes back, in order.
#[test]
fn floors_echo_under_back_pressure() {
    let fallback = [(FALLBACK_ENV, "1")];
    for (kind, env) in [("floor", &[][..]), ("floor-uring", &[]), ("floor-uring", &fallback)] {
        let peer = Peer::start_with(kind, "echo", 0, env);
        // A small receive window, so the replies back up in the server.
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.set_recv_buffer_size(8 * 1024).unwrap();
        sock.connect(&peer.addr.into()).unwrap();
        let s: TcpStream = sock.into();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        // More than the kernel's largest send and receive buffers together.
        let data: Vec<u8> = (0..16_000_000u32).map(|i| (i % 253) as u8).collect();
        let mut writer = s.try_clone().unwrap();
        let sent = data.clone();
        let w = thread::spawn(move || {
            // Pauses on the way are the point: the server stops reading.
            thread::sleep(Duration::from_millis(1));
            writer.write_all(&sent).unwrap();
            writer.shutdown(Shutdown::Write).unwrap();
        });
        // Let the server's replies back up before reading any.
        thread::sleep(Duration::from_millis(200));
        let mut echoed = Vec::with_capacity(data.len());
        (&s).read_to_end(&mut echoed).unwrap();
        w.join().unwrap();
        assert!(echoed == data, "{kind}: {} bytes came back of {}", echoed.len(), data.len());
        let status = peer.terminate();
        assert!(status.success(), "{kind} exited with {status}");
    }
}

/// Waits for a signalled child, failing after a bound.
fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + EXIT_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the peer ignored the signal");
        thread::sleep(Duration::from_millis(10));
    }
}

/// The io_uring floor's fallbacks (cooperative task running, a single-shot
/// receive into each connection's buffer) answer as its first choice does.
#[test]
fn floor_uring_fallback_paths() {
    let env = [(FALLBACK_ENV, "1")];
    let peer = Peer::start_with("floor-uring", "echo", 0, &env);
    assert!(
        peer.banner.contains("coop-taskrun, single-shot receive"),
        "not on the fallback paths: {}",
        peer.banner
    );
    assert!(peer.terminate().success());
    check_http_with("floor-uring", &env);
    check_echo_with("floor-uring", &env);
}

/// With a one-buffer ring, receives end with ENOBUFS all the time under
/// load: every request is still answered, and once the load stops the
/// server is idle, not re-arming in a loop.
#[test]
fn floor_uring_runs_its_buffer_ring_dry_without_spinning() {
    let peer = Peer::start_with("floor-uring", "http", 64, &[(BUFFERS_ENV, "1")]);
    let report = load(peer.addr, &["--mode", "keepalive", "-c", "64", "-n", "20000"]);
    assert_eq!(report["errors"]["total"], 0, "{report}");
    assert_eq!(report["completed"], 20000, "{report}");
    let pid = peer.child.id();
    let before = cpu_ticks(pid);
    thread::sleep(Duration::from_millis(500));
    let idle = cpu_ticks(pid) - before;
    assert!(idle <= 10, "{idle} ticks of CPU in 500 ms with no load");
    let mut peer = peer;
    let mut stderr = peer.child.stderr.take().unwrap();
    let status = peer.terminate();
    assert!(status.success(), "floor-uring exited with {status}");
    let mut text = String::new();
    stderr.read_to_string(&mut text).unwrap();
    assert!(text.contains("after ENOBUFS"), "the ring never ran dry: {text:?}");
}

/// Connection churn through the io_uring floor: one request per connection.
#[test]
fn floor_uring_serial_connections() {
    let peer = Peer::start("floor-uring", "http", 64);
    let report = load(peer.addr, &["--mode", "serial", "-n", "300"]);
    assert_eq!(report["errors"]["total"], 0, "{report}");
    assert_eq!(report["completed"], 300, "{report}");
    let status = peer.terminate();
    assert!(status.success(), "floor-uring exited with {status}");
}

/// With `--busy-poll` each floor answers as it does without, keeps
/// spinning on its CPU once the load stops (the zero-timeout poll), and
/// stops on SIGTERM; one worker each, so the spin takes one CPU only.
#[test]
fn floors_busy_poll_answer_and_spin() {
    for kind in ["floor", "floor-uring"] {
        let busy = ["--workers", "1", "--busy-poll"];
        let peer = Peer::start_args(kind, "http", 100, &[], &busy);
        assert!(peer.banner.contains("busy polling"), "{kind}: {}", peer.banner);
        let report = load(peer.addr, &["--mode", "serial", "-n", "300"]);
        assert_eq!(report["errors"]["total"], 0, "{kind}: {report}");
        assert_eq!(report["completed"], 300, "{kind}: {report}");
        let pid = peer.child.id();
        let before = cpu_ticks(pid);
        thread::sleep(Duration::from_millis(500));
        let idle = cpu_ticks(pid) - before;
        // A sleeping server takes about none of the 50 ticks; a spinning one
        // all it is given. A tenth leaves room for a busy machine.
        assert!(idle >= 5, "{kind}: {idle} ticks of CPU in 500 ms: not spinning");
        check_http_on(kind, peer);
    }
}

/// `--busy-poll` is a floor option: the runtimes' peers refuse it.
#[test]
fn busy_poll_is_for_the_floors_only() {
    let out = Command::new(BIN)
        .args(["peer", "tokio", "http", "--addr", "127.0.0.1:0", "--busy-poll"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("floors only"), "{stderr}");
}

/// Runs `hotloop-bench load --json` against `addr`, bounded in time, and
/// returns its report.
fn load(addr: SocketAddr, args: &[&str]) -> serde_json::Value {
    let mut child = Command::new(BIN)
        .args(["load", "--json", "--addr", &addr.to_string()])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start hotloop-bench load");
    let mut stdout = child.stdout.take().unwrap();
    let reader = thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        out
    });
    let deadline = Instant::now() + LOAD_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            signal(child.id(), libc::SIGKILL);
            let _ = child.wait();
            panic!("hotloop-bench load {args:?} ran past {LOAD_TIMEOUT:?}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "hotloop-bench load {args:?} exited with {status}");
    let out = reader.join().unwrap();
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("bad JSON {out:?}: {e}"))
}

/// User and system CPU time of `pid` so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which is in parentheses: utime and
    // stime are the 12th and 13th.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}
