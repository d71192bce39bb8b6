//! Unix domain sockets on both drivers: echo over a path and over a pair,
//! many connections at once (one listener and `serve_unix`), half-close,
//! a peer that goes away mid-stream, tokio's traits, the errors of a
//! missing or taken path, what binding removes (only a stale socket, and
//! only when asked), and no descriptor left open afterwards.

use crate::common::{self, TempDir};

use std::io::{Read, Write};
use std::net::Shutdown;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use hotloop::net::{serve_unix, ListenerOptions, UnixListener, UnixStream};
use hotloop::time::timeout;
use hotloop::DriverKind;
use hotloop::{spawn, Runtime};

/// A fresh socket path `NAME.sock` (nothing is there yet), in a directory
/// that goes, with the socket, when the returned guard is dropped: a
/// failed test leaves nothing behind.
fn sock_path(name: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new("unix");
    let path = dir.join(&format!("{name}.sock"));
    (dir, path)
}

/// Writes back what it reads (pooled reads) until the peer closes.
async fn echo(stream: UnixStream) {
    loop {
        let data = match stream.read_pooled().await {
            Ok(d) if !d.is_empty() => d,
            _ => return,
        };
        if stream.write_all_owned(data.to_vec()).await.0.is_err() {
            return;
        }
    }
}

/// Reads from `s` until `n` bytes came or the peer closed.
async fn read_n(s: &UnixStream, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < n {
        let (res, buf) = s.read_owned(Vec::with_capacity(4096)).await;
        match res.expect("read") {
            0 => break,
            _ => out.extend_from_slice(&buf),
        }
    }
    out
}

const LIMIT: Duration = Duration::from_secs(20);

#[hotloop::test(driver = "all")]
async fn echo_over_a_path() {
    let (_dir, path) = sock_path("echo");
    let listener = UnixListener::bind(&path).unwrap();
    assert_eq!(listener.local_addr().unwrap().as_pathname(), Some(path.as_path()));
    let client_path = path.clone();
    let client = spawn(async move {
        let s = UnixStream::connect(&client_path).await.unwrap();
        assert_eq!(s.peer_addr().unwrap().as_pathname(), Some(client_path.as_path()));
        assert!(s.local_addr().unwrap().is_unnamed());
        s.write_all_owned(b"hello over a path".to_vec()).await.0.unwrap();
        let back = read_n(&s, 17).await;
        s.shutdown_with(Shutdown::Write).await.unwrap();
        assert_eq!(read_n(&s, 1).await, b"", "the server closed after our end");
        back
    });
    let (stream, peer) = timeout(LIMIT, listener.accept()).await.unwrap().unwrap();
    assert!(peer.is_unnamed(), "the client did not bind");
    assert_eq!(stream.local_addr().unwrap().as_pathname(), Some(path.as_path()));
    timeout(LIMIT, echo(stream)).await.unwrap();
    assert_eq!(client.await.unwrap(), b"hello over a path");
}

#[hotloop::test(driver = "all")]
async fn echo_over_an_abstract_name() {
    let name =
        format!("\0hotloop-abstract-{}-{:?}", std::process::id(), std::thread::current().id());
    let listener = UnixListener::bind(&name).unwrap();
    let client = spawn({
        let name = name.clone();
        async move {
            let s = UnixStream::connect(&name).await.unwrap();
            s.write_all_owned(b"abstract".to_vec()).await.0.unwrap();
            read_n(&s, 8).await
        }
    });
    let (stream, _) = timeout(LIMIT, listener.accept()).await.unwrap().unwrap();
    let data = read_n(&stream, 8).await;
    stream.write_all_owned(data).await.0.unwrap();
    assert_eq!(client.await.unwrap(), b"abstract");
}

