//! What the command-level tests share: a `hotloop` process stopped by pid,
//! HTTP and stats helpers, and the `--driver` value for each driver.

#![allow(dead_code)] // each test file uses its own subset

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use hotloop::tls::rustls;
use rustls::pki_types::ServerName;

/// The `--driver` value that runs the command on `driver`: each test is
/// `#[hotloop::test(driver = "all")]`, run once per driver as `name::epoll`
/// and `name::uring` (the io_uring one skips where the kernel cannot run it,
/// and fails instead under `HOTLOOP_REQUIRE_URING=1`).
pub fn driver_arg(driver: hotloop::DriverKind) -> &'static str {
    match driver {
        hotloop::DriverKind::Epoll => "epoll",
        hotloop::DriverKind::Uring => "uring",
        hotloop::DriverKind::Auto => "auto",
    }
}

/// A `hotloop` process, killed on drop if still running.
pub struct Proc {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    /// Every stderr line read so far.
    pub seen: Vec<String>,
}

impl Proc {
    /// Starts `hotloop ARGS` and collects its stderr lines.
    pub fn start(args: &[&str]) -> Proc {
        Self::spawn(Command::new(env!("CARGO_BIN_EXE_hotloop")).args(args))
    }

    /// Starts `hotloop ARGS` with its open-file limit (soft and hard) at `nofile`.
    pub fn start_with_nofile(nofile: u32, args: &[&str]) -> Proc {
        Self::spawn(
            Command::new("prlimit")
                .arg(format!("--nofile={nofile}:{nofile}"))
                .arg(env!("CARGO_BIN_EXE_hotloop"))
                .args(args),
        )
    }

    /// Starts `cmd` (a wrapper around `hotloop`, say) and collects its stderr lines.
    pub fn start_with(cmd: &mut Command) -> Proc {
        Self::spawn(cmd)
    }

    fn spawn(cmd: &mut Command) -> Proc {
        let mut child =
            cmd.stderr(Stdio::piped()).stdout(Stdio::null()).spawn().expect("start hotloop");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc { child, lines: rx, seen: Vec::new() }
    }

    /// Waits for a stderr line containing `after` and returns the address after it.
    pub fn addr_after(&mut self, after: &str) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(100)) {
                self.seen.push(line.clone());
                if let Some(rest) = line.split(after).nth(1) {
                    let token = rest.split_whitespace().next().unwrap();
                    let token = token.trim_start_matches("http://").trim_end_matches("/stats");
                    return token.parse().unwrap();
                }
            }
        }
        panic!("no line with `{after}` from hotloop: {:?}", self.seen);
    }

    /// Reads the stderr lines that arrived within `wait`.
    pub fn collect_lines(&mut self, wait: Duration) -> &[String] {
        let deadline = Instant::now() + wait;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(left);
                    break;
                }
            }
        }
        &self.seen
    }

    /// Waits until a stderr line contains `text` (within `wait`).
    pub fn wait_for_line(&mut self, text: &str, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        if self.seen.iter().any(|l| l.contains(text)) {
            return true;
        }
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(text);
                    self.seen.push(line);
                    if hit {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
        false
    }

    /// Sends `signal` (a name for `kill -s`, e.g. `TERM`).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args(["-s", signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -s {signal}");
    }

    /// Waits up to `limit` for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Descriptors the process holds now.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id())).map_or(0, |d| d.count())
    }

    /// What each descriptor the process holds points at (for a failure's message).
    pub fn fd_targets(&self) -> Vec<String> {
        let dir = format!("/proc/{}/fd", self.child.id());
        let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
        let mut out: Vec<String> = entries
            .flatten()
            .map(|e| {
                let target = std::fs::read_link(e.path()).unwrap_or_default();
                format!("{} -> {}", e.file_name().to_string_lossy(), target.display())
            })
            .collect();
        out.sort();
        out
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `hotloop proxy` (TCP) on one worker forwarding to `backend`, with
/// the idle timeout `idle_ms`; its address.
pub fn tcp_proxy(
    driver: hotloop::DriverKind,
    backend: SocketAddr,
    idle_ms: &str,
) -> (Proc, SocketAddr) {
    let backend = backend.to_string();
    let mut p = Proc::start(&[
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--backend",
        &backend,
        "--workers",
        "1",
        "--driver",
        driver_arg(driver),
        "--idle-timeout-ms",
        idle_ms,
    ]);
    let addr = p.addr_after(" on ");
    (p, addr)
}

/// One `Connection: close` GET; the whole reply.
pub fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The stats endpoint's JSON.
pub fn stats(addr: SocketAddr) -> serde_json::Value {
    let reply = http_get(addr, "/stats");
    let body = reply.split_once("\r\n\r\n").expect("a head and a body").1;
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {reply}"))
}

/// One counter of the stats endpoint.
pub fn stat(addr: SocketAddr, name: &str) -> u64 {
    let v = stats(addr);
    v[name].as_u64().unwrap_or_else(|| panic!("no {name} in {v}"))
}

/// Polls `cond` every 20 ms until it holds or `limit` passes.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads one HTTP response with a `Content-Length` from a kept-alive
/// connection (over TCP or TLS): the head and the body, nothing more.
pub fn read_response(s: &mut impl Read) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            other => panic!("reading a head: {other:?} after {:?}", String::from_utf8_lossy(&head)),
        }
    }
    let head = String::from_utf8(head).unwrap();
    // Any case: hyper writes its field names in lower case.
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length").then_some(value)
        })
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    head + &String::from_utf8(body).unwrap()
}

