//! Dropping the runtime drops every task and closes every descriptor.
//! One test in its own binary: it counts the process's open descriptors,
//! which tests running in parallel would disturb.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hotloop::net::{serve, ListenerOptions, TcpListener};
use hotloop::DriverKind;
use hotloop::Runtime;

struct Count(Arc<AtomicUsize>);
impl Drop for Count {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn run(driver: DriverKind) {
    // The process-wide parts start with the first runtime and live as long
    // as the process (the tokio runtime that the default feature
    // `tokio-time` hosts keeps its reactor's descriptors): count from
    // after them.
    drop(Runtime::builder().workers(1).driver(driver).build().unwrap());
    let before = hotloop::open_fd_count().unwrap();
    let dropped = Arc::new(AtomicUsize::new(0));
    {
        let rt = Runtime::builder().workers(2).driver(driver).build().unwrap();
        let server =
            serve(rt.handle(), "127.0.0.1:0", ListenerOptions::default(), common::echo).unwrap();
        let addr = server.local_addr();
        // Idle connections held open by handler tasks.
        let clients: Vec<_> =
            (0..20).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        for w in 0..2 {
            let d = dropped.clone();
            drop(rt.handle().spawn_on(w, move || async move {
                let _c = Count(d);
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let _ = l.accept().await;
            }));
        }
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            hotloop::open_fd_count().unwrap() >= before + 40,
            "connections are open on both sides"
        );
        drop(rt);
        drop(clients);
        drop(server);
    }
    assert_eq!(dropped.load(Ordering::SeqCst), 2, "every task was dropped");
    assert_eq!(hotloop::open_fd_count().unwrap(), before, "every descriptor was closed");
}

#[test]
fn shutdown_closes_every_descriptor_on_each_driver() {
    run(DriverKind::Epoll);
    if !common::skip_uring() {
        run(DriverKind::Uring);
    }
}
