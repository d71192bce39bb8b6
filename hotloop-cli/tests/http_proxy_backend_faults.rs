//! `hotloop proxy --mode http` against backends that are full, refuse,
//! or answer what was not asked, and with the proxy itself out of
//! descriptors or stopping: none of it is held against a healthy backend,
//! and no client gets a broken answer. Both drivers.

use crate::common;
use crate::http_proxy::{get, h2_frame, once, start, stat, with_config, Backend, Client, Reply};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use common::{wait_until, Proc};
use hotloop::DriverKind;

/// What a raw HTTP/2 backend does with a request's stream.
#[derive(Debug, Clone, Copy, PartialEq)]
enum H2Act {
    /// `200` with the body `ok`.
    Answer,
    /// Nothing, for as long as the connection lasts.
    Hold,
    /// `RST_STREAM` with `REFUSED_STREAM`.
    Refuse,
    /// `GOAWAY` whose last stream is the one before.
    GoAway,
}

/// An HTTP/2 backend (prior knowledge) written frame by frame.
struct RawH2Backend {
    addr: SocketAddr,
    /// Connections accepted.
    connects: Arc<AtomicUsize>,
    /// Requests (streams) seen, over all connections.
    streams: Arc<AtomicUsize>,
}

/// A backend that announces `max_streams` concurrent streams, after
/// `settings_delay`, and does `act(connection, request)` with each request
/// (both counted from 0, the requests over all connections).
fn raw_h2_backend(
    max_streams: u32,
    settings_delay: Duration,
    act: impl Fn(usize, usize) -> H2Act + Send + Sync + 'static,
) -> RawH2Backend {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (connects, streams) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (c, n, act) = (connects.clone(), streams.clone(), Arc::new(act));
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(conn) = conn else { return };
            let index = c.fetch_add(1, SeqCst);
            let (n, act) = (n.clone(), act.clone());
            std::thread::spawn(move || {
                let _ = serve_h2(conn, max_streams, settings_delay, |s| act(index, s), &n);
            });
        }
    });
    RawH2Backend { addr, connects, streams }
}

fn serve_h2(
    mut s: TcpStream,
    max_streams: u32,
    settings_delay: Duration,
    act: impl Fn(usize) -> H2Act,
    streams: &AtomicUsize,
) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut preface = [0u8; 24];
    s.read_exact(&mut preface)?;
    std::thread::sleep(settings_delay);
    let mut settings = 3u16.to_be_bytes().to_vec();
    settings.extend_from_slice(&max_streams.to_be_bytes());
    s.write_all(&h2_frame(4, 0, 0, &settings))?;
    loop {
        let mut head = [0u8; 9];
        s.read_exact(&mut head)?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload)?;
        match kind {
            4 if flags & 1 == 0 => s.write_all(&h2_frame(4, 1, 0, &[]))?,
            6 if flags & 1 == 0 => s.write_all(&h2_frame(6, 1, 0, &payload))?,
            1 => match act(streams.fetch_add(1, SeqCst)) {
                H2Act::Answer => {
                    // `:status: 200` (static table entry 8), then the body.
                    let mut out = h2_frame(1, 0x4, id, &[0x88]);
                    out.extend_from_slice(&h2_frame(0, 0x1, id, b"ok"));
                    s.write_all(&out)?;
                }
                H2Act::Hold => {}
                H2Act::Refuse => s.write_all(&h2_frame(3, 0, id, &7u32.to_be_bytes()))?,
                H2Act::GoAway => {
                    let mut last = id.saturating_sub(2).to_be_bytes().to_vec();
                    last.extend_from_slice(&0u32.to_be_bytes());
                    s.write_all(&h2_frame(7, 0, 0, &last))?;
                }
            },
            _ => {}
        }
    }
}

fn h2_group(addr: SocketAddr, extra: &str) -> String {
    format!("[groups.g]\nbackends = [\"{addr}\"]\nprotocol = \"h2\"\n{extra}")
}

