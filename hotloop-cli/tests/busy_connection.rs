//! One connection that never lets its worker wait does not keep that
//! worker from its other clients: a client pipelines requests to
//! `serve http --workers 1` (each costing 1 ms of CPU, `--work-us`) far
//! ahead of their answers and reads the answers as fast as they come, so
//! the connection's reads find requests and its writes find room, and a
//! second client's GET is still answered at once. (Without the runtime's
//! cooperative budget the busy connection's task returned to the loop
//! only when it had read all the socket held, a receive window of
//! requests, seconds of work (on io_uring, often not for seconds either):
//! meanwhile no accept, no timer and no other connection ran.) Both
//! drivers.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::Proc;
use hotloop::DriverKind;

/// How long the busy client keeps at it, at most.
const BUSY_LIMIT: Duration = Duration::from_secs(10);
/// How long the second client may wait for its answer: with the budget,
/// a turn or two of the busy connection's work (128 answers a turn,
/// about 0.13 s), with room for a loaded machine; without, a receive window of
/// requests (thousands, seconds) on epoll, often seconds on io_uring.
const ANSWER_LIMIT: Duration = Duration::from_secs(1);
/// Requests in each of the busy client's writes.
const BATCH: usize = 256;
/// The busy client's socket buffers (capped by the kernel at
/// `net.core.wmem_max` and `rmem_max`): requests written ahead and
/// answers not yet read wait there, so the server always finds the next
/// request and room for its answer even while a loaded machine keeps the
/// client's threads waiting for a CPU.
const CLIENT_BUFFER: usize = 8 << 20;
/// CPU each request costs the server (`--work-us`): the client stays
/// far ahead.
const WORK_US: &str = "1000";

/// The busy client's two halves, until `stop` or [`BUSY_LIMIT`]: one
/// writes batches of pipelined requests, the other reads the answers and
/// counts their bytes in `read`.
fn busy_client(addr: SocketAddr, stop: &AtomicBool, read: &AtomicU64) {
    let mut writer = TcpStream::connect(addr).expect("connect");
    let sock = socket2::SockRef::from(&writer);
    sock.set_send_buffer_size(CLIENT_BUFFER).unwrap();
    sock.set_recv_buffer_size(CLIENT_BUFFER).unwrap();
    let mut reader = writer.try_clone().unwrap();
    reader.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    // A write blocked when the test stops ends soon.
    writer.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
    let start = Instant::now();
    let going = || !stop.load(Ordering::SeqCst) && start.elapsed() < BUSY_LIMIT;
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let batch = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n".repeat(BATCH);
            // The batches one after another, a write at a time: a write
            // the server takes too slowly to finish in the timeout goes on.
            let mut at = 0;
            while going() {
                match writer.write(&batch[at..]) {
                    Ok(n) if n > 0 => at = (at + n) % batch.len(),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    _ => break,
                }
            }
            let _ = writer.shutdown(std::net::Shutdown::Both);
        });
        let mut buf = vec![0u8; 1 << 20];
        while going() {
            match reader.read(&mut buf) {
                Ok(n) if n > 0 => {
                    read.fetch_add(n as u64, Ordering::SeqCst);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                _ => break,
            }
        }
        stop.store(true, Ordering::SeqCst);
        // Ends a write still blocked on the server.
        let _ = reader.shutdown(std::net::Shutdown::Both);
    });
}

/// How long a fresh client waits for the head of its answer.
fn answer_time(addr: SocketAddr) -> Result<Duration, String> {
    let start = Instant::now();
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(ANSWER_LIMIT)).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut head = [0u8; 15];
    s.read_exact(&mut head).map_err(|e| format!("{e} after {:?}", start.elapsed()))?;
    if &head != b"HTTP/1.1 200 OK" {
        return Err(String::from_utf8_lossy(&head).into_owned());
    }
    Ok(start.elapsed())
}

#[hotloop::test(driver = "all")]
fn a_pipelining_client_does_not_keep_the_worker_from_another(driver: DriverKind) {
    let args = [
        "serve",
        "http",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--driver",
        common::driver_arg(driver),
        "--work-us",
        WORK_US,
    ];
    let mut p = Proc::start(&args);
    let addr = p.addr_after(" on ");
    let (stop, read) = (AtomicBool::new(false), AtomicU64::new(0));
    let answered = std::thread::scope(|scope| {
        scope.spawn(|| busy_client(addr, &stop, &read));
        // The busy connection is being served before the second client comes.
        let flowing =
            common::wait_until(Duration::from_secs(5), || read.load(Ordering::SeqCst) > 16 << 10);
        let answered = answer_time(addr);
        let still_busy = !stop.swap(true, Ordering::SeqCst);
        assert!(flowing, "the busy client got no answers");
        assert!(still_busy, "the busy client stopped before the second client's answer");
        answered
    });
    if let Err(e) = answered {
        panic!("no answer for a second client beside a pipelining one ({e})");
    }
}
