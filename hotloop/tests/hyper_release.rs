//! `serve_hyper` releases an HTTP/1.1 connection's hyper state between
//! requests (`HyperOptions::idle_release`) and builds it again when the
//! client sends: every way a client can come back (a new request, the
//! rest of a pipelined head, a body, a half-close, HTTP/2) is served as if
//! nothing had happened, the header-read timeout still counts from the end
//! of the last answer, and the process holds hyper's buffers only while a
//! connection is busy (the live heap per idle connection, counted by the
//! allocator of this test binary).

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hotloop::hyper::{serve_hyper, HyperOptions};
use hotloop::net::Server;
use hotloop::{DriverKind, Runtime};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};

/// The system allocator, counting the bytes live on the heap.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator with the same
// arguments; the counter is only arithmetic beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// `LIVE` counts the whole process: the heap measurement runs alone, with
/// no other test of this binary allocating or freeing beside it (a test
/// that ends frees its connections' state, megabytes at a time).
static HEAP: RwLock<()> = RwLock::new(());

/// Held by every test that only uses the heap.
fn sharing_the_heap() -> RwLockReadGuard<'static, ()> {
    HEAP.read().unwrap_or_else(|e| e.into_inner())
}

/// Held by the test that measures the heap.
fn alone_on_the_heap() -> RwLockWriteGuard<'static, ()> {
    HEAP.write().unwrap_or_else(|e| e.into_inner())
}

/// Answers `<path> <body length>`.
async fn path_and_length(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    Ok(Response::new(Full::new(Bytes::from(format!("{path} {}", body.len())))))
}

fn server(
    driver: DriverKind,
    workers: usize,
    options: HyperOptions,
) -> (Runtime, Server, SocketAddr) {
    let rt = Runtime::builder().workers(workers).driver(driver).build().unwrap();
    let server =
        serve_hyper(rt.handle(), "127.0.0.1:0", options, || service_fn(path_and_length)).unwrap();
    let addr = server.local_addr();
    (rt, server, addr)
}

fn options(release: Option<Duration>, header: Duration) -> HyperOptions {
    HyperOptions {
        idle_release: release,
        header_timeout: Some(header),
        ..HyperOptions::from(hotloop::net::ListenerOptions::default())
    }
}

/// Reads byte by byte up to and including `end` (so nothing of a later
/// answer is taken).
fn read_through(s: &mut TcpStream, end: &[u8]) -> String {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(end) {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "the connection ended early: {got:?}");
        got.push(byte[0]);
    }
    String::from_utf8(got).unwrap()
}

/// Reads one answer with a `content-length` and returns its body.
fn read_answer(s: &mut TcpStream) -> String {
    let head = read_through(s, b"\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase().strip_prefix("content-length: ").map(|v| v.parse().unwrap())
        })
        .expect("content-length");
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    String::from_utf8(body).unwrap()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

const PAUSE: Duration = Duration::from_millis(150);

