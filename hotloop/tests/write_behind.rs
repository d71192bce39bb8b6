//! A byte a stream reported written reaches the peer, or the peer sees the
//! connection fail (a reset), by the send deadline, whichever way the
//! stream ends: dropped on its worker while the runtime runs or idles, just
//! before `block_on` returns, after it returned, with its runtime, or shut
//! down for writing or in both directions; for owned and borrowed writes,
//! and for a peer that reads late, slowly or never.
//!
//! On io_uring a borrowed write (tokio's `AsyncWrite`) that finds the
//! socket full is written behind: the stream reports the bytes written
//! while they are still in user space. On epoll they are in the kernel's
//! socket buffer, which delivers them after the stream is gone: the epoll
//! variant of each test is the reference behaviour.
//!
//! Every test writes until the socket is full while its peers read
//! nothing, takes its way out, and then each peer reads as it was told.
//! What a peer got must be a prefix of what was written, and it must end
//! in one of two ways: everything, then the end of the stream; or a reset
//! (only for a peer that read nothing until the deadline had passed).
//! Never a clean end after fewer bytes (a silent cut), and never nothing
//! at all (a descriptor held open).

use std::cell::RefCell;
use std::io::{ErrorKind, Read};
use std::net::{Shutdown, SocketAddr};
use std::rc::Rc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hotloop::net::TcpStream;
use hotloop::time::{sleep, timeout};
use hotloop::{DriverKind, Runtime};
use tokio::io::AsyncWriteExt;

/// How long the io_uring driver keeps sending a stream's written-behind
/// bytes after the stream stopped waiting for them (`WRITE_LINGER`).
const SEND_DEADLINE: Duration = Duration::from_secs(5);
/// When a peer that reads late starts, after the writer is done.
const LATE: Duration = Duration::from_secs(1);
/// When a peer that never reads looks at what it got: after the deadline.
const NEVER: Duration = SEND_DEADLINE.saturating_add(Duration::from_millis(1_500));
/// By when every peer must have seen the end of its stream, after the
/// writer is done.
const PEER_DONE: Duration = Duration::from_secs(12);
/// A write that waits this long finds the socket (and the stream) full.
const FULL_AFTER: Duration = Duration::from_millis(50);
/// Bytes per write: as many as the io_uring driver writes behind at once.
const CHUNK: usize = 64 * 1024;
/// At most this many bytes are written per stream.
const TOTAL_MAX: usize = 1 << 20;
/// The socket buffers on both sides, kept small so the writer fills them
/// at once (the kernel doubles what it is given).
const SOCKET_BUF: usize = 4096;

/// How a peer reads.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Reader {
    /// Nothing until [`LATE`], then everything at once.
    Late,
    /// A little at a time, as soon as the writer is done.
    Slowly,
    /// Nothing until the send deadline has passed.
    Never,
}

/// How the stream writes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Style {
    /// tokio's `AsyncWrite` (written behind on io_uring).
    Borrowed,
    /// `write_owned` (in the kernel once it returns, on both drivers).
    Owned,
}

/// Every style with every reader.
const CASES: [(Style, Reader); 6] = [
    (Style::Borrowed, Reader::Never),
    (Style::Borrowed, Reader::Late),
    (Style::Borrowed, Reader::Slowly),
    (Style::Owned, Reader::Never),
    (Style::Owned, Reader::Late),
    (Style::Owned, Reader::Slowly),
];

/// The byte at `i` of every stream: a stream's bytes are checked in order.
fn byte(i: usize) -> u8 {
    (i % 251) as u8
}

/// How a peer's stream ended.
#[derive(Debug, PartialEq)]
enum End {
    /// A clean end of stream.
    Eof,
    /// `ECONNRESET`.
    Reset,
    /// Nothing more came, and no end, by [`PEER_DONE`].
    Hang,
}

/// One peer: a listener of its own, and a thread that accepts, waits for
/// the writer to be done, then reads as told.
struct Peer {
    case: (Style, Reader),
    addr: SocketAddr,
    done: mpsc::Sender<()>,
    thread: JoinHandle<(usize, End)>,
}

