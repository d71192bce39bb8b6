//! One stream, every read and write style, with cancellation in between:
//! no byte is skipped, repeated or reordered, and every byte a write
//! reported reaches the peer, even when the stream is dropped unflushed.
//!
//! The styles are the owned-buffer `read_owned`, `read_pooled`, tokio's
//! `AsyncRead` and futures' `AsyncRead`; each pair of them alternates on
//! one stream while some reads are cut short by a timeout.

use std::io::{Read, Write};
use std::net::TcpStream as StdStream;
use std::pin::Pin;
use std::time::Duration;

use hotloop::net::{TcpListener, TcpStream};
use hotloop::time::timeout;
use hotloop::{DriverKind, Runtime};

/// How one read is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Owned,
    Pooled,
    Tokio,
    Futures,
}

const STYLES: [Style; 4] = [Style::Owned, Style::Pooled, Style::Tokio, Style::Futures];

/// The byte at position `i` of the test stream: never periodic at the
/// read sizes used, so a skipped or repeated run shows.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 7 + i / 251) % 253) as u8).collect()
}

/// The two stream types, which share one core: each read style on either.
trait Stream: tokio::io::AsyncRead + futures_io::AsyncRead + Unpin {
    async fn owned(&self, max: usize) -> std::io::Result<Vec<u8>>;
    async fn pooled(&self) -> std::io::Result<Vec<u8>>;
}

impl Stream for TcpStream {
    async fn owned(&self, max: usize) -> std::io::Result<Vec<u8>> {
        let (res, buf) = self.read_owned(Vec::with_capacity(max)).await;
        res.map(|_| buf)
    }
    async fn pooled(&self) -> std::io::Result<Vec<u8>> {
        self.read_pooled().await.map(|b| b.to_vec())
    }
}

impl Stream for hotloop::net::UnixStream {
    async fn owned(&self, max: usize) -> std::io::Result<Vec<u8>> {
        let (res, buf) = self.read_owned(Vec::with_capacity(max)).await;
        res.map(|_| buf)
    }
    async fn pooled(&self) -> std::io::Result<Vec<u8>> {
        self.read_pooled().await.map(|b| b.to_vec())
    }
}

/// Reads at most `max` bytes in `style` (a pooled read hands out what it
/// has); `Ok(empty)` at the end of the stream.
async fn read_once<S: Stream>(s: &mut S, style: Style, max: usize) -> std::io::Result<Vec<u8>> {
    match style {
        Style::Owned => s.owned(max).await,
        Style::Pooled => s.pooled().await,
        Style::Tokio => {
            let mut buf = vec![0u8; max];
            let n = tokio::io::AsyncReadExt::read(s, &mut buf).await?;
            buf.truncate(n);
            Ok(buf)
        }
        Style::Futures => {
            let mut buf = vec![0u8; max];
            let n = std::future::poll_fn(|cx| {
                futures_io::AsyncRead::poll_read(Pin::new(&mut *s), cx, &mut buf)
            })
            .await?;
            buf.truncate(n);
            Ok(buf)
        }
    }
}

/// How the hotloop side of a test connection is made: accepted sockets
/// are blocking on io_uring, connected ones non-blocking (the kernel then
/// answers `EAGAIN` and takes writes in parts).
#[derive(Debug, Clone, Copy)]
enum Side {
    Accepted,
    Connected,
}

/// Accepts one connection on a one-worker runtime and runs `server` on it
/// while `client` runs on a thread.
fn with_pair<T: Send + 'static, R>(
    driver: DriverKind,
    client: impl FnOnce(StdStream) -> T + Send + 'static,
    server: impl AsyncFnOnce(TcpStream) -> R,
) -> (T, R) {
    with_pair_as(driver, Side::Accepted, client, server)
}

