//! Draining a server: `stop` then `stopped`, `drain` and `drain_blocking`
//! all let the connections in flight finish, cut what is left at the
//! deadline, and close an idle keep-alive connection only once it has
//! been quiet. Both drivers.

use crate::common;

use std::future::Future;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper::Response;

use hotloop::hyper::serve_hyper;
use hotloop::net::{serve, ListenerOptions, ServerOptions, DRAIN_IDLE_QUIET};
use hotloop::{DriverKind, Runtime};

fn runtime(driver: DriverKind, workers: usize) -> Runtime {
    Runtime::builder().workers(workers).driver(driver).build().unwrap()
}

/// `serve_hyper` on `rt` with the drain's quiet time `quiet`, answering
/// every request with `body`.
fn hyper_answering(rt: &Runtime, quiet: Duration, body: Bytes) -> hotloop::net::Server {
    let options = ServerOptions { drain_idle_quiet: quiet, ..ServerOptions::default() };
    serve_hyper(rt.handle(), "127.0.0.1:0", options, move || {
        let body = body.clone();
        service_fn(move |_| {
            let body = body.clone();
            async move { Ok::<_, std::convert::Infallible>(Response::new(Full::new(body))) }
        })
    })
    .unwrap()
}

/// Waits until `cond` holds, for at most 10 s.
fn wait_until(mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out");
        thread::sleep(Duration::from_millis(2));
    }
}

/// A request that takes a second to answer (an await, not a busy worker)
/// is answered when `stop` is followed by `stopped().await`, which waits
/// for the connections, not only for the accept loops.
#[hotloop::test(driver = "all")]
fn stop_then_stopped_lets_a_request_in_flight_finish(driver: DriverKind) {
    let rt = runtime(driver, 2);
    let server = serve(rt.handle(), "127.0.0.1:0", ListenerOptions::default(), |s| async move {
        let (n, _) = s.read_owned(vec![0u8; 16]).await;
        if matches!(n, Ok(n) if n > 0) {
            hotloop::time::sleep(Duration::from_secs(1)).await;
            let _ = s.write_all_owned(b"done".to_vec()).await;
        }
    })
    .unwrap();
    let addr = server.local_addr();
    let client = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"go").unwrap();
        let mut reply = Vec::new();
        let _ = s.read_to_end(&mut reply);
        reply
    });
    wait_until(|| server.active_connections() == 1);
    let started = Instant::now();
    server.stop();
    rt.block_on(server.stopped()).unwrap();
    let took = started.elapsed();
    // What a program does after `stopped()`: its runtime goes.
    drop(rt);
    assert_eq!(client.join().unwrap(), b"done", "{driver:?}: the request in flight was cut");
    assert!(took < Duration::from_secs(5), "{driver:?}: took {took:?}");
}

/// What is still open at the drain's deadline is cut (the client sees its
/// connection end), counted, and the drain returns.
#[hotloop::test(driver = "all")]
fn a_drain_cuts_what_is_open_at_its_deadline_and_counts_it(driver: DriverKind) {
    let rt = runtime(driver, 2);
    let server = serve(rt.handle(), "127.0.0.1:0", ServerOptions::default(), common::echo).unwrap();
    let addr = server.local_addr();
    let mut held = TcpStream::connect(addr).unwrap();
    held.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    held.write_all(b"hi").unwrap();
    held.read_exact(&mut [0u8; 2]).unwrap();
    let cut_before = rt.stats().lifecycle.drain_cut;
    let drained = server.drain_blocking(Duration::from_millis(300));
    assert_eq!((drained.open, drained.cut, drained.left), (1, 1, 0), "{driver:?}: {drained:?}");
    assert!(drained.took >= Duration::from_millis(300), "{drained:?}");
    assert!(drained.took < Duration::from_secs(5), "{drained:?}");
    // The runtime still runs: the connection was closed by the cut, not by
    // the runtime going away.
    let ended = held.read(&mut [0u8; 8]);
    assert!(matches!(ended, Ok(0) | Err(_)), "{driver:?}: the held connection got {ended:?}");
    assert!(rt.stats().lifecycle.drain_cut > cut_before);
}

