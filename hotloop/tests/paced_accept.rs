//! Under accept pacing the driver accepts no further ahead of the accept
//! loop than the loop's budget, whether the worker is behind or has
//! caught up: on io_uring the multishot accept, which would take a whole
//! backlog in one enter, is never armed, and the waiting connections stay
//! in the kernel's backlog as they do on epoll.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use hotloop::net::{AcceptPacing, ListenerOptions, TcpListener};
use hotloop::DriverKind;
use hotloop::{open_fd_count, spawn, yield_now, Runtime};

/// Connections in the burst.
const BURST: usize = 200;
/// Tasks that keep the run queue over pacing's target (32).
const HOGS: usize = 40;

/// Serialises the variants: each counts the process's descriptors.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[hotloop::test(driver = "all")]
fn a_worker_behind_accepts_nothing_ahead_of_its_loop(driver: DriverKind) {
    let _serial = serial();
    hotloop::raise_nofile_limit().unwrap();
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let (burst_tx, burst_rx) = mpsc::channel::<()>();
    let stop = Arc::new(AtomicBool::new(false));
    let hog_stop = stop.clone();
    let worker = rt.handle().spawn_on(0, move || async move {
        for _ in 0..HOGS {
            let stop = hog_stop.clone();
            spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    yield_now().await;
                }
            });
        }
        let options = ListenerOptions {
            accept_pacing: Some(AcceptPacing::default()),
            ..ListenerOptions::default()
        };
        let listener = TcpListener::bind_with("127.0.0.1:0", options).unwrap();
        addr_tx.send(listener.local_addr().unwrap()).unwrap();
        // Warm-up connections: pacing sees the long run queue and falls behind.
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(listener.accept_stream().await.unwrap());
        }
        let baseline = open_fd_count().unwrap();
        // Blocks the worker while the burst connects: whatever the driver
        // accepts meanwhile is ahead of the loop.
        burst_rx.recv().unwrap();
        let mut ahead_max = 0;
        for taken in 1..=BURST {
            held.push(listener.accept_stream().await.unwrap());
            let open = open_fd_count().unwrap();
            ahead_max = ahead_max.max(open.saturating_sub(baseline + BURST + taken));
        }
        ahead_max
    });
    let addr = addr_rx.recv().unwrap();
    let warm: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let burst: Vec<TcpStream> = (0..BURST).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    burst_tx.send(()).unwrap();
    let ahead_max = worker.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    drop((warm, burst));
    // The budget while behind is one or two, and one single accept may be
    // armed beside it.
    assert!(
        ahead_max <= 4,
        "{ahead_max} connections were accepted ahead of a loop that was behind"
    );
}

/// Connections of the warm-up that lets pacing's budget grow to its cap.
const WARM_UP: usize = 12;

/// A worker that is not behind (its budget grown to the cap, nothing else
/// to run) and then finds a backlog of connections at once, as it does
/// after a quiet spell when a storm's retransmitted handshakes arrive
/// together: it still accepts no more than its budget ahead of its loop.
#[hotloop::test(driver = "all")]
fn a_worker_that_caught_up_accepts_no_further_ahead_than_its_budget(driver: DriverKind) {
    let _serial = serial();
    hotloop::raise_nofile_limit().unwrap();
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let (addr_tx, addr_rx) = mpsc::channel::<SocketAddr>();
    let (accepted_tx, accepted_rx) = mpsc::channel::<()>();
    let (burst_tx, burst_rx) = mpsc::channel::<()>();
    let worker = rt.handle().spawn_on(0, move || async move {
        let options = ListenerOptions {
            accept_pacing: Some(AcceptPacing::default()),
            ..ListenerOptions::default()
        };
        let cap = options.accepts_per_wakeup_max.unwrap();
        let listener = TcpListener::bind_with("127.0.0.1:0", options).unwrap();
        addr_tx.send(listener.local_addr().unwrap()).unwrap();
        // One connection per loop turn, with nothing else to run: the
        // worker keeps up, and the budget grows by 4 a turn to its cap.
        let mut held = Vec::new();
        for _ in 0..WARM_UP {
            held.push(listener.accept_stream().await.unwrap());
            accepted_tx.send(()).unwrap();
        }
        let baseline = open_fd_count().unwrap();
        // Blocks the worker while the burst connects: whatever the driver
        // accepts meanwhile is ahead of the loop.
        burst_rx.recv().unwrap();
        let mut ahead_max = 0;
        for taken in 1..=BURST {
            held.push(listener.accept_stream().await.unwrap());
            let open = open_fd_count().unwrap();
            ahead_max = ahead_max.max(open.saturating_sub(baseline + BURST + taken));
        }
        (ahead_max, cap)
    });
    let addr = addr_rx.recv().unwrap();
    let mut warm = Vec::new();
    for _ in 0..WARM_UP {
        warm.push(TcpStream::connect(addr).unwrap());
        accepted_rx.recv().unwrap();
    }
    let burst: Vec<TcpStream> = (0..BURST).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    burst_tx.send(()).unwrap();
    let (ahead_max, cap) = worker.join().unwrap();
    drop((warm, burst));
    // A direct accept per connection, and at most one single accept armed
    // beside it; never a multishot accept's whole backlog.
    assert!(
        ahead_max <= 4 && ahead_max < cap,
        "{ahead_max} connections were accepted ahead of a paced loop (its cap is {cap})"
    );
}
