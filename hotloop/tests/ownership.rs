//! An operation owns its socket until its last completion: a queued or
//! cancelled operation never acts on a descriptor number that another
//! socket reuses, an operation dropped in the turn it was made never
//! reaches the kernel, and a socket dropped outside its runtime still
//! closes at once.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use hotloop::net::AcceptMode;
use hotloop::net::{ListenerOptions, TcpListener, TcpStream};
use hotloop::time::{sleep, timeout, timeout_at};
use hotloop::DriverKind;
use hotloop::Runtime;

use crate::common;

/// A deadline that every clock, the loop's cached one included, sees as passed.
fn already_passed() -> Instant {
    Instant::now().checked_sub(Duration::from_secs(1)).unwrap()
}

fn runtime(driver: DriverKind) -> Runtime {
    Runtime::builder().workers(1).driver(driver).build().unwrap()
}

/// A peer that accepts one connection, optionally sends `greeting`, and
/// reports every byte it receives until the connection closes.
fn recording_peer(greeting: &'static [u8]) -> (SocketAddr, mpsc::Receiver<Vec<u8>>) {
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        if !greeting.is_empty() {
            s.write_all(greeting).unwrap();
        }
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        let _ = tx.send(got);
    });
    (addr, rx)
}

/// A peer that accepts one connection and holds it open until told.
fn silent_peer() -> (SocketAddr, mpsc::Sender<()>) {
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel::<()>();
    thread::spawn(move || {
        let (_s, _) = listener.accept().unwrap();
        let _ = rx.recv_timeout(Duration::from_secs(10));
    });
    (addr, tx)
}

/// A write whose deadline passed in the turn it was made, on a stream
/// dropped at once: another socket that gets the same descriptor number
/// must not receive its bytes.
#[hotloop::test(driver = "all")]
fn a_dropped_write_never_reaches_a_reused_descriptor(driver: DriverKind) {
    let rt = runtime(driver);
    let (addr_a, _hold_a) = silent_peer();
    let (addr_b, got_b) = recording_peer(b"");
    rt.block_on(async {
        let a = TcpStream::connect(addr_a).await.unwrap();
        let fd_a = std::os::fd::AsRawFd::as_raw_fd(&a);
        // Queued, then dropped by the elapsed deadline in the same turn.
        let _ = timeout_at(already_passed(), a.write_owned(b"LEAKED BYTES".to_vec())).await;
        drop(a);
        // A blocking connect in the same turn takes the lowest free number.
        let b = StdStream::connect(addr_b).unwrap();
        let fd_b = std::os::fd::AsRawFd::as_raw_fd(&b);
        if fd_b != fd_a {
            eprintln!("note: the descriptor was not reused ({fd_a} -> {fd_b})");
        }
        // Let the loop enter the kernel a few times.
        sleep(Duration::from_millis(30)).await;
        (&b).write_all(b"hello").unwrap();
        drop(b);
    });
    let got = got_b.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(got, b"hello", "bytes of a dropped write reached another socket");
}

/// A read dropped the same way must not steal the bytes of the socket
/// that reuses its descriptor number.
#[hotloop::test(driver = "all")]
fn a_dropped_read_never_steals_from_a_reused_descriptor(driver: DriverKind) {
    let rt = runtime(driver);
    let (addr_a, _hold_a) = silent_peer();
    let (addr_b, _got_b) = recording_peer(b"GREETING");
    rt.block_on(async {
        let a = TcpStream::connect(addr_a).await.unwrap();
        let _ = timeout_at(already_passed(), a.read_owned(Vec::with_capacity(64))).await;
        drop(a);
        let mut b = StdStream::connect(addr_b).unwrap();
        // Wait (blocking this turn) until the greeting is in b's receive queue.
        thread::sleep(Duration::from_millis(30));
        sleep(Duration::from_millis(30)).await;
        b.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut got = [0u8; 8];
        b.read_exact(&mut got).expect("the greeting was stolen by a dropped read");
        assert_eq!(&got, b"GREETING");
    });
}

/// A read whose future is dropped in the turn it was made loses no
/// bytes: the kernel never saw it.
#[hotloop::test(driver = "all")]
fn a_read_dropped_in_its_own_turn_loses_nothing(driver: DriverKind) {
    let rt = runtime(driver);
    rt.block_on(async {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = StdStream::connect(l.local_addr().unwrap()).unwrap();
        let s = l.accept_stream().await.unwrap();
        c.write_all(b"DATA").unwrap();
        sleep(Duration::from_millis(20)).await; // the bytes are in s's receive queue
        for _ in 0..10 {
            let r = timeout_at(already_passed(), s.read_owned(Vec::with_capacity(64))).await;
            if let Ok((res, buf)) = r {
                // epoll reads at once; that is fine, and the bytes are here.
                assert_eq!((res.unwrap(), &buf[..]), (4, &b"DATA"[..]));
                return;
            }
        }
        let (res, buf) = timeout(Duration::from_secs(2), s.read_owned(Vec::with_capacity(64)))
            .await
            .expect("the bytes were lost to a dropped read");
        assert_eq!(res.unwrap(), 4);
        assert_eq!(&buf[..], b"DATA");
    });
}

