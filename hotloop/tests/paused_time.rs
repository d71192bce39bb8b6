//! Paused time: a long sleep ends in milliseconds of real time, `advance`
//! fires timers in deadline order, a timeout on I/O that never comes
//! fires, an interval ticks, and a server's idle timeout cuts a silent
//! connection at once in real time.

use crate::common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use hotloop::net::{TcpListener, TcpStream};
use hotloop::time::{
    advance, interval, interval_at, now, sleep, timeout, timeout_at, MissedTickBehavior,
};

/// The most real time a paused test may take for what it waits for.
const REAL_LIMIT: Duration = Duration::from_secs(5);

#[hotloop::test(driver = "all", start_paused = true)]
async fn a_sixty_second_sleep_ends_at_once() {
    let (real, virtual_start) = (Instant::now(), now());
    sleep(Duration::from_secs(60)).await;
    assert!(now() - virtual_start >= Duration::from_secs(60), "the paused clock moved 60 s");
    assert!(real.elapsed() < REAL_LIMIT, "took {:?} of real time", real.elapsed());
}

#[hotloop::test(driver = "all", start_paused = true)]
async fn advance_fires_timers_in_deadline_order() {
    let fired = Rc::new(RefCell::new(Vec::new()));
    for secs in [3u64, 1, 2] {
        let fired = fired.clone();
        hotloop::spawn(async move {
            sleep(Duration::from_secs(secs)).await;
            fired.borrow_mut().push(secs);
        });
    }
    hotloop::yield_now().await; // the sleeps are filed
    advance(Duration::from_millis(1500)).await;
    assert_eq!(*fired.borrow(), [1], "only the 1 s timer is due at 1.5 s");
    advance(Duration::from_millis(1000)).await;
    assert_eq!(*fired.borrow(), [1, 2]);
    advance(Duration::from_secs(10)).await;
    assert_eq!(*fired.borrow(), [1, 2, 3]);
}

#[hotloop::test(driver = "all", start_paused = true)]
async fn a_timeout_on_io_that_never_comes_fires() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (_server, _) = listener.accept().await.unwrap();
    let real = Instant::now();
    // The peer never writes: only the (paused) clock can end this.
    let read = timeout(Duration::from_secs(3600), client.read_owned(Vec::with_capacity(16))).await;
    assert!(read.is_err(), "the read cannot finish: nothing was sent");
    assert!(real.elapsed() < REAL_LIMIT, "took {:?} of real time", real.elapsed());
}

#[hotloop::test(driver = "all", start_paused = true)]
async fn an_interval_ticks_on_the_paused_clock() {
    let real = Instant::now();
    let start = now();
    let mut ticks = interval(Duration::from_secs(10));
    for _ in 0..7 {
        ticks.tick().await;
    }
    // The first tick is at once; six periods follow.
    assert_eq!(now() - start, Duration::from_secs(60));
    assert!(real.elapsed() < REAL_LIMIT, "took {:?} of real time", real.elapsed());
}

/// A server that drops a connection after 60 s without a byte, tested in
/// paused time: the client sees the close without waiting a minute.
#[hotloop::test(driver = "all", start_paused = true)]
async fn a_servers_idle_timeout_cuts_a_silent_connection_quickly() {
    const IDLE: Duration = Duration::from_secs(60);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = hotloop::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            hotloop::spawn(async move {
                let mut buf = Vec::with_capacity(64);
                loop {
                    match timeout(IDLE, stream.read_owned(buf)).await {
                        Ok((Ok(n), b)) if n > 0 => buf = b,
                        _ => return, // idle, closed or failed: the stream drops
                    }
                    buf.clear();
                }
            });
        }
    });
    let client = TcpStream::connect(addr).await.unwrap();
    let (real, start) = (Instant::now(), now());
    let (n, _) = client.read_owned(Vec::with_capacity(16)).await;
    assert_eq!(n.unwrap(), 0, "the server closed the silent connection");
    assert!(now() - start >= IDLE, "closed after {:?} of paused time", now() - start);
    assert!(real.elapsed() < REAL_LIMIT, "took {:?} of real time", real.elapsed());
    server.abort();
}

/// `resume` lets the clock run again from where it stood: it never goes back.
#[hotloop::test(driver = "all", start_paused = true)]
async fn resume_runs_on_from_the_paused_time() {
    let start = now();
    advance(Duration::from_secs(3600)).await;
    hotloop::time::resume();
    sleep(Duration::from_millis(5)).await;
    assert!(now() - start >= Duration::from_secs(3600));
    let real = Instant::now();
    sleep(Duration::from_millis(20)).await;
    assert!(real.elapsed() >= Duration::from_millis(20), "a running clock waits in real time");
}

