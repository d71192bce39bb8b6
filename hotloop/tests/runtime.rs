//! The executor: block_on, spawn, JoinHandle, abort, yield, cross-thread
//! spawn and wake, panics, and shutdown closing every descriptor.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::Duration;

use hotloop::{spawn, yield_now, DriverKind, Runtime};

/// Sets a flag when dropped, to see that a task's future was dropped.
struct DropFlag(Arc<AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[hotloop::test(driver = "all")]
fn block_on_and_spawn_return_outputs(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let out = rt.block_on(async {
        let local = Rc::new(Cell::new(1)); // !Send state is fine in a task
        let l2 = local.clone();
        let h = spawn(async move {
            l2.set(l2.get() + 41);
            "done"
        });
        let r = h.await.unwrap();
        (r, local.get())
    });
    assert_eq!(out, ("done", 42));
}

#[hotloop::test(driver = "all")]
fn abort_drops_the_future(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let dropped = Arc::new(AtomicBool::new(false));
    let d = dropped.clone();
    let err = rt.block_on(async move {
        let h = spawn(async move {
            let _flag = DropFlag(d);
            hotloop::time::sleep(Duration::from_secs(3600)).await;
        });
        yield_now().await;
        h.abort();
        h.await.unwrap_err()
    });
    assert!(err.is_cancelled());
    assert!(dropped.load(Ordering::SeqCst));
}

#[hotloop::test(driver = "all")]
fn panicking_task_reports_and_runtime_continues(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let (panicked, after) = rt.block_on(async {
        let h = spawn(async { panic!("boom (expected by the test)") });
        let panicked = h.await.unwrap_err().is_panic();
        (panicked, spawn(async { 7 }).await.unwrap())
    });
    assert!(panicked);
    assert_eq!(after, 7);
}

#[hotloop::test(driver = "all")]
fn spawn_on_workers_from_another_thread(driver: DriverKind) {
    let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
    let handle = rt.handle().clone();
    let t = std::thread::spawn(move || {
        (0..handle.workers())
            .map(|w| {
                handle.spawn_on(w, move || async move {
                    std::thread::current().name().map(String::from)
                })
            })
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    let names = t.join().unwrap();
    assert_eq!(names, vec![Some("hotloop-worker-0".into()), Some("hotloop-worker-1".into())]);
}

#[hotloop::test(driver = "all")]
fn cross_thread_wake_reaches_a_sleeping_worker(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let slot: Arc<Mutex<(bool, Option<Waker>)>> = Arc::new(Mutex::new((false, None)));
    let s2 = slot.clone();
    let waiter = rt.handle().spawn_on(0, move || async move {
        std::future::poll_fn(|cx| {
            let mut st = s2.lock().unwrap();
            if st.0 {
                Poll::Ready(())
            } else {
                st.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    });
    // Let the worker go to sleep in its poller with no timer pending.
    std::thread::sleep(Duration::from_millis(100));
    let waker = {
        let mut st = slot.lock().unwrap();
        st.0 = true;
        st.1.take().expect("task parked its waker")
    };
    waker.wake();
    waiter.join().unwrap();
    assert!(rt.stats().workers[0].remote_wakeups > 0);
}

#[hotloop::test(driver = "all")]
fn block_on_all_runs_on_every_worker(driver: DriverKind) {
    let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
    let out = rt.block_on_all(|w| async move { w * 10 });
    let out: Vec<_> = out.into_iter().map(Result::unwrap).collect();
    assert_eq!(out, vec![0, 10]);
}

/// A finished task's waker is kept for later spawns only when nothing else
/// holds a clone of it; a clone kept past its task's end must find a stale
/// key and wake nothing.
#[hotloop::test]
async fn a_waker_kept_after_its_task_ended_never_wakes_a_later_task() {
    use std::cell::RefCell;
    use std::future::poll_fn;

    let kept: Rc<RefCell<Option<Waker>>> = Rc::default();
    let k = kept.clone();
    hotloop::spawn(poll_fn(move |cx| {
        *k.borrow_mut() = Some(cx.waker().clone());
        Poll::Ready(())
    }))
    .await
    .unwrap();
    // Tasks that end with no clone left: their wakers are reused.
    for _ in 0..100 {
        hotloop::spawn(async {}).await.unwrap();
    }
    let polls = Rc::new(Cell::new(0));
    let p = polls.clone();
    let later = hotloop::spawn(poll_fn(move |_| {
        p.set(p.get() + 1);
        Poll::<()>::Pending
    }));
    for _ in 0..3 {
        hotloop::yield_now().await;
    }
    let before = polls.get();
    assert_eq!(before, 1, "polled once, then parked with no waker kept");
    kept.borrow_mut().take().unwrap().wake();
    for _ in 0..3 {
        hotloop::yield_now().await;
    }
    assert_eq!(polls.get(), before, "a stale waker woke a later task");
    later.abort();
}

/// The task that calls `wake_all` is woken too, as the doc says: one that
/// returns `Pending` after it, keeping no waker, is polled again.
#[hotloop::test(driver = "all")]
fn wake_all_wakes_the_calling_task(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let task = rt.handle().spawn_on(0, || async {
        let mut polls = 0;
        std::future::poll_fn(|_| {
            polls += 1;
            if polls == 1 {
                hotloop::task::wake_all();
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
        polls
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !task.is_finished() {
        assert!(std::time::Instant::now() < deadline, "the caller was not woken");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(task.join().unwrap(), 2);
}

/// `wake_all` reaches every task of the worker it runs on, even one parked
/// on a wait that kept no waker (as an idle connection is while the server
/// is told to stop), and leaves the other workers' tasks alone.
#[hotloop::test(driver = "all")]
fn wake_all_reaches_every_task_of_its_worker_and_no_other(driver: DriverKind) {
    use std::sync::atomic::AtomicUsize;
    let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
    let go = Arc::new(AtomicBool::new(false));
    let parked = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for worker in 0..2 {
        for _ in 0..3 {
            let (go, parked) = (go.clone(), parked.clone());
            tasks.push(rt.handle().spawn_on(worker, move || async move {
                let mut first = true;
                // Pending until `go`, and no waker kept anywhere.
                std::future::poll_fn(|_| {
                    if first {
                        first = false;
                        parked.fetch_add(1, Ordering::SeqCst);
                    }
                    if go.load(Ordering::SeqCst) {
                        Poll::Ready(())
                    } else {
                        Poll::Pending
                    }
                })
                .await;
            }));
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while parked.load(Ordering::SeqCst) < 6 {
        assert!(std::time::Instant::now() < deadline, "the tasks never parked");
        std::thread::sleep(Duration::from_millis(5));
    }
    go.store(true, Ordering::SeqCst);
    // Worker 0 only: its three tasks end, worker 1's stay parked.
    let woken = rt.handle().spawn_on(0, || async { hotloop::task::wake_all() }).join().unwrap();
    assert!(woken >= 4, "the three parked tasks and the caller: {woken}");
    let (first, second) = tasks.split_at_mut(3);
    for t in first.iter() {
        while !t.is_finished() {
            assert!(std::time::Instant::now() < deadline, "a parked task was not woken");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(second.iter().all(|t| !t.is_finished()), "another worker's task was woken");
    rt.handle().spawn_on(1, || async { hotloop::task::wake_all() }).join().unwrap();
    for t in tasks {
        t.join().unwrap();
    }
}

/// A thread blocked in `join` before a task or a blocking job finishes is
/// woken with its output, and a `join` made after the finish returns it at
/// once: the finish signals only a thread it sees blocked.
#[hotloop::test(driver = "all")]
fn a_join_blocked_before_the_finish_gets_the_output(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let late = rt.handle().spawn_on(0, || async {
        hotloop::time::sleep(Duration::from_millis(50)).await;
        11
    });
    assert_eq!(late.join().unwrap(), 11);
    let done = rt.handle().spawn_on(0, || async { 12 });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done.is_finished() {
        assert!(std::time::Instant::now() < deadline, "the task never finished");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(done.join().unwrap(), 12);
    let job = rt.handle().spawn_blocking(|| {
        std::thread::sleep(Duration::from_millis(50));
        13
    });
    assert_eq!(job.join().unwrap(), 13);
}

/// `shutdown_timeout` and `shutdown_background` do not wait past their
/// bound for a worker whose thread a task blocks (as tokio's): they return,
/// and the worker ends on its own once the task lets go of its thread.
#[hotloop::test(driver = "all")]
fn a_bounded_shutdown_does_not_wait_for_a_blocked_worker(driver: DriverKind) {
    const BOUND: Duration = Duration::from_millis(100);
    for background in [false, true] {
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let (ended_tx, ended_rx) = std::sync::mpsc::channel();
        let (took_tx, took_rx) = std::sync::mpsc::channel();
        // The runtime lives on a thread of its own, so a shutdown that
        // waits for the worker fails the test instead of hanging it.
        let stopper = std::thread::spawn(move || {
            let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
            let (blocked_tx, blocked_rx) = std::sync::mpsc::channel();
            drop(rt.handle().spawn_on(0, move || async move {
                let _ended = DropSend(ended_tx);
                blocked_tx.send(()).unwrap();
                // Holds the worker's thread until the test lets go.
                let _ = release_rx.recv_timeout(Duration::from_secs(30));
            }));
            blocked_rx.recv_timeout(Duration::from_secs(10)).expect("the task started");
            let start = std::time::Instant::now();
            if background {
                rt.shutdown_background();
            } else {
                rt.shutdown_timeout(BOUND);
            }
            let _ = took_tx.send(start.elapsed());
        });
        let took = took_rx.recv_timeout(Duration::from_secs(2));
        release_tx.send(()).unwrap();
        stopper.join().unwrap();
        let took = took.unwrap_or_else(|_| {
            panic!("the shutdown (background: {background}) waited for the blocked worker")
        });
        if background {
            assert!(took < BOUND, "shutdown_background took {took:?}");
        } else {
            assert!(took >= BOUND, "shutdown_timeout took {took:?}, less than its bound");
        }
        // The worker, let go, ends and drops its task.
        ended_rx.recv_timeout(Duration::from_secs(10)).expect("the stray worker dropped its task");
    }
}

/// Sends on its channel when dropped, to see a task dropped on another thread.
struct DropSend(std::sync::mpsc::Sender<()>);
impl Drop for DropSend {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}
