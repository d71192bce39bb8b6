//! `hotloop bench`: runs hotloop and its peers side by side through the
//! experiments hotloop grew from, and reports every figure.
//!
//! Each scenario starts servers (`hotloop serve`, `hotloop proxy`,
//! `hotloop peer`, and nginx or haproxy when found on PATH) and drives them
//! with `hotloop load`, all as subprocesses of the same executable (or of
//! `--hotloop PATH`). Servers run on the first CPUs, the load generator on
//! the next one. A server that cannot start is reported as unavailable and
//! the suite goes on.
//!
//! # Implementation notes
//!
//! - Every process is owned by a [`proc::Child`] that stops it by pid when
//!   dropped, so an error or a panic never leaves one running; every wait
//!   on a process or a port is bounded.
//! - Warm-up is a separate, shorter load run before the repeats, so the
//!   server CPU time read around a measured run covers that run only.
//! - The server is started once per configuration and measured `--repeats`
//!   times; figures are medians, with the spread over repeats beside them.

mod accept_burst;
mod chart;
mod churn;
mod keepalive;
mod proc;
mod report;
mod serial;
mod server;
mod short_streams;
mod timers;

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde::Serialize;

use report::{Better, Column, Comparison, LoadReport, Row, Summary};
pub use server::{Running, ServerKind, ServerSpec, Workload};

/// Repeats per configuration unless `--repeats` says otherwise.
pub const REPEATS_DEFAULT: u32 = 3;
/// Repeats per configuration with `--quick`.
pub const REPEATS_QUICK: u32 = 1;
/// Requests (or connections) of warm-up before a configuration's measured
/// runs; the warm-up also stops after [`WARMUP_MAX_S`].
pub const WARMUP_REQUESTS_FULL: u64 = 5_000;
/// Warm-up requests with `--quick`.
pub const WARMUP_REQUESTS_QUICK: u64 = 300;
/// The longest a warm-up runs, seconds.
pub const WARMUP_MAX_S: u64 = 1;
/// With `--quick`, configurations not started within this many seconds of
/// the suite's start are reported as skipped, so the suite ends in time.
pub const QUICK_BUDGET_S: u64 = 105;
/// How long a server may take to accept its first connection.
pub const SERVER_START_TIMEOUT_MS: u64 = 5_000;
/// Slack given to a load run beyond its own duration before it is killed.
pub const LOAD_SLACK_S: u64 = 30;
/// How long a `GET /stats` may take.
pub const STATS_TIMEOUT_MS: u64 = 2_000;

/// `hotloop bench`: the benchmark suite.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Small counts and short runs: the whole suite in under two minutes.
    #[arg(long)]
    pub quick: bool,
    /// Scenarios to run, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub scenario: Vec<ScenarioName>,
    /// Peers to run beside hotloop, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "tokio,monoio,floor,nginx,haproxy")]
    pub peers: Vec<PeerName>,
    /// Directory for results.json, the SVG charts and the servers' logs.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Measured runs per configuration (default 3, 1 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: Option<u32>,
    /// The hotloop executable whose serve, proxy, peer and load subcommands
    /// run (default: this one).
    #[arg(long)]
    pub hotloop: Option<PathBuf>,
}

/// The scenarios, one per experiment hotloop reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScenarioName {
    /// 10,000 clients at once, 128-byte echo: io_uring multishot vs single-shot accept.
    AcceptBurst,
    /// One connection at a time, local and proxied: busy polling off, always, adaptive.
    Serial,
    /// Many concurrent one-request connections: accepts per wakeup unlimited vs 32.
    Churn,
    /// Short connections at a fixed rate: CPU and epoll registrations per connection.
    ShortStreams,
    /// The timer wheel's criterion results.
    Timers,
    /// Persistent connections at concurrency 1 and 256.
    Keepalive,
}

impl ScenarioName {
    /// Every scenario, in the order the suite runs them.
    pub const ALL: [ScenarioName; 6] = [
        ScenarioName::AcceptBurst,
        ScenarioName::Serial,
        ScenarioName::Churn,
        ScenarioName::ShortStreams,
        ScenarioName::Timers,
        ScenarioName::Keepalive,
    ];

