//! What only the io_uring driver has: multishot accept and its re-arm after
//! `EMFILE` or a full queue, the accept bound over a multishot accept,
//! operations dropped while the kernel holds them, small rings under
//! bursts, the lingering of a dropped stream's write, a quiet worker's
//! direct sends, zero-copy sends and their counters, the registered ring
//! descriptor, kernel busy polling, direct descriptors for accepted
//! connections (and their fallbacks) and the fallback to epoll. Behaviour both drivers share lives in the
//! file named after the behaviour.
//!
//! The tests in this file count descriptors and change the process's
//! descriptor limit, so they run one at a time (`serial`).

mod common;

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::net::TcpStream as StdStream;
use std::rc::Rc;
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use hotloop::net::{ListenerOptions, TcpListener};
use hotloop::time::{sleep, timeout};
use hotloop::{DriverKind, Runtime};

/// Serialises the tests of this file.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// True (after saying why) if io_uring cannot run here, or if
/// `HOTLOOP_DRIVER` forces another driver on every runtime.
fn uring_skipped() -> bool {
    if let Ok(forced) = std::env::var("HOTLOOP_DRIVER") {
        if !forced.is_empty() && forced.parse::<DriverKind>() != Ok(DriverKind::Uring) {
            eprintln!("skipped: HOTLOOP_DRIVER={forced} forces another driver");
            return true;
        }
    }
    common::skip_uring()
}

fn uring_runtime(workers: usize) -> Runtime {
    Runtime::builder()
        .workers(workers)
        .driver(DriverKind::Uring)
        .build()
        .expect("build an io_uring runtime")
}

/// Waits (polling the runtime's counters) until `cond` holds or `limit` passes.
async fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !cond() {
        if Instant::now() > deadline {
            return false;
        }
        sleep(Duration::from_millis(2)).await;
    }
    true
}

#[test]
fn accept_bound_holds_on_uring() {
    let _serial = serial();
    if uring_skipped() {
        return;
    }
    const BURST: usize = 200;
    let rt = uring_runtime(1);
    let bound = ListenerOptions::ACCEPTS_PER_WAKEUP_DEFAULT;
    rt.block_on(async {
        // The fixed bound, not pacing: a paced listener never arms the
        // multishot accept this test holds the bound over.
        let options = ListenerOptions { accept_pacing: None, ..ListenerOptions::default() };
        let listener = TcpListener::bind_with("127.0.0.1:0", options).unwrap();
        let addr = listener.local_addr().unwrap();
        // The whole burst waits in the backlog before the first accept.
        let clients: Vec<StdStream> =
            (0..BURST).map(|_| StdStream::connect(addr).unwrap()).collect();
        let mut accepted = Vec::with_capacity(BURST);
        for _ in 0..BURST {
            let s = timeout(Duration::from_secs(10), listener.accept_stream())
                .await
                .expect("accept timed out")
                .unwrap();
            accepted.push(s);
        }
        drop(clients);
    });
    let stats = rt.stats().total;
    assert_eq!(stats.accepted, BURST as u64);
    assert!(
        stats.max_accepted_per_wakeup <= bound as u64,
        "at most {bound} per wakeup, saw {}",
        stats.max_accepted_per_wakeup
    );
    assert!(
        stats.accept_wakeups >= BURST.div_ceil(bound) as u64,
        "at least {} wakeups, saw {}",
        BURST.div_ceil(bound),
        stats.accept_wakeups
    );
    assert!(stats.accept_bound_hits >= 1);
    assert_eq!(stats.multishot_rearms, 0, "one multishot accept took the whole burst");
}

#[test]
fn dropped_reads_free_everything() {
    let _serial = serial();
    if uring_skipped() {
        return;
    }
    const CONNECTIONS: usize = 10;
    const DROPS_PER_CONNECTION: usize = 100;
    let rt = uring_runtime(1);
    let baseline = hotloop::open_fd_count().unwrap();
    let handle = rt.handle().clone();
    rt.block_on(async {
        // Unpaced, so the multishot accept below takes connections ahead.
        let options = ListenerOptions { accept_pacing: None, ..ListenerOptions::default() };
        let listener = TcpListener::bind_with("127.0.0.1:0", options).unwrap();
        let addr = listener.local_addr().unwrap();
        for _ in 0..CONNECTIONS {
            let mut client = StdStream::connect(addr).unwrap();
            let stream = listener.accept_stream().await.unwrap();
            for _ in 0..DROPS_PER_CONNECTION {
                // Nothing to read: the read is still waiting when its future is dropped.
                let r =
                    timeout(Duration::from_millis(1), stream.read_owned(Vec::with_capacity(64)))
                        .await;
                assert!(r.is_err(), "a read with no data completed");
            }
            // The driver is still consistent: a later read gets the data.
            client.write_all(b"ping").unwrap();
            let (res, buf) =
                timeout(Duration::from_secs(5), stream.read_owned(Vec::with_capacity(64)))
                    .await
                    .expect("read after cancellations timed out");
            assert_eq!(res.unwrap(), 4);
            assert_eq!(&buf[..], b"ping");
            drop(stream);
            drop(client);
        }
        // Connections the multishot accept takes while nobody asks for them
        // wait in the listener's queue; closing the listener must close them.
        // They are counted as closed unserved.
        let unclaimed: Vec<StdStream> = (0..5).map(|_| StdStream::connect(addr).unwrap()).collect();
        sleep(Duration::from_millis(20)).await;
        assert_eq!(handle.stats().total.accepted_unserved, 0);
        drop(listener);
        assert_eq!(handle.stats().total.accepted_unserved, 5, "closed unserved, not counted");
        for mut client in unclaimed {
            client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            // A close (0) or a reset: never a wait.
            assert!(!matches!(std::io::Read::read(&mut client, &mut [0u8; 1]), Ok(n) if n > 0));
        }
        // Let the cancel completions come back, so the kernel releases its file references.
        sleep(Duration::from_millis(20)).await;
    });
    // A dropped read leaves nothing in the kernel to cancel: reads wait on
    // the socket's receive queue, not in an operation of their own.
    assert_eq!(hotloop::open_fd_count().unwrap(), baseline, "descriptors leaked");
}

/// Lowers the soft descriptor limit until dropped.
struct NofileLimit {
    saved: libc::rlimit,
}

impl NofileLimit {
    fn lower_to(soft: u64) -> NofileLimit {
        let mut saved = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes one rlimit into the live struct.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut saved) }, 0);
        let lowered = libc::rlimit { rlim_cur: soft.min(saved.rlim_cur), rlim_max: saved.rlim_max };
        // SAFETY: setrlimit reads one live rlimit.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
        NofileLimit { saved }
    }
}

impl Drop for NofileLimit {
    fn drop(&mut self) {
        // SAFETY: setrlimit reads one live rlimit.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &self.saved) };
    }
}

/// The highest descriptor number open in this process.
fn highest_fd() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0)
}

#[test]
fn multishot_rearms_after_emfile() {
    let _serial = serial();
    if uring_skipped() {
        return;
    }
    const CLIENTS: usize = 20;
    /// Descriptors the server may take before it runs out.
    const ROOM: u64 = 4;
    let rt = uring_runtime(1);
    rt.block_on(async {
        // Without pacing: a paced listener never arms the multishot accept.
        let options = ListenerOptions { accept_pacing: None, ..ListenerOptions::default() };
        let listener = Rc::new(TcpListener::bind_with("127.0.0.1:0", options).unwrap());
        let addr = listener.local_addr().unwrap();
        let clients: Vec<StdStream> =
            (0..CLIENTS).map(|_| StdStream::connect(addr).unwrap()).collect();
        // Fill every free number below the highest open descriptor, so the
        // limit leaves exactly ROOM descriptors for accepted connections.
        let top = highest_fd();
        let mut fillers = Vec::new();
        let last = loop {
            let f = std::fs::File::open("/dev/null").unwrap();
            let fd = std::os::fd::AsRawFd::as_raw_fd(&f) as u64;
            fillers.push(f);
            if fd >= top {
                break fd;
            }
        };
        let limit = NofileLimit::lower_to(last + 1 + ROOM);

        let held = Rc::new(RefCell::new(Vec::new()));
        let total = Rc::new(Cell::new(0usize));
        let acceptor = hotloop::spawn({
            let (listener, held, total) = (listener.clone(), held.clone(), total.clone());
            async move {
                while total.get() < CLIENTS {
                    let s = listener.accept_stream().await.unwrap();
                    held.borrow_mut().push(s);
                    total.set(total.get() + 1);
                }
            }
        });
        let ran_out =
            wait_until(Duration::from_secs(5), || rt.stats().total.accept_errors_resources >= 1)
                .await;
        assert!(ran_out, "the server never ran out of descriptors");
        assert!(total.get() <= ROOM as usize);
        // Give the descriptors back: accepting must resume by itself.
        held.borrow_mut().clear();
        drop(fillers);
        drop(limit);
        timeout(Duration::from_secs(5), acceptor)
            .await
            .expect("accepting did not resume after EMFILE")
            .unwrap();
        assert_eq!(total.get(), CLIENTS);
        drop(clients);
    });
    let stats = rt.stats().total;
    assert_eq!(stats.accepted, CLIENTS as u64);
    assert!(stats.accept_pauses >= 1);
    assert!(
        stats.multishot_rearms >= 1,
        "EMFILE ends the multishot accept, which must be re-armed"
    );
}