/// Ticks of a 10 s interval after the clock jumped 35 s past its first
/// tick, under each [`MissedTickBehavior`]: the late tick comes at once,
/// then `Burst` delivers the missed ones at once, `Delay` restarts the
/// schedule from the late tick, and `Skip` goes on with the original
/// schedule's next tick.
#[hotloop::test(driver = "all", start_paused = true)]
async fn missed_ticks_burst_delay_or_skip() {
    let period = Duration::from_secs(10);
    for behavior in [MissedTickBehavior::Burst, MissedTickBehavior::Delay, MissedTickBehavior::Skip]
    {
        let mut ticks = interval(period);
        assert_eq!(ticks.missed_tick_behavior(), MissedTickBehavior::Delay, "the default");
        ticks.set_missed_tick_behavior(behavior);
        let t0 = ticks.tick().await;
        advance(Duration::from_secs(35)).await;
        let late = now();
        assert_eq!(ticks.tick().await, t0 + period, "{behavior:?}: the late tick");
        assert_eq!(now(), late, "{behavior:?}: the late tick came at once");
        match behavior {
            MissedTickBehavior::Burst => {
                for k in [2u32, 3] {
                    assert_eq!(ticks.tick().await, t0 + period * k, "a missed tick");
                    assert_eq!(now(), late, "a missed tick comes at once");
                }
                assert_eq!(ticks.tick().await, t0 + period * 4, "back on schedule");
                assert!(now() >= t0 + period * 4);
            }
            MissedTickBehavior::Delay => {
                let next = ticks.tick().await;
                assert_eq!(next, late + period, "a period after the late tick");
                assert!(now() >= next);
                assert_eq!(ticks.tick().await, next + period);
            }
            MissedTickBehavior::Skip => {
                assert_eq!(ticks.tick().await, t0 + period * 4, "the schedule's next tick");
                assert_eq!(ticks.tick().await, t0 + period * 5);
            }
        }
    }
}

/// `interval_at` starts at its instant; `reset`, `reset_after`,
/// `reset_at` and `reset_immediately` move the next tick, and the ticks
/// after it follow the new schedule.
#[hotloop::test(driver = "all", start_paused = true)]
async fn an_interval_starts_at_its_instant_and_resets() {
    let period = Duration::from_secs(10);
    let start = now() + Duration::from_secs(3);
    let mut ticks = interval_at(start, period);
    assert_eq!(ticks.tick().await, start);
    assert!(now() >= start);
    assert_eq!(ticks.tick().await, start + period);

    let from = now();
    ticks.reset();
    assert_eq!(ticks.tick().await, from + period, "reset: a period from now");
    let from = now();
    ticks.reset_after(Duration::from_secs(4));
    let at = ticks.tick().await;
    assert_eq!(at, from + Duration::from_secs(4), "reset_after");
    assert_eq!(ticks.tick().await, at + period, "then every period");
    let target = now() + Duration::from_secs(25);
    ticks.reset_at(target);
    assert_eq!(ticks.tick().await, target, "reset_at");
    let before = now();
    ticks.reset_immediately();
    assert_eq!(ticks.tick().await, before, "reset_immediately");
    assert_eq!(now(), before, "at once");
    assert_eq!(ticks.tick().await, before + period);
}

/// `Timeout` is a nameable future, as tokio's: it hands its future back
/// (`get_ref`, `get_mut`, `into_inner`), knows its deadline, and prefers
/// an output that is ready when the deadline has passed too.
#[hotloop::test(driver = "all", start_paused = true)]
async fn a_timeout_is_a_future_that_hands_its_future_back() {
    let due = now() + Duration::from_secs(30);
    let mut limited: hotloop::time::Timeout<_> = timeout_at(due, std::future::ready(7));
    assert_eq!(limited.deadline(), due);
    let inner: &std::future::Ready<i32> = limited.get_ref();
    std::hint::black_box(inner);
    let inner: &mut std::future::Ready<i32> = limited.get_mut();
    std::hint::black_box(inner);
    advance(Duration::from_secs(60)).await;
    assert_eq!(limited.await, Ok(7), "ready at the deadline: the output wins");

    let short = sleep(Duration::from_secs(10));
    assert!(!short.is_elapsed());
    advance(Duration::from_secs(10)).await;
    assert!(short.is_elapsed(), "the paused clock passed the deadline");

    // The deadline counts from the call, as tokio's does, not from the
    // first poll.
    let made_early = timeout(Duration::from_secs(10), std::future::pending::<()>());
    advance(Duration::from_secs(20)).await;
    let before = now();
    assert!(made_early.await.is_err());
    assert_eq!(now(), before, "the deadline had passed already");

    let held = timeout(Duration::from_secs(5), sleep(Duration::from_secs(3600)));
    let inner = held.into_inner();
    assert!(inner.deadline() > now() + Duration::from_secs(3000), "the inner sleep, whole");
    assert!(timeout(Duration::from_secs(5), inner).await.is_err());
}

