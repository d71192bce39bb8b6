//! Busy polling: off never spins, always never sleeps, adaptive spins for
//! its budget after the last event and then sleeps.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use hotloop::net::{serve, ListenerOptions, Server};
use hotloop::DriverKind;
use hotloop::{BusyPoll, Runtime};

fn echo_server(driver: DriverKind, mode: BusyPoll) -> (Runtime, Server, SocketAddr) {
    let rt = Runtime::builder().workers(1).driver(driver).busy_poll(mode).build().unwrap();
    let server =
        serve(rt.handle(), "127.0.0.1:0", ListenerOptions::default(), common::echo).unwrap();
    let addr = server.local_addr();
    (rt, server, addr)
}

#[hotloop::test(driver = "all")]
fn off_sleeps_when_idle(driver: DriverKind) {
    let (rt, _server, addr) = echo_server(driver, BusyPoll::Off);
    assert_eq!(common::roundtrip(addr, b"hi", 2), b"hi");
    std::thread::sleep(Duration::from_millis(200));
    let c = rt.stats().workers[0];
    assert_eq!(c.poller_spins, 0);
    assert!(c.poller_waits < 50, "an idle worker woke {} times", c.poller_waits);
    assert_eq!(rt.stats().info.busy_poll, "off");
}

#[hotloop::test(driver = "all")]
fn always_never_sleeps(driver: DriverKind) {
    let (rt, _server, addr) = echo_server(driver, BusyPoll::Always);
    assert_eq!(common::roundtrip(addr, b"hi", 2), b"hi");
    std::thread::sleep(Duration::from_millis(200));
    let c = rt.stats().workers[0];
    assert!(c.poller_spins > 1_000, "only {} spins in 200 ms", c.poller_spins);
    assert_eq!(c.poller_waits, 0);
    assert_eq!(rt.stats().info.busy_poll, "always");
}

#[hotloop::test(driver = "all")]
fn adaptive_spins_then_sleeps(driver: DriverKind) {
    let mode = BusyPoll::Adaptive { spin_budget: Duration::from_millis(20) };
    let (rt, _server, addr) = echo_server(driver, mode);
    assert_eq!(common::roundtrip(addr, b"hi", 2), b"hi");
    std::thread::sleep(Duration::from_millis(150));
    let first = rt.stats().workers[0];
    std::thread::sleep(Duration::from_millis(200));
    let second = rt.stats().workers[0];
    assert!(first.poller_spins > 0, "adaptive mode spun after the event");
    assert_eq!(second.poller_spins, first.poller_spins, "an idle worker stopped spinning");
    assert!(second.poller_waits > 0);
    assert_eq!(rt.stats().info.busy_poll, "adaptive:20000");
}

#[hotloop::test(driver = "all")]
fn busy_polling_spins_on_the_completion_queue(driver: DriverKind) {
    for mode in [BusyPoll::Always, BusyPoll::Adaptive { spin_budget: Duration::from_micros(200) }] {
        let rt = Runtime::builder().workers(1).driver(driver).busy_poll(mode).build().unwrap();
        let server =
            serve(rt.handle(), "127.0.0.1:0", ListenerOptions::default(), common::echo).unwrap();
        let addr = server.local_addr();
        for i in 0..20 {
            let msg = format!("{mode} round trip {i}");
            assert_eq!(common::roundtrip(addr, msg.as_bytes(), msg.len()), msg.as_bytes());
        }
        // Leave the worker idle for a while: in `always` mode it keeps spinning.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(server.shutdown_blocking(Duration::from_secs(5)), 0);
        let stats = rt.stats().total;
        assert!(stats.poller_spins > 0, "{mode}: never spun");
        assert_eq!(stats.accepted, 20);
        if rt.stats().info.driver == "uring" && mode == BusyPoll::Always {
            // An idle spin reads the completion queue without entering the kernel.
            assert!(
                stats.uring_enters < stats.poller_spins,
                "{mode}: {} enters for {} spins",
                stats.uring_enters,
                stats.poller_spins
            );
        }
    }
}

/// A spinning worker reads the clock only once in several empty spins:
/// its timers still fire, and on time, whether the sleeper is the
/// `block_on` future or a spawned task.
#[hotloop::test(driver = "all")]
fn a_spinning_worker_fires_its_timers(driver: DriverKind) {
    const TIMER: Duration = Duration::from_millis(2);
    for mode in [BusyPoll::Always, BusyPoll::Adaptive { spin_budget: Duration::from_secs(5) }] {
        let rt = Runtime::builder().workers(1).driver(driver).busy_poll(mode).build().unwrap();
        let latest = rt.block_on(async {
            let spawned = hotloop::spawn(async {
                let mut latest = Duration::ZERO;
                for _ in 0..20 {
                    let start = std::time::Instant::now();
                    hotloop::time::sleep(TIMER).await;
                    latest = latest.max(start.elapsed());
                }
                latest
            });
            let mut latest = Duration::ZERO;
            for _ in 0..20 {
                let start = std::time::Instant::now();
                hotloop::time::sleep(TIMER).await;
                latest = latest.max(start.elapsed());
            }
            latest.max(spawned.await.unwrap())
        });
        assert!(rt.stats().total.poller_spins > 0, "{mode}: never spun");
        // The wheel counts whole milliseconds, so a 2 ms sleep ends within
        // its third tick; the bound is loose for a shared machine, and a
        // clock that stopped moving would never end it at all.
        assert!(latest >= TIMER, "{mode}: a timer fired early, after {latest:?}");
        assert!(latest < Duration::from_millis(500), "{mode}: a timer fired after {latest:?}");
    }
}
