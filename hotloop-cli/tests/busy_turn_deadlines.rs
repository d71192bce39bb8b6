//! Connection deadlines that pass while the worker's loop turn runs long:
//! `serve http` and `serve hyper` with millisecond header and idle
//! timeouts, requests that each cost CPU (`--work-us`) and heads left
//! unfinished, so that deadlines keep falling due in the middle of turns.
//! The worker must keep serving. (A sleep is ready once the clock has
//! passed its deadline, which can lie ahead of the turn's reading of the
//! clock; the connection's timer compared with the turn's reading alone,
//! filed the same deadline again, and spun in that poll for good: the
//! server answered nothing more.) Both drivers.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::Proc;
use hotloop::DriverKind;

/// How long the clients keep the worker busy.
const CHURN: Duration = Duration::from_secs(3);

/// One client: a whole request, then a head it never finishes, on fresh
/// connections until `until`.
fn churn(addr: SocketAddr, until: Instant) {
    while Instant::now() < until {
        let Ok(mut s) = TcpStream::connect(addr) else { continue };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut buf = [0u8; 256];
        if s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").is_err() || s.read(&mut buf).is_err() {
            continue;
        }
        std::thread::sleep(Duration::from_millis(2));
        // The header timeout ends this one.
        let _ = s.write_all(b"GET / HTTP/1.1\r\n");
        let _ = s.read(&mut buf);
    }
}

/// Whether a fresh client gets its answer within `limit`.
fn answered(addr: SocketAddr, limit: Duration) -> Result<(), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(limit)).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut head = [0u8; 15];
    s.read_exact(&mut head).map_err(|e| e.to_string())?;
    if &head == b"HTTP/1.1 200 OK" {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&head).into_owned())
    }
}

fn check(driver: &str, app: &str) {
    let args = [
        "serve",
        app,
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--driver",
        driver,
        "--idle-timeout-ms",
        "3",
        "--header-timeout-ms",
        "3",
        "--work-us",
        "300",
    ];
    let mut p = Proc::start(&args);
    let addr = p.addr_after(" on ");
    let until = Instant::now() + CHURN;
    std::thread::scope(|scope| {
        for _ in 0..16 {
            scope.spawn(|| churn(addr, until));
        }
    });
    if let Err(e) = answered(addr, Duration::from_secs(5)) {
        panic!("{app} on {driver}: no answer after the churn ({e}): the worker is stuck");
    }
}

#[hotloop::test(driver = "all")]
fn deadlines_due_inside_a_long_turn_do_not_stall_the_worker(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    for app in ["http", "hyper"] {
        check(driver, app);
    }
}