fn keep_alive_get(s: &mut TcpStream) -> String {
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    // The answer is small: its head and "ok" end it.
    while !got.ends_with(b"ok") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).to_lowercase()
}

/// A keep-alive connection that was just answered is not closed the moment
/// the server stops: its client is likely sending the next request, which
/// would meet a closed socket. The request that comes is answered with
/// `Connection: close`; a connection quiet for longer is closed at once.
#[hotloop::test(driver = "all")]
fn a_stopping_hyper_server_answers_the_request_that_was_on_its_way(driver: DriverKind) {
    let rt = runtime(driver, 1);
    let server = serve_hyper(rt.handle(), "127.0.0.1:0", ListenerOptions::default(), || {
        service_fn(|_| async {
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("ok"))))
        })
    })
    .unwrap();
    let addr = server.local_addr();
    let mut quiet = TcpStream::connect(addr).unwrap();
    quiet.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert!(keep_alive_get(&mut quiet).starts_with("http/1.1 200"));
    let mut busy = TcpStream::connect(addr).unwrap();
    busy.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    thread::sleep(DRAIN_IDLE_QUIET + Duration::from_millis(100));
    assert!(keep_alive_get(&mut busy).starts_with("http/1.1 200"));
    // `busy` was answered just now; `quiet` has been idle for longer than the quiet time.
    let drain = thread::spawn(move || server.drain_blocking(Duration::from_secs(10)));
    thread::sleep(DRAIN_IDLE_QUIET / 4);
    let last = keep_alive_get(&mut busy);
    assert!(last.starts_with("http/1.1 200"), "{driver:?}: the request on its way got {last:?}");
    assert!(last.contains("connection: close"), "{driver:?}: {last}");
    assert_eq!(busy.read(&mut [0u8; 8]).unwrap_or(0), 0, "closed after its last answer");
    assert_eq!(quiet.read(&mut [0u8; 8]).unwrap_or(0), 0, "the quiet connection is closed");
    let drained = drain.join().unwrap();
    assert_eq!(drained.cut, 0, "{drained:?}");
    assert!(drained.took < Duration::from_secs(5), "{drained:?}");
}

/// On io_uring a request can leave the socket before it reaches the
/// connection: an enter that runs the ring's deferred work while tasks run
/// (the early submit after a task that kept an entry waiting) moves it into
/// the receive's buffer ring, and its completion is read only at the end
/// of the turn. A stop in that turn, for a connection quiet for longer than
/// the quiet time, found an empty socket and closed it over the request.
/// Here a task on the connection's worker keeps a connect waiting, lets the
/// client send while it blocks the worker (so the bytes wait for the
/// ring's deferred work), and stops the server: the request is answered,
/// with `Connection: close`.
#[hotloop::test(driver = "all")]
fn a_request_taken_from_the_socket_but_not_delivered_is_answered_at_a_stop(driver: DriverKind) {
    let rt = runtime(driver, 1);
    let quiet = Duration::from_millis(300);
    let server = hyper_answering(&rt, quiet, Bytes::from("ok"));
    let addr = server.local_addr();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert!(keep_alive_get(&mut s).starts_with("http/1.1 200"));
    // Quiet for twice the quiet time: closed at once by a stop, unless its
    // next request is seen on its way.
    thread::sleep(quiet * 2);
    // A port nobody listens on: the connect's entry waits in the ring.
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (go, send) = std::sync::mpsc::channel::<()>();
    let client = thread::spawn(move || {
        send.recv().unwrap();
        keep_alive_get(&mut s)
    });
    let server = std::sync::Arc::new(server);
    let stopper = server.clone();
    let stopped = rt.handle().spawn_on(0, move || async move {
        let mut connect = std::pin::pin!(hotloop::net::TcpStream::connect(nobody));
        let mut first = true;
        std::future::poll_fn(|cx| {
            if std::mem::take(&mut first) {
                // On io_uring the connect's entry waits, and is kept past
                // this poll (a withdrawn entry is not submitted); epoll's
                // may be refused at once.
                let refused = connect.as_mut().poll(cx).is_ready();
                go.send(()).unwrap();
                // The worker busy while the request comes.
                thread::sleep(Duration::from_millis(50));
                stopper.stop();
                return if refused { Poll::Ready(()) } else { Poll::Pending };
            }
            connect.as_mut().poll(cx).map(drop)
        })
        .await;
    });
    let _ = rt.block_on(stopped);
    let last = client.join().unwrap();
    assert!(last.starts_with("http/1.1 200"), "{driver:?}: the request got {last:?}");
    assert!(last.contains("connection: close"), "{driver:?}: {last}");
    let server = std::sync::Arc::into_inner(server).expect("the task dropped its handle");
    let drained = server.drain_blocking(Duration::from_secs(10));
    assert_eq!(drained.cut, 0, "{drained:?}");
}

