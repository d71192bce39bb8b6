//! UDP sockets on both drivers: owned-buffer and batched echo, GSO and GRO,
//! ECN and destination addresses, truncation, ICMP errors after `connect`,
//! and a receiver whose buffer is full; on io_uring, the multishot
//! `RECVMSG` receive path (a burst larger than its ring, a socket dropped
//! with it armed) and the fallback when it is switched off.

use std::cell::Cell;
use std::future::poll_fn;
use std::io::IoSliceMut;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

use hotloop::net::{EcnCodepoint, RecvMeta, SendMeta, Transmit};
use hotloop::net::{UdpOptions, UdpSocket};
use hotloop::runtime::Handle;
use hotloop::time::timeout;
use hotloop::{DriverKind, Runtime};

const LOCALHOST: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
const LIMIT: Duration = Duration::from_secs(10);

/// Echoes datagrams in batches with the borrowed poll forms until `count` came back.
async fn batch_echo_server(sock: Rc<UdpSocket>, count: usize) {
    let mut storage = vec![[0u8; 2048]; 8];
    let mut echoed = 0;
    while echoed < count {
        let mut meta = [RecvMeta::default(); 8];
        let n = {
            let mut bufs: Vec<IoSliceMut<'_>> =
                storage.iter_mut().map(|b| IoSliceMut::new(&mut b[..])).collect();
            poll_fn(|cx| sock.poll_recv_msgs(cx, &mut bufs, &mut meta)).await.unwrap()
        };
        let transmits: Vec<Transmit<'_>> = (0..n)
            .map(|i| Transmit {
                destination: meta[i].addr,
                ecn: None,
                contents: &storage[i][..meta[i].len],
                segment_size: None,
                src_ip: None,
            })
            .collect();
        let mut sent = 0;
        while sent < n {
            sent += poll_fn(|cx| sock.poll_send_msgs(cx, &transmits[sent..])).await.unwrap();
        }
        echoed += n;
    }
}

#[hotloop::test(driver = "all")]
async fn owned_echo() {
    let server = UdpSocket::bind(LOCALHOST).unwrap();
    let client = UdpSocket::bind(LOCALHOST).unwrap();
    let server_addr = server.local_addr().unwrap();
    for i in 0..50u32 {
        let msg = format!("datagram {i}").into_bytes();
        let (res, _) = client.send_to(msg.clone(), server_addr).await;
        assert_eq!(res.unwrap(), msg.len());
        let (res, buf) = timeout(LIMIT, server.recv_from(Vec::with_capacity(1500))).await.unwrap();
        let (n, from) = res.unwrap();
        assert_eq!(&buf[..n], &msg[..]);
        assert_eq!(from, client.local_addr().unwrap());
        let (res, _) = server.send_to(buf, from).await;
        res.unwrap();
        let (res, back) = timeout(LIMIT, client.recv_from(Vec::with_capacity(1500))).await.unwrap();
        assert_eq!(res.unwrap().0, msg.len());
        assert_eq!(back, msg);
    }
}

#[hotloop::test(driver = "all")]
async fn batched_echo() {
    let server = Rc::new(UdpSocket::bind(LOCALHOST).unwrap());
    let server_addr = server.local_addr().unwrap();
    let total = 2_000;
    let echo = hotloop::spawn(batch_echo_server(server, total));
    let client = Rc::new(UdpSocket::bind(LOCALHOST).unwrap());
    client.connect(server_addr).unwrap();
    let got = Rc::new(Cell::new(0));
    let reader = {
        let (client, got) = (client.clone(), got.clone());
        hotloop::spawn(async move {
            let mut buf = Vec::with_capacity(2048);
            while got.get() < total {
                let (res, b) = client.recv(buf).await;
                assert_eq!(res.unwrap(), 1200);
                buf = b;
                got.set(got.get() + 1);
            }
        })
    };
    // At most 64 in flight, so no socket buffer overflows on the way.
    for i in 0..total {
        while i - got.get() >= 64 {
            hotloop::time::sleep(Duration::from_millis(1)).await;
        }
        let (res, _) = client.send(vec![i as u8; 1200]).await;
        res.unwrap();
    }
    timeout(LIMIT, reader).await.unwrap().unwrap();
    timeout(LIMIT, echo).await.unwrap().unwrap();
}

