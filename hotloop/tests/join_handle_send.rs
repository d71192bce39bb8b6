//! A `JoinHandle` is `Send` when its output is: awaited from another
//! runtime's thread while its task runs on a hotloop worker, aborted from
//! there, and its `!Send` I/O stays inside the task.

// A test hands a task's handle out of the worker that spawned it on purpose.
#![allow(clippy::async_yields_async)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hotloop::net::{TcpListener, TcpStream};
use hotloop::{DriverKind, JoinHandle, Runtime};

fn assert_send<T: Send>(_: &T) {}

struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The handle of a task doing hotloop I/O crosses to a tokio runtime's
/// thread and is awaited there.
#[hotloop::test(driver = "all")]
fn a_handle_is_awaited_on_another_thread(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let (handle_tx, handle_rx) = std::sync::mpsc::channel::<JoinHandle<std::io::Result<Vec<u8>>>>();
    let io = rt.handle().spawn_on(0, move || async move {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let handle = hotloop::spawn(async move {
            let stream = TcpStream::connect(addr).await?;
            let (res, _) = stream.write_all_owned(b"ping".to_vec()).await;
            res?;
            let (res, buf) = stream.read_owned(Vec::with_capacity(16)).await;
            res?;
            Ok(buf)
        });
        assert_send(&handle);
        handle_tx.send(handle).unwrap();
        let (peer, _) = listener.accept().await?;
        let (res, buf) = peer.read_owned(Vec::with_capacity(16)).await;
        res?;
        let (res, _) = peer.write_all_owned(buf).await;
        res
    });
    let handle = handle_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let tokio_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()
        .unwrap();
    // `tokio::spawn` demands a `Send` future: awaiting the handle inside one compiles and works.
    let reply = tokio_rt
        .block_on(
            tokio_rt
                .spawn(async move { tokio::time::timeout(Duration::from_secs(10), handle).await }),
        )
        .unwrap()
        .expect("the hotloop task finished in time")
        .expect("the hotloop task did not fail")
        .expect("the echo worked");
    assert_eq!(reply, b"ping");
    io.join().unwrap().unwrap();
}

/// Aborting from another thread drops the task's future on its worker.
#[hotloop::test(driver = "all")]
fn abort_from_another_thread_cancels_the_task(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = dropped.clone();
    let handle = rt
        .handle()
        .spawn_on(0, move || async move {
            hotloop::spawn(async move {
                let _guard = SetOnDrop(flag);
                hotloop::time::sleep(Duration::from_secs(60)).await;
            })
        })
        .join()
        .unwrap();
    assert!(!handle.is_finished());
    let joiner = std::thread::spawn(move || {
        handle.abort();
        futures_block_on(handle)
    });
    let result = joiner.join().unwrap();
    assert!(result.unwrap_err().is_cancelled());
    assert!(dropped.load(Ordering::SeqCst), "the future was dropped on its worker");
}

/// A minimal executor for a plain thread: parks until woken.
fn futures_block_on<F: std::future::Future>(fut: F) -> F::Output {
    struct Unparker(std::thread::Thread);
    impl std::task::Wake for Unparker {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unparker(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "the handle never became ready");
        std::thread::park_timeout(Duration::from_millis(100));
    }
}
