//! The cooperative budget: a task whose I/O never has to wait (a peer
//! that floods its connection, a peer that reads as fast as the task
//! writes) still gives way, so the other tasks of its worker run and
//! their timers fire; `task::unconstrained` lifts the budget.

use std::future::Future;
use std::io::{Read, Write};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hotloop::net::{TcpListener, TcpStream};
use hotloop::spawn;
use hotloop::time::{interval, timeout};

/// Ticks the ticker waits for, one period apart.
const TICKS: u32 = 50;
const PERIOD: Duration = Duration::from_millis(5);
/// The longest gap between two ticks the busy task may cause: with the
/// budget it is a few loop turns of its work, tens of milliseconds (the
/// bound leaves room for a loaded machine); without, the whole transfer,
/// until the peer gives up.
const GAP_MAX: Duration = Duration::from_secs(1);
/// How long a peer floods or drains before it gives up on its own.
const PEER_LIMIT: Duration = Duration::from_secs(15);
/// The peer's writes and reads.
const PEER_CHUNK: usize = 1 << 20;
/// The task's reads and writes: many per turn of a loop that never waits.
const TASK_CHUNK: usize = 4096;
/// CPU time the task spends on each chunk: it is slower than its peer,
/// so every read finds the socket full and every write finds room.
const WORK_PER_CHUNK: Duration = Duration::from_micros(100);
/// The socket buffers asked for on both ends of a flooded connection
/// (the kernel caps them at `net.core.rmem_max` and `wmem_max`), and the
/// time the flooding peer gets to fill them before the task reads: what
/// it holds lasts the task a while even when a loaded machine leaves the
/// peer's thread waiting for a CPU.
const FLOOD_BUFFER: usize = 8 << 20;
const FLOOD_FILL: Duration = Duration::from_millis(200);

/// What the task does with a chunk: [`WORK_PER_CHUNK`] of CPU.
fn work() {
    let start = Instant::now();
    while start.elapsed() < WORK_PER_CHUNK {
        std::hint::spin_loop();
    }
}

/// A peer thread; told to stop when dropped (it also stops when the
/// connection fails, or after [`PEER_LIMIT`]).
struct Peer {
    stop: Arc<AtomicBool>,
    /// Set when the peer ran out its time: the task never let the worker
    /// go for as long (the peer's end then ended the task's loop).
    ran_out: Arc<AtomicBool>,
}

