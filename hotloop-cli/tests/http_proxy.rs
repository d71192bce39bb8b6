//! `hotloop proxy --mode http` against small backends on loopback: routing,
//! upstream pools, health, retries, the proxy's own answers, headers,
//! request smuggling, streaming with back-pressure, trailers, upgrades,
//! HTTP/2 on both sides, TLS, deadlines and the drain. Both drivers.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{stats, wait_until, Proc, TempDir};
use hotloop::DriverKind;

// ---------------------------------------------------------------- backends

/// A request as a backend saw it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seen {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
    pub(crate) trailers: Vec<(String, String)>,
}

impl Seen {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// What a backend answers.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
    /// Chunked, with these trailers.
    pub(crate) trailers: Option<Vec<(String, String)>>,
    /// Wait this long before answering.
    pub(crate) delay: Duration,
    /// Close the connection without answering.
    pub(crate) hang_up: bool,
    /// Answer 101 and echo every byte after it.
    pub(crate) echo_upgrade: bool,
}

impl Reply {
    pub(crate) fn ok(body: &str) -> Reply {
        Reply {
            status: 200,
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
            trailers: None,
            delay: Duration::ZERO,
            hang_up: false,
            echo_upgrade: false,
        }
    }
    pub(crate) fn status(mut self, s: u16) -> Reply {
        self.status = s;
        self
    }
}

type Handler = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

/// An HTTP/1.1 backend on its own threads, keep-alive, counting.
pub(crate) struct Backend {
    pub(crate) addr: SocketAddr,
    pub(crate) accepts: Arc<AtomicUsize>,
    /// Connections whose peer (the proxy) closed them.
    pub(crate) closed: Arc<AtomicUsize>,
    pub(crate) seen: Arc<Mutex<Vec<Seen>>>,
}

impl Backend {
    pub(crate) fn start(handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Backend {
        Self::on(TcpListener::bind("127.0.0.1:0").unwrap(), Arc::new(handler))
    }

    pub(crate) fn named(name: &'static str) -> Backend {
        Self::start(move |_| Reply::ok(name))
    }

    fn on(l: TcpListener, handler: Handler) -> Backend {
        let addr = l.local_addr().unwrap();
        let accepts = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (a, c, s) = (accepts.clone(), closed.clone(), seen.clone());
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(conn) = conn else { return };
                a.fetch_add(1, SeqCst);
                let (c, s, h) = (c.clone(), s.clone(), handler.clone());
                std::thread::spawn(move || serve(conn, h, s, c));
            }
        });
        Backend { addr, accepts, closed, seen }
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub(crate) fn addr(&self) -> String {
        self.addr.to_string()
    }
}

fn serve(conn: TcpStream, handler: Handler, seen: Arc<Mutex<Vec<Seen>>>, closed: Arc<AtomicUsize>) {
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut w = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    loop {
        let Some(req) = read_request(&mut r) else {
            closed.fetch_add(1, SeqCst);
            return;
        };
        seen.lock().unwrap().push(req.clone());
        let reply = handler(&req);
        std::thread::sleep(reply.delay);
        if reply.hang_up {
            let _ = w.shutdown(Shutdown::Both);
            return;
        }
        if reply.echo_upgrade {
            let _ = w.write_all(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\nhello from the backend;",
            );
            let mut buf = [0u8; 4096];
            loop {
                match r.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        let _ = w.shutdown(Shutdown::Write);
                        return;
                    }
                    Ok(n) => {
                        if w.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                }
            }
        }
        let _ = write_reply(&mut w, &reply, req.method == "HEAD");
    }
}

fn write_reply(w: &mut TcpStream, reply: &Reply, head_only: bool) -> std::io::Result<()> {
    let mut out = format!("HTTP/1.1 {} X\r\n", reply.status);
    for (n, v) in &reply.headers {
        out += &format!("{n}: {v}\r\n");
    }
    match &reply.trailers {
        None => out += &format!("Content-Length: {}\r\n\r\n", reply.body.len()),
        Some(_) => out += "Transfer-Encoding: chunked\r\n\r\n",
    }
    w.write_all(out.as_bytes())?;
    if head_only {
        return Ok(());
    }
    match &reply.trailers {
        None => w.write_all(&reply.body),
        Some(t) => {
            let mut out = format!("{:x}\r\n", reply.body.len()).into_bytes();
            out.extend_from_slice(&reply.body);
            out.extend_from_slice(b"\r\n0\r\n");
            for (n, v) in t {
                out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
            }
            out.extend_from_slice(b"\r\n");
            w.write_all(&out)
        }
    }
}

fn read_line(r: &mut impl BufRead) -> Option<String> {
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line.trim_end_matches(['\r', '\n']).to_string()),
    }
}

fn read_fields(r: &mut impl BufRead) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    loop {
        let line = read_line(r)?;
        if line.is_empty() {
            return Some(out);
        }
        let (n, v) = line.split_once(':')?;
        out.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
}

/// A chunked body and its trailers; `None` if the stream ends first.
/// Header or trailer fields, names lowercased.
type Fields = Vec<(String, String)>;

fn read_chunked(r: &mut impl BufRead) -> Option<(Vec<u8>, Fields)> {
    let mut body = Vec::new();
    loop {
        let size = usize::from_str_radix(read_line(r)?.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some((body, read_fields(r)?));
        }
        let mut chunk = vec![0u8; size + 2];
        r.read_exact(&mut chunk).ok()?;
        body.extend_from_slice(&chunk[..size]);
    }
}

/// One whole request; `None` at the end of the stream or on a request cut short.
fn read_request(r: &mut impl BufRead) -> Option<Seen> {
    let line = read_line(r)?;
    let mut parts = line.split(' ');
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    let headers = read_fields(r)?;
    let mut seen = Seen { method, path, headers, ..Default::default() };
    if seen.header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let (body, trailers) = read_chunked(r)?;
        seen.body = body;
        seen.trailers = trailers;
    } else if let Some(len) = seen.header("content-length") {
        let mut body = vec![0u8; len.parse().ok()?];
        r.read_exact(&mut body).ok()?;
        seen.body = body;
    }
    Some(seen)
}

// ---------------------------------------------------------------- clients

/// An answer as the client read it.
#[derive(Debug, Default)]
pub(crate) struct Resp {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
    pub(crate) trailers: Vec<(String, String)>,
}

impl Resp {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Reads one answer (to a request that was not HEAD); `None` if the
/// connection ends first.
fn read_resp(r: &mut impl BufRead) -> Option<Resp> {
    let line = read_line(r)?;
    let status = line.split(' ').nth(1)?.parse().ok()?;
    let headers = read_fields(r)?;
    let mut resp = Resp { status, headers, ..Default::default() };
    if status == 101 || status == 204 || status == 304 {
        return Some(resp);
    }
    if resp.header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let (body, trailers) = read_chunked(r)?;
        resp.body = body;
        resp.trailers = trailers;
    } else if let Some(len) = resp.header("content-length") {
        let mut body = vec![0u8; len.parse().ok()?];
        r.read_exact(&mut body).ok()?;
        resp.body = body;
    } else {
        r.read_to_end(&mut resp.body).ok()?;
    }
    Some(resp)
}

/// A kept-alive client connection.
pub(crate) struct Client {
    pub(crate) w: TcpStream,
    pub(crate) r: BufReader<TcpStream>,
}

impl Client {
    pub(crate) fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Client { w: s.try_clone().unwrap(), r: BufReader::new(s) }
    }

    pub(crate) fn send(&mut self, raw: &[u8]) -> Option<Resp> {
        self.w.write_all(raw).ok()?;
        read_resp(&mut self.r)
    }

    /// Whether the proxy closed the connection (nothing more comes).
    pub(crate) fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.r.read(&mut b), Ok(0) | Err(_))
    }
}

pub(crate) fn get(host: &str, path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").into_bytes()
}

/// One request on a new connection.
pub(crate) fn once(addr: SocketAddr, raw: &[u8]) -> Resp {
    Client::connect(addr).send(raw).expect("an answer")
}

// ---------------------------------------------------------------- the proxy

pub(crate) fn start(driver: DriverKind, args: &[&str]) -> (Proc, SocketAddr, SocketAddr) {
    let driver = common::driver_arg(driver);
    let mut all = vec!["proxy", "--mode", "http", "--listen", "127.0.0.1:0", "--driver", driver];
    all.extend_from_slice(&["--stats-addr", "127.0.0.1:0"]);
    all.extend_from_slice(args);
    let mut p = Proc::start(&all);
    let addr = p.addr_after(" on ");
    let stats = p.addr_after("stats on ");
    (p, addr, stats)
}

