//! `TcpStream` through tokio's and futures' I/O traits: partial reads and
//! writes, vectored writes, shutdown, peer reset and cancellation.

use std::io::{Read, Write};
use std::net::TcpStream as StdStream;
use std::time::Duration;

use hotloop::net::TcpListener;
use hotloop::DriverKind;
use hotloop::Runtime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Accepts one connection and runs `f` on it, while `client` talks to it.
fn with_pair<T: Send + 'static>(
    driver: DriverKind,
    client: impl FnOnce(StdStream) -> T + Send + 'static,
    server: impl AsyncFnOnce(hotloop::net::TcpStream),
) -> T {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    rt.block_on(async move {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let s = StdStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            client(s)
        });
        // accept_stream: a client that resets at once must still be handed over.
        let stream = l.accept_stream().await.unwrap();
        server(stream).await;
        t.join().unwrap()
    })
}

#[hotloop::test(driver = "all")]
fn tokio_traits_read_exact_and_write_all(driver: DriverKind) {
    let back = with_pair(
        driver,
        |mut c| {
            // Dribble the request in small pieces: the server sees partial reads.
            for chunk in b"hello, tokio traits".chunks(3) {
                c.write_all(chunk).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
            let mut back = vec![0u8; 19];
            c.read_exact(&mut back).unwrap();
            let mut rest = Vec::new();
            c.read_to_end(&mut rest).unwrap();
            (back, rest)
        },
        async |mut s| {
            let mut buf = [0u8; 19];
            s.read_exact(&mut buf).await.unwrap();
            AsyncWriteExt::write_all(&mut s, &buf).await.unwrap();
            let parts = [std::io::IoSlice::new(b"ab"), std::io::IoSlice::new(b"cd")];
            let n = AsyncWriteExt::write_vectored(&mut s, &parts).await.unwrap();
            assert!(n > 0);
            if n < 4 {
                AsyncWriteExt::write_all(&mut s, &b"abcd"[n..]).await.unwrap();
            }
            AsyncWriteExt::shutdown(&mut s).await.unwrap();
        },
    );
    assert_eq!(back.0, b"hello, tokio traits");
    assert_eq!(back.1, b"abcd");
}

#[hotloop::test(driver = "all")]
fn tokio_traits_report_a_peer_reset(driver: DriverKind) {
    with_pair(
        driver,
        |c| {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&c);
            let linger = libc::linger { l_onoff: 1, l_linger: 0 };
            // SAFETY: passes a live linger struct and its size.
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&linger as *const libc::linger).cast(),
                    8,
                );
            }
            drop(c);
        },
        async |mut s| {
            hotloop::time::sleep(Duration::from_millis(50)).await;
            let mut buf = [0u8; 8];
            match AsyncReadExt::read(&mut s, &mut buf).await {
                Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset),
                Ok(n) => assert_eq!(n, 0),
            }
        },
    );
}