/// A file operation that waits in real time holds the paused clock, on
/// both drivers, as a file operation on tokio's blocking pool holds
/// tokio's: reads of a FIFO that is fed 50 ms later, each under an hour's
/// timeout, get their bytes instead of timing out, and the clock does not
/// move. On epoll the reads are blocking-pool jobs; on io_uring they are
/// ring operations, which hold the clock while they run.
#[hotloop::test(driver = "all", start_paused = true)]
async fn a_file_read_waiting_in_real_time_holds_the_paused_clock() {
    // A directory per run: the epoll and io_uring variants run side by
    // side in this process, and each removes its own FIFO.
    let dir = common::TempDir::new("paused-fifo");
    let path = dir.join("fifo");
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo reads one NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo");
    // Opened for reading and writing, the writer's end opens at once and
    // keeps the FIFO from reading as ended before the bytes come.
    let mut writer = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let feeder = std::thread::spawn(move || {
        use std::io::Write;
        for word in [b"ping", b"pong"] {
            std::thread::sleep(Duration::from_millis(50));
            writer.write_all(word).unwrap();
        }
        // Kept open until the reads are done, so they never see the end.
        std::thread::sleep(Duration::from_millis(200));
    });
    let file = hotloop::fs::File::open(&path).await.unwrap();
    let (real, start) = (Instant::now(), now());
    for word in [b"ping", b"pong"] {
        let read =
            timeout(Duration::from_secs(3600), file.read_at(Vec::with_capacity(16), 0)).await;
        let (res, buf) = read.expect("the read timed out: the paused clock jumped past it");
        assert_eq!(res.unwrap(), 4);
        assert_eq!(&buf, word);
    }
    assert_eq!(now(), start, "the paused clock moved while the reads waited");
    assert!(real.elapsed() >= Duration::from_millis(90), "the reads waited for the feeder");
    assert!(real.elapsed() < REAL_LIMIT, "took {:?} of real time", real.elapsed());
    feeder.join().unwrap();
}

/// A blocking-pool job holds the paused clock until its result has reached
/// the task: none of many quick jobs, each under an hour's timeout, lets
/// the clock jump (were a job counted as ended before its result was sent,
/// a worker that looked in between would find nothing in flight and
/// nothing in its inbox, and jump).
#[hotloop::test(driver = "all", start_paused = true)]
async fn a_blocking_job_holds_the_paused_clock_until_its_result_is_in() {
    let start = now();
    for i in 0..3000u32 {
        let job = timeout(Duration::from_secs(3600), hotloop::spawn_blocking(move || i)).await;
        assert_eq!(job.expect("the job's timeout fired").unwrap(), i);
        assert_eq!(now(), start, "the paused clock jumped while job {i} was out");
    }
}

/// A host-name lookup runs on the blocking pool, so it holds the paused
/// clock as any job there does: a resolver that takes 50 ms of real time
/// answers inside an hour's timeout.
#[cfg(feature = "test-util")]
#[hotloop::test(driver = "all", start_paused = true)]
async fn a_host_name_lookup_holds_the_paused_clock() {
    fn slow_resolver(_host: &str, port: u16) -> std::io::Result<Vec<std::net::SocketAddr>> {
        std::thread::sleep(Duration::from_millis(50));
        Ok(vec![std::net::SocketAddr::from(([127, 0, 0, 1], port))])
    }
    hotloop::net::set_resolver(Some(slow_resolver));
    let start = now();
    let found = timeout(Duration::from_secs(3600), hotloop::net::lookup_host("slow.invalid:80"))
        .await
        .expect("the lookup timed out: the paused clock jumped past it");
    hotloop::net::set_resolver(None);
    assert_eq!(
        found.unwrap().collect::<Vec<_>>(),
        [std::net::SocketAddr::from(([127, 0, 0, 1], 80))]
    );
    assert_eq!(now(), start, "the paused clock moved while the lookup ran");
}

