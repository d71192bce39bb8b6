//! `storm`: the DragonFly experiment as the seed ran it. Established
//! keep-alive connections send requests open-loop at a fixed rate while a
//! storm of new one-request connections saturates the server; the figure
//! is what the storm does to the established connections' latency,
//! measured from each request's intended send, with the accept bound
//! unlimited, 32 and paced by the loop's lag.
//!
//! # Implementation notes
//! - Two load generators run at once on the load CPU: `established`
//!   (keepalive, `--rate`, a warm-up so its connections are up before the
//!   storm) and `storm` (churn, closed loop). The storm starts a moment
//!   after the established load and outlasts it, so it covers the whole
//!   measured window.
//! - The storm has as many clients as the seed's 30,000 where the
//!   open-file limit allows (`--storm-clients` sets another count): the
//!   generator holds one descriptor per client and the server one per
//!   connection it has accepted, and each process must fit under the limit,
//!   less [`STORM_FDS_RESERVED`] for everything else. At 20,000 (this
//!   project's development machine) that is 19,000 clients, far more than
//!   the listen backlog (4,096): the kernel drops the handshakes that find
//!   the accept queue full, counted as "listen overflows", and their
//!   clients retry after 1 s and 3 s or fail their connect.
//! - Every request costs the server [`WORK_US`] of CPU, established or not,
//!   so the server, not the load generators, is the bottleneck; the table
//!   shows both CPUs.
//! - The established generator separates its own lag from the server's
//!   time (kernel receive timestamps, see `load`'s engine): "server p99"
//!   is each request's latency less the generator's lag, "gen. lag p99" the
//!   lag itself. Both generators share one CPU, so a storm generator that
//!   holds it shows there, not as the server's tail.
//! - With more than one worker (`--workers`), hotloop's rows also show how
//!   its workers split the connections (each worker's accepted, less those
//!   it handed off, plus those handed to it), read from the stats
//!   endpoint around each repeat.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use super::report::{self, Better, Column, LoadReport, Row};
use super::server::{self, ServerKind, ServerSpec, Workload};
use super::{
    find_on_path, last_line, proc, Ctx, LoadSpec, PeerName, ScenarioResult, METRIC_CPU_UTIL,
};

/// Established keep-alive connections.
pub const ESTABLISHED_CONNECTIONS: u64 = 64;
/// Requests per second the established connections send together.
pub const ESTABLISHED_RATE: u64 = 4_000;
/// Storm clients in the seed experiment (30,000 concurrent connections).
pub const STORM_CLIENTS_SEED: u64 = 30_000;
/// Storm clients with `--quick`.
pub const STORM_CLIENTS_QUICK: u64 = 500;
/// Descriptors of the open-file limit left out of the storm's clients: the
/// established connections, and what the server (listener, stats endpoint,
/// poller, rings, log) and the generator (poller, alarm, standard streams)
/// hold besides.
pub const STORM_FDS_RESERVED: u64 = 1_000;
/// CPU microseconds the server spends per request.
pub const WORK_US: u64 = 30;
/// Response body bytes (the seed's 1K object).
pub const BODY_BYTES: usize = 1024;

/// How one repeat is laid out in time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// The established load's warm-up, during which its connections open.
    pub warmup: Duration,
    /// The established load's measured time.
    pub duration: Duration,
    /// How long after the established load the storm starts.
    pub storm_delay: Duration,
    /// How long the storm outlasts the established load.
    pub storm_margin: Duration,
}

/// The full run's repeat.
pub const TIMING_FULL: Timing = Timing {
    warmup: Duration::from_secs(1),
    duration: Duration::from_secs(10),
    storm_delay: Duration::from_millis(500),
    storm_margin: Duration::from_millis(500),
};

/// A `--quick` repeat.
pub const TIMING_QUICK: Timing = Timing {
    warmup: Duration::from_millis(500),
    duration: Duration::from_secs(1),
    storm_delay: Duration::from_millis(250),
    storm_margin: Duration::from_millis(250),
};

