//! Spawning and joining tasks: hotloop's `JoinSet` and `JoinHandle`
//! against tokio's, side by side in one run.
//!
//! Both run on the calling thread (hotloop's `block_on` context, tokio's
//! current-thread runtime), so the thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`) is the whole cost, and time spent
//! descheduled on a shared machine is left out. Each round runs every
//! scenario on both runtimes, alternating which goes first; the report
//! gives the median per scenario, in nanoseconds per task.
//!
//! The last scenario awaits `spawn_blocking` jobs one at a time: each is a
//! round trip to a pool thread, so it reports the whole process's CPU
//! time and the wall-clock time per job instead.
//!
//! Run with `cargo bench -p hotloop --bench join`; `ROUNDS` sets the
//! number of rounds (default 9).

use std::hint::black_box;

/// Tasks per scenario run.
const TASKS: u64 = 10_000;

/// Nanoseconds of CPU time of `clock` (this thread's, or the process's).
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime({clock})");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Nanoseconds of CPU time this thread has used.
fn cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU nanoseconds per task of `f`.
fn per_task(f: impl FnOnce()) -> f64 {
    let start = cpu_ns();
    f();
    (cpu_ns() - start) as f64 / TASKS as f64
}

fn hotloop_set(rt: &hotloop::Runtime) -> f64 {
    per_task(|| {
        rt.block_on(async {
            let mut set = hotloop::task::JoinSet::new();
            for i in 0..TASKS {
                set.spawn(async move { black_box(i) });
            }
            let mut sum = 0;
            while let Some(r) = set.join_next().await {
                sum += r.unwrap();
            }
            black_box(sum);
        })
    })
}

fn tokio_set(rt: &tokio::runtime::Runtime) -> f64 {
    per_task(|| {
        rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for i in 0..TASKS {
                set.spawn(async move { black_box(i) });
            }
            let mut sum = 0;
            while let Some(r) = set.join_next().await {
                sum += r.unwrap();
            }
            black_box(sum);
        })
    })
}

fn hotloop_handles(rt: &hotloop::Runtime) -> f64 {
    per_task(|| {
        rt.block_on(async {
            for i in 0..TASKS {
                black_box(hotloop::spawn(async move { black_box(i) }).await.unwrap());
            }
        })
    })
}

fn tokio_handles(rt: &tokio::runtime::Runtime) -> f64 {
    per_task(|| {
        rt.block_on(async {
            for i in 0..TASKS {
                black_box(tokio::spawn(async move { black_box(i) }).await.unwrap());
            }
        })
    })
}

/// Jobs per `spawn_blocking` run: each is a round trip to another thread.
const JOBS: u64 = 2_000;

/// CPU nanoseconds of the whole process per job of `f`, and wall-clock
/// nanoseconds per job: a blocking job runs on another thread, so the
/// calling thread's CPU alone would leave half the cost out.
fn per_job(f: impl FnOnce()) -> (f64, f64) {
    let (cpu0, wall0) = (clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID), std::time::Instant::now());
    f();
    let cpu = clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    let wall = wall0.elapsed().as_nanos() as u64;
    (cpu as f64 / JOBS as f64, wall as f64 / JOBS as f64)
}

fn hotloop_blocking(rt: &hotloop::Runtime) -> (f64, f64) {
    per_job(|| {
        rt.block_on(async {
            for i in 0..JOBS {
                black_box(hotloop::spawn_blocking(move || black_box(i)).await.unwrap());
            }
        })
    })
}

fn tokio_blocking(rt: &tokio::runtime::Runtime) -> (f64, f64) {
    per_job(|| {
        rt.block_on(async {
            for i in 0..JOBS {
                black_box(tokio::task::spawn_blocking(move || black_box(i)).await.unwrap());
            }
        })
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(9);
    let hl = hotloop::Runtime::builder().workers(1).build().expect("hotloop runtime");
    let tk = tokio::runtime::Builder::new_current_thread().build().expect("tokio runtime");
    let (mut hs, mut ts, mut hh, mut th) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut hb, mut tb) = (Vec::new(), Vec::new());
    // One warm-up round each, not counted.
    hotloop_set(&hl);
    tokio_set(&tk);
    for round in 0..rounds {
        if round % 2 == 0 {
            hs.push(hotloop_set(&hl));
            ts.push(tokio_set(&tk));
            hh.push(hotloop_handles(&hl));
            th.push(tokio_handles(&tk));
            hb.push(hotloop_blocking(&hl));
            tb.push(tokio_blocking(&tk));
        } else {
            ts.push(tokio_set(&tk));
            hs.push(hotloop_set(&hl));
            th.push(tokio_handles(&tk));
            hh.push(hotloop_handles(&hl));
            tb.push(tokio_blocking(&tk));
            hb.push(hotloop_blocking(&hl));
        }
    }
    println!("{TASKS} tasks, {rounds} rounds, median CPU ns per task (hotloop / tokio):");
    let (hs, ts, hh, th) = (median(hs), median(ts), median(hh), median(th));
    println!("JoinSet spawn + join_next: {hs:8.1} / {ts:8.1}  ({:.2}x)", hs / ts);
    println!("spawn + await JoinHandle:  {hh:8.1} / {th:8.1}  ({:.2}x)", hh / th);
    let cpu = |v: &[(f64, f64)]| median(v.iter().map(|x| x.0).collect());
    let wall = |v: &[(f64, f64)]| median(v.iter().map(|x| x.1).collect());
    let (hc, tc, hw, tw) = (cpu(&hb), cpu(&tb), wall(&hb), wall(&tb));
    println!("{JOBS} jobs, spawn_blocking + await, per job: process CPU ns and wall ns (hotloop / tokio):");
    println!("spawn_blocking CPU:        {hc:8.1} / {tc:8.1}  ({:.2}x)", hc / tc);
    println!("spawn_blocking wall:       {hw:8.1} / {tw:8.1}  ({:.2}x)", hw / tw);
}