#[hotloop::test(driver = "all")]
fn tokio_read_cancelled_mid_flight_loses_nothing(driver: DriverKind) {
    let got = with_pair(
        driver,
        |mut c| {
            std::thread::sleep(Duration::from_millis(200));
            c.write_all(b"after the timeouts").unwrap();
            let mut b = [0u8; 2];
            c.read_exact(&mut b).unwrap();
            b
        },
        async |mut s| {
            let mut buf = [0u8; 64];
            let mut cancelled = 0;
            let n = loop {
                match hotloop::time::timeout(
                    Duration::from_millis(2),
                    AsyncReadExt::read(&mut s, &mut buf),
                )
                .await
                {
                    Ok(r) => break r.unwrap(),
                    Err(_) => cancelled += 1,
                }
            };
            assert!(cancelled > 5);
            let mut got = buf[..n].to_vec();
            while got.len() < 18 {
                let n = AsyncReadExt::read(&mut s, &mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(got, b"after the timeouts");
            AsyncWriteExt::write_all(&mut s, b"ok").await.unwrap();
        },
    );
    assert_eq!(&got, b"ok");
}

#[hotloop::test(driver = "all")]
fn futures_traits_round_trip(driver: DriverKind) {
    let back = with_pair(
        driver,
        |mut c| {
            c.write_all(b"futures-io").unwrap();
            let mut back = Vec::new();
            c.read_to_end(&mut back).unwrap();
            back
        },
        async |mut s| {
            let mut buf = [0u8; 10];
            futures_util::AsyncReadExt::read_exact(&mut s, &mut buf).await.unwrap();
            futures_util::AsyncWriteExt::write_all(&mut s, &buf).await.unwrap();
            futures_util::AsyncWriteExt::close(&mut s).await.unwrap();
        },
    );
    assert_eq!(back, b"futures-io");
}

/// `AsyncWrite` promises nothing about what a caller passes after a
/// `Pending`: every `Ok(n)` counts bytes of the slice it was given, at
/// most its length, and the peer receives exactly the bytes counted.
#[hotloop::test(driver = "all")]
fn poll_write_counts_only_the_callers_bytes(driver: DriverKind) {
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (n_tx, n_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let received = with_pair(
        driver,
        move |mut c| {
            go_rx.recv().unwrap(); // the server filled the socket
            let mut all = Vec::new();
            c.read_to_end(&mut all).unwrap();
            (all, n_rx.recv().unwrap())
        },
        async move |mut s| {
            use std::pin::Pin;
            use tokio::io::AsyncWrite;
            let big = vec![b'a'; 64 * 1024];
            let mut expected = Vec::new();
            // Fill the socket until a write has to wait.
            loop {
                let r = std::future::poll_fn(|cx| {
                    std::task::Poll::Ready(Pin::new(&mut s).poll_write(cx, &big))
                })
                .await;
                match r {
                    std::task::Poll::Ready(Ok(n)) => {
                        assert!(n <= big.len());
                        expected.extend_from_slice(&big[..n]);
                    }
                    std::task::Poll::Ready(Err(e)) => panic!("{e}"),
                    std::task::Poll::Pending => break,
                }
            }
            go_tx.send(()).unwrap();
            // Now a different, one-byte slice.
            let n = std::future::poll_fn(|cx| Pin::new(&mut s).poll_write(cx, b"b")).await.unwrap();
            assert!(n <= 1, "poll_write returned {n} for a 1-byte slice");
            expected.extend_from_slice(&b"b"[..n]);
            AsyncWriteExt::shutdown(&mut s).await.unwrap();
            n_tx.send(expected).unwrap();
        },
    );
    let (all, expected) = received;
    assert_eq!(all.len(), expected.len(), "the peer got other bytes than were counted");
    assert!(all == expected, "the peer got other bytes than were counted");
}

/// Writes through the poll traits and owned-buffer writes, alternated on
/// one stream whose peer at first does not read: whether a write went
/// straight to the kernel, waited in a ring entry or behind the stream,
/// the peer receives every byte once, in the order written.
#[hotloop::test(driver = "all")]
fn write_styles_alternated_on_a_full_socket_keep_their_order(driver: DriverKind) {
    const CHUNK: usize = 48 * 1024 + 7; // not a multiple of any buffer size
    const CHUNKS: usize = 300; // about 14 MiB: more than loopback's socket buffers
    let pattern =
        |at: usize, len: usize| -> Vec<u8> { (at..at + len).map(|i| (i % 253) as u8).collect() };
    let received = with_pair(
        driver,
        |mut c| {
            std::thread::sleep(Duration::from_millis(200)); // the socket fills meanwhile
            c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut all = Vec::new();
            c.read_to_end(&mut all).unwrap();
            all
        },
        async move |mut s| {
            let mut at = 0;
            for i in 0..CHUNKS {
                let bytes = pattern(at, CHUNK);
                if i % 2 == 0 {
                    AsyncWriteExt::write_all(&mut s, &bytes).await.unwrap();
                } else {
                    let (res, _) = s.write_all_owned(bytes).await;
                    res.unwrap();
                }
                at += CHUNK;
            }
            AsyncWriteExt::shutdown(&mut s).await.unwrap();
        },
    );
    assert_eq!(received.len(), CHUNK * CHUNKS, "bytes lost or added");
    let wrong = received.iter().enumerate().position(|(i, b)| *b != (i % 253) as u8);
    assert_eq!(wrong, None, "a byte out of order");
}