#[hotloop::test(driver = "all")]
async fn a_pair_talks_both_ways() {
    let (a, b) = UnixStream::pair().unwrap();
    assert!(a.local_addr().unwrap().is_unnamed());
    assert!(b.peer_addr().unwrap().is_unnamed());
    let n = a.write_vectored_owned(vec![b"one ".to_vec(), b"two".to_vec()]).await.0.unwrap();
    assert_eq!(n, 7);
    assert_eq!(timeout(LIMIT, read_n(&b, 7)).await.unwrap(), b"one two");
    b.write_all_owned(b"back".to_vec()).await.0.unwrap();
    let got = timeout(LIMIT, a.read_pooled()).await.unwrap().unwrap();
    assert_eq!(&got[..], b"back");
    // Bigger than a socket buffer: the writer waits for the reader.
    let big: Vec<u8> = (0..1_000_000u32).map(|i| i as u8).collect();
    let a = Rc::new(a);
    let writer = spawn({
        let a = a.clone();
        let big = big.clone();
        async move { a.write_all_owned(big).await.0.unwrap() }
    });
    let got = timeout(LIMIT, read_n(&b, big.len())).await.unwrap();
    writer.await.unwrap();
    assert!(got == big, "a megabyte arrives whole and in order");
    // A shared buffer that large goes out zero-copy on io_uring, which a
    // Unix socket refuses: the write falls back to a copying send.
    let shared: std::sync::Arc<[u8]> = big.clone().into();
    let writer = spawn({
        let a = a.clone();
        async move { a.write_all_owned(shared).await.0.unwrap() }
    });
    let got = timeout(LIMIT, read_n(&b, big.len())).await.unwrap();
    writer.await.unwrap();
    assert!(got == big, "a shared megabyte arrives whole and in order");
}

#[hotloop::test(driver = "all")]
async fn many_connections_at_once_on_one_listener() {
    const CLIENTS: usize = 200;
    let (_dir, path) = sock_path("many");
    let listener = UnixListener::bind(&path).unwrap();
    let server = spawn(async move {
        for _ in 0..CLIENTS {
            let s = listener.accept_stream().await.unwrap();
            spawn(echo(s));
        }
    });
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let path = path.clone();
            spawn(async move {
                let s = UnixStream::connect(&path).await.unwrap();
                let msg = format!("client {i}");
                s.write_all_owned(msg.clone().into_bytes()).await.0.unwrap();
                assert_eq!(read_n(&s, msg.len()).await, msg.as_bytes());
            })
        })
        .collect();
    for c in clients {
        timeout(LIMIT, c).await.unwrap().unwrap();
    }
    timeout(LIMIT, server).await.unwrap().unwrap();
}

#[hotloop::test(driver = "all")]
async fn connect_waits_while_the_backlog_is_full() {
    let (_dir, path) = sock_path("backlog");
    let options = ListenerOptions { backlog: 1, ..Default::default() };
    let listener = UnixListener::bind_with(&path, options).unwrap();
    // More connects than the backlog holds, before anyone accepts.
    let clients: Vec<_> = (0..6)
        .map(|_| {
            let path = path.clone();
            spawn(async move { UnixStream::connect(&path).await.map(drop) })
        })
        .collect();
    hotloop::time::sleep(Duration::from_millis(30)).await;
    let server = spawn(async move {
        for _ in 0..6 {
            drop(listener.accept_stream().await.unwrap());
        }
    });
    for c in clients {
        timeout(LIMIT, c).await.unwrap().unwrap().expect("connect succeeds once there is room");
    }
    timeout(LIMIT, server).await.unwrap().unwrap();
}