/// Every way back into a released connection is served in order.
#[hotloop::test(driver = "all")]
fn a_released_connection_serves_whatever_the_client_sends_next(driver: DriverKind) {
    let _heap = sharing_the_heap();
    let (_rt, server, addr) =
        server(driver, 1, options(Some(Duration::from_millis(50)), Duration::from_secs(10)));
    let mut s = connect(addr);
    // A request, a pause (released), another.
    s.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(read_answer(&mut s), "/a 0");
    std::thread::sleep(PAUSE);
    s.write_all(b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(read_answer(&mut s), "/b 0");
    // A request and the start of the next, pipelined; the rest after a pause.
    s.write_all(b"GET /c HTTP/1.1\r\nHost: x\r\n\r\nGET /d HTTP/1.1\r\nHo").unwrap();
    assert_eq!(read_answer(&mut s), "/c 0");
    std::thread::sleep(PAUSE);
    s.write_all(b"st: x\r\n\r\n").unwrap();
    assert_eq!(read_answer(&mut s), "/d 0");
    // A head alone, its body after a pause; then a request with a body at once.
    s.write_all(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n").unwrap();
    std::thread::sleep(PAUSE);
    s.write_all(b"12345").unwrap();
    assert_eq!(read_answer(&mut s), "/e 5");
    std::thread::sleep(PAUSE);
    s.write_all(
        b"POST /f HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .unwrap();
    assert_eq!(read_answer(&mut s), "/f 3");
    std::thread::sleep(PAUSE);
    // Back to back: the connection is now kept built while it sends.
    for i in 0..20 {
        s.write_all(format!("GET /g{i} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).unwrap();
        assert_eq!(read_answer(&mut s), format!("/g{i} 0"));
    }
    std::thread::sleep(PAUSE);
    // A request, then the end of the client's side: answered, then closed.
    s.write_all(b"GET /h HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_answer(&mut s), "/h 0");
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");

    // A client whose first bytes arrive in pieces, the preface of HTTP/2 among them.
    let mut s = connect(addr);
    s.write_all(b"PR").unwrap();
    std::thread::sleep(PAUSE);
    s.write_all(b"OPFIND /i HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(read_answer(&mut s), "/i 0");

    // A released connection ends when the server stops.
    let mut s = connect(addr);
    s.write_all(b"GET /j HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(read_answer(&mut s), "/j 0");
    std::thread::sleep(PAUSE);
    let start = Instant::now();
    server.stop();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty() && start.elapsed() < Duration::from_secs(3), "{rest:?}");
}

/// An answer whose body pauses longer than the release time: the body
/// streams while hyper waits for it, and the connection is not taken
/// apart under it.
struct SlowBody {
    step: u8,
    pause: Option<std::pin::Pin<Box<hotloop::time::Sleep>>>,
}

impl hyper::body::Body for SlowBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        use std::future::Future;
        use std::task::Poll;
        match self.step {
            0 => {
                self.step = 1;
                self.pause = Some(Box::pin(hotloop::time::sleep(PAUSE)));
                Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from_static(b"first")))))
            }
            1 => {
                std::task::ready!(self.pause.as_mut().unwrap().as_mut().poll(cx));
                self.step = 2;
                Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from_static(b"second")))))
            }
            _ => Poll::Ready(None),
        }
    }
}

#[hotloop::test(driver = "all")]
fn an_answer_that_pauses_is_not_cut_by_a_release(driver: DriverKind) {
    let _heap = sharing_the_heap();
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let server = serve_hyper(
        rt.handle(),
        "127.0.0.1:0",
        options(Some(Duration::from_millis(50)), Duration::from_secs(10)),
        || {
            service_fn(|_req: Request<Incoming>| async {
                Ok::<_, Infallible>(Response::new(SlowBody { step: 0, pause: None }))
            })
        },
    )
    .unwrap();
    let mut s = connect(server.local_addr());
    for _ in 0..2 {
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let text = read_through(&mut s, b"0\r\n\r\n");
        assert!(text.contains("first") && text.contains("second"), "{text}");
        std::thread::sleep(PAUSE);
    }
}

/// HTTP/2 by prior knowledge still works after a pause (its state is
/// never released), on a connection whose preface came in two pieces.
#[hotloop::test(driver = "all")]
fn http2_by_prior_knowledge_is_served_after_a_split_preface_and_a_pause(driver: DriverKind) {
    let _heap = sharing_the_heap();
    let (_rt, _server, addr) =
        server(driver, 1, options(Some(Duration::from_millis(50)), Duration::from_secs(10)));
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let bodies = rt.block_on(async move {
        let stream = hotloop::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http2::handshake(
            hotloop::hyper::HotloopExecutor,
            hotloop::hyper::HyperIo::new(stream),
        )
        .await
        .unwrap();
        hotloop::spawn(conn);
        let mut bodies = Vec::new();
        for path in ["/k", "/l"] {
            let req = Request::get(path).body(Full::new(Bytes::from_static(b"xy"))).unwrap();
            let resp = sender.send_request(req).await.unwrap();
            bodies.push(resp.into_body().collect().await.unwrap().to_bytes());
            hotloop::time::sleep(PAUSE).await;
        }
        bodies
    });
    assert_eq!(bodies, vec![Bytes::from("/k 2"), Bytes::from("/l 2")]);

    let mut s = connect(addr);
    s.write_all(&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..10]).unwrap();
    std::thread::sleep(PAUSE);
    s.write_all(&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[10..]).unwrap();
    // An empty SETTINGS frame: the server answers with its own SETTINGS.
    s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
    let mut frame = [0u8; 9];
    s.read_exact(&mut frame).unwrap();
    assert_eq!(frame[3], 4, "the first frame is SETTINGS: {frame:?}");
}

