//! Unix datagram sockets: bound sockets addressed by path, connected
//! sockets, an unnamed pair, an unbound sender, truncation to the buffer,
//! a receive that waits (and is cancel-safe), a sender held back by a full
//! queue; and `peer_cred` on Unix streams.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hotloop::net::{UnixDatagram, UnixListener, UnixStream};
use hotloop::time::{sleep, timeout};

const LIMIT: Duration = Duration::from_secs(10);

/// A fresh socket path in the temporary directory, removed when dropped.
struct TempPath(PathBuf);

impl TempPath {
    fn new(tag: &str) -> TempPath {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        TempPath(
            std::env::temp_dir()
                .join(format!("hotloop-dgram-{}-{tag}-{n}.sock", std::process::id())),
        )
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[hotloop::test(driver = "all")]
async fn bound_sockets_exchange_datagrams_by_path() {
    let (pa, pb) = (TempPath::new("a"), TempPath::new("b"));
    let a = UnixDatagram::bind(&pa.0).unwrap();
    let b = UnixDatagram::bind(&pb.0).unwrap();
    assert_eq!(a.send_to(b"hello", &pb.0).await.unwrap(), 5);
    let mut buf = [0u8; 64];
    let (n, from) = timeout(LIMIT, b.recv_from(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf[..n], b"hello");
    assert_eq!(from.as_pathname(), Some(pa.0.as_path()));
    assert_eq!(b.local_addr().unwrap().as_pathname(), Some(pb.0.as_path()));
    // Boundaries are kept: two sends, two receives.
    b.send_to(b"one", &pa.0).await.unwrap();
    b.send_to(b"two!", &pa.0).await.unwrap();
    assert_eq!(a.recv(&mut buf).await.unwrap(), 3);
    assert_eq!(a.recv(&mut buf).await.unwrap(), 4);
    assert_eq!(&buf[..4], b"two!");
}

#[hotloop::test(driver = "all")]
async fn connected_sockets_use_send_and_recv() {
    let (pa, pb) = (TempPath::new("a"), TempPath::new("b"));
    let a = UnixDatagram::bind(&pa.0).unwrap();
    let b = UnixDatagram::bind(&pb.0).unwrap();
    a.connect(&pb.0).unwrap();
    b.connect(&pa.0).unwrap();
    assert_eq!(a.peer_addr().unwrap().as_pathname(), Some(pb.0.as_path()));
    a.send(b"ping").await.unwrap();
    let mut buf = [0u8; 16];
    let n = timeout(LIMIT, b.recv(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf[..n], b"ping");
    b.send(b"pong").await.unwrap();
    let n = timeout(LIMIT, a.recv(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf[..n], b"pong");
}

#[hotloop::test(driver = "all")]
async fn a_pair_and_an_unbound_sender() {
    let (x, y) = UnixDatagram::pair().unwrap();
    x.send(b"over the pair").await.unwrap();
    let mut buf = [0u8; 64];
    let n = timeout(LIMIT, y.recv(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf[..n], b"over the pair");

    let path = TempPath::new("server");
    let server = UnixDatagram::bind(&path.0).unwrap();
    let client = UnixDatagram::unbound().unwrap();
    client.send_to(b"anon", &path.0).await.unwrap();
    let (n, from) = timeout(LIMIT, server.recv_from(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf[..n], b"anon");
    assert!(from.is_unnamed(), "an unbound sender has no address: {from:?}");
}

#[hotloop::test(driver = "all")]
async fn a_datagram_longer_than_the_buffer_is_cut() {
    let (x, y) = UnixDatagram::pair().unwrap();
    x.send(&[7u8; 100]).await.unwrap();
    x.send(b"next").await.unwrap();
    let mut small = [0u8; 10];
    assert_eq!(y.recv(&mut small).await.unwrap(), 10);
    // The rest of the first datagram is gone; the next one is whole.
    let mut buf = [0u8; 100];
    let n = y.recv(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"next");
}

#[hotloop::test(driver = "all")]
async fn a_waiting_receive_is_woken_and_a_cancelled_one_takes_nothing() {
    let (x, y) = UnixDatagram::pair().unwrap();
    let mut buf = [0u8; 16];
    // Cancelled while waiting: nothing lost.
    assert!(timeout(Duration::from_millis(20), y.recv(&mut buf)).await.is_err());
    let x = std::rc::Rc::new(x);
    let sender = x.clone();
    hotloop::spawn(async move {
        sleep(Duration::from_millis(20)).await;
        sender.send(b"late").await.unwrap();
    });
    let n = timeout(LIMIT, y.recv(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf[..n], b"late");
}

#[hotloop::test(driver = "all")]
async fn a_sender_waits_for_a_full_queue_to_drain() {
    const DATAGRAMS: usize = 2000;
    let (x, y) = UnixDatagram::pair().unwrap();
    // Far more than the receive queue holds: sends must wait for the reader.
    let writer = hotloop::spawn(async move {
        for i in 0..DATAGRAMS {
            x.send(&(i as u32).to_le_bytes()).await.unwrap();
        }
    });
    let mut buf = [0u8; 4];
    for i in 0..DATAGRAMS {
        let n = timeout(LIMIT, y.recv(&mut buf)).await.unwrap().unwrap();
        assert_eq!((n, u32::from_le_bytes(buf)), (4, i as u32));
    }
    timeout(LIMIT, writer).await.unwrap().unwrap();
}

/// A sender not connected to the receiver gets no wake-up from the kernel
/// when the receiver's full queue drains (only a connected peer is woken):
/// its `send_to` still goes out soon after the queue has room, unbound or
/// bound, by trying again after its pause.
#[hotloop::test(driver = "all")]
async fn an_unconnected_send_to_a_full_queue_goes_out_once_it_drains() {
    for bound in [false, true] {
        let (path, own) = (TempPath::new("full"), TempPath::new("sender"));
        let receiver = UnixDatagram::bind(&path.0).unwrap();
        // Another socket fills the receiver's queue until the kernel refuses.
        let filler = std::os::unix::net::UnixDatagram::unbound().unwrap();
        filler.set_nonblocking(true).unwrap();
        let mut queued = 0;
        loop {
            match filler.send_to(b"fill", &path.0) {
                Ok(_) => queued += 1,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("filling the queue: {e}"),
            }
            assert!(queued < 100_000, "the receiver's queue never filled");
        }
        let sender = if bound {
            UnixDatagram::bind(&own.0).unwrap()
        } else {
            UnixDatagram::unbound().unwrap()
        };
        let target = path.0.clone();
        let send = hotloop::spawn(async move { sender.send_to(b"late", &target).await });
        // Refused at least once before the queue drains.
        sleep(Duration::from_millis(50)).await;
        let mut buf = [0u8; 16];
        for _ in 0..queued {
            let n = timeout(LIMIT, receiver.recv(&mut buf)).await.unwrap().unwrap();
            assert_eq!(&buf[..n], b"fill");
        }
        let sent = timeout(Duration::from_secs(5), send)
            .await
            .unwrap_or_else(|_| panic!("the send (bound: {bound}) never went out"));
        assert_eq!(sent.unwrap().unwrap(), 4);
        let n = timeout(LIMIT, receiver.recv(&mut buf)).await.unwrap().unwrap();
        assert_eq!(&buf[..n], b"late");
    }
}

#[hotloop::test(driver = "all")]
async fn binding_a_taken_path_fails_clearly() {
    let path = TempPath::new("taken");
    let _first = UnixDatagram::bind(&path.0).unwrap();
    let err = UnixDatagram::bind(&path.0).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    assert!(err.to_string().contains(&*path.0.to_string_lossy()), "{err}");
}

#[hotloop::test(driver = "all")]
async fn peer_cred_names_this_process() {
    let me = std::process::id() as i32;
    let (uid, gid) = own_ids();
    let (a, b) = UnixStream::pair().unwrap();
    for s in [&a, &b] {
        let cred = s.peer_cred().unwrap();
        assert_eq!((cred.pid(), cred.uid(), cred.gid()), (Some(me), uid, gid));
    }
    let path = TempPath::new("listener");
    let listener = UnixListener::bind(&path.0).unwrap();
    let client = UnixStream::connect(&path.0).await.unwrap();
    let (server, _) = timeout(LIMIT, listener.accept()).await.unwrap().unwrap();
    assert_eq!(server.peer_cred().unwrap().pid(), Some(me));
    assert_eq!(client.peer_cred().unwrap().uid(), uid);
}

/// This process's uid and gid, read from `/proc/self/status`.
fn own_ids() -> (u32, u32) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> u32 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    (field("Uid:"), field("Gid:"))
}

/// An error the kernel reports on a datagram socket (its peer reconnected
/// elsewhere with a datagram unread: `ECONNRESET`) is returned once, and the
/// socket then waits for the next datagram as before (before, on epoll, the
/// error's readiness stayed for good: every later receive found nothing,
/// was told the socket was ready, and looped without yielding).
#[hotloop::test(driver = "all")]
fn an_error_on_a_datagram_socket_is_reported_once_then_it_waits(driver: hotloop::DriverKind) {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = hotloop::Runtime::builder().workers(1).driver(driver).build().unwrap();
        let outcome = rt.block_on(async {
            let other = TempPath::new("other");
            let _bound = UnixDatagram::bind(&other.0).unwrap();
            let (x, y) = UnixDatagram::pair().unwrap();
            let y = std::rc::Rc::new(y);
            y.send(b"a").await.unwrap();
            // `y` waits in a receive when the error comes, so the poller
            // sees it (an error taken before the poller looks is no event).
            let waiting = hotloop::spawn({
                let y = y.clone();
                async move {
                    let mut buf = [0u8; 16];
                    timeout(Duration::from_millis(500), y.recv(&mut buf)).await
                }
            });
            sleep(Duration::from_millis(20)).await;
            x.connect(&other.0).unwrap();
            let first = waiting.await.unwrap();
            let mut buf = [0u8; 16];
            let then = timeout(Duration::from_millis(100), y.recv(&mut buf)).await;
            (format!("{first:?}"), then.is_err())
        });
        let _ = done.send(outcome);
    });
    let (first, waited) = finished.recv_timeout(LIMIT).expect("the receive after the error spun");
    assert!(first.contains("ConnectionReset"), "{first}");
    assert!(waited, "a receive with nothing sent returned");
}

/// A name in Linux's abstract namespace (a leading NUL byte), as the docs
/// say: bound, sent to and connected to (std's path-taking calls refuse a
/// NUL in a path).
#[hotloop::test(driver = "all")]
async fn abstract_names_bind_connect_and_receive() {
    let name = format!("\0hotloop-dgram-abstract-{}", std::process::id());
    let a = UnixDatagram::bind(&name).unwrap();
    let b = UnixDatagram::unbound().unwrap();
    assert_eq!(b.send_to(b"to a name", &name).await.unwrap(), 9);
    let mut buf = [0u8; 32];
    let n = timeout(LIMIT, a.recv(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf[..n], b"to a name");
    b.connect(&name).unwrap();
    assert_eq!(b.send(b"again").await.unwrap(), 5);
    let n = timeout(LIMIT, a.recv(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf[..n], b"again");
}

/// Two tasks receiving on one socket, one of which gives up (a timeout):
/// the other still gets the datagram that arrives later (before, on
/// io_uring, the socket's one poll woke only the last task to wait, the one
/// that had given up).
#[hotloop::test(driver = "all")]
async fn two_receivers_on_one_socket_both_keep_their_wake_up() {
    let (x, y) = UnixDatagram::pair().unwrap();
    let y = std::rc::Rc::new(y);
    let patient = hotloop::spawn({
        let y = y.clone();
        async move {
            let mut buf = [0u8; 16];
            let n = timeout(LIMIT, y.recv(&mut buf)).await.unwrap().unwrap();
            buf[..n].to_vec()
        }
    });
    sleep(Duration::from_millis(10)).await;
    let mut buf = [0u8; 16];
    assert!(timeout(Duration::from_millis(10), y.recv(&mut buf)).await.is_err());
    x.send(b"late").await.unwrap();
    assert_eq!(
        timeout(Duration::from_secs(5), patient)
            .await
            .expect("the first receiver was never woken")
            .unwrap(),
        b"late"
    );
}
