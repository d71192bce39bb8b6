//! Lazy epoll registration: with `TCP_DEFER_ACCEPT` and a client that
//! sends at once, a short request/response connection never touches
//! `epoll_ctl`. Eager mode registers every connection.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use hotloop::net::{serve, ListenerOptions};
use hotloop::DriverKind;
use hotloop::{Registration, Runtime};

const CONNECTIONS: usize = 50;

/// A short stream: read one request, answer, close.
async fn short_stream(stream: hotloop::net::TcpStream) {
    let (res, _buf) = stream.read_owned(Vec::with_capacity(512)).await;
    if matches!(res, Ok(n) if n > 0) {
        let _ = stream.write_all_owned(&b"pong"[..]).await;
    }
}

/// Runs `CONNECTIONS` short streams against a one-worker epoll server.
fn short_streams(
    registration: Registration,
    defer_accept: Option<u32>,
) -> hotloop::stats::Counters {
    let rt = Runtime::builder()
        .workers(1)
        .driver(DriverKind::Epoll)
        .registration(registration)
        .build()
        .unwrap();
    let options = ListenerOptions { defer_accept_secs: defer_accept, ..Default::default() };
    let server = serve(rt.handle(), "127.0.0.1:0", options, short_stream).unwrap();
    let addr = server.local_addr();
    for _ in 0..CONNECTIONS {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"ping").unwrap();
        let mut reply = Vec::new();
        s.read_to_end(&mut reply).unwrap();
        assert_eq!(reply, b"pong");
    }
    let c = rt.stats().workers[0];
    server.shutdown_blocking(Duration::from_secs(5));
    c
}

#[test]
fn lazy_registration_with_defer_accept_registers_no_connection() {
    let c = short_streams(Registration::Lazy, Some(1));
    assert_eq!(c.accepted, CONNECTIONS as u64);
    assert_eq!(c.registrations, 1, "only the listener is registered");
    assert_eq!(c.registrations_avoided, CONNECTIONS as u64);
}

#[test]
fn eager_registration_registers_every_connection() {
    let c = short_streams(Registration::Eager, Some(1));
    assert_eq!(c.registrations, 1 + CONNECTIONS as u64);
    assert_eq!(c.registrations_avoided, 0);
}

#[test]
fn lazy_registration_without_defer_accept_registers_only_what_waits() {
    let c = short_streams(Registration::Lazy, None);
    assert_eq!(c.registrations + c.registrations_avoided, 1 + CONNECTIONS as u64);
}

/// The same as the first test, counted by the kernel: run under
/// `strace -f -c`, the process makes a handful of `epoll_ctl` calls
/// (eventfds and the listener) for 50 connections.
#[test]
fn strace_counts_no_epoll_ctl_per_connection() {
    if std::env::var_os("HOTLOOP_STRACE_CHILD").is_some() {
        return; // the child run of the test below
    }
    if Command::new("strace").arg("-V").output().is_err() {
        eprintln!("skipped: strace is not installed");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("strace")
        .args(["-f", "-c", "-e", "trace=epoll_ctl,accept4"])
        .arg(&exe)
        .args(["--exact", &harness_name("strace_child"), "--ignored", "--test-threads=1"])
        .env("HOTLOOP_STRACE_CHILD", "1")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed: {report}");
    let count = |syscall: &str| -> u64 {
        report
            .lines()
            .find(|l| l.split_whitespace().last() == Some(syscall))
            .and_then(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                // % time, seconds, usecs/call, calls, [errors], syscall
                cols.get(3).and_then(|c| c.parse().ok())
            })
            .unwrap_or(0)
    };
    let accepts = count("accept4");
    let ctls = count("epoll_ctl");
    assert!(accepts >= CONNECTIONS as u64, "strace saw {accepts} accept4 calls:\n{report}");
    assert!(
        ctls < 10,
        "strace saw {ctls} epoll_ctl calls for {CONNECTIONS} connections:\n{report}"
    );
}

#[test]
#[ignore = "run by strace_counts_no_epoll_ctl_per_connection"]
fn strace_child() {
    let c = short_streams(Registration::Lazy, Some(1));
    assert_eq!(c.registrations, 1);
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