    /// The name used on the command line and in file names.
    pub fn as_str(self) -> &'static str {
        match self {
            ScenarioName::AcceptBurst => "accept-burst",
            ScenarioName::Serial => "serial",
            ScenarioName::Churn => "churn",
            ScenarioName::ShortStreams => "short-streams",
            ScenarioName::Timers => "timers",
            ScenarioName::Keepalive => "keepalive",
        }
    }
}

/// The servers hotloop is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PeerName {
    /// `hotloop peer tokio`.
    Tokio,
    /// `hotloop peer monoio`.
    Monoio,
    /// `hotloop peer floor`, raw system calls.
    Floor,
    /// nginx from PATH, HTTP only.
    Nginx,
    /// haproxy from PATH, HTTP only.
    Haproxy,
}

/// What a scenario produced.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    /// The scenario's command-line name.
    pub name: &'static str,
    /// A one-line description.
    pub title: String,
    /// The figure the originating experiment reported.
    pub reference: String,
    /// What was used: counts, sizes, placement, substitutions.
    pub setup: Vec<String>,
    /// The table's columns; the first is the headline figure.
    pub columns: Vec<Column>,
    /// One row per server configuration and group.
    pub rows: Vec<Row>,
    /// hotloop against the floor and the best peer.
    pub comparisons: Vec<Comparison>,
}

impl ScenarioResult {
    /// An empty result with its columns.
    pub fn new(name: &'static str, title: &str, reference: &str, columns: Vec<Column>) -> Self {
        ScenarioResult {
            name,
            title: title.to_string(),
            reference: reference.to_string(),
            setup: Vec::new(),
            columns,
            rows: Vec::new(),
            comparisons: Vec::new(),
        }
    }

    /// Fills `comparisons` from the rows: the headline column and, when
    /// present, CPU seconds per 1,000 connections or requests.
    pub fn compare(&mut self) {
        let mut metrics: Vec<(&str, Better)> = Vec::new();
        if let Some(first) = self.columns.first() {
            metrics.push((first.key, first.better));
        }
        for column in &self.columns {
            if column.key == METRIC_CPU_PER_1K && !metrics.iter().any(|(k, _)| *k == column.key) {
                metrics.push((column.key, Better::Lower));
            }
        }
        self.comparisons = report::compare(&self.rows, &metrics);
    }
}

/// Figures of one run by metric key.
pub type Figures = BTreeMap<String, f64>;
/// `[value_us, count]` pairs of a latency histogram.
pub type Histogram = Vec<(f64, u64)>;

/// Metric key: completed per second.
pub const METRIC_RATE: &str = "rate_per_s";
/// Metric key: server CPU seconds per 1,000 completed connections or requests.
pub const METRIC_CPU_PER_1K: &str = "cpu_s_per_1k";
/// Metric key: server CPU time over wall time, per worker, in percent.
pub const METRIC_CPU_UTIL: &str = "server_cpu_pct";

/// One load generator run: `hotloop load` arguments.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// serial, burst, churn or keepalive.
    pub mode: &'static str,
    /// Concurrent connections (clients).
    pub connections: u64,
    /// Stop after this many requests, if set.
    pub requests: Option<u64>,
    /// Stop after this many seconds. Whole seconds, so the load generator
    /// may take them as an integer.
    pub duration_secs: u64,
    /// Bytes per echo message or HTTP body.
    pub size: usize,
    /// Requests or connections per second, if paced.
    pub rate: Option<u64>,
    /// Source addresses to spread connections over.
    pub sources: u32,
}

impl LoadSpec {
    /// The command-line arguments after `load`.
    pub fn args(&self, addr: SocketAddr, proto: &str, pin: Option<usize>) -> Vec<String> {
        let mut a = vec![
            "--addr".to_string(),
            addr.to_string(),
            "--proto".into(),
            proto.into(),
            "--mode".into(),
            self.mode.into(),
            "--connections".into(),
            self.connections.to_string(),
            "--duration".into(),
            self.duration_secs.to_string(),
            "--size".into(),
            self.size.to_string(),
            "--warmup".into(),
            "0".into(),
            "--sources".into(),
            self.sources.to_string(),
            "--json".into(),
        ];
        if let Some(n) = self.requests {
            a.extend(["--requests".to_string(), n.to_string()]);
        }
        if let Some(r) = self.rate {
            a.extend(["--rate".to_string(), r.to_string()]);
        }
        if let Some(cpu) = pin {
            a.extend(["--pin".to_string(), cpu.to_string()]);
        }
        a
    }