/// Reads an answer's head, byte by byte (lowercased), and its length.
fn read_head(s: &mut TcpStream) -> (String, usize) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "{}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap().to_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    (head, len)
}

/// A stop while a client reads a long answer slowly (1 MiB, in the
/// kernel's send queue when hyper's last write returns; the client's
/// receive buffer small): the quiet time counts from the client's
/// acknowledgement of the answer's end, not from that write. Counted from
/// the write, it ran out while the client was still reading, and the next
/// request, sent as soon as the answer was read, met the close. It is
/// answered, with `Connection: close`.
#[hotloop::test(driver = "all")]
fn a_stopping_hyper_server_lets_a_slow_reader_finish_before_the_quiet_time_counts(
    driver: DriverKind,
) {
    const BODY: usize = 1 << 20;
    let rt = runtime(driver, 1);
    let quiet = Duration::from_millis(500);
    let server = hyper_answering(&rt, quiet, Bytes::from(vec![b'x'; BODY]));
    let addr = server.local_addr();
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(16 * 1024).unwrap();
    sock.connect(&addr.into()).unwrap();
    let mut s = TcpStream::from(sock);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let request = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n";
    s.write_all(request).unwrap();
    let (head, len) = read_head(&mut s);
    assert!(head.starts_with("http/1.1 200") && !head.contains("connection: close"), "{head}");
    assert_eq!(len, BODY, "{head}");
    let drain = thread::spawn(move || server.drain_blocking(Duration::from_secs(10)));
    // About 1 MiB/s: the answer takes twice the quiet time to read.
    let mut buf = vec![0u8; 16 * 1024];
    let mut left = len;
    while left > 0 {
        let n = s.read(&mut buf[..left.min(16 * 1024)]).unwrap();
        assert!(n > 0, "{driver:?}: closed with {left} bytes of the answer unread");
        left -= n;
        thread::sleep(Duration::from_millis(15));
    }
    // At once, as a keep-alive client does.
    s.write_all(request).unwrap();
    let (last, len) = read_head(&mut s);
    assert!(last.starts_with("http/1.1 200"), "{driver:?}: the next request got {last:?}");
    assert!(last.contains("connection: close"), "{driver:?}: {last}");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert_eq!(rest.len(), len, "{driver:?}: the last answer");
    drop(s);
    assert_eq!(drain.join().unwrap().cut, 0);
}

