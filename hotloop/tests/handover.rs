//! Socket hand-over between processes (`net::Handover`): a successor
//! takes every listening socket, serves the connections waiting in their
//! queues, and the predecessor stops accepting and drains; a successor
//! that fails, or hangs past its ready wait, leaves the predecessor
//! serving and the next successor takes over; only a process of the same
//! user takes the sockets; systemd's `LISTEN_FDS`, a descriptor in it that
//! is not a socket included. Both drivers.
//!
//! A predecessor and its successor are two runtimes of this process (the
//! exchange goes over the upgrade socket all the same), or a child process
//! where the test needs one: a successor that panics, and socket
//! activation.

use crate::common::TempDir;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{BorrowedFd, RawFd};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// The upgrade example's server, to check its recipe.
#[allow(dead_code)]
#[path = "../examples/upgrade.rs"]
mod upgrade_example;

use hotloop::hyper::serve_hyper;
use hotloop::net::{serve, Handover, Server, ServerOptions, TcpStream as HotloopStream};
use hotloop::{DriverKind, Runtime};

const LIMIT: Duration = Duration::from_secs(10);

/// The environment variable that makes [`successor_child`] act.
const CHILD: &str = "HOTLOOP_HANDOVER_TEST_CHILD";

fn runtime(driver: DriverKind, workers: usize) -> Runtime {
    Runtime::builder().workers(workers).driver(driver).build().unwrap()
}

/// A fresh upgrade socket path, in a directory that goes (the socket
/// with it) when the returned guard is dropped.
fn socket_path() -> (TempDir, PathBuf) {
    let dir = TempDir::new("handover");
    let path = dir.join("upgrade.sock");
    (dir, path)
}

/// A handler that answers its first bytes with `name` and closes, or,
/// when they start with `h`, holds the connection until the client ends it.
fn named(
    name: &'static str,
) -> impl Fn(HotloopStream) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>
       + Send
       + Sync
       + 'static {
    move |s| {
        Box::pin(async move {
            let (n, buf) = s.read_owned(vec![0u8; 64]).await;
            if !matches!(n, Ok(1..)) {
                return;
            }
            if buf[0] == b'h' {
                while matches!(s.read_owned(vec![0u8; 64]).await.0, Ok(1..)) {}
                return;
            }
            let _ = s.write_all_owned(name.as_bytes().to_vec()).await;
        })
    }
}

/// Sends one byte and reads the answer to its end.
fn ask(s: &mut TcpStream) -> String {
    s.set_read_timeout(Some(LIMIT)).unwrap();
    s.write_all(b"q").unwrap();
    let mut got = String::new();
    s.read_to_string(&mut got).unwrap_or_else(|e| panic!("the answer failed: {e}"));
    got
}

fn options(handover: &Handover, maxconn: Option<usize>) -> ServerOptions {
    ServerOptions { maxconn, handover: Some(handover.clone()), ..Default::default() }
}

fn wait_until(mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out");
        thread::sleep(Duration::from_millis(2));
    }
}

/// A predecessor `A` at its connection limit leaves new connections in the
/// kernel's queues; the successor `B` gets every socket (with another
/// worker count too) and serves what waits there; `A` stops accepting,
/// drains what it held, and new connections go to `B`. None is refused or
/// reset.
fn queued_connections_go_to_the_successor(driver: DriverKind, workers_a: usize, workers_b: usize) {
    let (_dir, path) = socket_path();
    let rt_a = runtime(driver, workers_a);
    let handover_a = Handover::open(&path).unwrap();
    assert_eq!(handover_a.predecessor(), None);
    let a = serve(rt_a.handle(), "127.0.0.1:0", options(&handover_a, Some(1)), named("A")).unwrap();
    handover_a.ready().unwrap();
    let addr = a.local_addr();
    let mut holder = TcpStream::connect(addr).unwrap();
    holder.write_all(b"h").unwrap();
    wait_until(|| a.active_connections() == 1);
    // A holds its one connection: these wait in its sockets' accept queues.
    let queued: Vec<TcpStream> = (0..24).map(|_| TcpStream::connect(addr).unwrap()).collect();

    let rt_b = runtime(driver, workers_b);
    let handover_b = Handover::open(&path).unwrap();
    assert_eq!(handover_b.predecessor(), Some(std::process::id()));
    assert_eq!(handover_b.inherited(), workers_a, "every member of the SO_REUSEPORT group");
    let upgrades_before = rt_b.stats().lifecycle.upgrades_in;
    // Port 0 takes the inherited socket on that address.
    let b = serve(rt_b.handle(), "127.0.0.1:0", options(&handover_b, None), named("B")).unwrap();
    assert_eq!(b.local_addr(), addr);
    handover_b.ready().unwrap();
    assert!(handover_a.wait_replaced(Some(LIMIT)), "A was not told a successor serves");
    assert!(a.is_handed_over());
    // Every one is answered. At its limit a worker of A still takes one
    // connection ahead (it is then held, not closed, and served once A
    // stops): with two workers, the one not holding `holder` may have
    // taken one. The rest waited in the queues and are B's.
    let mut by_a = 0;
    for (i, mut s) in queued.into_iter().enumerate() {
        match ask(&mut s).as_str() {
            "B" => {}
            "A" => by_a += 1,
            other => {
                panic!("{driver:?} {workers_a}->{workers_b}: queued connection {i}: {other:?}")
            }
        }
    }
    assert!(by_a < workers_a, "{driver:?} {workers_a}->{workers_b}: A served {by_a} of the queue");
    assert_eq!(ask(&mut TcpStream::connect(addr).unwrap()), "B");
    drop(holder);
    let drained = a.drain_blocking(LIMIT);
    assert_eq!(drained.cut, 0, "{drained:?}");
    assert!(rt_b.stats().lifecycle.upgrades_in > upgrades_before);
    // A's sockets are closed; B's still serve.
    drop(rt_a);
    assert_eq!(ask(&mut TcpStream::connect(addr).unwrap()), "B");
    assert_eq!(b.drain_blocking(LIMIT).cut, 0);
}