/// How many storm clients to run, and why if that is not what was asked
/// for: `asked` (`--storm-clients`), else the seed's count (500 with
/// `--quick`), at most what `fd_limit` (the open-file limit of each
/// process) holds beside [`STORM_FDS_RESERVED`], in whole thousands.
pub fn storm_clients(asked: Option<u64>, quick: bool, fd_limit: u64) -> (u64, Option<String>) {
    let reserved = STORM_FDS_RESERVED.min(fd_limit / 2);
    let room = fd_limit - reserved;
    let fits = if room >= 1_000 { room / 1_000 * 1_000 } else { room.max(1) };
    let limit = format!(
        "the open-file limit is {fd_limit} per process, and the storm's generator and the server \
         must each fit under it with {reserved} to spare"
    );
    match asked {
        Some(n) if n > fits => {
            (fits, Some(format!("--storm-clients {n} lowered to {fits}: {limit}")))
        }
        Some(n) => (n.max(1), None),
        None if quick => (STORM_CLIENTS_QUICK.min(fits), None),
        None if fits < STORM_CLIENTS_SEED => (
            fits,
            Some(format!("{fits} storm clients, not the seed's {STORM_CLIENTS_SEED}: {limit}")),
        ),
        None => (STORM_CLIENTS_SEED, None),
    }
}