/// Runs this test binary again with `test` selected and `env` set, and
/// returns the child's output; the child sees `HOTLOOP_TEST_CHILD`.
fn run_child(test: &str, env: &[(&str, &str)]) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("HOTLOOP_TEST_CHILD", test)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child test failed:\n{text}");
    assert!(text.contains("1 passed"), "the child test did not run:\n{text}");
    text
}

fn is_child(test: &str) -> bool {
    std::env::var("HOTLOOP_TEST_CHILD").as_deref() == Ok(test)
}

/// The shape of a test that runs in a child process of its own: in the
/// child, `child` runs and this returns `None`; in the parent, the child
/// runs with `env` and its output comes back with the guard that keeps
/// such tests one at a time (held for any further child runs), or `None`
/// where io_uring is skipped.
fn in_child(
    test: &str,
    env: &[(&str, &str)],
    child: impl FnOnce(),
) -> Option<(MutexGuard<'static, ()>, String)> {
    if is_child(test) {
        child();
        return None;
    }
    let serial = serial();
    if uring_skipped() {
        return None;
    }
    Some((serial, run_child(test, env)))
}

/// [`in_child`] with direct descriptors on (`HOTLOOP_URING_DIRECT_FDS=1`).
fn in_direct_child(test: &str, child: impl FnOnce()) -> Option<(MutexGuard<'static, ()>, String)> {
    in_child(test, &[("HOTLOOP_URING_DIRECT_FDS", "1")], child)
}

/// Checks what a child said with [`print_direct_counters`]: connections
/// accepted as direct descriptors, and plain descriptors installed.
fn assert_direct_counters(out: &str, accepts: u64, installs: u64) {
    assert_eq!(counter(out, "direct_accepts"), accepts, "{out}");
    assert_eq!(counter(out, "installs"), installs, "{out}");
}

/// Runs `child` as the test named `test` with direct descriptors on, and
/// checks it accepted one direct connection and installed one plain
/// descriptor for it.
fn one_direct_accept_one_install(test: &str, child: impl FnOnce()) {
    if let Some((_serial, out)) = in_direct_child(test, child) {
        assert_direct_counters(&out, 1, 1);
    }
}

/// One connection accepted on `rt` (a child's direct stream): the
/// listener (kept open), the client's end and the accepted stream.
fn one_accepted(rt: &Runtime) -> (TcpListener, StdStream, hotloop::net::TcpStream) {
    let listener = rt.block_on(async { TcpListener::bind("127.0.0.1:0").unwrap() });
    let client = StdStream::connect(listener.local_addr().unwrap()).unwrap();
    let stream = rt.block_on(async { listener.accept_stream().await.unwrap() });
    (listener, client, stream)
}

/// What a child says of direct descriptors, for [`counter`] in its parent.
fn print_direct_counters(rt: &Runtime) {
    let stats = rt.stats();
    println!(
        "direct_accepts={} installs={}",
        stats.total.direct_accepts, stats.total.direct_fd_installs
    );
}

#[test]
fn auto_falls_back_to_epoll_when_told() {
    const NAME: &str = "auto_falls_back_to_epoll_when_told";
    if is_child(NAME) {
        let rt = Runtime::builder().workers(1).driver(DriverKind::Auto).build().unwrap();
        let info = rt.stats().info;
        println!("driver={} reason={}", info.driver, info.reason);
        assert_eq!(info.driver, "epoll");
        assert!(info.reason.contains("epoll"), "reason: {}", info.reason);
        return;
    }
    let _serial = serial();
    let out = run_child(NAME, &[("HOTLOOP_DRIVER", "epoll")]);
    assert!(out.contains("driver=epoll"), "{out}");
}

#[test]
fn auto_picks_uring_when_the_kernel_allows() {
    let _serial = serial();
    let rt = Runtime::builder().workers(1).driver(DriverKind::Auto).build().unwrap();
    let info = rt.stats().info;
    match common::uring_unavailable() {
        None if std::env::var("HOTLOOP_DRIVER").is_err() => {
            assert_eq!(info.driver, "uring", "{}", info.reason)
        }
        None => {}
        Some(why) => {
            assert_eq!(info.driver, "epoll");
            assert!(info.reason.contains(&why), "{} / {why}", info.reason);
        }
    }
    assert!(!info.reason.is_empty());
}

#[test]
fn small_rings_survive_bursts() {
    let _serial = serial();
    if uring_skipped() {
        return;
    }
    const BURST: usize = 200;
    // 8 submission entries and 32 completion entries: a burst of 200
    // accepts overflows the completion queue, and 200 reads queued in one
    // turn overflow the submission queue.
    let rt =
        Runtime::builder().workers(1).driver(DriverKind::Uring).uring_entries(8).build().unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut clients: Vec<StdStream> =
            (0..BURST).map(|_| StdStream::connect(addr).unwrap()).collect();
        let mut readers = Vec::with_capacity(BURST);
        for _ in 0..BURST {
            let s = timeout(Duration::from_secs(10), listener.accept_stream())
                .await
                .expect("accept timed out")
                .unwrap();
            readers.push(hotloop::spawn(async move {
                let (res, buf) = s.read_owned(Vec::with_capacity(16)).await;
                assert_eq!(res.unwrap(), 5);
                buf
            }));
        }
        for c in &mut clients {
            c.write_all(b"hello").unwrap();
        }
        for r in readers {
            let buf = timeout(Duration::from_secs(10), r).await.expect("read timed out").unwrap();
            assert_eq!(&buf[..], b"hello");
        }
    });
    let stats = rt.stats().total;
    assert_eq!(stats.accepted, BURST as u64);
    assert!(stats.sq_full >= 1, "the submission queue never filled");
    assert!(
        stats.cq_overflows + stats.multishot_rearms >= 1,
        "the completion queue never overflowed"
    );
    println!(
        "sq_full={} cq_overflows={} multishot_rearms={} uring_enters={} submissions={}",
        stats.sq_full,
        stats.cq_overflows,
        stats.multishot_rearms,
        stats.uring_enters,
        stats.submissions
    );
}

#[test]
fn full_accept_queue_pauses_the_multishot() {
    let _serial = serial();
    if uring_skipped() {
        return;
    }
    // More than the driver queues per listener (1024): the multishot is
    // cancelled when the queue fills and re-armed once it drains.
    const BURST: usize = 1100;
    hotloop::raise_nofile_limit().unwrap();
    let rt = uring_runtime(1);
    rt.block_on(async {
        // Unpaced: pacing that finds the loop behind would stop the
        // multishot before the queue fills (`paced_accept.rs`).
        let options = ListenerOptions { accept_pacing: None, ..Default::default() };
        let listener = TcpListener::bind_with("127.0.0.1:0", options).unwrap();
        let addr = listener.local_addr().unwrap();
        // Arm the multishot first, so the kernel accepts the whole burst into the queue.
        let first = StdStream::connect(addr).unwrap();
        let mut accepted = vec![listener.accept_stream().await.unwrap()];
        let clients: Vec<StdStream> =
            (0..BURST - 1).map(|_| StdStream::connect(addr).unwrap()).collect();
        sleep(Duration::from_millis(50)).await;
        while accepted.len() < BURST {
            let s = timeout(Duration::from_secs(10), listener.accept_stream())
                .await
                .expect("accept timed out")
                .unwrap();
            accepted.push(s);
        }
        // The full queue ended the multishot; a later connection needs it re-armed.
        let late = StdStream::connect(addr).unwrap();
        timeout(Duration::from_secs(5), listener.accept_stream())
            .await
            .expect("accept after the queue drained timed out")
            .unwrap();
        drop((first, clients, late));
    });
    let stats = rt.stats().total;
    assert_eq!(stats.accepted, BURST as u64 + 1);
    assert!(stats.multishot_rearms >= 1, "the full queue never paused the multishot: {stats:?}");
    assert_eq!(stats.accept_errors_other, 0);
}