/// A quiet time at or above the drain's timeout (here the one
/// `drain_blocking` is given) keeps a connection that was idle for longer
/// than that before the stop: it is not closed before the drain's
/// deadline, and its next request is answered with `Connection: close`.
/// The quiet time counted from when the connection fell idle, so it was
/// over at the stop, and the connection was closed at once.
#[hotloop::test(driver = "all")]
fn a_quiet_time_at_the_drains_timeout_keeps_a_connection_idle_since_before_the_stop(
    driver: DriverKind,
) {
    let rt = runtime(driver, 1);
    let quiet = Duration::from_secs(1);
    let server = hyper_answering(&rt, quiet, Bytes::from("ok"));
    let addr = server.local_addr();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert!(keep_alive_get(&mut s).starts_with("http/1.1 200"));
    // Idle for longer than the quiet time, then the stop.
    thread::sleep(quiet + Duration::from_millis(300));
    let drain = thread::spawn(move || server.drain_blocking(quiet));
    // Well inside the drain, and as far from its deadline.
    thread::sleep(Duration::from_millis(200));
    let last = keep_alive_get(&mut s);
    assert!(last.starts_with("http/1.1 200"), "{driver:?}: the request got {last:?}");
    assert!(last.contains("connection: close"), "{driver:?}: {last}");
    assert_eq!(s.read(&mut [0u8; 8]).unwrap_or(0), 0, "closed after its last answer");
    // The server's close lingers for the client's end, within the drain.
    drop(s);
    assert_eq!(drain.join().unwrap().cut, 0);
}

/// A body sent in two parts, the second `pause` after the first (a
/// streamed answer whose head went out long before its end); `pause`
/// zero sends one part.
struct TwoParts {
    sent: u8,
    pause: Option<hotloop::time::Sleep>,
}

impl hyper::body::Body for TwoParts {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match (self.sent, &mut self.pause) {
            (0, _) => {
                self.sent = 1;
                Poll::Ready(Some(Ok(Frame::data(Bytes::from("part1;")))))
            }
            (1, Some(pause)) => {
                std::task::ready!(Pin::new(pause).poll(cx));
                self.sent = 2;
                Poll::Ready(Some(Ok(Frame::data(Bytes::from("part2;")))))
            }
            _ => Poll::Ready(None),
        }
    }
}

/// Reads a chunked answer to its last chunk; the lowercased head and body.
fn read_chunked(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"0\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).to_lowercase()
}

/// The server stops while an answer is being written (its head, sent
/// before the stop, said keep-alive): the connection is not closed when
/// that answer ends, which a client already sending its next request
/// would meet; that request gets an answer with `Connection: close`.
#[hotloop::test(driver = "all")]
fn a_stop_during_a_streamed_answer_lets_the_next_request_be_answered(driver: DriverKind) {
    let rt = runtime(driver, 1);
    let server = serve_hyper(rt.handle(), "127.0.0.1:0", ListenerOptions::default(), || {
        service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
            let pause = (req.uri().path() == "/slow")
                .then(|| hotloop::time::sleep(Duration::from_millis(400)));
            Ok::<_, std::convert::Infallible>(Response::new(TwoParts { sent: 0, pause }))
        })
    })
    .unwrap();
    let addr = server.local_addr();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let mut first = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&first).contains("part1;") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed before the first part");
        first.extend_from_slice(&buf[..n]);
    }
    assert!(!String::from_utf8_lossy(&first).to_lowercase().contains("connection: close"));
    // Stopping while the second part is due.
    let drain = thread::spawn(move || server.drain_blocking(Duration::from_secs(10)));
    thread::sleep(Duration::from_millis(100));
    let rest = read_chunked(&mut s);
    assert!(rest.contains("part2;"), "{driver:?}: the streamed answer was cut: {rest:?}");
    // The client, told keep-alive, sends its next request at once.
    s.write_all(b"GET /fast HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let next = read_chunked(&mut s);
    assert!(next.starts_with("http/1.1 200"), "{driver:?}: the next request got {next:?}");
    assert!(next.contains("connection: close"), "{driver:?}: {next}");
    assert_eq!(s.read(&mut buf).unwrap_or(0), 0, "closed after its last answer");
    assert_eq!(drain.join().unwrap().cut, 0);
}

/// One HTTP/2 frame: its type, flags, stream and payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Reads one HTTP/2 frame: (type, flags, stream, payload).
fn read_h2_frame(s: &mut TcpStream) -> (u8, u8, u32, Vec<u8>) {
    let mut head = [0u8; 9];
    s.read_exact(&mut head).unwrap();
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).unwrap();
    (head[3], head[4], stream, payload)
}

