//! Timers: sleep never fires early, timeout and interval behave, many
//! concurrent timers all fire, and a dropped sleep is cancelled.

// Some tests hand a polled sleep from one worker or runtime to another on purpose.
#![allow(clippy::async_yields_async)]

use std::future::Future;
use std::time::{Duration, Instant};

use hotloop::time::{interval, sleep, timeout};
use hotloop::DriverKind;
use hotloop::{spawn, Runtime};

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

/// `is_elapsed` says what the next poll does: both judge the deadline
/// by the loop's time of this turn (and the clock, within a tick of it).
/// By the clock alone, a sleep 5 ms past the turn's reading read as
/// elapsed once the task had blocked for 10 ms, while its poll was still
/// pending until the next turn.
#[hotloop::test(driver = "all")]
async fn is_elapsed_agrees_with_the_next_poll() {
    let mut nap = std::pin::pin!(sleep(Duration::from_millis(5)));
    // No loop turn in between: the turn's reading stays where it was.
    std::thread::sleep(Duration::from_millis(10));
    let elapsed = nap.is_elapsed();
    let ready =
        std::future::poll_fn(|cx| std::task::Poll::Ready(nap.as_mut().poll(cx).is_ready())).await;
    assert_eq!(elapsed, ready, "is_elapsed() said {elapsed}, the poll was ready: {ready}");
    nap.await;
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

/// A period near the end of time saturates, as `sleep` and `timeout` do:
/// the first tick comes at once, the next never.
#[hotloop::test(driver = "all")]
async fn an_interval_near_the_end_of_time_ticks_once_and_then_waits() {
    for period in
        [Duration::MAX, Duration::MAX - Duration::from_secs(1), Duration::from_secs(u64::MAX / 2)]
    {
        let mut ticks = interval(period);
        timeout(Duration::from_secs(5), ticks.tick()).await.expect("the first tick is at once");
        assert!(
            timeout(Duration::from_millis(30), ticks.tick()).await.is_err(),
            "a second tick of a {period:?} period came"
        );
    }
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

/// The driver sleeps until the wheel's earliest deadline: one that comes
/// earlier than the deadline the worker last slept with (both drivers
/// keep a timer armed across sleeps) still wakes it on time, and so does
/// a later one after the earlier timer was cancelled.
#[hotloop::test(driver = "all")]
async fn an_earlier_deadline_than_the_last_sleeps_is_met() {
    let far = spawn(sleep(Duration::from_secs(30)));
    // The worker sleeps with only the far deadline (the job wakes it from
    // another thread).
    hotloop::spawn_blocking(|| std::thread::sleep(Duration::from_millis(30))).await.unwrap();
    let start = Instant::now();
    sleep(Duration::from_millis(20)).await;
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(20) && took < Duration::from_secs(2), "{took:?}");
    // A near deadline armed, then cancelled: the next one is still met.
    assert!(timeout(Duration::from_millis(5), std::future::pending::<()>()).await.is_err());
    let near = spawn(sleep(Duration::from_millis(15)));
    near.abort();
    let start = Instant::now();
    sleep(Duration::from_millis(40)).await;
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(40) && took < Duration::from_secs(2), "{took:?}");
    far.abort();
}

/// With the earliest deadline unchanged (a server's idle timeouts), the
/// worker's sleeps arm no kernel timer each: the driver's timer (epoll's
/// timerfd, io_uring's timeout entry) is armed once for them all.
#[hotloop::test(driver = "all")]
async fn sleeps_until_an_unchanged_deadline_arm_the_timer_once() {
    let far = spawn(sleep(Duration::from_secs(30)));
    // Until the worker has slept once with the far deadline, its timer may
    // still be armed for the first time (a job that ends before the worker
    // sleeps leaves it unarmed): a few waits first, so that one counts
    // before the measured ones.
    for _ in 0..3 {
        hotloop::spawn_blocking(|| std::thread::sleep(Duration::from_millis(1))).await.unwrap();
    }
    let before = hotloop::Handle::current().stats().total;
    for _ in 0..50 {
        // Each job's completion wakes the sleeping worker from another thread.
        hotloop::spawn_blocking(|| std::thread::sleep(Duration::from_micros(300))).await.unwrap();
    }
    let after = hotloop::Handle::current().stats().total;
    assert!(after.poller_waits - before.poller_waits >= 25, "the worker did not sleep");
    assert_eq!(
        after.timer_arms - before.timer_arms,
        0,
        "the timer was re-armed for the same deadline"
    );
    far.abort();
}