/// `text` in a config file, in a directory that goes (the file with it)
/// when the returned guard is dropped.
pub(crate) fn config_file(text: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new("http-proxy");
    let path = dir.join("proxy.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

pub(crate) fn with_config(
    driver: DriverKind,
    text: &str,
    extra: &[&str],
) -> (Proc, SocketAddr, SocketAddr) {
    // The proxy reads the file once, before it says where it listens, and
    // `start` waits for that: the file can go when this returns.
    let (_dir, path) = config_file(text);
    let mut args = vec!["--config", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    start(driver, &args)
}

pub(crate) fn stat(stats_addr: SocketAddr, name: &str) -> u64 {
    let v = stats(stats_addr);
    v[name].as_u64().unwrap_or_else(|| panic!("no {name} in the stats"))
}

// ---------------------------------------------------------------- tests

/// The first route whose host and path prefix match picks the group; a
/// request no route takes gets 404.
#[hotloop::test(driver = "all")]
fn routes_send_each_host_and_path_to_its_group(driver: DriverKind) {
    let (a, b, c) = (Backend::named("a"), Backend::named("b"), Backend::named("c"));
    let config = format!(
        r#"
[groups.api]
backends = ["{}"]
[groups.wild]
backends = ["{}"]
[groups.static]
backends = ["{}"]

[[routes]]
host = "api.test"
path = "/v1/"
group = "api"
[[routes]]
host = "*.test"
group = "wild"
[[routes]]
path = "/static/"
group = "static"
"#,
        a.addr(),
        b.addr(),
        c.addr()
    );
    let (_p, addr, st) = with_config(driver, &config, &["--workers", "2"]);
    let mut cl = Client::connect(addr);
    assert_eq!(cl.send(&get("API.test:80", "/v1/users")).unwrap().text(), "a");
    assert_eq!(cl.send(&get("api.test", "/v2/")).unwrap().text(), "b");
    assert_eq!(cl.send(&get("www.test", "/")).unwrap().text(), "b");
    assert_eq!(cl.send(&get("example.org", "/static/x.css")).unwrap().text(), "c");
    let miss = cl.send(&get("example.org", "/")).unwrap();
    assert_eq!(miss.status, 404, "{miss:?}");
    // An absolute-form target names the host, whatever `Host` says.
    let abs = cl.send(b"GET http://api.test/v1/x HTTP/1.1\r\nHost: other.org\r\n\r\n").unwrap();
    assert_eq!(abs.text(), "a");
    assert_eq!(a.seen()[1].path, "/v1/x", "the backend gets the origin form");
    assert_eq!(
        a.seen()[1].header("host"),
        Some("api.test"),
        "the backend gets the host the route was picked by"
    );
    assert_eq!(stat(st, "http_no_route"), 1);
}

/// `--backend` without a file is one group for every host and path, and
/// the backends take turns.
#[hotloop::test(driver = "all")]
fn backends_without_a_file_take_turns_for_every_host(driver: DriverKind) {
    let (a, b) = (Backend::named("a"), Backend::named("b"));
    let list = format!("{},{}", a.addr(), b.addr());
    let (_p, addr, _) = start(driver, &["--backend", &list, "--workers", "1"]);
    let mut cl = Client::connect(addr);
    let got: Vec<String> =
        (0..4).map(|i| cl.send(&get(&format!("h{i}.org"), "/any")).unwrap().text()).collect();
    assert_eq!(got, ["a", "b", "a", "b"]);
}

/// Short client connections reuse the workers' pooled backend connections
/// (counted in the stats); pooled connections idle past their timeout are
/// closed; the pool keeps at most `pool_idle_max` per backend and worker.
///
/// The reuse is counted under the default idle timeout (60 s): with a
/// short one, a worker that the kernel happened to give no client
/// connection for longer than the timeout (a stall of a loaded machine, or
/// a run of connections to the other worker) rightly closed its idle
/// connection and opened another, a third connection that was not a
/// failure to reuse. The expiry is then checked on a proxy of its own.
/// The borrow wait is long for the same reason: a worker whose borrow
/// from the other took longer than the default 1 ms (a loaded machine)
/// rightly connected instead.
#[hotloop::test(driver = "all")]
fn upstream_connections_are_pooled_reused_and_expire(driver: DriverKind) {
    let a = Backend::named("a");
    let config = format!(
        "[groups.g]\nbackends = [\"{}\"]\npool_idle_max = 2\npool_borrow_ms = 5000\n",
        a.addr()
    );
    let (_p, addr, st) = with_config(driver, &config, &["--workers", "2"]);
    for _ in 0..40 {
        let r = once(addr, b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        assert_eq!(r.status, 200);
    }
    let accepts = a.accepts.load(SeqCst);
    assert!(
        accepts <= 2,
        "40 requests from 40 client connections took {accepts} backend connections"
    );
    assert_eq!(a.closed.load(SeqCst), 0, "a pooled connection closed before its idle timeout");
    assert_eq!(stat(st, "backend_g_0_requests"), 40);
    assert_eq!(stat(st, "backend_g_0_reused"), 40 - accepts as u64);
    // Idle past 400 ms: the proxy closes them.
    let e = Backend::named("e");
    let config = format!(
        "[groups.g]\nbackends = [\"{}\"]\npool_idle_timeout_ms = 400\npool_idle_max = 2\n",
        e.addr()
    );
    let (_e, addr, st) = with_config(driver, &config, &["--workers", "2"]);
    for _ in 0..4 {
        assert_eq!(once(addr, &get("t", "/")).status, 200);
    }
    assert!(
        wait_until(Duration::from_secs(5), || e.closed.load(SeqCst) == e.accepts.load(SeqCst)),
        "{} of {} pooled connections closed",
        e.closed.load(SeqCst),
        e.accepts.load(SeqCst)
    );
    assert!(wait_until(Duration::from_secs(2), || stat(st, "backend_g_0_pool_idle") == 0));
    // Five answers at once on one worker's five connections; two stay idle.
    let slow = Backend::start(|_| Reply { delay: Duration::from_millis(300), ..Reply::ok("s") });
    let config = format!("[groups.g]\nbackends = [\"{}\"]\npool_idle_max = 2\n", slow.addr());
    let (_q, addr, st) = with_config(driver, &config, &["--workers", "1"]);
    let threads: Vec<_> =
        (0..5).map(|_| std::thread::spawn(move || once(addr, &get("t", "/")).status)).collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 200);
    }
    assert_eq!(slow.accepts.load(SeqCst), 5);
    assert!(wait_until(Duration::from_secs(2), || slow.closed.load(SeqCst) == 3));
    assert_eq!(stat(st, "backend_g_0_pool_idle"), 2);
}

/// A worker with no idle connection to a backend borrows the one another
/// worker holds: requests on short client connections, spread over two
/// workers, all go over the one backend connection (moved between the
/// workers' drivers, not opened again), and the move is counted.
#[hotloop::test(driver = "all")]
fn a_worker_borrows_an_idle_connection_from_another_workers_pool(driver: DriverKind) {
    let a = Backend::named("a");
    // A generous wait: the lender's worker may be slow to answer on a
    // loaded machine, and a borrow that comes too late would open a
    // second connection.
    let config = format!("[groups.g]\nbackends = [\"{}\"]\npool_borrow_ms = 5000\n", a.addr());
    let (_p, addr, st) = with_config(driver, &config, &["--workers", "2"]);
    let mut sent = 0;
    // The listener spreads the connections over both workers; after the
    // first, each one on the worker without the connection borrows it.
    while sent < 60 && (sent < 10 || stat(st, "backend_g_0_borrowed") == 0) {
        let r = once(addr, b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        assert_eq!(r.text(), "a");
        sent += 1;
    }
    let borrowed = stat(st, "backend_g_0_borrowed");
    assert!(borrowed >= 1, "{sent} client connections, none on the worker without the connection");
    assert_eq!(a.accepts.load(SeqCst), 1, "the backend accepted a second connection");
    assert_eq!(a.closed.load(SeqCst), 0, "a connection closed in the move");
    assert_eq!(stat(st, "backend_g_0_lent"), borrowed);
    assert_eq!(stat(st, "backend_g_0_reused"), sent - 1);
    assert_eq!(stat(st, "backend_g_0_connects"), 1);
}

/// A request that finds its worker's pool empty while one of the worker's
/// connections to the backend is busy waits (up to `pool_borrow_ms`) for
/// that one to come back rather than open another; with a wait shorter
/// than the busy answer, or with `pool_borrow_ms = 0`, it connects.
#[hotloop::test(driver = "all")]
fn a_request_waits_for_a_busy_connection_to_come_back(driver: DriverKind) {
    let slow = Backend::start(|_| Reply { delay: Duration::from_millis(150), ..Reply::ok("s") });
    let two_at_once = |pool_borrow_ms: u64| {
        let config = format!(
            "[groups.g]\nbackends = [\"{}\"]\npool_borrow_ms = {pool_borrow_ms}\n",
            slow.addr()
        );
        let before = slow.accepts.load(SeqCst);
        let (_p, addr, st) = with_config(driver, &config, &["--workers", "1"]);
        let first = std::thread::spawn(move || once(addr, &get("t", "/")).status);
        // The first request's connection is busy at the backend when the
        // second comes.
        assert!(wait_until(Duration::from_secs(5), || slow.accepts.load(SeqCst) > before));
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(once(addr, &get("t", "/")).status, 200);
        assert_eq!(first.join().unwrap(), 200);
        (slow.accepts.load(SeqCst) - before, stat(st, "backend_g_0_reused"))
    };
    assert_eq!(two_at_once(5000), (1, 1), "the second request opened a connection of its own");
    assert_eq!(two_at_once(20), (2, 0), "a short wait still took the busy connection");
    assert_eq!(two_at_once(0), (2, 0), "waited with waiting off");
}

/// A connection the backend closed while it was idle is not lent: the
/// borrower connects instead and every request is answered. With
/// `pool_borrow_ms = 0` nothing is borrowed at all.
#[hotloop::test(driver = "all")]
fn a_connection_the_backend_closed_is_not_lent(driver: DriverKind) {
    // Answers keep-alive, then closes: every pooled connection is dead by
    // the time another request could borrow it.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let backend = l.local_addr().unwrap();
    let (accepts, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (a, c) = (accepts.clone(), closed.clone());
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { return };
            a.fetch_add(1, SeqCst);
            let c = c.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn.try_clone().unwrap());
                if read_request(&mut r).is_some() {
                    let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nk");
                }
                let _ = conn.shutdown(Shutdown::Both);
                c.fetch_add(1, SeqCst);
            });
        }
    });
    let config = format!("[groups.g]\nbackends = [\"{backend}\"]\npool_borrow_ms = 5000\n");
    let (_p, addr, st) = with_config(driver, &config, &["--workers", "2"]);
    for i in 0..20 {
        let r = once(addr, b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        assert_eq!((i, r.status, r.text()), (i, 200, "k".to_string()));
        // The backend's end is sent before the next request (a request
        // written before it would be lost on any reused connection).
        assert!(wait_until(Duration::from_secs(5), || {
            closed.load(SeqCst) == accepts.load(SeqCst)
        }));
    }
    assert_eq!(stat(st, "backend_g_0_lent"), 0, "a closed connection was lent");
    assert_eq!(stat(st, "backend_g_0_borrowed"), 0);
    assert_eq!(stat(st, "http_502"), 0);

    let a = Backend::named("a");
    let config = format!("[groups.g]\nbackends = [\"{}\"]\npool_borrow_ms = 0\n", a.addr());
    let (_q, addr, st) = with_config(driver, &config, &["--workers", "2"]);
    for _ in 0..20 {
        assert_eq!(once(addr, &get("t", "/")).text(), "a");
    }
    assert_eq!(stat(st, "backend_g_0_borrowed"), 0, "borrowed with borrowing off");
}

