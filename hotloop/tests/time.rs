//! Timers: sleep never fires early, timeout and interval behave, many
//! concurrent timers all fire, and a dropped sleep is cancelled.

use std::time::{Duration, Instant};

use hotloop::spawn;
use hotloop::time::{interval, sleep, timeout};

#[hotloop::test(driver = "all")]
async fn sleep_never_fires_early() {
    for ms in [0u64, 1, 2, 5, 13, 30] {
        let start = Instant::now();
        sleep(Duration::from_millis(ms)).await;
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(ms), "sleep({ms} ms) took {took:?}");
        assert!(took < Duration::from_millis(ms + 200), "sleep({ms} ms) took {took:?}");
    }
}

#[hotloop::test(driver = "all")]
async fn timeout_elapses_or_passes_the_value() {
    let start = Instant::now();
    let r = timeout(Duration::from_millis(20), sleep(Duration::from_secs(60))).await;
    assert!(r.is_err());
    assert!(start.elapsed() >= Duration::from_millis(20));
    assert_eq!(timeout(Duration::from_secs(60), async { 5 }).await, Ok(5));
}

#[hotloop::test(driver = "all")]
async fn interval_ticks_on_schedule() {
    let start = Instant::now();
    let mut iv = interval(Duration::from_millis(10));
    for _ in 0..6 {
        iv.tick().await;
    }
    // The first tick is immediate; five periods follow.
    assert!(start.elapsed() >= Duration::from_millis(50));
}

#[hotloop::test(driver = "all")]
async fn thousands_of_timers_fire_and_none_early() {
    let handles: Vec<_> = (0..5_000u64)
        .map(|i| {
            spawn(async move {
                let d = Duration::from_micros((i * 7919) % 80_000);
                let start = Instant::now();
                sleep(d).await;
                start.elapsed() >= d
            })
        })
        .collect();
    let mut fired = 0;
    for h in handles {
        if h.await.unwrap() {
            fired += 1;
        }
    }
    assert_eq!(fired, 5_000);
    assert!(hotloop::Handle::current().stats().total.timers_fired >= 4_000);
}

#[hotloop::test(driver = "all")]
async fn dropped_sleep_is_cancelled() {
    for _ in 0..1_000 {
        let r = timeout(Duration::from_millis(1), sleep(Duration::from_secs(3600))).await;
        assert!(r.is_err());
    }
    // With the long sleeps cancelled, the worker may sleep in its poller.
    sleep(Duration::from_millis(5)).await;
    let c = hotloop::Handle::current().stats().total;
    assert!(c.timers_fired <= 1_100, "cancelled timers fired: {}", c.timers_fired);
}