#[test]
fn kernel_busy_poll_is_reported() {
    let _serial = serial();
    if uring_skipped() {
        return;
    }
    let rt = Runtime::builder()
        .workers(1)
        .driver(DriverKind::Uring)
        .kernel_busy_poll(Some(hotloop::KernelBusyPoll { busy_poll_us: 50, budget: 8 }))
        .build()
        .unwrap();
    let info = rt.stats().info;
    println!("kernel_busy_poll: {}", info.kernel_busy_poll);
    assert!(
        info.kernel_busy_poll.starts_with("on:")
            || info.kernel_busy_poll.starts_with("not applied:"),
        "{}",
        info.kernel_busy_poll
    );
    assert!(info.kernel_busy_poll.contains("NAPI"));
}

#[test]
fn reads_dropped_while_data_arrives() {
    let _serial = serial();
    if uring_skipped() {
        return;
    }
    // Data keeps arriving while reads are being dropped, so some reads are
    // dropped after the kernel filled their buffer or while it does: the
    // buffer must outlive the operation either way.
    const ROUNDS: usize = 300;
    let rt = uring_runtime(1);
    let baseline = hotloop::open_fd_count().unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let writer = thread::spawn(move || {
            let mut s = StdStream::connect(addr).unwrap();
            let mut sent = 0usize;
            let start = Instant::now();
            while start.elapsed() < Duration::from_millis(400) {
                if s.write_all(&[1u8; 64]).is_err() {
                    break;
                }
                sent += 64;
                // Gaps around the 1 ms read timeout, so reads both finish and get dropped.
                let gap_us = [200, 900, 1100, 1500][sent / 64 % 4];
                thread::sleep(Duration::from_micros(gap_us));
            }
            sent
        });
        let stream = listener.accept_stream().await.unwrap();
        let (mut received, mut dropped) = (0usize, 0usize);
        for _ in 0..ROUNDS {
            match timeout(Duration::from_millis(1), stream.read_owned(Vec::with_capacity(256)))
                .await
            {
                Ok((res, buf)) => {
                    let n = res.unwrap();
                    assert!(buf.iter().all(|&b| b == 1), "a read returned foreign bytes");
                    received += n;
                }
                Err(_) => dropped += 1,
            }
        }
        let sent = writer.join().unwrap();
        assert!(received <= sent);
        assert!(dropped > 0 && received > 0, "received {received}, dropped {dropped}");
        drop(stream);
        drop(listener);
        sleep(Duration::from_millis(20)).await;
    });
    assert_eq!(hotloop::open_fd_count().unwrap(), baseline, "descriptors leaked");
}

/// The inode of the socket behind descriptor `fd` of this process.
fn socket_inode(fd: i32) -> Option<String> {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).ok().map(|p| p.display().to_string())
}

/// True while some descriptor of this process still refers to `inode`.
fn inode_open(inode: &str) -> bool {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .any(|e| std::fs::read_link(e.path()).is_ok_and(|p| p.display().to_string() == inode))
}

#[test]
fn a_dropped_streams_stuck_write_is_cut_at_its_linger_limit_on_an_idle_worker() {
    use std::os::fd::AsRawFd;
    use tokio::io::AsyncWriteExt;

    let _serial = serial();
    if uring_skipped() {
        return;
    }
    let rt = uring_runtime(1);
    // A peer that never reads, with a small receive buffer, so a write
    // behind the stream stays stuck in the kernel.
    let peer = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = peer.local_addr().unwrap();
    let inode = rt
        .handle()
        .spawn_on(0, move || async move {
            let mut stream = hotloop::net::TcpStream::connect(addr).await.unwrap();
            let inode = socket_inode(stream.as_raw_fd()).unwrap();
            let chunk = vec![7u8; 64 * 1024];
            // Write until a write waits: the send in flight cannot finish.
            loop {
                match timeout(Duration::from_millis(200), AsyncWriteExt::write(&mut stream, &chunk))
                    .await
                {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => panic!("write failed: {e}"),
                    Err(_) => break,
                }
            }
            drop(stream);
            inode
        })
        .join()
        .unwrap();
    let (_held, _) = peer.accept().unwrap();
    // The worker has nothing else to do now: only the linger limit
    // (5 s) may end the stuck write and close the socket.
    assert!(inode_open(&inode), "the lingering write holds the socket at first");
    let started = Instant::now();
    while inode_open(&inode) && started.elapsed() < Duration::from_secs(15) {
        thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !inode_open(&inode),
        "the socket of a dropped stream whose write is stuck must close at its linger limit"
    );
    assert!(started.elapsed() < Duration::from_secs(9), "closed after {:?}", started.elapsed());
}

/// An owned write on a quiet worker goes out as a direct `send(2)`, with
/// no ring entry; into a socket with no room it falls back to a `SEND`
/// entry that waits, and every byte of every write arrives, in order.
#[test]
fn a_quiet_workers_write_is_sent_directly_and_a_full_socket_falls_back_to_the_ring() {
    use std::io::Read;

    let _serial = serial();
    if uring_skipped() {
        return;
    }
    const CHUNK: usize = 64 * 1024;
    const TOTAL: usize = 24 << 20; // far more than loopback's socket buffers hold
    let rt = uring_runtime(1);
    let listener = rt.block_on(async { TcpListener::bind("127.0.0.1:0").unwrap() });
    let addr = listener.local_addr().unwrap();
    let mut client = StdStream::connect(addr).unwrap();
    let stats = rt.handle();
    let (lone_entries, queued_entries) = rt.block_on(async move {
        let stream = listener.accept_stream().await.unwrap();
        // Let the worker go quiet: a turn with nothing to complete.
        sleep(Duration::from_millis(20)).await;
        let before = stats.stats().total.submissions;
        let (res, _) = stream.write_owned(b"lone".to_vec()).await;
        assert_eq!(res.unwrap(), 4);
        let mut lone_entries = stats.stats().total.submissions - before;
        // The poll form (tokio's `AsyncWrite`, which hyper writes through)
        // too: its flush has nothing left to wait for.
        let mut stream = stream;
        sleep(Duration::from_millis(20)).await;
        let before = stats.stats().total.submissions;
        tokio::io::AsyncWriteExt::write_all(&mut stream, b"ly").await.unwrap();
        tokio::io::AsyncWriteExt::flush(&mut stream).await.unwrap();
        lone_entries += stats.stats().total.submissions - before;
        // The client does not read yet: the socket fills, a direct send
        // says EAGAIN, and the rest goes through SEND entries.
        let before = stats.stats().total.submissions;
        let writer = hotloop::spawn(async move {
            let mut sent = 0;
            while sent < TOTAL {
                let chunk: Vec<u8> = (sent..sent + CHUNK).map(|i| (i % 251) as u8).collect();
                let (res, _) = stream.write_all_owned(chunk).await;
                res.expect("write");
                sent += CHUNK;
            }
            stream
        });
        sleep(Duration::from_millis(300)).await;
        let queued_entries = stats.stats().total.submissions - before;
        let reader = std::thread::spawn(move || {
            let mut first = [0u8; 6];
            client.read_exact(&mut first).unwrap();
            assert_eq!(&first, b"lonely");
            let mut got = vec![0u8; TOTAL];
            client.read_exact(&mut got).unwrap();
            let wrong = got.iter().enumerate().position(|(i, b)| *b != (i % 251) as u8);
            assert_eq!(wrong, None, "a byte out of place");
            client
        });
        let _stream =
            timeout(Duration::from_secs(20), writer).await.expect("writer stuck").unwrap();
        let _client = hotloop::task::spawn_blocking(move || reader.join().unwrap()).await.unwrap();
        (lone_entries, queued_entries)
    });
    assert_eq!(lone_entries, 0, "a quiet worker's lone write made a ring entry");
    assert!(rt.stats().total.direct_sends >= 2, "the direct sends were not counted");
    assert!(queued_entries >= 1, "a write into a full socket never reached the ring");
}