/// A single-shot accept armed right before its listener is dropped
/// never takes a connection meant for the next listener that gets the
/// same descriptor number.
#[hotloop::test(driver = "all")]
fn a_dropped_listeners_accept_never_takes_another_listeners_connection(driver: DriverKind) {
    let rt = runtime(driver);
    rt.block_on(async {
        let opts = ListenerOptions { accept_mode: AcceptMode::Single, ..Default::default() };
        let old = TcpListener::bind_with("127.0.0.1:0", opts.clone()).unwrap();
        // Arms an accept (single-shot on io_uring) and leaves it queued.
        assert!(timeout(Duration::from_millis(1), old.accept()).await.is_err());
        drop(old);
        let new = TcpListener::bind_with("127.0.0.1:0", opts).unwrap();
        let mut c = StdStream::connect(new.local_addr().unwrap()).unwrap();
        let (s, _) = timeout(Duration::from_secs(2), new.accept())
            .await
            .expect("the connection went to the dropped listener's accept")
            .unwrap();
        c.write_all(b"x").unwrap();
        let (res, buf) = s.read_owned(Vec::with_capacity(8)).await;
        assert_eq!((res.unwrap(), &buf[..]), (1, &b"x"[..]));
    });
}

/// A listener whose accept is armed, dropped after `block_on` returned,
/// stops accepting at once.
#[hotloop::test(driver = "all")]
fn a_listener_dropped_outside_its_runtime_stops_accepting(driver: DriverKind) {
    let rt = runtime(driver);
    let listener = rt.block_on(async {
        // An address of its own: a port freed by the drop may be bound
        // again at once by another test on 127.0.0.1.
        let l = TcpListener::bind("127.0.0.77:0").unwrap();
        // Arms the accept (multishot on io_uring) and leaves it armed.
        assert!(timeout(Duration::from_millis(20), l.accept()).await.is_err());
        l
    });
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let err = StdStream::connect(addr).expect_err("a dropped listener still accepts");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    drop(rt);
}

/// A stream with a read in flight, dropped after `block_on` returned,
/// closes at once: the peer sees the end of the stream.
#[hotloop::test(driver = "all")]
fn a_stream_dropped_outside_its_runtime_closes(driver: DriverKind) {
    let rt = runtime(driver);
    let l = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let stream = rt.block_on(async {
        let s = TcpStream::connect(addr).await.unwrap();
        // The read stays in the kernel until its cancel is processed.
        assert!(timeout(Duration::from_millis(20), s.read_owned(Vec::with_capacity(64)))
            .await
            .is_err());
        s
    });
    let (mut peer, _) = l.accept().unwrap();
    drop(stream);
    peer.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 8];
    let n = peer.read(&mut buf).expect("the peer never saw the stream close");
    assert_eq!(n, 0);
    drop(rt);
}

