//! Panics stay where they happen: in a task's poll, in a destructor the
//! executor or the driver runs, or in a `spawn_on` closure, a panic reaches
//! the waiter that concerns it as an error and the worker carries on.

use crate::common;

use std::cell::RefCell;
use std::future::{pending, poll_fn, Future};
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

use hotloop::time::{sleep, timeout};
use hotloop::DriverKind;
use hotloop::{spawn, yield_now, JoinError, Runtime};

/// Panics when dropped.
struct PanicOnDrop(&'static str);

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("{}", self.0);
        }
    }
}

fn runtime(driver: DriverKind) -> Runtime {
    Runtime::builder().workers(1).driver(driver).build().unwrap()
}

/// The worker still runs tasks.
fn worker_alive(rt: &Runtime) {
    let r = rt.handle().spawn_on(0, || async { 7 }).join();
    assert_eq!(r.expect("the worker died"), 7);
}

fn payload(e: JoinError) -> String {
    match e {
        JoinError::Panicked(p) => p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default(),
        JoinError::Cancelled => "cancelled".into(),
    }
}

#[hotloop::test(driver = "all")]
fn a_panicking_destructor_of_an_aborted_task_spares_the_worker(driver: DriverKind) {
    let rt = runtime(driver);
    let r = rt
        .handle()
        .spawn_on(0, || async {
            let h = spawn(async {
                let _g = PanicOnDrop("aborted task's destructor");
                pending::<()>().await
            });
            yield_now().await;
            h.abort();
            h.await.map_err(|e| e.is_cancelled())
        })
        .join();
    assert_eq!(r.unwrap(), Err(true));
    worker_alive(&rt);
}

#[hotloop::test(driver = "all")]
fn a_panicking_destructor_of_a_finished_task_spares_the_worker(driver: DriverKind) {
    let rt = runtime(driver);
    let r = rt
        .handle()
        .spawn_on(0, || Finished {
            _guard: PanicOnDrop("finished task's destructor"),
            inner: Box::pin(async {
                sleep(Duration::from_millis(1)).await;
                5
            }),
        })
        .join();
    assert_eq!(r.unwrap(), 5, "the output was delivered before the destructor ran");
    worker_alive(&rt);
}

#[hotloop::test(driver = "all")]
fn a_panicking_spawn_on_closure_reaches_its_join_handle(driver: DriverKind) {
    let rt = runtime(driver);
    let r = rt
        .handle()
        .spawn_on(0, || -> std::future::Ready<u32> { panic!("closure panicked") })
        .join();
    assert_eq!(payload(r.unwrap_err()), "closure panicked");
    worker_alive(&rt);
    // block_on_all, which waits on every worker, still returns.
    let all = rt.block_on_all(|w| async move { w });
    assert_eq!(all.len(), 1);
}

/// A buffer whose destructor panics, dropped by the driver when its
/// cancelled read ends (io_uring) or by the task (epoll).
#[hotloop::test(driver = "all")]
fn a_panicking_buffer_destructor_spares_the_worker(driver: DriverKind) {
    let rt = runtime(driver);
    let r = rt
        .handle()
        .spawn_on(0, || async {
            let l = hotloop::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let s = l.accept_stream().await.unwrap();
            let buf = PanickyBuf { bytes: Vec::with_capacity(64), _g: PanicOnDrop("buffer") };
            let r = hotloop::spawn(async move {
                let _ = timeout(Duration::from_millis(5), s.read_owned(buf)).await;
            })
            .await;
            sleep(Duration::from_millis(20)).await; // the cancelled read ends
            r.is_err()
        })
        .join();
    assert!(r.is_ok(), "{:?}", r.err().map(payload));
    worker_alive(&rt);
}

/// A task that panics and whose destructor then aborts another task:
/// the panic is the panicking task's, and the other task is cancelled.
#[hotloop::test(driver = "all")]
fn a_panic_is_never_blamed_on_another_task(driver: DriverKind) {
    let rt = runtime(driver);
    rt.block_on(async {
        let victim = Rc::new(RefCell::new(spawn(pending::<()>())));
        let culprit = spawn(WithGuard {
            _guard: AbortOnDrop(victim.clone()),
            inner: Box::pin(async { panic!("the culprit's own panic") }),
        });
        assert_eq!(payload(culprit.await.unwrap_err()), "the culprit's own panic");
        let v = poll_fn(|cx| Pin::new(&mut *victim.borrow_mut()).poll(cx)).await;
        assert!(
            v.expect_err("the victim ran on").is_cancelled(),
            "the victim got the culprit's panic"
        );
    });
}