/// With `HOTLOOP_URING_DIRECT_SEND=0` every owned write is a `SEND` entry.
#[test]
fn direct_sends_can_be_switched_off() {
    const NAME: &str = "direct_sends_can_be_switched_off";
    if is_child(NAME) {
        let rt = uring_runtime(1);
        let handle = rt.handle();
        let listener = rt.block_on(async { TcpListener::bind("127.0.0.1:0").unwrap() });
        let _client = StdStream::connect(listener.local_addr().unwrap()).unwrap();
        let entries = rt.block_on(async move {
            let stream = listener.accept_stream().await.unwrap();
            sleep(Duration::from_millis(20)).await;
            let before = handle.stats().total.submissions;
            let (res, _) = stream.write_owned(b"lone".to_vec()).await;
            assert_eq!(res.unwrap(), 4);
            handle.stats().total.submissions - before
        });
        assert!(entries >= 1, "the write made no ring entry with direct sends off");
        return;
    }
    let _serial = serial();
    if uring_skipped() {
        return;
    }
    run_child(NAME, &[("HOTLOOP_URING_DIRECT_SEND", "0")]);
}

/// Writes four 256 KiB shared buffers (`Arc<[u8]>`, which a zero-copy
/// send can keep alive) to a loopback client that checks every byte, then
/// prints the description line and the zero-copy counters (`zc=N copied=N`).
fn write_large_and_count() {
    const WRITE: usize = 256 << 10;
    const WRITES: usize = 4;
    let rt = uring_runtime(1);
    let listener = rt.block_on(async { TcpListener::bind("127.0.0.1:0").unwrap() });
    let mut client = StdStream::connect(listener.local_addr().unwrap()).unwrap();
    let reader = thread::spawn(move || {
        let mut got = vec![0u8; WRITE * WRITES];
        std::io::Read::read_exact(&mut client, &mut got).unwrap();
        got.iter().enumerate().position(|(i, &b)| b != (i % 251) as u8)
    });
    rt.block_on(async move {
        let stream = listener.accept_stream().await.unwrap();
        for n in 0..WRITES {
            let buf: std::sync::Arc<[u8]> =
                (n * WRITE..(n + 1) * WRITE).map(|i| (i % 251) as u8).collect();
            stream.write_all_owned(buf).await.0.unwrap();
        }
        // The notifications of the last sends may come after their
        // results: let the ring reap them before counting.
        sleep(Duration::from_millis(100)).await;
    });
    assert_eq!(reader.join().unwrap(), None, "a byte out of place");
    let stats = rt.stats();
    println!("reason: {}", stats.info.reason);
    println!("zc={} copied={}", stats.total.send_zc, stats.total.send_zc_copied);
}

/// The zero-copy counters a child printed.
fn zero_copy_counts(out: &str) -> (u64, u64) {
    let line = out.lines().find(|l| l.starts_with("zc=")).expect("no counters printed");
    let mut nums = line.split(' ').map(|f| f.split('=').nth(1).unwrap().parse::<u64>().unwrap());
    (nums.next().unwrap(), nums.next().unwrap())
}

/// Owned writes of shared buffers from 64 KiB go out zero-copy
/// (`SEND_ZC`), save to a local peer: the kernel would copy them at
/// delivery (and says so when asked), so to a loopback peer they are
/// plain sends from the first. `HOTLOOP_URING_SEND_ZC=always` sends
/// zero-copy anyway (every write counted as copied), `=0` never does; the
/// description line says which, and the bytes arrive whole either way.
#[test]
fn zero_copy_sends_are_counted_and_can_be_switched_off() {
    const NAME: &str = "zero_copy_sends_are_counted_and_can_be_switched_off";
    let Some((_serial, out)) = in_child(NAME, &[], write_large_and_count) else { return };
    if let Some(why) = out.lines().find_map(|l| l.split("zero-copy sends off: ").nth(1)) {
        assert!(
            std::env::var(common::REQUIRE_URING).as_deref() != Ok("1"),
            "zero-copy sends are required with io_uring ({}=1): {why}",
            common::REQUIRE_URING
        );
        eprintln!("skipped: {why}");
        return;
    }
    assert!(out.contains("65536 bytes or more sent zero-copy"), "{out}");
    assert_eq!(zero_copy_counts(&out), (0, 0), "loopback: zero-copy sends to a local peer\n{out}");
    let out = run_child(NAME, &[("HOTLOOP_URING_SEND_ZC", "always")]);
    let (zc, copied) = zero_copy_counts(&out);
    assert!(zc == 0 && copied >= 4, "every write zero-copy, each copied: {zc} {copied}\n{out}");
    let out = run_child(NAME, &[("HOTLOOP_URING_SEND_ZC", "0")]);
    assert!(out.contains("zero-copy sends off (HOTLOOP_URING_SEND_ZC=0)"), "{out}");
    assert_eq!(zero_copy_counts(&out), (0, 0), "{out}");
}

/// Serves one echo on a fresh io_uring runtime and returns its
/// description line.
fn echo_once_and_describe() -> String {
    let rt = uring_runtime(1);
    let listener = rt.block_on(async { TcpListener::bind("127.0.0.1:0").unwrap() });
    let mut client = StdStream::connect(listener.local_addr().unwrap()).unwrap();
    client.write_all(b"ping").unwrap();
    rt.block_on(async move {
        let stream = listener.accept_stream().await.unwrap();
        let (res, buf) = stream.read_owned(Vec::with_capacity(16)).await;
        assert_eq!(res.unwrap(), 4);
        let (res, _) = stream.write_owned(buf).await;
        assert_eq!(res.unwrap(), 4);
    });
    let mut got = [0u8; 4];
    std::io::Read::read_exact(&mut client, &mut got).unwrap();
    assert_eq!(&got, b"ping");
    rt.stats().info.reason
}

/// The ring is entered through a registered descriptor unless
/// `HOTLOOP_URING_REGISTERED_RING=0`; the description line says which, and
/// connections are served either way.
#[test]
fn registered_ring_is_described_and_can_be_switched_off() {
    const NAME: &str = "registered_ring_is_described_and_can_be_switched_off";
    if is_child(NAME) {
        println!("reason: {}", echo_once_and_describe());
        return;
    }
    let _serial = serial();
    if uring_skipped() {
        return;
    }
    let reason = echo_once_and_describe();
    assert!(reason.contains("; ring descriptor registered;"), "{reason}");
    let out = run_child(NAME, &[("HOTLOOP_URING_REGISTERED_RING", "0")]);
    assert!(
        out.contains("ring descriptor not registered (HOTLOOP_URING_REGISTERED_RING=0)"),
        "{out}"
    );
}

/// The child of the two tests below: a `SEND` entry queued by one task,
/// then ten tasks that each hold the worker for 20 ms. Returns when the
/// peer had the bytes, counted from before the tasks were spawned, and
/// how long the ten tasks took together.
fn send_queued_before_costly_tasks() -> (Duration, Duration) {
    const COSTLY_TASKS: usize = 10;
    const COSTLY: Duration = Duration::from_millis(20);
    let rt = uring_runtime(1);
    let listener = rt.block_on(async { TcpListener::bind("127.0.0.1:0").unwrap() });
    let mut client = StdStream::connect(listener.local_addr().unwrap()).unwrap();
    let start = Rc::new(Cell::new(None::<Instant>));
    let reader = thread::spawn(move || {
        let mut got = [0u8; 4];
        std::io::Read::read_exact(&mut client, &mut got).unwrap();
        assert_eq!(&got, b"ping");
        Instant::now()
    });
    let costly = rt.block_on({
        let start = start.clone();
        async move {
            let stream = listener.accept_stream().await.unwrap();
            start.set(Some(Instant::now()));
            // With direct sends off (the callers' environment), the write
            // is a `SEND` entry waiting for the ring to be entered.
            let writer = hotloop::spawn(async move {
                let (res, _) = stream.write_owned(b"ping".to_vec()).await;
                assert_eq!(res.unwrap(), 4);
                stream
            });
            let t0 = Instant::now();
            let costly: Vec<_> = (0..COSTLY_TASKS)
                .map(|_| hotloop::spawn(async { thread::sleep(COSTLY) }))
                .collect();
            for task in costly {
                task.await.unwrap();
            }
            let took = t0.elapsed();
            let _stream = writer.await.unwrap();
            took
        }
    });
    let arrived = reader.join().unwrap();
    (arrived - start.get().unwrap(), costly)
}

