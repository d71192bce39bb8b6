//! `hotloop serve http` keeps one timer per connection for its header and
//! idle deadlines, moved only when it fires: across keep-alive requests a
//! connection still closes at the idle timeout after its last answer (not
//! at the first request's deadline, and not never), and a request head
//! left unfinished after answered requests still gets a 408 at the header
//! timeout.

use crate::common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{read_response, read_to_close, Proc};
use hotloop::DriverKind;

/// Opens a keep-alive connection and has `requests` requests answered on it.
fn answered_connection(addr: SocketAddr, requests: usize, pause: Duration) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for _ in 0..requests {
        s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        let answer = read_response(&mut s);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        std::thread::sleep(pause);
    }
    s
}

#[hotloop::test(driver = "all")]
fn keep_alive_connections_follow_the_idle_and_header_timeouts_across_requests(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let mut p = Proc::start(&[
        "serve",
        "http",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--driver",
        driver,
        "--header-timeout-ms",
        "400",
        "--idle-timeout-ms",
        "700",
    ]);
    let addr = p.addr_after(" on ");

    // Requests spread over more than the first header deadline and more
    // than one idle timeout: each answer restarts the idle clock.
    let mut s = answered_connection(addr, 5, Duration::from_millis(250));
    // Then silence: closed at the idle timeout after the last answer
    // (250 ms of it have passed), with nothing more sent.
    let (rest, took) = read_to_close(&mut s);
    assert!(rest.is_empty(), "{driver}: {}", String::from_utf8_lossy(&rest));
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{driver}: idle close {took:?} after the wait"
    );

    // Answered requests, then half a request head: 408 at the header timeout.
    let mut s = answered_connection(addr, 3, Duration::ZERO);
    s.write_all(b"GET / HTTP/1.1\r\nHost").unwrap();
    let (rest, took) = read_to_close(&mut s);
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.starts_with("HTTP/1.1 408"), "{driver}: {rest}");
    assert!(
        took >= Duration::from_millis(350) && took < Duration::from_secs(3),
        "{driver}: 408 after {took:?}"
    );
    p.signal("TERM");
}

/// With the idle timeout shorter than the header timeout, a connection
/// on which nothing moves is closed at the idle timeout whatever it waits
/// for: a first request that never comes, or the rest of a head (which
/// gets its 408).
#[hotloop::test(driver = "all")]
fn an_idle_timeout_shorter_than_the_header_timeout_closes_a_silent_head(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let mut p = Proc::start(&[
        "serve",
        "http",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--driver",
        driver,
        "--header-timeout-ms",
        "10000",
        "--idle-timeout-ms",
        "300",
    ]);
    let addr = p.addr_after(" on ");

    let mut silent = TcpStream::connect(addr).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (rest, took) = read_to_close(&mut silent);
    assert!(rest.is_empty(), "{driver}: {}", String::from_utf8_lossy(&rest));
    assert!(took < Duration::from_secs(3), "{driver}: a silent connection closed after {took:?}");

    let mut s = answered_connection(addr, 1, Duration::ZERO);
    s.write_all(b"GET / HTTP/1.1\r\nHost").unwrap();
    let (rest, took) = read_to_close(&mut s);
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.starts_with("HTTP/1.1 408"), "{driver}: {rest}");
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "{driver}: 408 after {took:?}"
    );
    p.signal("TERM");
}

/// `--header-timeout-ms 0` is no header timeout, as 0 is for the idle and
/// send timeouts (and for `proxy --header-timeout-ms`): a head that takes
/// its time is answered by `http`, `static` and `hyper` alike. It was
/// 1 ms, so every request but one sent at once got 408 (or a close).
#[hotloop::test(driver = "all")]
fn a_header_timeout_of_zero_is_none(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let root = common::TempDir::new("header-zero");
    std::fs::write(root.join("index.html"), "home").unwrap();
    let root_arg = root.join("");
    for (app, extra) in [
        ("http", vec![]),
        ("static", vec!["--root", root_arg.to_str().unwrap()]),
        ("hyper", vec![]),
    ] {
        let mut args = vec!["serve", app, "--addr", "127.0.0.1:0", "--workers", "1"];
        args.extend_from_slice(&["--driver", driver, "--header-timeout-ms", "0"]);
        args.extend_from_slice(&extra);
        let mut p = Proc::start(&args);
        let addr = p.addr_after(" on ");
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        s.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(200));
        s.write_all(b"Host: t\r\nConnection: close\r\n\r\n").unwrap();
        let (reply, _) = read_to_close(&mut s);
        let reply = String::from_utf8_lossy(&reply);
        assert!(reply.starts_with("HTTP/1.1 200"), "{driver} {app}: {reply:?}");
    }
}