#[hotloop::test(driver = "all")]
fn one_worker_hands_over_the_connections_in_its_backlog(driver: DriverKind) {
    queued_connections_go_to_the_successor(driver, 1, 1);
}

#[hotloop::test(driver = "all")]
fn two_workers_hand_over_every_member_of_the_group(driver: DriverKind) {
    queued_connections_go_to_the_successor(driver, 2, 2);
}

#[hotloop::test(driver = "all")]
fn a_successor_with_another_worker_count_serves_every_socket(driver: DriverKind) {
    queued_connections_go_to_the_successor(driver, 2, 1);
    queued_connections_go_to_the_successor(driver, 1, 2);
}

/// Clients that keep connecting while the sockets change hands: none is
/// refused or reset, whichever process answers.
#[hotloop::test(driver = "all")]
fn clients_connecting_through_a_hand_over_all_get_answers(driver: DriverKind) {
    let (_dir, path) = socket_path();
    let rt_a = runtime(driver, 2);
    let handover_a = Handover::open(&path).unwrap();
    let a = serve(rt_a.handle(), "127.0.0.1:0", options(&handover_a, None), named("A")).unwrap();
    handover_a.ready().unwrap();
    let addr = a.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            thread::spawn(move || {
                let (mut answered, mut failed) = (0, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    let got =
                        TcpStream::connect(addr).map_err(|e| e.to_string()).and_then(|mut s| {
                            s.set_read_timeout(Some(LIMIT)).unwrap();
                            s.write_all(b"q").map_err(|e| e.to_string())?;
                            let mut got = String::new();
                            s.read_to_string(&mut got).map_err(|e| e.to_string())?;
                            Ok(got)
                        });
                    match got {
                        Ok(name) if name == "A" || name == "B" => answered += 1,
                        other => failed.push(format!("{other:?}")),
                    }
                }
                (answered, failed)
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(100));
    let rt_b = runtime(driver, 2);
    let handover_b = Handover::open(&path).unwrap();
    let b = serve(rt_b.handle(), "127.0.0.1:0", options(&handover_b, None), named("B")).unwrap();
    handover_b.ready().unwrap();
    assert!(handover_a.wait_replaced(Some(LIMIT)));
    assert_eq!(a.drain_blocking(LIMIT).cut, 0);
    drop(rt_a);
    thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    let mut answered = 0;
    for c in clients {
        let (n, failed) = c.join().unwrap();
        assert!(
            failed.is_empty(),
            "{driver:?}: {} failed: {:?}",
            failed.len(),
            &failed[..failed.len().min(5)]
        );
        answered += n;
    }
    assert!(answered > 0);
    assert_eq!(b.drain_blocking(LIMIT).cut, 0);
}

/// The descriptor of this process's listening socket on `addr`.
fn listening_fd(addr: SocketAddr) -> RawFd {
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let Ok(fd) = entry.unwrap().file_name().to_string_lossy().parse::<RawFd>() else {
            continue;
        };
        // SAFETY: the descriptor is only borrowed for the two queries
        // below, while the test's servers keep it open.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let sock = socket2::SockRef::from(&borrowed);
        let here = sock.local_addr().ok().and_then(|a| a.as_socket());
        if here == Some(addr) && sock.is_listener().unwrap_or(false) {
            return fd;
        }
    }
    panic!("no listening socket on {addr}");
}

/// Takes the next connection's wake-up on a listening socket and does
/// nothing with it, as a predecessor's io_uring accept does when the
/// kernel wakes it (accepts wait as exclusive waiters, one woken per
/// connection) and it is cancelled before it runs: an epoll instance
/// registered with `EPOLLEXCLUSIVE`, a thread blocked in `epoll_wait`.
struct WakeThief {
    /// Written to end the thief's wait (an eventfd in its epoll set).
    done: std::os::fd::OwnedFd,
    thread: thread::JoinHandle<()>,
}