/// A write dropped while the kernel holds it (its peer reads nothing, so
/// 8 MiB cannot all go) keeps its buffer until the kernel is done with it,
/// then frees it; the stream stays usable for another write meanwhile.
/// (The writes before it went out zero-copy on io_uring: their bytes are
/// the kernel's until the peer acknowledges them or the connection ends,
/// so the peer goes away at the end.)
#[hotloop::test(driver = "all")]
fn a_write_dropped_in_the_kernel_frees_its_buffer_when_the_kernel_is_done(driver: DriverKind) {
    let rt = runtime(driver);
    let (addr, hold) = silent_peer();
    rt.block_on(async {
        let s = TcpStream::connect(addr).await.unwrap();
        let buf: std::sync::Arc<[u8]> = vec![7u8; 8 << 20].into();
        // A send may take part of the buffer: send it again until the
        // socket's buffers are full and one waits (is cut by the timeout).
        let mut cut = false;
        for _ in 0..64 {
            match timeout(Duration::from_millis(50), s.write_owned(buf.clone())).await {
                Err(_) => {
                    cut = true;
                    break;
                }
                Ok((result, _)) => assert!(result.unwrap() > 0),
            }
        }
        assert!(cut, "512 MiB went to a peer that reads nothing");
        // The stream takes another write while the dropped one winds down.
        let again = timeout(Duration::from_millis(50), s.write_owned(b"x".to_vec())).await;
        drop(again);
        drop(s);
        drop(hold);
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::sync::Arc::strong_count(&buf) > 1 && Instant::now() < deadline {
            sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(std::sync::Arc::strong_count(&buf), 1, "the dropped write's buffer was kept");
    });
    assert_zero_copy_when_forced(&rt);
}

/// In a child of [`zero_copy_writes_keep_their_bytes_until_the_kernel_is_done`]
/// (zero-copy forced), checks that the writes went out zero-copy.
fn assert_zero_copy_when_forced(rt: &Runtime) {
    if std::env::var("HOTLOOP_URING_SEND_ZC").as_deref() == Ok("always")
        && rt.stats().info.driver == "uring"
    {
        let total = rt.stats().total;
        assert!(total.send_zc + total.send_zc_copied >= 1, "no write went out zero-copy");
    }
}

/// The two tests above again on io_uring, each in a child process with
/// zero-copy sends forced (`HOTLOOP_URING_SEND_ZC=always`): a loopback
/// peer is local, so by default the driver sends it copying sends, and
/// the zero-copy sends' lifetimes (bytes the kernel's until their
/// notification) would go untested here.
#[test]
fn zero_copy_writes_keep_their_bytes_until_the_kernel_is_done() {
    if std::env::var_os("HOTLOOP_URING_SEND_ZC").is_some() || common::skip_uring() {
        return;
    }
    for test in [
        "ownership::a_write_dropped_in_the_kernel_frees_its_buffer_when_the_kernel_is_done::uring",
        "ownership::a_write_dropped_mid_flight_sends_only_its_own_bytes::uring",
    ] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--test-threads=1"])
            .env("HOTLOOP_URING_SEND_ZC", "always")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success() && text.contains("1 passed"), "{test}:\n{text}");
    }
}

/// The byte at `offset` of the stream [`a_write_dropped_mid_flight_sends_only_its_own_bytes`]
/// writes: never zero, the value a scribbled buffer takes.
fn pattern(offset: usize) -> u8 {
    1 + (offset % 251) as u8
}

/// Bytes that are zeroed when their last handle is dropped, as memory
/// handed back to the allocator and reused would change under a kernel
/// still reading it.
struct Zeroed(Vec<u8>);

impl Drop for Zeroed {
    fn drop(&mut self) {
        self.0.fill(0);
    }
}

/// An owned write buffer over shared [`Zeroed`] bytes: it can give the
/// driver another handle on them ([`IoBuf::share`]), so on io_uring a
/// large write of it goes out zero-copy.
///
/// [`IoBuf::share`]: hotloop::buf::IoBuf::share
struct Scribbled(std::rc::Rc<Zeroed>);

// SAFETY: the bytes are a Vec's heap block, never changed while an Rc on
// them lives (only the last one's drop zeroes them); a shared handle is an
// Rc clone.
unsafe impl hotloop::buf::IoBuf for Scribbled {
    fn stable_ptr(&self) -> *const u8 {
        self.0 .0.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.0 .0.len()
    }
    fn share(&self) -> Option<Box<dyn std::any::Any>> {
        Some(Box::new(self.0.clone()))
    }
}

/// Large owned writes to a peer that reads nothing until the last one is
/// cut by its deadline, each buffer's bytes zeroed when their last handle
/// is dropped: the peer, reading at last, gets exactly the bytes the
/// writes held and no zero. A zero would be bytes freed while the kernel
/// still read them: a zero-copy send's bytes are the kernel's until its
/// notification, which comes after its result, when the peer has
/// acknowledged them.
#[hotloop::test(driver = "all")]
fn a_write_dropped_mid_flight_sends_only_its_own_bytes(driver: DriverKind) {
    const WRITE: usize = 4 << 20;
    let rt = runtime(driver);
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (go, wait) = mpsc::channel::<()>();
    let peer = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let _ = wait.recv_timeout(Duration::from_secs(10));
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).map(|_| got)
    });
    let written = rt.block_on(async {
        let s = TcpStream::connect(addr).await.unwrap();
        let mut written = 0;
        let mut cut = false;
        for _ in 0..64 {
            let buf = Scribbled(Zeroed((written..written + WRITE).map(pattern).collect()).into());
            match timeout(Duration::from_millis(100), s.write_owned(buf)).await {
                Err(_) => {
                    cut = true;
                    break;
                }
                Ok((result, _)) => written += result.unwrap(),
            }
        }
        assert!(cut, "256 MiB went to a peer that reads nothing");
        go.send(()).unwrap();
        drop(s);
        written
    });
    assert_zero_copy_when_forced(&rt);
    drop(rt);
    let got = peer.join().unwrap().expect("the peer's read failed");
    assert!(got.len() >= written, "{} bytes reported written, {} received", written, got.len());
    let wrong = got.iter().enumerate().position(|(i, &b)| b != pattern(i));
    assert_eq!(wrong, None, "a byte out of place (0: a dropped buffer was still being sent)");
}