#[hotloop::test(driver = "all")]
async fn gso_and_gro() {
    for (gso, gro) in [(false, false), (true, false), (false, true), (true, true)] {
        let options = UdpOptions { gro, ..UdpOptions::default() };
        let server = UdpSocket::bind_with(LOCALHOST, &options).unwrap();
        let client = UdpSocket::bind(LOCALHOST).unwrap();
        let dest = server.local_addr().unwrap();
        assert!(client.max_gso_segments() > 1, "the kernel supports UDP_SEGMENT");
        let segments = 10;
        let payload: Vec<u8> = (0..segments * 1200).map(|i| (i / 1200) as u8).collect();
        if gso {
            let meta = SendMeta {
                destination: Some(dest),
                segment_size: Some(1200),
                ..SendMeta::default()
            };
            let (res, _) = client.send_msg(payload.clone(), meta).await;
            assert_eq!(res.unwrap(), payload.len());
        } else {
            for chunk in payload.chunks(1200) {
                let (res, _) = client.send_to(chunk.to_vec(), dest).await;
                res.unwrap();
            }
        }
        let mut received = Vec::new();
        let mut receives = 0;
        while received.len() < payload.len() {
            let buf = Vec::with_capacity(64 * 1024);
            let (res, buf) = timeout(LIMIT, server.recv_msg(buf)).await.unwrap();
            let meta = res.unwrap();
            assert!(!meta.truncated);
            if gro {
                assert_eq!(meta.stride, 1200.min(meta.len), "gso={gso} gro={gro}");
            } else {
                assert_eq!((meta.len, meta.stride), (1200, 1200), "gso={gso} gro={gro}");
            }
            received.extend_from_slice(&buf);
            receives += 1;
        }
        assert_eq!(received, payload, "gso={gso} gro={gro}");
        if !gro {
            assert_eq!(receives, segments);
        }
        if gso && gro {
            // Loopback hands a GSO train to a GRO socket whole.
            assert!(receives < segments, "GRO coalesced nothing ({receives} receives)");
        }
    }
}