impl WakeThief {
    fn on(listener: RawFd) -> WakeThief {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        // SAFETY: no pointers; the result is checked and owned at once.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0, "epoll_create1: {}", std::io::Error::last_os_error());
        // SAFETY: `ep` is a new descriptor nothing else owns.
        let ep = unsafe { OwnedFd::from_raw_fd(ep) };
        // SAFETY: no pointers; the result is checked and owned at once.
        let done = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(done >= 0, "eventfd: {}", std::io::Error::last_os_error());
        // SAFETY: `done` is a new descriptor nothing else owns.
        let done = unsafe { OwnedFd::from_raw_fd(done) };
        // Its own copy: the server's descriptor closes when it stops.
        // SAFETY: `listener` is open while the servers run.
        let listener = unsafe { BorrowedFd::borrow_raw(listener) }.try_clone_to_owned().unwrap();
        const LISTENER: u64 = 1;
        const DONE: u64 = 2;
        for (fd, events, tag) in [
            (listener.as_raw_fd(), libc::EPOLLIN | libc::EPOLLEXCLUSIVE, LISTENER),
            (done.as_raw_fd(), libc::EPOLLIN, DONE),
        ] {
            let mut ev = libc::epoll_event { events: events as u32, u64: tag };
            // SAFETY: `ev` is a live event; both descriptors are open.
            let added =
                unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
            assert_eq!(added, 0, "epoll_ctl: {}", std::io::Error::last_os_error());
        }
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let thread = thread::spawn(move || {
            // SAFETY: no arguments.
            tid_tx.send(unsafe { libc::gettid() }).unwrap();
            loop {
                let mut got = [libc::epoll_event { events: 0, u64: 0 }];
                // SAFETY: `got` has room for the one event asked for.
                let n = unsafe { libc::epoll_wait(ep.as_raw_fd(), got.as_mut_ptr(), 1, -1) };
                match (n, got[0].u64) {
                    // Woken by the connection (if it is still queued when
                    // this runs): take no more wake-ups, take nothing.
                    (1, LISTENER) => {
                        // SAFETY: `ep` is open; DEL takes no event.
                        let del = unsafe {
                            libc::epoll_ctl(
                                ep.as_raw_fd(),
                                libc::EPOLL_CTL_DEL,
                                listener.as_raw_fd(),
                                std::ptr::null_mut(),
                            )
                        };
                        assert_eq!(del, 0);
                    }
                    (1, DONE) => return,
                    _ => {}
                }
            }
        });
        // Until it sleeps in epoll_wait it takes nothing (an exclusive
        // epoll entry with nobody waiting passes the wake-up on).
        let tid = tid_rx.recv().unwrap();
        let asleep = || {
            let at = format!("/proc/self/task/{tid}/syscall");
            let nr = std::fs::read_to_string(at).unwrap_or_default();
            let nr: i64 = nr.split(' ').next().and_then(|n| n.parse().ok()).unwrap_or(-1);
            [libc::SYS_epoll_wait, libc::SYS_epoll_pwait, libc::SYS_epoll_pwait2].contains(&nr)
        };
        wait_until(asleep);
        WakeThief { done, thread }
    }

    fn end(self) {
        use std::os::fd::AsRawFd;
        let one = 1u64.to_ne_bytes();
        // SAFETY: `one` is 8 readable bytes, as an eventfd write takes.
        let n = unsafe { libc::write(self.done.as_raw_fd(), one.as_ptr().cast(), 8) };
        assert_eq!(n, 8);
        self.thread.join().unwrap();
    }
}

/// A connection that arrives while the predecessor stops, and whose
/// wake-up the predecessor's last accept took without running, is served
/// by the successor at once: once the predecessor says it stopped, the
/// successor's accept loops look at their backlogs themselves. (On
/// io_uring the successor's armed accept is never woken otherwise; the
/// connection waited for the next one to arrive, 0.3-2 s in upgrades
/// under a probe.)
#[hotloop::test(driver = "all")]
fn a_connection_whose_wake_up_the_predecessor_took_is_served(driver: DriverKind) {
    let (_dir, path) = socket_path();
    let rt_a = runtime(driver, 1);
    let handover_a = Handover::open(&path).unwrap();
    let a = serve(rt_a.handle(), "127.0.0.1:0", options(&handover_a, None), named("A")).unwrap();
    handover_a.ready().unwrap();
    let addr = a.local_addr();
    // Registered before the successor's accept: the kernel wakes the
    // exclusive waiters in the order they came.
    let thief = WakeThief::on(listening_fd(addr));
    let client = Arc::new(std::sync::Mutex::new(None));
    let arriving = client.clone();
    // Runs once A's server stopped accepting, before A says so.
    handover_a.on_hand_over(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"q").unwrap();
        *arriving.lock().unwrap() = Some(s);
    });
    let rt_b = runtime(driver, 1);
    let handover_b = Handover::open(&path).unwrap();
    let b = serve(rt_b.handle(), "127.0.0.1:0", options(&handover_b, None), named("B")).unwrap();
    // B's accept loop parks on its (armed) accept.
    thread::sleep(Duration::from_millis(100));
    handover_b.ready().unwrap();
    assert!(handover_a.wait_replaced(Some(LIMIT)));
    let mut s = client.lock().unwrap().take().expect("A's hand-over callback did not run");
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut got = String::new();
    let read = s.read_to_string(&mut got);
    assert!(read.is_ok() && got == "B", "{driver:?}: the queued connection got {read:?} {got:?}");
    thief.end();
    if driver == DriverKind::Uring {
        // The thief took the wake-up, so B's armed accept slept: B found
        // the connection by looking at the backlog.
        assert_eq!(rt_b.stats().total.backlog_recheck_accepts, 1, "the test proves nothing");
    }
    assert_eq!(a.drain_blocking(LIMIT).cut, 0);
    assert_eq!(b.drain_blocking(LIMIT).cut, 0);
}

