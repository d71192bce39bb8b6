//! `spawn_blocking`: results and panics come back to the awaiting task, the
//! worker keeps running meanwhile, the pool is bounded and shrinks when
//! idle, shutdown cancels queued jobs, and the counters show it all.

use std::time::{Duration, Instant};

use hotloop::time::{sleep, timeout};
use hotloop::{spawn, spawn_blocking, Handle, JoinError, Runtime};

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
    let start = Instant::now();
    drop(rt);
    assert!(start.elapsed() < Duration::from_millis(250), "shutdown does not wait for jobs");
    assert!(matches!(queued.join(), Err(JoinError::Cancelled)));
    running.join().expect("a running job finishes on its thread");
}

#[test]
fn handle_spawn_blocking_from_any_thread() {
    let rt = Runtime::builder().workers(1).build().unwrap();
    let handle = rt.handle().clone();
    let out =
        std::thread::spawn(move || handle.spawn_blocking(|| 2 + 2).join().unwrap()).join().unwrap();
    assert_eq!(out, 4);
}