/// A worker whose turn falls on a backend with its pooled connection busy
/// sends the request to another backend it holds an idle connection to,
/// rather than open a new one.
#[hotloop::test(driver = "all")]
fn a_worker_prefers_a_backend_it_holds_an_idle_connection_to(driver: DriverKind) {
    let slow_or = |name: &'static str| {
        move |s: &Seen| {
            let delay = if s.path == "/slow" { Duration::from_millis(600) } else { Duration::ZERO };
            Reply { delay, ..Reply::ok(name) }
        }
    };
    let (a, b) = (Backend::start(slow_or("a")), Backend::start(slow_or("b")));
    let list = format!("{},{}", a.addr(), b.addr());
    let (_p, addr, st) = start(driver, &["--backend", &list, "--workers", "1"]);
    // One pooled connection to each backend.
    assert_eq!(once(addr, &get("t", "/")).text(), "a");
    assert_eq!(once(addr, &get("t", "/")).text(), "b");
    // a's connection busy for a while; b's turn, then a's again.
    let slow = std::thread::spawn(move || once(addr, &get("t", "/slow")).text());
    assert!(wait_until(Duration::from_secs(5), || a.seen().len() == 2));
    assert_eq!(once(addr, &get("t", "/")).text(), "b");
    assert_eq!(once(addr, &get("t", "/")).text(), "b", "b's idle connection, not a new one to a");
    assert_eq!(slow.join().unwrap(), "a");
    assert_eq!((a.accepts.load(SeqCst), b.accepts.load(SeqCst)), (1, 1));
    assert_eq!(stat(st, "backend_default_1_reused"), 2);
    // With a's connection back, the turns go on.
    let got: Vec<String> = (0..2).map(|_| once(addr, &get("t", "/")).text()).collect();
    assert_eq!(got, ["b", "a"]);
}

/// Backends over TLS (`https://` in `backends`, or `tls = true`): the
/// certificate is checked against the roots of `tls_ca_file` (the
/// system's without it) for `tls_server_name`, unless `tls_verify =
/// false`; one that does not check out is a 502 that says why. ALPN
/// offers the group's protocol, so `protocol = "h2"` gets HTTP/2. The
/// health checks connect the same way.
#[hotloop::test(driver = "all")]
fn backends_over_tls_are_verified_and_negotiate_alpn(driver: DriverKind) {
    let a = Backend::named("a");
    let cert = common::certificate();
    let (c, k) = (cert.path.to_str().unwrap(), cert.key.to_str().unwrap());
    // The TLS backend: a proxy with a certificate for `localhost`, before `a`.
    let args = ["--backend", &a.addr(), "--workers", "1", "--tls-cert", c, "--tls-key", k];
    let (_backend, tls_addr, _) = start(driver, &args);
    let port = tls_addr.port();
    let config = format!(
        r#"
[groups.good]
backends = ["https://127.0.0.1:{port}"]
tls_server_name = "localhost"
tls_ca_file = "{c}"
health_path = "/health"
health_interval_ms = 50
[groups.h2]
backends = ["127.0.0.1:{port}"]
protocol = "h2"
tls = true
tls_server_name = "localhost"
tls_ca_file = "{c}"
[groups.system]
backends = ["https://127.0.0.1:{port}"]
tls_server_name = "localhost"
[groups.wrong]
backends = ["https://127.0.0.1:{port}"]
tls_server_name = "other.test"
tls_ca_file = "{c}"
[groups.unverified]
backends = ["https://127.0.0.1:{port}"]
tls_server_name = "other.test"
tls_verify = false

[[routes]]
path = "/good"
group = "good"
[[routes]]
path = "/h2"
group = "h2"
[[routes]]
path = "/system"
group = "system"
[[routes]]
path = "/wrong"
group = "wrong"
[[routes]]
path = "/unverified"
group = "unverified"
"#
    );
    let (_p, addr, _) = with_config(driver, &config, &["--workers", "1"]);
    // The health checks go over TLS too.
    assert!(wait_until(Duration::from_secs(5), || a.seen().iter().any(|s| s.path == "/health")));
    let requests =
        || -> Vec<Seen> { a.seen().into_iter().filter(|s| s.path != "/health").collect() };
    let mut cl = Client::connect(addr);
    let r = cl.send(&get("t", "/good")).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "a"), "{r:?}");
    let via = |s: &Seen| -> Vec<String> {
        s.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("via"))
            .map(|(_, v)| v.clone())
            .collect()
    };
    let seen = requests().pop().unwrap();
    assert_eq!(via(&seen), ["1.1 hotloop", "1.1 hotloop"]);
    assert!(seen.header("forwarded").unwrap().ends_with("proto=https"), "{seen:?}");
    let r = cl.send(&get("t", "/h2")).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "a"), "{r:?}");
    let seen = requests().pop().unwrap();
    assert_eq!(via(&seen), ["1.1 hotloop", "2 hotloop"], "HTTP/2 over ALPN");
    for (path, why) in [("/system", "UnknownIssuer"), ("/wrong", "not valid for name")] {
        let r = cl.send(&get("t", path)).unwrap();
        assert_eq!(r.status, 502, "{path}: {r:?}");
        assert!(r.text().contains("TLS") && r.text().contains(why), "{path}: {}", r.text());
    }
    let r = cl.send(&get("t", "/unverified")).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "a"), "{r:?}");
    assert_eq!(requests().len(), 3, "no request reached `a` through a refused certificate");
}