const H2_DATA: u8 = 0;
const H2_HEADERS: u8 = 1;
const H2_SETTINGS: u8 = 4;
const H2_PING: u8 = 6;
const H2_GOAWAY: u8 = 7;
const H2_END_STREAM: u8 = 1;
const H2_ACK: u8 = 1;

/// A drain's GOAWAY meets an HTTP/2 client with no stream open, which
/// answers the server's PING, sends its own GOAWAY and ends its side in
/// one segment (as h2's client does, but in one piece: TCP_CORK holds the
/// bytes until the FIN). The server writes nothing after that end: a
/// client that closed its socket would answer any byte with a reset
/// (hyper's final GOAWAY drew one per connection at every upgrade).
#[hotloop::test(driver = "all")]
fn an_http2_client_that_ends_after_the_drains_goaway_is_sent_nothing_more(driver: DriverKind) {
    let rt = runtime(driver, 1);
    let server = serve_hyper(rt.handle(), "127.0.0.1:0", ServerOptions::default(), || {
        service_fn(|_req| async {
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("ok"))))
        })
    })
    .unwrap();
    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // GET / on stream 1: :method GET, :scheme http, :path /, :authority t.
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(h2_frame(H2_SETTINGS, 0, 0, &[]));
    hello.extend(h2_frame(H2_HEADERS, H2_END_STREAM | 4, 1, &[0x82, 0x86, 0x84, 0x41, 1, b't']));
    s.write_all(&hello).unwrap();
    loop {
        let (kind, flags, stream, _) = read_h2_frame(&mut s);
        if kind == H2_SETTINGS && flags & H2_ACK == 0 {
            s.write_all(&h2_frame(H2_SETTINGS, H2_ACK, 0, &[])).unwrap();
        }
        if stream == 1 && matches!(kind, H2_DATA | H2_HEADERS) && flags & H2_END_STREAM != 0 {
            break;
        }
    }
    let drain = thread::spawn(move || server.drain_blocking(Duration::from_secs(10)));
    let mut goaway = false;
    let ping = loop {
        let (kind, flags, _, payload) = read_h2_frame(&mut s);
        goaway |= kind == H2_GOAWAY;
        if kind == H2_PING && flags & H2_ACK == 0 {
            break payload;
        }
    };
    assert!(goaway, "{driver:?}: no GOAWAY came before the drain's PING");
    socket2::SockRef::from(&s).set_tcp_cork(true).unwrap();
    let mut bye = h2_frame(H2_PING, H2_ACK, 0, &ping);
    bye.extend(h2_frame(H2_GOAWAY, 0, 0, &[0; 8]));
    s.write_all(&bye).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut after = Vec::new();
    s.read_to_end(&mut after).unwrap();
    assert!(
        after.is_empty(),
        "{driver:?}: the server wrote {} bytes after the client's end (frame type {:?})",
        after.len(),
        after.get(3)
    );
    assert_eq!(drain.join().unwrap().cut, 0, "{driver:?}");
}

/// The state (`/proc/net/tcp`, hex) of the IPv4 loopback connection from
/// `local` to `remote`, if there is one.
fn tcp_state(local: std::net::SocketAddr, remote: std::net::SocketAddr) -> Option<u8> {
    let hex = |a: std::net::SocketAddr| match a {
        std::net::SocketAddr::V4(v4) => {
            format!("{:08X}:{:04X}", u32::from_le_bytes(v4.ip().octets()), v4.port())
        }
        std::net::SocketAddr::V6(_) => unreachable!("IPv4 only"),
    };
    let (local, remote) = (hex(local), hex(remote));
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&local.as_str()) && f.get(2) == Some(&remote.as_str()))
            .then(|| u8::from_str_radix(f[3], 16).ok())
            .flatten()
    })
}

