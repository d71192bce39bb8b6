//! What a zero-copy send (`SEND_ZC`) costs the sender against a copying
//! one: the io_uring driver's `HOTLOOP_URING_SEND_ZC` switch.
//!
//! One io_uring worker connects to a receiver that reads and discards,
//! and writes a shared buffer (`Arc<[u8]>`, which a zero-copy send can
//! keep alive) of each size until `MIB` MiB are sent. Each round runs
//! every mode once, in turn: `off` (`HOTLOOP_URING_SEND_ZC=0`, a copying
//! `SEND`), `on` (the default: zero-copy until the kernel reports that it
//! copied one on this socket) and `always` (`HOTLOOP_URING_SEND_ZC=always`,
//! zero-copy on every write whatever the kernel reports). The threshold
//! is lowered to 4 KiB so every size goes through the zero-copy path. The
//! report gives, per size and mode, the median over the rounds of the
//! sending thread's CPU time per MiB (`CLOCK_THREAD_CPUTIME_ID`: time spent
//! descheduled on a shared machine is left out, the kernel's work in the
//! thread's system calls and soft interrupts is in) and of the wall time,
//! and the zero-copy counters: how many sends the kernel really sent
//! zero-copy and how many it copied after all.
//!
//! The receiver is a thread on loopback unless `SEND_ZC_PEER=host:port`
//! names one elsewhere (another network namespace across a veth pair, a
//! real device). Over loopback or veth the receiving socket is local, so
//! the kernel copies the pages when it delivers them (and reports it):
//! only a network device sends from the writer's pages.
//!
//! Run with `cargo bench -p hotloop --bench send_zc`; `ROUNDS` (default
//! 5) and `MIB` (default 256) change the run.

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Instant;

use hotloop::net::TcpStream;
use hotloop::{DriverKind, Runtime};

/// The sizes of the writes.
const SIZES: [usize; 4] = [16 << 10, 64 << 10, 256 << 10, 1 << 20];
/// The modes, as `HOTLOOP_URING_SEND_ZC` values (`None`: unset).
const MODES: [(&str, Option<&str>); 3] =
    [("off", Some("0")), ("on", None), ("always", Some("always"))];

/// Nanoseconds of this thread's CPU time.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A receiver on loopback that reads and discards every connection's bytes.
fn local_receiver() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

/// One run: `total` bytes in writes of `size` with the switch at `mode`.
/// Returns (CPU ns per MiB, wall ns per MiB, zero-copy sends, copied ones).
fn run(peer: SocketAddr, size: usize, total: usize, mode: Option<&str>) -> (f64, f64, u64, u64) {
    // The switches are read when a runtime is built; the bench's other
    // threads (receivers) never read the environment.
    match mode {
        Some(v) => std::env::set_var("HOTLOOP_URING_SEND_ZC", v),
        None => std::env::remove_var("HOTLOOP_URING_SEND_ZC"),
    }
    std::env::set_var("HOTLOOP_URING_SEND_ZC_MIN_BYTES", "4096");
    let rt = Runtime::builder().workers(1).driver(DriverKind::Uring).build().unwrap();
    let buf: Arc<[u8]> = (0..size).map(|i| i as u8).collect();
    let (cpu, wall) = rt.block_on(async move {
        let s = TcpStream::connect(peer).await.unwrap();
        let (cpu, wall) = (thread_cpu_ns(), Instant::now());
        let mut sent = 0;
        while sent < total {
            let (res, _) = s.write_all_owned(buf.clone()).await;
            res.unwrap();
            sent += size;
        }
        (thread_cpu_ns() - cpu, wall.elapsed().as_nanos() as u64)
    });
    let stats = rt.stats().total;
    let mib = total as f64 / f64::from(1 << 20);
    (cpu as f64 / mib, wall as f64 / mib, stats.send_zc, stats.send_zc_copied)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let mib: usize = std::env::var("MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
    let peer = match std::env::var("SEND_ZC_PEER") {
        Ok(p) => p.parse().expect("SEND_ZC_PEER: host:port"),
        Err(_) => local_receiver(),
    };
    println!("send_zc: {mib} MiB per run, {rounds} rounds, receiver {peer}");
    println!(
        "{:>8} {:>7} {:>12} {:>12} {:>10} {:>10}",
        "size", "mode", "cpu ms/GiB", "wall ms/GiB", "zc sends", "copied"
    );
    for size in SIZES {
        let mut cpu = vec![Vec::new(); MODES.len()];
        let mut wall = vec![Vec::new(); MODES.len()];
        let mut counts = vec![(0, 0); MODES.len()];
        for round in 0..rounds {
            // Interleaved, and in a different order each round.
            for k in 0..MODES.len() {
                let m = (k + round) % MODES.len();
                let (c, w, zc, copied) = run(peer, size, mib << 20, MODES[m].1);
                cpu[m].push(c);
                wall[m].push(w);
                counts[m] = (counts[m].0 + zc, counts[m].1 + copied);
            }
        }
        for (m, (name, _)) in MODES.iter().enumerate() {
            println!(
                "{:>7}K {:>7} {:>12.1} {:>12.1} {:>10} {:>10}",
                size >> 10,
                name,
                median(cpu[m].clone()) * 1024.0 / 1e6,
                median(wall[m].clone()) * 1024.0 / 1e6,
                counts[m].0,
                counts[m].1
            );
        }
    }
}