impl Peer {
    fn new(case: (Style, Reader)) -> Peer {
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        // Set before `listen`, so the accepted socket has it from the start.
        sock.set_recv_buffer_size(SOCKET_BUF).unwrap();
        sock.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into()).unwrap();
        sock.listen(8).unwrap();
        let listener = std::net::TcpListener::from(sock);
        let addr = listener.local_addr().unwrap();
        let (done, written) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            // The writer is done writing (or gone).
            let _ = written.recv_timeout(PEER_DONE);
            let start = Instant::now();
            match case.1 {
                Reader::Late => std::thread::sleep(LATE),
                Reader::Never => std::thread::sleep(NEVER),
                Reader::Slowly => {}
            }
            let mut got = 0;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let left = PEER_DONE.saturating_sub(start.elapsed());
                if left.is_zero() {
                    return (got, End::Hang);
                }
                s.set_read_timeout(Some(left)).unwrap();
                let want = if case.1 == Reader::Slowly { 2048 } else { buf.len() };
                match s.read(&mut buf[..want]) {
                    Ok(0) => return (got, End::Eof),
                    Ok(n) => {
                        for (i, b) in buf[..n].iter().enumerate() {
                            assert_eq!(
                                *b,
                                byte(got + i),
                                "{case:?}: byte {} out of order",
                                got + i
                            );
                        }
                        got += n;
                        if case.1 == Reader::Slowly {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::ConnectionReset => return (got, End::Reset),
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        return (got, End::Hang);
                    }
                    Err(e) => panic!("{case:?}: the peer's read failed: {e}"),
                }
            }
        });
        Peer { case, addr, done, thread }
    }

    /// Tells the peer the writer is done: its reading starts from now.
    fn start_reading(&self) {
        let _ = self.done.send(());
    }

    /// Checks what the peer got against the `written` bytes its stream
    /// reported written: `None` if it is right, else what is wrong.
    fn check(self, driver: DriverKind, written: usize) -> Option<String> {
        let (got, end) = self.thread.join().unwrap();
        let what =
            format!("{driver:?}, {:?} writes, a peer that reads {:?}", self.case.0, self.case.1);
        match end {
            _ if got > written => {
                Some(format!("{what}: the peer got {got} bytes, more than the {written} written"))
            }
            End::Eof if got < written => Some(format!(
                "{what}: a clean end after {got} of the {written} bytes reported written"
            )),
            End::Reset if self.case.1 != Reader::Never => Some(format!(
                "{what}: a reset after {got} of {written} bytes, although the peer read in time"
            )),
            End::Hang => Some(format!(
                "{what}: {got} of the {written} bytes reported written, then nothing and no end \
                 for {PEER_DONE:?}: the descriptor was held open"
            )),
            End::Eof | End::Reset => None,
        }
    }
}

/// Peers for every case.
fn peers() -> Vec<Peer> {
    CASES.iter().map(|&case| Peer::new(case)).collect()
}

/// Connects to `peer` with a small send buffer.
async fn connect(peer: &Peer) -> TcpStream {
    let s = TcpStream::connect(peer.addr).await.unwrap();
    s.set_send_buffer_size(SOCKET_BUF).unwrap();
    s
}

/// Writes numbered bytes in `style` until a write waits [`FULL_AFTER`]
/// (the peer reads nothing yet); returns how many the stream reported
/// written. A write that timed out took nothing: an owned write's future
/// dropped while it waits sends nothing, and a borrowed write that
/// returned `Pending` took nothing (the `AsyncWrite` contract).
async fn write_until_full(s: &mut TcpStream, style: Style) -> usize {
    let bytes: Vec<u8> = (0..TOTAL_MAX + CHUNK).map(byte).collect();
    let mut written = 0;
    while written < TOTAL_MAX {
        let chunk = &bytes[written..written + CHUNK];
        let n = match style {
            Style::Borrowed => match timeout(FULL_AFTER, AsyncWriteExt::write(s, chunk)).await {
                Ok(res) => res.unwrap(),
                Err(_) => break,
            },
            Style::Owned => match timeout(FULL_AFTER, s.write_owned(chunk.to_vec())).await {
                Ok((res, _)) => res.unwrap(),
                Err(_) => break,
            },
        };
        assert!(n > 0);
        written += n;
    }
    assert!(written < TOTAL_MAX, "the socket never filled");
    written
}

/// Connects to `peer`, fills the stream, and tells the peer it may read.
async fn fill(peer: &Peer) -> (TcpStream, usize) {
    let mut s = connect(peer).await;
    let written = write_until_full(&mut s, peer.case.0).await;
    peer.start_reading();
    (s, written)
}

