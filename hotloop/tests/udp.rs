//! UDP sockets on both drivers: owned-buffer and batched echo, GSO and GRO,
//! ECN and destination addresses, truncation, ICMP errors after `connect`,
//! and a receiver whose buffer is full.

mod common;

use std::cell::Cell;
use std::future::poll_fn;
use std::io::IoSliceMut;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

use hotloop::net::udp::{EcnCodepoint, RecvMeta, SendMeta, Transmit};
use hotloop::net::{UdpOptions, UdpSocket};
use hotloop::time::timeout;
use hotloop::Runtime;

const LOCALHOST: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
const LIMIT: Duration = Duration::from_secs(10);

fn runtime(driver: hotloop::DriverKind) -> Runtime {
    Runtime::builder().workers(1).driver(driver).build().unwrap()
}

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

test_all_drivers! {
    fn owned_echo(driver: DriverKind) {
        runtime(driver).block_on(async {
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
        });
    }

    fn batched_echo(driver: DriverKind) {
        runtime(driver).block_on(async {
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
        });
    }

    fn gso_and_gro(driver: DriverKind) {
        runtime(driver).block_on(async {
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
        });
    }

    fn ecn_and_destination_address(driver: DriverKind) {
        runtime(driver).block_on(async {
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
            client.try_send_msg(&Transmit {
                destination: dest,
                ecn: Some(EcnCodepoint::Ect0),
                contents: b"batch",
                segment_size: None,
                src_ip: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            }).unwrap();
            let mut buf = [0u8; 64];
            let mut meta = [RecvMeta::default(); 1];
            let n = timeout(LIMIT, poll_fn(|cx| {
                server.poll_recv_msgs(cx, &mut [IoSliceMut::new(&mut buf)], &mut meta)
            })).await.unwrap().unwrap();
            assert_eq!(n, 1);
            assert_eq!(&buf[..meta[0].len], b"batch");
            assert_eq!(meta[0].ecn, Some(EcnCodepoint::Ect0));
            assert_eq!(meta[0].dst_ip, Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        });
    }

    fn ecn_and_destination_address_ipv6(driver: DriverKind) {
        runtime(driver).block_on(async {
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
        });
    }

    fn datagram_larger_than_buffer(driver: DriverKind) {
        runtime(driver).block_on(async {
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
            let n = timeout(LIMIT, poll_fn(|cx| {
                server.poll_recv_msgs(cx, &mut [IoSliceMut::new(&mut small)], &mut meta)
            })).await.unwrap().unwrap();
            assert_eq!(n, 1);
            assert_eq!(&small, b"ne");
            assert!(meta[0].truncated);
        });
    }

    fn connection_refused_after_connect(driver: DriverKind) {
        runtime(driver).block_on(async {
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
            client.try_send_msg(&Transmit {
                destination: dest,
                ecn: None,
                contents: b"anyone?",
                segment_size: None,
                src_ip: None,
            }).unwrap();
            let res = timeout(LIMIT, waiter).await.unwrap().unwrap();
            assert_eq!(res.unwrap_err().kind(), std::io::ErrorKind::ConnectionRefused);
        });
    }

    fn full_receive_buffer(driver: DriverKind) {
        // On loopback a UDP send never waits: the kernel hands each datagram
        // to the receiver at once and drops it there if its buffer is full.
        // The sender must go on without error and without spinning, and the
        // receiver gets what fit.
        let rt = runtime(driver);
        rt.block_on(async {
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
                    .map(|_| Transmit { destination: dest, ecn: None, contents: &payload, segment_size: None, src_ip: None })
                    .collect();
                sent += timeout(LIMIT, poll_fn(|cx| client.poll_send_msgs(cx, &batch))).await.unwrap().unwrap();
            }
            assert!(start.elapsed() < LIMIT);
            let mut got = 0;
            let mut storage = vec![[0u8; 1500]; 32];
            loop {
                let mut meta = [RecvMeta::default(); 32];
                let mut bufs: Vec<IoSliceMut<'_>> = storage.iter_mut().map(|b| IoSliceMut::new(&mut b[..])).collect();
                let polled = timeout(Duration::from_millis(50), poll_fn(|cx| server.poll_recv_msgs(cx, &mut bufs, &mut meta))).await;
                match polled {
                    Ok(n) => got += n.unwrap(),
                    Err(_) => break,
                }
            }
            assert!(got > 0 && got < sent_total, "received {got} of {sent_total}");
        });
        let stats = rt.stats().total;
        // Parking for a datagram that never comes is a handful of waits, not a spin.
        assert!(stats.poller_waits < 1_000, "{} poller waits", stats.poller_waits);
    }
}
