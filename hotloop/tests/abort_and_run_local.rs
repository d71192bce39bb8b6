//! Aborting tasks as tokio does (`RemoteJoinHandle::abort`, `AbortHandle`
//! from a `JoinHandle` or `JoinSet::spawn`, from any thread), and
//! `task::run_local`, which gives code that must be `Send` (an axum
//! handler) a `Send` future of hotloop I/O, its panic as an error.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hotloop::net::{TcpListener, TcpStream};
use hotloop::task::{run_local, AbortHandle, JoinSet};
use hotloop::{DriverKind, JoinError, Runtime};

fn assert_send<T: Send>(t: T) -> T {
    t
}

/// Sets its flag when dropped: the task holding it is gone.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn flag() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

/// A future that never ends and sets `dropped` when it is dropped.
async fn forever(dropped: Arc<AtomicBool>) -> u32 {
    let _guard = SetOnDrop(dropped);
    std::future::pending::<u32>().await
}

/// Hotloop I/O (not `Send`) awaited from a future that must be `Send`.
#[hotloop::test(driver = "all")]
async fn run_local_gives_a_send_future_of_hotloop_io() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = hotloop::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let (res, _) = s.write_all_owned(b"banner".to_vec()).await;
        res.unwrap();
    });
    // The whole handler-like future is `Send`: the `!Send` connect and read
    // run in the task `run_local` spawns at once.
    let handler = assert_send(async move {
        run_local(async move {
            let stream = TcpStream::connect(addr).await?;
            let (res, buf) = stream.read_owned(Vec::with_capacity(16)).await;
            res.map(|_| buf)
        })
        .await
    });
    let got: std::io::Result<Vec<u8>> = handler.await;
    assert_eq!(got.unwrap(), b"banner");
    peer.await.unwrap();
}

#[hotloop::test(driver = "all")]
async fn run_local_turns_a_panic_into_an_error_of_the_output_type() {
    let failed: std::io::Result<()> = run_local(async {
        hotloop::task::yield_now().await;
        panic!("a bug in the I/O code")
    })
    .await;
    let e = failed.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::Other);
    assert!(e.to_string().contains("task panicked: a bug in the I/O code"), "{e}");
}

#[hotloop::test(driver = "all")]
async fn dropping_run_local_unfinished_aborts_its_task() {
    let dropped = flag();
    let d = dropped.clone();
    let pending = run_local(async move {
        forever(d).await;
        Ok::<(), std::io::Error>(())
    });
    // Let the task start, then drop its future as a cancelled handler would.
    hotloop::task::yield_now().await;
    assert!(!dropped.load(Ordering::SeqCst));
    drop(pending);
    hotloop::task::yield_now().await;
    assert!(dropped.load(Ordering::SeqCst), "the task outlived the future awaiting it");
}

/// `RemoteJoinHandle::abort` from the thread that spawned on the worker.
#[hotloop::test(driver = "all")]
fn a_remote_handle_aborts_its_task_on_the_worker(driver: DriverKind) {
    let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
    let dropped = flag();
    let d = dropped.clone();
    let task = rt.handle().spawn_on(1, move || forever(d));
    // Until the task is running on its worker.
    while rt.handle().spawn_on(1, || async {}).join().is_err() {}
    task.abort();
    assert!(matches!(task.join(), Err(JoinError::Cancelled)));
    assert!(dropped.load(Ordering::SeqCst), "the aborted task's future was not dropped");
}

/// An abort that reaches the worker before the spawn runs: the task never runs.
#[hotloop::test(driver = "all")]
fn a_remote_abort_before_the_spawn_runs_stops_it(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    // Keeps the worker busy, so both the spawn and the abort queue behind it.
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let blocker = rt.handle().spawn_on(0, move || async move {
        go_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    });
    let ran = flag();
    let r = ran.clone();
    let task = rt.handle().spawn_on(0, move || {
        r.store(true, Ordering::SeqCst);
        async {}
    });
    task.abort();
    go_tx.send(()).unwrap();
    blocker.join().unwrap();
    assert!(matches!(task.join(), Err(JoinError::Cancelled)));
    assert!(!ran.load(Ordering::SeqCst), "the aborted task was built");
}

/// A blocking job that has started runs to its end whatever `abort` says
/// (a thread cannot be stopped); one still waiting in the queue is not run
/// and gives `Cancelled`: tokio's behaviour both ways.
#[hotloop::test(driver = "all")]
fn aborting_a_blocking_job_skips_it_only_before_it_starts(driver: DriverKind) {
    let rt = hotloop::Runtime::builder()
        .workers(1)
        .driver(driver)
        .max_blocking_threads(1)
        .build()
        .unwrap();
    rt.block_on(async {
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let first = hotloop::spawn_blocking(move || {
            started_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            5
        });
        started_rx.recv().unwrap();
        // The pool's one thread is busy: this one waits in the queue.
        let ran = flag();
        let second = hotloop::spawn_blocking({
            let ran = ran.clone();
            move || ran.store(true, Ordering::SeqCst)
        });
        second.abort();
        first.abort();
        go_tx.send(()).unwrap();
        assert_eq!(first.await.unwrap(), 5, "a started job ran to its end");
        assert!(matches!(second.await, Err(JoinError::Cancelled)));
        assert!(!ran.load(Ordering::SeqCst), "the aborted job ran");
    });
}

