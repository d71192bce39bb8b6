//! The `TcpStream` calls a tokio user reaches for: `readable`/`try_read`,
//! `writable`/`try_write`, `from_std`, and `into_split`/`split` with
//! tokio's I/O traits on the halves, on both drivers.

use std::io::{Read, Write};
use std::time::Duration;

use hotloop::net::{TcpListener, TcpStream};
use hotloop::time::timeout;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A connected pair: (client, server side).
async fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (server, _) = listener.accept().await.unwrap();
    (client, server)
}

/// Reads with `readable` and `try_read` until `want` bytes or the end.
async fn read_by_readiness(s: &TcpStream, want: usize) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 7];
    while got.len() < want {
        s.readable().await.unwrap();
        match s.try_read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    }
    got
}

/// `input_pending` tells whether the peer sent bytes (or its end) that no
/// read has taken, wherever they wait: on io_uring the multishot receive
/// moves them out of the kernel's queue into the driver's once the stream
/// has been read, where a peek (`InputProbe::pending`) no longer sees
/// them. A server deciding whether to linger before a close asks this.
#[hotloop::test(driver = "all")]
async fn input_pending_sees_bytes_the_driver_holds() {
    let (client, server) = pair().await;
    assert!(!server.input_pending().unwrap(), "nothing was sent");
    // A read that waits (on io_uring: the receive is armed from then on).
    let server = std::rc::Rc::new(server);
    let first = hotloop::spawn({
        let server = server.clone();
        async move { server.read_pooled().await.unwrap().to_vec() }
    });
    hotloop::time::sleep(Duration::from_millis(20)).await;
    client.write_all_owned(b"first".to_vec()).await.0.unwrap();
    assert_eq!(first.await.unwrap(), b"first");
    client.write_all_owned(b"next".to_vec()).await.0.unwrap();
    // Time for the bytes to arrive (and on io_uring, to be received).
    hotloop::time::sleep(Duration::from_millis(50)).await;
    assert!(server.input_pending().unwrap(), "unread bytes were not seen");
    assert_eq!(&server.read_pooled().await.unwrap()[..], b"next");
    assert!(!server.input_pending().unwrap(), "the bytes were read");
    drop(client);
    hotloop::time::sleep(Duration::from_millis(50)).await;
    assert!(server.input_pending().unwrap(), "the peer's end was not seen");
}

#[hotloop::test(driver = "all")]
async fn readable_and_try_read_take_what_the_peer_sent() {
    let (client, server) = pair().await;
    let mut buf = [0u8; 16];
    let nothing = server.try_read(&mut buf).unwrap_err();
    assert_eq!(nothing.kind(), std::io::ErrorKind::WouldBlock);
    // Nothing sent: `readable` waits.
    assert!(timeout(Duration::from_millis(50), server.readable()).await.is_err());
    let (res, _) = client.write_all_owned(b"hello, readiness".to_vec()).await;
    res.unwrap();
    // Part by readiness, the rest by another read style: nothing is lost between them.
    // Two reads of 7 bytes (the helper's buffer), then the last 2 by an owned read.
    assert_eq!(read_by_readiness(&server, 14).await, b"hello, readine");
    let (res, rest) = server.read_owned(Vec::with_capacity(16)).await;
    res.unwrap();
    assert_eq!(rest, b"ss");
    drop(client);
    assert_eq!(read_by_readiness(&server, 1).await, b"", "the peer's end reads as Ok(0)");
}