/// `Duration::MAX` means "never": no overflow panic, and the worker sleeps.
#[hotloop::test(driver = "all")]
fn the_longest_sleeps_and_timeouts_neither_panic_nor_spin(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    rt.block_on(async {
        assert_eq!(timeout(Duration::MAX, async { 3 }).await, Ok(3));
        assert!(timeout(Duration::from_millis(10), sleep(Duration::MAX)).await.is_err());
        // A deadline past 2^64 ms from the clock's base.
        let polls = std::rc::Rc::new(std::cell::Cell::new(0u32));
        let counted = polls.clone();
        let far = spawn(async move {
            let mut s = std::pin::pin!(sleep(Duration::from_millis(u64::MAX)));
            std::future::poll_fn(|cx| {
                counted.set(counted.get() + 1);
                s.as_mut().poll(cx)
            })
            .await
        });
        sleep(Duration::from_millis(100)).await;
        assert!(!far.is_finished(), "a sleep of 2^64 ms fired");
        assert!(
            polls.get() <= 2,
            "the far sleep was polled {} times: the worker spins",
            polls.get()
        );
        far.abort();
    });
}

/// A sleep polled on one worker and then awaited on another leaves no
/// entry in the first worker's wheel.
#[hotloop::test(driver = "all")]
fn a_sleep_that_moves_between_workers_leaves_no_timer_behind(driver: DriverKind) {
    let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
    let h = rt.handle();
    let s = h
        .spawn_on(0, || async {
            let mut s = Box::pin(sleep(Duration::from_millis(30)));
            std::future::poll_fn(|cx| {
                let _ = s.as_mut().poll(cx);
                std::task::Poll::Ready(())
            })
            .await;
            s
        })
        .join()
        .unwrap();
    h.spawn_on(1, move || s).join().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let stats = rt.stats();
    assert_eq!(stats.workers[1].timers_fired, 1, "the sleep fired on the worker that awaited it");
    assert_eq!(stats.workers[0].timers_fired, 0, "the first worker's wheel kept a stale timer");
}

/// A sleep held in a thread-local that outlives the runtime's own
/// thread-locals is dropped without a panic.
#[test]
fn a_sleep_dropped_during_thread_local_teardown_does_not_panic() {
    thread_local! {
        static KEEP: std::cell::RefCell<Option<std::pin::Pin<Box<hotloop::time::Sleep>>>> =
            const { std::cell::RefCell::new(None) };
    }
    let t = std::thread::spawn(|| {
        KEEP.with(|_| {}); // registered first, so torn down after the runtime's
        let rt = Runtime::builder().workers(1).driver(DriverKind::Epoll).build().unwrap();
        let s = rt.block_on(async {
            let mut s = Box::pin(sleep(Duration::from_secs(60)));
            std::future::poll_fn(|cx| {
                let _ = s.as_mut().poll(cx);
                std::task::Poll::Ready(())
            })
            .await;
            s
        });
        KEEP.with(|k| *k.borrow_mut() = Some(s));
        drop(rt);
    });
    t.join().expect("dropping a sleep during thread-local teardown panicked");
}

/// An interval whose next tick is filed in a worker's wheel can be reset
/// off that worker (here, between two `block_on` calls): the worker drops
/// the old timer and the next tick comes at the new time.
#[hotloop::test(driver = "all")]
fn an_interval_reset_off_its_worker_ticks_at_the_new_time(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let mut ticks = rt.block_on(async {
        let mut ticks = interval(Duration::from_secs(3600));
        ticks.tick().await;
        // Polled once: the next tick's timer is filed.
        assert!(timeout(Duration::from_millis(5), ticks.tick()).await.is_err());
        ticks
    });
    ticks.reset_after(Duration::from_millis(20));
    let start = Instant::now();
    rt.block_on(async {
        timeout(Duration::from_secs(5), ticks.tick()).await.expect("the tick after the reset came")
    });
    assert!(start.elapsed() >= Duration::from_millis(15), "early: {:?}", start.elapsed());
}

