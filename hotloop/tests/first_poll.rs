//! A new connection's first poll may run inside its accept loop's poll
//! (when nothing else waits to run): whatever that poll does, panic, finish,
//! wait, spawn or stop the server, the accept loop and the worker carry on
//! as if the handler had run on its own.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hotloop::net::{serve, serve_with_stop, ServerOptions};
use hotloop::DriverKind;
use hotloop::Runtime;

fn runtime(driver: DriverKind) -> Runtime {
    Runtime::builder().workers(1).driver(driver).build().unwrap()
}

fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// Connects, sends `req`, and reads until the server closes.
fn exchange(addr: SocketAddr, req: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

/// Replies `ok` to a request already in the socket, and closes.
async fn reply_once(stream: hotloop::net::TcpStream) {
    let (res, buf) = stream.read_owned(Vec::with_capacity(64)).await;
    if matches!(res, Ok(n) if n > 0) && buf.first() == Some(&b'p') {
        panic!("a handler panicked in its first poll");
    }
    let _ = stream.write_all_owned(b"ok".to_vec()).await;
}

#[hotloop::test(driver = "all")]
fn a_handler_that_panics_in_its_first_poll_spares_the_accept_loop(driver: DriverKind) {
    let rt = runtime(driver);
    let server = serve(rt.handle(), "127.0.0.1:0", ServerOptions::default(), reply_once).unwrap();
    let addr = server.local_addr();
    for round in 0..20 {
        // One panicking connection, then one that must still be served by the same loop.
        assert_eq!(exchange(addr, b"panic"), b"", "round {round}: the panicking one is closed");
        assert_eq!(exchange(addr, b"hello"), b"ok", "round {round}: the next one is served");
    }
    assert!(wait_for(|| server.active_connections() == 0), "every connection was counted finished");
    let stats = rt.stats().total;
    assert_eq!(stats.accepted, 40);
}

#[hotloop::test(driver = "all")]
fn connections_served_in_place_and_queued_alike_all_finish(driver: DriverKind) {
    // Clients that send at once (served in the loop's poll) mixed with
    // clients that connect and wait before sending (their handler parks),
    // from several threads, so the queue is sometimes empty and sometimes not.
    let rt = runtime(driver);
    let server = serve(rt.handle(), "127.0.0.1:0", ServerOptions::default(), reply_once).unwrap();
    let addr = server.local_addr();
    let served = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let served = served.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let mut s = TcpStream::connect(addr).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    if (i + t) % 3 == 0 {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    s.write_all(b"hello").unwrap();
                    let mut out = Vec::new();
                    let _ = s.read_to_end(&mut out);
                    if out == b"ok" {
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(served.load(Ordering::Relaxed), 200);
    assert!(wait_for(|| server.active_connections() == 0));
}

#[hotloop::test(driver = "all")]
fn a_first_poll_that_spawns_and_stops_the_server_ends_cleanly(driver: DriverKind) {
    // The handler spawns a task and, on a `stop` request, stops the server
    // from inside its first poll, which runs while the accept loop is
    // being polled.
    let rt = runtime(driver);
    let server_slot: Arc<Mutex<Option<Arc<hotloop::net::Server>>>> = Arc::new(Mutex::new(None));
    let spawned = Arc::new(AtomicUsize::new(0));
    let handler = {
        let server_slot = server_slot.clone();
        let spawned = spawned.clone();
        move |stream: hotloop::net::TcpStream, _stop| {
            let server_slot = server_slot.clone();
            let spawned = spawned.clone();
            async move {
                let (res, buf) = stream.read_owned(Vec::with_capacity(64)).await;
                let spawned = spawned.clone();
                hotloop::spawn(async move {
                    spawned.fetch_add(1, Ordering::Relaxed);
                });
                if matches!(res, Ok(n) if n > 0) && buf.starts_with(b"stop") {
                    if let Some(server) = server_slot.lock().unwrap().as_ref() {
                        server.stop();
                    }
                }
                let _ = stream.write_all_owned(b"ok".to_vec()).await;
            }
        }
    };
    let server = Arc::new(
        serve_with_stop(rt.handle(), "127.0.0.1:0", ServerOptions::default(), handler).unwrap(),
    );
    *server_slot.lock().unwrap() = Some(server.clone());
    let addr = server.local_addr();
    for _ in 0..10 {
        assert_eq!(exchange(addr, b"hello"), b"ok");
    }
    assert_eq!(exchange(addr, b"stop"), b"ok", "the stopping connection is answered");
    assert!(wait_for(|| spawned.load(Ordering::Relaxed) == 11), "every spawned task ran");
    assert!(wait_for(|| TcpStream::connect(addr).is_err()), "the listener closed after the stop");
    assert!(wait_for(|| server.active_connections() == 0));
    // The worker still runs tasks.
    let r = rt.handle().spawn_on(0, || async { 7 }).join();
    assert_eq!(r.unwrap(), 7);
}

/// A handler that owns a `Runtime` drops it in its first poll, normally
/// and while unwinding from a panic: the dropped runtime's shutdown
/// takes over the thread's context for a moment and must find it free
/// (a poll in place runs with nothing of the worker's borrowed). Runs in
/// a child process, which an abort would kill.
#[hotloop::test(driver = "all")]
fn a_first_poll_that_drops_a_runtime_it_owns_leaves_the_server_serving(driver: DriverKind) {
    let out = common::run_child(
        &harness_name("owned_runtime_in_first_poll_child"),
        "HOTLOOP_FIRST_POLL_CHILD",
        driver,
    );
    assert!(out.contains("first poll runtimes: ok"));
}

/// The child of the test above.
#[test]
fn owned_runtime_in_first_poll_child() {
    let Some(driver) = common::child_driver("HOTLOOP_FIRST_POLL_CHILD") else { return };
    let rt = runtime(driver);
    let handler = move |stream: hotloop::net::TcpStream| async move {
        let (res, buf) = stream.read_owned(Vec::with_capacity(64)).await;
        let inner = Runtime::builder().workers(1).driver(driver).build().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        inner.handle().spawn(async move { tx.send(5).unwrap() });
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 5);
        if matches!(res, Ok(n) if n > 0) && buf.first() == Some(&b'p') {
            let _owned = inner;
            panic!("the owner panics");
        }
        drop(inner);
        let _ = stream.write_all_owned(b"ok".to_vec()).await;
    };
    let server = serve(rt.handle(), "127.0.0.1:0", ServerOptions::default(), handler).unwrap();
    let addr = server.local_addr();
    for round in 0..3 {
        assert_eq!(exchange(addr, b"hello"), b"ok", "round {round}: dropped normally");
        assert_eq!(exchange(addr, b"panic"), b"", "round {round}: dropped while unwinding");
    }
    assert_eq!(exchange(addr, b"hello"), b"ok", "still serving");
    assert!(wait_for(|| server.active_connections() == 0));
    println!("first poll runtimes: ok");
}

/// The name the test harness knows `name` by: prefixed with this file's
/// module path below the test crate (`file::name` in `tests/suite.rs`, just
/// `name` in a binary of its own), for running one test in a child.
fn harness_name(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}
