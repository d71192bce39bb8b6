//! Handles know the runtime they belong to: an operation, a join handle or
//! a socket used while another runtime runs on the same thread acts on its
//! own runtime's state, or fails cleanly, and never touches the other's.

// The tests hand futures from one runtime to another on purpose.
#![allow(clippy::async_yields_async)]

use std::future::{poll_fn, Future};
use std::io::Write;
use std::net::{TcpListener as StdListener, TcpStream as StdStream};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use hotloop::net::TcpStream;
use hotloop::time::{sleep, timeout};
use hotloop::DriverKind;
use hotloop::{spawn, Runtime};

fn runtime(driver: DriverKind) -> Runtime {
    Runtime::builder().workers(1).driver(driver).build().unwrap()
}

/// Polls `f` once, so an operation inside it is submitted.
async fn poll_once<F: Future + Unpin>(f: &mut F) {
    poll_fn(|cx| {
        let _ = Pin::new(&mut *f).poll(cx);
        Poll::Ready(())
    })
    .await
}

/// A read started on runtime A and dropped inside runtime B's
/// `block_on` is cancelled in A: B's own read (in the same slot of its
/// own table) still completes with its data.
#[hotloop::test(driver = "all")]
fn an_operation_dropped_under_another_runtime_stays_in_its_own(driver: DriverKind) {
    let (rt_a, rt_b) = (runtime(driver), runtime(driver));
    let la = StdListener::bind("127.0.0.1:0").unwrap();
    let lb = StdListener::bind("127.0.0.1:0").unwrap();
    let (addr_a, addr_b) = (la.local_addr().unwrap(), lb.local_addr().unwrap());
    let read_a = rt_a.block_on(async move {
        let a = TcpStream::connect(addr_a).await.unwrap();
        let mut read = Box::pin(async move { a.read_owned(Vec::with_capacity(64)).await });
        poll_once(&mut read).await;
        sleep(Duration::from_millis(5)).await; // the read reaches A's kernel queue
        read
    });
    let (_pa, _) = la.accept().unwrap();
    rt_b.block_on(async move {
        let b = TcpStream::connect(addr_b).await.unwrap();
        let (mut pb, _) = lb.accept().unwrap();
        let mut read_b = Box::pin(b.read_owned(Vec::with_capacity(64)));
        poll_once(&mut read_b).await;
        sleep(Duration::from_millis(5)).await;
        drop(read_a); // A's operation, dropped while B runs
        pb.write_all(b"for b").unwrap();
        let (res, buf) = timeout(Duration::from_secs(2), read_b)
            .await
            .expect("B's read was disturbed by A's cancellation");
        assert_eq!(res.unwrap(), 5);
        assert_eq!(&buf[..], b"for b");
    });
    // A still works after its operation was cancelled from outside.
    rt_a.block_on(async { sleep(Duration::from_millis(1)).await });
}

/// Aborting runtime A's task inside runtime B's `block_on` aborts that
/// task, not B's task in the same slot.
#[hotloop::test(driver = "all")]
fn abort_from_another_runtime_aborts_its_own_task(driver: DriverKind) {
    let (rt_a, rt_b) = (runtime(driver), runtime(driver));
    let handle_a = rt_a.block_on(async {
        spawn(async {
            sleep(Duration::from_millis(100)).await;
            "a"
        })
    });
    let out_b = rt_b.block_on(async move {
        let task_b = spawn(async {
            sleep(Duration::from_millis(20)).await;
            "b"
        });
        handle_a.abort();
        let out = task_b.await;
        (out, handle_a)
    });
    let (out_b, handle_a) = out_b;
    assert_eq!(out_b.expect("B's task was aborted by A's handle"), "b");
    let out_a = rt_a.block_on(handle_a);
    assert!(out_a.expect_err("A's task ran to completion after abort").is_cancelled());
}

/// A socket of runtime A used while runtime B runs fails with an error
/// that says so, instead of waiting forever in a driver nobody polls.
#[hotloop::test(driver = "all")]
fn a_socket_used_under_another_runtime_fails_cleanly(driver: DriverKind) {
    let (rt_a, rt_b) = (runtime(driver), runtime(driver));
    let l = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let a = rt_a.block_on(async move { TcpStream::connect(addr).await.unwrap() });
    let _peer: StdStream = l.accept().unwrap().0;
    rt_b.block_on(async move {
        let (res, _) = timeout(Duration::from_secs(2), a.read_owned(Vec::with_capacity(8)))
            .await
            .expect("a read on another runtime's socket waited forever");
        let err = res.expect_err("a read with nothing to read succeeded");
        assert!(err.to_string().contains("not running on this thread"), "{err}");
    });
}
