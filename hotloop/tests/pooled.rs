//! Pooled reads: a buffer only while there are bytes, no bytes lost when a
//! read is dropped, bytes in order when pooled and plain reads mix, a
//! fast sender held back rather than buffered without bound, and a buffer
//! dropped on another thread given back to the worker that read into it.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpStream as StdStream;
use std::time::Duration;

use hotloop::net::TcpListener;
use hotloop::time::timeout;
use hotloop::DriverKind;
use hotloop::Runtime;

fn runtime(driver: DriverKind) -> Runtime {
    Runtime::builder().workers(1).driver(driver).build().unwrap()
}

/// A pooled read dropped while waiting takes no bytes with it.
#[hotloop::test(driver = "all")]
fn a_dropped_pooled_read_loses_nothing(driver: DriverKind) {
    let rt = runtime(driver);
    rt.block_on(async {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = StdStream::connect(l.local_addr().unwrap()).unwrap();
        let s = l.accept_stream().await.unwrap();
        for _ in 0..20 {
            assert!(timeout(Duration::from_millis(1), s.read_pooled()).await.is_err());
        }
        c.write_all(b"first").unwrap();
        let mut got = Vec::new();
        // Reads that may time out while the bytes arrive: whatever they
        // return is kept, and what they did not return is still there.
        for _ in 0..5 {
            if let Ok(b) = timeout(Duration::from_micros(1), s.read_pooled()).await {
                got.extend_from_slice(&b.unwrap());
            }
        }
        while got.len() < 5 {
            let b = timeout(Duration::from_secs(2), s.read_pooled()).await.unwrap().unwrap();
            got.extend_from_slice(&b);
        }
        assert_eq!(got, b"first");
    });
}

/// Pooled and owned-buffer reads on one socket see the bytes in order.
#[hotloop::test(driver = "all")]
fn pooled_and_plain_reads_keep_the_order(driver: DriverKind) {
    let rt = runtime(driver);
    rt.block_on(async {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = StdStream::connect(l.local_addr().unwrap()).unwrap();
        let s = l.accept_stream().await.unwrap();
        let sent: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let writer = {
            let sent = sent.clone();
            std::thread::spawn(move || {
                for chunk in sent.chunks(7_001) {
                    c.write_all(chunk).unwrap();
                }
                c
            })
        };
        let mut got = Vec::new();
        let mut pooled = true;
        while got.len() < sent.len() {
            if pooled {
                let b = timeout(Duration::from_secs(5), s.read_pooled()).await.unwrap().unwrap();
                assert!(!b.is_empty());
                got.extend_from_slice(&b);
            } else {
                let (res, b) =
                    timeout(Duration::from_secs(5), s.read_owned(Vec::with_capacity(3_000)))
                        .await
                        .unwrap();
                let n = res.unwrap();
                assert!(n > 0);
                got.extend_from_slice(&b[..n]);
            }
            pooled = !pooled;
        }
        assert!(got == sent, "bytes came out of order or were lost");
        let c = writer.join().unwrap();
        drop(c);
        let b = timeout(Duration::from_secs(2), s.read_pooled()).await.unwrap().unwrap();
        assert!(b.is_empty(), "the end of the stream");
    });
}

/// A sender much faster than the reader: everything arrives, in order,
/// and the reader's side never queues more than a bounded amount.
#[hotloop::test(driver = "all")]
fn a_fast_sender_is_held_back_not_buffered(driver: DriverKind) {
    const TOTAL: usize = 8 << 20;
    let rt = runtime(driver);
    rt.block_on(async {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = StdStream::connect(l.local_addr().unwrap()).unwrap();
        let s = l.accept_stream().await.unwrap();
        let writer = std::thread::spawn(move || {
            let block = vec![7u8; 64 * 1024];
            for _ in 0..TOTAL / block.len() {
                c.write_all(&block).unwrap();
            }
            c.shutdown(std::net::Shutdown::Write).unwrap();
            let mut rest = Vec::new();
            let _ = c.read_to_end(&mut rest);
        });
        // Let the sender fill every buffer it can before reading.
        hotloop::time::sleep(Duration::from_millis(100)).await;
        let mut total = 0;
        loop {
            let b = timeout(Duration::from_secs(10), s.read_pooled()).await.unwrap().unwrap();
            if b.is_empty() {
                break;
            }
            assert!(b.iter().all(|&x| x == 7));
            total += b.len();
        }
        assert_eq!(total, TOTAL);
        drop(s);
        writer.join().unwrap();
    });
}

/// A pooled buffer dropped on another worker, or on a plain thread, goes
/// back to the worker that read into it, whose next read takes it again.
/// Before, the thread that dropped it kept it (or freed it): the reader's
/// pool stayed empty and every read there took a new buffer, while the
/// other worker's pool filled with buffers it had not lent.
#[hotloop::test(driver = "all")]
fn a_buffer_dropped_elsewhere_goes_back_to_its_reader(driver: DriverKind) {
    let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
    rt.block_on(async {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = StdStream::connect(l.local_addr().unwrap()).unwrap();
        let s = l.accept_stream().await.unwrap();
        let handle = hotloop::Handle::current();
        let mut buffers = HashSet::new();
        for round in 0..200 {
            c.write_all(b"x").unwrap();
            let b = timeout(Duration::from_secs(5), s.read_pooled()).await.unwrap().unwrap();
            assert_eq!(&*b, b"x");
            buffers.insert(b.as_ptr() as usize);
            if round % 2 == 0 {
                handle.spawn_on(1, move || async move { drop(b) }).await.unwrap();
            } else {
                std::thread::spawn(move || drop(b)).join().unwrap();
            }
        }
        assert_eq!(buffers.len(), 1, "the reader took a new buffer for each read");
    });
}