/// What is due now is ready at its first poll, without waiting for the
/// wheel's next millisecond tick: a zero sleep, an interval's first tick,
/// and the tick after `reset_immediately`. Their deadlines are the real
/// time when made, a little past the turn's time the loop read.
#[hotloop::test(driver = "all")]
async fn what_is_due_now_is_ready_at_the_first_poll() {
    for _ in 0..3 {
        sleep(Duration::from_millis(2)).await; // a fresh turn
        assert!(poll_once(sleep(Duration::ZERO)).await.is_ready(), "a zero sleep");
        let mut ticks = interval(Duration::from_secs(3600));
        assert!(poll_once(ticks.tick()).await.is_ready(), "the first tick");
        assert!(poll_once(ticks.tick()).await.is_pending(), "the second, an hour on");
        ticks.reset_immediately();
        assert!(poll_once(ticks.tick()).await.is_ready(), "the tick after reset_immediately");
    }
}

/// Polls `future` once, in the calling task.
async fn poll_once<F: Future>(future: F) -> std::task::Poll<F::Output> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| std::task::Poll::Ready(future.as_mut().poll(cx))).await
}

/// What a reset from another thread acts on: a timer a task waits on
/// through a mutex, as when a deadline is shared between tasks.
type Shared<T> = std::sync::Arc<std::sync::Mutex<T>>;