    /// A shorter run of the same shape, to warm the server up: at most
    /// `requests` requests (a quarter of a count-bound run) and `seconds`.
    pub fn warmup(&self, requests: u64, seconds: u64) -> LoadSpec {
        let mut w = self.clone();
        w.duration_secs = seconds;
        let n = self.requests.map_or(requests, |n| (n / 4).min(requests)).max(1);
        w.requests = Some(n);
        w.connections = w.connections.min(n);
        w
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.duration_secs + LOAD_SLACK_S)
    }
}

/// The suite's shared state: where things run, what is enabled, the clock.
pub struct Ctx {
    /// The executable driven as subprocesses.
    pub exe: PathBuf,
    /// `--quick`.
    pub quick: bool,
    /// Measured runs per configuration.
    pub repeats: u32,
    /// Enabled peers.
    pub peers: Vec<PeerName>,
    /// Output directory.
    pub out: PathBuf,
    /// CPUs the servers are pinned to.
    pub server_cpus: Vec<usize>,
    /// The CPU the load generator is pinned to.
    pub load_cpu: Option<usize>,
    /// Worker threads per server (one per server CPU).
    pub workers: usize,
    /// Why every load run would fail, if the load generator is missing.
    pub load_missing: Option<String>,
    started: Instant,
    runs: u64,
}

impl Ctx {
    /// Prints a progress line on stderr with the time since the suite began.
    pub fn progress(&self, text: &str) {
        eprintln!("[{:6.1}s] {text}", self.started.elapsed().as_secs_f64());
    }

    /// A fresh log file path for `name`.
    pub fn log_path(&mut self, name: &str) -> PathBuf {
        self.runs += 1;
        let clean: String =
            name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        self.out.join("logs").join(format!("{:04}-{clean}.log", self.runs))
    }

    /// The peers enabled for `proto`, as server specs; nginx and haproxy
    /// only speak HTTP here and appear only when found on PATH.
    pub fn peer_specs(&self, proto: &str, setup: &mut Vec<String>) -> Vec<ServerSpec> {
        let mut specs = Vec::new();
        for &peer in &self.peers {
            match peer {
                PeerName::Tokio => specs.push(ServerSpec::peer("tokio")),
                PeerName::Monoio => specs.push(ServerSpec::peer("monoio")),
                PeerName::Floor => specs.push(ServerSpec::peer("floor")),
                PeerName::Nginx | PeerName::Haproxy => {
                    let name = if peer == PeerName::Nginx { "nginx" } else { "haproxy" };
                    if proto != "http" {
                        continue;
                    }
                    match find_on_path(name) {
                        Some(program) => {
                            if peer == PeerName::Haproxy {
                                let note = format!(
                                    "haproxy: maxconn {} (it budgets two files per connection; a process may hold 20,000)",
                                    server::HAPROXY_MAXCONN
                                );
                                if !setup.contains(&note) {
                                    setup.push(note);
                                }
                            }
                            specs.push(ServerSpec {
                                server: name.to_string(),
                                config: String::new(),
                                kind: if peer == PeerName::Nginx {
                                    ServerKind::Nginx { program }
                                } else {
                                    ServerKind::Haproxy { program }
                                },
                            })
                        }
                        None => {
                            let note = format!("{name}: not found on PATH, not measured");
                            if !setup.contains(&note) {
                                setup.push(note);
                            }
                        }
                    }
                }
            }
        }
        specs
    }