/// An entry queued early in a long run of tasks is submitted while the
/// later tasks run (`HOTLOOP_URING_SUBMIT_AFTER_US`, 200 µs by default),
/// as epoll's inline write would send it, not after the run.
#[test]
fn an_entry_queued_before_costly_tasks_is_submitted_while_they_run() {
    const NAME: &str = "an_entry_queued_before_costly_tasks_is_submitted_while_they_run";
    if is_child(NAME) {
        let (arrived, costly) = send_queued_before_costly_tasks();
        assert!(costly >= Duration::from_millis(200), "the costly tasks took {costly:?}");
        assert!(
            arrived < Duration::from_millis(100),
            "the bytes arrived {arrived:?} after the write, the costly tasks took {costly:?}"
        );
        return;
    }
    let _serial = serial();
    if uring_skipped() {
        return;
    }
    run_child(NAME, &[("HOTLOOP_URING_DIRECT_SEND", "0")]);
}

/// With `HOTLOOP_URING_SUBMIT_AFTER_US=off` the same entry waits for the
/// end of the run of tasks: the case the default exists for.
#[test]
fn submitting_during_a_run_of_tasks_can_be_switched_off() {
    const NAME: &str = "submitting_during_a_run_of_tasks_can_be_switched_off";
    if is_child(NAME) {
        let (arrived, costly) = send_queued_before_costly_tasks();
        assert!(
            arrived >= Duration::from_millis(180),
            "the bytes arrived {arrived:?} after the write, before the costly tasks ended \
             ({costly:?}), with submitting during the run off"
        );
        return;
    }
    let _serial = serial();
    if uring_skipped() {
        return;
    }
    run_child(
        NAME,
        &[("HOTLOOP_URING_DIRECT_SEND", "0"), ("HOTLOOP_URING_SUBMIT_AFTER_US", "off")],
    );
}

/// The child of the test below: streams of every shape at once on one
/// io_uring worker, read with pooled reads, each byte checked: four bulk
/// senders (256 KiB in 7,001-byte writes, so receives end inside buffers
/// and share them with other sockets) and four that send 37-byte messages
/// one at a time. Prints the description line.
fn receive_mixed_streams_and_check() {
    const BULK: usize = 256 * 1024;
    const SMALL: usize = 37;
    const MESSAGES: usize = 400;
    let rt = uring_runtime(1);
    let listener = rt.block_on(async { TcpListener::bind("127.0.0.1:0").unwrap() });
    let addr = listener.local_addr().unwrap();
    let pattern = |stream: usize, i: usize| ((i * 7 + stream * 31) % 251) as u8;
    let senders: Vec<_> = (0..8)
        .map(|k| {
            thread::spawn(move || {
                let mut c = StdStream::connect(addr).unwrap();
                c.write_all(&[k as u8]).unwrap();
                if k < 4 {
                    let sent: Vec<u8> = (0..BULK).map(|i| pattern(k, i)).collect();
                    for chunk in sent.chunks(7_001) {
                        c.write_all(chunk).unwrap();
                    }
                } else {
                    let mut ack = [0u8; 1];
                    for m in 0..MESSAGES {
                        let msg: Vec<u8> = (0..SMALL).map(|i| pattern(k, m * SMALL + i)).collect();
                        c.write_all(&msg).unwrap();
                        // One message in flight at a time, as requests are.
                        std::io::Read::read_exact(&mut c, &mut ack).unwrap();
                    }
                }
            })
        })
        .collect();
    rt.block_on(async move {
        let mut readers = Vec::new();
        for _ in 0..8 {
            let stream = listener.accept_stream().await.unwrap();
            readers.push(hotloop::spawn(async move {
                let (mut got, mut acked) = (Vec::new(), 0);
                loop {
                    let bytes = timeout(Duration::from_secs(10), stream.read_pooled())
                        .await
                        .expect("bytes within 10 s")
                        .unwrap();
                    if bytes.is_empty() {
                        break;
                    }
                    got.extend_from_slice(&bytes);
                    // A small sender waits for each whole message's ack.
                    while got[0] >= 4 && acked < (got.len() - 1) / SMALL {
                        let (res, _) = stream.write_owned(vec![1u8]).await;
                        res.unwrap();
                        acked += 1;
                    }
                }
                let k = got[0] as usize;
                let body = &got[1..];
                let want = if k < 4 { BULK } else { SMALL * MESSAGES };
                assert_eq!(body.len(), want, "stream {k}: bytes received");
                for (i, &b) in body.iter().enumerate() {
                    assert_eq!(b, pattern(k, i), "stream {k}: byte {i} of {want}");
                }
            }));
        }
        for reader in readers {
            reader.await.unwrap();
        }
    });
    for s in senders {
        s.join().unwrap();
    }
    println!("reason: {}", rt.stats().info.reason);
}

/// Stream receives fill 64 KiB buffers a completion at a time
/// (`IOU_PBUF_RING_INC`) unless `HOTLOOP_URING_RECV_INC=0`, when each takes a
/// whole 4 KiB buffer; the description line says which, and every byte of
/// bulk and small streams read at once arrives in order either way.
#[test]
fn stream_receives_fill_buffers_incrementally_and_can_be_switched_off() {
    const NAME: &str = "stream_receives_fill_buffers_incrementally_and_can_be_switched_off";
    let Some((_serial, out)) = in_child(NAME, &[], receive_mixed_streams_and_check) else { return };
    if let Some(why) = out.lines().find_map(|l| l.split("4 KiB buffers whole: ").nth(1)) {
        eprintln!("incremental consumption not tested: {why}");
    } else {
        assert!(out.contains("a part at a time (IOU_PBUF_RING_INC)"), "{out}");
    }
    let out = run_child(NAME, &[("HOTLOOP_URING_RECV_INC", "0")]);
    assert!(out.contains("take 4 KiB buffers whole (HOTLOOP_URING_RECV_INC=0)"), "{out}");
}

/// Descriptors open in this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A blocking client that sends `msg` and reads its echo, `rounds` times
/// (a keep-alive exchange).
fn exchange(client: &mut StdStream, msg: &[u8], rounds: usize) {
    client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = vec![0u8; msg.len()];
    for _ in 0..rounds {
        client.write_all(msg).unwrap();
        std::io::Read::read_exact(client, &mut got).unwrap();
        assert_eq!(got, msg);
    }
}

