//! `serve_hyper` against clients that try to make a connection cost more
//! than it should: an HTTP/2 client that keeps a stalled request open with
//! PINGs, one that resets every stream just after it is accepted (a rapid
//! reset), one that reads none of its answers, and an HTTP/1.1 head too
//! large for the buffer limit. Raw clients on loopback, both drivers.

use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hotloop::hyper::{serve_hyper, HyperOptions};
use hotloop::net::{ListenerOptions, Server};
use hotloop::{DriverKind, Runtime};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};

/// The client's connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame types.
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const WINDOW_UPDATE: u8 = 8;

/// An HTTP/2 frame: its header (length, type, flags, stream) and payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// `HEADERS` of a `GET /` (END_HEADERS, and END_STREAM if `end`):
/// `:method GET`, `:scheme http`, `:path /` from HPACK's static table,
/// `:authority t` as a literal without indexing.
fn get(stream: u32, end: bool) -> Vec<u8> {
    frame(1, if end { 0x5 } else { 0x4 }, stream, &[0x82, 0x86, 0x84, 0x01, 0x01, b't'])
}

/// The types of the whole frames at the front of `buf`, which are taken out.
fn take_frames(buf: &mut Vec<u8>) -> Vec<u8> {
    let mut types = Vec::new();
    while buf.len() >= 9 {
        let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
        if buf.len() < 9 + len {
            break;
        }
        types.push(buf[3]);
        buf.drain(..9 + len);
    }
    types
}

/// Reads what is there within `wait`: the frame types read, and whether
/// the connection ended.
fn read_some(s: &mut TcpStream, buf: &mut Vec<u8>, wait: Duration) -> (Vec<u8>, bool) {
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
    (take_frames(buf), ended)
}

fn server<S, F, B>(
    driver: DriverKind,
    options: HyperOptions,
    service: S,
) -> (Runtime, Server, SocketAddr)
where
    S: Fn(Request<Incoming>) -> F + Send + Sync + Clone + 'static,
    F: std::future::Future<Output = Result<Response<B>, Infallible>> + 'static,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let server =
        serve_hyper(rt.handle(), "127.0.0.1:0", options, move || service_fn(service.clone()))
            .unwrap();
    let addr = server.local_addr();
    (rt, server, addr)
}

fn options() -> HyperOptions {
    HyperOptions::from(ListenerOptions::default())
}

/// HTTP/2: a stream whose request body stalls after its first bytes,
/// while the client sends a PING every 100 ms: the PINGs are no progress,
/// so the idle timeout still ends the connection (GOAWAY, then the cut).
/// Before, every byte read moved the idle clock, and the PINGs kept the
/// connection, and the service waiting for the body, for good.
#[hotloop::test(driver = "all")]
fn pings_do_not_keep_a_stalled_request_body_open(driver: DriverKind) {
    let opts = HyperOptions { idle_timeout: Some(Duration::from_millis(300)), ..options() };
    let (_rt, _server, addr) = server(driver, opts, |req: Request<Incoming>| async move {
        let n = req.into_body().collect().await.map_or(0, |b| b.to_bytes().len());
        Ok(Response::new(Full::new(Bytes::from(n.to_string()))))
    });
    let mut s = TcpStream::connect(addr).unwrap();
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    hello.extend(get(1, false));
    hello.extend(frame(0, 0, 1, b"abcde"));
    s.write_all(&hello).unwrap();
    let started = Instant::now();
    let (mut buf, mut goaway) = (Vec::new(), false);
    let ended = loop {
        if started.elapsed() > Duration::from_secs(6) {
            break false;
        }
        let _ = s.write_all(&frame(PING, 0, 0, &[1; 8]));
        let (types, ended) = read_some(&mut s, &mut buf, Duration::from_millis(100));
        goaway |= types.contains(&GOAWAY);
        if ended {
            break true;
        }
    };
    let took = started.elapsed();
    assert!(ended, "{driver:?}: still open after {took:?} (GOAWAY sent: {goaway})");
    assert!(goaway, "{driver:?}: ended after {took:?} without a GOAWAY");
    assert!(took < Duration::from_secs(4), "{driver:?}: ended after {took:?}");
}

