//! Small-file reads, side by side: open, read 4 KiB, close, on hotloop's
//! io_uring driver (ring operations), hotloop's epoll driver (the blocking
//! pool) and `tokio::fs` (tokio's blocking pool), one runtime thread each.
//!
//! ```sh
//! scripts/bench_fs_read.sh [SECONDS] [ROUNDS] [TASKS]
//! ```
//!
//! `TASKS` tasks (64 by default) each loop over 256 files of 4 KiB (in the
//! page cache after the first pass) with `File::open` + one 4 KiB read +
//! drop. Rows run interleaved, `ROUNDS` times (5); the table shows the
//! medians: reads per second, and reads per second of CPU time the whole
//! process used (`/proc/self/stat` utime + stime: the runtime thread, the
//! blocking pool's threads and the kernel's io_uring workers), which is
//! the per-core figure.

use std::cell::Cell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

const FILES: usize = 256;
const FILE_BYTES: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Row {
    HotloopUring,
    HotloopEpoll,
    Tokio,
}

impl Row {
    fn name(self) -> &'static str {
        match self {
            Row::HotloopUring => "hotloop io_uring",
            Row::HotloopEpoll => "hotloop epoll",
            Row::Tokio => "tokio::fs",
        }
    }
}

/// The process's CPU time so far (all threads), in seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The command name may hold spaces: fields count from after its `)`.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn paths(dir: &std::path::Path) -> Rc<Vec<PathBuf>> {
    Rc::new((0..FILES).map(|i| dir.join(format!("f{i}"))).collect())
}

/// Runs the row for `secs`; returns (reads, wall seconds, CPU seconds).
fn run(row: Row, dir: &std::path::Path, secs: f64, tasks: usize) -> (u64, f64, f64) {
    let paths = paths(dir);
    let done = Rc::new(Cell::new(0u64));
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    match row {
        Row::HotloopUring | Row::HotloopEpoll => {
            let kind = if row == Row::HotloopUring {
                hotloop::DriverKind::Uring
            } else {
                hotloop::DriverKind::Epoll
            };
            let rt = hotloop::Runtime::builder().workers(1).driver(kind).build().unwrap();
            rt.block_on(async {
                let mut handles = Vec::new();
                for t in 0..tasks {
                    let (paths, done) = (paths.clone(), done.clone());
                    handles.push(hotloop::spawn(async move {
                        let mut i = t;
                        let mut buf = Vec::with_capacity(FILE_BYTES);
                        while Instant::now() < until {
                            let file = hotloop::fs::File::open(&paths[i % FILES]).await.unwrap();
                            let (res, b) = file.read_at(buf, 0).await;
                            assert_eq!(res.unwrap(), FILE_BYTES);
                            buf = b;
                            drop(file);
                            done.set(done.get() + 1);
                            i += 7;
                        }
                    }));
                }
                for h in handles {
                    h.await.unwrap();
                }
            });
        }
        Row::Tokio => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, async {
                use tokio::io::AsyncReadExt;
                let mut handles = Vec::new();
                for t in 0..tasks {
                    let (paths, done) = (paths.clone(), done.clone());
                    handles.push(tokio::task::spawn_local(async move {
                        let mut i = t;
                        let mut buf = vec![0u8; FILE_BYTES];
                        while Instant::now() < until {
                            let mut file = tokio::fs::File::open(&paths[i % FILES]).await.unwrap();
                            let n = file.read(&mut buf).await.unwrap();
                            assert_eq!(n, FILE_BYTES);
                            drop(file);
                            done.set(done.get() + 1);
                            i += 7;
                        }
                    }));
                }
                for h in handles {
                    h.await.unwrap();
                }
            });
        }
    }
    (done.get(), t0.elapsed().as_secs_f64(), cpu_seconds() - cpu0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let secs: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let rounds: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
    let tasks: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
    let dir = std::env::temp_dir().join(format!("hotloop-fs-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..FILES {
        std::fs::write(dir.join(format!("f{i}")), vec![i as u8; FILE_BYTES]).unwrap();
    }
    let rows = [Row::HotloopUring, Row::HotloopEpoll, Row::Tokio];
    // Warm the page cache and the pools.
    for row in rows {
        run(row, &dir, 0.5, tasks);
    }
    let mut rate = vec![Vec::new(); rows.len()];
    let mut per_cpu = vec![Vec::new(); rows.len()];
    for round in 0..rounds {
        for (k, row) in rows.iter().enumerate() {
            let (n, wall, cpu) = run(*row, &dir, secs, tasks);
            rate[k].push(n as f64 / wall);
            per_cpu[k].push(n as f64 / cpu.max(0.01));
        }
        eprintln!("round {} done", round + 1);
    }
    let tokio_rate = median(rate[2].clone());
    let tokio_cpu = median(per_cpu[2].clone());
    println!(
        "{:<18} {:>12} {:>16} {:>14} {:>16}",
        "row", "reads/s", "reads/CPU-s", "rate vs tokio", "per-CPU vs tokio"
    );
    for (k, row) in rows.iter().enumerate() {
        let (r, c) = (median(rate[k].clone()), median(per_cpu[k].clone()));
        println!(
            "{:<18} {:>12.0} {:>16.0} {:>13.2}x {:>15.2}x",
            row.name(),
            r,
            c,
            r / tokio_rate,
            c / tokio_cpu
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
