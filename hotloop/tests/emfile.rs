//! Running out of descriptors on accept: the loop neither spins nor drops
//! the listener; it pauses, counts, and serves everyone once descriptors
//! free up. In its own binary because it lowers the process's fd limit.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use hotloop::net::TcpListener;
use hotloop::DriverKind;
use hotloop::{spawn, Runtime};

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

fn run(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let (tx, rx) = mpsc::channel::<SocketAddr>();
    drop(rt.handle().spawn_on(0, move || async move {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        tx.send(listener.local_addr().unwrap()).unwrap();
        // Keep the worker out of its driver while the clients connect and the
        // limit drops, so no driver (io_uring's multishot accept included)
        // has taken their connections yet.
        std::thread::sleep(Duration::from_millis(400));
        loop {
            match listener.accept_stream().await {
                Ok(stream) => drop(spawn(common::echo(stream))),
                Err(e) => panic!("the accept loop gave up: {e}"),
            }
        }
    }));
    let addr = rx.recv().unwrap();

    // Open the clients first, then leave the server only a few descriptors.
    const CLIENTS: usize = 40;
    let mut clients: Vec<TcpStream> =
        (0..CLIENTS).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for c in &mut clients {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(b"x").unwrap();
    }
    let open = hotloop::open_fd_count().unwrap() as u64;
    let old = set_nofile(open + 5);
    std::thread::sleep(Duration::from_millis(700));
    let during = rt.stats().workers[0];
    assert!(during.accept_errors_resources > 0, "{driver:?}: the server ran out of descriptors");
    assert!(during.accept_pauses > 0);
    // A spinning loop would poll hundreds of thousands of times in 300 ms;
    // pausing 10 ms per EMFILE keeps it to a few hundred.
    assert!(during.tasks_polled < 5_000, "accept loop spun: {} polls", during.tasks_polled);

    // Serve them one by one: each client that finishes frees a descriptor.
    for mut c in clients.drain(..) {
        let mut b = [0u8; 1];
        c.read_exact(&mut b).expect("every client is served once descriptors free up");
        assert_eq!(&b, b"x");
    }
    set_nofile(old);
    assert_eq!(rt.stats().workers[0].accepted, CLIENTS as u64);
}

#[test]
fn emfile_pauses_accepting_and_recovers_on_each_driver() {
    run(DriverKind::Epoll);
    if !common::skip_uring() {
        run(DriverKind::Uring);
    }
}