/// Waits on the runtime (its timers keep running) until every peer is done.
async fn until_peers_done(peers: &[Peer]) {
    let start = Instant::now();
    while !peers.iter().all(|p| p.thread.is_finished()) && start.elapsed() < PEER_DONE * 2 {
        sleep(Duration::from_millis(20)).await;
    }
}

/// Checks every peer, and fails with everything that went wrong.
fn check_all(driver: DriverKind, peers: Vec<Peer>, written: Vec<usize>) {
    assert_eq!(peers.len(), written.len());
    let wrong: Vec<String> =
        peers.into_iter().zip(written).filter_map(|(peer, n)| peer.check(driver, n)).collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The CPU time the calling thread has used.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: passes a live timespec for the kernel to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Asserts that `f`, which may wait for peers up to the send deadline,
/// waits without spinning: its thread uses a small share of a core.
fn without_spinning<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let (cpu, wall) = (thread_cpu(), Instant::now());
    let out = f();
    let (cpu, wall) = (thread_cpu() - cpu, wall.elapsed());
    assert!(
        cpu < Duration::from_millis(500),
        "{what} used {cpu:?} of CPU in {wall:?}: it spins instead of waiting"
    );
    out
}

fn runtime(driver: DriverKind, workers: usize) -> Runtime {
    Runtime::builder().workers(workers).driver(driver).build().unwrap()
}

/// Dropped inside `block_on`, which goes on running (its timers) until
/// every peer is done.
#[hotloop::test(driver = "all")]
fn dropped_on_its_worker_while_the_runtime_runs(driver: DriverKind) {
    let rt = runtime(driver, 1);
    let peers = peers();
    let written = rt.block_on(async {
        let mut written = Vec::new();
        for peer in &peers {
            let (s, n) = fill(peer).await;
            drop(s);
            written.push(n);
        }
        until_peers_done(&peers).await;
        written
    });
    check_all(driver, peers, written);
}

/// Dropped by a task on a worker thread, which then has nothing to do.
#[hotloop::test(driver = "all")]
fn dropped_on_a_worker_thread_that_then_idles(driver: DriverKind) {
    let rt = runtime(driver, 1);
    let peers = peers();
    let written: Vec<usize> = peers
        .iter()
        .map(|peer| {
            let (addr, case, done) = (peer.addr, peer.case, peer.done.clone());
            rt.handle()
                .spawn_on(0, move || async move {
                    let mut s = TcpStream::connect(addr).await.unwrap();
                    s.set_send_buffer_size(SOCKET_BUF).unwrap();
                    let n = write_until_full(&mut s, case.0).await;
                    let _ = done.send(());
                    drop(s);
                    n
                })
                .join()
                .unwrap()
        })
        .collect();
    check_all(driver, peers, written);
    drop(rt);
}

/// Dropped at the end of `block_on`'s future: `block_on` returns, and the
/// runtime stays, idle, while the peers read.
#[hotloop::test(driver = "all")]
fn dropped_on_its_worker_just_before_block_on_returns(driver: DriverKind) {
    let rt = runtime(driver, 1);
    let peers = peers();
    let written = without_spinning("block_on's return", || {
        rt.block_on(async {
            let mut written = Vec::new();
            for peer in &peers {
                let (s, n) = fill(peer).await;
                drop(s);
                written.push(n);
            }
            written
        })
    });
    check_all(driver, peers, written);
    drop(rt);
}

/// Returned out of `block_on` and dropped there, with the runtime idle.
#[hotloop::test(driver = "all")]
fn dropped_after_block_on_returns(driver: DriverKind) {
    let rt = runtime(driver, 1);
    let peers = peers();
    let streams = rt.block_on(async {
        let mut streams = Vec::new();
        for peer in &peers {
            streams.push(fill(peer).await);
        }
        streams
    });
    let written: Vec<usize> = streams.iter().map(|(_, n)| *n).collect();
    // The peer that never reads comes first: its deadline runs from here.
    without_spinning("dropping streams off their runtime", || drop(streams));
    check_all(driver, peers, written);
    drop(rt);
}