    /// Starts `spec`, warms it up, measures it `repeats` times under `load`,
    /// stops it, and returns its row. Never fails: problems become an
    /// unavailable row or notes.
    pub fn measure(
        &mut self,
        group: &str,
        spec: &ServerSpec,
        work: &Workload,
        load: &LoadSpec,
    ) -> Row {
        let label = if spec.config.is_empty() {
            spec.server.clone()
        } else {
            format!("{} {}", spec.server, spec.config)
        };
        let title = if group.is_empty() { label.clone() } else { format!("{group}: {label}") };
        if let Some(why) = &self.load_missing {
            return Row::unavailable(group, &spec.server, &spec.config, why.clone());
        }
        if self.quick && self.started.elapsed() > Duration::from_secs(QUICK_BUDGET_S) {
            let why = format!("skipped: the --quick time budget ({QUICK_BUDGET_S} s) was spent");
            self.progress(&format!("{title}: {why}"));
            return Row::unavailable(group, &spec.server, &spec.config, why);
        }
        self.progress(&format!("{title}: starting"));
        let mut running = match server::start(self, spec, work) {
            Ok(r) => r,
            Err(why) => {
                self.progress(&format!("{title}: unavailable: {why}"));
                return Row::unavailable(group, &spec.server, &spec.config, why);
            }
        };
        let mut row = Row::new(group, &spec.server, &spec.config);
        row.notes.extend(running.notes.iter().cloned());
        let warmup_requests = if self.quick { WARMUP_REQUESTS_QUICK } else { WARMUP_REQUESTS_FULL };
        let warmup = load.warmup(warmup_requests, WARMUP_MAX_S);
        if let Err(e) = self.run_load(&running, &work.proto, &warmup, &title) {
            row.notes.push(format!("warm-up failed: {e}"));
        }
        let mut samples: Vec<BTreeMap<String, f64>> = Vec::new();
        let mut histograms = Vec::new();
        for repeat in 1..=self.repeats {
            match self.measure_once(&mut running, work, load, &title) {
                Ok((figures, histogram)) => {
                    let rate = figures.get(METRIC_RATE).copied().unwrap_or(f64::NAN);
                    self.progress(&format!(
                        "{title}: repeat {repeat}/{}: {} /s, p99 {} µs, server CPU {} s/1k",
                        self.repeats,
                        report::format_figure(rate, 0),
                        report::format_figure(
                            figures.get("p99_us").copied().unwrap_or(f64::NAN),
                            0
                        ),
                        report::format_figure(
                            figures.get(METRIC_CPU_PER_1K).copied().unwrap_or(f64::NAN),
                            4
                        ),
                    ));
                    samples.push(figures);
                    histograms.push(histogram);
                }
                Err(e) => {
                    self.progress(&format!("{title}: repeat {repeat} failed: {e}"));
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
        if samples.is_empty() {
            let why = row.notes.last().cloned().unwrap_or_else(|| "no run completed".into());
            row.unavailable = Some(format!("load failed: {why}"));
            return row;
        }
        let keys: Vec<String> = samples.iter().flat_map(|s| s.keys().cloned()).collect();
        for key in keys {
            let values: Vec<f64> = samples.iter().filter_map(|s| s.get(&key).copied()).collect();
            if let Some(summary) = Summary::of(&values) {
                row.metrics.insert(key, summary);
            }
        }
        // Keep the histogram of the repeat with the median rate.
        let rates: Vec<f64> =
            samples.iter().map(|s| s.get(METRIC_RATE).copied().unwrap_or(0.0)).collect();
        let mid = report::median(&rates);
        let pick = rates
            .iter()
            .enumerate()
            .min_by(|a, b| (a.1 - mid).abs().total_cmp(&(b.1 - mid).abs()))
            .map_or(0, |(i, _)| i);
        row.histogram_us = histograms.swap_remove(pick);
        row
    }

    fn measure_once(
        &mut self,
        running: &mut Running,
        work: &Workload,
        load: &LoadSpec,
        title: &str,
    ) -> Result<(Figures, Histogram), String> {
        let stats_before = running.stats();
        let cpu_before = running.cpu_seconds();
        let started = Instant::now();
        let report = self.run_load(running, &work.proto, load, title)?;
        let wall_s = started.elapsed().as_secs_f64();
        let cpu_after = running.cpu_seconds();
        let stats_after = running.stats();
        let mut f = figures_of(&report);
        if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
            let cpu = after - before;
            f.insert("server_cpu_s".into(), cpu);
            if report.completed > 0 {
                f.insert(METRIC_CPU_PER_1K.into(), cpu / report.completed as f64 * 1000.0);
            }
            f.insert(METRIC_CPU_UTIL.into(), cpu / wall_s / self.workers as f64 * 100.0);
        }
        f.insert("wall_s".into(), wall_s);
        if let (Some(before), Some(after)) = (stats_before, stats_after) {
            for (key, value) in &after {
                let delta = value - before.get(key).copied().unwrap_or(0.0);
                // Maxima are levels, not counters: report them as they are.
                let figure = if key.starts_with("max_") { *value } else { delta };
                f.insert(format!("stats_{key}"), figure);
            }
            let accepted = after.get("accepted").copied().unwrap_or(0.0)
                - before.get("accepted").copied().unwrap_or(0.0);
            let per_conn = |key: &str| {
                let d = after.get(key).copied().unwrap_or(0.0)
                    - before.get(key).copied().unwrap_or(0.0);
                if accepted > 0.0 {
                    Some(d / accepted)
                } else {
                    None
                }
            };
            if let Some(v) = per_conn("registrations") {
                f.insert("registrations_per_conn".into(), v);
            }
            let wakeups = per_conn("accept_wakeups");
            if let Some(w) = wakeups.filter(|w| *w > 0.0) {
                f.insert("accepted_per_wakeup".into(), 1.0 / w);
            }
        }
        Ok((f, report.histogram_us))
    }

    /// Runs `hotloop load` against `running`, bounded in time.
    fn run_load(
        &mut self,
        running: &Running,
        proto: &str,
        load: &LoadSpec,
        title: &str,
    ) -> Result<LoadReport, String> {
        let mut cmd = Command::new(&self.exe);
        cmd.arg("load").args(load.args(running.addr, proto, self.load_cpu));
        let log = self.log_path(&format!("load-{title}"));
        let (status, stdout) = proc::run_bounded("hotloop load", cmd, &[], &log, load.timeout())
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("hotloop load {status}: {}", last_line(&log)));
        }
        let report = LoadReport::parse(&stdout)?;
        if report.completed == 0 {
            return Err(format!("no request completed ({} errors)", report.errors_total()));
        }
        Ok(report)
    }
}