/// The child of the test below: 8 keep-alive connections echoed over
/// owned reads, owned and poll-form writes and a shutdown; prints the
/// description line and the counters.
fn keepalive_over_accepted_streams() {
    const CONNECTIONS: usize = 8;
    let rt = uring_runtime(1);
    let listener = rt.block_on(async { TcpListener::bind("127.0.0.1:0").unwrap() });
    let addr = listener.local_addr().unwrap();
    let before = open_fds();
    let served = Rc::new(Cell::new(0));
    let clients = thread::spawn(move || {
        let mut all: Vec<StdStream> =
            (0..CONNECTIONS).map(|_| StdStream::connect(addr).unwrap()).collect();
        for (i, c) in all.iter_mut().enumerate() {
            exchange(c, format!("request {i}").as_bytes(), 20);
        }
        for c in &mut all {
            c.shutdown(std::net::Shutdown::Write).unwrap();
            let mut rest = Vec::new();
            std::io::Read::read_to_end(c, &mut rest).unwrap();
            assert_eq!(rest, b"bye", "the last write before the shutdown was lost");
        }
    });
    let fds_held = rt.block_on({
        let served = served.clone();
        async move {
            let mut tasks = Vec::new();
            let mut fds_held = 0;
            for _ in 0..CONNECTIONS {
                let stream = listener.accept_stream().await.unwrap();
                let served = served.clone();
                tasks.push(hotloop::spawn(async move {
                    let mut buf = Vec::with_capacity(64);
                    loop {
                        let (res, b) = stream.read_owned(buf).await;
                        buf = b;
                        if res.unwrap() == 0 {
                            break;
                        }
                        let (res, b) = stream.write_all_owned(buf).await;
                        buf = b;
                        res.unwrap();
                        buf.clear();
                    }
                    // A poll-form write, then the write side shut.
                    let mut left: &[u8] = b"bye";
                    while !left.is_empty() {
                        match stream.try_write(left) {
                            Ok(n) => left = &left[n..],
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                                stream.writable().await.unwrap()
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                    stream.shutdown_with(std::net::Shutdown::Write).await.unwrap();
                    served.set(served.get() + 1);
                }));
            }
            fds_held = fds_held.max(open_fds());
            for t in tasks {
                t.await.unwrap();
            }
            fds_held
        }
    });
    clients.join().unwrap();
    assert_eq!(served.get(), CONNECTIONS);
    let stats = rt.stats();
    println!(
        "reason: {}\ndirect_accepts={} installs={} fds_added={}",
        stats.info.reason,
        stats.total.direct_accepts,
        stats.total.direct_fd_installs,
        fds_held.saturating_sub(before + CONNECTIONS),
    );
}

/// The number after `name=` in `out`.
fn counter(out: &str, name: &str) -> u64 {
    let at = out.find(&format!("{name}=")).unwrap_or_else(|| panic!("no {name} in {out}"));
    out[at + name.len() + 1..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

/// With `HOTLOOP_URING_DIRECT_FDS=1` accepted connections are direct
/// descriptors: slots of the ring's file table, none of the process's
/// descriptors, and keep-alive exchanges, poll-form writes and shutdowns
/// go through the ring on the slot, with no plain descriptor installed.
/// Off (the default, and `=0`), they are plain descriptors.
#[test]
fn direct_descriptors_serve_keepalive_exchanges_and_can_be_switched_off() {
    const NAME: &str = "direct_descriptors_serve_keepalive_exchanges_and_can_be_switched_off";
    let Some((_serial, out)) = in_direct_child(NAME, keepalive_over_accepted_streams) else {
        return;
    };
    assert!(out.contains("accepted TCP connections are direct descriptors"), "{out}");
    assert_eq!(counter(&out, "direct_accepts"), 8, "{out}");
    assert_eq!(counter(&out, "installs"), 0, "a plain descriptor was installed: {out}");
    assert_eq!(counter(&out, "fds_added"), 0, "accepted streams took descriptors: {out}");
    let out = run_child(NAME, &[("HOTLOOP_URING_DIRECT_FDS", "0")]);
    assert!(out.contains("plain descriptors (HOTLOOP_URING_DIRECT_FDS=0)"), "{out}");
    assert_eq!(counter(&out, "direct_accepts"), 0, "{out}");
    assert_eq!(counter(&out, "fds_added"), 8, "{out}");
}

/// The child of the test below: 40 connections, each answered and kept
/// open, on a listener whose backlog is 8, with a table of 24 slots,
/// accepted by a multishot accept (`accept_pacing` off) or one at a time.
fn more_connections_than_slots() {
    const CONNECTIONS: usize = 40;
    let rt = uring_runtime(1);
    let paced = std::env::var("PACED").is_ok();
    let options = ListenerOptions {
        backlog: 8,
        accept_pacing: if paced { ListenerOptions::default().accept_pacing } else { None },
        ..Default::default()
    };
    let listener = rt.block_on(async { TcpListener::bind_with("127.0.0.1:0", options).unwrap() });
    let addr = listener.local_addr().unwrap();
    let clients = thread::spawn(move || {
        let mut held = Vec::new();
        for i in 0..CONNECTIONS {
            let mut c = StdStream::connect(addr).unwrap();
            exchange(&mut c, format!("client {i}").as_bytes(), 2);
            held.push(c);
        }
        held
    });
    rt.block_on(async {
        for _ in 0..CONNECTIONS {
            let stream = listener.accept_stream().await.unwrap();
            hotloop::spawn(common::echo(stream));
        }
        while !clients.is_finished() {
            sleep(Duration::from_millis(2)).await;
        }
    });
    let held = clients.join().unwrap();
    let stats = rt.stats();
    println!(
        "reason: {}\ndirect_accepts={} accept_errors_resources={}",
        stats.info.reason, stats.total.direct_accepts, stats.total.accept_errors_resources
    );
    drop(held);
}

/// A file table smaller than the connections: the driver stops accepting
/// into it while it lacks room for the listener's backlog (the kernel
/// would close a connection it accepted with no slot for it, `ENFILE`),
/// and the rest are plain descriptors; every connection is served.
#[test]
fn a_table_smaller_than_the_connections_falls_back_to_plain_descriptors() {
    const NAME: &str = "a_table_smaller_than_the_connections_falls_back_to_plain_descriptors";
    if is_child(NAME) {
        more_connections_than_slots();
        return;
    }
    let _serial = serial();
    if uring_skipped() {
        return;
    }
    let out = run_child(
        NAME,
        &[("HOTLOOP_URING_DIRECT_FDS", "1"), ("HOTLOOP_URING_DIRECT_FDS_SLOTS", "24")],
    );
    assert!(out.contains("direct descriptors (24 slots)"), "{out}");
    let direct = counter(&out, "direct_accepts");
    // 24 slots, 9 kept free for a multishot accept on a backlog of 8 (and
    // one): 16, and perhaps one the kernel accepted before the stop
    // reached it.
    assert!((8..=17).contains(&direct), "{direct} direct of 40: {out}");
    assert_eq!(counter(&out, "accept_errors_resources"), 0, "the table filled: {out}");
    // One at a time (accept pacing), every slot is used.
    let out = run_child(
        NAME,
        &[
            ("HOTLOOP_URING_DIRECT_FDS", "1"),
            ("HOTLOOP_URING_DIRECT_FDS_SLOTS", "24"),
            ("PACED", "1"),
        ],
    );
    assert_eq!(counter(&out, "direct_accepts"), 24, "{out}");
    assert_eq!(counter(&out, "accept_errors_resources"), 0, "the table filled: {out}");
}

/// The child of the test below. Stream A's write-behind send waits for
/// room (its client reads nothing yet) when A is dropped: the driver sends
/// the rest, one entry per part, on A's socket. Meanwhile a new
/// connection B is accepted, where the kernel would reuse A's slot were
/// it free. Every byte A took reaches A's client, and B's client gets
/// only B's bytes.
fn lingering_write_beside_a_new_connection() {
    let rt = uring_runtime(1);
    let listener = rt.block_on(async { TcpListener::bind("127.0.0.1:0").unwrap() });
    let addr = listener.local_addr().unwrap();
    // A's client takes little at a time, so the rest leaves in many parts.
    let client_a =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    client_a.set_recv_buffer_size(4096).unwrap();
    client_a.connect(&addr.into()).unwrap();
    let client_a: StdStream = client_a.into();
    // One `block_on`: a runtime leaving the thread waits for the lingering
    // write (up to its deadline), which A's client only reads later.
    let mut client_b = rt.block_on(async {
        let a = listener.accept_stream().await.unwrap();
        a.set_send_buffer_size(4096).unwrap();
        let chunk = vec![b'a'; 64 * 1024];
        let mut taken = 0usize;
        // Until a send has waited 100 ms for room.
        loop {
            match a.try_write(&chunk) {
                Ok(n) => taken += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if timeout(Duration::from_millis(100), a.writable()).await.is_err() {
                        break;
                    }
                }
                Err(e) => panic!("{e}"),
            }
        }
        drop(a);
        let client_b = StdStream::connect(addr).unwrap();
        let b = listener.accept_stream().await.unwrap();
        let (res, _) = b.write_all_owned(b"only b".to_vec()).await;
        res.unwrap();
        // A's client starts reading now: A's rest goes out while B is open.
        let reader = thread::spawn(move || {
            let mut client_a = client_a;
            client_a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut all = Vec::new();
            let mut part = [0u8; 1024];
            loop {
                match std::io::Read::read(&mut client_a, &mut part).unwrap() {
                    0 => break all,
                    n => all.extend_from_slice(&part[..n]),
                }
                thread::sleep(Duration::from_micros(200));
            }
        });
        while !reader.is_finished() {
            sleep(Duration::from_millis(5)).await;
        }
        let all = reader.join().unwrap();
        assert_eq!(all.len(), taken, "A's client got {} of the {taken} bytes A took", all.len());
        assert!(all.iter().all(|&c| c == b'a'));
        drop(b);
        client_b
    });
    client_b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut client_b, &mut got).unwrap();
    assert_eq!(got, b"only b", "B's client got another stream's bytes");
    let stats = rt.stats();
    println!("direct_accepts={}", stats.total.direct_accepts);
}

/// A slot is given back only after the last operation on it ended (as a
/// plain descriptor is closed): an entry a dropped stream's write still
/// queues never reaches the connection accepted next.
#[test]
fn an_entry_of_a_dropped_stream_never_reaches_the_next_connections_slot() {
    const NAME: &str = "an_entry_of_a_dropped_stream_never_reaches_the_next_connections_slot";
    let Some((_serial, out)) = in_child(
        NAME,
        &[("HOTLOOP_URING_DIRECT_FDS", "1")],
        lingering_write_beside_a_new_connection,
    ) else {
        return;
    };
    assert_eq!(counter(&out, "direct_accepts"), 2, "{out}");
}

/// The child of the test below: a direct stream's `as_raw_fd` and
/// `peer_addr` work as on a plain descriptor (one is installed, once), and
/// the stream goes on serving through the ring.
fn raw_fd_of_a_direct_stream() {
    use std::os::fd::{AsRawFd, FromRawFd};
    let rt = uring_runtime(1);
    let (_listener, mut client, stream) = one_accepted(&rt);
    let client_addr = client.local_addr().unwrap();
    assert_eq!(rt.stats().total.direct_fd_installs, 0);
    let raw = stream.as_raw_fd();
    // User code's own system call on it: `getpeername` through std.
    // SAFETY: `raw` is the stream's open descriptor; `ManuallyDrop` never closes it.
    let std_view = std::mem::ManuallyDrop::new(unsafe { StdStream::from_raw_fd(raw) });
    assert_eq!(std_view.peer_addr().unwrap(), client_addr);
    assert_eq!(stream.peer_addr().unwrap(), client_addr);
    assert_eq!(stream.as_raw_fd(), raw);
    stream.set_nodelay(true).unwrap();
    assert!(stream.nodelay().unwrap());
    rt.block_on(async {
        let served = hotloop::spawn(common::echo(stream));
        let ask = thread::spawn(move || {
            exchange(&mut client, b"after as_raw_fd", 5);
        });
        while !ask.is_finished() {
            sleep(Duration::from_millis(2)).await;
        }
        ask.join().unwrap();
        drop(served);
    });
    print_direct_counters(&rt);
}

/// `as_raw_fd` (and every socket call through it) on a stream accepted as
/// a direct descriptor works as on a plain one.
#[test]
fn a_direct_streams_raw_fd_is_a_plain_descriptor() {
    one_direct_accept_one_install(
        "a_direct_streams_raw_fd_is_a_plain_descriptor",
        raw_fd_of_a_direct_stream,
    );
}

/// The child of the test below: an input probe of a direct stream costs
/// no descriptor until it is used; used, it sees what the client sent
/// before any read did; once the stream is gone it says so.
fn input_probe_of_a_direct_stream() {
    let rt = uring_runtime(1);
    let (_listener, mut client, stream) = one_accepted(&rt);
    let probe = stream.input_probe();
    assert_eq!(rt.stats().total.direct_fd_installs, 0, "making the probe installed a descriptor");
    let shown = format!("{stream:?}");
    assert!(shown.contains("fd: None") && shown.contains("direct_slot"), "{shown}");
    assert_eq!(
        rt.stats().total.direct_fd_installs,
        0,
        "printing the stream installed a descriptor"
    );
    assert!(!probe.pending().unwrap(), "nothing was sent yet");
    client.write_all(b"x").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !probe.pending().unwrap() {
        assert!(Instant::now() < deadline, "the probe never saw the byte");
        thread::sleep(Duration::from_millis(1));
    }
    drop(stream);
    assert!(probe.pending().is_err(), "a probe of a closed stream answered");
    print_direct_counters(&rt);
}

/// A stream's input probe (what a drain peeks with) installs a plain
/// descriptor for a direct socket only when it is used, not when made;
/// printing the stream (`Debug`) installs none.
#[test]
fn an_input_probe_installs_a_descriptor_only_when_used() {
    one_direct_accept_one_install(
        "an_input_probe_installs_a_descriptor_only_when_used",
        input_probe_of_a_direct_stream,
    );
}

/// The child of the test below: socket options on a direct stream while
/// no descriptor can be installed for it, then once one can.
fn socket_options_of_a_direct_stream_out_of_descriptors() {
    let rt = uring_runtime(1);
    let (_listener, client, stream) = one_accepted(&rt);
    let fillers = {
        let _limit = NofileLimit::lower_to(highest_fd() + 8);
        // Every number below the limit taken, gaps included.
        let mut fillers = Vec::new();
        while let Ok(f) = std::fs::File::open("/dev/null") {
            fillers.push(f);
        }
        let err = stream.set_nodelay(false).expect_err("an option set with no descriptor to spare");
        assert_eq!(err.raw_os_error(), Some(libc::EMFILE), "{err}");
        assert!(stream.nodelay().is_err(), "an option read with no descriptor to spare");
        let err = stream.peer_addr().expect_err("an address read with no descriptor to spare");
        assert_eq!(err.raw_os_error(), Some(libc::EMFILE), "{err}");
        assert_eq!(rt.stats().total.direct_fd_installs, 0);
        fillers
    };
    drop(fillers);
    stream.set_nodelay(false).unwrap();
    assert!(!stream.nodelay().unwrap(), "the option did not hold");
    assert_eq!(stream.peer_addr().unwrap(), client.local_addr().unwrap());
    print_direct_counters(&rt);
}

/// A socket option on a direct stream when the process is out of
/// descriptors is an `EMFILE` error, not a panic (installing the plain
/// descriptor the option needs fails), and works once one is free.
#[test]
fn socket_options_of_a_direct_stream_fail_cleanly_out_of_descriptors() {
    one_direct_accept_one_install(
        "socket_options_of_a_direct_stream_fail_cleanly_out_of_descriptors",
        socket_options_of_a_direct_stream_out_of_descriptors,
    );
}

/// The child of the test below: a direct stream set to close with a
/// reset (`SO_LINGER` 0) and shut down while no descriptor can be
/// installed for it, then dropped, the fillers still held.
fn direct_stream_cut_out_of_descriptors() {
    use std::io::{ErrorKind, Read};
    let rt = uring_runtime(1);
    let (_listener, mut client, stream) = one_accepted(&rt);
    let fillers = {
        let _limit = NofileLimit::lower_to(highest_fd() + 8);
        let mut fillers = Vec::new();
        while let Ok(f) = std::fs::File::open("/dev/null") {
            fillers.push(f);
        }
        stream.set_linger(Some(Duration::ZERO)).expect("SO_LINGER with no descriptor to spare");
        // The kernel shutdown a TLS cut makes after it needs none either.
        stream.shutdown_now(std::net::Shutdown::Read).expect("a shutdown with none to spare");
        drop(stream);
        fillers
    };
    client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let end = client.read(&mut [0u8; 1]);
    assert!(
        matches!(&end, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "the peer read {end:?}, not a reset"
    );
    drop(fillers);
    print_direct_counters(&rt);
}

/// `SO_LINGER` on a direct stream needs no descriptor (a ring entry,
/// Linux 6.7): a connection cut when the process is out of descriptors
/// reaches its peer as a reset. Before, installing the descriptor for
/// the option failed with `EMFILE`, and a caller that went on closed the
/// connection with a FIN, which makes a truncated transfer look whole.
#[test]
fn a_direct_stream_is_reset_out_of_descriptors() {
    const NAME: &str = "a_direct_stream_is_reset_out_of_descriptors";
    if let Some((_serial, out)) = in_direct_child(NAME, direct_stream_cut_out_of_descriptors) {
        assert_direct_counters(&out, 1, 0);
    }
}

/// The child of the test below: hyper serves keep-alive requests on a
/// direct stream, and no plain descriptor is installed for it until the
/// drain's peek.
#[cfg(feature = "hyper")]
fn hyper_over_a_direct_stream() {
    use std::io::Read;
    let rt = uring_runtime(1);
    let service = || {
        hyper::service::service_fn(|_req| async {
            Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Full::new(
                bytes::Bytes::from_static(b"ok"),
            )))
        })
    };
    let server = hotloop::hyper::serve_hyper(
        rt.handle(),
        "127.0.0.1:0",
        ListenerOptions::default(),
        service,
    )
    .unwrap();
    let mut client = StdStream::connect(server.local_addr()).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for _ in 0..3 {
        client.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 512];
        while !(got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"ok")) {
            // A read with a receive timeout is not restarted after a
            // signal (signal(7)): retried, as `read_exact` would.
            let n = match client.read(&mut chunk) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                read => read.unwrap(),
            };
            assert!(n > 0, "closed before the answer: {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&chunk[..n]);
        }
        assert!(got.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&got));
    }
    // A second client that closes after its answer: hyper shuts the
    // connection's write side down (a ring entry on the slot).
    let mut closing = StdStream::connect(server.local_addr()).unwrap();
    closing.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    closing.shutdown(std::net::Shutdown::Write).unwrap();
    closing.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut answer = Vec::new();
    std::io::Read::read_to_end(&mut closing, &mut answer).unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&answer));
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.active_connections() > 1 {
        assert!(Instant::now() < deadline, "the closed connection did not end");
        thread::sleep(Duration::from_millis(2));
    }
    println!("installs_while_serving={}", rt.stats().total.direct_fd_installs);
    server.shutdown_blocking(Duration::from_secs(5));
    print_direct_counters(&rt);
}