/// `JoinSet::spawn` returns an `AbortHandle` that works from another thread.
#[hotloop::test(driver = "all")]
async fn an_abort_handle_from_a_join_set_aborts_from_another_thread() {
    let mut set = JoinSet::new();
    let dropped = flag();
    let handle: AbortHandle = set.spawn(forever(dropped.clone()));
    set.spawn(async { 1 });
    assert!(!handle.is_finished());
    let thread_handle = handle.clone();
    std::thread::spawn(move || thread_handle.abort()).join().unwrap();
    let mut results = Vec::new();
    while let Some(r) = set.join_next().await {
        results.push(r.map_err(|e| e.is_cancelled()));
    }
    results.sort();
    assert_eq!(results, vec![Ok(1), Err(true)]);
    assert!(dropped.load(Ordering::SeqCst));
    assert!(handle.is_finished());
}

/// A task's `AbortHandle` is `Send` and `Sync` whatever its output; it
/// tells when the task has finished.
#[hotloop::test(driver = "all")]
async fn a_join_handles_abort_handle_is_send_for_any_output() {
    let task = hotloop::spawn(async { std::rc::Rc::new(3) });
    let abort = task.abort_handle();
    fn send_sync<T: Send + Sync + Clone>(_: &T) {}
    send_sync(&abort);
    assert_eq!(*task.await.unwrap(), 3);
    assert!(abort.is_finished());
    abort.abort(); // finished: nothing happens
    let dropped = flag();
    let task = hotloop::spawn(forever(dropped.clone()));
    let abort = task.abort_handle();
    hotloop::task::yield_now().await;
    abort.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert!(dropped.load(Ordering::SeqCst));
}

/// A set's handles tell their own task's finish, also once the set has
/// reused the task's place for a newer task.
#[hotloop::test(driver = "all")]
async fn a_join_set_handle_tells_its_own_task_after_its_place_is_reused() {
    let mut set = JoinSet::new();
    let first = set.spawn(async { 1 });
    assert_eq!(set.join_next().await.unwrap().unwrap(), 1);
    let second = set.spawn(forever(flag()));
    assert!(first.is_finished());
    assert!(!second.is_finished(), "the newer task in the same place is running");
    second.abort();
    assert!(set.join_next().await.unwrap().unwrap_err().is_cancelled());
    assert!(second.is_finished());
}

/// A task detached from its set keeps a handle that tells its own state,
/// though a newer task takes its place in the set and finishes first.
#[hotloop::test(driver = "all")]
async fn a_detached_tasks_handle_is_not_fooled_by_the_task_in_its_place() {
    let mut set = JoinSet::new();
    let dropped = flag();
    let detached = set.spawn(forever(dropped.clone()));
    set.detach_all();
    let newer = set.spawn(async { 2 });
    assert_eq!(set.join_next().await.unwrap().unwrap(), 2);
    assert!(newer.is_finished());
    assert!(!detached.is_finished(), "the detached task still runs");
    detached.abort();
    hotloop::task::yield_now().await;
    assert!(dropped.load(Ordering::SeqCst), "the abort reached the detached task");
    assert!(detached.is_finished());
}

/// Takes itself out of a registry when dropped, as a connection's guard does.
struct Registered(std::rc::Rc<std::cell::RefCell<Vec<u32>>>, u32);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.borrow_mut().retain(|&id| id != self.1);
    }
}

/// An abort (and a dropped `JoinSet`) drops the task later, at its turn
/// on the worker, as tokio does: not inside the caller, which may hold a
/// borrow the task's destructors take.
#[hotloop::test(driver = "all")]
fn an_abort_drops_the_task_at_its_turn_not_inside_the_caller(driver: DriverKind) {
    use std::cell::RefCell;
    use std::rc::Rc;
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    rt.block_on(async {
        let registry = Rc::new(RefCell::new(Vec::new()));
        let mut set = JoinSet::new();
        let mut handles = Vec::new();
        for id in 0..4u32 {
            registry.borrow_mut().push(id);
            let guard = Registered(registry.clone(), id);
            let task = async move {
                let _guard = guard;
                std::future::pending::<()>().await
            };
            if id < 2 {
                handles.push(hotloop::spawn(task));
            } else {
                set.spawn(task);
            }
        }
        hotloop::yield_now().await;
        {
            let held = registry.borrow_mut();
            for h in &handles {
                h.abort();
            }
            drop(set);
            assert_eq!(held.len(), 4, "dropped inside the caller's borrow");
        }
        for h in handles {
            assert!(h.await.unwrap_err().is_cancelled());
        }
        for _ in 0..4 {
            hotloop::yield_now().await;
        }
        assert!(registry.borrow().is_empty(), "left: {:?}", registry.borrow());
    });
}
