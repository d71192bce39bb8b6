//! Echo across many concurrent connections, on every worker.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::Duration;

use hotloop::net::{serve, ListenerOptions};
use hotloop::{DriverKind, Runtime};

#[hotloop::test(driver = "all")]
fn many_concurrent_connections(driver: DriverKind) {
    let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
    let server =
        serve(rt.handle(), "127.0.0.1:0", ListenerOptions::default(), common::echo).unwrap();
    let addr = server.local_addr();
    let clients: Vec<_> = (0..8)
        .map(|c| {
            thread::spawn(move || {
                for i in 0..25 {
                    let mut s = TcpStream::connect(addr).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let msg = format!("client {c} message {i} {}", "x".repeat(i * 100));
                    s.write_all(msg.as_bytes()).unwrap();
                    let mut back = vec![0; msg.len()];
                    s.read_exact(&mut back).unwrap();
                    assert_eq!(back, msg.as_bytes());
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let stats = rt.stats();
    assert_eq!(stats.total.accepted, 200);
    assert!(stats.workers[..2].iter().all(|w| w.accepted > 0), "both workers accept");
    let still_active = server.shutdown_blocking(Duration::from_secs(5));
    assert_eq!(still_active, 0);
}

#[hotloop::test(driver = "all")]
fn large_payload_round_trips(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let server =
        serve(rt.handle(), "127.0.0.1:0", ListenerOptions::default(), common::echo).unwrap();
    let addr = server.local_addr();
    let payload: Vec<u8> = (0..4_000_000u32).map(|i| (i % 251) as u8).collect();
    let expected = payload.clone();
    let t = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut w = s.try_clone().unwrap();
        let writer = thread::spawn(move || {
            w.write_all(&payload).unwrap();
            w.shutdown(std::net::Shutdown::Write).unwrap();
        });
        let mut back = Vec::new();
        s.read_to_end(&mut back).unwrap();
        writer.join().unwrap();
        back
    });
    let back = t.join().unwrap();
    assert_eq!(back.len(), expected.len());
    assert!(back == expected);
    server.stop();
}
