//! Connection limits and descriptor exhaustion as an operator meets them:
//! `--maxconn` bounds descriptors, a waiting accept loop sleeps until a
//! slot frees, and running out of descriptors is logged once per episode.
//! Both drivers.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{stat, wait_until, Proc};
use hotloop::DriverKind;

fn echo_once(s: &mut TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
}

/// 600 clients against `--maxconn 100`: the server holds about 100
/// descriptors for them (the rest wait in the kernel's backlog), and
/// the stats endpoint still answers.
#[hotloop::test(driver = "all")]
fn maxconn_bounds_descriptors_and_the_stats_endpoint_stays_reachable(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    hotloop::raise_nofile_limit().unwrap();
    let mut p = Proc::start(&[
        "serve",
        "echo",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--driver",
        driver,
        "--maxconn",
        "100",
        "--stats-addr",
        "127.0.0.1:0",
    ]);
    let addr = p.addr_after(" on ");
    let stats = p.addr_after("stats on ");
    let baseline = p.fds();
    let clients: Vec<TcpStream> = (0..600).map(|_| TcpStream::connect(addr).unwrap()).collect();
    assert!(wait_until(Duration::from_secs(20), || stat(stats, "active_connections") == 100));
    std::thread::sleep(Duration::from_millis(300)); // let any accept-ahead land
    let held = p.fds().saturating_sub(baseline);
    assert!(
        held <= 110,
        "{driver}: {held} descriptors held for 100 connections; active_connections {}; \
         accepted {}; {:?}",
        stat(stats, "active_connections"),
        stat(stats, "accepted"),
        kinds(&p.fd_targets())
    );
    assert_eq!(stat(stats, "active_connections"), 100);
    drop(clients);
    // Every waiting client is accepted as slots free, then closes.
    assert!(wait_until(Duration::from_secs(30), || stat(stats, "active_connections") == 0));
}

/// At the limit an accept loop sleeps until a connection ends (on any
/// worker), rather than waking every 2 ms to look.
#[hotloop::test(driver = "all")]
fn an_accept_loop_at_the_limit_sleeps_until_a_slot_frees(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let mut p = Proc::start(&[
        "serve",
        "echo",
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--driver",
        driver,
        "--maxconn",
        "1",
        "--stats-addr",
        "127.0.0.1:0",
    ]);
    let addr = p.addr_after(" on ");
    let stats = p.addr_after("stats on ");
    let mut first = TcpStream::connect(addr).unwrap();
    echo_once(&mut first);
    let before = stat(stats, "tasks_polled");
    std::thread::sleep(Duration::from_secs(1));
    let polls = stat(stats, "tasks_polled") - before;
    // A scrape costs a handful of polls; a 2 ms recheck on two workers costs about 1,000.
    assert!(polls < 100, "{driver}: {polls} task polls in 1 s at the limit, idle");
    // A waiting client is taken as soon as the slot frees, whichever worker it waits on.
    let waiting: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                echo_once(&mut s);
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    drop(first);
    for w in waiting {
        w.join().unwrap();
    }
}

/// Out of descriptors: one warning when it starts and one line when it
/// ends, with the count, per worker; not one per 10 ms retry.
#[hotloop::test(driver = "all")]
fn descriptor_exhaustion_is_logged_once_per_episode(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let mut p = Proc::start_with_nofile(
        48,
        &["serve", "echo", "--addr", "127.0.0.1:0", "--workers", "1", "--driver", driver],
    );
    let addr = p.addr_after(" on ");
    let clients: Vec<TcpStream> = (0..80).map(|_| TcpStream::connect(addr).unwrap()).collect();
    // A second of failing retries (about 100 at 10 ms each).
    assert!(p.wait_for_line("accept failed", Duration::from_secs(10)), "{:?}", p.seen);
    p.collect_lines(Duration::from_secs(1));
    drop(clients);
    let mut s = TcpStream::connect(addr).unwrap();
    echo_once(&mut s);
    assert!(p.wait_for_line("accepting again after", Duration::from_secs(10)), "{:?}", p.seen);
    p.collect_lines(Duration::from_millis(300));
    let failed = p.seen.iter().filter(|l| l.contains("accept failed")).count();
    let again = p.seen.iter().filter(|l| l.contains("accepting again")).count();
    // The hold is one episode; when the clients go, the backlog they
    // leave can run the table out once or twice more, briefly: each such
    // run is an episode of its own, with its own pair of lines.
    assert!(failed <= 3 && again == failed, "{driver}: {:#?}", p.seen);
    let first_end = p.seen.iter().find(|l| l.contains("accepting again")).unwrap();
    let count: u64 =
        first_end.split("after ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(count >= 20, "{driver}: the first episode counted {count} failures: {first_end}");
}

/// How many of a process's descriptors point at each kind of thing
/// (`socket`, `pipe`, `anon_inode:[eventfd]`, a path), for a failure's message.
fn kinds(targets: &[String]) -> std::collections::BTreeMap<String, usize> {
    let mut kinds = std::collections::BTreeMap::new();
    for t in targets {
        let target = t.split(" -> ").nth(1).unwrap_or(t);
        let kind = target.split(":[").next().unwrap_or(target);
        let kind = if kind == "anon_inode" { target } else { kind };
        *kinds.entry(kind.to_string()).or_insert(0) += 1;
    }
    kinds
}