/// The established and the storm load of one repeat.
pub fn loads(clients: u64, timing: Timing) -> (LoadSpec, LoadSpec) {
    let established = LoadSpec {
        mode: "keepalive",
        connections: ESTABLISHED_CONNECTIONS,
        requests: None,
        duration: timing.duration,
        size: BODY_BYTES,
        rate: Some(ESTABLISHED_RATE),
        sources: 1,
        warmup: timing.warmup,
        // The storm's generator shares its CPU: a spinning one would starve it.
        spin: false,
    };
    let storm = LoadSpec {
        mode: "churn",
        connections: clients,
        requests: None,
        duration: (timing.warmup + timing.duration + timing.storm_margin)
            .saturating_sub(timing.storm_delay),
        size: BODY_BYTES,
        rate: None,
        sources: 4,
        warmup: Duration::ZERO,
        spin: false,
    };
    (established, storm)
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> ScenarioResult {
    let (clients, clients_note) = storm_clients(ctx.storm_clients, ctx.quick, ctx.fd_limit);
    let timing = if ctx.quick { TIMING_QUICK } else { TIMING_FULL };
    let mut result = ScenarioResult::new(
        "storm",
        &format!(
            "{ESTABLISHED_CONNECTIONS} established connections at {ESTABLISHED_RATE} req/s open loop \
             beside a storm of {} one-request clients, {WORK_US} µs of work per request",
            report::format_figure(clients as f64, 0)
        ),
        "DragonFly at most 32 accepts per kevent, 30,000 concurrent connections: an unbounded accept \
         batch delays the I/O of connections the server already has; 1K p99 69.02 -> 35.59 ms",
        columns(ctx.workers),
    );
    result.setup.extend(clients_note);
    result.setup.push(
        "established latency runs from each request's intended send (open loop, no coordinated omission); \
         \"server p99\" is that latency less the established generator's own lag, \"gen. lag p99\" the lag \
         (late sends, and replies read late after the kernel's receive timestamp); the storm's latency runs \
         from the start of connect(2) to the last byte of its reply"
            .into(),
    );
    result.setup.push(format!(
        "the server does {WORK_US} µs of work per request; \"server CPU %\" near 100 shows it is the bottleneck; \
         on a shared machine \"server CPU+wait %\" adds the time it was ready to run but another process had \
         its CPU (/proc/PID/task/*/schedstat); \"load CPU %\" is both load generators together on their one CPU; \
         \"req/server CPU-s\" (established and storm requests per second of server CPU) compares throughput \
         when other processes take different shares of the server's CPU from run to run; \"listen overflows\" \
         counts handshakes the kernel dropped because the accept queue was full (TcpExt ListenOverflows)"
    ));
    let work = Workload { proto: "http".into(), body_size: BODY_BYTES, work_us: WORK_US };
    let (established, storm) = loads(clients, timing);
    let specs = server_specs(ctx, &mut result.setup);
    for spec in &specs {
        let row = measure(ctx, spec, &work, &established, &storm, timing.storm_delay);
        result.rows.push(row);
    }
    // The defaults on each driver; nginx and haproxy skip the work per
    // request, so they are reference rows.
    result.compare_as(&["epoll paced (default)", "uring paced (default)"]);
    result
}

/// The table's columns; the first, the established connections' p99, is
/// the headline. With more than one worker, the split of connections
/// between them too.
pub fn columns(workers: usize) -> Vec<Column> {
    let col = |key, header, decimals, better| Column { key, header, decimals, better };
    let mut columns = vec![
        col("est_p99_ms", "est. p99 ms", 2, Better::Lower),
        col("est_p50_ms", "est. p50 ms", 2, Better::Lower),
        col("est_p999_ms", "est. p99.9 ms", 2, Better::Lower),
        col("est_max_ms", "est. max ms", 2, Better::Lower),
        col("est_server_p99_ms", "server p99 ms", 2, Better::Lower),
        col("est_gen_lag_p99_ms", "gen. lag p99 ms", 2, Better::Lower),
        col("est_retransmitted", "est. retransmitted", 0, Better::Lower),
        col("est_rate_pct", "est. % of offered", 1, Better::Higher),
        col("not_sent", "est. not sent", 0, Better::Lower),
        col("storm_rate", "storm conn/s", 0, Better::Higher),
        col("storm_in_flight", "storm in flight", 0, Better::Higher),
        col("storm_p99_ms", "storm p99 ms", 1, Better::Lower),
        col("storm_errors", "storm errors", 0, Better::Lower),
        col("listen_overflows", "listen overflows", 0, Better::Lower),
        col("softnet_drops", "backlog drops", 0, Better::Lower),
        col("req_per_cpu_s", "req/server CPU-s", 0, Better::Higher),
        col(METRIC_CPU_UTIL, "server CPU %", 0, Better::Lower),
        col("server_busy_pct", "server CPU+wait %", 0, Better::Lower),
        col("load_cpu_pct", "load CPU %", 0, Better::Lower),
        col("accepted_per_wakeup", "accepts/wakeup", 1, Better::Lower),
        col("est_errors", "est. errors", 0, Better::Lower),
    ];
    if workers > 1 {
        columns.extend([
            col("busiest_worker_conn_pct", "busiest worker's conn %", 1, Better::Lower),
            col("handed_off_pct", "handed off %", 1, Better::Lower),
        ]);
    }
    columns
}

/// From each worker's stats before and after a run: the share of the
/// connections the busiest worker served, and the share of accepted
/// connections handed to another worker, both in percent.
fn worker_split(
    before: &[BTreeMap<String, f64>],
    after: &[BTreeMap<String, f64>],
) -> Option<(f64, f64)> {
    if before.len() != after.len() || after.len() < 2 {
        return None;
    }
    let delta = |i: usize, k: &str| {
        after[i].get(k).copied().unwrap_or(0.0) - before[i].get(k).copied().unwrap_or(0.0)
    };
    let served: Vec<f64> = (0..after.len())
        .map(|i| delta(i, "accepted") - delta(i, "handoffs_out") + delta(i, "handoffs_in"))
        .collect();
    let accepted: f64 = (0..after.len()).map(|i| delta(i, "accepted")).sum();
    let handed: f64 = (0..after.len()).map(|i| delta(i, "handoffs_out")).sum();
    if accepted <= 0.0 {
        return None;
    }
    let busiest = served.iter().copied().fold(0.0, f64::max);
    Some((100.0 * busiest / accepted, 100.0 * handed / accepted))
}

/// hotloop's accept settings on both drivers, tokio, the floor's two, and
/// nginx and haproxy each with and without a bound, when present.
fn server_specs(ctx: &Ctx, setup: &mut Vec<String>) -> Vec<ServerSpec> {
    let mut specs = Vec::new();
    for driver in ["epoll", "uring"] {
        for (name, args) in [
            ("unlimited", &["--max-accepts", "unlimited", "--accept-pacing", "off"][..]),
            ("max-accepts 32", &["--max-accepts", "32", "--accept-pacing", "off"][..]),
            ("paced (default)", &["--max-accepts", "32", "--accept-pacing", "on"][..]),
            ("paced, cap 256", &["--max-accepts", "256", "--accept-pacing", "on"][..]),
        ] {
            if ctx.quick && name == "paced, cap 256" {
                continue; // --quick keeps to the three settings the table is about
            }
            let mut all = vec!["--driver", driver];
            all.extend_from_slice(args);
            specs.push(ServerSpec::hotloop(&format!("{driver} {name}"), &all));
        }
    }
    if ctx.peers.contains(&PeerName::Tokio) {
        // tokio has no accept bound: its loop accepts whatever is ready.
        specs.push(ServerSpec::peer("tokio"));
    }
    if ctx.peers.contains(&PeerName::Floor) {
        for (name, value) in [("unlimited", "unlimited"), ("max-accepts 32", "32")] {
            specs.push(ServerSpec {
                server: "floor".into(),
                config: name.into(),
                kind: ServerKind::Peer("floor".into(), vec!["--max-accepts".into(), value.into()]),
            });
        }
    }
    let mut others_note = false;
    if ctx.quick {
        setup.push("--quick: nginx and haproxy are left out of this scenario".into());
        return specs;
    }
    if ctx.peers.contains(&PeerName::Nginx) {
        match find_on_path("nginx") {
            Some(program) => {
                for on in [false, true] {
                    specs.push(ServerSpec {
                        server: "nginx".into(),
                        config: format!("multi_accept {}", if on { "on" } else { "off" }),
                        kind: ServerKind::Nginx { program: program.clone(), multi_accept: on },
                    });
                }
                others_note = true;
            }
            None => setup.push("nginx: not found on PATH, not measured".into()),
        }
    }
    if ctx.peers.contains(&PeerName::Haproxy) {
        match find_on_path("haproxy") {
            Some(program) => {
                for (config, value) in [("maxaccept -1 (unlimited)", -1), ("maxaccept 32", 32)] {
                    specs.push(ServerSpec {
                        server: "haproxy".into(),
                        config: config.into(),
                        kind: ServerKind::Haproxy {
                            program: program.clone(),
                            maxaccept: Some(value),
                        },
                    });
                }
                setup.push(format!(
                    "haproxy: maxconn {} (it budgets two files per connection; a process may hold 20,000)",
                    server::HAPROXY_MAXCONN
                ));
                others_note = true;
            }
            None => setup.push("haproxy: not found on PATH, not measured".into()),
        }
    }
    if others_note {
        setup.push(
            "nginx and haproxy serve a static body without the per-request work, so they are not saturated \
             by the same storm; their rows show their accept settings under the same load, not a comparable bottleneck"
                .into(),
        );
    }
    specs
}

/// Starts `spec`, runs both loads `repeats` times, and returns its row.
fn measure(
    ctx: &mut Ctx,
    spec: &ServerSpec,
    work: &Workload,
    established: &LoadSpec,
    storm: &LoadSpec,
    storm_delay: Duration,
) -> Row {
    let config = spec.config.as_str();
    let title = format!("{} {config}", spec.server);
    if let Some(why) = &ctx.load_missing {
        return Row::unavailable("", &spec.server, config, why.clone());
    }
    ctx.progress(&format!("{title}: starting"));
    let mut running = match server::start(ctx, spec, work) {
        Ok(r) => r,
        Err(why) => {
            ctx.progress(&format!("{title}: unavailable: {why}"));
            return Row::unavailable("", &spec.server, config, why);
        }
    };
    ctx.note_load(established, work.load_proto());
    ctx.note_load(storm, work.load_proto());
    let mut row = Row::new("", &spec.server, config);
    row.notes.extend(running.notes.iter().cloned());
    super::measure::mark_row(&mut row, spec, work, &running);
    let mut samples: Vec<BTreeMap<String, f64>> = Vec::new();
    for repeat in 1..=ctx.repeats {
        let stats_before = running.stats();
        let split_before = if ctx.workers > 1 { running.worker_stats() } else { None };
        let tcp_before = proc::tcp_ext_counters().ok();
        let drops_before = proc::softnet_dropped().ok();
        let cpu_before = running.cpu_seconds();
        let wait_before = running.run_queue_wait_seconds();
        let started = Instant::now();
        let outcome = run_both(ctx, &running, work, established, storm, storm_delay, &title);
        let wall_s = started.elapsed().as_secs_f64();
        let cpu_after = running.cpu_seconds();
        let wait_after = running.run_queue_wait_seconds();
        let tcp_after = proc::tcp_ext_counters().ok();
        let drops_after = proc::softnet_dropped().ok();
        let stats_after = running.stats();
        let split_after = if ctx.workers > 1 { running.worker_stats() } else { None };
        match outcome {
            Ok((est, st)) => {
                if est.completed == 0 {
                    let note = format!(
                        "repeat {repeat}: starved: not one established request completed in the {} s run",
                        super::load::secs_arg(established.duration)
                    );
                    row.notes.push(note);
                }
                let mut f = figures(&est, &st, established, wall_s);
                if let (Some(b), Some(a)) = (cpu_before, cpu_after) {
                    let workers = ctx.workers.max(1) as f64;
                    f.insert(METRIC_CPU_UTIL.into(), 100.0 * (a - b) / wall_s / workers);
                    if a > b {
                        let served = (est.completed + st.completed) as f64;
                        f.insert("req_per_cpu_s".into(), served / (a - b));
                    }
                    if let (Some(wb), Some(wa)) = (wait_before, wait_after) {
                        let busy = (a - b) + (wa - wb);
                        f.insert("server_busy_pct".into(), 100.0 * busy / wall_s / workers);
                    }
                }
                if let (Some(b), Some(a)) = (&tcp_before, &tcp_after) {
                    let delta = |k: &str| {
                        a.get(k)
                            .copied()
                            .unwrap_or(0)
                            .saturating_sub(b.get(k).copied().unwrap_or(0))
                    };
                    f.insert("listen_overflows".into(), delta("ListenOverflows") as f64);
                }
                if let (Some(b), Some(a)) = (drops_before, drops_after) {
                    f.insert("softnet_drops".into(), a.saturating_sub(b) as f64);
                }
                if let (Some(b), Some(a)) = (&stats_before, &stats_after) {
                    let delta = |k: &str| {
                        a.get(k).copied().unwrap_or(0.0) - b.get(k).copied().unwrap_or(0.0)
                    };
                    if delta("accept_wakeups") > 0.0 {
                        f.insert(
                            "accepted_per_wakeup".into(),
                            delta("accepted") / delta("accept_wakeups"),
                        );
                    }
                }
                if let (Some(b), Some(a)) = (&split_before, &split_after) {
                    if let Some((busiest, handed)) = worker_split(b, a) {
                        f.insert("busiest_worker_conn_pct".into(), busiest);
                        f.insert("handed_off_pct".into(), handed);
                    }
                }
                let figure =
                    |k: &str, d| report::format_figure(f.get(k).copied().unwrap_or(f64::NAN), d);
                ctx.progress(&format!(
                    "{title}: repeat {repeat}/{}: established p99 {} ms (server {}, generator lag {}), \
                     {}% of offered; storm {} conn/s; server CPU {}%",
                    ctx.repeats,
                    figure("est_p99_ms", 2),
                    figure("est_server_p99_ms", 2),
                    figure("est_gen_lag_p99_ms", 2),
                    figure("est_rate_pct", 1),
                    figure("storm_rate", 0),
                    figure(METRIC_CPU_UTIL, 0),
                ));
                samples.push(f);
            }
            Err(e) => {
                ctx.progress(&format!("{title}: repeat {repeat} failed: {e}"));
                row.notes.push(format!("repeat {repeat}: {e}"));
            }
        }
        if running.exited() {
            row.notes.push("the server exited during the run".into());
            break;
        }
    }
    row.server_info = running.stats_text();
    drop(running);
    super::measure::summarise(&mut row, &samples);
    row
}

/// The row's figures from one repeat.
pub fn figures(
    est: &LoadReport,
    st: &LoadReport,
    established: &LoadSpec,
    wall_s: f64,
) -> BTreeMap<String, f64> {
    let offered = established.rate.unwrap_or(0) as f64;
    let mut f = BTreeMap::new();
    // With no request completed the latencies are unknown, not zero: left out.
    if est.completed > 0 {
        f.insert("est_p50_ms".into(), est.latency_us.p50 / 1000.0);
        f.insert("est_p99_ms".into(), est.latency_us.p99 / 1000.0);
        f.insert("est_p999_ms".into(), est.latency_us.p999 / 1000.0);
        f.insert("est_max_ms".into(), est.latency_us.max / 1000.0);
        if let Some(server) = &est.server_latency_us {
            f.insert("est_server_p50_ms".into(), server.p50 / 1000.0);
            f.insert("est_server_p99_ms".into(), server.p99 / 1000.0);
            f.insert("est_server_p999_ms".into(), server.p999 / 1000.0);
        }
        if let Some(lag) = &est.generator_lag_us {
            f.insert("est_gen_lag_p50_ms".into(), lag.p50 / 1000.0);
            f.insert("est_gen_lag_p99_ms".into(), lag.p99 / 1000.0);
            f.insert("est_gen_lag_max_ms".into(), lag.max / 1000.0);
        }
    }
    if let Some(n) = est.retransmitted {
        f.insert("est_retransmitted".into(), n as f64);
    }
    f.insert("storm_in_flight".into(), st.max_in_flight as f64);
    if offered > 0.0 {
        f.insert("est_rate_pct".into(), 100.0 * est.rate_per_s / offered);
    }
    f.insert("storm_rate".into(), st.rate_per_s);
    f.insert("storm_p99_ms".into(), st.latency_us.p99 / 1000.0);
    f.insert("storm_p50_ms".into(), st.latency_us.p50 / 1000.0);
    if let Some(q) = &st.request_latency_us {
        f.insert("storm_req_p99_ms".into(), q.p99 / 1000.0);
    }
    f.insert("load_cpu_pct".into(), 100.0 * (est.cpu_s + st.cpu_s) / wall_s);
    f.insert("errors".into(), (est.errors_total() + st.errors_total()) as f64);
    // The storm's failed connects are what a storm does (a full accept
    // queue); the established connections' errors are what a row's ratios
    // must not hide, and their schedule is the one that must hold.
    f.insert(report::METRIC_ERROR_PCT.into(), est.error_pct());
    if let (Some(offered), Some(not_sent)) = (est.offered, est.not_sent) {
        f.insert("offered".into(), offered as f64);
        f.insert("not_sent".into(), not_sent as f64);
        let behind = if est.behind_schedule() { 1.0 } else { 0.0 };
        f.insert(report::METRIC_BEHIND.into(), behind);
    }
    f.insert("est_errors".into(), est.errors_total() as f64);
    f.insert("storm_errors".into(), st.errors_total() as f64);
    f
}

/// Runs the established load and, `storm_delay` later, the storm, both
/// bounded in time; returns their reports.
fn run_both(
    ctx: &mut Ctx,
    running: &server::Running,
    work: &Workload,
    established: &LoadSpec,
    storm: &LoadSpec,
    storm_delay: Duration,
    title: &str,
) -> Result<(LoadReport, LoadReport), String> {
    let pin = ctx.load_cpu;
    let proto = work.load_proto();
    let start = |ctx: &mut Ctx, load: &LoadSpec, name: &str| {
        let mut cmd = Command::new(&ctx.exe);
        cmd.arg("load").args(load.args(running.addr, proto, pin));
        let log = ctx.log_path(&format!("load-{name}-{title}"));
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
    };
    let est = start(ctx, established, "established");
    std::thread::sleep(storm_delay);
    let st = start(ctx, storm, "storm");
    let est = est.join().map_err(|_| "the established load's thread panicked".to_string())?;
    let st = st.join().map_err(|_| "the storm load's thread panicked".to_string())?;
    Ok((est?, st?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(accepted: f64, out: f64, handed_in: f64) -> BTreeMap<String, f64> {
        [("accepted", accepted), ("handoffs_out", out), ("handoffs_in", handed_in)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    #[test]
    fn worker_split_counts_hand_offs_where_they_are_served() {
        let before = [worker(10.0, 0.0, 0.0), worker(10.0, 0.0, 0.0)];
        // Worker 0 accepted 700 and handed 100 to worker 1, which accepted 300.
        let after = [worker(710.0, 100.0, 0.0), worker(310.0, 0.0, 100.0)];
        let (busiest, handed) = worker_split(&before, &after).unwrap();
        assert!((busiest - 60.0).abs() < 1e-9 && (handed - 10.0).abs() < 1e-9);
        assert!(worker_split(&before[..1], &after[..1]).is_none());
        assert!(worker_split(&before, &before).is_none());
    }

    #[test]
    fn split_columns_only_with_more_than_one_worker() {
        let has = |w| columns(w).iter().any(|c| c.key == "busiest_worker_conn_pct");
        assert!(!has(1) && has(2));
    }

    #[test]
    fn the_storm_is_as_large_as_the_open_file_limit_allows() {
        // Here: 20,000 per process, so 19,000 clients, and a note saying why
        // not the seed's 30,000.
        let (n, note) = storm_clients(None, false, 20_000);
        assert_eq!(n, 19_000);
        assert!(note.unwrap().contains("not the seed's 30000"));
        assert_eq!(storm_clients(None, false, 1_048_576), (STORM_CLIENTS_SEED, None));
        assert_eq!(storm_clients(None, true, 20_000), (STORM_CLIENTS_QUICK, None));
        // Asked for: taken as is when it fits, lowered with a note when not.
        assert_eq!(storm_clients(Some(5_000), false, 20_000), (5_000, None));
        let (n, note) = storm_clients(Some(25_000), true, 20_000);
        assert_eq!(n, 19_000);
        assert!(note.unwrap().starts_with("--storm-clients 25000 lowered to 19000"));
        // A small limit keeps half for everything else.
        assert_eq!(storm_clients(None, true, 1_024).0, 500);
        assert_eq!(storm_clients(Some(900), false, 1_024).0, 512);
    }

    #[test]
    fn the_storm_outlasts_the_established_load() {
        for timing in [TIMING_FULL, TIMING_QUICK] {
            let (est, storm) = loads(19_000, timing);
            let est_end = est.warmup + est.duration;
            let storm_end = timing.storm_delay + storm.warmup + storm.duration;
            assert!(storm_end > est_end && timing.storm_delay < est.warmup, "{timing:?}");
            assert_eq!(storm.connections, 19_000);
            assert_eq!(est.rate, Some(ESTABLISHED_RATE));
        }
    }

    #[test]
    fn figures_split_the_generators_lag_from_the_servers_time() {
        let mut est = LoadReport { completed: 4_000, rate_per_s: 3_960.0, ..Default::default() };
        est.latency_us.p99 = 12_000.0;
        let mut server = est.latency_us;
        server.p99 = 7_000.0;
        est.server_latency_us = Some(server);
        let mut lag = est.latency_us;
        lag.p99 = 5_000.0;
        est.generator_lag_us = Some(lag);
        est.retransmitted = Some(3);
        // 80 of the 4,000 starts due never went out, 2%: it fell behind.
        (est.offered, est.not_sent) = (Some(4_000), Some(80));
        let st = LoadReport { completed: 9_000, rate_per_s: 900.0, ..Default::default() };
        let (spec, _) = loads(500, TIMING_QUICK);
        let f = figures(&est, &st, &spec, 2.0);
        assert_eq!(
            (f["est_p99_ms"], f["est_server_p99_ms"], f["est_gen_lag_p99_ms"]),
            (12.0, 7.0, 5.0)
        );
        assert_eq!(f["est_rate_pct"], 99.0);
        assert_eq!((f["not_sent"], f[report::METRIC_BEHIND]), (80.0, 1.0));
        // Every column but those read from the server has its figure.
        for c in columns(1) {
            let from_server = [
                METRIC_CPU_UTIL,
                "server_busy_pct",
                "req_per_cpu_s",
                "accepted_per_wakeup",
                "listen_overflows",
                "softnet_drops",
            ];
            assert!(from_server.contains(&c.key) || f.contains_key(c.key), "{}", c.key);
        }
    }
}