/// [`with_pair`], with the hotloop side accepted or connected.
fn with_pair_as<T: Send + 'static, R>(
    driver: DriverKind,
    side: Side,
    client: impl FnOnce(StdStream) -> T + Send + 'static,
    server: impl AsyncFnOnce(TcpStream) -> R,
) -> (T, R) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    rt.block_on(async move {
        let (t, stream) = match side {
            Side::Accepted => {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = l.local_addr().unwrap();
                let t = std::thread::spawn(move || {
                    let s = StdStream::connect(addr).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    s.set_nodelay(true).unwrap();
                    client(s)
                });
                (t, l.accept_stream().await.unwrap())
            }
            Side::Connected => {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = l.local_addr().unwrap();
                let t = std::thread::spawn(move || {
                    let (s, _) = l.accept().unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    client(s)
                });
                (t, TcpStream::connect(addr).await.unwrap())
            }
        };
        let r = server(stream).await;
        // Wait for the client without blocking the worker: what a dropped
        // stream left to send goes on in the loop.
        while !t.is_finished() {
            hotloop::time::sleep(Duration::from_millis(2)).await;
        }
        (t.join().unwrap(), r)
    })
}

/// Sends `data` in uneven pieces with pauses, so reads see partial
/// arrivals, reads that wait, and reads cancelled while they wait.
fn dribble(mut c: StdStream, data: Vec<u8>) {
    let mut at = 0;
    let mut step = 0usize;
    while at < data.len() {
        let n = [1, 900, 17, 5000, 3, 20_000, 64][step % 7].min(data.len() - at);
        c.write_all(&data[at..at + n]).unwrap();
        at += n;
        step += 1;
        if step.is_multiple_of(3) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    c.shutdown(std::net::Shutdown::Write).unwrap();
    // Hold the socket open until the server has read everything.
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
}

/// Alternates `a` and `b` on one stream; every third read is under a
/// timeout short enough to cut some of them off while they wait.
async fn read_alternating<S: Stream>(mut s: S, a: Style, b: Style, len: usize) -> Vec<u8> {
    let sizes = [7usize, 1, 4096, 100, 65_536, 3];
    let mut got = Vec::with_capacity(len);
    let mut i = 0usize;
    let mut cancelled = 0;
    loop {
        let style = if i.is_multiple_of(2) { a } else { b };
        let max = sizes[i % sizes.len()];
        i += 1;
        let chunk = if i.is_multiple_of(3) {
            match timeout(Duration::from_micros(300), read_once(&mut s, style, max)).await {
                Ok(r) => r.unwrap(),
                Err(_) => {
                    cancelled += 1;
                    continue;
                }
            }
        } else {
            timeout(Duration::from_secs(20), read_once(&mut s, style, max))
                .await
                .expect("a read waited 20 s with bytes sent")
                .unwrap()
        };
        if chunk.is_empty() {
            break;
        }
        got.extend_from_slice(&chunk);
        assert!(got.len() <= len, "{a:?}/{b:?}: more bytes read than sent");
    }
    // Three reads of each style at least. (Fewer reads come when the
    // sender is done before the reader starts, on a loaded machine: the
    // pooled style then takes up to the driver's 64 KiB queue at once.)
    assert!(i >= 6, "{a:?}/{b:?}: too few reads to mix styles ({i}, {cancelled} cancelled)");
    got
}

#[hotloop::test(driver = "all")]
fn every_pair_of_read_styles_on_one_stream_loses_nothing(driver: DriverKind) {
    const LEN: usize = 120_000;
    for a in STYLES {
        for b in STYLES {
            let data = pattern(LEN);
            let sent = data.clone();
            // Both kinds of socket, in turn.
            let side = if (a as usize + b as usize).is_multiple_of(2) {
                Side::Accepted
            } else {
                Side::Connected
            };
            let ((), got) = with_pair_as(
                driver,
                side,
                move |c| dribble(c, data),
                async move |s| read_alternating(s, a, b, LEN).await,
            );
            assert_eq!(got.len(), sent.len(), "{driver:?} {a:?} then {b:?}: length");
            let first_bad = got.iter().zip(&sent).position(|(x, y)| x != y);
            assert_eq!(first_bad, None, "{driver:?} {a:?} then {b:?}: bytes differ");
        }
    }
}

/// A tokio `read_exact` for a header, then the body with owned reads (and
/// the other way round): the bytes the first style pulled in but did not
/// hand out are the next style's first bytes.
#[hotloop::test(driver = "all")]
fn a_header_by_read_exact_and_a_body_by_another_style(driver: DriverKind) {
    for body_style in STYLES {
        let data = pattern(50_000);
        let sent = data.clone();
        let ((), got) = with_pair(
            driver,
            move |mut c| {
                // Header and part of the body in one segment.
                c.write_all(&data[..3000]).unwrap();
                std::thread::sleep(Duration::from_millis(5));
                c.write_all(&data[3000..]).unwrap();
                c.shutdown(std::net::Shutdown::Write).unwrap();
                let _ = c.read_to_end(&mut Vec::new());
            },
            async move |mut s| {
                let mut head = [0u8; 10];
                tokio::io::AsyncReadExt::read_exact(&mut s, &mut head).await.unwrap();
                let mut got = head.to_vec();
                loop {
                    let chunk = read_once(&mut s, body_style, 4096).await.unwrap();
                    if chunk.is_empty() {
                        break got;
                    }
                    got.extend_from_slice(&chunk);
                }
            },
        );
        assert!(
            got == sent,
            "{driver:?}: tokio read_exact then {body_style:?} lost or moved bytes"
        );
    }
}

/// A tokio read cancelled while it waits (a timeout around it) leaves the
/// bytes that arrive afterwards to whichever style reads next.
#[hotloop::test(driver = "all")]
fn a_cancelled_borrowed_read_leaves_its_bytes_to_the_next_style(driver: DriverKind) {
    for next in STYLES {
        let ((), got) = with_pair(
            driver,
            |mut c| {
                std::thread::sleep(Duration::from_millis(50));
                c.write_all(b"arrived after the cancel").unwrap();
                c.shutdown(std::net::Shutdown::Write).unwrap();
                let _ = c.read_to_end(&mut Vec::new());
            },
            async move |mut s| {
                let mut buf = [0u8; 64];
                let r = timeout(
                    Duration::from_millis(5),
                    tokio::io::AsyncReadExt::read(&mut s, &mut buf),
                )
                .await;
                assert!(r.is_err(), "the read should have waited");
                // Let the bytes arrive (and any operation still armed take them).
                hotloop::time::sleep(Duration::from_millis(150)).await;
                let mut got = Vec::new();
                loop {
                    let chunk = read_once(&mut s, next, 64).await.unwrap();
                    if chunk.is_empty() {
                        break got;
                    }
                    got.extend_from_slice(&chunk);
                }
            },
        );
        assert_eq!(
            got, b"arrived after the cancel",
            "{driver:?}: tokio read cancelled, then {next:?}"
        );
    }
}

/// How a stream's last writes are made before it is dropped.
#[derive(Debug, Clone, Copy)]
enum WriteStyle {
    Tokio,
    Futures,
    /// tokio writes, then owned writes, alternating.
    Mixed,
}

/// Every byte `poll_write` reported reaches the peer, in order, when the
/// stream is dropped without a flush, also when the peer reads slowly so
/// that the kernel takes a write in parts.
#[hotloop::test(driver = "all")]
fn writes_reported_before_an_unflushed_drop_all_arrive(driver: DriverKind) {
    let cases = [WriteStyle::Tokio, WriteStyle::Futures, WriteStyle::Mixed]
        .into_iter()
        .flat_map(|style| [(style, Side::Accepted), (style, Side::Connected)]);
    for (style, side) in cases {
        const LEN: usize = 262_144;
        let data = pattern(LEN);
        let sent = data.clone();
        let (got, ()) = with_pair_as(
            driver,
            side,
            |mut c| {
                // A slow reader with a small window: the kernel takes the
                // server's writes in parts, also after the drop.
                socket2::SockRef::from(&c).set_recv_buffer_size(32 * 1024).unwrap();
                std::thread::sleep(Duration::from_millis(50));
                let mut got = Vec::new();
                let mut buf = [0u8; 2000];
                loop {
                    match c.read(&mut buf).unwrap() {
                        0 => break got,
                        n => got.extend_from_slice(&buf[..n]),
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
            },
            async move |mut s| {
                use std::io::IoSlice;
                s.set_send_buffer_size(4096).unwrap();
                let mut at = 0;
                let mut i = 0;
                while at < data.len() {
                    let end = (at + 10_000 + i * 3_000).min(data.len());
                    let n = match (style, i % 2) {
                        (WriteStyle::Tokio, _) | (WriteStyle::Mixed, 0) => {
                            tokio::io::AsyncWriteExt::write(&mut s, &data[at..end]).await.unwrap()
                        }
                        (WriteStyle::Futures, _) => std::future::poll_fn(|cx| {
                            futures_io::AsyncWrite::poll_write_vectored(
                                Pin::new(&mut s),
                                cx,
                                &[IoSlice::new(&data[at..end])],
                            )
                        })
                        .await
                        .unwrap(),
                        (WriteStyle::Mixed, _) => {
                            let (res, _) = s.write_all_owned(data[at..end].to_vec()).await;
                            res.unwrap();
                            end - at
                        }
                    };
                    assert!(n > 0);
                    at += n;
                    i += 1;
                }
                drop(s); // no flush, no shutdown
            },
        );
        assert_eq!(
            got.len(),
            sent.len(),
            "{driver:?} {style:?} {side:?}: bytes reported written were lost"
        );
        assert!(got == sent, "{driver:?} {style:?} {side:?}: bytes arrived out of order");
    }
}

/// An owned shutdown after borrowed writes sends the written bytes first.
#[hotloop::test(driver = "all")]
fn an_owned_shutdown_after_borrowed_writes_sends_them_first(driver: DriverKind) {
    let data = pattern(200_000);
    let sent = data.clone();
    let (got, ()) = with_pair(
        driver,
        |mut c| {
            std::thread::sleep(Duration::from_millis(50));
            let mut got = Vec::new();
            c.read_to_end(&mut got).unwrap();
            got
        },
        async move |mut s| {
            s.set_send_buffer_size(4096).unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut s, &data).await.unwrap();
            s.shutdown_with(std::net::Shutdown::Write).await.unwrap();
            // The stream stays open until the peer has everything.
            hotloop::time::sleep(Duration::from_millis(300)).await;
        },
    );
    assert!(got == sent, "{driver:?}: {} of {} bytes before the shutdown", got.len(), sent.len());
}

/// The same mix on a Unix domain stream pair (both ends on the worker; the
/// writer is a task of its own).
#[hotloop::test(driver = "all")]
async fn read_styles_mix_on_a_unix_stream(driver: DriverKind) {
    const LEN: usize = 60_000;
    for (a, b) in [
        (Style::Tokio, Style::Owned),
        (Style::Pooled, Style::Futures),
        (Style::Owned, Style::Pooled),
    ] {
        let (reader, writer) = hotloop::net::UnixStream::pair().unwrap();
        let data = pattern(LEN);
        let sent = data.clone();
        let w = hotloop::spawn(async move {
            let mut at = 0;
            let mut step = 0;
            while at < data.len() {
                let n = [1, 900, 17, 5000, 3, 64][step % 6].min(data.len() - at);
                let (res, _) = writer.write_all_owned(data[at..at + n].to_vec()).await;
                res.unwrap();
                at += n;
                step += 1;
                if step % 3 == 0 {
                    hotloop::time::sleep(Duration::from_millis(1)).await;
                }
            }
            writer.shutdown_with(std::net::Shutdown::Write).await.unwrap();
            writer
        });
        let got = read_alternating(reader, a, b, LEN).await;
        drop(w.await.unwrap());
        assert!(got == sent, "{driver:?} unix {a:?}/{b:?}: bytes lost or moved");
    }
}

/// Shutting down both sides cuts a connection at once, even with a
/// written-behind send stalled on a peer that never reads.
#[hotloop::test(driver = "all")]
fn a_full_shutdown_does_not_wait_for_a_stalled_write(driver: DriverKind) {
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    with_pair(
        driver,
        move |c| {
            go_rx.recv().unwrap(); // never reads before the server is done
            drop(c);
        },
        async move |mut s| {
            s.set_send_buffer_size(4096).unwrap();
            let chunk = vec![7u8; 64 * 1024];
            // Write until a write has to wait for the peer.
            while timeout(
                Duration::from_millis(200),
                tokio::io::AsyncWriteExt::write(&mut s, &chunk),
            )
            .await
            .is_ok()
            {}
            let cut =
                timeout(Duration::from_secs(3), s.shutdown_with(std::net::Shutdown::Both)).await;
            assert!(cut.is_ok(), "{driver:?}: shutdown(Both) waited for a peer that never reads");
            go_tx.send(()).unwrap();
        },
    );
}