/// A successor that takes the sockets and ends before it is ready (dropped
/// here; a panicking child process below) leaves the predecessor serving,
/// counted, and a later successor still takes over.
#[hotloop::test(driver = "all")]
fn a_successor_that_fails_leaves_the_old_process_serving(driver: DriverKind) {
    let (_dir, path) = socket_path();
    let rt_a = runtime(driver, 2);
    let handover_a = Handover::open(&path).unwrap();
    let a = serve(rt_a.handle(), "127.0.0.1:0", options(&handover_a, None), named("A")).unwrap();
    handover_a.ready().unwrap();
    let addr = a.local_addr();
    let failures = rt_a.stats().lifecycle.upgrade_failures;

    // One that gives up after receiving the sockets.
    let quitter = Handover::open(&path).unwrap();
    assert_eq!(quitter.inherited(), 2);
    drop(quitter);
    wait_until(|| rt_a.stats().lifecycle.upgrade_failures > failures);
    assert!(!handover_a.is_replaced());
    assert_eq!(ask(&mut TcpStream::connect(addr).unwrap()), "A");

    // One that panics while it starts, in a process of its own.
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            &harness_name("successor_child") as &str,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--ignored",
        ])
        .env(CHILD, &path)
        .output()
        .unwrap();
    assert!(!out.status.success(), "the child was to panic");
    assert!(String::from_utf8_lossy(&out.stderr).contains("panics while it starts"));
    wait_until(|| rt_a.stats().lifecycle.upgrade_failures > failures + 1);
    assert!(!handover_a.is_replaced());
    for _ in 0..20 {
        assert_eq!(ask(&mut TcpStream::connect(addr).unwrap()), "A");
    }

    // And a good one still takes over.
    let rt_b = runtime(driver, 1);
    let handover_b = Handover::open(&path).unwrap();
    let b = serve(rt_b.handle(), "127.0.0.1:0", options(&handover_b, None), named("B")).unwrap();
    handover_b.ready().unwrap();
    assert!(handover_a.wait_replaced(Some(LIMIT)));
    assert_eq!(a.drain_blocking(LIMIT).cut, 0);
    drop(rt_a);
    assert_eq!(ask(&mut TcpStream::connect(addr).unwrap()), "B");
    assert_eq!(b.drain_blocking(LIMIT).cut, 0);
}

/// A stand-in successor on the upgrade socket at `path`, connected by
/// hand: it reads what the running process sends it and never answers.
struct Probe(socket2::Socket);

impl Probe {
    fn connect(path: &std::path::Path) -> Probe {
        use socket2::{Domain, SockAddr, Socket, Type};
        let sock = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
        sock.connect(&SockAddr::unix(path).unwrap()).unwrap();
        sock.set_read_timeout(Some(LIMIT)).unwrap();
        Probe(sock)
    }