/// Hop-by-hop fields (the fixed ones and those `Connection` names) are
/// removed both ways; `Via`, `X-Forwarded-For` and `Forwarded` are added.
#[hotloop::test(driver = "all")]
fn hop_by_hop_headers_go_and_forwarding_headers_come(driver: DriverKind) {
    let a = Backend::start(|_| {
        let mut r = Reply::ok("a");
        r.headers = vec![
            ("Connection".into(), "X-Backend-Hop".into()),
            ("X-Backend-Hop".into(), "1".into()),
            ("Keep-Alive".into(), "timeout=5".into()),
            ("X-End".into(), "kept".into()),
        ];
        r
    });
    let (_p, addr, _) = start(driver, &["--backend", &a.addr(), "--workers", "1"]);
    let r = once(
        addr,
        b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: keep-alive, X-Client-Hop\r\nX-Client-Hop: 1\r\n\
          Keep-Alive: timeout=9\r\nProxy-Authorization: Basic eDp5\r\nProxy-Connection: keep-alive\r\n\
          TE: trailers, deflate\r\nX-Forwarded-For: 10.1.2.3\r\nX-End: kept\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    let seen = &a.seen()[0];
    for gone in ["x-client-hop", "keep-alive", "proxy-authorization", "proxy-connection"] {
        assert!(seen.header(gone).is_none(), "{gone} reached the backend: {seen:?}");
    }
    assert_eq!(seen.header("te"), Some("trailers"));
    assert_eq!(seen.header("x-end"), Some("kept"));
    assert_eq!(seen.header("via"), Some("1.1 hotloop"));
    assert_eq!(seen.header("x-forwarded-for"), Some("10.1.2.3, 127.0.0.1"));
    assert_eq!(seen.header("forwarded"), Some("for=127.0.0.1;host=\"a.test\";proto=http"));
    assert_eq!(seen.header("host"), Some("a.test"));
    assert!(r.header("x-backend-hop").is_none() && r.header("keep-alive").is_none(), "{r:?}");
    assert_eq!(r.header("x-end"), Some("kept"));
    assert_eq!(r.header("via"), Some("1.1 hotloop"));
}

/// The request-smuggling forms: those hyper refuses get 400 and reach no
/// backend; the rest are read one way only and sent on framed again, so the
/// backend sees exactly the request the proxy read and never a second one.
#[hotloop::test(driver = "all")]
fn smuggling_attempts_are_refused_or_framed_again(driver: DriverKind) {
    let a = Backend::named("a");
    let (_p, addr, st) = start(driver, &["--backend", &a.addr(), "--workers", "1"]);
    let smuggled = "GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n";
    let refused: [(&str, String); 9] = [
        (
            "double CL",
            "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde"
                .into(),
        ),
        ("obs-fold", "GET / HTTP/1.1\r\nHost: t\r\nX-A: a\r\n b\r\n\r\n".into()),
        ("bare CR", "GET / HTTP/1.1\rHost: t\r\n\r\n".into()),
        (
            "TE not chunked",
            format!("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n{smuggled}"),
        ),
        (
            "chunked not last",
            "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n"
                .into(),
        ),
        (
            "space before colon",
            "POST / HTTP/1.1\r\nHost: t\r\nContent-Length : 5\r\n\r\nhello".into(),
        ),
        ("signed CL", "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: +5\r\n\r\nhello".into()),
        (
            "TE in HTTP/1.0",
            "POST / HTTP/1.0\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".into(),
        ),
        ("two Hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n".into()),
    ];
    for (what, raw) in &refused {
        let mut cl = Client::connect(addr);
        let r = cl.send(raw.as_bytes()).unwrap_or_else(|| panic!("{what}: no answer"));
        assert_eq!(r.status, 400, "{what}: {r:?}");
    }
    assert!(a.seen().is_empty(), "refused requests reached the backend: {:?}", a.seen());
    // Invalid chunk sizes: 400 (never 502: the backend is not to blame).
    for (what, chunks) in [
        ("non-hex size", "zz\r\nhello\r\n0\r\n\r\n"),
        ("size overflow", "fffffffffffffffffff\r\nhello\r\n0\r\n\r\n"),
        ("bare LF after size", "5\nhello\r\n0\r\n\r\n"),
    ] {
        let raw = format!(
            "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n{chunks}{smuggled}"
        );
        let mut cl = Client::connect(addr);
        let r = cl.send(raw.as_bytes()).unwrap_or_else(|| panic!("{what}: no answer"));
        assert_eq!(r.status, 400, "{what}: {r:?}");
        assert!(cl.closed(), "{what}: the connection stayed open");
    }
    // CL and TE: read as chunked, answered, and the connection closed, so
    // the bytes after the chunked body are never read as a request.
    for order in [
        "Content-Length: 4\r\nTransfer-Encoding: chunked",
        "Transfer-Encoding: chunked\r\nContent-Length: 4",
    ] {
        let raw = format!("POST /clte HTTP/1.1\r\nHost: t\r\n{order}\r\n\r\n0\r\n\r\n{smuggled}");
        let mut cl = Client::connect(addr);
        assert_eq!(cl.send(raw.as_bytes()).unwrap().status, 200);
        assert!(cl.closed(), "the connection after CL+TE stayed open");
    }
    // A bare LF ends head lines (RFC 9112 section 2.2); the backend gets CRLF.
    let mut cl = Client::connect(addr);
    assert_eq!(cl.send(b"GET /lf HTTP/1.1\nHost: t\n\n").unwrap().status, 200);
    // Identical Content-Lengths are one (RFC 9110 section 8.6).
    let r = cl.send(
        b"POST /samecl HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nabcd",
    );
    assert_eq!(r.unwrap().status, 200);
    let seen = a.seen();
    let paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    assert!(!paths.contains(&"/smuggled"), "a smuggled request reached the backend: {paths:?}");
    let clte: Vec<&Seen> = seen.iter().filter(|s| s.path == "/clte").collect();
    assert_eq!(clte.len(), 2);
    for s in clte {
        assert!(s.body.is_empty() && s.header("content-length").is_none_or(|v| v == "0"), "{s:?}");
    }
    let same = seen.iter().find(|s| s.path == "/samecl").unwrap();
    assert_eq!(same.body, b"abcd");
    assert_eq!(
        stat(st, "backend_default_0_errors"),
        0,
        "client errors were held against the backend"
    );
}

/// A refused connect moves any request to the next backend (nothing was
/// sent); `max_fails` failures eject a backend for `fail_timeout_ms`, but
/// never a group's last one in: it gets 502 with a body that says why.
/// With every backend of a group out (here by the active checks) the
/// answer is 503 with `Retry-After`.
#[hotloop::test(driver = "all")]
fn connect_failures_retry_eject_and_answer_502_then_503(driver: DriverKind) {
    // Bound and never listening: connects are refused, and no other test's
    // listener can take the port while it is held (a listener dropped at
    // once would leave the port free for one).
    let dead_socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    dead_socket.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
    let dead = dead_socket.local_addr().unwrap().as_socket().unwrap();
    let live = Backend::named("live");
    let config = format!(
        r#"
[groups.mixed]
backends = ["{dead}", "{}"]
max_fails = 2
fail_timeout_ms = 30000
[groups.gone]
backends = ["{dead}"]
max_fails = 2
fail_timeout_ms = 30000
[groups.checked]
backends = ["{dead}"]
health_path = "/health"
health_interval_ms = 100
health_fall = 1
[[routes]]
host = "gone.test"
group = "gone"
[[routes]]
host = "checked.test"
group = "checked"
[[routes]]
group = "mixed"
"#,
        live.addr()
    );
    let (mut p, addr, st) = with_config(driver, &config, &["--workers", "1"]);
    let mut cl = Client::connect(addr);
    for i in 0..6 {
        assert_eq!(cl.send(&get("t", "/")).unwrap().text(), "live", "GET {i}");
        let post = cl.send(b"POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc").unwrap();
        assert_eq!(post.text(), "live", "POST {i}");
    }
    assert_eq!(live.seen().iter().filter(|s| s.body == b"abc").count(), 6);
    assert_eq!(stat(st, "backend_mixed_0_ejections"), 1);
    assert_eq!(stat(st, "backend_mixed_0_errors"), 2, "an ejected backend is not tried");
    // The only backend of its group: failures never take it out.
    for i in 0..4 {
        let r = cl.send(&get("gone.test", "/")).unwrap();
        assert_eq!(r.status, 502, "{i}: {r:?}");
        assert!(r.text().contains("group gone: could not connect"), "{}", r.text());
    }
    assert_eq!(stat(st, "backend_gone_0_errors"), 4);
    assert_eq!(stat(st, "backend_gone_0_ejections"), 0, "a group's last backend was taken out");
    // The checks may take it down: then 503, and `Retry-After` is the time
    // the checks take to bring it back (2 passes 100 ms apart: 1 s).
    assert!(p.wait_for_line("is down", Duration::from_secs(5)), "{:?}", p.seen);
    let out = cl.send(&get("checked.test", "/")).unwrap();
    assert_eq!(out.status, 503, "{out:?}");
    assert_eq!(out.header("retry-after"), Some("1"), "{out:?}");
    assert!(out.text().contains("no backend of group checked is up"));
    assert_eq!(stat(st, "http_503"), 1);
    assert_eq!(stat(st, "http_502"), 4);
}

/// A 5xx answer is the backend's answer, not its failure: any client can
/// provoke one (an unhandled exception, a 501 for an unknown method), and
/// a few of them took a group's only backend out, every client then
/// getting 503. With `fail_on_5xx = true` they count, but never take out
/// a group's last backend in.
#[hotloop::test(driver = "all")]
fn server_errors_take_no_backend_out_unless_the_group_says_so(driver: DriverKind) {
    let failing = |name: &'static str| {
        move |s: &Seen| {
            if s.path == "/boom" {
                Reply::ok("oops").status(500)
            } else {
                Reply::ok(name)
            }
        }
    };
    let (only, s1, s2) = (
        Backend::start(failing("only")),
        Backend::start(failing("s1")),
        Backend::start(failing("s2")),
    );
    // The defaults.
    let config = format!("[groups.app]\nbackends = [\"{}\"]\n", only.addr());
    let (_p, addr, st) = with_config(driver, &config, &["--workers", "1"]);
    let mut cl = Client::connect(addr);
    for i in 0..5 {
        assert_eq!(cl.send(&get("t", "/boom")).unwrap().status, 500, "{i}");
    }
    let r = cl.send(&get("t", "/")).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "only"), "{r:?}");
    assert_eq!(stat(st, "backend_app_0_errors"), 0, "a 500 counted as a failure");
    assert_eq!(stat(st, "backend_app_0_ejections"), 0);
    // Counted where the group asks: the first to reach `max_fails` goes
    // out, the other, then the last one in, stays.
    let config = format!(
        "[groups.strict]\nbackends = [\"{}\", \"{}\"]\nfail_on_5xx = true\nmax_fails = 2\nfail_timeout_ms = 30000\n",
        s1.addr(),
        s2.addr()
    );
    let (_q, addr, st) = with_config(driver, &config, &["--workers", "1"]);
    let mut cl = Client::connect(addr);
    for i in 0..8 {
        let r = cl.send(&get("strict.test", "/boom")).unwrap();
        assert_eq!(r.status, 500, "{i}: {r:?}");
    }
    let n = |name: &str| stat(st, &format!("backend_strict_{name}"));
    assert_eq!(n("0_ejections") + n("1_ejections"), 1);
    assert_eq!(n("0_errors") + n("1_errors"), 8);
    assert_eq!(stat(st, "http_503"), 0);
}

/// A connection lost after the request was sent: an idempotent request
/// without a body goes to the next backend, a POST gets 502. A backend
/// slower than `header_timeout_ms` gets 504. A 5xx answer is passed on
/// and not counted against its backend.
#[hotloop::test(driver = "all")]
fn lost_requests_retry_only_when_idempotent_and_slow_ones_get_504(driver: DriverKind) {
    let crashing = Backend::start(|s| Reply {
        hang_up: s.path != "/slow",
        delay: Duration::from_millis(if s.path == "/slow" { 1500 } else { 0 }),
        ..Reply::ok("crashing")
    });
    let steady = Backend::start(|s| {
        if s.path == "/500" {
            Reply::ok("oops").status(500)
        } else {
            Reply::ok("steady")
        }
    });
    let config = format!(
        "[groups.g]\nbackends = [\"{}\", \"{}\"]\nmax_fails = 0\nheader_timeout_ms = 300\n",
        crashing.addr(),
        steady.addr()
    );
    let (_p, addr, st) = with_config(driver, &config, &["--workers", "1"]);
    let mut cl = Client::connect(addr);
    // Round-robin starts at the crashing backend for requests 0, 2, 4.
    let get0 = cl.send(&get("t", "/")).unwrap();
    assert_eq!(get0.text(), "steady", "{get0:?}");
    assert_eq!(cl.send(&get("t", "/")).unwrap().text(), "steady");
    let post = cl.send(b"POST /once HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc").unwrap();
    assert_eq!(post.status, 502, "a POST was sent again: {post:?}");
    assert!(steady.seen().iter().all(|s| s.method != "POST"));
    assert_eq!(cl.send(&get("t", "/500")).unwrap().status, 500);
    let slow = cl.send(&get("t", "/slow")).unwrap();
    assert_eq!(slow.status, 504, "{slow:?}");
    assert!(slow.text().contains("no answer within 300 ms"));
    assert!(stat(st, "http_retries") >= 1);
    assert_eq!(stat(st, "backend_g_1_errors"), 0, "the 500 counted against its backend");
}