/// An HTTP/2 backend allowing 2 concurrent streams, with both held by
/// long requests: a third request gets a second connection and its `200`
/// at once, instead of waiting in h2's queue until the header timeout
/// answered `504` and counted the full backend as failed. Requests that
/// come while a worker's first connection is being opened wait for it
/// rather than each dialing its own.
#[hotloop::test(driver = "all")]
fn a_full_h2_backend_connection_gets_another_and_no_failure(driver: DriverKind) {
    // Eight requests at once on a cold worker share the one connection
    // being opened (the backend's preface comes 200 ms late).
    let b = raw_h2_backend(100, Duration::from_millis(200), |_, _| H2Act::Answer);
    let (_p, addr, st) = with_config(driver, &h2_group(b.addr, ""), &["--workers", "1"]);
    let go = Arc::new(Barrier::new(8));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let go = go.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                go.wait();
                c.send(&get("t", "/")).map(|r| (r.status, r.text()))
            })
        })
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap(), Some((200, "ok".to_string())));
    }
    assert_eq!(b.connects.load(SeqCst), 1, "{driver:?}: each request dialed its own");
    assert_eq!(stat(st, "backend_g_0_connects"), 1);

    // The first connection holds its streams; later ones answer.
    let b = raw_h2_backend(
        2,
        Duration::ZERO,
        |conn, _| {
            if conn == 0 {
                H2Act::Hold
            } else {
                H2Act::Answer
            }
        },
    );
    let config = h2_group(b.addr, "header_timeout_ms = 10000\n");
    let (_p, addr, st) = with_config(driver, &config, &["--workers", "1"]);
    let mut held = Vec::new();
    for _ in 0..2 {
        let c = Client::connect(addr);
        let mut w = c.w.try_clone().unwrap();
        w.write_all(&get("t", "/long")).unwrap();
        held.push(c);
    }
    assert!(wait_until(Duration::from_secs(5), || b.streams.load(SeqCst) == 2));
    let t = Instant::now();
    let r = once(addr, &get("t", "/"));
    assert_eq!((r.status, r.text().as_str()), (200, "ok"), "{driver:?}: {r:?}");
    assert!(t.elapsed() < Duration::from_secs(3), "{driver:?}: waited {:?}", t.elapsed());
    assert_eq!(stat(st, "backend_g_0_errors"), 0);
    assert_eq!(stat(st, "backend_g_0_ejections"), 0);
    assert_eq!(stat(st, "backend_g_0_connects"), 2);
    assert_eq!(b.connects.load(SeqCst), 2);
    drop(held);
}

/// An HTTP/2 backend refusing every other stream (`REFUSED_STREAM`, the
/// first included): a `GET` and a bodiless `POST` are each sent again on
/// a new connection and answered `200`, with no failure counted (RFC 9113
/// section 8.7: a refused stream was not processed, whatever its method).
/// The same for a stream above a `GOAWAY`'s last one.
#[hotloop::test(driver = "all")]
fn a_refused_h2_stream_is_sent_again_and_no_failure(driver: DriverKind) {
    let b =
        raw_h2_backend(
            100,
            Duration::ZERO,
            |_, n| {
                if n % 2 == 0 {
                    H2Act::Refuse
                } else {
                    H2Act::Answer
                }
            },
        );
    let (_p, addr, st) = with_config(driver, &h2_group(b.addr, ""), &["--workers", "1"]);
    let r = once(addr, &get("t", "/"));
    assert_eq!((r.status, r.text().as_str()), (200, "ok"), "{driver:?}: {r:?}");
    let post = b"POST /form HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n";
    let r = once(addr, post);
    assert_eq!((r.status, r.text().as_str()), (200, "ok"), "{driver:?}: {r:?}");
    assert_eq!(b.streams.load(SeqCst), 4);
    assert_eq!(stat(st, "backend_g_0_errors"), 0);
    assert_eq!(stat(st, "backend_g_0_ejections"), 0);

    // A `GOAWAY` that lets the request's stream through no more: sent
    // again on a new connection, and the old one leaves the pool.
    let b =
        raw_h2_backend(
            100,
            Duration::ZERO,
            |conn, _| {
                if conn == 0 {
                    H2Act::GoAway
                } else {
                    H2Act::Answer
                }
            },
        );
    let (_p, addr, st) = with_config(driver, &h2_group(b.addr, ""), &["--workers", "1"]);
    for _ in 0..2 {
        let r = once(addr, post);
        assert_eq!((r.status, r.text().as_str()), (200, "ok"), "{driver:?}: {r:?}");
    }
    assert_eq!(b.streams.load(SeqCst), 3, "{driver:?}: a stream went on the connection gone away");
    assert_eq!(stat(st, "backend_g_0_errors"), 0);
    assert_eq!(b.connects.load(SeqCst), 2);
}