    /// The next message (its descriptors, not asked for, are closed by the
    /// kernel); empty once the running process closed the connection.
    fn next(&self) -> String {
        let mut buf = [0u8; 256];
        let n = (&self.0).read(&mut buf).expect("a message within the limit");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

/// A successor that takes the sockets and then says nothing (stuck in its
/// start-up, stopped by a signal: here a hand-over opened and held, or a
/// stand-in connected by hand) holds the running process only for its
/// ready wait: then it is told `late` and dropped, and a later successor,
/// even one that connected while the old process still waited on the
/// stuck one, takes over at once. The old process serves throughout. A
/// stuck successor that says ready after it was dropped is refused
/// (`TimedOut`) and does not take over.
#[hotloop::test(driver = "all")]
fn a_successor_that_never_says_ready_is_dropped_and_the_next_takes_over(driver: DriverKind) {
    const WAIT: Duration = Duration::from_millis(300);
    let (_dir, path) = socket_path();
    let rt_a = runtime(driver, 2);
    let handover_a = Handover::open(&path).unwrap();
    handover_a.set_ready_wait(WAIT);
    let a = serve(rt_a.handle(), "127.0.0.1:0", options(&handover_a, None), named("A")).unwrap();
    handover_a.ready().unwrap();
    let addr = a.local_addr();
    let failures = rt_a.stats().lifecycle.upgrade_failures;

    // One that gets the sockets and hangs, and a stand-in behind it: the
    // stand-in's header says the first was dropped.
    let stuck = Handover::open(&path).unwrap();
    assert_eq!(stuck.inherited(), 2);
    let probe = Probe::connect(&path);
    assert_eq!(ask(&mut TcpStream::connect(addr).unwrap()), "A");
    assert!(probe.next().starts_with("hotloop-handover 1 "), "{driver:?}");
    assert!(!handover_a.is_replaced());
    // Its `ready` now is refused, and the old process goes on.
    let refused = stuck.ready().unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::TimedOut, "{refused}");
    assert!(!handover_a.is_replaced());
    assert_eq!(ask(&mut TcpStream::connect(addr).unwrap()), "A");
    // The stand-in is told `late` in turn, and the connection closes.
    let told: Vec<String> =
        std::iter::from_fn(|| Some(probe.next())).take_while(|m| !m.is_empty()).collect();
    assert_eq!(told.last().map(String::as_str), Some("late\n"), "{driver:?}: {told:?}");
    assert!(rt_a.stats().lifecycle.upgrade_failures >= failures + 2);
    assert_eq!(ask(&mut TcpStream::connect(addr).unwrap()), "A");

    // Another hangs, and a good one connects behind it at once: it gets the
    // sockets once the stuck one is dropped, long before its own wait ends.
    let stuck = Handover::open(&path).unwrap();
    let started = Instant::now();
    let rt_b = runtime(driver, 1);
    let handover_b = Handover::open(&path).unwrap();
    let waited = started.elapsed();
    assert!(waited < WAIT * 10, "{driver:?}: the next successor waited {waited:?}");
    assert_eq!(handover_b.inherited(), 2);
    assert_eq!(ask(&mut TcpStream::connect(addr).unwrap()), "A");
    let b = serve(rt_b.handle(), "127.0.0.1:0", options(&handover_b, None), named("B")).unwrap();
    handover_b.ready().unwrap();
    assert!(handover_a.wait_replaced(Some(LIMIT)));
    assert_eq!(stuck.ready().unwrap_err().kind(), std::io::ErrorKind::TimedOut);
    assert_eq!(a.drain_blocking(LIMIT).cut, 0);
    drop(rt_a);
    assert_eq!(ask(&mut TcpStream::connect(addr).unwrap()), "B");
    assert_eq!(b.drain_blocking(LIMIT).cut, 0);
}

/// Openers racing on a stale upgrade socket file (left by a process that
/// stopped): exactly one binds the path, and each other one gets the
/// sockets from the one before, in turn. Before, several could be refused
/// at once; each removed the file and bound its own, so all but the last
/// were orphaned (no successor could reach them, each serving as though it
/// were the first), or a bind failed with the path in use. Twenty rounds
/// of six.
#[test]
fn openers_racing_on_a_stale_socket_file_bind_it_once() {
    for round in 0..20 {
        let (_dir, path) = socket_path();
        let stale = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::SEQPACKET, None);
        stale.unwrap().bind(&socket2::SockAddr::unix(&path).unwrap()).unwrap();
        assert!(path.exists(), "the stale socket file");
        let start = Arc::new(std::sync::Barrier::new(6));
        let openers: Vec<_> = (0..6)
            .map(|_| {
                let (path, start) = (path.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    let handover = Handover::open(&path).map_err(|e| e.to_string())?;
                    let first = handover.predecessor().is_none();
                    handover.ready().map_err(|e| e.to_string())?;
                    Ok::<_, String>((first, handover))
                })
            })
            .collect();
        let opened: Vec<_> = openers.into_iter().map(|t| t.join().unwrap()).collect();
        let firsts = opened.iter().filter(|o| matches!(o, Ok((true, _)))).count();
        let failed: Vec<_> = opened.iter().filter_map(|o| o.as_ref().err()).collect();
        for (_, handover) in opened.iter().flatten() {
            handover.close();
        }
        assert!(failed.is_empty(), "round {round}: {failed:?}");
        assert_eq!(firsts, 1, "round {round}: {firsts} processes bound the upgrade socket");
    }
}