/// A stop while a connection's close lingers: a client posts a 256 KiB
/// body the service ignores and gets a 1 MiB answer, which it reads
/// slowly; hyper ends the connection once the answer is in the kernel's
/// send queue, its write side is shut (`FIN_WAIT1`), and the close
/// lingers to read what the client still sends. The server drains then,
/// and the client goes on sending its body: the linger goes on too, and
/// the client gets its whole answer. Before, the stop ended the task at
/// once, the socket closed with the client's bytes unread (or meeting
/// them after), the kernel answered with a reset, and the unsent part
/// of the answer was lost.
#[hotloop::test(driver = "all")]
fn a_stop_lets_a_lingering_close_finish_so_the_answer_is_not_reset(driver: DriverKind) {
    const ANSWER: usize = 1 << 20;
    const BODY: usize = 256 * 1024;
    const CHUNK: usize = 16 * 1024;
    const FIN_WAIT1: u8 = 4;
    let rt = runtime(driver, 1);
    let server = hyper_answering(&rt, DRAIN_IDLE_QUIET, Bytes::from(vec![b'x'; ANSWER]));
    let addr = server.local_addr();
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(16 * 1024).unwrap();
    sock.connect(&addr.into()).unwrap();
    let mut s = TcpStream::from(sock);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let me = s.local_addr().unwrap();
    let head = format!("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: {BODY}\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&[b'b'; CHUNK]).unwrap();
    let (answer_head, len) = read_head(&mut s);
    assert!(answer_head.starts_with("http/1.1 200"), "{answer_head}");
    assert_eq!(len, ANSWER);
    // hyper is done with the answer and the close lingers.
    wait_until(|| tcp_state(addr, me) == Some(FIN_WAIT1));
    let drain = thread::spawn(move || server.drain_blocking(Duration::from_secs(10)));
    thread::sleep(Duration::from_millis(50));
    // The rest of the body, while the answer is read slowly.
    let mut writer = s.try_clone().unwrap();
    let sender = thread::spawn(move || {
        for _ in 1..BODY / CHUNK {
            if writer.write_all(&[b'b'; CHUNK]).is_err() {
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
    });
    let mut buf = vec![0u8; CHUNK];
    let mut got = 0;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => panic!("{driver:?}: {e} after {got} bytes of the answer's {ANSWER}"),
        }
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(got, ANSWER, "{driver:?}: the answer");
    sender.join().unwrap();
    drop(s);
    assert_eq!(drain.join().unwrap().cut, 0);
}

/// A connection the cut has not ended when the drain stops waiting for it
/// (its worker busy in a long synchronous computation: `Drained::left`)
/// is counted in `drain_cut` when the drain returns, with those the cut
/// ended, so the stats say what the drain's report says. Before, it was
/// counted only when its worker polled it again, which a process that
/// exits after the drain never does.
#[hotloop::test(driver = "all")]
fn a_connection_the_cut_has_not_ended_yet_is_counted_as_cut(driver: DriverKind) {
    let rt = runtime(driver, 1);
    let options = ServerOptions::default();
    let server = hotloop::net::serve_with_stop(rt.handle(), "127.0.0.1:0", options, |s, stop| {
        async move {
            let (n, _) = s.read_owned(vec![0u8; 16]).await;
            if n.is_err() {
                return;
            }
            stop.stopping().await;
            hotloop::time::sleep(Duration::from_millis(100)).await;
            // Busy past the drain's deadline and the cut's wait.
            thread::sleep(Duration::from_millis(2500));
            let _ = s.read_owned(vec![0u8; 16]).await;
        }
    })
    .unwrap();
    let mut held = TcpStream::connect(server.local_addr()).unwrap();
    held.write_all(b"hi").unwrap();
    wait_until(|| server.active_connections() == 1);
    let before = rt.stats().lifecycle.drain_cut;
    let drained = server.drain_blocking(Duration::from_millis(300));
    assert_eq!((drained.open, drained.cut, drained.left), (1, 0, 1), "{driver:?}: {drained:?}");
    let counted = rt.stats().lifecycle.drain_cut - before;
    assert!(counted >= 1, "{driver:?}: drain_cut counted {counted} of {drained:?}");
}
