//! The proxy at its open-file limit with a backend that never answers:
//! every client waits for the connect timeout (none is cut at once because
//! the client's socket took the descriptor its backend socket needed), the
//! descriptors come back, and running out is logged once per episode, not
//! per retry. Both drivers, two workers.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{wait_until, Proc};
use hotloop::DriverKind;

const NOFILE: u32 = 128;
const CLIENTS: usize = 150;
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);

/// A listener whose accept queue is full and never drained: further
/// handshakes are dropped by the kernel, so connects to it hang.
fn black_hole() -> (TcpListener, Vec<TcpStream>, SocketAddr) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into()).unwrap();
    socket.listen(0).unwrap();
    let listener: TcpListener = socket.into();
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    while let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
        fillers.push(s);
        assert!(fillers.len() < 16, "the black hole's queue never filled");
    }
    (listener, fillers, addr)
}

#[hotloop::test(driver = "all")]
fn at_the_descriptor_limit_clients_wait_for_the_connect_timeout(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_hole, _fillers, backend) = black_hole();
    let mut p = Proc::start_with_nofile(
        NOFILE,
        &[
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--backend",
            &backend.to_string(),
            "--workers",
            "2",
            "--driver",
            driver,
            "--connect-timeout-ms",
            &CONNECT_TIMEOUT.as_millis().to_string(),
        ],
    );
    let addr = p.addr_after(" on ");
    let baseline = p.fds();

    // Each client sends a byte and times how long until the proxy ends it.
    let (tx, ended) = mpsc::channel();
    for _ in 0..CLIENTS {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let _ = s.write_all(b"x");
            let end = s.read(&mut [0u8; 16]);
            let _ = tx.send((start.elapsed(), end.map_err(|e| e.kind())));
        });
    }
    drop(tx);
    let ends: Vec<(Duration, Result<usize, std::io::ErrorKind>)> = ended.iter().collect();
    assert_eq!(ends.len(), CLIENTS, "{driver}: a client thread failed");
    let early: Vec<_> =
        ends.iter().filter(|(after, _)| *after < CONNECT_TIMEOUT.mul_f64(0.9)).collect();
    assert!(
        early.is_empty(),
        "{driver}: {} of {CLIENTS} clients were cut before the connect timeout: {:?}",
        early.len(),
        &early[..early.len().min(10)]
    );
    assert!(
        ends.iter().all(|(_, end)| matches!(end, Ok(0) | Err(_))),
        "{driver}: a client read bytes from a backend that never answered"
    );

    // The descriptors come back.
    assert!(
        wait_until(Duration::from_secs(10), || p.fds() <= baseline + 2),
        "{driver}: {} descriptors open after the run, {baseline} before: {:#?}",
        p.fds(),
        p.fd_targets()
    );
    p.collect_lines(Duration::from_millis(1500));
    let failed = p.seen.iter().filter(|l| l.contains("accept failed")).count();
    let again = p.seen.iter().filter(|l| l.contains("accepting again")).count();
    // Logged once per run of failures, not once per retry: a run ends after
    // a quiet second, and the limit is met again by each wave of clients
    // (about NOFILE / 2 clients are let in per connect timeout), so a worker
    // logs at most one run per wave, each run counting many retries.
    let waves = CLIENTS.div_ceil(NOFILE as usize / 2) + 1;
    assert!(
        failed >= 1 && failed <= 2 * waves && again == failed,
        "{driver}: {failed} runs of failures logged, {again} ends: {:#?}",
        p.seen
    );
}