/// The upgrade example's recipe when its successor is late: the
/// predecessor (this test, at its connection limit of 1, so queued
/// connections wait for the successor) stops waiting for a successor after
/// 50 ms, and the successor (the example's `run`) accepts a connection
/// whose request has not come yet, then learns from its `ready` that it
/// does not take over. It drains before it returns: the request, sent
/// after that, is answered. Before, `ready()?` returned at once, dropping
/// the runtime and the connection with it.
#[hotloop::test(driver = "all")]
fn a_late_successor_following_the_example_answers_what_it_accepted(driver: DriverKind) {
    let (_dir, path) = socket_path();
    let rt_a = runtime(driver, 1);
    let handover_a = Handover::open(&path).unwrap();
    handover_a.set_ready_wait(Duration::from_millis(50));
    let a = serve(rt_a.handle(), "127.0.0.1:0", options(&handover_a, Some(1)), named("A")).unwrap();
    handover_a.ready().unwrap();
    let addr = a.local_addr();
    let mut holder = TcpStream::connect(addr).unwrap();
    holder.write_all(b"h").unwrap();
    wait_until(|| a.active_connections() == 1);
    // Queued behind A's limit: the successor accepts it.
    let mut held = TcpStream::connect(addr).unwrap();
    held.set_read_timeout(Some(LIMIT)).unwrap();
    let path_b = path.to_str().unwrap().to_string();
    let b = thread::spawn(move || {
        let rt = runtime(driver, 1);
        // Past A's ready wait, and time to accept `held`.
        let serving = |_| thread::sleep(Duration::from_millis(300));
        upgrade_example::run(rt, &addr.to_string(), &path_b, serving, || Ok(true))
    });
    let deadline = Instant::now() + Duration::from_secs(1);
    while !b.is_finished() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    held.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap_or_default();
    let mut reply = String::new();
    let got = held.read_to_string(&mut reply);
    assert!(
        reply.starts_with("HTTP/1.1 200") && reply.contains("served by pid"),
        "{driver:?}: {got:?}: {reply:?}"
    );
    let refused = b.join().unwrap().unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::TimedOut, "{refused}");
    // A serves on.
    drop(holder);
    assert_eq!(ask(&mut TcpStream::connect(addr).unwrap()), "A");
    assert_eq!(a.drain_blocking(LIMIT).cut, 0);
}

/// Run by [`a_successor_that_fails_leaves_the_old_process_serving`] in a
/// child process: takes the sockets, then panics.
#[test]
#[ignore = "run as a child process by a_successor_that_fails_leaves_the_old_process_serving"]
fn successor_child() {
    let Ok(path) = std::env::var(CHILD) else { return };
    let handover = Handover::open(path).unwrap();
    assert!(handover.inherited() > 0);
    panic!("the successor panics while it starts");
}

/// Starts [`activated_child`] under `sh`, which sets the descriptors up
/// from the child's standard input (`listener`) and then sets `LISTEN_PID`
/// and `LISTEN_FDS`; a connection made before it started and one after are
/// both answered by it. `spec` says what else the child checks.
fn activate(driver: DriverKind, listener: std::net::TcpListener, sh: &str, spec: &str) {
    let addr = listener.local_addr().unwrap();
    // Waits in the socket's queue until the child accepts it.
    let mut early = TcpStream::connect(addr).unwrap();
    let mut child = Command::new("sh")
        .args(["-c", sh])
        .arg(std::env::current_exe().unwrap())
        .args([
            &harness_name("activated_child") as &str,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--ignored",
        ])
        .env(CHILD, format!("{addr} {driver:?} {spec}"))
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(listener)))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    assert_eq!(ask(&mut early), "activated", "{driver:?}");
    assert_eq!(ask(&mut TcpStream::connect(addr).unwrap()), "activated");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

/// systemd's socket activation: a socket at descriptor 3, `LISTEN_FDS=1`
/// and `LISTEN_PID` naming the process; a connection made before the
/// process started is served by it.
#[hotloop::test(driver = "all")]
fn socket_activation_serves_the_listen_fds_socket(driver: DriverKind) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let sh = "exec 3<&0 0</dev/null; LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" \"$@\"";
    activate(driver, listener, sh, "-");
}

/// `LISTEN_FDS` with a descriptor that is not a socket first (a FIFO, as
/// systemd's `ListenFIFO=` passes) and a listening socket after it: the
/// FIFO is closed with a warning rather than failing the start, the socket
/// is served, and `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES` are gone
/// from the environment (a child must not take them for its own).
#[hotloop::test(driver = "all")]
fn socket_activation_skips_a_descriptor_that_is_not_a_socket(driver: DriverKind) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = TempDir::new("handover");
    let fifo = dir.join("listen.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    // Read and write, so the open does not wait for a writer.
    let sh = format!(
        "exec 4<&0 3<>'{}' 0</dev/null; LISTEN_PID=$$ LISTEN_FDS=2 LISTEN_FDNAMES=fifo:web \
         exec \"$0\" \"$@\"",
        fifo.display()
    );
    activate(driver, listener, &sh, "fifo-at-3");
}

