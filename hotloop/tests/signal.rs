//! Process signals: `ctrl_c`, `signal(kind)` listeners on workers, and
//! `ShutdownSignals` on a blocking thread, on both drivers.
//!
//! Signals are process-wide and the tests of one binary run in parallel
//! threads, so every test here holds `SERIAL` while it sends signals, and
//! each sends them only to this test process.
// Each test holds `SERIAL` across the awaits of its own runtime, on its own
// thread: another test waiting for it blocks only its own thread.
#![allow(clippy::await_holding_lock)]

use std::future::poll_fn;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::Duration;

use hotloop::signal::{ctrl_c, signal, ShutdownSignals, Signal, SignalKind};
use hotloop::time::timeout;
use hotloop::{DriverKind, Handle};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sends `kind` to this thread (the handler runs before `raise` returns).
fn raise(kind: SignalKind) {
    // SAFETY: raise(3) takes no pointers; the signal has hotloop's handler.
    assert_eq!(unsafe { libc::raise(kind.as_raw_value()) }, 0);
}

/// True if `sig` has no delivery waiting: one poll, which parks the task's waker.
async fn is_idle(sig: &mut Signal) -> bool {
    poll_fn(|cx| Poll::Ready(sig.poll_recv(cx).is_pending())).await
}

const LIMIT: Duration = Duration::from_secs(10);

#[hotloop::test(driver = "all")]
async fn ctrl_c_completes_at_the_next_sigint(_driver: DriverKind) {
    let _serial = serial();
    // Installs the handler first, so a SIGINT sent before `ctrl_c` is first
    // polled cannot end the test process.
    let _guard = signal(SignalKind::interrupt()).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    // Sent until seen: the task cannot tell the thread when `ctrl_c` is listening.
    let sender = std::thread::spawn({
        let done = done.clone();
        move || {
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
                // SAFETY: kill(2) takes no pointers; it signals this process only.
                unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
            }
        }
    });
    let res = timeout(LIMIT, ctrl_c()).await;
    done.store(true, Ordering::SeqCst);
    sender.join().unwrap();
    res.expect("ctrl_c did not complete").unwrap();
}

#[hotloop::test(driver = "all")]
async fn two_listeners_each_get_one_delivery(_driver: DriverKind) {
    let _serial = serial();
    let mut a = signal(SignalKind::user_defined1()).unwrap();
    let mut b = signal(SignalKind::user_defined1()).unwrap();
    assert!(is_idle(&mut a).await && is_idle(&mut b).await, "a delivery before any was sent");
    raise(SignalKind::user_defined1());
    assert_eq!(timeout(LIMIT, a.recv()).await.unwrap(), Some(()));
    assert_eq!(timeout(LIMIT, b.recv()).await.unwrap(), Some(()));
    assert!(is_idle(&mut a).await && is_idle(&mut b).await, "one signal, two deliveries");

    // Two deliveries nobody waited for coalesce into one, as in tokio.
    raise(SignalKind::user_defined1());
    raise(SignalKind::user_defined1());
    assert_eq!(timeout(LIMIT, a.recv()).await.unwrap(), Some(()));
    assert!(is_idle(&mut a).await);
}

#[hotloop::test(driver = "all", workers = 2)]
async fn listeners_on_two_workers_each_get_the_delivery(_driver: DriverKind) {
    let _serial = serial();
    let handle = Handle::current();
    // Made here, so both listen before the signal is sent; each moves to its worker.
    let tasks: Vec<_> = (0..2)
        .map(|worker| {
            let mut sig = signal(SignalKind::user_defined2()).unwrap();
            handle.spawn_on(worker, move || async move { timeout(LIMIT, sig.recv()).await })
        })
        .collect();
    // Both workers park in their drivers before the signal comes.
    hotloop::time::sleep(Duration::from_millis(50)).await;
    raise(SignalKind::user_defined2());
    for task in tasks {
        assert_eq!(task.await.unwrap().expect("a worker's listener was not woken"), Some(()));
    }
}

#[hotloop::test(driver = "all")]
async fn a_signal_sent_from_another_thread_wakes_a_parked_task(_driver: DriverKind) {
    let _serial = serial();
    let mut sig = signal(SignalKind::alarm()).unwrap();
    let task = hotloop::spawn(async move { timeout(LIMIT, sig.recv()).await });
    let sender = std::thread::spawn(|| {
        // The worker is asleep in its driver by then: only the cross-thread wake reaches it.
        std::thread::sleep(Duration::from_millis(50));
        raise(SignalKind::alarm());
    });
    assert_eq!(task.await.unwrap().expect("the task was not woken"), Some(()));
    sender.join().unwrap();
}

