//! Faults a server meets every day: resets, half-closes, writes to a closed
//! peer, refused and stalled connects, futures dropped mid-operation.
//! Each gives a clear `io::Error` or a clean end, never a panic.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use hotloop::net::{serve, ListenerOptions, TcpListener};
use hotloop::time::timeout;
use hotloop::DriverKind;
use hotloop::Runtime;

/// Serves with `handler`, which reports one result per connection on a channel.
fn server_reporting<F, Fut, T>(
    driver: DriverKind,
    handler: F,
) -> (Runtime, SocketAddr, mpsc::Receiver<T>)
where
    F: Fn(hotloop::net::TcpStream, mpsc::Sender<T>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
    T: Send + 'static,
{
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let server = serve(rt.handle(), "127.0.0.1:0", ListenerOptions::default(), move |s| {
        handler(s, tx.lock().unwrap().clone())
    })
    .unwrap();
    let addr = server.local_addr();
    (rt, addr, rx)
}

fn reset(stream: TcpStream) {
    // SO_LINGER with a zero timeout makes close send RST.
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: passes a live linger struct and its size.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as u32,
        );
    }
    drop(stream);
}

#[hotloop::test(driver = "all")]
fn peer_reset_mid_read_is_an_error_not_a_panic(driver: DriverKind) {
    let (_rt, addr, rx) = server_reporting(driver, |s, tx| async move {
        let (first, buf) = s.read_owned(Vec::with_capacity(64)).await;
        let _ = tx.send(first.map(|n| n > 0).unwrap_or(false));
        let (second, _) = s.read_owned(buf).await;
        // A reset reads as ECONNRESET (or, if it raced the read, as EOF).
        let _ = tx.send(
            matches!(second, Err(ref e) if e.kind() == std::io::ErrorKind::ConnectionReset)
                || matches!(second, Ok(0)),
        );
    });
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(b"partial request").unwrap();
    assert!(rx.recv_timeout(Duration::from_secs(5)).unwrap());
    std::thread::sleep(Duration::from_millis(20));
    reset(c);
    assert!(
        rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        "the reset surfaced as an error or EOF"
    );
}

#[hotloop::test(driver = "all")]
fn half_close_reads_eof_and_can_still_answer(driver: DriverKind) {
    let (_rt, addr, _rx) = server_reporting::<_, _, ()>(driver, |s, _tx| async move {
        let mut got = Vec::new();
        let mut buf = Vec::with_capacity(16);
        loop {
            let (res, b) = s.read_owned(buf).await;
            match res {
                Ok(0) => break,
                Ok(_) => got.extend_from_slice(&b),
                Err(_) => return,
            }
            buf = b;
        }
        got.reverse();
        let _ = s.write_all_owned(got).await;
    });
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"abcdef").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let mut reply = Vec::new();
    c.read_to_end(&mut reply).unwrap();
    assert_eq!(reply, b"fedcba");
}

#[hotloop::test(driver = "all")]
fn write_to_a_closed_peer_is_epipe_not_sigpipe(driver: DriverKind) {
    let (_rt, addr, rx) = server_reporting(driver, |s, tx| async move {
        hotloop::time::sleep(Duration::from_millis(50)).await;
        let chunk = vec![7u8; 64 * 1024];
        let mut result = Ok(());
        for _ in 0..1_000 {
            let (res, _) = s.write_all_owned(chunk.clone()).await;
            if let Err(e) = res {
                result = Err(e.kind());
                break;
            }
        }
        let _ = tx.send(result);
    });
    let c = TcpStream::connect(addr).unwrap();
    reset(c);
    let r = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(
        matches!(r, Err(std::io::ErrorKind::BrokenPipe) | Err(std::io::ErrorKind::ConnectionReset)),
        "got {r:?}"
    );
}

#[hotloop::test(driver = "all")]
fn connect_to_a_closed_port_is_refused(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let err = rt.block_on(hotloop::net::TcpStream::connect(("127.0.0.1", port))).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
}