#[hotloop::test(driver = "all")]
async fn ecn_and_destination_address() {
    let options = UdpOptions { recv_ecn: true, recv_dst_addr: true, ..UdpOptions::default() };
    let server = UdpSocket::bind_with(LOCALHOST, &options).unwrap();
    let client = UdpSocket::bind(LOCALHOST).unwrap();
    let dest = server.local_addr().unwrap();
    for ecn in [EcnCodepoint::Ect0, EcnCodepoint::Ect1, EcnCodepoint::Ce] {
        let meta = SendMeta { destination: Some(dest), ecn: Some(ecn), ..SendMeta::default() };
        let (res, _) = client.send_msg(b"ecn".to_vec(), meta).await;
        res.unwrap();
        let (res, _) = timeout(LIMIT, server.recv_msg(Vec::with_capacity(64))).await.unwrap();
        let got = res.unwrap();
        assert_eq!(got.ecn, Some(ecn));
        assert_eq!(got.dst_ip, Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    }
    // The borrowed batch form reports the same.
    client
        .try_send_msg(&Transmit {
            destination: dest,
            ecn: Some(EcnCodepoint::Ect0),
            contents: b"batch",
            segment_size: None,
            src_ip: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        })
        .unwrap();
    let mut buf = [0u8; 64];
    let mut meta = [RecvMeta::default(); 1];
    let n = timeout(
        LIMIT,
        poll_fn(|cx| server.poll_recv_msgs(cx, &mut [IoSliceMut::new(&mut buf)], &mut meta)),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(n, 1);
    assert_eq!(&buf[..meta[0].len], b"batch");
    assert_eq!(meta[0].ecn, Some(EcnCodepoint::Ect0));
    assert_eq!(meta[0].dst_ip, Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
}

#[hotloop::test(driver = "all")]
async fn ecn_and_destination_address_ipv6() {
    let v6: SocketAddr = "[::1]:0".parse().unwrap();
    let options = UdpOptions { recv_ecn: true, recv_dst_addr: true, ..UdpOptions::default() };
    let server = UdpSocket::bind_with(v6, &options).unwrap();
    let client = UdpSocket::bind(v6).unwrap();
    let dest = server.local_addr().unwrap();
    let meta = SendMeta {
        destination: Some(dest),
        ecn: Some(EcnCodepoint::Ect1),
        src_ip: Some(IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)),
        ..SendMeta::default()
    };
    let (res, _) = client.send_msg(b"v6".to_vec(), meta).await;
    res.unwrap();
    let (res, buf) = timeout(LIMIT, server.recv_msg(Vec::with_capacity(64))).await.unwrap();
    let got = res.unwrap();
    assert_eq!(buf, b"v6");
    assert_eq!(got.ecn, Some(EcnCodepoint::Ect1));
    assert_eq!(got.dst_ip, Some(IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)));
    assert_eq!(got.addr, client.local_addr().unwrap());
}

#[hotloop::test(driver = "all")]
async fn datagram_larger_than_buffer() {
    let server = UdpSocket::bind(LOCALHOST).unwrap();
    let client = UdpSocket::bind(LOCALHOST).unwrap();
    let dest = server.local_addr().unwrap();
    let (res, _) = client.send_to(vec![7u8; 2000], dest).await;
    res.unwrap();
    let (res, buf) = timeout(LIMIT, server.recv_msg(Vec::with_capacity(100))).await.unwrap();
    let meta = res.unwrap();
    assert_eq!(meta.len, 100);
    assert!(meta.truncated);
    assert_eq!(buf, vec![7u8; 100]);
    // The rest of the datagram is gone: the next one starts fresh.
    let (res, _) = client.send_to(b"next".to_vec(), dest).await;
    res.unwrap();
    let mut small = [0u8; 2];
    let mut meta = [RecvMeta::default(); 1];
    let n = timeout(
        LIMIT,
        poll_fn(|cx| server.poll_recv_msgs(cx, &mut [IoSliceMut::new(&mut small)], &mut meta)),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(n, 1);
    assert_eq!(&small, b"ne");
    assert!(meta[0].truncated);
}

#[hotloop::test(driver = "all")]
async fn connection_refused_after_connect() {
    let closed = std::net::UdpSocket::bind(LOCALHOST).unwrap();
    let dest = closed.local_addr().unwrap();
    drop(closed);
    // Owned-buffer receive.
    let client = UdpSocket::bind(LOCALHOST).unwrap();
    client.connect(dest).unwrap();
    let (res, _) = client.send(b"anyone?".to_vec()).await;
    res.unwrap();
    let (res, _) = timeout(LIMIT, client.recv(Vec::with_capacity(64))).await.unwrap();
    assert_eq!(res.unwrap_err().kind(), std::io::ErrorKind::ConnectionRefused);
    // Borrowed poll form, parked before the error arrives.
    let client = Rc::new(UdpSocket::bind(LOCALHOST).unwrap());
    client.connect(dest).unwrap();
    let waiter = {
        let client = client.clone();
        hotloop::spawn(async move {
            let mut buf = [0u8; 64];
            poll_fn(|cx| client.poll_recv_from(cx, &mut buf)).await
        })
    };
    hotloop::time::sleep(Duration::from_millis(5)).await;
    client
        .try_send_msg(&Transmit {
            destination: dest,
            ecn: None,
            contents: b"anyone?",
            segment_size: None,
            src_ip: None,
        })
        .unwrap();
    let res = timeout(LIMIT, waiter).await.unwrap().unwrap();
    assert_eq!(res.unwrap_err().kind(), std::io::ErrorKind::ConnectionRefused);
}

/// On loopback a UDP send never waits: the kernel hands each datagram to
/// the receiver at once and drops it there if its buffer is full. The
/// sender must go on without error and without spinning, and the receiver
/// gets what fit.
#[hotloop::test(driver = "all")]
async fn full_receive_buffer() {
    let options = UdpOptions { recv_buffer_bytes: Some(16 * 1024), ..UdpOptions::default() };
    let server = UdpSocket::bind_with(LOCALHOST, &options).unwrap();
    let options = UdpOptions { send_buffer_bytes: Some(4 * 1024), ..UdpOptions::default() };
    let client = UdpSocket::bind_with(LOCALHOST, &options).unwrap();
    let dest = server.local_addr().unwrap();
    let payload = [1u8; 1200];
    let sent_total = 5_000;
    let start = Instant::now();
    let mut sent = 0;
    while sent < sent_total {
        let batch: Vec<Transmit<'_>> = (0..32.min(sent_total - sent))
            .map(|_| Transmit {
                destination: dest,
                ecn: None,
                contents: &payload,
                segment_size: None,
                src_ip: None,
            })
            .collect();
        sent +=
            timeout(LIMIT, poll_fn(|cx| client.poll_send_msgs(cx, &batch))).await.unwrap().unwrap();
    }
    assert!(start.elapsed() < LIMIT);
    let mut got = 0;
    let mut storage = vec![[0u8; 1500]; 32];
    loop {
        let mut meta = [RecvMeta::default(); 32];
        let mut bufs: Vec<IoSliceMut<'_>> =
            storage.iter_mut().map(|b| IoSliceMut::new(&mut b[..])).collect();
        let polled = timeout(
            Duration::from_millis(50),
            poll_fn(|cx| server.poll_recv_msgs(cx, &mut bufs, &mut meta)),
        )
        .await;
        match polled {
            Ok(n) => got += n.unwrap(),
            Err(_) => break,
        }
    }
    assert!(got > 0 && got < sent_total, "received {got} of {sent_total}");
    let stats = Handle::current().stats().total;
    // Parking for a datagram that never comes is a handful of waits, not a spin.
    assert!(stats.poller_waits < 1_000, "{} poller waits", stats.poller_waits);
}

/// The switch that turns multishot `RECVMSG` off (the fallback path).
const NO_MULTISHOT: &str = "HOTLOOP_URING_MULTISHOT_RECVMSG";

/// True where datagram sockets should receive through a multishot
/// `RECVMSG`: io_uring on Linux 6.0+, unless switched off.
fn ring_expected(driver: DriverKind) -> bool {
    let off = |var: &str| std::env::var(var).is_ok_and(|v| v == "0");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    driver == DriverKind::Uring
        && !off(NO_MULTISHOT)
        && !off("HOTLOOP_URING_MULTISHOT_RECV")
        && (major, minor) >= (6, 0)
}

/// Echo with GRO off and on (a GSO train comes back as one receive), a
/// datagram longer than the buffer, and source and destination addresses,
/// through whichever receive path `driver` takes here, which it checks.
async fn exercise_receives(driver: DriverKind) {
    for gro in [false, true] {
        let options = UdpOptions { gro, recv_dst_addr: true, ..UdpOptions::default() };
        let server = UdpSocket::bind_with(LOCALHOST, &options).unwrap();
        let client = UdpSocket::bind(LOCALHOST).unwrap();
        let dest = server.local_addr().unwrap();
        let payload: Vec<u8> = (0..8 * 1200).map(|i| (i / 1200) as u8 + 1).collect();
        let meta =
            SendMeta { destination: Some(dest), segment_size: Some(1200), ..SendMeta::default() };
        let (res, _) = client.send_msg(payload.clone(), meta).await;
        assert_eq!(res.unwrap(), payload.len());
        let mut echoed = 0;
        let mut receives = 0;
        while echoed < payload.len() {
            let (res, buf) =
                timeout(LIMIT, server.recv_msg(Vec::with_capacity(64 * 1024))).await.unwrap();
            let meta = res.unwrap();
            assert!(!meta.truncated, "gro={gro}");
            assert_eq!(meta.addr, client.local_addr().unwrap(), "gro={gro}");
            assert_eq!(meta.dst_ip, Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), "gro={gro}");
            assert_eq!(meta.stride, 1200.min(meta.len), "gro={gro}");
            assert_eq!(&buf[..], &payload[echoed..echoed + meta.len], "gro={gro}");
            echoed += meta.len;
            receives += 1;
            let back = SendMeta {
                destination: Some(meta.addr),
                segment_size: Some(meta.stride),
                ..SendMeta::default()
            };
            let (res, _) = server.send_msg(buf, back).await;
            res.unwrap();
        }
        if gro {
            assert!(receives < 8, "GRO coalesced nothing ({receives} receives)");
        } else {
            assert_eq!(receives, 8);
        }
        assert_eq!(server.receives_from_ring(), ring_expected(driver), "gro={gro}");
        // The echo comes back datagram by datagram, to the borrowed form.
        let mut back = Vec::new();
        let mut storage = vec![[0u8; 1500]; 4];
        while back.len() < payload.len() {
            let mut meta = [RecvMeta::default(); 4];
            let mut bufs: Vec<IoSliceMut<'_>> =
                storage.iter_mut().map(|b| IoSliceMut::new(&mut b[..])).collect();
            let n = timeout(LIMIT, poll_fn(|cx| client.poll_recv_msgs(cx, &mut bufs, &mut meta)))
                .await
                .unwrap()
                .unwrap();
            for (m, b) in meta[..n].iter().zip(&storage) {
                assert_eq!((m.len, m.addr, m.truncated), (1200, dest, false));
                back.extend_from_slice(&b[..m.len]);
            }
        }
        assert_eq!(back, payload, "gro={gro}");
        assert_eq!(client.receives_from_ring(), ring_expected(driver));
        // Truncation, to both forms, reported as recvmsg reports it; the
        // rest of a datagram is gone, and with GRO the rest of the train.
        client
            .try_send_msg(&Transmit {
                destination: dest,
                ecn: None,
                contents: &payload[..3000],
                segment_size: Some(1000),
                src_ip: None,
            })
            .unwrap();
        let mut taken = 0;
        while taken < if gro { 1 } else { 3 } {
            let (res, buf) = timeout(LIMIT, server.recv_msg(Vec::with_capacity(10))).await.unwrap();
            let meta = res.unwrap();
            assert_eq!((meta.len, meta.truncated), (10, true), "gro={gro}");
            assert_eq!(&buf[..], &payload[taken * 1000..taken * 1000 + 10]);
            taken += 1;
        }
        let (res, _) = client.send_to(b"fits".to_vec(), dest).await;
        res.unwrap();
        let mut small = [0u8; 2];
        let mut meta = [RecvMeta::default(); 1];
        let n = timeout(
            LIMIT,
            poll_fn(|cx| server.poll_recv_msgs(cx, &mut [IoSliceMut::new(&mut small)], &mut meta)),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!((n, &small, meta[0].len, meta[0].truncated), (1, b"fi", 2, true));
    }
}

/// Receives through the multishot path (on io_uring, Linux 6.0+): echo with
/// GRO off and on, truncation, source and destination addresses.
#[hotloop::test(driver = "all")]
async fn multishot_receive_echo_truncation_addresses(driver: DriverKind) {
    exercise_receives(driver).await;
}

/// The same with multishot `RECVMSG` switched off, in a child process (the
/// switch is read when a driver starts, for the whole process).
#[test]
fn fallback_without_multishot_recvmsg() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact"])
        .args([harness_name("fallback_receives::epoll"), harness_name("fallback_receives::uring")])
        .env(NO_MULTISHOT, "0")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("2 passed"), "{stdout}");
}