/// Reads until the end of the stream (a TCP close, a TLS close_notify or
/// a reset) and returns what came, and how long it took.
pub fn read_to_close(s: &mut impl Read) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            // A signal to the test process is not the end of the stream.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Ok(0) | Err(_) => return (got, start.elapsed()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// A fresh directory under the system's temporary directory, removed with
/// everything in it when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `hotloop-cli-NAME-PID-N`.
    pub fn new(name: &str) -> TempDir {
        Self::under(&std::env::temp_dir(), name).unwrap()
    }

    /// Creates `hotloop-cli-NAME-PID-N` under `base` (a file system of
    /// the test's choice).
    pub fn under(base: &Path, name: &str) -> std::io::Result<TempDir> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = base.join(format!(
            "hotloop-cli-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(TempDir(dir))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `NAME` inside the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A self-signed certificate and its key, in a directory of their own
/// that is removed when this is dropped: kept for as long as a process
/// may read the files (at start, and again on SIGHUP).
pub struct Certificate {
    /// The certificate's PEM file.
    pub path: PathBuf,
    /// The private key's PEM file.
    pub key: PathBuf,
    _dir: TempDir,
}

/// A self-signed certificate for `localhost` and 127.0.0.1.
pub fn certificate() -> Certificate {
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let cert = rcgen::generate_simple_self_signed(names).unwrap();
    let dir = TempDir::new("tls");
    let (path, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&path, cert.cert.pem()).unwrap();
    std::fs::write(&key, cert.key_pair.serialize_pem()).unwrap();
    Certificate { path, key, _dir: dir }
}

/// `hotloop serve APP` over TLS on `driver` with two workers; the process,
/// its address and its certificate.
pub fn serve_tls(driver: &str, app: &str, extra: &[&str]) -> (Proc, SocketAddr, Certificate) {
    let cert = certificate();
    let (c, k) = (cert.path.to_str().unwrap(), cert.key.to_str().unwrap());
    let mut args =
        vec!["serve", app, "--addr", "127.0.0.1:0", "--workers", "2", "--driver", driver];
    args.extend_from_slice(&["--tls-cert", c, "--tls-key", k]);
    args.extend_from_slice(extra);
    let mut p = Proc::start(&args);
    let addr = p.addr_after(" on ");
    assert!(p.seen.iter().any(|l| l.contains("over TLS")), "{:?}", p.seen);
    (p, addr, cert)
}

/// A blocking TLS client connection.
pub type TlsClient = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A blocking TLS client that trusts `cert`, connected to `addr` with the
/// handshake done.
pub fn tls_client(addr: SocketAddr, cert: &Path) -> TlsClient {
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    tls_client_over(tcp, cert, &[])
}

/// A TLS client that trusts `cert` over `tcp` (connected), offering ALPN
/// `alpn`, with the handshake done.
pub fn tls_client_over(tcp: TcpStream, cert: &Path, alpn: &[&[u8]]) -> TlsClient {
    let mut roots = rustls::RootCertStore::empty();
    for c in hotloop::tls::load_certs(cert).unwrap() {
        roots.add(c).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let name = ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).unwrap();
    }
    tls
}

/// quinn's client configuration (TLS 1.3, `alpn` offered) trusting the
/// certificates in `cert`.
pub fn quic_client_config(cert: &Path, alpn: &[u8]) -> quinn::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for c in hotloop::tls::load_certs(cert).unwrap() {
        roots.add(c).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![alpn.to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    quinn::ClientConfig::new(Arc::new(crypto))
}

/// How a client's bytes after a closing request reach the server.
#[derive(Debug, Clone, Copy)]
pub enum Pipelined {
    /// One more request in the same write: read with the closing one,
    /// it stays in the server's buffer.
    Buffered,
    /// 48 KiB of requests in the same write, more than one read of the
    /// server's takes: the rest waits in the server's socket.
    BeyondOneRead,
    /// One more request once the answer has begun, while the server is
    /// still writing it (an answer larger than the socket buffers take):
    /// it waits in the server's socket.
    Later,
}

/// Sends `closing` (a request the server answers and then closes on)
/// followed by more, as `how` says, through a small receive buffer,
/// reading the answer only after a pause; returns all that came before
/// the end of the stream (a reset ends it too).
pub fn answer_with_pipelined_bytes(addr: SocketAddr, closing: &str, how: Pipelined) -> Vec<u8> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&addr.into()).unwrap();
    let mut s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    let next = "GET / HTTP/1.1\r\nHost: t\r\n\r\n";
    let mut first = Vec::new();
    match how {
        Pipelined::Buffered => s.write_all(format!("{closing}{next}").as_bytes()).unwrap(),
        Pipelined::BeyondOneRead => {
            let many = next.repeat(48 * 1024 / next.len());
            s.write_all(format!("{closing}{many}").as_bytes()).unwrap();
        }
        Pipelined::Later => {
            s.write_all(closing.as_bytes()).unwrap();
            first.resize(1, 0);
            s.read_exact(&mut first).unwrap();
            s.write_all(next.as_bytes()).unwrap();
        }
    }
    // The server writes what its socket takes and closes while most of
    // the answer has yet to reach the client.
    std::thread::sleep(Duration::from_millis(200));
    first.extend(read_to_close(&mut s).0);
    first
}

/// Asks `addr` for an answer it closes on (`Connection: close`) with
/// 1 MiB of requests pipelined behind it, written while the answer is
/// read through a 4 KiB receive buffer; returns what was read to the end
/// (panics if the server closed on the pipelined requests).
pub fn answer_with_a_megabyte_pipelined_behind(addr: SocketAddr) -> Vec<u8> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&addr.into()).unwrap();
    let mut s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut writer = s.try_clone().unwrap();
    writer.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    let next = "GET / HTTP/1.1\r\nHost: t\r\n\r\n";
    let sent = std::thread::spawn(move || {
        writer.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")?;
        writer.write_all(next.repeat((1 << 20) / next.len()).as_bytes())
    });
    let got = read_to_close(&mut s).0;
    sent.join().unwrap().expect("the server closed on the pipelined requests");
    got
}

/// The body length a whole answer `got` should have and the one it has.
pub fn body_lengths(got: &[u8]) -> (usize, usize) {
    let split = got.windows(4).position(|w| w == b"\r\n\r\n").expect("a whole head") + 4;
    let head = String::from_utf8_lossy(&got[..split]);
    let promised = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length").then_some(value)
        })
        .map_or(0, |v| v.trim().parse().unwrap());
    (promised, got.len() - split)
}
