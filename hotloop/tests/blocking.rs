//! `spawn_blocking`: results and panics come back to the awaiting task, the
//! worker keeps running meanwhile, the pool is bounded and shrinks when
//! idle, shutdown cancels queued jobs and waits (bounded) for running
//! ones, and the counters show it all.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hotloop::time::{sleep, timeout};
use hotloop::{spawn, spawn_blocking, DriverKind, Handle, JoinError, Runtime};

#[hotloop::test(driver = "all")]
async fn result_comes_back_and_the_worker_keeps_running() {
    let worker_thread = std::thread::current().id();
    let ticker = spawn(async {
        let mut ticks = 0u32;
        while ticks < 1_000 {
            sleep(Duration::from_millis(5)).await;
            ticks += 1;
        }
    });
    let start = Instant::now();
    let (thread, name) = timeout(
        Duration::from_secs(10),
        spawn_blocking(|| {
            std::thread::sleep(Duration::from_millis(300));
            (std::thread::current().id(), std::thread::current().name().map(str::to_owned))
        }),
    )
    .await
    .expect("in time")
    .expect("no panic");
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert_ne!(thread, worker_thread, "the job ran on a pool thread");
    assert_eq!(name.as_deref(), Some("hotloop-blocking"));
    // The worker fired timers while the job slept.
    let fired = Handle::current().stats().total.timers_fired;
    assert!(fired >= 20, "only {fired} timers fired during a 300 ms blocking job");
    ticker.abort();
}

#[hotloop::test(driver = "all")]
async fn a_panic_is_a_join_error() {
    let err = spawn_blocking(|| -> u32 { panic!("blocking job failed") }).await.unwrap_err();
    assert!(err.is_panic());
    // The pool survives it.
    assert_eq!(spawn_blocking(|| 5).await.unwrap(), 5);
}