/// The figures of one load report, keyed for [`Row::metrics`].
pub fn figures_of(r: &LoadReport) -> BTreeMap<String, f64> {
    let l = &r.latency_us;
    let mut f = BTreeMap::new();
    for (key, value) in [
        (METRIC_RATE, r.rate_per_s),
        ("elapsed_ms", r.elapsed_s * 1000.0),
        ("completed", r.completed as f64),
        ("errors", r.errors_total() as f64),
        ("mean_us", l.mean),
        ("stdev_us", l.stdev),
        ("p50_us", l.p50),
        ("p90_us", l.p90),
        ("p99_us", l.p99),
        ("p999_us", l.p999),
        ("max_us", l.max),
        ("mean_ms", l.mean / 1000.0),
        ("stdev_ms", l.stdev / 1000.0),
        ("p99_ms", l.p99 / 1000.0),
    ] {
        f.insert(key.to_string(), value);
    }
    f
}

/// The last non-empty line of a log file, for error messages.
pub fn last_line(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // An error line says more than clap's closing "try '--help'" hint.
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("error") || l.starts_with("hotloop: "))
        .or_else(|| text.lines().rev().map(str::trim).find(|l| !l.is_empty()))
        .unwrap_or("(no output)");
    format!("{line} (log: {})", path.display())
}