/// Active checks: `health_fall` failed checks take a backend out,
/// `health_rise` passing ones bring it back.
#[hotloop::test(driver = "all")]
fn active_health_checks_take_a_backend_out_and_back(driver: DriverKind) {
    let sick = Arc::new(AtomicBool::new(false));
    let s = sick.clone();
    let flaky = Backend::start(move |r| {
        if r.path == "/health" && s.load(SeqCst) {
            Reply::ok("sick").status(503)
        } else {
            Reply::ok("flaky")
        }
    });
    let steady = Backend::named("steady");
    let config = format!(
        "[groups.g]\nbackends = [\"{}\", \"{}\"]\nhealth_path = \"/health\"\nhealth_interval_ms = 50\nhealth_rise = 2\nhealth_fall = 2\n",
        flaky.addr(),
        steady.addr()
    );
    let (mut p, addr, _) = with_config(driver, &config, &["--workers", "2"]);
    let answers =
        |n| -> Vec<String> { (0..n).map(|_| once(addr, &get("t", "/")).text()).collect() };
    assert!(answers(6).contains(&"flaky".to_string()));
    sick.store(true, SeqCst);
    assert!(p.wait_for_line("is down", Duration::from_secs(5)), "{:?}", p.seen);
    assert!(answers(8).iter().all(|a| a == "steady"));
    sick.store(false, SeqCst);
    assert!(p.wait_for_line("is up", Duration::from_secs(5)), "{:?}", p.seen);
    assert!(wait_until(Duration::from_secs(2), || answers(4).contains(&"flaky".to_string())));
    assert!(flaky.seen().iter().any(|s| s.header("user-agent") == Some("hotloop-health-check")));
}

/// A client that does not read holds the backend's upload back (nothing
/// near the whole body is buffered), then gets all of it; trailers pass
/// both ways.
#[hotloop::test(driver = "all")]
fn slow_clients_hold_the_backend_back_and_trailers_pass(driver: DriverKind) {
    const BIG: usize = 64 << 20;
    let written = Arc::new(AtomicUsize::new(0));
    let w2 = written.clone();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let big_addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let _ = read_request(&mut r);
        let mut s = s;
        s.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {BIG}\r\n\r\n").as_bytes())
            .unwrap();
        let piece = vec![b'x'; 64 << 10];
        for _ in 0..BIG / piece.len() {
            if s.write_all(&piece).is_err() {
                return;
            }
            w2.fetch_add(piece.len(), SeqCst);
        }
    });
    let trailing = Backend::start(|s| Reply {
        headers: vec![("Trailer".into(), "x-sum".into())],
        trailers: Some(vec![("x-sum".into(), format!("{}", s.body.len()))]),
        ..Reply::ok("with trailers")
    });
    let config = format!(
        "[groups.big]\nbackends = [\"{big_addr}\"]\n[groups.t]\nbackends = [\"{}\"]\n[[routes]]\nhost = \"big\"\ngroup = \"big\"\n[[routes]]\ngroup = \"t\"\n",
        trailing.addr()
    );
    let (_p, addr, _) = with_config(driver, &config, &["--workers", "1"]);
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: big\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let held = written.load(SeqCst);
    assert!(
        held < BIG * 3 / 4,
        "the backend wrote {held} of {BIG} bytes to a client that read nothing"
    );
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut r = BufReader::new(s);
    let resp = read_resp(&mut r).unwrap();
    assert_eq!(resp.body.len(), BIG);
    // Trailers (declared in `Trailer`, as HTTP/1.1 senders do): the
    // client's reach the backend, the backend's reach a client that said
    // `TE: trailers`.
    let mut cl = Client::connect(addr);
    let r = cl
        .send(b"POST / HTTP/1.1\r\nHost: t\r\nTE: trailers\r\nTrailer: x-client\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nx-client: yes\r\n\r\n")
        .unwrap();
    assert_eq!(r.text(), "with trailers");
    assert_eq!(r.trailers, vec![("x-sum".to_string(), "3".to_string())]);
    let seen = &trailing.seen()[0];
    assert_eq!(seen.body, b"abc");
    assert_eq!(seen.trailers, vec![("x-client".to_string(), "yes".to_string())]);
}