#[hotloop::test(driver = "all")]
#[ignore = "run by fallback_without_multishot_recvmsg with the switch set"]
async fn fallback_receives(driver: DriverKind) {
    if !std::env::var(NO_MULTISHOT).is_ok_and(|v| v == "0") {
        eprintln!("skipped: needs {NO_MULTISHOT}=0");
        return;
    }
    exercise_receives(driver).await;
}

/// A burst several times the ring's size, sent while the receiver is not
/// reading: the ring runs dry, the rest waits in the socket's receive
/// buffer, and every datagram still arrives, in order, with no hang.
#[hotloop::test(driver = "all")]
async fn burst_larger_than_the_ring() {
    let options = UdpOptions { recv_buffer_bytes: Some(4 << 20), ..UdpOptions::default() };
    let server = UdpSocket::bind_with(LOCALHOST, &options).unwrap();
    let client = UdpSocket::bind(LOCALHOST).unwrap();
    let dest = server.local_addr().unwrap();
    let send = |i: u32| {
        client
            .try_send_msg(&Transmit {
                destination: dest,
                ecn: None,
                contents: &i.to_be_bytes(),
                segment_size: None,
                src_ip: None,
            })
            .unwrap()
    };
    // Arm the receive, then let it meet the burst with nobody reading.
    send(0);
    let (res, buf) = timeout(LIMIT, server.recv_msg(Vec::with_capacity(16))).await.unwrap();
    assert_eq!((res.unwrap().len, &buf[..]), (4, &0u32.to_be_bytes()[..]));
    let total = 1_000u32;
    for round in 0..4 {
        for i in 1..=total / 4 {
            send(round * total / 4 + i);
        }
        hotloop::time::sleep(Duration::from_millis(5)).await;
    }
    let mut next = 1u32;
    let mut storage = vec![[0u8; 16]; 32];
    while next <= total {
        if next.is_multiple_of(2) {
            let (res, buf) = timeout(LIMIT, server.recv_msg(Vec::with_capacity(16))).await.unwrap();
            assert_eq!(res.unwrap().len, 4);
            assert_eq!(u32::from_be_bytes(buf[..4].try_into().unwrap()), next);
            next += 1;
        } else {
            let mut meta = [RecvMeta::default(); 32];
            let mut bufs: Vec<IoSliceMut<'_>> =
                storage.iter_mut().map(|b| IoSliceMut::new(&mut b[..])).collect();
            let n = timeout(LIMIT, poll_fn(|cx| server.poll_recv_msgs(cx, &mut bufs, &mut meta)))
                .await
                .expect("the receive hung after the ring ran dry")
                .unwrap();
            for (m, b) in meta[..n].iter().zip(&storage) {
                assert_eq!(m.len, 4);
                assert_eq!(u32::from_be_bytes(b[..4].try_into().unwrap()), next);
                next += 1;
            }
        }
    }
    // Later datagrams still arrive.
    send(total + 1);
    let (res, buf) = timeout(LIMIT, server.recv_msg(Vec::with_capacity(16))).await.unwrap();
    assert_eq!((res.unwrap().len, &buf[..]), (4, &(total + 1).to_be_bytes()[..]));
}