/// Run by [`socket_activation_serves_the_listen_fds_socket`] and
/// [`socket_activation_skips_a_descriptor_that_is_not_a_socket`]: serves
/// the `LISTEN_FDS` socket for two connections.
#[test]
#[ignore = "run as a child process by the socket_activation_ tests"]
fn activated_child() {
    let Ok(spec) = std::env::var(CHILD) else { return };
    let mut words = spec.split(' ');
    let addr: SocketAddr = words.next().unwrap().parse().unwrap();
    let driver = if words.next() == Some("Uring") { DriverKind::Uring } else { DriverKind::Epoll };
    let fifo_at_3 = words.next() == Some("fifo-at-3");
    let handover = Handover::inherit().unwrap();
    assert_eq!(handover.inherited(), 1, "LISTEN_FDS gave one socket");
    for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        assert_eq!(std::env::var_os(name), None, "{name} is still in the environment");
    }
    if fifo_at_3 {
        assert!(std::fs::read_link("/proc/self/fd/3").is_err(), "the FIFO at 3 is still open");
    }
    let rt = runtime(driver, 2);
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    let server = serve(rt.handle(), addr, options(&handover, None), move |s| {
        let count = count.clone();
        async move {
            named("activated")(s).await;
            count.fetch_add(1, Ordering::SeqCst);
        }
    })
    .unwrap();
    assert_eq!(server.local_addr(), addr, "the inherited socket, not a new one");
    handover.ready().unwrap();
    wait_until(|| served.load(Ordering::SeqCst) >= 2);
    server.drain_blocking(LIMIT);
}

/// Only a process of the same user takes the sockets: the upgrade socket's
/// file is its owner's alone (mode 0600), and a process of another user
/// that connects anyway (the mode opened up) gets none, from a process
/// running as root too. The other user is this test's thread with its
/// identity changed; where the tests do not run as root it cannot change
/// it, and the test checks the mode alone.
#[test]
fn only_a_process_of_the_same_user_takes_the_sockets() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, path) = socket_path();
    let rt = runtime(DriverKind::Epoll, 1);
    let handover = Handover::open(&path).unwrap();
    let a = serve(rt.handle(), "127.0.0.1:0", options(&handover, None), named("A")).unwrap();
    handover.ready().unwrap();
    let addr = a.local_addr();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the upgrade socket's mode is {mode:o}");
    // SAFETY: geteuid takes nothing and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not run as root: only the mode was checked");
        return;
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    // The directory too, whatever the umask made it, so the other user
    // reaches the socket and it is the owner check that turns it away.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let other = {
        let path = path.clone();
        thread::spawn(move || {
            const NOBODY: libc::c_long = 65534;
            // SAFETY: the raw system call changes this thread's identity
            // alone (glibc's `setresuid` would change every thread's);
            // the thread ends after the connection below.
            let set =
                unsafe { libc::syscall(libc::SYS_setresuid, NOBODY, NOBODY, -1 as libc::c_long) };
            assert_eq!(set, 0, "setresuid: {}", std::io::Error::last_os_error());
            Handover::open(&path).map(|h| h.inherited())
        })
        .join()
        .unwrap()
    };
    assert!(other.is_err(), "a process of another user took {other:?} sockets");
    assert!(!handover.is_replaced());
    assert_eq!(ask(&mut TcpStream::connect(addr).unwrap()), "A");
    assert_eq!(a.drain_blocking(LIMIT).cut, 0);
}

/// An HTTP/2 connection to the predecessor at the hand-over: the request
/// in flight is answered, the connection gets a GOAWAY and ends, and a new
/// connection reaches the successor.
#[hotloop::test(driver = "all")]
fn http2_connections_get_a_goaway_and_finish_their_streams(driver: DriverKind) {
    let (_dir, path) = socket_path();
    let started = Arc::new(AtomicBool::new(false));
    let hyper_server = |rt: &Runtime, handover: &Handover, name: &'static str| -> Server {
        let started = started.clone();
        serve_hyper(rt.handle(), "127.0.0.1:0", options(handover, None), move || {
            let started = started.clone();
            service_fn(move |req: Request<hyper::body::Incoming>| {
                let started = started.clone();
                async move {
                    if req.uri().path() == "/slow" {
                        started.store(true, Ordering::SeqCst);
                        hotloop::time::sleep(Duration::from_millis(500)).await;
                    }
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(name))))
                }
            })
        })
        .unwrap()
    };
    let rt_a = runtime(driver, 2);
    let handover_a = Handover::open(&path).unwrap();
    let a = hyper_server(&rt_a, &handover_a, "A");
    handover_a.ready().unwrap();
    let addr = a.local_addr();

    let client =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (mut sender, conn) = client.block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap()
    });
    let conn_ended = client.spawn(conn);
    let slow = {
        let req = Request::get("/slow").body(Full::new(Bytes::new())).unwrap();
        let response = sender.send_request(req);
        client.spawn(async move {
            let resp = response.await.map_err(|e| e.to_string())?;
            let body = resp.into_body().collect().await.map_err(|e| e.to_string())?;
            Ok::<_, String>(body.to_bytes())
        })
    };
    wait_until(|| started.load(Ordering::SeqCst));

    let rt_b = runtime(driver, 2);
    let handover_b = Handover::open(&path).unwrap();
    let b = hyper_server(&rt_b, &handover_b, "B");
    handover_b.ready().unwrap();
    assert!(handover_a.wait_replaced(Some(LIMIT)));
    let drained = a.drain_blocking(LIMIT);
    assert_eq!(drained.cut, 0, "{driver:?}: {drained:?}");
    assert_eq!(client.block_on(slow).unwrap().unwrap(), Bytes::from("A"), "the stream in flight");
    // The GOAWAY ended the connection once its stream was done.
    let ended = client.block_on(async { tokio::time::timeout(LIMIT, conn_ended).await });
    assert!(ended.is_ok(), "{driver:?}: the HTTP/2 connection did not end after its GOAWAY");
    let again = client.block_on(async {
        let req = Request::get("/").body(Full::new(Bytes::new())).unwrap();
        sender.send_request(req).await
    });
    assert!(again.is_err(), "a request after the GOAWAY went through");
    let fresh = client.block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .unwrap();
        tokio::spawn(conn);
        let req = Request::get("/").body(Full::new(Bytes::new())).unwrap();
        sender.send_request(req).await.unwrap().into_body().collect().await.unwrap().to_bytes()
    });
    assert_eq!(fresh, Bytes::from("B"));
    drop(rt_a);
    assert_eq!(b.drain_blocking(LIMIT).cut, 0);
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