/// `Upgrade: h2c` is never tunnelled (h2c smuggling would reach the
/// backend past the routes): `h2c` is taken out, and the request goes as
/// an ordinary one; another protocol asked beside it is still tunnelled.
#[hotloop::test(driver = "all")]
fn an_h2c_upgrade_is_forwarded_as_an_ordinary_request(driver: DriverKind) {
    // Switches to whatever is asked.
    let a = Backend::start(|s| Reply {
        echo_upgrade: s.header("upgrade").is_some(),
        ..Reply::ok("plain")
    });
    let (_p, addr, _) = start(driver, &["--backend", &a.addr(), "--workers", "1"]);
    let h2c = b"GET / HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n";
    let mut c = Client::connect(addr);
    let r = c.send(h2c).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "plain"), "{driver:?}: {r:?}");
    let seen = a.seen()[0].clone();
    assert_eq!(seen.header("upgrade"), None, "{driver:?}: {seen:?}");
    assert_eq!(seen.header("http2-settings"), None, "{driver:?}: {seen:?}");
    // The client's connection goes on as HTTP/1.1.
    assert_eq!(c.send(&get("t", "/")).unwrap().text(), "plain");
    let both = b"GET /ws HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: h2c, echo\r\n\r\n";
    let r = Client::connect(addr).send(both).unwrap();
    assert_eq!(r.status, 101, "{driver:?}: {r:?}");
    assert_eq!(a.seen().last().unwrap().header("upgrade"), Some("echo"));
}

/// A backend that answers `101` to a request that asked for no upgrade:
/// the client gets `502` and keeps its connection (a `101` passed on
/// would have ended it), and the backend's connection is not pooled.
#[hotloop::test(driver = "all")]
fn an_unasked_switch_of_protocols_is_a_502(driver: DriverKind) {
    let a = Backend::start(|_| Reply { echo_upgrade: true, ..Reply::ok("") });
    let (_p, addr, st) = start(driver, &["--backend", &a.addr(), "--workers", "1"]);
    let mut c = Client::connect(addr);
    for _ in 0..2 {
        let r = c.send(&get("t", "/")).unwrap();
        assert_eq!(r.status, 502, "{driver:?}: {r:?}");
        assert!(r.text().contains("switched protocols"), "{driver:?}: {r:?}");
    }
    assert_eq!(a.accepts.load(SeqCst), 2, "{driver:?}: a switched connection was reused");
    assert_eq!(stat(st, "backend_default_0_pool_idle"), 0);
}

