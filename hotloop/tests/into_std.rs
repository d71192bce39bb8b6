//! `TcpStream::into_std`: a connection leaves its worker's driver with
//! nothing lost on the way (bytes in the kernel or in io_uring's receive
//! queue, a peer's end or reset), and works on its next owner: another
//! worker, or the same one again.

use std::io::{self, Read, Write};
use std::net::TcpStream as StdStream;
use std::time::Duration;

use hotloop::net::{TcpListener, TcpStream};
use hotloop::time::{sleep, timeout};
use hotloop::DriverKind;
use hotloop::Runtime;

fn runtime(driver: DriverKind, workers: usize) -> Runtime {
    Runtime::builder().workers(workers).driver(driver).build().unwrap()
}

/// A listener, a connected peer and the accepted stream.
async fn pair() -> (StdStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = StdStream::connect(l.local_addr().unwrap()).unwrap();
    let s = l.accept_stream().await.unwrap();
    (c, s)
}

/// Reads `n` bytes from `s` (with owned reads; on io_uring the first one
/// arms the stream's multishot receive).
async fn read_exact(s: &TcpStream, n: usize) -> Vec<u8> {
    let mut got = Vec::new();
    while got.len() < n {
        let (res, b) =
            timeout(Duration::from_secs(5), s.read_owned(Vec::with_capacity(n - got.len())))
                .await
                .expect("bytes did not come");
        let k = res.unwrap();
        assert!(k > 0, "the peer's end before {n} bytes");
        got.extend_from_slice(&b[..k]);
    }
    got
}

/// Leaves the stream idle with a read waiting (io_uring: its multishot
/// receive armed in the kernel), then cancels the wait.
async fn arm_and_idle(s: &TcpStream) {
    assert!(timeout(Duration::from_millis(20), s.readable()).await.is_err(), "nothing was sent");
}

/// The moved stream as a blocking std stream with a bound on every read.
fn blocking(s: StdStream) -> StdStream {
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// A sender much faster than the reader: some bytes wait in the driver
/// (io_uring's receive queue, which refuses the move until they are
/// read), the rest in the kernel; the new owner reads every byte after
/// those, in order.
#[hotloop::test(driver = "all")]
fn bytes_pending_in_the_kernel_reach_the_new_owner(driver: DriverKind) {
    const TOTAL: usize = 1 << 20;
    let sent: Vec<u8> = (0..TOTAL as u32).map(|i| (i % 253) as u8).collect();
    let rt = runtime(driver, 1);
    let got = rt.block_on(async {
        let (mut c, s) = pair().await;
        let writer = {
            let sent = sent.clone();
            std::thread::spawn(move || c.write_all(&sent).unwrap())
        };
        let mut got = read_exact(&s, 1000).await;
        // Let the driver queue what it will before the move.
        sleep(Duration::from_millis(50)).await;
        let mut s = s;
        let moved = loop {
            match s.into_std().await {
                Ok(std) => break std,
                Err(e) => {
                    let (back, e) = e.into_parts();
                    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
                    let mut buf = vec![0; 64 * 1024];
                    loop {
                        match back.try_read(&mut buf) {
                            Ok(0) => panic!("the peer's end before every byte"),
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                            Err(e) => panic!("{e}"),
                        }
                    }
                    s = back;
                }
            }
        };
        let mut moved = blocking(moved);
        let mut rest = Vec::new();
        moved.read_to_end(&mut rest).unwrap();
        writer.join().unwrap();
        got.extend_from_slice(&rest);
        got
    });
    assert_eq!(got.len(), sent.len(), "bytes were lost in the move");
    assert!(got == sent, "bytes came out of order");
}

/// A stream whose receive is armed and idle moves to another worker, and
/// the bytes sent after the move reach that worker only: the old driver
/// has no receive left in the kernel to take them.
#[hotloop::test(driver = "all")]
fn an_idle_stream_moves_to_another_worker_and_works_there(driver: DriverKind) {
    let rt = runtime(driver, 1);
    let handle = rt.handle().clone();
    rt.block_on(async move {
        let (mut c, s) = pair().await;
        c.write_all(b"ping").unwrap();
        assert_eq!(read_exact(&s, 4).await, b"ping");
        arm_and_idle(&s).await;
        let moved = s.into_std().await.unwrap();
        c.write_all(b"after the move").unwrap();
        // The old worker turns its driver meanwhile: a receive still armed
        // there would take the bytes now.
        sleep(Duration::from_millis(20)).await;
        let served = handle.spawn_on(0, move || async move {
            let s = TcpStream::from_std(moved).unwrap();
            let got = read_exact(&s, 14).await;
            let (res, _) = s.write_all_owned(b"pong".to_vec()).await;
            res.unwrap();
            got
        });
        let got = timeout(Duration::from_secs(5), served).await.unwrap().unwrap();
        assert_eq!(got, b"after the move");
        let mut c = blocking(c);
        let mut pong = [0; 4];
        c.read_exact(&mut pong).unwrap();
        assert_eq!(&pong, b"pong");
    });
}

/// Moved out and back onto the same worker, a stream waits there again
/// (on epoll it must have left the interest list, or registering it
/// again fails with `EEXIST`).
#[hotloop::test(driver = "all")]
fn a_stream_moved_back_to_its_own_worker_waits_there(driver: DriverKind) {
    let rt = runtime(driver, 1);
    rt.block_on(async {
        let (mut c, s) = pair().await;
        c.write_all(b"one").unwrap();
        assert_eq!(read_exact(&s, 3).await, b"one");
        arm_and_idle(&s).await;
        let s = TcpStream::from_std(s.into_std().await.unwrap()).unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            c.write_all(b"two").unwrap();
            c
        });
        assert_eq!(read_exact(&s, 3).await, b"two");
        drop(writer.join().unwrap());
    });
}

