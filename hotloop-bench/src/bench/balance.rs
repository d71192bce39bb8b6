//! `balance`: two workers, a few heavy long-lived connections among light
//! ones, placed by the kernel's `SO_REUSEPORT` hash, by hotloop's
//! load-aware hand-off, or by an `exact_balance`-style connection count.
//!
//! # Implementation notes
//! - The server is `hotloop serve echo` with two workers pinned to the
//!   first two CPUs, costing [`WORK_NS_PER_BYTE`] per byte received, so a
//!   heavy connection's [`HEAVY_BYTES`] message costs about 200 µs and a
//!   light one's [`LIGHT_BYTES`] about 2 µs.
//! - One trial opens, [`Timing::stagger`] apart, a group of light keep-alive
//!   connections, then one heavy connection, four times over (light, heavy,
//!   light, heavy, ...), each a load generator of its own sending at a
//!   fixed rate (open loop). The kernel's hash places each connection at
//!   random; a count balance places a heavy connection by the light ones
//!   beside it; the light groups measure their latency after a second of
//!   warm-up, once every heavy connection is sending.
//! - The machine has two CPUs, so the load generators are not pinned and
//!   share them with the server: the figures compare the three placements
//!   under the same disturbance, not absolute latencies.
//! - The three servers run at once (idle between their trials) and each
//!   trial runs against all three in turn, so a slow spell of the shared
//!   machine falls on all of them alike.
//! - Per-worker CPU is read from `/proc/PID/task/*/schedstat` over the
//!   trial, each thread placed by the CPU it last ran on (`stat`; a pinned
//!   worker's thread always last ran on its own CPU); per-worker
//!   connections from the stats endpoint once every connection is open.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use super::report::{Better, Column, LoadReport, Row};
use super::server::{self, ServerSpec, Workload};
use super::{last_line, proc, Ctx, LoadSpec, ScenarioResult, STATS_TIMEOUT_MS};

/// Workers in the server.
pub const WORKERS: usize = 2;
/// Heavy connections per trial.
pub const HEAVY_CONNECTIONS: usize = 4;
/// Bytes per heavy message.
pub const HEAVY_BYTES: usize = 2048;
/// Messages per second each heavy connection sends.
pub const HEAVY_RATE: u64 = 1_200;
/// Light keep-alive connections per group (one group before each heavy one).
pub const LIGHT_CONNECTIONS: u64 = 4;
/// Bytes per light message.
pub const LIGHT_BYTES: usize = 16;
/// Messages per second each light group sends.
pub const LIGHT_RATE: u64 = 500;
/// Server CPU per byte received, nanoseconds.
pub const WORK_NS_PER_BYTE: u64 = 100;
/// Trials per placement, full run.
pub const TRIALS_FULL: usize = 20;
/// Trials per placement with `--quick`.
pub const TRIALS_QUICK: usize = 3;

/// How one trial is laid out in time.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Between one connection group's start and the next.
    pub stagger: Duration,
    /// A light group's warm-up: longer than every group's start, so each
    /// measures only while all heavy connections send.
    pub light_warmup: Duration,
    /// Measured time per light group.
    pub duration: Duration,
    /// How long a heavy connection outlasts the last light group's end.
    pub heavy_margin: Duration,
}

/// The full run's trial.
pub const TIMING_FULL: Timing = Timing {
    stagger: Duration::from_millis(100),
    light_warmup: Duration::from_secs(1),
    duration: Duration::from_secs(2),
    heavy_margin: Duration::from_secs(1),
};