/// `Upgrade` (here a made-up protocol, as WebSocket would be): the 101 is
/// passed on, then bytes flow both ways until the client ends.
#[hotloop::test(driver = "all")]
fn upgrades_are_tunnelled(driver: DriverKind) {
    let a = Backend::start(|s| Reply {
        echo_upgrade: s.header("upgrade").is_some(),
        ..Reply::ok("plain")
    });
    let (_p, addr, st) = start(driver, &["--backend", &a.addr(), "--workers", "1"]);
    let mut cl = Client::connect(addr);
    let r = cl
        .send(b"GET /ws HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
        .unwrap();
    assert_eq!(r.status, 101, "{r:?}");
    assert_eq!(r.header("upgrade"), Some("echo"));
    let seen = &a.seen()[0];
    assert_eq!(seen.header("upgrade"), Some("echo"));
    assert!(seen.header("connection").is_some_and(|c| c.eq_ignore_ascii_case("upgrade")));
    let mut first = vec![0u8; "hello from the backend;".len()];
    cl.r.read_exact(&mut first).unwrap();
    assert_eq!(first, b"hello from the backend;");
    for msg in [&b"one"[..], b"two three"] {
        cl.w.write_all(msg).unwrap();
        let mut back = vec![0u8; msg.len()];
        cl.r.read_exact(&mut back).unwrap();
        assert_eq!(back, msg);
    }
    cl.w.shutdown(Shutdown::Write).unwrap();
    assert!(cl.closed(), "the tunnel did not end with the client's end");
    assert_eq!(stat(st, "http_upgrades"), 1);
    // The proxy serves on: plain requests on a new connection.
    assert_eq!(once(addr, &get("t", "/")).text(), "plain");
}

/// HTTP/2 clients (prior knowledge) through the proxy, to HTTP/1.1 and to
/// HTTP/2 backends; an HTTP/2 backend gets one connection per worker.
#[hotloop::test(driver = "all")]
fn http2_clients_and_http2_backends(driver: DriverKind) {
    let drv = common::driver_arg(driver);
    let mut h2_backend = Proc::start(&[
        "serve",
        "hyper",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--driver",
        drv,
        "--body-size",
        "5",
    ]);
    let h2_addr = h2_backend.addr_after(" on ");
    let h1 = Backend::named("h1");
    let config = format!(
        "[groups.h2]\nbackends = [\"{h2_addr}\"]\nprotocol = \"h2\"\n[groups.h1]\nbackends = [\"{}\"]\n[[routes]]\nhost = \"h2.test\"\ngroup = \"h2\"\n[[routes]]\ngroup = \"h1\"\n",
        h1.addr()
    );
    let (_p, addr, st) = with_config(driver, &config, &["--workers", "2"]);
    // HTTP/1.1 clients to the HTTP/2 backend.
    for _ in 0..6 {
        let r = once(addr, &get("h2.test", "/"));
        assert_eq!((r.status, r.body.len()), (200, 5), "{r:?}");
    }
    assert!(stat(st, "backend_h2_0_connects") <= 2);
    assert!(stat(st, "backend_h2_0_reused") >= 4);
    // HTTP/2 clients, several streams on one connection, to both groups.
    let rt = hotloop::Runtime::builder().workers(1).driver(driver).build().unwrap();
    let answers = rt.block_on(async move {
        use hyper::body::Body as _;
        let send = h2_client(addr).await;
        let mut out = Vec::new();
        for host in ["h2.test", "h1.test", "h2.test", "h1.test"] {
            let req = hyper::Request::get(format!("http://{host}/x")).body(String::new()).unwrap();
            let resp = send.clone().send_request(req).await.unwrap();
            let status = resp.status().as_u16();
            let mut body = resp.into_body();
            let mut bytes = Vec::new();
            while let Some(frame) =
                std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
            {
                if let Ok(data) = frame.unwrap().into_data() {
                    bytes.extend_from_slice(&data);
                }
            }
            out.push((status, bytes));
        }
        out
    });
    assert_eq!(answers[1], (200, b"h1".to_vec()));
    assert_eq!((answers[0].0, answers[0].1.len()), (200, 5));
    let seen = &h1.seen()[0];
    assert_eq!(seen.header("host"), Some("h1.test"), "an HTTP/2 request gets a Host for HTTP/1.1");
    assert_eq!(seen.header("via"), Some("2 hotloop"));
    // `:authority` picks the route, and a `host` field naming another host
    // does not reach the backend.
    let rt = hotloop::Runtime::builder().workers(1).driver(driver).build().unwrap();
    let status = rt.block_on(async move {
        let mut send = h2_client(addr).await;
        let req = hyper::Request::get("http://h1.test/other")
            .header("host", "admin.test")
            .body(String::new())
            .unwrap();
        send.send_request(req).await.unwrap().status().as_u16()
    });
    assert_eq!(status, 200);
    let last = h1.seen().last().cloned().unwrap();
    assert_eq!((last.path.as_str(), last.header("host")), ("/other", Some("h1.test")));
    h2_backend.signal("QUIT");
}

/// An HTTP/2 client connection (prior knowledge) to `addr`, its
/// connection driven by a task of its own.
async fn h2_client(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<String> {
    let tcp = hotloop::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::Builder::new(hotloop::hyper::HotloopExecutor)
        .timer(hotloop::hyper::HotloopTimer)
        .handshake::<_, String>(hotloop::hyper::HyperIo::new(tcp))
        .await
        .unwrap();
    drop(hotloop::spawn(conn));
    send
}

/// Over TLS, ALPN offers h2 and http/1.1; HTTP/1.1 is served and
/// `Forwarded` says `proto=https`.
#[hotloop::test(driver = "all")]
fn tls_clients_negotiate_alpn(driver: DriverKind) {
    let a = Backend::named("a");
    let cert = common::certificate();
    let (c, k) = (cert.path.to_str().unwrap(), cert.key.to_str().unwrap());
    let (_p, addr, _) =
        start(driver, &["--backend", &a.addr(), "--workers", "1", "--tls-cert", c, "--tls-key", k]);
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let h2 = common::tls_client_over(tcp, &cert.path, &[b"h2", b"http/1.1"]);
    assert_eq!(h2.conn.alpn_protocol(), Some(&b"h2"[..]));
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = common::tls_client_over(tcp, &cert.path, &[b"http/1.1"]);
    tls.write_all(b"GET / HTTP/1.1\r\nHost: secure.test\r\nConnection: close\r\n\r\n").unwrap();
    let resp = read_resp(&mut BufReader::new(tls)).unwrap();
    assert_eq!(resp.text(), "a");
    assert_eq!(
        a.seen()[0].header("forwarded"),
        Some("for=127.0.0.1;host=\"secure.test\";proto=https")
    );
}

/// The server-mode deadlines hold for the proxy's clients (an unfinished
/// head is closed after the header timeout), and a stop drains: a request
/// in flight is answered, then the process exits.
#[hotloop::test(driver = "all")]
fn client_deadlines_and_the_drain_apply(driver: DriverKind) {
    let slow = Backend::start(|_| Reply { delay: Duration::from_millis(700), ..Reply::ok("late") });
    let (mut p, addr, _) =
        start(driver, &["--backend", &slow.addr(), "--workers", "1", "--header-timeout-ms", "300"]);
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n").unwrap();
    half.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t = Instant::now();
    let mut sink = Vec::new();
    let _ = half.read_to_end(&mut sink);
    assert!(t.elapsed() < Duration::from_secs(3), "an unfinished head held for {:?}", t.elapsed());
    let in_flight = std::thread::spawn(move || once(addr, &get("t", "/")));
    assert!(wait_until(Duration::from_secs(5), || !slow.seen().is_empty()));
    p.signal("TERM");
    let r = in_flight.join().unwrap();
    assert_eq!(r.text(), "late");
    assert!(
        p.wait_exit(Duration::from_secs(5)).is_some_and(|s| s.success()),
        "{:?}",
        p.collect_lines(Duration::ZERO)
    );
}

/// A bad file is refused at start with its line and the reason.
#[test]
fn a_bad_config_file_is_refused_with_its_line() {
    let (_dir, path) = config_file("[groups.g]\nbackends = [\"127.0.0.1:1\"]\nretries = \"two\"\n");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hotloop"))
        .args([
            "proxy",
            "--mode",
            "http",
            "--listen",
            "127.0.0.1:0",
            "--config",
            path.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:3: groups.g.retries", path.display())), "{err}");
}

/// A backend of raw bytes: `on_conn` runs on its own thread for each
/// connection accepted.
fn raw_backend(on_conn: impl Fn(TcpStream) + Send + Sync + 'static) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let on_conn = Arc::new(on_conn);
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(conn) = conn else { return };
            let f = on_conn.clone();
            std::thread::spawn(move || f(conn));
        }
    });
    addr
}

/// Reads a request's head off `r` (its lines up to the empty one).
fn read_head(r: &mut impl BufRead) -> Option<String> {
    let mut head = String::new();
    loop {
        let line = read_line(r)?;
        if line.is_empty() {
            return Some(head);
        }
        head += &line;
        head += "\n";
    }
}

/// A backend that answers an upload before reading its body (an early
/// `401`) keeps that connection busy until the upload ends: the
/// connection is not pooled, and the next request gets another one
/// instead of waiting behind the upload.
#[hotloop::test(driver = "all")]
fn a_connection_still_taking_an_upload_is_not_pooled(driver: DriverKind) {
    let backend = raw_backend(|conn| {
        let mut w = conn.try_clone().unwrap();
        let mut r = BufReader::new(conn);
        while let Some(head) = read_head(&mut r) {
            if head.starts_with("POST") {
                // Answered at once; the body is never read.
                let _ = w.write_all(b"HTTP/1.1 401 X\r\nContent-Length: 1\r\n\r\nx");
                std::thread::sleep(Duration::from_secs(30));
                return;
            }
            let _ = w.write_all(b"HTTP/1.1 200 X\r\nContent-Length: 2\r\n\r\nok");
        }
    });
    let (_p, addr, st) = start(driver, &["--backend", &backend.to_string(), "--workers", "1"]);
    let mut uploader = Client::connect(addr);
    let early = uploader
        .send(b"POST /up HTTP/1.1\r\nHost: t\r\nContent-Length: 10000000\r\n\r\n0123456789")
        .unwrap();
    assert_eq!((early.status, early.text().as_str()), (401, "x"));
    // The upload goes on (the client still holds its connection); another
    // client's request is answered at once on a connection of its own.
    let mut other = Client::connect(addr);
    other.r.get_ref().set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let t = Instant::now();
    let r = other.send(&get("t", "/")).expect("answered while the upload goes on");
    assert_eq!((r.status, r.text().as_str()), (200, "ok"), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "waited {:?}", t.elapsed());
    assert_eq!(stat(st, "backend_default_0_connects"), 2, "the busy one was not reused");
    drop(uploader);
}

/// The header timeout counts from the request body's end: a client that
/// uploads slowly gets its answer, and nothing is held against the
/// backend. A client that stops sending its body gets `408` after the
/// body timeout (not the backend's fault); a backend that stops taking it
/// gets `504` and the failure.
#[hotloop::test(driver = "all")]
fn a_slow_upload_is_timed_by_its_pauses_and_blamed_on_the_side_that_paused(driver: DriverKind) {
    let reader = Backend::start(|s| Reply::ok(&format!("got {}", s.body.len())));
    let deaf = raw_backend(|conn| {
        let mut r = BufReader::new(conn);
        let _ = read_head(&mut r);
        // Never reads the body, never answers.
        std::thread::sleep(Duration::from_secs(30));
    });
    let config = format!(
        "[groups.r]\nbackends = [\"{}\"]\nheader_timeout_ms = 300\nbody_timeout_ms = 600\nmax_fails = 1\n\
         [groups.d]\nbackends = [\"{deaf}\"]\nheader_timeout_ms = 300\nbody_timeout_ms = 600\nmax_fails = 0\n\
         [[routes]]\nhost = \"deaf.test\"\ngroup = \"d\"\n[[routes]]\ngroup = \"r\"\n",
        reader.addr()
    );
    let (_p, addr, st) = with_config(driver, &config, &["--workers", "1"]);
    // Ten bytes, one every 150 ms: 1.5 s, five header timeouts.
    let mut cl = Client::connect(addr);
    cl.w.write_all(b"POST /slow HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n").unwrap();
    for b in b"0123456789" {
        std::thread::sleep(Duration::from_millis(150));
        cl.w.write_all(&[*b]).unwrap();
    }
    let r = read_resp(&mut cl.r).expect("an answer");
    assert_eq!((r.status, r.text().as_str()), (200, "got 10"), "{r:?}");
    assert_eq!(stat(st, "backend_r_0_errors"), 0);
    // A client that stops halfway: 408 after the body timeout, and the
    // backend stays in (max_fails 1 would have taken it out).
    let mut stalled = Client::connect(addr);
    let t = Instant::now();
    let r = stalled
        .send(b"POST /half HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n01234")
        .expect("an answer");
    assert_eq!(r.status, 408, "{r:?}");
    assert!(t.elapsed() >= Duration::from_millis(500), "{:?}", t.elapsed());
    assert_eq!(stat(st, "backend_r_0_errors"), 0);
    assert_eq!(once(addr, &get("t", "/")).status, 200, "the backend still takes requests");
    // A backend that takes none of a large body: 504, its failure.
    let deaf_client = TcpStream::connect(addr).unwrap();
    deaf_client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    deaf_client.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut w = deaf_client.try_clone().unwrap();
    let upload = std::thread::spawn(move || {
        let len = 64 << 20;
        let head =
            format!("POST /big HTTP/1.1\r\nHost: deaf.test\r\nContent-Length: {len}\r\n\r\n");
        w.write_all(head.as_bytes()).unwrap();
        let chunk = vec![b'x'; 1 << 16];
        for _ in 0..(len >> 16) {
            if w.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let r = read_resp(&mut BufReader::new(deaf_client)).expect("an answer");
    assert_eq!(r.status, 504, "{r:?}");
    assert!(r.text().contains("took none of the body"), "{r:?}");
    assert_eq!(stat(st, "backend_d_0_errors"), 1);
    let _ = upload.join();
}

/// An answer with both `Transfer-Encoding: chunked` and `Content-Length`
/// is read by its chunks, and the client's copy carries no stale length.
#[hotloop::test(driver = "all")]
fn an_answer_framed_two_ways_reaches_the_client_by_its_chunks(driver: DriverKind) {
    let accepts = Arc::new(AtomicUsize::new(0));
    let a = accepts.clone();
    let backend = raw_backend(move |conn| {
        a.fetch_add(1, SeqCst);
        let mut w = conn.try_clone().unwrap();
        let mut r = BufReader::new(conn);
        while read_head(&mut r).is_some() {
            let _ = w.write_all(
                b"HTTP/1.1 200 X\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            );
        }
    });
    let (_p, addr, _st) = start(driver, &["--backend", &backend.to_string(), "--workers", "1"]);
    let mut cl = Client::connect(addr);
    for _ in 0..2 {
        let r = cl.send(&get("t", "/")).expect("an answer");
        assert_eq!((r.status, r.text().as_str()), (200, "hello"), "{r:?}");
        assert_ne!(r.header("content-length"), Some("3"), "{r:?}");
    }
    // Such an answer is an error to handle as one (RFC 9112 section 6.3):
    // its connection is not kept.
    assert_eq!(accepts.load(SeqCst), 2, "a connection framed two ways was pooled");
}

/// A request body of no known length on a `GET` (chunked) reaches the
/// backend: the proxy sends it chunked, where hyper's client would frame
/// a `GET` without a length as bodiless and never read the body. The
/// body read to its end, the connection is pooled.
#[hotloop::test(driver = "all")]
fn a_chunked_get_body_reaches_the_backend(driver: DriverKind) {
    let a = Backend::start(|s| Reply::ok(&format!("got {}", s.body.len())));
    let (_p, addr, st) = start(driver, &["--backend", &a.addr(), "--workers", "1"]);
    let mut cl = Client::connect(addr);
    for i in 0..2 {
        let r = cl
            .send(b"GET /q HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
            .unwrap_or_else(|| panic!("{i}: no answer"));
        assert_eq!((r.status, r.text().as_str()), (200, "got 5"), "{i}: {r:?}");
    }
    let seen = a.seen();
    assert!(seen.iter().all(|s| s.body == b"hello"), "{seen:?}");
    assert_eq!(a.accepts.load(SeqCst), 1, "the first connection was not pooled");
    assert_eq!(stat(st, "backend_default_0_reused"), 1);
}

/// A pooled connection the backend closes as the request goes out (its
/// keep-alive timeout, reached just then) costs one try on a new
/// connection: the client gets its answer and nothing is held against
/// the backend.
#[hotloop::test(driver = "all")]
fn a_pooled_connection_closed_as_the_request_goes_out_costs_one_try(driver: DriverKind) {
    // Each connection: one answer kept alive, then the next request read
    // and the connection closed without an answer.
    let backend = raw_backend(|conn| {
        let mut w = conn.try_clone().unwrap();
        let mut r = BufReader::new(conn);
        if read_head(&mut r).is_some() {
            let _ = w.write_all(b"HTTP/1.1 200 X\r\nContent-Length: 2\r\n\r\nok");
        }
        let _ = read_head(&mut r);
        let _ = w.shutdown(Shutdown::Both);
    });
    let (_p, addr, st) = start(driver, &["--backend", &backend.to_string(), "--workers", "1"]);
    for i in 0..2 {
        let r = once(addr, &get("t", "/"));
        assert_eq!((r.status, r.text().as_str()), (200, "ok"), "{i}: {r:?}");
    }
    assert_eq!(stat(st, "backend_default_0_errors"), 0);
    assert_eq!(stat(st, "backend_default_0_connects"), 2);
    assert_eq!(stat(st, "http_502"), 0);
}

/// Answers and uploads with trailers end at their trailers: the backend
/// connection is pooled and reused, and the latency recorded (hyper polls
/// no body after its trailers, and a chunked body never says it ended).
#[hotloop::test(driver = "all")]
fn answers_and_uploads_with_trailers_end_and_their_connection_is_reused(driver: DriverKind) {
    let trailing = Backend::start(|s| Reply {
        headers: vec![("Trailer".into(), "x-sum".into())],
        trailers: Some(vec![("x-sum".into(), format!("{}", s.body.len()))]),
        ..Reply::ok("with trailers")
    });
    let plain = Backend::start(|s| Reply::ok(&format!("got {}", s.body.len())));
    let config = format!(
        "[groups.t]\nbackends = [\"{}\"]\n[groups.p]\nbackends = [\"{}\"]\n[[routes]]\nhost = \"p\"\ngroup = \"p\"\n[[routes]]\ngroup = \"t\"\n",
        trailing.addr(),
        plain.addr()
    );
    let (_p, addr, st) = with_config(driver, &config, &["--workers", "1"]);
    let mut cl = Client::connect(addr);
    for i in 0..2 {
        let r = cl
            .send(b"POST / HTTP/1.1\r\nHost: p\r\nTrailer: x-client\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nx-client: yes\r\n\r\n")
            .unwrap();
        assert_eq!(r.text(), "got 3", "{i}");
    }
    assert_eq!(plain.accepts.load(SeqCst), 1, "an upload with trailers kept its connection busy");
    assert_eq!(stat(st, "backend_p_0_reused"), 1);
    for i in 0..2 {
        let r = cl.send(b"GET / HTTP/1.1\r\nHost: t\r\nTE: trailers\r\n\r\n").unwrap();
        assert_eq!(r.text(), "with trailers", "{i}");
        assert_eq!(r.trailers, vec![("x-sum".to_string(), "0".to_string())], "{i}");
    }
    assert_eq!(trailing.accepts.load(SeqCst), 1, "an answer with trailers closed its connection");
    assert_eq!(stat(st, "backend_t_0_reused"), 1);
    assert!(stat(st, "backend_t_0_latency_p50_us") > 0, "no latency recorded");
}

/// An HTTP/1.0 request without `Host` reaches an HTTP/1.1 backend with
/// the backend's address as `Host` (HTTP/1.1 requires one: a compliant
/// backend answers 400 without).
#[hotloop::test(driver = "all")]
fn a_request_without_host_gets_the_backends_address(driver: DriverKind) {
    let a = Backend::start(|s| {
        if s.header("host").is_none() {
            Reply::ok("no host").status(400)
        } else {
            Reply::ok("a")
        }
    });
    let (_p, addr, _) = start(driver, &["--backend", &a.addr(), "--workers", "1"]);
    let r = once(addr, b"GET / HTTP/1.0\r\n\r\n");
    assert_eq!((r.status, r.text().as_str()), (200, "a"), "{r:?}");
    assert_eq!(a.seen()[0].header("host"), Some(a.addr().as_str()));
}

// ------------------------------------------------- raw HTTP/2 for cancels

/// A client connection speaking HTTP/2 frame by frame, so that a request
/// and its cancel (`RST_STREAM`) reach the proxy in one segment.
struct RawH2 {
    s: TcpStream,
    next_stream: u32,
}

impl RawH2 {
    fn connect(addr: SocketAddr) -> RawH2 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        // The preface and empty SETTINGS.
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        out.extend_from_slice(&h2_frame(4, 0, 0, &[]));
        s.write_all(&out).unwrap();
        RawH2 { s, next_stream: 1 }
    }

    /// `HEADERS` of a `GET /` to host `t` on a new stream, ending it.
    fn request(&mut self) -> (u32, Vec<u8>) {
        let id = self.next_stream;
        self.next_stream += 2;
        // :method GET, :scheme http, :path / (static table), then
        // :authority t as a literal without indexing.
        let block = [0x82, 0x86, 0x84, 0x01, 0x01, b't'];
        (id, h2_frame(1, 0x4 | 0x1, id, &block))
    }

    /// A request read to the end of its answer: the answer's body.
    fn get(&mut self) -> Vec<u8> {
        let (id, frame) = self.request();
        self.s.write_all(&frame).unwrap();
        let mut body = Vec::new();
        loop {
            let mut head = [0u8; 9];
            self.s.read_exact(&mut head).unwrap();
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let (kind, flags) = (head[3], head[4]);
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let mut payload = vec![0u8; len];
            self.s.read_exact(&mut payload).unwrap();
            if kind == 4 && flags & 1 == 0 {
                self.s.write_all(&h2_frame(4, 1, 0, &[])).unwrap();
            }
            assert!(kind != 3 || stream != id, "the request was reset");
            if kind == 0 && stream == id {
                body.extend_from_slice(&payload);
            }
            if (kind == 0 || kind == 1) && stream == id && flags & 1 == 1 {
                return body;
            }
        }
    }

    /// A request and its cancel, written at once.
    fn cancelled(&mut self) {
        let (id, mut out) = self.request();
        out.extend_from_slice(&h2_frame(3, 0, id, &8u32.to_be_bytes()));
        self.s.write_all(&out).unwrap();
    }
}

pub(crate) fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A request whose client cancels it while its worker borrows a
/// connection from another worker's pool (the borrowing future dropped
/// after the lender took the connection out): the connection is not lost
/// on the way. It joins the borrower's pool, so `lent` and `borrowed`
/// agree, the backend keeps its one connection open, the gauges say so,
/// and requests are still answered over it.
#[hotloop::test(driver = "all")]
fn a_borrow_cancelled_by_its_client_keeps_the_connection(driver: DriverKind) {
    let a = Backend::named("a");
    let config = format!("[groups.g]\nbackends = [\"{}\"]\npool_borrow_ms = 5000\n", a.addr());
    let (_p, addr, st) = with_config(driver, &config, &["--workers", "2", "--balance", "count"]);
    // The HTTP/2 client's worker holds the one connection, idle.
    let mut h2 = RawH2::connect(addr);
    assert_eq!(h2.get(), b"a");
    let n = |name: &str| stat(st, &format!("backend_g_0_{name}"));
    for round in 0..20 {
        // An HTTP/1.1 client on the other worker (with only the HTTP/2
        // client connected, it holds fewer connections) borrows it, and
        // leaves it in that worker's pool.
        assert!(wait_until(Duration::from_secs(5), || stat(st, "active_connections") == 1));
        let borrowed = n("borrowed");
        assert_eq!(once(addr, &get("t", "/")).text(), "a");
        assert_eq!(n("borrowed"), borrowed + 1, "round {round}: not on the other worker");
        assert!(wait_until(Duration::from_secs(5), || n("pool_idle") == 1), "round {round}");
        // A request on the first worker asks for it back, and is
        // cancelled before it comes.
        h2.cancelled();
        let moves = 2 * (round + 1);
        let arrived = wait_until(Duration::from_secs(5), || {
            (n("lent"), n("borrowed"), n("pool_idle")) == (moves, moves, 1)
        });
        assert!(
            arrived,
            "round {round}: {} lent, {} borrowed, {} idle; the backend closed {} of {} connections",
            n("lent"),
            n("borrowed"),
            n("pool_idle"),
            a.closed.load(SeqCst),
            a.accepts.load(SeqCst)
        );
    }
    assert_eq!(h2.get(), b"a");
    assert_eq!((a.accepts.load(SeqCst), a.closed.load(SeqCst)), (1, 0));
    assert_eq!((n("lent"), n("borrowed")), (40, 40));
    assert_eq!((n("open"), n("pool_idle"), n("connects")), (1, 1, 1));
}

// ------------------------------------- a client that never opens its window

/// An HTTP/2 client that gives the proxy `window` bytes of flow-control
/// window per stream (`INITIAL_WINDOW_SIZE`, no `WINDOW_UPDATE`) and opens
/// `streams` streams, with a PING every 200 ms. Returns how long each
/// stream took to be reset (`None`: not within 10 s), and whether
/// `settled` came true within 3 s after that, the connection still open
/// and pinging.
pub(crate) fn windowless_h2_client(
    addr: SocketAddr,
    window: u32,
    streams: u32,
    settled: impl FnMut() -> bool,
) -> (Vec<Option<Duration>>, bool) {
    let mut r = TcpStream::connect(addr).unwrap();
    r.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let w = Arc::new(Mutex::new(r.try_clone().unwrap()));
    // The preface, SETTINGS with SETTINGS_INITIAL_WINDOW_SIZE (4) of
    // `window`, then the requests.
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    let mut settings = vec![0, 4];
    settings.extend_from_slice(&window.to_be_bytes());
    out.extend_from_slice(&h2_frame(4, 0, 0, &settings));
    let mut raw = RawH2 { s: r.try_clone().unwrap(), next_stream: 1 };
    for _ in 0..streams {
        out.extend_from_slice(&raw.request().1);
    }
    w.lock().unwrap().write_all(&out).unwrap();
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let pinger = {
        let (w, stop) = (w.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(SeqCst) {
                std::thread::sleep(Duration::from_millis(200));
                let _ = w.lock().unwrap().write_all(&h2_frame(6, 0, 0, &[7; 8]));
            }
        })
    };
    let mut reset = vec![None; streams as usize];
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while start.elapsed() < Duration::from_secs(10) && reset.iter().any(Option::is_none) {
        match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => break,
        }
        while buf.len() >= 9 {
            let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
            if buf.len() < 9 + len {
                break;
            }
            let (kind, flags) = (buf[3], buf[4]);
            let stream = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
            if kind == 4 && flags & 1 == 0 {
                let _ = w.lock().unwrap().write_all(&h2_frame(4, 1, 0, &[]));
            }
            if kind == 3 && stream % 2 == 1 {
                reset[(stream / 2) as usize].get_or_insert(start.elapsed());
            }
            buf.drain(..9 + len);
        }
    }
    let settled = wait_until(Duration::from_secs(3), settled);
    stop.store(true, SeqCst);
    pinger.join().unwrap();
    (reset, settled)
}

/// A client that gives no flow-control window holds no backend connection
/// for long: each stream whose answer has waited for window for the send
/// timeout is reset, and its backend connection closed (the PINGs keep
/// the connection from being idle, and no write waits on the socket).
#[hotloop::test(driver = "all")]
fn a_stream_the_client_gives_no_window_is_reset_at_the_send_timeout(driver: DriverKind) {
    let big = "x".repeat(1 << 20);
    let a = Backend::start(move |_| Reply::ok(&big));
    let config = format!("[groups.g]\nbackends = [\"{}\"]\n", a.addr());
    let (_p, addr, st) =
        with_config(driver, &config, &["--workers", "1", "--send-timeout-ms", "500"]);
    let (reset, closed) = windowless_h2_client(addr, 0, 4, || stat(st, "backend_g_0_open") == 0);
    let open = stat(st, "backend_g_0_open");
    for (i, took) in reset.iter().enumerate() {
        let took = took.unwrap_or_else(|| {
            panic!("stream {} not reset; {open} backend connections open", 2 * i + 1)
        });
        assert!(took < Duration::from_secs(4), "stream {} reset after {took:?}", 2 * i + 1);
    }
    assert!(closed, "{open} backend connections still open");
    assert_eq!(a.seen().len(), 4);
}

/// The client idle timeout does not run while the backend owes the
/// answer: a group's header timeout above it takes effect, over HTTP/1.1
/// and HTTP/2; a kept-alive HTTP/1.1 connection idle after its answer
/// still closes at the idle timeout.
#[hotloop::test(driver = "all")]
fn the_idle_timeout_waits_while_the_backend_owes_the_answer(driver: DriverKind) {
    let slow =
        Backend::start(|_| Reply { delay: Duration::from_millis(2500), ..Reply::ok("late") });
    let config =
        format!("[groups.g]\nbackends = [\"{}\"]\nheader_timeout_ms = 5000\n", slow.addr());
    let (_p, addr, _) =
        with_config(driver, &config, &["--workers", "1", "--idle-timeout-ms", "1000"]);
    let h2 = std::thread::spawn(move || RawH2::connect(addr).get());
    let mut c = Client::connect(addr);
    let r = c.send(&get("t", "/")).expect("an answer, not a cut");
    assert_eq!((r.status, r.text().as_str()), (200, "late"));
    let idle = Instant::now();
    assert!(c.closed(), "the idle connection was not closed");
    let waited = idle.elapsed();
    assert!(waited > Duration::from_millis(700) && waited < Duration::from_secs(4), "{waited:?}");
    assert_eq!(h2.join().unwrap(), b"late");
}

/// A client that gives one byte of flow-control window per stream: hyper
/// took the backend's whole answer (one chunk) as soon as that byte was
/// there and ended the stream's task, and h2 held the rest with no
/// deadline, for good. The answer's last byte is now held back until the
/// rest is sent, so the stream waits for window as any other, and is
/// reset at the send timeout.
#[hotloop::test(driver = "all")]
fn a_stream_the_client_gives_one_byte_of_window_is_reset_at_the_send_timeout(driver: DriverKind) {
    // Small enough to come in one chunk.
    let body = "x".repeat(1000);
    let a = Backend::start(move |_| Reply::ok(&body));
    let config = format!("[groups.g]\nbackends = [\"{}\"]\n", a.addr());
    let (_p, addr, _) =
        with_config(driver, &config, &["--workers", "1", "--send-timeout-ms", "500"]);
    let (reset, _) = windowless_h2_client(addr, 1, 4, || true);
    for (i, took) in reset.iter().enumerate() {
        let took = took.unwrap_or_else(|| panic!("stream {} not reset", 2 * i + 1));
        assert!(took < Duration::from_secs(4), "stream {} reset after {took:?}", 2 * i + 1);
    }
    assert_eq!(a.seen().len(), 4);
}

/// Reads what comes within `wait`: the types of the whole frames read (taken
/// out of `buf`), and whether the connection ended.
fn h2_frames_within(s: &mut TcpStream, buf: &mut Vec<u8>, wait: Duration) -> (Vec<u8>, bool) {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut chunk = [0u8; 16 * 1024];
    let ended = match s.read(&mut chunk) {
        Ok(0) => true,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            false
        }
        Err(e) => {
            !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
        }
    };
    let mut types = Vec::new();
    while buf.len() >= 9 {
        let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
        if buf.len() < 9 + len {
            break;
        }
        types.push(buf[3]);
        buf.drain(..9 + len);
    }
    (types, ended)
}

/// An HTTP/2 upload that stalls after its first bytes while the client
/// sends a PING every 200 ms: the PINGs are no progress, so the idle
/// timeout ends the connection (GOAWAY, then the cut), and the backend
/// connection busy with the upload closes. Before, every byte read moved
/// the idle clock, and the PINGs held both for good.
#[hotloop::test(driver = "all")]
fn a_stalled_upload_kept_up_by_pings_ends_at_the_idle_timeout(driver: DriverKind) {
    let a = Backend::named("a");
    let config = format!("[groups.g]\nbackends = [\"{}\"]\n", a.addr());
    let (_p, addr, st) =
        with_config(driver, &config, &["--workers", "1", "--idle-timeout-ms", "500"]);
    let mut s = TcpStream::connect(addr).unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&h2_frame(4, 0, 0, &[]));
    // POST / to host t (END_HEADERS, no END_STREAM), then ten bytes of body.
    out.extend_from_slice(&h2_frame(1, 0x4, 1, &[0x83, 0x86, 0x84, 0x01, 0x01, b't']));
    out.extend_from_slice(&h2_frame(0, 0, 1, b"0123456789"));
    s.write_all(&out).unwrap();
    assert!(
        wait_until(Duration::from_secs(3), || stat(st, "backend_g_0_open") == 1),
        "the upload never reached the backend"
    );
    let started = Instant::now();
    let (mut buf, mut goaway) = (Vec::new(), false);
    let ended = loop {
        if started.elapsed() > Duration::from_secs(6) {
            break false;
        }
        let _ = s.write_all(&h2_frame(6, 0, 0, &[7; 8]));
        let (types, ended) = h2_frames_within(&mut s, &mut buf, Duration::from_millis(200));
        goaway |= types.contains(&7);
        if ended {
            break true;
        }
    };
    let took = started.elapsed();
    assert!(ended && goaway, "after {took:?}: ended {ended}, GOAWAY {goaway}");
    assert!(took < Duration::from_secs(4), "ended after {took:?}");
    assert!(
        wait_until(Duration::from_secs(3), || stat(st, "backend_g_0_open") == 0),
        "the backend connection busy with the upload is still open"
    );
}

/// HTTP/2 rapid reset after accept: a client opens 100 streams, waits for
/// the proxy to take them to the backend, resets them and opens 100 more,
/// again and again, ignoring the GOAWAY. It is sent a GOAWAY and cut after
/// a few hundred streams, and the backend saw about as many connections.
/// Before, only streams reset before hyper accepted them were bounded (by
/// h2), and each stream cost the backend a connection without end.
#[hotloop::test(driver = "all")]
fn a_client_that_resets_every_stream_costs_the_backend_little(driver: DriverKind) {
    let a = Backend::start(|_| Reply { delay: Duration::from_secs(3), ..Reply::ok("late") });
    let config = format!("[groups.g]\nbackends = [\"{}\"]\n", a.addr());
    let (_p, addr, _) = with_config(driver, &config, &["--workers", "1"]);
    let mut raw = RawH2::connect(addr);
    let (mut buf, mut goaway_at, mut ended) = (Vec::new(), None, false);
    let mut opened = Vec::new();
    let started = Instant::now();
    while raw.next_stream < 2 * 2000 && !ended && started.elapsed() < Duration::from_secs(30) {
        let mut out = Vec::new();
        for id in opened.drain(..) {
            out.extend_from_slice(&h2_frame(3, 0, id, &8u32.to_be_bytes()));
        }
        for _ in 0..100 {
            let (id, frame) = raw.request();
            out.extend_from_slice(&frame);
            opened.push(id);
        }
        if raw.s.write_all(&out).is_err() {
            break;
        }
        // Long enough for the proxy to accept them (h2 bounds streams reset
        // before that itself).
        let until = Instant::now() + Duration::from_millis(50);
        while Instant::now() < until && !ended {
            let (types, end) = h2_frames_within(&mut raw.s, &mut buf, Duration::from_millis(10));
            if types.contains(&7) && goaway_at.is_none() {
                goaway_at = Some(raw.next_stream / 2);
            }
            ended = end;
        }
    }
    let sent = raw.next_stream / 2;
    let accepts = a.accepts.load(SeqCst);
    let goaway_at =
        goaway_at.unwrap_or_else(|| panic!("no GOAWAY after {sent} streams ({accepts} accepted)"));
    assert!(goaway_at < 1000, "GOAWAY after {goaway_at} streams");
    assert!(accepts < 700, "the backend accepted {accepts} connections for {sent} streams");
}