/// hyper on a direct stream: keep-alive requests served through the ring,
/// and a connection's end shut down, with no plain descriptor (its writes,
/// its shutdown and the drain's peek used to ask for one per connection).
#[cfg(feature = "hyper")]
#[test]
fn hyper_serves_a_direct_stream_without_installing_a_descriptor() {
    const NAME: &str = "hyper_serves_a_direct_stream_without_installing_a_descriptor";
    let Some((_serial, out)) = in_direct_child(NAME, hyper_over_a_direct_stream) else {
        return;
    };
    assert_eq!(counter(&out, "direct_accepts"), 2, "{out}");
    assert_eq!(counter(&out, "installs_while_serving"), 0, "{out}");
}

/// The child of the test below: a direct stream whose receive is armed and
/// whose queue is empty; the client's bytes arrive while the worker runs
/// this task (no turn since), so they are still the kernel's when
/// `input_pending` looks. Its peek first installs a descriptor, an enter
/// that runs the receive, which moves the bytes out of the socket before
/// the peek and posts a completion no reap has seen: it still says true.
fn input_pending_of_a_direct_stream() {
    use std::io::Write;
    let rt = uring_runtime(1);
    let listener = rt.block_on(async { TcpListener::bind("127.0.0.1:0").unwrap() });
    let mut client = StdStream::connect(listener.local_addr().unwrap()).unwrap();
    rt.block_on(async {
        let stream = listener.accept_stream().await.unwrap();
        client.write_all(b"one").unwrap();
        let (n, buf) = stream.read_owned(vec![0u8; 64]).await;
        assert_eq!(&buf[..n.unwrap()], b"one");
        client.write_all(b"two").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(stream.input_pending().unwrap(), "the client's second bytes were missed");
        let (n, buf) = stream.read_owned(vec![0u8; 64]).await;
        assert_eq!(&buf[..n.unwrap()], b"two");
    });
    print_direct_counters(&rt);
}