/// A `--quick` trial: the groups start 50 ms apart, all within 0.4 s, so
/// half a second of warm-up still covers them.
pub const TIMING_QUICK: Timing = Timing {
    stagger: Duration::from_millis(50),
    light_warmup: Duration::from_millis(500),
    duration: Duration::from_millis(500),
    heavy_margin: Duration::from_millis(200),
};

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> ScenarioResult {
    let trials = if ctx.quick { TRIALS_QUICK } else { TRIALS_FULL };
    let timing = if ctx.quick { TIMING_QUICK } else { TIMING_FULL };
    let mut result = ScenarioResult::new(
        "balance",
        &format!(
            "{WORKERS} workers; {HEAVY_CONNECTIONS} heavy connections ({HEAVY_BYTES}-byte echo at \
             {HEAVY_RATE}/s each, ~{} µs of work per message) among light ones \
             ({LIGHT_BYTES} bytes at {LIGHT_RATE}/s per group of {LIGHT_CONNECTIONS}); {trials} trials",
            HEAVY_BYTES as u64 * WORK_NS_PER_BYTE / 1000
        ),
        "Envoy's exact_balance balances connection counts, not load; the kernel's reuseport hash \
         balances neither",
        columns(),
    );
    result.setup.push(format!(
        "arrival order per trial: light group, heavy, light group, heavy, ... ({} ms apart); \
         server CPU {WORK_NS_PER_BYTE} ns per byte received; workers pinned to CPUs 0 and 1, load \
         generators unpinned on the same two CPUs",
        timing.stagger.as_millis()
    ));
    result.setup.push(
        "CPU max/min %: the busier and the idler worker's CPU over the trial; imbalance: their \
         difference; figures are medians over trials, with min, max and spread beside them"
            .into(),
    );
    let (saved_workers, saved_cpus, saved_load) =
        (ctx.workers, ctx.server_cpus.clone(), ctx.load_cpu);
    ctx.workers = WORKERS;
    ctx.load_cpu = None;
    ctx.server_cpus = proc::allowed_cpus().into_iter().take(WORKERS).collect();
    let drivers: &[&str] = if ctx.quick { &["uring"] } else { &["uring", "epoll"] };
    for driver in drivers {
        let specs: Vec<ServerSpec> = ["kernel", "load", "count"]
            .iter()
            .map(|balance| {
                ServerSpec::hotloop(
                    &format!("{driver} {balance}"),
                    &[
                        "--driver",
                        driver,
                        "--balance",
                        balance,
                        "--work-ns-per-byte",
                        &WORK_NS_PER_BYTE.to_string(),
                    ],
                )
            })
            .collect();
        result.rows.extend(measure_interleaved(ctx, &specs, trials, timing));
    }
    for row in &mut result.rows {
        row.workers = Some(WORKERS);
    }
    // The default placement; there are no peers, so the table is the comparison.
    result.compare_as(&["uring load", "epoll load"]);
    ctx.workers = saved_workers;
    ctx.server_cpus = saved_cpus;
    ctx.load_cpu = saved_load;
    result
}

/// The table's columns; the first is the headline.
pub fn columns() -> Vec<Column> {
    let col = |key, header, decimals, better| Column { key, header, decimals, better };
    vec![
        col("light_p99_ms", "light p99 ms", 2, Better::Lower),
        col("light_p50_ms", "light p50 ms", 3, Better::Lower),
        col("cpu_imbalance_pct", "CPU imbalance %", 0, Better::Lower),
        col("cpu_max_pct", "CPU max %", 0, Better::Lower),
        col("cpu_min_pct", "CPU min %", 0, Better::Higher),
        col("conns_max", "conns max", 0, Better::Lower),
        col("conns_min", "conns min", 0, Better::Higher),
        col("handoffs", "hand-offs", 0, Better::Lower),
        col("heavy_rate_pct", "heavy % of offered", 1, Better::Higher),
        col("errors", "errors", 0, Better::Lower),
    ]
}

/// Starts every server of `specs`, then runs trial after trial, each
/// against every server in turn, so that a slow spell of a shared machine
/// falls on all of them alike; one row per server.
fn measure_interleaved(
    ctx: &mut Ctx,
    specs: &[ServerSpec],
    trials: usize,
    timing: Timing,
) -> Vec<Row> {
    let mut rows: Vec<Row> = specs.iter().map(|s| Row::new("", &s.server, &s.config)).collect();
    if let Some(why) = &ctx.load_missing {
        for row in &mut rows {
            row.unavailable = Some(why.clone());
        }
        return rows;
    }
    let work = Workload { proto: "echo".into(), body_size: LIGHT_BYTES, work_us: 0 };
    let mut running = Vec::new();
    for (spec, row) in specs.iter().zip(&mut rows) {
        ctx.progress(&format!("{} {}: starting", spec.server, spec.config));
        match server::start(ctx, spec, &work) {
            Ok(r) => running.push(Some(r)),
            Err(why) => {
                row.unavailable = Some(why);
                running.push(None);
            }
        }
    }
    let (light, heavy) = loads(timing);
    ctx.note_load(&light, "echo");
    ctx.note_load(&heavy, "echo");
    let mut samples: Vec<Vec<BTreeMap<String, f64>>> = vec![Vec::new(); specs.len()];
    for trial in 1..=trials {
        for (i, spec) in specs.iter().enumerate() {
            let Some(server) = &running[i] else { continue };
            let title = format!("{} {}", spec.server, spec.config);
            match run_trial(ctx, server, &light, &heavy, timing.stagger, &title) {
                Ok(f) => {
                    ctx.progress(&format!(
                        "{title}: trial {trial}/{trials}: light p99 {:.2} ms, CPU {:.0}% / {:.0}%, hand-offs {}",
                        f.get("light_p99_ms").copied().unwrap_or(f64::NAN),
                        f.get("cpu_max_pct").copied().unwrap_or(f64::NAN),
                        f.get("cpu_min_pct").copied().unwrap_or(f64::NAN),
                        f.get("handoffs").copied().unwrap_or(f64::NAN),
                    ));
                    samples[i].push(f);
                }
                Err(e) => rows[i].notes.push(format!("trial {trial}: {e}")),
            }
        }
    }
    for (i, row) in rows.iter_mut().enumerate() {
        if let Some(server) = running[i].take() {
            row.server_info = server.stats_text();
            super::measure::summarise(row, &samples[i]);
        }
    }
    rows
}