#[hotloop::test(driver = "all")]
async fn writable_and_try_write_fill_a_socket_and_wait_for_room() {
    let (client, server) = pair().await;
    client.set_send_buffer_size(4096).unwrap();
    server.set_recv_buffer_size(4096).unwrap();
    let chunk = vec![7u8; 16 * 1024];
    let mut taken = 0usize;
    let mut full = false;
    // Until the socket (or the write in flight) takes nothing more: then
    // `writable` waits. A `writable` that returned at once while
    // `try_write` found no room would spin here until the bound.
    for _ in 0..10_000 {
        match timeout(Duration::from_millis(200), client.writable()).await {
            Err(_) => {
                full = true;
                break;
            }
            Ok(r) => r.unwrap(),
        }
        match client.try_write(&chunk) {
            Ok(n) => taken += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert!(full, "writable never waited: {taken} bytes taken");
    assert!(taken > 0);
    // The peer drains it: room again, and every byte taken arrives.
    let reader = hotloop::spawn(async move {
        let mut total = 0usize;
        loop {
            let (res, _) = server.read_owned(Vec::with_capacity(64 * 1024)).await;
            match res.unwrap() {
                0 => return total,
                n => total += n,
            }
        }
    });
    timeout(Duration::from_secs(10), client.writable()).await.unwrap().unwrap();
    let more = client.try_write(b"end");
    let taken = taken + more.unwrap_or(0);
    client.shutdown_with(std::net::Shutdown::Write).await.unwrap();
    assert_eq!(reader.await.unwrap(), taken);
}

#[hotloop::test(driver = "all")]
async fn from_std_wraps_a_connected_std_stream() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // A blocking connect on the blocking pool, then the socket on this worker.
    let std_stream =
        hotloop::spawn_blocking(move || std::net::TcpStream::connect(addr)).await.unwrap().unwrap();
    let client = TcpStream::from_std(std_stream).unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let (res, _) = client.write_all_owned(b"std".to_vec()).await;
    res.unwrap();
    assert_eq!(read_by_readiness(&server, 3).await, b"std");
    assert_eq!(client.peer_addr().unwrap(), addr);
}

#[hotloop::test(driver = "all")]
async fn owned_halves_read_and_write_in_two_tasks_and_the_write_half_ends_the_side() {
    // A peer on a plain thread: echoes what it reads, and closes after the
    // client's write side ends.
    let peer = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = peer.local_addr().unwrap();
    let echo = std::thread::spawn(move || {
        let (mut s, _) = peer.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap();
        s.write_all(&all).unwrap();
        all.len()
    });
    let (read, mut write) = TcpStream::connect(addr).await.unwrap().into_split();
    let reader = hotloop::spawn(async move {
        let mut read = read;
        let mut got = Vec::new();
        read.read_to_end(&mut got).await.unwrap();
        got
    });
    write.write_all(b"through ").await.unwrap();
    let (res, _) = write.write_all_owned(b"the halves".to_vec()).await;
    res.unwrap();
    // Dropping the write half ends the write side: the peer's read_to_end returns.
    drop(write);
    assert_eq!(reader.await.unwrap(), b"through the halves");
    assert_eq!(echo.join().unwrap(), 18);
}

/// The write half dropped while a write is still on its way (io_uring
/// writes behind) to a peer that never reads: the socket is let go within
/// a dropped stream's send deadline (io_uring: the driver shuts the write
/// side after the bytes or cuts the connection at the deadline), not held
/// by a task waiting for as long as the peer stays silent. On epoll the
/// bytes are in the kernel and the descriptor closes with the halves.
#[hotloop::test(driver = "all")]
async fn a_write_half_dropped_towards_a_peer_that_never_reads_lets_the_socket_go() {
    use std::os::fd::AsRawFd;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    peer.set_recv_buffer_size(4096).unwrap();
    peer.connect(&addr.into()).unwrap();
    let (server, _) = listener.accept().await.unwrap();
    socket2::SockRef::from(&server).set_send_buffer_size(4096).unwrap();
    // The socket's entry in the descriptor table, which another test's
    // socket may take once it is free: the link names this one's inode.
    let entry = format!("/proc/self/fd/{}", server.as_raw_fd());
    let link = std::fs::read_link(&entry).unwrap();
    let (read, mut write) = server.into_split();
    let chunk = vec![7u8; 64 * 1024];
    let mut stalled = false;
    for _ in 0..512 {
        if timeout(Duration::from_millis(200), write.write(&chunk)).await.is_err() {
            stalled = true;
            break;
        }
    }
    assert!(stalled, "a peer that never reads took 32 MiB");
    drop(write);
    drop(read);
    let started = std::time::Instant::now();
    while std::fs::read_link(&entry).ok().as_ref() == Some(&link) {
        assert!(
            started.elapsed() < Duration::from_secs(9),
            "the socket is still open {:?} after its halves were dropped",
            started.elapsed()
        );
        hotloop::time::sleep(Duration::from_millis(50)).await;
    }
    drop(peer);
}

#[hotloop::test(driver = "all")]
async fn halves_reunite_only_with_their_own_stream() {
    let (a, _a_peer) = pair().await;
    let (b, _b_peer) = pair().await;
    let (a_read, a_write) = a.into_split();
    let (b_read, b_write) = b.into_split();
    let hotloop::net::ReuniteError(a_read, b_write) = a_read.reunite(b_write).unwrap_err();
    let a = a_read.reunite(a_write).expect("the halves of one stream");
    let b = b_write.reunite(b_read).expect("the halves of one stream");
    // Reunited, the streams work and were not shut down.
    let (res, _) = a.write_all_owned(b"a".to_vec()).await;
    res.unwrap();
    let (res, _) = b.write_all_owned(b"b".to_vec()).await;
    res.unwrap();
    assert_eq!(read_by_readiness(&_a_peer, 1).await, b"a");
    assert_eq!(read_by_readiness(&_b_peer, 1).await, b"b");
}

#[hotloop::test(driver = "all")]
async fn borrowed_halves_copy_with_tokio_traits() {
    let (client, server) = pair().await;
    let echo = hotloop::spawn(async move {
        let (mut r, mut w) = server.split();
        let n = tokio::io::copy(&mut r, &mut w).await.unwrap();
        w.shutdown().await.unwrap();
        n
    });
    let (mut r, mut w) = client.split();
    w.write_all(b"round trip").await.unwrap();
    w.shutdown().await.unwrap();
    let mut back = Vec::new();
    r.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"round trip");
    assert_eq!(echo.await.unwrap(), 10);
}