/// A child's exit is I/O (its pidfd, watched by the driver), and I/O does
/// not hold the paused clock, as in tokio: waiting for a child that runs
/// for seconds under an hour's timeout times out at once.
#[hotloop::test(driver = "all", start_paused = true)]
async fn a_child_wait_does_not_hold_the_paused_clock() {
    let mut child = hotloop::process::Command::new("sleep").arg("30").spawn().unwrap();
    let (real, start) = (Instant::now(), now());
    let waited = timeout(Duration::from_secs(3600), child.wait()).await;
    assert!(waited.is_err(), "the child cannot have ended: {waited:?}");
    assert_eq!(now() - start, Duration::from_secs(3600), "the clock jumped to the deadline");
    assert!(real.elapsed() < REAL_LIMIT, "took {:?} of real time", real.elapsed());
    child.kill().await.unwrap();
}

/// Runs `body` on a fresh runtime with a paused clock, on a thread of its
/// own, and fails if it has not returned within [`REAL_LIMIT`] (a hung
/// worker then fails the test instead of hanging it).
fn within_limit<F, Fut>(driver: hotloop::DriverKind, workers: usize, body: F)
where
    F: FnOnce(hotloop::Handle) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = hotloop::Runtime::builder().workers(workers).driver(driver).build().unwrap();
        let handle = rt.handle().clone();
        rt.block_on(async move {
            hotloop::time::pause();
            body(handle).await;
        });
        let _ = done_tx.send(());
    });
    done_rx.recv_timeout(REAL_LIMIT).expect("the paused clock never moved on: the worker hung");
}

/// An advance as far as the clock goes (`Duration::MAX`) stops at the
/// clock's end, where every deadline is due: the timers filed before it
/// fire, and sleeps made after it complete at once, as does a sleep to an
/// instant past the end on a clock that jumps there. (The clock used to
/// saturate past the last tick it could reach, and the paused worker spun
/// for good on a timer it could never fire.)
#[hotloop::test(driver = "all")]
fn an_advance_to_the_end_of_the_clock_leaves_every_timer_due(driver: hotloop::DriverKind) {
    const MILLENNIUM: Duration = Duration::from_secs(86_400 * 365 * 1000);
    within_limit(driver, 1, |_| async {
        let filed = hotloop::spawn(sleep(Duration::from_secs(3600)));
        hotloop::yield_now().await; // the sleep is filed
        advance(Duration::MAX).await;
        assert!(filed.is_finished(), "the timer filed before the advance fired");
        let end = now();
        sleep(Duration::from_secs(1)).await;
        sleep(Duration::MAX).await;
        hotloop::time::sleep_until(end + MILLENNIUM).await;
        advance(Duration::MAX).await;
        assert_eq!(now(), end, "the clock stays at its end");
    });
    within_limit(driver, 1, |_| async {
        hotloop::time::sleep_until(now() + MILLENNIUM).await;
    });
}

/// A blocking job whose handle was dropped holds the paused clock while it
/// runs; when it ends, nothing reaches the worker through its inbox (no
/// task awaits the result), yet the clock moves on again: the pool wakes
/// the worker that waits for it.
#[hotloop::test(driver = "all")]
fn a_dropped_blocking_job_releases_the_paused_clock_when_it_ends(driver: hotloop::DriverKind) {
    within_limit(driver, 1, |_| async {
        drop(hotloop::spawn_blocking(|| std::thread::sleep(Duration::from_millis(50))));
        let start = now();
        sleep(Duration::from_secs(60)).await;
        assert!(now() - start >= Duration::from_secs(60));
    });
}

/// The same for a job that another worker's task awaits (its result wakes
/// that worker, not the paused one), and for one queued through a
/// `Handle` from a thread outside the runtime.
#[hotloop::test(driver = "all")]
fn a_job_awaited_elsewhere_releases_the_paused_clock_when_it_ends(driver: hotloop::DriverKind) {
    within_limit(driver, 2, |handle| async move {
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let elsewhere = handle.spawn_on(0, move || async move {
            hotloop::spawn_blocking(move || {
                started_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(50));
            })
            .await
        });
        // Out before the sleep below, so the sleep meets it.
        started_rx.recv_timeout(REAL_LIMIT).expect("the job started");
        sleep(Duration::from_secs(60)).await;
        elsewhere.await.unwrap().unwrap();
    });
    within_limit(driver, 1, |handle| async move {
        std::thread::spawn(move || {
            drop(handle.spawn_blocking(|| std::thread::sleep(Duration::from_millis(50))));
        })
        .join()
        .unwrap();
        sleep(Duration::from_secs(60)).await;
    });
}