/// A socket dropped with its receive armed (and datagrams on the way)
/// closes once the kernel is done with it (the operation holds the socket
/// and its ring until its last completion): no panic, and its port can be
/// bound again, round after round (ring groups are reused).
#[hotloop::test(driver = "all")]
async fn dropping_a_socket_with_its_receive_armed() {
    let client = UdpSocket::bind(LOCALHOST).unwrap();
    for round in 0..100 {
        let server = UdpSocket::bind(LOCALHOST).unwrap();
        let addr = server.local_addr().unwrap();
        // The receive is armed in the kernel when its wait times out.
        let waited =
            timeout(Duration::from_millis(1), server.recv_msg(Vec::with_capacity(64))).await;
        assert!(waited.is_err());
        if round % 2 == 0 {
            // Datagrams still land in the ring while the cancel is on its way.
            for _ in 0..3 {
                let (res, _) = client.send_to(vec![1u8; 100], addr).await;
                res.unwrap();
            }
        }
        drop(server);
        let mut rebound = None;
        for _ in 0..200 {
            match UdpSocket::bind(addr) {
                Ok(s) => {
                    rebound = Some(s);
                    break;
                }
                Err(_) => hotloop::time::sleep(Duration::from_millis(1)).await,
            }
        }
        assert!(rebound.is_some(), "round {round}: port {addr} still in use");
    }
}

/// A socket whose receive is armed, dropped after its runtime stopped
/// running, still closes at once.
#[test]
fn dropping_an_armed_socket_outside_its_runtime() {
    for driver in [DriverKind::Epoll, DriverKind::Uring] {
        if driver == DriverKind::Uring && hotloop::runtime::uring_available().is_err() {
            continue;
        }
        let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
        let (server, addr) = rt.block_on(async {
            let server = UdpSocket::bind(LOCALHOST).unwrap();
            let addr = server.local_addr().unwrap();
            let waited =
                timeout(Duration::from_millis(1), server.recv_msg(Vec::with_capacity(64))).await;
            assert!(waited.is_err());
            (server, addr)
        });
        drop(server);
        std::net::UdpSocket::bind(addr).expect("the dropped socket's port is still in use");
    }
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