/// `TcpSocket`: options set before `listen` and before `connect` (bound to
/// a chosen local address), on both drivers.
#[hotloop::test(driver = "all")]
async fn tcp_socket_sets_options_then_listens_and_connects() {
    use hotloop::net::TcpSocket;
    let listening = TcpSocket::new_v4().unwrap();
    listening.set_reuseaddr(true).unwrap();
    listening.set_reuseport(true).unwrap();
    listening.set_nodelay(true).unwrap();
    assert!(listening.reuseaddr().unwrap() && listening.reuseport().unwrap());
    listening.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = listening.listen(64).unwrap();
    let addr = listener.local_addr().unwrap();

    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 * 1024).unwrap();
    assert!(socket.recv_buffer_size().unwrap() >= 64 * 1024);
    socket.set_keepalive(true).unwrap();
    assert!(socket.keepalive().unwrap());
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let local = socket.local_addr().unwrap();
    let client = socket.connect(addr).await.unwrap();
    let (server, peer) = listener.accept().await.unwrap();
    assert_eq!(client.local_addr().unwrap(), local, "the bound address was used");
    assert_eq!(peer, local);
    assert!(server.nodelay().unwrap(), "accepted sockets inherit TCP_NODELAY");
    let (res, _) = client.write_all_owned(b"socket".to_vec()).await;
    res.unwrap();
    assert_eq!(read_by_readiness(&server, 6).await, b"socket");

    // Refused: the error comes back from `connect`.
    let closed = TcpSocket::new_v4().unwrap();
    closed.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let nobody = closed.local_addr().unwrap();
    drop(closed);
    let e = TcpSocket::new_v4().unwrap().connect(nobody).await.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
}