/// The handler of the signal [`a_signal_while_the_sockets_are_awaited_does_not_fail_the_successor`]
/// sends: it only interrupts.
extern "C" fn interrupted(_: libc::c_int) {}

/// Sends `bytes` with the descriptors `fds` attached, as a hand-over does.
fn send_with_fds(sock: &socket2::Socket, bytes: &[u8], fds: &[RawFd]) {
    use std::os::fd::AsRawFd;
    let mut iov =
        libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    let mut control = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        // SAFETY: the control buffer (64 bytes, aligned for `cmsghdr`) holds
        // one header and a few descriptors, so the first header and its
        // data lie inside it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                std::mem::size_of_val(fds),
            );
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) as usize;
        }
    }
    // SAFETY: every pointer in `msg` is live for the call.
    let sent = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    assert_eq!(sent, bytes.len() as isize, "{}", std::io::Error::last_os_error());
}

/// A successor whose thread is interrupted by signals while it waits for
/// its predecessor's sockets (a socket with a receive timeout then sees
/// `EINTR`, whatever `SA_RESTART` says) goes on waiting and takes them. A
/// stand-in predecessor on the upgrade socket sends its header at once and
/// its listening socket 300 ms later; the successor's thread gets a
/// signal every 20 ms meanwhile. (Seen with `serve` under upgrades on a
/// starved machine: the successor exited with "Interrupted system call"
/// and the old process served on.)
#[test]
fn a_signal_while_the_sockets_are_awaited_does_not_fail_the_successor() {
    use socket2::{Domain, SockAddr, Socket, Type};
    use std::os::fd::AsRawFd;
    let (_dir, path) = socket_path();
    let upgrade = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
    upgrade.bind(&SockAddr::unix(&path).unwrap()).unwrap();
    upgrade.listen(4).unwrap();
    let served = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = served.local_addr().unwrap();
    // SAFETY: a handler that does nothing, for a signal nothing else here
    // uses; no SA_RESTART, as a handler that interrupts would be installed.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = interrupted as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGWINCH, &action, std::ptr::null_mut()), 0);
    }
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let receiving = Arc::new(AtomicBool::new(true));
    let successor = {
        let path = path.clone();
        let receiving = receiving.clone();
        thread::spawn(move || {
            // SAFETY: no arguments.
            tid_tx.send(unsafe { libc::pthread_self() }).unwrap();
            let got = Handover::open(&path);
            receiving.store(false, Ordering::SeqCst);
            got
        })
    };
    let thread_id = tid_rx.recv().unwrap();
    let (conn, _) = upgrade.accept().unwrap();
    let header = format!("hotloop-handover 1 pid={} sockets=1\n", std::process::id());
    send_with_fds(&conn, header.as_bytes(), &[]);
    let mut signals = 0;
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline && receiving.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(20));
        // SAFETY: the successor's thread is alive until it stops receiving,
        // and a signal to a thread that just returned is harmless.
        unsafe { libc::pthread_kill(thread_id, libc::SIGWINCH) };
        signals += 1;
    }
    send_with_fds(&conn, addr.to_string().as_bytes(), &[served.as_raw_fd()]);
    let handover = successor.join().unwrap().expect("the successor took the sockets");
    assert!(signals >= 5, "the successor stopped waiting after {signals} signals");
    assert_eq!(handover.inherited(), 1);
    assert_eq!(handover.predecessor(), Some(std::process::id()));
    drop(handover);
}