#[test]
fn the_pool_is_bounded_and_shrinks_when_idle() {
    let rt = Runtime::builder()
        .workers(1)
        .max_blocking_threads(2)
        .blocking_keep_alive(Duration::from_millis(100))
        .build()
        .unwrap();
    let start = Instant::now();
    let handles: Vec<_> = (0..6)
        .map(|i| {
            rt.handle().spawn_blocking(move || {
                std::thread::sleep(Duration::from_millis(100));
                i
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(30));
    let busy = rt.stats().blocking;
    assert_eq!(busy.threads, 2, "{busy:?}");
    assert_eq!(busy.running, 2, "{busy:?}");
    assert_eq!(busy.queued, 4, "{busy:?}");
    assert_eq!(busy.threads_max, 2);
    let outputs: Vec<i32> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(outputs, vec![0, 1, 2, 3, 4, 5]);
    assert!(start.elapsed() >= Duration::from_millis(300), "two threads ran six 100 ms jobs");
    let done = rt.stats().blocking;
    assert_eq!((done.queued, done.running, done.completed), (0, 0, 6), "{done:?}");
    assert_eq!(done.threads_started, 2, "{done:?}");

    // Idle threads exit after the keep-alive.
    let deadline = Instant::now() + Duration::from_secs(5);
    while rt.stats().blocking.threads > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(rt.stats().blocking.threads, 0);
    // And start again when work comes.
    assert_eq!(rt.handle().spawn_blocking(|| 9).join().unwrap(), 9);
    assert!(rt.stats().to_json().contains("\"blocking_completed\":7,"));
    assert!(rt.stats().to_prometheus().contains("hotloop_blocking_threads_started_total 3"));
}

#[test]
fn shutdown_cancels_queued_jobs() {
    let rt = Runtime::builder().workers(1).max_blocking_threads(1).build().unwrap();
    let running = rt.handle().spawn_blocking(|| std::thread::sleep(Duration::from_millis(300)));
    let queued = rt.handle().spawn_blocking(|| 1);
    std::thread::sleep(Duration::from_millis(50));
    drop(rt);
    assert!(matches!(queued.join(), Err(JoinError::Cancelled)));
    assert!(running.is_finished(), "the drop waited for the running job");
    running.join().expect("a running job finishes on its thread");
}

/// A file a running blocking job writes is written when the runtime is
/// dropped with `main` (the job's handle dropped long before), as with
/// tokio: the drop waits for the jobs already running.
#[hotloop::test(driver = "all")]
fn dropping_the_runtime_waits_for_a_running_job(driver: DriverKind) {
    // Made before the runtime, so dropped after it: a failing test's
    // runtime still waits for the job before the directory goes.
    let dir = common::TempDir::new("blocking");
    let marker = dir.join("marker");
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    rt.block_on(async {
        let started = Arc::new(AtomicBool::new(false));
        let job = spawn_blocking({
            let (started, marker) = (started.clone(), marker.clone());
            move || {
                started.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(300));
                std::fs::write(marker, b"done").unwrap();
            }
        });
        drop(job);
        // Started, not queued: a queued job is cancelled by the drop.
        timeout(Duration::from_secs(10), async {
            while !started.load(Ordering::SeqCst) {
                sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the job started");
    });
    drop(rt);
    let written = std::fs::read(&marker);
    assert_eq!(written.expect("the job's file was not written").as_slice(), b"done");
}

/// The wait is bounded: by `Builder::blocking_shutdown_timeout` for a
/// drop or `shutdown`, by `shutdown_timeout`'s argument, and not at all
/// with `shutdown_background`.
#[hotloop::test(driver = "all")]
fn the_wait_for_running_jobs_is_bounded(driver: DriverKind) {
    const BOUND: Duration = Duration::from_millis(200);
    // A job that sleeps for 10 s unless told to end.
    let stuck = |rt: &Runtime| {
        let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        drop(rt.handle().spawn_blocking(move || {
            started_tx.send(()).unwrap();
            let _ = end_rx.recv_timeout(Duration::from_secs(10));
        }));
        started_rx.recv_timeout(Duration::from_secs(10)).expect("the job started");
        end_tx
    };
    let build = || {
        Runtime::builder()
            .workers(1)
            .driver(driver)
            .blocking_shutdown_timeout(BOUND)
            .build()
            .unwrap()
    };
    let timed = |stop: &dyn Fn(Runtime), rt: Runtime| {
        let start = Instant::now();
        stop(rt);
        start.elapsed()
    };

    let rt = build();
    let end = stuck(&rt);
    let took = timed(&drop, rt);
    assert!(took >= BOUND && took < BOUND * 5, "the drop took {took:?}");
    drop(end);

    let rt = build();
    let end = stuck(&rt);
    let took = timed(&|rt: Runtime| rt.shutdown_timeout(Duration::from_millis(50)), rt);
    assert!(took >= Duration::from_millis(50) && took < BOUND, "shutdown_timeout took {took:?}");
    drop(end);

    let rt = build();
    let end = stuck(&rt);
    let took = timed(&Runtime::shutdown_background, rt);
    assert!(took < Duration::from_millis(50), "shutdown_background took {took:?}");
    drop(end);

    // Dropped by a task of another runtime: that task's worker is not held
    // for the job (its other tasks would stall), whatever the bound.
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let end = stuck(&rt);
    let outer = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let took = outer.block_on(async move {
        let start = Instant::now();
        drop(rt);
        start.elapsed()
    });
    assert!(took < Duration::from_secs(1), "the drop in a task took {took:?}");
    drop(end);
}

/// A job whose result panics when dropped, its handle dropped first (so
/// the pool thread drops the result), takes neither the thread's place in
/// the pool nor the running count with it: the next job runs with one
/// thread allowed, and dropping the runtime does not wait its shutdown
/// bound for a job long gone.
#[hotloop::test(driver = "all")]
fn a_result_that_panics_when_dropped_leaves_the_pool_working(driver: DriverKind) {
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("a blocking job's result panicked when dropped");
        }
    }
    let rt = Runtime::builder().workers(1).driver(driver).max_blocking_threads(1).build().unwrap();
    let next = rt.block_on(async {
        let (dropped_tx, dropped_rx) = std::sync::mpsc::channel::<()>();
        // The job returns only once its handle is gone: the result's last
        // holder is then the pool thread.
        drop(spawn_blocking(move || {
            let _ = dropped_rx.recv();
            Bomb
        }));
        dropped_tx.send(()).unwrap();
        timeout(Duration::from_secs(1), spawn_blocking(|| 1)).await
    });
    assert_eq!(next.expect("the next job did not run within 1 s").unwrap(), 1);
    let start = Instant::now();
    drop(rt);
    assert!(start.elapsed() < Duration::from_secs(1), "the drop took {:?}", start.elapsed());
}

#[test]
fn handle_spawn_blocking_from_any_thread() {
    let rt = Runtime::builder().workers(1).build().unwrap();
    let handle = rt.handle().clone();
    let out =
        std::thread::spawn(move || handle.spawn_blocking(|| 2 + 2).join().unwrap()).join().unwrap();
    assert_eq!(out, 4);
}