#[test]
fn serve_unix_serves_many_clients_from_two_workers() {
    for driver in [DriverKind::Epoll, DriverKind::Uring] {
        if driver == DriverKind::Uring && common::skip_uring() {
            continue;
        }
        let (_dir, path) = sock_path("serve");
        let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
        let server = serve_unix(rt.handle(), &path, ListenerOptions::default(), echo).unwrap();
        assert_eq!(server.local_addr(), path);
        let threads: Vec<_> = (0..32)
            .map(|i| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
                    s.set_read_timeout(Some(LIMIT)).unwrap();
                    for round in 0..10 {
                        let msg = format!("client {i} round {round}\n");
                        s.write_all(msg.as_bytes()).unwrap();
                        let mut back = vec![0; msg.len()];
                        s.read_exact(&mut back).unwrap();
                        assert_eq!(back, msg.as_bytes());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let stats = rt.handle().stats();
        let per_worker: Vec<u64> = stats.workers.iter().map(|w| w.accepted).collect();
        eprintln!("{driver:?}: connections accepted per worker {per_worker:?}");
        assert_eq!(stats.total.accepted, 32, "every client was accepted once");
        let left = server.shutdown_blocking(Duration::from_secs(5));
        assert_eq!(left, 0, "every connection ended ({driver:?})");
        assert!(path.exists(), "stopping leaves the socket file");
        drop(rt);
    }
}

#[hotloop::test(driver = "all")]
async fn half_close_keeps_the_other_direction() {
    let (client, server) = UnixStream::pair().unwrap();
    client.write_all_owned(b"request".to_vec()).await.0.unwrap();
    client.shutdown_with(Shutdown::Write).await.unwrap();
    // The server sees the request, then the end of it.
    assert_eq!(timeout(LIMIT, read_n(&server, 100)).await.unwrap(), b"request");
    // The other direction still works.
    server.write_all_owned(b"reply after your end".to_vec()).await.0.unwrap();
    server.shutdown_with(Shutdown::Write).await.unwrap();
    assert_eq!(timeout(LIMIT, read_n(&client, 100)).await.unwrap(), b"reply after your end");
    // Writing on the half the client shut down fails.
    let (res, _) = client.write_owned(b"late".to_vec()).await;
    assert_eq!(res.unwrap_err().kind(), std::io::ErrorKind::BrokenPipe);
}

#[hotloop::test(driver = "all")]
async fn a_peer_that_goes_away_mid_stream() {
    // Closed mid-message: the reader gets what was sent, then the end.
    let (a, b) = UnixStream::pair().unwrap();
    a.write_all_owned(b"half a mess".to_vec()).await.0.unwrap();
    drop(a);
    assert_eq!(timeout(LIMIT, read_n(&b, 100)).await.unwrap(), b"half a mess");
    let (res, _) = b.write_owned(b"anyone?".to_vec()).await;
    assert_eq!(res.unwrap_err().kind(), std::io::ErrorKind::BrokenPipe);

    // Closed with unread data: the kernel reports a reset to the writer.
    let (a, b) = UnixStream::pair().unwrap();
    b.write_all_owned(b"never read".to_vec()).await.0.unwrap();
    drop(a);
    let (res, _) = timeout(LIMIT, b.read_owned(Vec::with_capacity(64))).await.unwrap();
    match res {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset),
        Ok(n) => assert_eq!(n, 0, "a reset or a clean end, never data"),
    }
    let (res, _) = b.write_owned(b"anyone?".to_vec()).await;
    assert!(res.is_err(), "writing to a closed peer fails");

    // A reader parked in a read is woken by the close.
    let (a, b) = UnixStream::pair().unwrap();
    let reader =
        spawn(async move { b.read_owned(Vec::with_capacity(64)).await.0.map_err(|e| e.kind()) });
    hotloop::time::sleep(Duration::from_millis(20)).await;
    drop(a);
    assert_eq!(timeout(LIMIT, reader).await.unwrap().unwrap(), Ok(0));
}

/// A stream dropped while its writes wait for a peer that reads nothing
/// closes its socket at once, as on epoll: the peer's own write then fails
/// (`EPIPE`), and it reads exactly the bytes the writes reported taken,
/// then the end. (On io_uring a Unix stream is never written behind:
/// before, the bytes written behind kept the dropped stream's socket open
/// for as long as the peer read nothing.)
#[hotloop::test(driver = "all")]
async fn a_stream_dropped_with_its_peer_full_closes_at_once() {
    use tokio::io::AsyncWriteExt;
    let (_dir, path) = sock_path("full");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let mut ours = UnixStream::connect(&path).await.unwrap();
    let (mut peer, _) = listener.accept().unwrap();
    let chunk = vec![7u8; 64 * 1024];
    let mut reported = 0;
    while let Ok(written) = timeout(Duration::from_millis(100), ours.write(&chunk)).await {
        reported += written.unwrap();
        assert!(reported < 64 << 20, "64 MiB went to a peer that reads nothing");
    }
    drop(ours);
    // The runtime runs on: nothing may keep the socket for the writes.
    hotloop::time::sleep(Duration::from_millis(50)).await;
    peer.set_nonblocking(true).unwrap();
    let err = peer.write(b"x").expect_err("the dropped stream's socket is still open");
    assert_eq!(err.raw_os_error(), Some(libc::EPIPE), "{err}");
    peer.set_nonblocking(false).unwrap();
    peer.set_read_timeout(Some(LIMIT)).unwrap();
    let mut got = Vec::new();
    peer.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), reported, "the peer read other than the bytes reported taken");
}