/// A stop closes the idle pooled backend connections at once: the backend
/// need not wait for the drain's end (here 20 s, kept going by an idle
/// client connection) to see them go.
#[hotloop::test(driver = "all")]
fn a_stop_closes_the_idle_pooled_backend_connections(driver: DriverKind) {
    let a = Backend::named("a");
    let (mut p, addr, _) = start(
        driver,
        &[
            "--backend",
            &a.addr(),
            "--workers",
            "1",
            "--drain-timeout-ms",
            "20000",
            "--drain-idle-quiet-ms",
            "30000",
        ],
    );
    let mut c = Client::connect(addr);
    assert_eq!(c.send(&get("t", "/")).unwrap().text(), "a");
    assert_eq!(a.closed.load(SeqCst), 0);
    p.signal("TERM");
    assert!(
        wait_until(Duration::from_secs(5), || a.closed.load(SeqCst) == 1),
        "{driver:?}: the pooled connection is still open during the drain"
    );
    assert!(p.wait_exit(Duration::ZERO).is_none(), "{driver:?}: the drain ended early");
    drop(c);
    assert!(p.wait_exit(Duration::from_secs(10)).is_some_and(|s| s.success()));
}

/// The proxy out of descriptors (filled with idle clients under a low
/// open-file limit): the health checks and requests that find no socket
/// are no verdict on the backends. None is taken down or out, a request
/// gets `503` with `Retry-After: 1` (not `502`), and once the clients
/// leave, requests are answered at once.
#[hotloop::test(driver = "all")]
fn out_of_descriptors_no_backend_is_taken_out(driver: DriverKind) {
    const NOFILE: u32 = 64;
    let (a, b) = (Backend::named("a"), Backend::named("b"));
    let config = format!(
        "[groups.g]\nbackends = [\"{}\", \"{}\"]\nmax_fails = 1\nhealth_path = \"/health\"\nhealth_interval_ms = 100\nhealth_rise = 1\nhealth_fall = 2\n",
        a.addr(),
        b.addr()
    );
    let (_dir, path) = crate::http_proxy::config_file(&config);
    let drv = common::driver_arg(driver);
    let mut p = Proc::start_with_nofile(
        NOFILE,
        &[
            "proxy",
            "--mode",
            "http",
            "--listen",
            "127.0.0.1:0",
            "--stats-addr",
            "127.0.0.1:0",
            "--config",
            path.to_str().unwrap(),
            "--workers",
            "1",
            "--driver",
            drv,
            "--header-timeout-ms",
            "30000",
        ],
    );
    let addr = p.addr_after(" on ");
    let st = p.addr_after("stats on ");
    // A client in before the flood, its connection warm.
    let mut early = Client::connect(addr);
    assert_eq!(early.send(&get("t", "/")).unwrap().status, 200);
    let flood: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    for _ in 0..(NOFILE as usize + 40) {
        flood.lock().unwrap().push(TcpStream::connect(addr).unwrap());
    }
    assert!(p.wait_for_line("accept failed", Duration::from_secs(10)), "{driver:?}: {:?}", p.seen);
    // Many times `fall` check intervals.
    std::thread::sleep(Duration::from_millis(1000));
    // No socket for the request: `503`, soon over. (A descriptor a
    // check has just given back may still be free when it dials: then it
    // is answered.)
    let r = early.send(&get("t", "/")).unwrap();
    assert!(r.status == 503 || r.status == 200, "{driver:?}: {r:?}");
    if r.status == 503 {
        assert_eq!(r.header("retry-after"), Some("1"), "{driver:?}: {r:?}");
        assert!(r.text().contains("short of sockets"), "{driver:?}: {r:?}");
    }
    flood.lock().unwrap().clear();
    assert!(
        wait_until(Duration::from_secs(10), || p.fds() < NOFILE as usize / 2),
        "{driver:?}: the clients' descriptors did not come back"
    );
    for _ in 0..4 {
        assert_eq!(once(addr, &get("t", "/")).status, 200);
    }
    for i in 0..2 {
        assert_eq!(stat(st, &format!("backend_g_{i}_ejections")), 0, "{driver:?}");
        assert_eq!(stat(st, &format!("backend_g_{i}_errors")), 0, "{driver:?}");
    }
    p.collect_lines(Duration::ZERO);
    assert!(!p.seen.iter().any(|l| l.contains("is down")), "{driver:?}: {:?}", p.seen);
}