#[hotloop::test(driver = "all")]
async fn the_default_action_no_longer_runs_once_a_listener_exists(_driver: DriverKind) {
    let _serial = serial();
    let mut hup = signal(SignalKind::hangup()).unwrap();
    // SIGHUP's default action ends the process; the test carries on instead.
    raise(SignalKind::hangup());
    assert_eq!(timeout(LIMIT, hup.recv()).await.unwrap(), Some(()));
    // The handler stays after its last listener is gone.
    drop(hup);
    raise(SignalKind::hangup());
    let mut hup = signal(SignalKind::hangup()).unwrap();
    assert!(is_idle(&mut hup).await, "a delivery before the listener existed was seen");
}

#[test]
fn signals_that_cannot_be_listened_for_are_refused() {
    for raw in
        [libc::SIGKILL, libc::SIGSTOP, libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE]
    {
        let err = signal(SignalKind::from_raw(raw)).expect_err("a forbidden signal was accepted");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let name = SignalKind::from_raw(raw).to_string();
        assert!(err.to_string().contains(&name), "{err}");
    }
    for raw in [0, -1, 65, 1000] {
        let err = signal(SignalKind::from_raw(raw))
            .expect_err("a number that names no signal was accepted");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{raw}: {err}");
    }
}

#[test]
fn signal_kinds_convert_and_print() {
    assert_eq!(SignalKind::from_raw(libc::SIGTERM), SignalKind::terminate());
    assert_eq!(libc::c_int::from(SignalKind::quit()), libc::SIGQUIT);
    assert!(SignalKind::interrupt().is_stop() && !SignalKind::hangup().is_stop());
    assert_eq!(SignalKind::user_defined2().to_string(), "SIGUSR2");
    assert_eq!(format!("{:?}", SignalKind::user_defined2()), "User2");
    assert_eq!(format!("{:?}", SignalKind::from_raw(40)), "SignalKind(40)");
}

#[test]
fn shutdown_signals_takes_each_signal_on_a_blocking_thread() {
    let _serial = serial();
    let signals = ShutdownSignals::block().unwrap();
    assert_eq!(signals.wait_timeout(Duration::from_millis(20)).unwrap(), None);
    for kind in [SignalKind::terminate(), SignalKind::hangup(), SignalKind::user_defined1()] {
        raise(kind);
        assert_eq!(signals.wait_timeout(LIMIT).unwrap(), Some(kind));
    }
    // `wait` blocks until a signal sent by another thread arrives.
    let sender = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(50));
        raise(SignalKind::quit());
    });
    assert_eq!(signals.wait().unwrap(), SignalKind::quit());
    sender.join().unwrap();
    assert_eq!(signals.wait_timeout(Duration::from_millis(20)).unwrap(), None);
}

/// Panics when woken.
struct PanicWaker;

impl std::task::Wake for PanicWaker {
    fn wake(self: Arc<Self>) {
        panic!("a listener's waker panics");
    }
}

/// Sends `kind` to this process from another thread after `after`, so
/// the listener is parked and only a wake from the signal thread can
/// deliver it.
fn send_later(kind: SignalKind, after: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        // SAFETY: kill(2) takes no pointers; it signals this process only.
        unsafe { libc::kill(libc::getpid(), kind.as_raw_value()) };
    })
}

/// Waits for `sig`'s next delivery, which a wake must bring: a
/// `timeout` polls its future once more when it ends and would find the
/// delivery counted even with no wake, so the wait is bounded well below it.
async fn woken_within(sig: &mut Signal, limit: Duration) {
    let start = std::time::Instant::now();
    assert_eq!(timeout(LIMIT, sig.recv()).await.expect("delivery stopped"), Some(()));
    assert!(start.elapsed() < limit, "the delivery came only when the wait gave up: no wake");
}

/// One listener whose waker panics does not end delivery: later
/// listeners, of this signal and others, still get theirs.
#[hotloop::test(driver = "all")]
async fn a_panicking_waker_does_not_stop_signal_delivery(_driver: DriverKind) {
    let _serial = serial();
    let mut bad = signal(SignalKind::user_defined2()).unwrap();
    let waker = std::task::Waker::from(Arc::new(PanicWaker));
    let mut cx = std::task::Context::from_waker(&waker);
    assert!(bad.poll_recv(&mut cx).is_pending(), "a delivery before any was sent");
    raise(SignalKind::user_defined2());
    hotloop::time::sleep(Duration::from_millis(50)).await;
    // Parked listeners, woken only by the signal thread.
    let mut good = signal(SignalKind::user_defined2()).unwrap();
    for _ in 0..2 {
        assert!(is_idle(&mut good).await);
        let sender = send_later(SignalKind::user_defined2(), Duration::from_millis(20));
        woken_within(&mut good, LIMIT / 2).await;
        sender.join().unwrap();
    }
    let mut other = signal(SignalKind::user_defined1()).unwrap();
    assert!(is_idle(&mut other).await);
    let sender = send_later(SignalKind::user_defined1(), Duration::from_millis(20));
    woken_within(&mut other, LIMIT / 2).await;
    sender.join().unwrap();
    drop(bad);
}