#[hotloop::test(driver = "all")]
async fn tokio_traits_echo_with_copy() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_dir, path) = sock_path("tokio");
    let listener = UnixListener::bind(&path).unwrap();
    let server = spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let (mut r, mut w) = tokio::io::split(stream);
        let n = tokio::io::copy(&mut r, &mut w).await.unwrap();
        w.shutdown().await.unwrap();
        n
    });
    let client = UnixStream::connect(&path).await.unwrap();
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    // Write and read at once, through the traits: the echo flows back while we send.
    let (mut r, mut w) = tokio::io::split(client);
    let writer = spawn({
        let payload = payload.clone();
        async move {
            w.write_all(&payload).await.unwrap();
            w.shutdown().await.unwrap();
        }
    });
    let mut back = Vec::new();
    timeout(LIMIT, r.read_to_end(&mut back)).await.unwrap().unwrap();
    assert!(back == payload, "the echo came back whole");
    timeout(LIMIT, writer).await.unwrap().unwrap();
    assert_eq!(timeout(LIMIT, server).await.unwrap().unwrap(), payload.len() as u64);
}

#[hotloop::test(driver = "all")]
async fn connecting_to_a_missing_path_says_not_found() {
    let (dir, path) = sock_path("missing");
    let err = UnixStream::connect(&path).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    assert!(err.to_string().contains(path.to_str().unwrap()), "the error names the path: {err}");

    // A socket file nobody listens on refuses.
    let stale = dir.join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    let err = UnixStream::connect(&stale).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);

    // A path longer than a socket address can hold is bad input.
    let long = std::env::temp_dir().join("x".repeat(200));
    let err = UnixStream::connect(&long).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

#[hotloop::test(driver = "all")]
async fn binding_removes_only_a_stale_socket_and_only_when_asked() {
    let (dir, path) = sock_path("bind");

    // Dropping a listener leaves its file; binding again is refused.
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists(), "dropping the listener removed nothing");
    let err = UnixListener::bind(&path).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    assert!(err.to_string().contains("remove_stale_socket"), "the error says what to do: {err}");

    // Asked to, a bind replaces the stale socket.
    let replace = ListenerOptions { remove_stale_socket: true, ..Default::default() };
    let live = UnixListener::bind_with(&path, replace.clone()).unwrap();

    // A socket someone listens on is never removed...
    let err = UnixListener::bind_with(&path, replace.clone()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    assert!(path.exists());
    // ...and the live listener still takes connections (the probe's
    // connection, which it sees first, then ours).
    let client = spawn({
        let path = path.clone();
        async move { UnixStream::connect(&path).await.unwrap() }
    });
    let probe = timeout(LIMIT, live.accept_stream()).await.unwrap().unwrap();
    drop(probe);
    let _ours = timeout(LIMIT, live.accept_stream()).await.unwrap().unwrap();
    drop(client.await.unwrap());
    drop(live);

    // Nor is a file that is not a socket.
    let file = dir.join("regular");
    std::fs::write(&file, b"keep me").unwrap();
    let err = UnixListener::bind_with(&file, replace).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    // Dropping a listener elsewhere leaves this file alone too.
    let other = dir.join("other.sock");
    drop(UnixListener::bind(&other).unwrap());
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
}