/// The path of `program` if an executable of that name is on PATH.
pub fn find_on_path(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

/// Runs the suite.
pub fn run(args: BenchArgs) -> io::Result<()> {
    let exe = match &args.hotloop {
        Some(p) => p.clone(),
        None => std::env::current_exe()?,
    };
    std::fs::create_dir_all(args.out.join("logs"))?;
    let cpus = proc::allowed_cpus();
    let (server_cpus, load_cpu) = placement(&cpus);
    let repeats = args.repeats.unwrap_or(if args.quick { REPEATS_QUICK } else { REPEATS_DEFAULT });
    let mut ctx = Ctx {
        exe,
        quick: args.quick,
        repeats,
        peers: args.peers.clone(),
        out: args.out.clone(),
        workers: server_cpus.len().max(1),
        server_cpus,
        load_cpu,
        load_missing: None,
        started: Instant::now(),
        runs: 0,
    };
    ctx.load_missing = probe_subcommand(&mut ctx, "load");
    ctx.progress(&format!(
        "{} CPUs; servers on {:?} with {} worker(s), load on {}; {} repeat(s); output in {}",
        cpus.len(),
        ctx.server_cpus,
        ctx.workers,
        ctx.load_cpu.map_or("any CPU".to_string(), |c| format!("CPU {c}")),
        ctx.repeats,
        ctx.out.display()
    ));
    if let Some(why) = &ctx.load_missing {
        ctx.progress(&format!("every load figure is unavailable: {why}"));
    }
    let chosen: Vec<ScenarioName> = if args.scenario.is_empty() {
        ScenarioName::ALL.to_vec()
    } else {
        ScenarioName::ALL.into_iter().filter(|s| args.scenario.contains(s)).collect()
    };
    let mut results = Vec::new();
    for scenario in chosen {
        ctx.progress(&format!("scenario {}", scenario.as_str()));
        let mut result = match scenario {
            ScenarioName::AcceptBurst => accept_burst::run(&mut ctx),
            ScenarioName::Serial => serial::run(&mut ctx),
            ScenarioName::Churn => churn::run(&mut ctx),
            ScenarioName::ShortStreams => short_streams::run(&mut ctx),
            ScenarioName::Timers => timers::run(&mut ctx),
            ScenarioName::Keepalive => keepalive::run(&mut ctx),
        };
        result.compare();
        print_result(&result);
        write_charts(&ctx.out, &result)?;
        results.push(result);
        // Written after each scenario so an interrupted suite keeps its figures.
        write_results(&ctx, &results)?;
    }
    ctx.progress(&format!("done; results in {}", ctx.out.join("results.json").display()));
    Ok(())
}

/// Server CPUs and the load generator's CPU: with two or more CPUs the
/// servers get the first half (at least one) and the load the next one.
pub fn placement(cpus: &[usize]) -> (Vec<usize>, Option<usize>) {
    match cpus.len() {
        0 => (Vec::new(), None),
        1 => (Vec::new(), None),
        n => {
            let servers = (n / 2).max(1);
            (cpus[..servers].to_vec(), Some(cpus[servers]))
        }
    }
}

/// `None` if `exe SUBCOMMAND --help` succeeds; otherwise why not.
fn probe_subcommand(ctx: &mut Ctx, subcommand: &str) -> Option<String> {
    let mut cmd = Command::new(&ctx.exe);
    cmd.args([subcommand, "--help"]);
    let log = ctx.log_path(&format!("probe-{subcommand}"));
    match proc::run_bounded(subcommand, cmd, &[], &log, Duration::from_secs(10)) {
        Ok((status, _)) if status.success() => None,
        Ok((status, _)) => Some(format!(
            "`hotloop {subcommand}` is missing from this build ({status}): {}",
            last_line(&log)
        )),
        Err(e) => Some(format!("`hotloop {subcommand}` could not run: {e}")),
    }
}

fn print_result(result: &ScenarioResult) {
    println!("\n== {}: {}", result.name, result.title);
    println!("   reference: {}", result.reference);
    for line in &result.setup {
        println!("   {line}");
    }
    if result.rows.is_empty() {
        println!(" (no figures: see above)");
    }
    print!("{}", report::render_table(&result.rows, &result.columns));
    let notes: Vec<String> = result
        .rows
        .iter()
        .flat_map(|r| {
            r.notes
                .iter()
                .map(move |n| format!("   note [{}{}]: {n}", group_prefix(&r.group), r.label()))
        })
        .collect();
    for n in notes {
        println!("{n}");
    }
    if !result.comparisons.is_empty() {
        println!(" hotloop's ratio (hotloop / other):");
        print!("{}", report::render_comparisons(&result.comparisons, &result.columns));
    }
}

fn group_prefix(group: &str) -> String {
    if group.is_empty() {
        String::new()
    } else {
        format!("{group}: ")
    }
}

fn write_charts(out: &Path, result: &ScenarioResult) -> io::Result<()> {
    let Some(headline) = result.columns.first() else { return Ok(()) };
    let bars: Vec<(String, f64)> = result
        .rows
        .iter()
        .filter_map(|r| {
            r.get(headline.key).map(|v| (format!("{}{}", group_prefix(&r.group), r.label()), v))
        })
        .collect();
    if !bars.is_empty() {
        let svg =
            chart::bars(&format!("{}: {}", result.name, headline.header), headline.header, &bars);
        std::fs::write(out.join(format!("{}-{}.svg", result.name, headline.key)), svg)?;
    }
    let series: Vec<(String, Vec<(f64, u64)>)> = result
        .rows
        .iter()
        .filter(|r| !r.histogram_us.is_empty())
        .map(|r| (format!("{}{}", group_prefix(&r.group), r.label()), r.histogram_us.clone()))
        .collect();
    if !series.is_empty() {
        let svg = chart::latency_cdf(&format!("{}: latency distribution", result.name), &series);
        std::fs::write(out.join(format!("{}-latency.svg", result.name)), svg)?;
    }
    Ok(())
}

#[derive(Serialize)]
struct ResultsFile<'a> {
    quick: bool,
    repeats: u32,
    server_cpus: &'a [usize],
    load_cpu: Option<usize>,
    server_workers: usize,
    kernel: String,
    open_files_limit: Option<u64>,
    scenarios: &'a [ScenarioResult],
}