/// The light group's and a heavy connection's load runs.
fn loads(timing: Timing) -> (LoadSpec, LoadSpec) {
    let light = LoadSpec {
        mode: "keepalive",
        connections: LIGHT_CONNECTIONS,
        requests: None,
        duration: timing.duration,
        size: LIGHT_BYTES,
        rate: Some(LIGHT_RATE),
        sources: 1,
        warmup: timing.light_warmup,
        spin: false,
    };
    // Long enough to outlast the last light group.
    let span = timing.stagger * (2 * HEAVY_CONNECTIONS as u32);
    let heavy = LoadSpec {
        mode: "keepalive",
        connections: 1,
        requests: None,
        duration: timing.duration + timing.light_warmup + timing.heavy_margin + span,
        size: HEAVY_BYTES,
        rate: Some(HEAVY_RATE),
        sources: 1,
        warmup: Duration::ZERO,
        spin: false,
    };
    (light, heavy)
}

fn run_trial(
    ctx: &mut Ctx,
    running: &server::Running,
    light: &LoadSpec,
    heavy: &LoadSpec,
    stagger: Duration,
    title: &str,
) -> Result<BTreeMap<String, f64>, String> {
    let pid = running.pid().ok_or("the server has no process")?;
    let stats_before = running.stats().unwrap_or_default();
    let cpu_before = worker_cpu_seconds(pid, &ctx.server_cpus);
    let started = Instant::now();
    let mut lights = Vec::new();
    let mut heavies = Vec::new();
    for _ in 0..HEAVY_CONNECTIONS {
        lights.push(spawn_load(ctx, running, light, &format!("light-{title}")));
        std::thread::sleep(stagger);
        heavies.push(spawn_load(ctx, running, heavy, &format!("heavy-{title}")));
        std::thread::sleep(stagger);
    }
    // Every connection is open and sending: where did they land?
    std::thread::sleep(Duration::from_millis(300));
    let conns = worker_connections(running);
    let lights: Vec<LoadReport> = lights.into_iter().map(join).collect::<Result<_, _>>()?;
    let heavies: Vec<LoadReport> = heavies.into_iter().map(join).collect::<Result<_, _>>()?;
    let wall = started.elapsed().as_secs_f64();
    let cpu_after = worker_cpu_seconds(pid, &ctx.server_cpus);
    let stats_after = running.stats().unwrap_or_default();
    let cpu: Vec<f64> =
        cpu_after.iter().zip(&cpu_before).map(|(a, b)| 100.0 * (a - b) / wall).collect();
    let handoffs = stats_after.get("handoffs_out").copied().unwrap_or(0.0)
        - stats_before.get("handoffs_out").copied().unwrap_or(0.0);
    Ok(trial_figures(&lights, &heavies, &cpu, &conns, handoffs))
}