/// Counts descriptors around a runtime's life on `driver` that does all of
/// the above, failures included.
fn exercise(driver: DriverKind, dir: &Path) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    rt.block_on(async {
        let path = dir.join("fds.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let accepted = spawn(async move {
            for _ in 0..20 {
                let s = listener.accept_stream().await.unwrap();
                spawn(echo(s));
            }
        });
        for _ in 0..20 {
            let s = UnixStream::connect(&path).await.unwrap();
            s.write_all_owned(b"x".to_vec()).await.0.unwrap();
            assert_eq!(read_n(&s, 1).await, b"x");
        }
        timeout(LIMIT, accepted).await.unwrap().unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        drop((a, b));
        assert!(UnixStream::connect(dir.join("missing")).await.is_err());
        assert!(UnixListener::bind(&path).is_err());
    });
    drop(rt);
    let path = dir.join("server.sock");
    let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
    let server = serve_unix(rt.handle(), &path, ListenerOptions::default(), echo).unwrap();
    let mut c = std::os::unix::net::UnixStream::connect(&path).unwrap();
    c.write_all(b"y").unwrap();
    let mut one = [0u8];
    c.read_exact(&mut one).unwrap();
    drop(c);
    server.shutdown_blocking(Duration::from_secs(5));
    drop(rt);
}

#[test]
fn no_descriptor_is_left_open() {
    // Counted in a process of its own: the tests running beside this one
    // open and close descriptors of their own.
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &harness_name("count_descriptors_alone"),
            "--ignored",
            "--test-threads=1",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let said = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{said}");
    assert!(stdout.contains("1 passed"), "the count ran: {said}");
}

#[test]
#[ignore = "run by no_descriptor_is_left_open, alone in a process of its own"]
fn count_descriptors_alone() {
    for driver in [DriverKind::Epoll, DriverKind::Uring] {
        if driver == DriverKind::Uring && common::skip_uring() {
            continue;
        }
        let dir = TempDir::new(&format!("unix-fds-{driver:?}"));
        // The process-wide parts (the tokio runtime the default feature
        // `tokio-time` hosts keeps its reactor's descriptors for the life of
        // the process) start with the first runtime: count from after them.
        drop(Runtime::builder().workers(1).driver(driver).build().unwrap());
        let before = hotloop::open_fd_count().unwrap();
        exercise(driver, dir.path());
        assert_eq!(hotloop::open_fd_count().unwrap(), before, "{driver:?} closed everything");
    }
}

#[cfg(feature = "futures-io")]
#[hotloop::test(driver = "all")]
async fn futures_traits_over_a_pair() {
    use futures_util::io::{AsyncReadExt, AsyncWriteExt};
    let (mut a, mut b) = UnixStream::pair().unwrap();
    // The traits' methods by path: the inherent owned-buffer ones share their names.
    AsyncWriteExt::write_all(&mut a, b"through futures-io").await.unwrap();
    AsyncWriteExt::close(&mut a).await.unwrap();
    let mut got = Vec::new();
    timeout(LIMIT, AsyncReadExt::read_to_end(&mut b, &mut got)).await.unwrap().unwrap();
    assert_eq!(got, b"through futures-io");
}

/// The name the test harness knows `name` by: prefixed with this file's
/// module path below the test crate (`file::name` in `tests/suite.rs`, just
/// `name` in a binary of its own), for running one test in a child.
fn harness_name(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}