/// HTTP/2 rapid reset after accept: a client opens 100 streams, waits for
/// the service to take them, resets them and opens 100 more, again and
/// again, ignoring the GOAWAY. The connection is sent a GOAWAY and cut
/// after a few hundred, and the service started about as many requests.
/// Before, h2 counted only streams reset before hyper accepted them, and
/// the service started every one of them without end.
#[hotloop::test(driver = "all")]
fn a_client_that_resets_every_stream_is_sent_away_and_cut(driver: DriverKind) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let (_rt, _server, addr) = server(driver, options(), move |_req: Request<Incoming>| {
        counted.fetch_add(1, SeqCst);
        async {
            hotloop::time::sleep(Duration::from_secs(20)).await;
            Ok(Response::new(Full::new(Bytes::from_static(b"late"))))
        }
    });
    let mut s = TcpStream::connect(addr).unwrap();
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    s.write_all(&hello).unwrap();
    let (mut buf, mut goaway_at, mut ended) = (Vec::new(), None, false);
    let mut next = 1u32;
    let mut opened = Vec::new();
    let started = Instant::now();
    while next < 2 * 3000 && !ended && started.elapsed() < Duration::from_secs(20) {
        let mut out = Vec::new();
        for id in opened.drain(..) {
            out.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
        }
        for _ in 0..100 {
            out.extend(get(next, true));
            opened.push(next);
            next += 2;
        }
        if s.write_all(&out).is_err() {
            ended = true;
            break;
        }
        // Long enough for the server to accept them (h2 bounds streams
        // reset before that itself).
        let until = Instant::now() + Duration::from_millis(30);
        while Instant::now() < until && !ended {
            let (types, end) = read_some(&mut s, &mut buf, Duration::from_millis(10));
            if types.contains(&GOAWAY) && goaway_at.is_none() {
                goaway_at = Some(next / 2);
            }
            ended = end;
        }
    }
    let calls = calls.load(SeqCst);
    let goaway_at = goaway_at.unwrap_or_else(|| {
        panic!("{driver:?}: no GOAWAY after {} streams ({calls} taken)", next / 2)
    });
    assert!(goaway_at < 1000, "{driver:?}: GOAWAY after {goaway_at} streams");
    assert!(ended, "{driver:?}: not cut after {} streams", next / 2);
    assert!(calls < 700, "{driver:?}: the service took {calls} requests");
}

/// An answer's body without end, in 16 KiB chunks, counting the chunks
/// hyper takes.
struct Endless(Arc<AtomicUsize>);

static CHUNK: [u8; 16 * 1024] = [b'x'; 16 * 1024];

impl Body for Endless {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.fetch_add(1, SeqCst);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&CHUNK)))))
    }
}

/// HTTP/2: a client that gives all the flow-control window there is and
/// reads nothing, on 50 streams: hyper takes about 64 KiB of each answer
/// ahead (its send buffer per stream), a few chunks each. Before, it took
/// 400 KiB of each (25 chunks): with 200 streams, 80 MiB held for one
/// connection that reads nothing.
#[hotloop::test(driver = "all")]
fn a_client_that_reads_nothing_makes_hyper_hold_little_per_stream(driver: DriverKind) {
    let taken = Arc::new(AtomicUsize::new(0));
    let counted = taken.clone();
    let (_rt, _server, addr) = server(driver, options(), move |_req: Request<Incoming>| {
        let counted = counted.clone();
        async move { Ok(Response::new(Endless(counted))) }
    });
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    // A small segment size keeps the server's send buffer small too (the
    // kernel sizes it by the segments in flight), so what hyper takes is
    // what the streams hold, not what the socket does.
    sock.set_tcp_mss(536).unwrap();
    sock.connect(&addr.into()).unwrap();
    let mut s: TcpStream = sock.into();
    let mut hello = PREFACE.to_vec();
    // SETTINGS_INITIAL_WINDOW_SIZE at its largest, and the connection's window too.
    hello.extend(frame(SETTINGS, 0, 0, &[0, 4, 0x7f, 0xff, 0xff, 0xff]));
    hello.extend(frame(WINDOW_UPDATE, 0, 0, &(0x7fff_ffffu32 - 65_535).to_be_bytes()));
    const STREAMS: usize = 50;
    for i in 0..STREAMS as u32 {
        hello.extend(get(2 * i + 1, true));
    }
    s.write_all(&hello).unwrap();
    // Until hyper has taken what it will.
    let mut last = usize::MAX;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(300));
        let now = taken.load(SeqCst);
        if now == last {
            break;
        }
        last = now;
    }
    let per_stream = taken.load(SeqCst) as f64 / STREAMS as f64;
    eprintln!("{driver:?}: {per_stream} chunks per stream");
    assert!(per_stream <= 8.0, "{driver:?}: {per_stream} chunks of 16 KiB taken per stream");
}

/// HTTP/1.1: a head of 100 KiB (one long field) is over the 64 KiB buffer
/// limit: it is answered 431 (or the connection closed), not served.
/// Before, hyper's buffer grew to about 400 KiB for a head.
#[hotloop::test(driver = "all")]
fn a_head_over_the_buffer_limit_is_refused(driver: DriverKind) {
    let (_rt, _server, addr) = server(driver, options(), |_req: Request<Incoming>| async {
        Ok(Response::new(Full::new(Bytes::from_static(b"served"))))
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = b"GET / HTTP/1.1\r\nHost: t\r\nX-Long: ".to_vec();
    req.extend(std::iter::repeat_n(b'a', 100 * 1024));
    req.extend_from_slice(b"\r\n\r\n");
    // The server may answer and close before it has read it all.
    let _ = s.write_all(&req);
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let got = String::from_utf8_lossy(&got);
    assert!(
        got.is_empty() || got.starts_with("HTTP/1.1 431"),
        "{driver:?}: answered {:?}",
        got.lines().next()
    );
}
