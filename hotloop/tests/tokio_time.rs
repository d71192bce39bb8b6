//! With the `tokio-time` feature (on by default), `tokio::time` works
//! inside hotloop tasks: `sleep`, `timeout` around hotloop I/O, an
//! `interval`, and tower's own `Timeout` service, on both drivers and on
//! several workers; so do `tokio::spawn` and `tokio::net` where the
//! program's tokio compiles them in.

use std::time::{Duration, Instant};

use hotloop::net::{TcpListener, TcpStream};
use hotloop::{DriverKind, Runtime};
use tower::{Service, ServiceExt};

#[hotloop::test(driver = "all")]
async fn tokio_sleep_and_interval_run_in_a_hotloop_task() {
    let start = Instant::now();
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(start.elapsed() >= Duration::from_millis(30));
    let task = hotloop::spawn(async {
        let mut ticks = tokio::time::interval(Duration::from_millis(5));
        for _ in 0..4 {
            ticks.tick().await;
        }
    });
    tokio::time::timeout(Duration::from_secs(10), task).await.unwrap().unwrap();
}

#[hotloop::test(driver = "all")]
async fn tokio_timeout_cuts_hotloop_io_that_never_comes() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (_server, _) = listener.accept().await.unwrap();
    let start = Instant::now();
    let read =
        tokio::time::timeout(Duration::from_millis(50), client.read_owned(Vec::with_capacity(8)));
    assert!(read.await.is_err(), "nothing was sent, so the read cannot finish");
    assert!(start.elapsed() >= Duration::from_millis(50));
}

/// tower's `Timeout` (which calls `tokio::time::sleep`) around a slow
/// service, on every worker of a runtime.
#[hotloop::test(driver = "all")]
fn towers_timeout_layer_works_on_every_worker(driver: DriverKind) {
    let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
    let results = rt.block_on_all(|_| async {
        let slow = tower::service_fn(|delay: u64| async move {
            hotloop::time::sleep(Duration::from_millis(delay)).await;
            Ok::<_, std::convert::Infallible>(delay)
        });
        let mut svc = tower::timeout::Timeout::new(slow, Duration::from_millis(50));
        let fast = svc.ready().await.unwrap().call(1).await.map_err(|e| e.to_string());
        let late = svc.ready().await.unwrap().call(5_000).await.map_err(|e| e.to_string());
        (fast, late)
    });
    for r in results {
        let (fast, late) = r.unwrap();
        assert_eq!(fast, Ok(1));
        assert!(late.unwrap_err().contains("timed out"));
    }
}

/// `tokio::spawn` and `tokio::net` from a hotloop task: the future runs on
/// the hosted tokio runtime's thread, its socket on that runtime's reactor,
/// and hotloop I/O talks to it.
#[hotloop::test(driver = "all")]
async fn tokio_spawn_and_tokio_net_work_inside_a_hotloop_task() {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.write_all(b"from tokio").await.unwrap();
        std::thread::current().name().map(String::from)
    });
    let stream = TcpStream::connect(addr).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 10 {
        let (res, buf) = stream.read_owned(Vec::with_capacity(16)).await;
        assert!(res.unwrap() > 0, "the tokio side closed early");
        got.extend_from_slice(&buf);
    }
    assert_eq!(got, b"from tokio");
    let thread = tokio::time::timeout(Duration::from_secs(10), server).await.unwrap().unwrap();
    assert_eq!(thread.as_deref(), Some("hotloop-tokio"));
}
