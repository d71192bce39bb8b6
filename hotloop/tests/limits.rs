//! Connection limits: at `maxconn` the listener stops accepting (the
//! kernel's backlog holds the rest) and resumes as connections finish.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use hotloop::net::{serve, ServerOptions};
use hotloop::DriverKind;
use hotloop::Runtime;

fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..200 {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Serialises the tests of this file: one counts the process's descriptors.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn limit_test(driver: DriverKind, options: ServerOptions, workers: usize, limit: u64) {
    let _serial = serial();
    let rt = Runtime::builder().workers(workers).driver(driver).build().unwrap();
    let server = serve(rt.handle(), "127.0.0.1:0", options, common::echo).unwrap();
    let addr = server.local_addr();
    let mut clients: Vec<TcpStream> = (0..6).map(|_| TcpStream::connect(addr).unwrap()).collect();
    assert!(wait_for(|| rt.stats().total.accepted >= limit), "accepted up to the limit");
    std::thread::sleep(Duration::from_millis(100));
    let c = rt.stats().total;
    // Workers race for the last slot; the loser holds its connection
    // (accepted, not closed, not served) until a slot frees.
    assert!(
        c.accepted < limit + workers as u64,
        "accepted {} beyond the limit {limit}",
        c.accepted
    );
    assert!(c.maxconn_reached > 0);
    assert_eq!(
        server.active_connections() as u64,
        limit,
        "no more than the limit are served at once"
    );
    let accepted_at_limit = c.accepted;
    // Finish one accepted connection (one that echoes): one more is accepted.
    let served_now = clients
        .iter_mut()
        .position(|c| {
            c.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            let mut b = [0u8; 1];
            c.write_all(b"x").is_ok() && c.read_exact(&mut b).is_ok()
        })
        .expect("an accepted connection echoes");
    drop(clients.remove(served_now));
    assert!(
        wait_for(|| rt.stats().total.accepted >= accepted_at_limit.max(limit + 1)),
        "resumed after a connection finished"
    );
    for c in clients.iter_mut() {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    }
    // Close everyone still waiting in the backlog only after the accepted ones answer.
    // Every client is served as slots free up (in whatever order the
    // workers accept them: each client finishes on its own thread).
    let threads: Vec<_> = clients
        .drain(..)
        .map(|mut c| {
            std::thread::spawn(move || {
                let mut b = [0u8; 1];
                c.write_all(b"hi").is_ok() && c.read_exact(&mut b).is_ok()
            })
        })
        .collect();
    let served = threads.into_iter().map(|t| t.join().unwrap()).filter(|ok| *ok).count();
    assert_eq!(served, 5, "every client is served as slots free up");
}

#[hotloop::test(driver = "all")]
fn per_worker_maxconn_pauses_accepting(driver: DriverKind) {
    let options = ServerOptions { maxconn_per_worker: Some(2), ..Default::default() };
    limit_test(driver, options, 1, 2);
}

#[hotloop::test(driver = "all")]
fn global_maxconn_pauses_accepting(driver: DriverKind) {
    let options = ServerOptions { maxconn: Some(3), ..Default::default() };
    limit_test(driver, options, 2, 3);
}

/// At `maxconn` the driver holds no descriptors beyond the limit: on
/// io_uring the multishot accept stops, so the kernel's backlog (not
/// the driver's queue) holds the clients that wait; it resumes as
/// connections finish.
#[hotloop::test(driver = "all")]
fn maxconn_bounds_descriptors_not_only_handlers(driver: DriverKind) {
    const LIMIT: usize = 10;
    const CLIENTS: usize = 120;
    let _serial = serial();
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let options = ServerOptions { maxconn: Some(LIMIT), ..Default::default() };
    let server = serve(rt.handle(), "127.0.0.1:0", options, common::echo).unwrap();
    let addr = server.local_addr();
    std::thread::sleep(Duration::from_millis(50));
    let baseline = hotloop::open_fd_count().unwrap();
    let mut clients: Vec<TcpStream> =
        (0..CLIENTS).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let held = hotloop::open_fd_count().unwrap() - baseline - CLIENTS;
    assert!(
        held <= LIMIT + 2,
        "the server holds {held} descriptors for {CLIENTS} clients at maxconn {LIMIT}"
    );
    // Finishing connections lets the waiting ones in, one slot at a time.
    for c in clients.drain(..LIMIT) {
        drop(c);
    }
    assert!(wait_for(|| rt.stats().total.accepted >= 2 * LIMIT as u64), "accepting resumed");
    let mut c = clients.pop().unwrap();
    drop(clients);
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    c.read_exact(&mut b).expect("a waiting client is served once slots free");
    assert_eq!(&b, b"ping");
}