#[hotloop::test(driver = "all")]
fn connect_timeout_fires_when_the_backlog_is_full(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    // A listener that never accepts, with the smallest backlog: once its
    // queue is full, the kernel drops new SYNs and connects stall.
    let options = ListenerOptions { backlog: 0, ..Default::default() };
    let l = rt.block_on(async { TcpListener::bind_with("127.0.0.1:0", options) }).unwrap();
    let addr = l.local_addr().unwrap();
    let _held: Vec<_> = (0..4).filter_map(|_| socket_connect_nonblocking(addr)).collect();
    let err = rt
        .block_on(hotloop::net::TcpStream::connect_timeout(addr, Duration::from_millis(200)))
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err.kind(), std::io::ErrorKind::TimedOut), "expected a timeout, got {err}");
}

#[hotloop::test(driver = "all")]
fn dropping_reads_mid_flight_keeps_the_driver_consistent(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            c.write_all(b"late").unwrap();
            let mut b = [0u8; 2];
            c.read_exact(&mut b).unwrap();
            b
        });
        let (stream, _) = listener.accept().await.unwrap();
        let mut dropped = 0;
        loop {
            match timeout(Duration::from_millis(1), stream.read_owned(Vec::with_capacity(16))).await
            {
                Err(_) => dropped += 1,
                Ok((res, buf)) => {
                    assert_eq!(res.unwrap(), 4);
                    assert_eq!(buf, b"late");
                    break;
                }
            }
        }
        assert!(dropped > 10, "reads were dropped mid-flight {dropped} times");
        let (res, _) = stream.write_all_owned(&b"ok"[..]).await;
        res.unwrap();
        assert_eq!(&client.join().unwrap(), b"ok");
    });
}

/// Starts a connect without waiting for it (to fill a backlog).
fn socket_connect_nonblocking(addr: SocketAddr) -> Option<std::net::TcpStream> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_millis(50)).ok()?;
    Some(s)
}

#[hotloop::test(driver = "all")]
fn peer_reset_during_read_is_an_error(driver: DriverKind) {
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = thread::spawn(move || {
            let s = TcpStream::connect(addr).unwrap();
            // Wait for the server's bytes, leave them unread and close:
            // closing with unread data makes the kernel send a reset.
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut probe = [0u8; 1];
            s.set_nonblocking(true).unwrap();
            while s.peek(&mut probe).is_err() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(1));
            }
            thread::sleep(Duration::from_millis(20));
            drop(s);
        });
        let (stream, _) = listener.accept().await.unwrap();
        let (res, _) = stream.write_all_owned(b"never read".to_vec()).await;
        res.unwrap();
        let (res, _) = timeout(Duration::from_secs(5), stream.read_owned(Vec::with_capacity(64)))
            .await
            .expect("the reset never reached the read");
        let err = res.expect_err("a reset connection cannot be read");
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
        client.join().unwrap();
    });
}

#[hotloop::test(driver = "all")]
fn client_connect_vectored_write_and_shutdown(driver: DriverKind) {
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr().unwrap();
    let echo = thread::spawn(move || {
        let (mut s, _) = server.accept().unwrap();
        let mut all = Vec::new();
        std::io::Read::read_to_end(&mut s, &mut all).unwrap();
        s.write_all(&all).unwrap();
    });
    let rt = Runtime::builder().workers(1).driver(driver).build().unwrap();
    rt.block_on(async {
        let stream = hotloop::net::TcpStream::connect(addr).await.unwrap();
        let bufs = vec![b"vectored ".to_vec(), b"write ".to_vec(), b"works".to_vec()];
        let (res, _) = stream.write_vectored_owned(bufs).await;
        assert_eq!(res.unwrap(), 20);
        stream.shutdown_with(std::net::Shutdown::Write).await.unwrap();
        let mut back = Vec::new();
        loop {
            let (res, buf) = stream.read_owned(Vec::with_capacity(64)).await;
            match res.unwrap() {
                0 => break,
                _ => back.extend_from_slice(&buf),
            }
        }
        assert_eq!(back, b"vectored write works");
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let refused_addr = closed.local_addr().unwrap();
        drop(closed);
        let err = hotloop::net::TcpStream::connect(refused_addr).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    });
    echo.join().unwrap();
}
