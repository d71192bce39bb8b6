//! An accept that runs out of descriptors first asks the worker's
//! reclaimers (`net::on_descriptor_shortage`: a cache of open files) to
//! close what they can spare, and tries again at once when they did,
//! instead of pausing. In its own binary because it lowers the process's
//! fd limit.

mod common;

use std::cell::RefCell;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use hotloop::net::{on_descriptor_shortage, ListenerOptions, TcpListener};
use hotloop::{spawn, DriverKind, Runtime};

/// Sets the soft open-file limit; returns the one before.
fn set_nofile(soft: u64) -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write one live rlimit.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        let old = lim.rlim_cur;
        lim.rlim_cur = soft;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        old
    }
}

thread_local! {
    /// What the worker keeps and can give back: stands in for a cache of
    /// open files.
    static SPARE: RefCell<Vec<File>> = const { RefCell::new(Vec::new()) };
}

/// How long accepting would pause without the reclaimers: far beyond what
/// the test waits.
const PAUSE: Duration = Duration::from_secs(60);

fn run(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let (tx, rx) = mpsc::channel::<SocketAddr>();
    let reclaimed = Arc::new(AtomicUsize::new(0));
    let counted = reclaimed.clone();
    drop(rt.handle().spawn_on(0, move || async move {
        let options = ListenerOptions { resource_pause: PAUSE, ..ListenerOptions::default() };
        let listener = TcpListener::bind_with("127.0.0.1:0", options).unwrap();
        SPARE.with(|s| {
            s.borrow_mut().extend((0..4).map(|_| File::open("/dev/null").unwrap()));
        });
        on_descriptor_shortage(move || {
            let closed = SPARE.with(|s| s.take().len());
            counted.fetch_add(closed, Ordering::Relaxed);
            closed
        });
        tx.send(listener.local_addr().unwrap()).unwrap();
        // Keep the worker out of its driver while the client connects and
        // the test takes every descriptor left, so nothing has accepted
        // the connection yet.
        std::thread::sleep(Duration::from_millis(400));
        loop {
            match listener.accept_stream().await {
                Ok(stream) => drop(spawn(common::echo(stream))),
                Err(e) => panic!("the accept loop gave up: {e}"),
            }
        }
    }));
    let addr = rx.recv().unwrap();
    let mut client = TcpStream::connect(addr).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    client.write_all(b"x").unwrap();
    // No descriptor left for the server's accept: a low limit, filled up.
    let old = set_nofile(hotloop::open_fd_count().unwrap() as u64 + 8);
    let mut filler = Vec::new();
    while let Ok(f) = File::open("/dev/null") {
        filler.push(f);
    }
    let start = Instant::now();
    let mut b = [0u8; 1];
    let echoed = client.read_exact(&mut b);
    drop(filler);
    set_nofile(old);
    echoed.unwrap_or_else(|e| {
        panic!("{driver:?}: not served after {:?} (accepting paused?): {e}", start.elapsed())
    });
    assert_eq!(&b, b"x");
    assert_eq!(reclaimed.load(Ordering::Relaxed), 4, "{driver:?}: the spare descriptors went");
    let stats = rt.stats().workers[0];
    assert!(stats.accept_errors_resources > 0, "{driver:?}: the accept ran out first");
}

#[test]
fn an_accept_out_of_descriptors_reclaims_and_retries_at_once_on_each_driver() {
    run(DriverKind::Epoll);
    if !common::skip_uring() {
        run(DriverKind::Uring);
    }
}