/// The header-read timeout counts from the end of the last answer, with
/// hyper's state released between requests or kept (then hyper's own
/// header timer, kept in the connection's record, ends it): silent, or
/// with half a head.
#[hotloop::test(driver = "all")]
fn the_header_timeout_counts_from_the_last_answer_across_a_release(driver: DriverKind) {
    let _heap = sharing_the_heap();
    let header = Duration::from_millis(600);
    for release in [Some(Duration::from_millis(50)), None] {
        let (_rt, _server, addr) = server(driver, 1, options(release, header));
        for partial in [&b""[..], &b"GET /m HTTP/1.1\r\n"[..]] {
            let mut s = connect(addr);
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            assert_eq!(read_answer(&mut s), "/ 0");
            let answered = Instant::now();
            std::thread::sleep(Duration::from_millis(300));
            s.write_all(partial).unwrap();
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            let took = answered.elapsed();
            assert!(
                took >= header - Duration::from_millis(50)
                    && took < header + Duration::from_secs(2),
                "{release:?} {partial:?}: closed {took:?} after the answer"
            );
            let rest = String::from_utf8_lossy(&rest);
            assert!(rest.is_empty() || rest.starts_with("HTTP/1.1 408"), "{rest}");
        }
        // A client that sends half a head and stops, and one that never
        // sends anything, meet it too, from their connection.
        for first in [&b"GET / HTTP/1.1\r\n"[..], &b""[..]] {
            let mut s = connect(addr);
            let start = Instant::now();
            s.write_all(first).unwrap();
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            let took = start.elapsed();
            assert!(
                took >= header - Duration::from_millis(50)
                    && took < header + Duration::from_secs(2),
                "{release:?} {first:?}: {took:?}"
            );
        }
    }
}

/// The live heap per connection that answered one request and fell
/// silent, over `n` such connections, after `settle`.
fn heap_per_idle_connection(addr: SocketAddr, n: usize, settle: Duration) -> isize {
    let mut conns = Vec::with_capacity(n);
    std::thread::sleep(Duration::from_millis(100));
    let before = LIVE.load(Ordering::SeqCst);
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut buf = [0u8; 512];
        let mut got = 0;
        while !buf[..got].ends_with(b"/ 0") {
            got += s.read(&mut buf[got..]).unwrap();
        }
        conns.push(s);
    }
    std::thread::sleep(settle);
    (LIVE.load(Ordering::SeqCst) - before) / n as isize
}

/// With the release, an idle connection holds about its task and socket
/// state; without it, hyper's two 8 KiB buffers.
#[hotloop::test(driver = "all")]
fn an_idle_connection_holds_no_hyper_buffers(driver: DriverKind) {
    let _heap = alone_on_the_heap();
    let n = 300;
    let settle = Duration::from_millis(300);
    let released = {
        let (_rt, _server, addr) = server(driver, 1, HyperOptions::default());
        heap_per_idle_connection(addr, 20, settle); // pools and first allocations
        heap_per_idle_connection(addr, n, settle)
    };
    let (_rt2, _server2, addr2) = server(driver, 1, options(None, Duration::from_secs(30)));
    heap_per_idle_connection(addr2, 20, settle);
    let kept = heap_per_idle_connection(addr2, n, settle);
    assert!(released < 2048, "{released} B per idle connection with the release");
    assert!(kept > 12 * 1024, "{kept} B per idle connection without it");
    eprintln!("{released} B per idle connection released, {kept} B kept");
}