/// Two tasks waiting to read one stream, one of which gives up (a
/// timeout): the other still wakes when the peer sends. On io_uring the
/// stream's wait held one waker, the last poller's, so the bytes woke only
/// the task that had given up.
#[hotloop::test(driver = "all")]
async fn a_reader_that_gives_up_leaves_the_other_reader_its_wake_up() {
    let (client, server) = pair().await;
    let server = std::rc::Rc::new(server);
    let patient = hotloop::spawn({
        let server = server.clone();
        async move {
            timeout(Duration::from_secs(10), server.readable()).await.unwrap().unwrap();
            let mut buf = [0u8; 16];
            let n = server.try_read(&mut buf).unwrap();
            buf[..n].to_vec()
        }
    });
    hotloop::time::sleep(Duration::from_millis(10)).await; // the patient task waits
    assert!(timeout(Duration::from_millis(10), server.readable()).await.is_err());
    let (res, _) = client.write_all_owned(b"late".to_vec()).await;
    res.unwrap();
    let got = timeout(Duration::from_secs(5), patient)
        .await
        .expect("the reader still waiting was never woken")
        .unwrap();
    assert_eq!(got, b"late");
}

/// A task waits for room (`writable`) while the socket is full; another
/// tries a write (`try_write`), which finds none: the first still wakes
/// once the peer reads. On io_uring `try_write` polled the send in flight
/// with a waker that wakes nobody, which took the waiting task's place.
#[hotloop::test(driver = "all")]
async fn a_try_write_that_finds_no_room_leaves_the_writer_waiting_its_wake_up() {
    let (client, server) = pair().await;
    client.set_send_buffer_size(4096).unwrap();
    server.set_recv_buffer_size(4096).unwrap();
    let client = std::rc::Rc::new(client);
    let chunk = vec![7u8; 16 * 1024];
    let mut full = false;
    for _ in 0..10_000 {
        match client.try_write(&chunk) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                full = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(full, "the socket never filled");
    // The send written behind (io_uring) reaches the kernel and waits there.
    hotloop::time::sleep(Duration::from_millis(20)).await;
    let patient = hotloop::spawn({
        let client = client.clone();
        async move { timeout(Duration::from_secs(10), client.writable()).await.unwrap() }
    });
    hotloop::time::sleep(Duration::from_millis(20)).await; // the patient task waits
    let tried = client.try_write(b"x").unwrap_err();
    assert_eq!(tried.kind(), std::io::ErrorKind::WouldBlock);
    // The peer reads until nothing more comes for a while.
    let reader = hotloop::spawn(async move {
        while let Ok((res, _)) =
            timeout(Duration::from_millis(300), server.read_owned(Vec::with_capacity(64 * 1024)))
                .await
        {
            if res.unwrap() == 0 {
                break;
            }
        }
    });
    timeout(Duration::from_secs(5), patient)
        .await
        .expect("the writer waiting for room was never woken")
        .unwrap()
        .unwrap();
    reader.await.unwrap();
}

/// A task waits for room while another shuts the stream down in both
/// directions: the first is woken (on io_uring the send it waited on was
/// handed to the driver, which dropped its waker), and once the peer has
/// read every byte, the wait ends well.
#[hotloop::test(driver = "all")]
async fn a_shutdown_beside_a_task_waiting_for_room_wakes_it() {
    let (client, server) = pair().await;
    client.set_send_buffer_size(4096).unwrap();
    server.set_recv_buffer_size(4096).unwrap();
    let client = std::rc::Rc::new(client);
    let chunk = vec![7u8; 16 * 1024];
    let mut taken = 0usize;
    for _ in 0..10_000 {
        match client.try_write(&chunk) {
            Ok(n) => taken += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    hotloop::time::sleep(Duration::from_millis(20)).await;
    let patient = hotloop::spawn({
        let client = client.clone();
        async move { timeout(Duration::from_secs(10), client.writable()).await.unwrap() }
    });
    hotloop::time::sleep(Duration::from_millis(20)).await; // the patient task waits
    client.shutdown_with(std::net::Shutdown::Both).await.unwrap();
    let reader = hotloop::spawn(async move {
        let mut total = 0usize;
        loop {
            let (res, _) =
                timeout(Duration::from_secs(5), server.read_owned(Vec::with_capacity(64 * 1024)))
                    .await
                    .expect("the peer's end never came");
            match res.unwrap() {
                0 => return total,
                n => total += n,
            }
        }
    });
    timeout(Duration::from_secs(5), patient)
        .await
        .expect("the writer waiting for room was never woken")
        .unwrap()
        .unwrap();
    assert_eq!(reader.await.unwrap(), taken, "every byte taken arrives before the end");
}
