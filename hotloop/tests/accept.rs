//! The accept path: the per-wakeup bound, accept pacing, TCP_NODELAY on
//! accepted sockets, and fairness (a task that only yields does not stop
//! accepts).

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use hotloop::net::{serve, AcceptMode, AcceptPacing, ListenerOptions, TcpListener};
use hotloop::DriverKind;
use hotloop::{spawn, yield_now, Runtime};

/// Starts a listener on worker 0 that sleeps (blocking its thread) before
/// accepting, so that `clients` connections wait in the backlog, then
/// serves them all; returns the runtime's counters.
fn burst_into_a_busy_listener(
    driver: DriverKind,
    options: ListenerOptions,
    clients: usize,
) -> hotloop::stats::Counters {
    burst_beside_hogs(driver, options, clients, 0)
}

/// As [`burst_into_a_busy_listener`], with `hogs` tasks beside the
/// listener that each burn 50 µs of CPU and yield, again and again, so the
/// run queue stays `hogs` long and every loop turn is full of work.
fn burst_beside_hogs(
    driver: DriverKind,
    options: ListenerOptions,
    clients: usize,
    hogs: usize,
) -> hotloop::stats::Counters {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let (tx, rx) = mpsc::channel::<SocketAddr>();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hog_done = done.clone();
    drop(rt.handle().spawn_on(0, move || async move {
        for _ in 0..hogs {
            let hog_done = hog_done.clone();
            spawn(async move {
                while !hog_done.load(std::sync::atomic::Ordering::Relaxed) {
                    let until = std::time::Instant::now() + Duration::from_micros(50);
                    while std::time::Instant::now() < until {
                        std::hint::spin_loop();
                    }
                    yield_now().await;
                }
            });
        }
        let listener = TcpListener::bind_with("127.0.0.1:0", options).unwrap();
        tx.send(listener.local_addr().unwrap()).unwrap();
        // Keep the worker busy while the clients connect.
        std::thread::sleep(Duration::from_millis(300));
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            spawn(common::echo(stream));
        }
    }));
    let addr = rx.recv().unwrap();
    let mut conns: Vec<TcpStream> =
        (0..clients).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for c in &mut conns {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(b"ping").unwrap();
    }
    for c in &mut conns {
        let mut buf = [0u8; 4];
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    rt.stats().workers[0]
}

#[hotloop::test(driver = "all")]
fn accepts_are_taken_in_batches_of_at_most_the_bound(driver: DriverKind) {
    let options = ListenerOptions {
        accepts_per_wakeup_max: Some(8),
        accept_pacing: None,
        ..Default::default()
    };
    let c = burst_into_a_busy_listener(driver, options, 200);
    assert_eq!(c.accepted, 200);
    assert!(
        c.max_accepted_per_wakeup <= 8,
        "batch of {} exceeds the bound of 8",
        c.max_accepted_per_wakeup
    );
    assert!(
        c.accept_wakeups >= 25,
        "200 connections in batches of 8 need 25 wakeups, saw {}",
        c.accept_wakeups
    );
    assert!(c.accept_bound_hits > 0);
}

#[hotloop::test(driver = "all")]
fn unlimited_accepts_drain_the_queue_in_one_wakeup(driver: DriverKind) {
    let options =
        ListenerOptions { accepts_per_wakeup_max: None, accept_pacing: None, ..Default::default() };
    let c = burst_into_a_busy_listener(driver, options, 200);
    assert_eq!(c.accepted, 200);
    assert!(
        c.max_accepted_per_wakeup > 8,
        "unbounded accept took only {} at once",
        c.max_accepted_per_wakeup
    );
    assert_eq!(c.accept_bound_hits, 0);
}

#[hotloop::test(driver = "all")]
fn paced_accepts_shrink_while_the_worker_is_behind(driver: DriverKind) {
    // 40 runnable tasks (over the run queue target of 32) and turns of
    // about 3 ms (61 polls of 50 µs, over the 1 ms target): the budget stays near one.
    let options = ListenerOptions {
        accepts_per_wakeup_max: None,
        accept_pacing: Some(AcceptPacing::default()),
        ..Default::default()
    };
    let c = burst_beside_hogs(driver, options, 100, 40);
    assert_eq!(c.accepted, 100);
    assert!(
        c.max_accepted_per_wakeup <= 8,
        "a paced batch of {} while behind",
        c.max_accepted_per_wakeup
    );
    assert!(
        c.accept_wakeups >= 25,
        "100 connections in small batches, saw {} wakeups",
        c.accept_wakeups
    );
}

#[hotloop::test(driver = "all")]
fn paced_accepts_grow_while_the_worker_keeps_up(driver: DriverKind) {
    let options = ListenerOptions {
        accepts_per_wakeup_max: Some(64),
        accept_pacing: Some(AcceptPacing::default()),
        ..Default::default()
    };
    let c = burst_into_a_busy_listener(driver, options, 300);
    assert_eq!(c.accepted, 300);
    assert!(
        c.max_accepted_per_wakeup > 8,
        "the budget did not grow: largest batch {}",
        c.max_accepted_per_wakeup
    );
    assert!(
        c.max_accepted_per_wakeup <= 64,
        "batch of {} exceeds the cap of 64",
        c.max_accepted_per_wakeup
    );
}