/// Aborts a task when dropped.
struct AbortOnDrop(Rc<RefCell<hotloop::JoinHandle<()>>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.borrow().abort();
    }
}

/// A future whose own fields outlive a panic in `inner`: the executor
/// drops them after it has caught the panic.
struct WithGuard<F> {
    _guard: AbortOnDrop,
    inner: Pin<Box<F>>,
}

impl<F: Future> Future for WithGuard<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        self.inner.as_mut().poll(cx)
    }
}

/// A future with a field that panics when the executor drops the
/// finished task.
struct Finished<F> {
    _guard: PanicOnDrop,
    inner: Pin<Box<F>>,
}

impl<F: Future> Future for Finished<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        self.inner.as_mut().poll(cx)
    }
}

/// A read buffer whose destructor panics.
struct PanickyBuf {
    bytes: Vec<u8>,
    _g: PanicOnDrop,
}

// SAFETY: delegates to the Vec, whose heap block stays put while the struct moves.
unsafe impl hotloop::buf::IoBufMut for PanickyBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.bytes.stable_mut_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.bytes.bytes_total()
    }
    unsafe fn set_init(&mut self, n: usize) {
        // SAFETY: forwarded from the caller.
        unsafe { self.bytes.set_init(n) }
    }
}

/// A `block_on` inside a task is refused in that task, before anything
/// changes: the task's handle reports the panic, and the worker keeps its
/// own context (its later spawns and timers run on it).
#[hotloop::test(driver = "all")]
fn a_nested_block_on_panics_in_its_task_and_the_worker_keeps_its_context(driver: DriverKind) {
    let rt = runtime(driver);
    let other = Rc::new(runtime(driver));
    rt.block_on(async {
        for target in [other.clone(), other.clone()] {
            let nested = spawn(async move { target.block_on(async { 1 }) });
            let err = timeout(Duration::from_secs(10), nested).await.unwrap().unwrap_err();
            assert!(payload(err).contains("cannot be entered from inside another"));
        }
        // The worker still has its own context: a spawn and a sleep run here.
        let later = spawn(async {
            sleep(Duration::from_millis(5)).await;
            9
        });
        assert_eq!(timeout(Duration::from_secs(10), later).await.unwrap().unwrap(), 9);
    });
    // And the same runtime, nested in its own task.
    let rt = Rc::new(rt);
    let again = rt.clone();
    let err = rt.block_on(async move { spawn(async move { again.block_on(async {}) }).await });
    assert!(err.unwrap_err().is_panic());
    worker_alive(&rt);
    let other = Rc::try_unwrap(other).ok().unwrap();
    worker_alive(&other);
}

/// A task that owns a `Runtime` and panics drops that runtime while it
/// unwinds: the drop must not panic again (that would abort the process).
/// Runs in a child process, which an abort would kill.
#[hotloop::test(driver = "all")]
fn a_task_that_owns_a_runtime_and_panics_reports_the_panic(driver: DriverKind) {
    let out = common::run_child(
        &harness_name("owned_runtime_child"),
        "HOTLOOP_OWNED_RUNTIME_CHILD",
        driver,
    );
    assert!(out.contains("owned runtimes: ok"));
}

/// The child of the test above.
#[test]
fn owned_runtime_child() {
    let Some(driver) = common::child_driver("HOTLOOP_OWNED_RUNTIME_CHILD") else { return };
    let rt = runtime(driver);
    rt.block_on(async move {
        // Dropped while the owning task unwinds.
        let owner = spawn(async move {
            let inner = Runtime::builder().workers(1).driver(driver).build().unwrap();
            assert_eq!(inner.handle().spawn_on(0, || async { 3 }).join().unwrap(), 3);
            let _owned = inner;
            panic!("the owner panics");
        });
        let err = timeout(Duration::from_secs(10), owner).await.unwrap().unwrap_err();
        assert_eq!(payload(err), "the owner panics");
        // Dropped normally, inside a task, after its own block_on ran elsewhere.
        let dropper = spawn(async move {
            let inner = Runtime::builder().workers(1).driver(driver).build().unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            inner.handle().spawn(async move { tx.send(5).unwrap() });
            assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 5);
            drop(inner);
            11
        });
        assert_eq!(timeout(Duration::from_secs(10), dropper).await.unwrap().unwrap(), 11);
        // The worker still has its own context.
        sleep(Duration::from_millis(2)).await;
    });
    worker_alive(&rt);
    println!("owned runtimes: ok");
}

/// The name the test harness knows `name` by: prefixed with this file's
/// module path below the test crate (`file::name` in `tests/suite.rs`, just
/// `name` in a binary of its own), for running one test in a child.
fn harness_name(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}