#[test]
fn input_pending_sees_bytes_a_mid_turn_enter_moved() {
    const NAME: &str = "input_pending_sees_bytes_a_mid_turn_enter_moved";
    if let Some((_serial, out)) = in_direct_child(NAME, input_pending_of_a_direct_stream) {
        assert_eq!(counter(&out, "direct_accepts"), 1, "{out}");
    }
}

/// The child of the test below: a stream accepted as a direct descriptor,
/// with its multishot receive armed by a first exchange, leaves the ring
/// with `into_std`; bytes the client sends after the move reach the std
/// stream, which answers them.
fn into_std_of_a_direct_stream() {
    use std::io::{Read, Write};
    let rt = uring_runtime(1);
    let listener = rt.block_on(async { TcpListener::bind("127.0.0.1:0").unwrap() });
    let mut client = StdStream::connect(listener.local_addr().unwrap()).unwrap();
    let client_addr = client.local_addr().unwrap();
    client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let moved = rt.block_on(async {
        let stream = listener.accept_stream().await.unwrap();
        client.write_all(b"before").unwrap();
        let (n, buf) = stream.read_owned(vec![0u8; 64]).await;
        assert_eq!(&buf[..n.unwrap()], b"before");
        stream.into_std().await.unwrap()
    });
    assert_eq!(moved.peer_addr().unwrap(), client_addr);
    client.write_all(b"after the move").unwrap();
    let mut moved = moved;
    moved.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = [0u8; 14];
    moved.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"after the move");
    moved.write_all(b"answered").unwrap();
    let mut answer = [0u8; 8];
    client.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"answered");
    drop(moved);
    assert_eq!(client.read(&mut answer).unwrap(), 0, "the moved stream's close reaches the client");
    print_direct_counters(&rt);
}

/// `into_std` on a stream accepted as a direct descriptor hands over a
/// plain descriptor (installed for it) that carries the connection on.
#[test]
fn a_direct_stream_leaves_the_ring_with_into_std() {
    one_direct_accept_one_install(
        "a_direct_stream_leaves_the_ring_with_into_std",
        into_std_of_a_direct_stream,
    );
}

/// The child of the test below: a server on two workers whose first is
/// kept busy hands new connections to the second (`Balance::Load`).
fn handed_to_another_worker() {
    use hotloop::net::{serve, Balance, ServerOptions};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let rt = uring_runtime(2);
    let options = ServerOptions { balance: Balance::Load, ..Default::default() };
    let server = serve(rt.handle(), "127.0.0.1:0", options, common::echo).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let busy = stop.clone();
    drop(rt.handle().spawn_on(0, move || async move {
        while !busy.load(Ordering::Relaxed) {
            let until = Instant::now() + Duration::from_micros(50);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            hotloop::yield_now().await;
        }
    }));
    thread::sleep(Duration::from_millis(50));
    for i in 0..40 {
        let mut c = StdStream::connect(server.local_addr()).unwrap();
        exchange(&mut c, format!("handed {i}").as_bytes(), 2);
    }
    stop.store(true, Ordering::Relaxed);
    let stats = rt.stats();
    let out: u64 = stats.workers.iter().map(|w| w.handoffs_out).sum();
    println!(
        "handoffs_out={out} direct_accepts={} installs={}",
        stats.total.direct_accepts, stats.total.direct_fd_installs
    );
    server.shutdown_blocking(Duration::from_secs(1));
}

/// A direct socket handed to another worker gets a plain descriptor to
/// travel with (its slot is only in the accepting worker's ring), and is
/// served there.
#[test]
fn a_direct_socket_handed_to_another_worker_is_served_there() {
    const NAME: &str = "a_direct_socket_handed_to_another_worker_is_served_there";
    let Some((_serial, out)) = in_direct_child(NAME, handed_to_another_worker) else {
        return;
    };
    let handed = counter(&out, "handoffs_out");
    assert!(handed > 0, "nothing was handed over: {out}");
    assert!(counter(&out, "direct_accepts") > 0, "{out}");
    // One each (and one for a connection the chosen worker refused, then
    // served here as a plain descriptor).
    let installs = counter(&out, "installs");
    assert!(installs >= handed && installs <= counter(&out, "direct_accepts"), "{out}");
}

/// The child of the test below: a direct stream dropped after `block_on`
/// returned (no worker turn to come) closes at once: its slot's close is
/// submitted by the drop itself.
fn direct_stream_dropped_off_turn() {
    use std::io::Read;
    let rt = uring_runtime(1);
    let (_listener, mut client, stream) = one_accepted(&rt);
    drop(stream);
    client.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut b = [0u8; 1];
    let n = client.read(&mut b).expect("the peer's end came within a second");
    assert_eq!(n, 0, "end of stream");
    print_direct_counters(&rt);
}

/// A direct stream dropped where its runtime is not running reaches its
/// peer's end as a plain one does: its slot is given back before the
/// drop's settle, which then submits the slot's close.
#[test]
fn a_direct_stream_dropped_off_turn_closes_at_once() {
    const NAME: &str = "a_direct_stream_dropped_off_turn_closes_at_once";
    if let Some((_serial, out)) = in_direct_child(NAME, direct_stream_dropped_off_turn) {
        assert_direct_counters(&out, 1, 0);
    }
}