fn write_results(ctx: &Ctx, results: &[ScenarioResult]) -> io::Result<()> {
    let file = ResultsFile {
        quick: ctx.quick,
        repeats: ctx.repeats,
        server_cpus: &ctx.server_cpus,
        load_cpu: ctx.load_cpu,
        server_workers: ctx.workers,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        open_files_limit: open_files_limit(),
        scenarios: results,
    };
    let text = serde_json::to_string_pretty(&file).map_err(io::Error::other)?;
    std::fs::write(ctx.out.join("results.json"), text)
}

/// The soft limit on open files for this process (and so its children).
pub fn open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a valid, writable rlimit.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (rc == 0).then_some(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    #[test]
    fn defaults_run_everything() {
        let a = Cli::parse_from(["bench"]).bench;
        assert!(!a.quick && a.scenario.is_empty() && a.repeats.is_none());
        assert_eq!(a.peers.len(), 5);
        assert_eq!(a.out, PathBuf::from("bench-out"));
    }

    #[test]
    fn lists_and_limits_parse() {
        let a = Cli::parse_from([
            "bench",
            "--quick",
            "--scenario",
            "churn,accept-burst",
            "--peers",
            "tokio,floor",
            "--out",
            "/tmp/x",
            "--repeats",
            "5",
        ])
        .bench;
        assert!(a.quick);
        assert_eq!(a.scenario, vec![ScenarioName::Churn, ScenarioName::AcceptBurst]);
        assert_eq!(a.peers, vec![PeerName::Tokio, PeerName::Floor]);
        assert_eq!(a.repeats, Some(5));
        assert!(Cli::try_parse_from(["bench", "--repeats", "0"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--scenario", "nope"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--peers", "apache"]).is_err());
    }

    #[test]
    fn placement_splits_cpus() {
        assert_eq!(placement(&[0]), (vec![], None));
        assert_eq!(placement(&[0, 1]), (vec![0], Some(1)));
        assert_eq!(placement(&[0, 1, 2, 3]), (vec![0, 1], Some(2)));
    }

    #[test]
    fn load_args_follow_the_contract() {
        let spec = LoadSpec {
            mode: "burst",
            connections: 10_000,
            requests: Some(10_000),
            duration_secs: 30,
            size: 128,
            rate: None,
            sources: 4,
        };
        let a = spec.args("127.0.0.1:9000".parse().unwrap(), "echo", Some(1)).join(" ");
        assert!(a.contains("--mode burst") && a.contains("--connections 10000"), "{a}");
        assert!(
            a.contains("--requests 10000") && a.contains("--pin 1") && a.ends_with("--pin 1"),
            "{a}"
        );
        assert!(a.contains("--json") && !a.contains("--rate"), "{a}");
        let w = spec.warmup(5_000, 1);
        assert_eq!((w.duration_secs, w.requests, w.connections), (1, Some(2_500), 2_500));
        let keepalive = LoadSpec { mode: "keepalive", requests: None, connections: 256, ..spec };
        let w = keepalive.warmup(300, 1);
        assert_eq!((w.requests, w.connections), (Some(300), 256));
    }

    #[test]
    fn figures_include_cpu_ready_keys() {
        let mut r = LoadReport { completed: 2000, rate_per_s: 100.0, ..Default::default() };
        r.latency_us.p99 = 35_590.0;
        let f = figures_of(&r);
        assert_eq!(f["p99_ms"], 35.59);
        assert_eq!(f[METRIC_RATE], 100.0);
    }
}