#[hotloop::test(driver = "all")]
fn accepted_sockets_inherit_nodelay(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let nodelay = rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || TcpStream::connect(addr).unwrap());
        let (stream, peer) = listener.accept().await.unwrap();
        assert!(peer.ip().is_loopback());
        drop(client.join().unwrap());
        stream.nodelay().unwrap()
    });
    assert!(nodelay);
}

#[hotloop::test(driver = "all")]
fn a_task_that_only_yields_does_not_stop_accepts(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let (tx, rx) = mpsc::channel::<SocketAddr>();
    drop(rt.handle().spawn_on(0, move || async move {
        spawn(async {
            loop {
                // A timer, not `yield_now`: a yielding task would run up to
                // `event_interval` times per turn.
                hotloop::time::sleep(Duration::from_millis(1)).await;
            }
        });
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        tx.send(listener.local_addr().unwrap()).unwrap();
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            spawn(common::echo(stream));
        }
    }));
    let addr = rx.recv().unwrap();
    for _ in 0..20 {
        assert_eq!(common::roundtrip(addr, b"hello", 5), b"hello");
    }
}

/// Two tasks accepting on one listener both get a connection: a second
/// waiter does not push the first one out.
#[hotloop::test(driver = "all")]
fn two_tasks_accepting_on_one_listener_both_get_one(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    rt.block_on(async {
        let l = std::rc::Rc::new(TcpListener::bind("127.0.0.1:0").unwrap());
        let addr = l.local_addr().unwrap();
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let l = l.clone();
                spawn(async move { l.accept_stream().await.map(drop) })
            })
            .collect();
        hotloop::time::sleep(Duration::from_millis(10)).await; // both are parked
        let _c1 = TcpStream::connect(addr).unwrap();
        hotloop::time::sleep(Duration::from_millis(10)).await;
        let _c2 = TcpStream::connect(addr).unwrap();
        for t in tasks {
            hotloop::time::timeout(Duration::from_secs(2), t)
                .await
                .expect("an accepting task was never woken")
                .unwrap()
                .unwrap();
        }
    });
}

#[hotloop::test(driver = "all")]
fn single_and_multishot_accept_both_serve(driver: DriverKind) {
    for mode in [AcceptMode::Multishot, AcceptMode::Single] {
        let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
        let options = ListenerOptions { accept_mode: mode, ..ListenerOptions::default() };
        let server = serve(rt.handle(), "127.0.0.1:0", options, common::echo).unwrap();
        let addr = server.local_addr();
        let clients: Vec<_> = (0..4)
            .map(|c| {
                std::thread::spawn(move || {
                    for i in 0..15 {
                        let msg = format!("{mode:?} client {c} message {i}");
                        let back = common::roundtrip(addr, msg.as_bytes(), msg.len());
                        assert_eq!(back, msg.as_bytes());
                    }
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
        assert_eq!(server.shutdown_blocking(Duration::from_secs(5)), 0);
        let stats = rt.stats();
        assert_eq!(stats.total.accepted, 60, "{mode:?}");
        if stats.info.driver == "uring" && mode == AcceptMode::Single {
            assert_eq!(stats.total.multishot_rearms, 0);
        }
    }
}

/// A task accepting while its owner says it takes no connection
/// (`set_accept_room(Some(0))`, a server at its limit a moment ago) still
/// gets the one that comes once the owner lifts the bound: on io_uring an
/// accept polled with no room used to arm nothing, and lifting the room
/// woke nobody, so the task waited until its listener was dropped.
#[hotloop::test(driver = "all")]
async fn an_accept_polled_with_no_room_is_served_once_the_room_rises() {
    let l = std::rc::Rc::new(TcpListener::bind("127.0.0.1:0").unwrap());
    let addr = l.local_addr().unwrap();
    l.set_accept_room(Some(0));
    let accepting = spawn({
        let l = l.clone();
        async move { l.accept_stream().await.map(drop) }
    });
    hotloop::time::sleep(Duration::from_millis(10)).await; // parked
    let _client = TcpStream::connect(addr).unwrap();
    hotloop::time::sleep(Duration::from_millis(20)).await;
    l.set_accept_room(None);
    hotloop::time::timeout(Duration::from_secs(1), accepting)
        .await
        .expect("the accepting task was never woken")
        .unwrap()
        .unwrap();
}

/// An accept armed, then stopped by a room of zero before the kernel saw
/// it, then allowed again: the waiting task is woken to arm a new one.
#[hotloop::test(driver = "all")]
async fn an_accept_stopped_by_no_room_resumes_when_the_room_comes_back() {
    let l = std::rc::Rc::new(TcpListener::bind("127.0.0.1:0").unwrap());
    let addr = l.local_addr().unwrap();
    let accepting = spawn({
        let l = l.clone();
        async move { l.accept_stream().await.map(drop) }
    });
    // The accepting task runs (and arms its accept) within this turn.
    hotloop::yield_now().await;
    l.set_accept_room(Some(0));
    l.set_accept_room(None);
    let _client = TcpStream::connect(addr).unwrap();
    hotloop::time::timeout(Duration::from_secs(1), accepting)
        .await
        .expect("the accepting task was never woken")
        .unwrap()
        .unwrap();
}

/// A task that asks for a connection takes one from the backlog even
/// while the owner's room is zero: asking is taking one.
#[hotloop::test(driver = "all")]
async fn an_accept_with_no_room_takes_a_client_already_waiting() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let _client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    l.set_accept_room(Some(0));
    hotloop::time::timeout(Duration::from_secs(1), l.accept_stream())
        .await
        .expect("an accept with no room never took the waiting client")
        .unwrap();
}