/// A peer's end the driver already saw is seen by the new owner as the
/// end; a reset it already saw is reported, by the move or by the new
/// owner's read, never turned into a clean end.
#[hotloop::test(driver = "all")]
fn a_peer_close_before_the_move_is_seen_after_it(driver: DriverKind) {
    let rt = runtime(driver, 1);
    rt.block_on(async {
        let (c, s) = pair().await;
        arm_and_idle(&s).await;
        drop(c);
        timeout(Duration::from_secs(5), s.readable()).await.unwrap().unwrap();
        let mut moved = blocking(s.into_std().await.unwrap());
        assert_eq!(moved.read(&mut [0; 8]).unwrap(), 0, "the end after the move");

        let (c, s) = pair().await;
        arm_and_idle(&s).await;
        socket2::SockRef::from(&c).set_linger(Some(Duration::ZERO)).unwrap();
        drop(c);
        timeout(Duration::from_secs(5), s.readable()).await.unwrap().unwrap();
        match s.into_std().await {
            Err(e) => assert_eq!(e.error().kind(), io::ErrorKind::ConnectionReset, "{e}"),
            Ok(moved) => {
                let err = blocking(moved).read(&mut [0; 8]).expect_err("the reset was lost");
                assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
            }
        }
    });
}

/// The moved stream is non-blocking, accepted or connected, as
/// `TcpStream::into_std` says and tokio's `from_std` requires: a read of
/// an idle one answers `WouldBlock` at once rather than holding the thread.
#[hotloop::test(driver = "all")]
fn the_moved_stream_is_non_blocking(driver: DriverKind) {
    let rt = runtime(driver, 1);
    rt.block_on(async {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let connected = TcpStream::connect(addr).await.unwrap();
        let accepted = l.accept_stream().await.unwrap();
        arm_and_idle(&accepted).await;
        arm_and_idle(&connected).await;
        // Both moved before either is read: each is the other's peer.
        let accepted = accepted.into_std().await.unwrap();
        let connected = connected.into_std().await.unwrap();
        for (what, mut moved) in [("accepted", &accepted), ("connected", &connected)] {
            // A bound in case it blocks after all: a timeout then reads as
            // `WouldBlock` too, so the time it took is what tells.
            moved.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let started = std::time::Instant::now();
            let err = moved.read(&mut [0; 8]).expect_err("nothing was sent");
            assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{what}: {err}");
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "{what}: the read blocked for {:?}",
                started.elapsed()
            );
        }
    });
}