/// Held by tasks, on a worker thread and on `block_on`'s thread, when the
/// runtime is dropped.
#[hotloop::test(driver = "all")]
fn dropped_with_its_runtime(driver: DriverKind) {
    let rt = runtime(driver, 1);
    let peers = peers();
    let (on_worker, on_main) = peers.split_at(CASES.len() / 2);
    let mut written = Vec::new();
    for peer in on_worker {
        let (addr, case, done) = (peer.addr, peer.case, peer.done.clone());
        let (tx, rx) = mpsc::channel();
        drop(rt.handle().spawn_on(0, move || async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.set_send_buffer_size(SOCKET_BUF).unwrap();
            let n = write_until_full(&mut s, case.0).await;
            let _ = done.send(());
            let _ = tx.send(n);
            // Holds the stream until the runtime drops the task.
            std::future::pending::<()>().await;
            drop(s);
        }));
        written.push(rx.recv().unwrap());
    }
    let filled = Rc::new(RefCell::new(Vec::new()));
    rt.block_on(async {
        for (i, peer) in on_main.iter().enumerate() {
            let (addr, case, done, counts) =
                (peer.addr, peer.case, peer.done.clone(), filled.clone());
            drop(hotloop::spawn(async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                s.set_send_buffer_size(SOCKET_BUF).unwrap();
                let n = write_until_full(&mut s, case.0).await;
                let _ = done.send(());
                counts.borrow_mut().push(n);
                std::future::pending::<()>().await;
                drop(s);
            }));
            // One at a time, so the counts come in the peers' order.
            while filled.borrow().len() <= i {
                sleep(Duration::from_millis(5)).await;
            }
        }
    });
    written.extend(filled.take());
    without_spinning("dropping the runtime", || drop(rt));
    check_all(driver, peers, written);
}

/// Shut down for writing (tokio's `shutdown` for borrowed writes,
/// `shutdown_with(Write)` for owned ones) within a bound, then dropped.
/// The shutdown flushes: where the peer never reads it cannot finish, so
/// the stream is dropped when the bound passes.
#[hotloop::test(driver = "all")]
fn shut_down_for_writing_then_dropped(driver: DriverKind) {
    let rt = runtime(driver, 1);
    let peers = peers();
    let written = rt.block_on(async {
        let mut written = Vec::new();
        for peer in &peers {
            let (mut s, n) = fill(peer).await;
            let bound = if peer.case.1 == Reader::Never { FULL_AFTER } else { LATE * 4 };
            let shut = match peer.case.0 {
                Style::Borrowed => timeout(bound, AsyncWriteExt::shutdown(&mut s)).await,
                Style::Owned => timeout(bound, s.shutdown_with(Shutdown::Write)).await,
            };
            if peer.case.1 != Reader::Never {
                shut.expect("the shutdown waited past its peer's reading").unwrap();
            }
            drop(s);
            written.push(n);
        }
        until_peers_done(&peers).await;
        written
    });
    check_all(driver, peers, written);
}

/// Shut down in both directions, which returns at once whatever the peer
/// does, and then kept (`keep`) until every peer is done, or dropped.
fn shut_down_in_both_directions(driver: DriverKind, keep: bool) {
    let rt = runtime(driver, 1);
    let peers = peers();
    let written = rt.block_on(async {
        let mut written = Vec::new();
        let mut kept = Vec::new();
        for peer in &peers {
            let (mut s, n) = fill(peer).await;
            timeout(Duration::from_secs(1), s.shutdown_with(Shutdown::Both))
                .await
                .expect("a shutdown of both directions waited for the peer")
                .unwrap();
            // The write side is shut: a write fails, at once or (written
            // behind on a busy io_uring worker) at its flush.
            let after = timeout(Duration::from_secs(1), async {
                AsyncWriteExt::write(&mut s, b"more").await?;
                AsyncWriteExt::flush(&mut s).await
            })
            .await
            .expect("a write after the shutdown waited");
            assert_eq!(after.unwrap_err().kind(), ErrorKind::BrokenPipe);
            if keep {
                kept.push(s);
            }
            written.push(n);
        }
        until_peers_done(&peers).await;
        drop(kept);
        written
    });
    check_all(driver, peers, written);
}

#[hotloop::test(driver = "all")]
fn shut_down_in_both_directions_then_kept(driver: DriverKind) {
    shut_down_in_both_directions(driver, true);
}

#[hotloop::test(driver = "all")]
fn shut_down_in_both_directions_then_dropped(driver: DriverKind) {
    shut_down_in_both_directions(driver, false);
}