/// One trial's figures: from the light groups' and the heavy connections'
/// reports, each worker's CPU in percent and its connections, and the
/// hand-offs the server counted.
pub fn trial_figures(
    lights: &[LoadReport],
    heavies: &[LoadReport],
    cpu: &[f64],
    conns: &[f64],
    handoffs: f64,
) -> BTreeMap<String, f64> {
    let mut f = BTreeMap::new();
    let p50s: Vec<f64> = lights.iter().map(|r| r.latency_us.p50 / 1000.0).collect();
    f.insert("light_p50_ms".into(), super::report::median(&p50s));
    let p99 = lights.iter().map(|r| r.latency_us.p99 / 1000.0).fold(0.0, f64::max);
    f.insert("light_p99_ms".into(), p99);
    if cpu.len() == WORKERS {
        let (max, min) = (
            cpu.iter().copied().fold(0.0, f64::max),
            cpu.iter().copied().fold(f64::INFINITY, f64::min),
        );
        f.insert("cpu_max_pct".into(), max);
        f.insert("cpu_min_pct".into(), min);
        f.insert("cpu_imbalance_pct".into(), max - min);
    }
    if conns.len() == WORKERS {
        f.insert("conns_max".into(), conns.iter().copied().fold(0.0, f64::max));
        f.insert("conns_min".into(), conns.iter().copied().fold(f64::INFINITY, f64::min));
    }
    f.insert("handoffs".into(), handoffs);
    let offered = (HEAVY_RATE * HEAVY_CONNECTIONS as u64) as f64;
    let heavy_rate: f64 = heavies.iter().map(|r| r.rate_per_s).sum();
    f.insert("heavy_rate_pct".into(), 100.0 * heavy_rate / offered);
    let errors: u64 = lights.iter().chain(heavies).map(LoadReport::errors_total).sum();
    f.insert("errors".into(), errors as f64);
    let attempts: u64 = lights.iter().chain(heavies).map(|r| r.completed).sum::<u64>() + errors;
    let error_pct = if attempts == 0 { 0.0 } else { 100.0 * errors as f64 / attempts as f64 };
    f.insert(super::report::METRIC_ERROR_PCT.into(), error_pct);
    // The light groups' latencies are the figures; a heavy connection that
    // fell behind shows in "heavy % of offered".
    let behind = lights.iter().any(LoadReport::behind_schedule);
    f.insert(super::report::METRIC_BEHIND.into(), if behind { 1.0 } else { 0.0 });
    f
}

type LoadThread = std::thread::JoinHandle<Result<LoadReport, String>>;

fn spawn_load(ctx: &mut Ctx, running: &server::Running, load: &LoadSpec, name: &str) -> LoadThread {
    let mut cmd = Command::new(&ctx.exe);
    cmd.arg("load").args(load.args(running.addr, "echo", None));
    let log = ctx.log_path(&format!("load-{name}"));
    let timeout = load.timeout();
    let name = name.to_string();
    std::thread::spawn(move || {
        let (status, stdout) =
            proc::run_bounded(&name, cmd, &[], &log, timeout).map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("{name} load {status}: {}", last_line(&log)));
        }
        LoadReport::parse(&stdout)
    })
}

fn join(t: LoadThread) -> Result<LoadReport, String> {
    t.join().map_err(|_| "a load thread panicked".to_string())?
}

/// CPU seconds of each worker thread (`schedstat`, nanoseconds), by
/// worker: the position in `cpus` (the servers' CPUs) of the CPU it is
/// pinned to.
fn worker_cpu_seconds(pid: u32, cpus: &[usize]) -> Vec<f64> {
    let mut by_worker = vec![0.0; WORKERS];
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("hotloop-worker") {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        let Ok(sched) = std::fs::read_to_string(task.path().join("schedstat")) else { continue };
        let (Some(ns), Some(cpu)) = (proc::parse_schedstat_run_ns(&sched), last_cpu(&stat)) else {
            continue;
        };
        let worker = cpus.iter().position(|&c| c == cpu);
        if let Some(slot) = worker.and_then(|w| by_worker.get_mut(w)) {
            *slot += ns as f64 / 1e9;
        }
    }
    by_worker
}

/// Field 39 of `/proc/PID/task/TID/stat`: the CPU the thread last ran on.
fn last_cpu(stat: &str) -> Option<usize> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ")" comes field 3: field 39 is the 37th of those.
    rest.split_ascii_whitespace().nth(36)?.parse().ok()
}

/// Each worker's open connections, from the stats endpoint.
fn worker_connections(running: &server::Running) -> Vec<f64> {
    let Some(addr) = running.stats_addr else { return Vec::new() };
    let Ok(body) = proc::http_get(addr, "/stats", Duration::from_millis(STATS_TIMEOUT_MS)) else {
        return Vec::new();
    };
    let value: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let Some(workers) = value.get("workers").and_then(|w| w.as_array()) else { return Vec::new() };
    workers.iter().take(WORKERS).filter_map(|w| w.get("load_connections")?.as_f64()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_last_cpu_of_a_thread() {
        let mut stat = String::from("12 (hotloop-worker) S");
        for i in 4..=52 {
            stat.push_str(&format!(" {}", if i == 39 { 1 } else { 0 }));
        }
        assert_eq!(last_cpu(&stat), Some(1));
    }
}