/// Runs a task on worker 0 of a two-worker runtime that waits on `timer`
/// (an hour away or more) through `poll`, and, once the task has polled
/// it, calls `reset` on it from worker 1 or from a plain thread. Returns
/// how long the task waited, or panics if it waited for its 5 s bound
/// (the wake-up was lost).
fn wait_across_a_reset<T: Send + 'static>(
    driver: DriverKind,
    timer: T,
    poll: fn(&mut T, &mut std::task::Context<'_>) -> std::task::Poll<()>,
    reset: fn(&mut T),
    from_worker: bool,
) -> Duration {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
    let shared: Shared<T> = std::sync::Arc::new(std::sync::Mutex::new(timer));
    let polled = std::sync::Arc::new(AtomicBool::new(false));
    let (s, p) = (shared.clone(), polled.clone());
    let waiter = rt.handle().spawn_on(0, move || async move {
        let start = Instant::now();
        let waited = timeout(
            Duration::from_secs(5),
            std::future::poll_fn(|cx| {
                let ready = poll(&mut s.lock().unwrap(), cx);
                p.store(true, SeqCst);
                ready
            }),
        )
        .await;
        (waited.is_ok(), start.elapsed())
    });
    let resetter = move || {
        while !polled.load(SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        reset(&mut shared.lock().unwrap());
    };
    if from_worker {
        rt.handle().spawn_on(1, move || async move { resetter() }).join().unwrap();
    } else {
        std::thread::spawn(resetter).join().unwrap();
    }
    let (in_time, took) = waiter.join().unwrap();
    assert!(in_time && took < Duration::from_secs(3), "the reset's wake-up was lost: {took:?}");
    took
}

/// The deadline a reset below moves a timer to.
const SOON: Duration = Duration::from_millis(50);

/// A task waiting on a `Sleep` an hour away wakes at the new deadline when
/// another thread (a plain one, or another worker) resets it, as with
/// tokio's `Sleep::reset`; so does one waiting on an `Interval` reset by
/// each of its resets, and one waiting on a `Timeout`.
#[hotloop::test(driver = "all")]
fn a_reset_from_another_thread_keeps_the_wake_up(driver: DriverKind) {
    use hotloop::time::{interval_at, sleep_until, timeout_at, Interval, Sleep, Timeout};
    use std::pin::Pin;
    use std::task::Poll;
    type Waiting = Pin<Box<Timeout<std::future::Pending<()>>>>;
    let hour = || Instant::now() + Duration::from_secs(3600);
    let sleep_poll: fn(&mut Sleep, &mut std::task::Context<'_>) -> Poll<()> =
        |s, cx| Pin::new(s).poll(cx);
    let tick_poll: fn(&mut Interval, &mut std::task::Context<'_>) -> Poll<()> =
        |i, cx| i.poll_tick(cx).map(drop);
    let timeout_poll: fn(&mut Waiting, &mut std::task::Context<'_>) -> Poll<()> =
        |t, cx| t.as_mut().poll(cx).map(|out| assert!(out.is_err(), "the pending future ended"));
    for from_worker in [false, true] {
        let took = wait_across_a_reset(
            driver,
            sleep_until(hour()),
            sleep_poll,
            |s| s.reset(Instant::now() + SOON),
            from_worker,
        );
        assert!(took >= SOON, "a sleep woke before its new deadline: {took:?}");
        let took = wait_across_a_reset(
            driver,
            interval_at(hour(), Duration::from_secs(3600)),
            tick_poll,
            |i| i.reset_at(Instant::now() + SOON),
            from_worker,
        );
        assert!(took >= SOON, "reset_at: {took:?}");
        let took = wait_across_a_reset(
            driver,
            interval_at(hour(), Duration::from_secs(3600)),
            tick_poll,
            |i| i.reset_after(SOON),
            from_worker,
        );
        assert!(took >= SOON, "reset_after: {took:?}");
        let took = wait_across_a_reset(
            driver,
            interval_at(hour(), SOON),
            tick_poll,
            |i| i.reset(),
            from_worker,
        );
        assert!(took >= SOON, "reset: {took:?}");
        wait_across_a_reset(
            driver,
            interval_at(hour(), Duration::from_secs(3600)),
            tick_poll,
            |i| i.reset_immediately(),
            from_worker,
        );
        let took = wait_across_a_reset(
            driver,
            Box::pin(timeout_at(hour(), std::future::pending::<()>())),
            timeout_poll,
            |t| t.as_mut().reset(Instant::now() + SOON),
            from_worker,
        );
        assert!(took >= SOON, "a timeout fired before its new deadline: {took:?}");
    }
}

/// Resets from another thread that race the timer firing, the task's
/// polls and each other: every wait ends soon after the last deadline
/// (well before its 5 s bound, which would end a lost wake-up), none before
/// the deadline it last read.
#[hotloop::test(driver = "all")]
fn resets_racing_the_deadline_and_the_polls_lose_no_wake_up(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    for round in 0..100u32 {
        let shared: Shared<hotloop::time::Sleep> = std::sync::Arc::new(std::sync::Mutex::new(
            hotloop::time::sleep_until(Instant::now() + Duration::from_millis(2)),
        ));
        let s = shared.clone();
        let waiter = rt.handle().spawn_on(0, move || async move {
            let start = Instant::now();
            let waited = timeout(
                Duration::from_secs(5),
                std::future::poll_fn(|cx| {
                    let mut sleep = s.lock().unwrap();
                    let ready = std::pin::Pin::new(&mut *sleep).poll(cx);
                    if ready.is_ready() {
                        assert!(Instant::now() >= sleep.deadline(), "woke before the deadline");
                    }
                    ready
                }),
            )
            .await;
            waited.is_ok() && start.elapsed() < Duration::from_secs(2)
        });
        // Around the first deadline: before it, at it, or after it fired.
        std::thread::sleep(Duration::from_micros(500 * u64::from(round % 7)));
        for k in 0..3u64 {
            shared.lock().unwrap().reset(Instant::now() + Duration::from_millis(1 + k));
            std::thread::yield_now();
        }
        assert!(waiter.join().unwrap(), "round {round}: the wake-up was lost");
    }
}

/// A paused clock on a busy-polling worker still moves to the next timer
/// when nothing else is left to do: a spin never sleeps, and the clock
/// jumps only where the worker would sleep (before, `sleep(10 s)` under a
/// paused clock on such a worker spun a CPU for good).
#[hotloop::test(driver = "all")]
fn a_paused_clock_advances_on_a_busy_polling_worker(driver: DriverKind) {
    let rt = Runtime::builder()
        .workers(1)
        .driver(driver)
        .busy_poll(hotloop::BusyPoll::Always)
        .build()
        .unwrap();
    let slept = rt.handle().spawn_on(0, || async {
        hotloop::time::pause();
        let start = hotloop::time::now();
        sleep(Duration::from_secs(10)).await;
        let moved = hotloop::time::now() - start;
        hotloop::time::resume();
        moved
    });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(slept.join());
    });
    let moved = rx.recv_timeout(Duration::from_secs(5)).expect("the paused sleep never ended");
    assert!(moved.unwrap() >= Duration::from_secs(10));
}