impl Peer {
    /// Fails if the peer ran out its time: what was measured beside the
    /// task came only once the peer stopped, not while it flooded or drained.
    fn assert_busy(&self) {
        assert!(!self.ran_out.load(Ordering::SeqCst), "the ticks came only after the peer gave up");
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Runs `each` (a blocking write or read of one chunk) on `stream` until
/// it fails, the test is done, or [`PEER_LIMIT`] passes.
fn peer(
    mut stream: std::net::TcpStream,
    mut each: impl FnMut(&mut std::net::TcpStream) -> bool + Send + 'static,
) -> Peer {
    let (stop, ran_out) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let (stopped, running_out) = (stop.clone(), ran_out.clone());
    std::thread::spawn(move || {
        let start = Instant::now();
        while !stopped.load(Ordering::SeqCst) && each(&mut stream) {
            if start.elapsed() >= PEER_LIMIT {
                running_out.store(true, Ordering::SeqCst);
                return;
            }
        }
    });
    Peer { stop, ran_out }
}

/// A peer that writes 1 MiB at a time, as fast as the task takes it.
fn flooding(stream: std::net::TcpStream) -> Peer {
    socket2::SockRef::from(&stream).set_send_buffer_size(FLOOD_BUFFER).unwrap();
    let chunk = vec![7u8; PEER_CHUNK];
    peer(stream, move |s| s.write_all(&chunk).is_ok())
}

/// A peer that reads 1 MiB at a time, as fast as the task writes.
fn draining(stream: std::net::TcpStream) -> Peer {
    let mut buf = vec![0u8; PEER_CHUNK];
    peer(stream, move |s| s.read(&mut buf).is_ok_and(|n| n > 0))
}

/// A connection to a flooding peer: the peer's end and the task's, with
/// the buffers between them full.
async fn flooded() -> (Peer, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (stream, _) = listener.accept().await.unwrap();
    stream.set_recv_buffer_size(FLOOD_BUFFER).unwrap();
    let peer = flooding(client);
    hotloop::time::sleep(FLOOD_FILL).await;
    (peer, stream)
}

/// A connection to a draining peer: the peer's end and the task's.
async fn drained() -> (Peer, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (stream, _) = listener.accept().await.unwrap();
    (draining(client), stream)
}

/// Spawns `busy` on this worker and, beside it, waits for [`TICKS`] ticks
/// of a [`PERIOD`] interval; returns the longest gap between two ticks.
async fn longest_gap_beside(busy: impl Future<Output = ()> + 'static) -> Duration {
    let busy = spawn(busy);
    let mut ticks = interval(PERIOD);
    ticks.tick().await;
    let mut last = Instant::now();
    let mut longest = Duration::ZERO;
    for _ in 0..TICKS {
        ticks.tick().await;
        let now = Instant::now();
        longest = longest.max(now - last);
        last = now;
    }
    busy.abort();
    longest
}

/// Reads [`TASK_CHUNK`] bytes at a time until the peer stops.
async fn read_owned_forever(stream: TcpStream) {
    let mut buf = Vec::with_capacity(TASK_CHUNK);
    loop {
        let (res, b) = stream.read_owned(buf).await;
        buf = b;
        if !matches!(res, Ok(n) if n > 0) {
            return;
        }
        work();
    }
}

#[hotloop::test(driver = "all")]
async fn owned_reads_of_a_flooded_connection_let_the_worker_run() {
    let (peer, stream) = flooded().await;
    let gap = longest_gap_beside(read_owned_forever(stream)).await;
    peer.assert_busy();
    assert!(gap < GAP_MAX, "the ticker waited {gap:?} beside a flooded read");
}

#[hotloop::test(driver = "all")]
async fn pooled_reads_of_a_flooded_connection_let_the_worker_run() {
    let (peer, stream) = flooded().await;
    let gap = longest_gap_beside(async move {
        while stream.read_pooled().await.is_ok_and(|b| !b.is_empty()) {
            work();
        }
    })
    .await;
    peer.assert_busy();
    assert!(gap < GAP_MAX, "the ticker waited {gap:?} beside flooded pooled reads");
}

#[hotloop::test(driver = "all")]
async fn writes_to_a_draining_peer_let_the_worker_run() {
    let (peer, stream) = drained().await;
    let gap = longest_gap_beside(async move {
        let mut chunk = vec![1u8; TASK_CHUNK];
        loop {
            let (res, b) = stream.write_all_owned(chunk).await;
            chunk = b;
            if res.is_err() {
                return;
            }
            work();
        }
    })
    .await;
    peer.assert_busy();
    assert!(gap < GAP_MAX, "the ticker waited {gap:?} beside writes to a fast reader");
}

/// The timeout's own deadline is not charged: a read loop that spends
/// its budget on every poll still times out.
#[hotloop::test(driver = "all")]
async fn a_timeout_around_a_flooded_read_fires() {
    let (peer, stream) = flooded().await;
    let res = timeout(Duration::from_millis(50), read_owned_forever(stream)).await;
    assert!(res.is_err(), "the reads ended before the timeout: the peer stopped");
    peer.assert_busy();
}

/// On io_uring without the multishot receive, reads go straight to
/// `recv(2)`, as on epoll: the owned-read test again, in a child process
/// with that receive switched off.
#[test]
fn owned_reads_without_the_multishot_receive_let_the_worker_run() {
    if crate::common::skip_uring() {
        return;
    }
    let test = "coop::owned_reads_of_a_flooded_connection_let_the_worker_run::uring";
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("HOTLOOP_URING_MULTISHOT_RECV", "0")
        .output()
        .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child failed:\n{text}");
    assert!(text.contains("1 passed"), "the child test did not run:\n{text}");
}

/// Counts the polls of the future it wraps.
struct Polls<F> {
    inner: Pin<Box<F>>,
    polls: u32,
}

impl<F: Future> Future for Polls<F> {
    type Output = (F::Output, u32);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.polls += 1;
        let polls = self.polls;
        self.inner.as_mut().poll(cx).map(|out| (out, polls))
    }
}

/// Bytes a peer sends at once; read one at a time, they take more polls
/// than one budget allows.
const SENT: usize = 300;

/// Reads [`SENT`] bytes one at a time, all there before the first read;
/// returns them and the polls the reads took.
async fn read_bytes_singly(unconstrained: bool) -> (Vec<u8>, u32) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let sent: Vec<u8> = (0..SENT).map(|i| (i % 251) as u8).collect();
    client.write_all(&sent).unwrap();
    let (stream, _) = listener.accept().await.unwrap();
    let reads = async move {
        let mut got = Vec::with_capacity(SENT);
        while got.len() < SENT {
            let (res, b) = stream.read_owned(Vec::with_capacity(1)).await;
            assert_eq!(res.unwrap(), 1);
            got.extend_from_slice(&b);
        }
        got
    };
    let (got, polls) = if unconstrained {
        Polls { inner: Box::pin(hotloop::task::unconstrained(reads)), polls: 0 }.await
    } else {
        Polls { inner: Box::pin(reads), polls: 0 }.await
    };
    drop(client);
    assert_eq!(got, sent, "a read the budget stopped lost or took bytes");
    (got, polls)
}

/// A read loop that never waits gives way at least every 128 reads, and
/// loses no byte when it does; `unconstrained` lets it run on.
#[hotloop::test(driver = "all")]
async fn the_budget_stops_a_read_loop_without_losing_bytes_and_unconstrained_lifts_it() {
    let (_, budgeted) = read_bytes_singly(false).await;
    assert!(budgeted >= 3, "{SENT} reads took {budgeted} polls");
    let (_, free) = read_bytes_singly(true).await;
    assert!(free <= 2, "{SENT} unconstrained reads took {free} polls");
}
