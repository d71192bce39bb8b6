//! `hotloop-bench bench`: runs hotloop and its peers side by side through
//! the experiments hotloop grew from, and reports every figure.
//!
//! Each scenario starts servers (`hotloop serve` and `hotloop proxy` from
//! the production binary, `hotloop-bench peer`, and nginx, haproxy or h2o when
//! found on PATH) and drives them with `hotloop-bench load`, all as
//! subprocesses. The `hotloop` binary is `--hotloop PATH`, or the one cargo
//! builds into this executable's target directory (see [`locate_server`]).
//! Servers run on the first CPUs, the load generator on the next one. A
//! server that cannot start is reported as unavailable and the suite goes
//! on.
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
mod balance;
mod chart;
mod churn;
mod hyper;
mod keepalive;
mod load;
mod measure;
mod output;
mod proc;
mod report;
mod serial;
mod server;
mod short_streams;
mod storm;
mod timers;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde::Serialize;

pub use load::{figures_of, LoadSpec};
use report::{Better, Column, Comparison, Row};
pub use server::{ServerKind, ServerSpec, Workload};

/// Repeats per configuration unless `--repeats` says otherwise.
pub const REPEATS_DEFAULT: u32 = 3;
/// Repeats per configuration with `--quick`.
pub const REPEATS_QUICK: u32 = 1;
/// Requests (or connections) of warm-up before a configuration's measured
/// runs; the warm-up also stops after [`WARMUP_MAX_FULL`].
pub const WARMUP_REQUESTS_FULL: u64 = 5_000;
/// Warm-up requests with `--quick`.
pub const WARMUP_REQUESTS_QUICK: u64 = 100;
/// The longest a warm-up runs.
pub const WARMUP_MAX_FULL: Duration = Duration::from_secs(1);
/// The longest a warm-up runs with `--quick`.
pub const WARMUP_MAX_QUICK: Duration = Duration::from_millis(300);
/// How long a server may take to accept its first connection.
pub const SERVER_START_TIMEOUT_MS: u64 = 5_000;
/// Slack given to a load run beyond its own duration before it is killed.
pub const LOAD_SLACK_S: u64 = 30;
/// How long a `GET /stats` may take.
pub const STATS_TIMEOUT_MS: u64 = 2_000;

/// `hotloop-bench bench`: the benchmark suite.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Small counts and short runs: every scenario, each shortened, in about
    /// two minutes after the build.
    #[arg(long)]
    pub quick: bool,
    /// Scenarios to run, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub scenario: Vec<ScenarioName>,
    /// Peers to run beside hotloop, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "tokio,monoio,floor,nginx,haproxy,h2o")]
    pub peers: Vec<PeerName>,
    /// Directory for results.json, the SVG charts and the servers' logs.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Measured runs per configuration (default 3, 1 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: Option<u32>,
    /// The `hotloop` server executable whose serve and proxy subcommands
    /// run (default: built with cargo next to this executable).
    #[arg(long)]
    pub hotloop: Option<PathBuf>,
    /// Workers per server (default: one per server CPU, half the CPUs):
    /// hotloop's `--workers`, the peers' `--workers`, nginx's
    /// `worker_processes`, haproxy's `nbthread`, h2o's `num-threads`. The
    /// servers run on the first N CPUs and the load on the next; with
    /// fewer than N + 1 CPUs the servers run on all of them and the load
    /// is not pinned, so they share CPUs. The balance scenario always runs
    /// two.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=WORKERS_MAX as i64))]
    pub workers: Option<u16>,
    /// Clients in the storm scenario's storm (default: the seed's 30,000, or
    /// as many as the open-file limit lets the generator and the server
    /// each hold, 19,000 at a limit of 20,000; 500 with --quick).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub storm_clients: Option<u64>,
    /// io_uring features to measure switched off beside on, comma-separated:
    /// each adds, beside every `hotloop uring` row of the keepalive and
    /// hyper scenarios, the same server with that feature off (its
    /// `HOTLOOP_URING_*` variable), measured in the same interleaved rounds.
    #[arg(long, value_delimiter = ',')]
    pub uring_off: Vec<UringFeature>,
}

/// An io_uring feature of the driver that can be switched off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UringFeature {
    /// Entering the ring through a registered ring descriptor
    /// (`HOTLOOP_URING_REGISTERED_RING=0` switches it off).
    RegisteredRing,
    /// Zero-copy owned writes (`SEND_ZC`) from 64 KiB
    /// (`HOTLOOP_URING_SEND_ZC=0` switches them off).
    SendZc,
    /// Stream receives into 64 KiB buffers consumed a part at a time
    /// (`IOU_PBUF_RING_INC`; `HOTLOOP_URING_RECV_INC=0` switches it off).
    RecvInc,
    /// Accepted connections as direct descriptors in the ring's file table
    /// (`HOTLOOP_URING_DIRECT_FDS=0` switches them off; off by default, so
    /// the on rows set `HOTLOOP_URING_DIRECT_FDS=1` and say so).
    DirectFds,
}

impl UringFeature {
    /// The name used on the command line and in row labels.
    pub fn as_str(self) -> &'static str {
        match self {
            UringFeature::RegisteredRing => "registered-ring",
            UringFeature::SendZc => "send-zc",
            UringFeature::RecvInc => "recv-inc",
            UringFeature::DirectFds => "direct-fds",
        }
    }

    /// The environment variable and value that switch it off.
    pub fn off_env(self) -> (&'static str, &'static str) {
        match self {
            UringFeature::RegisteredRing => ("HOTLOOP_URING_REGISTERED_RING", "0"),
            UringFeature::SendZc => ("HOTLOOP_URING_SEND_ZC", "0"),
            UringFeature::RecvInc => ("HOTLOOP_URING_RECV_INC", "0"),
            UringFeature::DirectFds => ("HOTLOOP_URING_DIRECT_FDS", "0"),
        }
    }
}

/// The most workers `--workers` takes (the peers' own limit).
pub const WORKERS_MAX: u16 = 1024;

/// The scenarios, one per experiment hotloop reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScenarioName {
    /// 10,000 clients at once, 128-byte echo: io_uring multishot vs single-shot accept.
    AcceptBurst,
    /// One connection at a time, local and proxied: busy polling off, always, adaptive,
    /// against the floors with and without busy polling; idle CPU after each local run.
    Serial,
    /// Many concurrent one-request connections: accepts per wakeup unlimited vs 32.
    Churn,
    /// Established connections at a fixed rate beside an accept storm:
    /// accepts per wakeup unlimited vs 32 vs paced.
    Storm,
    /// Short connections at a fixed rate: CPU and epoll registrations per connection.
    ShortStreams,
    /// Timer queues timed in process: hotloop's wheel, an ordered map and
    /// neqo's flat wheel.
    Timers,
    /// Persistent connections at concurrency 1 and 256, and at 1 with busy
    /// polling against the busy-polling floors.
    Keepalive,
    /// The same hyper service on hotloop and on tokio.
    Hyper,
    /// Two workers, heavy and light connections: kernel hash vs load-aware
    /// hand-off vs connection count.
    Balance,
}

impl ScenarioName {
    /// Every scenario, in the order the suite runs them.
    pub const ALL: [ScenarioName; 9] = [
        ScenarioName::AcceptBurst,
        ScenarioName::Serial,
        ScenarioName::Churn,
        ScenarioName::Storm,
        ScenarioName::ShortStreams,
        ScenarioName::Timers,
        ScenarioName::Keepalive,
        ScenarioName::Hyper,
        ScenarioName::Balance,
    ];

    /// The name used on the command line and in file names.
    pub fn as_str(self) -> &'static str {
        match self {
            ScenarioName::AcceptBurst => "accept-burst",
            ScenarioName::Serial => "serial",
            ScenarioName::Churn => "churn",
            ScenarioName::Storm => "storm",
            ScenarioName::ShortStreams => "short-streams",
            ScenarioName::Timers => "timers",
            ScenarioName::Keepalive => "keepalive",
            ScenarioName::Hyper => "hyper",
            ScenarioName::Balance => "balance",
        }
    }
}

/// The servers hotloop is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PeerName {
    /// `hotloop-bench peer tokio`.
    Tokio,
    /// `hotloop-bench peer monoio`.
    Monoio,
    /// `hotloop-bench peer floor`, raw system calls.
    Floor,
    /// `hotloop-bench peer floor-uring`, raw io_uring; measured in the
    /// keepalive and serial scenarios, shown as `floor io_uring`. With
    /// `floor` or `floor-uring`, those scenarios also measure the floor with
    /// `--busy-poll`.
    #[serde(rename = "floor-uring")]
    FloorUring,
    /// nginx from PATH, HTTP only.
    Nginx,
    /// haproxy from PATH, HTTP only.
    Haproxy,
    /// h2o from PATH, HTTP only: one thread, no access log.
    H2o,
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
    /// The load commands it ran, each once, in order.
    pub loads: Vec<String>,
    /// What was used: counts, sizes, placement, substitutions.
    pub setup: Vec<String>,
    /// The table's columns; the first is the headline figure.
    pub columns: Vec<Column>,
    /// One row per server configuration and group.
    pub rows: Vec<Row>,
    /// The hotloop configurations compared with the floor and the peers,
    /// by name (the defaults, or the setting a group is about): each in
    /// every group that has it, never the best of several.
    pub compared: Vec<String>,
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
            loads: Vec::new(),
            setup: Vec::new(),
            columns,
            rows: Vec::new(),
            compared: Vec::new(),
            comparisons: Vec::new(),
        }
    }

    /// Names the hotloop configurations the ratios are taken for.
    pub fn compare_as(&mut self, configs: &[&str]) {
        self.compared = configs.iter().map(|c| c.to_string()).collect();
    }

    /// Marks rows from their figures (errors, a schedule fallen behind),
    /// then fills `comparisons`: the headline column and, when present,
    /// CPU seconds per 1,000 connections or requests, for each configuration
    /// in `compared`.
    pub fn compare(&mut self) {
        for row in &mut self.rows {
            row.flag_from_figures();
        }
        let mut metrics: Vec<(&str, Better)> = Vec::new();
        if let Some(first) = self.columns.first() {
            metrics.push((first.key, first.better));
        }
        for column in &self.columns {
            if column.key == METRIC_CPU_PER_1K && !metrics.iter().any(|(k, _)| *k == column.key) {
                metrics.push((column.key, Better::Lower));
            }
        }
        self.comparisons = report::compare(&self.rows, &metrics, &self.compared);
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
/// Metric key: the resolution of [`METRIC_CPU_PER_1K`] (the CPU clock's
/// step over the run's completions).
pub const METRIC_CPU_PER_1K_RES: &str = "cpu_s_per_1k_res";
/// Metric key: server CPU time over wall time, per worker, in percent.
pub const METRIC_CPU_UTIL: &str = "server_cpu_pct";
/// Metric key: server CPU time, per worker, in percent, over a window with
/// no load right after a measured run.
pub const METRIC_IDLE_CPU: &str = "idle_cpu_pct";

/// The suite's shared state: where things run, what is enabled, the clock.
pub struct Ctx {
    /// This executable: its `load` and `peer` subcommands run as subprocesses.
    pub exe: PathBuf,
    /// The `hotloop` server executable: its `serve` and `proxy` subcommands.
    pub server_exe: PathBuf,
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
    /// Worker threads per server (one per server CPU unless `--workers`).
    pub workers: usize,
    /// One line saying the servers share their CPUs with the load
    /// generator, when they do; every scenario's report carries it.
    pub placement_note: Option<String>,
    /// One line naming the `HOTLOOP_*` variables of the bench's own
    /// environment, which no server inherits; every scenario's report
    /// carries it.
    pub env_note: Option<String>,
    /// Why every load run would fail, if the load generator is missing.
    pub load_missing: Option<String>,
    /// The load commands the current scenario ran, each once, in order:
    /// the report's "load:" lines are printed from these.
    pub load_lines: Vec<String>,
    /// The open-file limit every process the suite starts inherits (the
    /// suite raises its own to the hard limit first).
    pub fd_limit: u64,
    /// `--storm-clients`.
    pub storm_clients: Option<u64>,
    /// `--uring-off`.
    pub uring_off: Vec<UringFeature>,
    started: Instant,
    runs: u64,
}

impl Ctx {
    /// `hotloop serve` on io_uring with `args`, then the same with each
    /// feature of `--uring-off` switched off.
    pub fn hotloop_uring(&self, config: &str, args: &[&str]) -> Vec<ServerSpec> {
        uring_specs(config, args, &self.uring_off)
    }

    /// Records that `load` ran (or is about to) against `proto` servers, for
    /// the scenario's "load:" lines.
    pub fn note_load(&mut self, load: &LoadSpec, proto: &str) {
        let line = load.command_line(proto, self.load_cpu);
        if !self.load_lines.contains(&line) {
            self.load_lines.push(line);
        }
    }

    /// Prints a progress line on stderr with the time since the suite
    /// began, broken into lines no wider than the tables.
    pub fn progress(&self, text: &str) {
        let stamp = format!("[{:6.1}s] ", self.started.elapsed().as_secs_f64());
        let rest = " ".repeat(stamp.len() + 2);
        for line in report::wrap(text, report::LINE_WIDTH_MAX, &stamp, &rest) {
            eprintln!("{line}");
        }
    }

    /// A fresh log file path for `name`.
    pub fn log_path(&mut self, name: &str) -> PathBuf {
        self.runs += 1;
        let clean: String =
            name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        self.out.join("logs").join(format!("{:04}-{clean}.log", self.runs))
    }
}

/// `hotloop serve` with `args`, then the same with each of `off`
/// switched off through its variable, labelled `CONFIG, FEATURE off`.
///
/// The bench's children inherit no `HOTLOOP_*` variable, so a feature off
/// by default (direct descriptors) is switched on in the base row by its
/// variable, and the row says so.
fn uring_specs(config: &str, args: &[&str], off: &[UringFeature]) -> Vec<ServerSpec> {
    let mut base = ServerSpec::hotloop(config, args);
    if off.contains(&UringFeature::DirectFds) {
        let (name, _) = UringFeature::DirectFds.off_env();
        base.config = format!("{config}, {} on", UringFeature::DirectFds.as_str());
        if let ServerKind::Serve(_, env) = &mut base.kind {
            env.push((name.to_string(), "1".to_string()));
        }
    }
    let mut specs = vec![base];
    for feature in off {
        let (name, value) = feature.off_env();
        let mut spec = ServerSpec::hotloop(&format!("{config}, {} off", feature.as_str()), args);
        if let ServerKind::Serve(_, env) = &mut spec.kind {
            env.push((name.to_string(), value.to_string()));
        }
        specs.push(spec);
    }
    specs
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
    let chosen: Vec<ScenarioName> = if args.scenario.is_empty() {
        ScenarioName::ALL.to_vec()
    } else {
        ScenarioName::ALL.into_iter().filter(|s| args.scenario.contains(s)).collect()
    };
    let exe = std::env::current_exe()?;
    // The timers scenario only reads criterion's files.
    let needs_server = chosen.iter().any(|s| *s != ScenarioName::Timers);
    let server_exe = match &args.hotloop {
        Some(p) => p.clone(),
        None if needs_server => locate_server(&exe)?,
        None => PathBuf::new(),
    };
    // Raised before any child starts, so each inherits it: the peers that
    // do not raise their own (tokio, monoio, nginx) hold as many
    // connections as the servers that do.
    let fd_limit = hotloop::raise_nofile_limit()?;
    std::fs::create_dir_all(args.out.join("logs"))?;
    // Absolute, because servers (nginx) resolve paths from their own directory.
    let out = std::fs::canonicalize(&args.out)?;
    let cpus = proc::allowed_cpus();
    let place = placement(&cpus, args.workers.map(usize::from));
    let placement_note = place.shared_note();
    let repeats = args.repeats.unwrap_or(if args.quick { REPEATS_QUICK } else { REPEATS_DEFAULT });
    let mut ctx = Ctx {
        exe,
        server_exe,
        quick: args.quick,
        repeats,
        peers: args.peers.clone(),
        out,
        workers: place.workers,
        server_cpus: place.server_cpus,
        load_cpu: place.load_cpu,
        placement_note,
        env_note: env_note(std::env::vars_os()),
        load_missing: None,
        load_lines: Vec::new(),
        fd_limit,
        storm_clients: args.storm_clients,
        uring_off: args.uring_off.clone(),
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
    for note in [&ctx.placement_note, &ctx.env_note].into_iter().flatten() {
        ctx.progress(note);
    }
    if let Some(why) = &ctx.load_missing {
        ctx.progress(&format!("every load figure is unavailable: {why}"));
    }
    let mut results = Vec::new();
    let mut charts = 0;
    for scenario in chosen {
        ctx.progress(&format!("scenario {}", scenario.as_str()));
        ctx.load_lines.clear();
        let mut result = match scenario {
            ScenarioName::AcceptBurst => accept_burst::run(&mut ctx),
            ScenarioName::Serial => serial::run(&mut ctx),
            ScenarioName::Churn => churn::run(&mut ctx),
            ScenarioName::Storm => storm::run(&mut ctx),
            ScenarioName::ShortStreams => short_streams::run(&mut ctx),
            ScenarioName::Timers => timers::run(&mut ctx),
            ScenarioName::Keepalive => keepalive::run(&mut ctx),
            ScenarioName::Hyper => hyper::run(&mut ctx),
            ScenarioName::Balance => balance::run(&mut ctx),
        };
        result.loads = ctx.load_lines.clone();
        result.setup.extend(ctx.env_note.clone());
        // The timers scenario runs no server; balance sets its own workers
        // and placement, and says so.
        if !matches!(scenario, ScenarioName::Timers | ScenarioName::Balance) {
            result.setup.extend(ctx.placement_note.clone());
            for row in &mut result.rows {
                row.workers.get_or_insert(ctx.workers);
            }
        }
        result.compare();
        output::print_result(&result);
        charts += output::write_charts(&ctx.out, &result)?.len();
        results.push(result);
        // Written after each scenario so an interrupted suite keeps its figures.
        output::write_results(&ctx, &results)?;
    }
    ctx.progress(&format!(
        "done in {:.0} s; figures in {}, server and load logs in {}",
        ctx.started.elapsed().as_secs_f64(),
        ctx.out.join("results.json").display(),
        ctx.out.join("logs").display(),
    ));
    // The last line says where to look.
    ctx.progress(&format!("charts ({charts} SVG files): {}", ctx.out.display()));
    Ok(())
}

/// A line naming the `HOTLOOP_*` variables among `vars` (the bench's
/// environment) that the servers do not get, if there are any.
pub fn env_note(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Option<String> {
    let names: Vec<String> = vars
        .into_iter()
        .filter(|(k, _)| k.to_string_lossy().starts_with(proc::HOTLOOP_VAR_PREFIX))
        .map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy()))
        .collect();
    (!names.is_empty()).then(|| {
        format!(
            "not passed to the servers: {} (each row's server gets only the variables its row sets, so it \
             runs the configuration its label names)",
            names.join(" ")
        )
    })
}

/// Where the servers and the load generator run, and with how many workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// CPUs the servers are pinned to (none: not pinned).
    pub server_cpus: Vec<usize>,
    /// The CPU the load generator is pinned to (none: not pinned).
    pub load_cpu: Option<usize>,
    /// Workers per server.
    pub workers: usize,
}

impl Placement {
    /// One line saying that the servers and the load share CPUs, when they
    /// do (the load is not pinned to a CPU of its own).
    pub fn shared_note(&self) -> Option<String> {
        if self.load_cpu.is_some() {
            return None;
        }
        let plural = if self.workers == 1 { "" } else { "s" };
        let cpus = match self.server_cpus.as_slice() {
            [] => "unpinned".to_string(),
            [one] => format!("on CPU {one}"),
            many => format!("on CPUs {many:?}"),
        };
        Some(format!(
            "shared CPUs: servers with {} worker{plural} {cpus}, load generators not pinned \
             (fewer CPUs than workers + 1), so the load takes CPU time from the servers",
            self.workers
        ))
    }
}

/// Server CPUs, the load generator's CPU and the workers per server.
///
/// Without `workers`, with two or more CPUs, the servers get the first
/// half (at least one) and a worker on each, and the load the next one.
/// With `workers` N, the servers get the first N CPUs and the load the
/// next; with fewer than N + 1 CPUs the servers get them all and the load
/// none of its own. With one CPU nothing is pinned.
pub fn placement(cpus: &[usize], workers: Option<usize>) -> Placement {
    let (server_cpus, load_cpu) = match (cpus.len(), workers) {
        (0 | 1, _) => (Vec::new(), None),
        (n, None) => {
            let servers = (n / 2).max(1);
            (cpus[..servers].to_vec(), Some(cpus[servers]))
        }
        (n, Some(w)) if n > w => (cpus[..w].to_vec(), Some(cpus[w])),
        (_, Some(_)) => (cpus.to_vec(), None),
    };
    let workers = workers.unwrap_or(server_cpus.len()).max(1);
    Placement { server_cpus, load_cpu, workers }
}

/// The `hotloop` server binary that belongs with `bench_exe`.
///
/// Inside the source tree (this crate's manifest is still where it was
/// built), `cargo build -p hotloop-cli -p hotloop-bench` with this
/// executable's profile brings it up to date first; it does nothing when it
/// already is. Both packages are named so that cargo resolves the same
/// features as the README's command (which builds the two together):
/// building the server alone would resolve `hotloop`'s features for it
/// alone and compile the runtime and its dependencies a second time. The
/// binary is then the `hotloop` in this executable's target directory
/// (`target/release/`, or its parent when this runs from `deps/` as a
/// test). Outside the source tree, a `hotloop` next to this executable or
/// on PATH.
pub fn locate_server(bench_exe: &Path) -> io::Result<PathBuf> {
    let mut dir = bench_exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("Cargo.toml");
    let profile = dir.file_name().and_then(|n| n.to_str()).unwrap_or("release").to_string();
    if manifest.is_file() {
        if let Some(target) = dir.parent() {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let profile_arg = if profile == "debug" { "dev" } else { profile.as_str() };
            eprintln!("hotloop-bench: building the `hotloop` server ({profile_arg} profile)");
            let status = Command::new(cargo)
                .args(["build", "--quiet", "-p", "hotloop-cli", "-p", "hotloop-bench", "--profile"])
                .arg(profile_arg)
                .arg("--manifest-path")
                .arg(&manifest)
                .env("CARGO_TARGET_DIR", target)
                .status();
            match status {
                Ok(s) if s.success() => {}
                Ok(s) => eprintln!("hotloop-bench: building `hotloop` failed ({s})"),
                Err(e) => eprintln!("hotloop-bench: could not run cargo ({e})"),
            }
        }
    }
    let beside = dir.join("hotloop");
    if beside.is_file() {
        return Ok(beside);
    }
    find_on_path("hotloop").ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "no `hotloop` server binary in {} or on PATH: build it with \
                 `cargo build --release -p hotloop-cli`, or pass --hotloop PATH",
                dir.display()
            ),
        )
    })
}

/// `None` if `exe SUBCOMMAND --help` succeeds; otherwise why not.
fn probe_subcommand(ctx: &mut Ctx, subcommand: &str) -> Option<String> {
    let mut cmd = Command::new(&ctx.exe);
    cmd.args([subcommand, "--help"]);
    let log = ctx.log_path(&format!("probe-{subcommand}"));
    match proc::run_bounded(subcommand, cmd, &[], &log, Duration::from_secs(10)) {
        Ok((status, _)) if status.success() => None,
        Ok((status, _)) => Some(format!(
            "`hotloop-bench {subcommand}` is missing from this build ({status}): {}",
            last_line(&log)
        )),
        Err(e) => Some(format!("`hotloop-bench {subcommand}` could not run: {e}")),
    }
}

/// A test's own directory under the system's temporary directory,
/// `hotloop-NAME-PID`, removed with everything in it when dropped: a test
/// that fails leaves nothing behind either.
#[cfg(test)]
struct TestDir(PathBuf);

#[cfg(test)]
impl TestDir {
    fn new(name: &str) -> TestDir {
        let dir = std::env::temp_dir().join(format!("hotloop-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TestDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

#[cfg(test)]
impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
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
        assert_eq!(a.peers.len(), 6);
        assert!(a.peers.contains(&PeerName::H2o) && a.uring_off.is_empty());
        assert_eq!(a.out, PathBuf::from("bench-out"));
    }

    #[test]
    fn uring_off_adds_a_row_per_feature_with_its_variable() {
        let a = Cli::parse_from(["bench", "--uring-off", "registered-ring"]).bench;
        assert_eq!(a.uring_off, vec![UringFeature::RegisteredRing]);
        let specs = uring_specs("uring", &["--driver", "uring"], &a.uring_off);
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[1].config, "uring, registered-ring off");
        match &specs[1].kind {
            ServerKind::Serve(args, env) => {
                assert_eq!(args, &["--driver", "uring"]);
                assert_eq!(env, &[("HOTLOOP_URING_REGISTERED_RING".to_string(), "0".to_string())]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn direct_fds_on_is_set_by_the_row_not_inherited() {
        let specs = uring_specs("uring", &["--driver", "uring"], &[UringFeature::DirectFds]);
        assert_eq!(specs[0].config, "uring, direct-fds on");
        let env = |spec: &ServerSpec| match &spec.kind {
            ServerKind::Serve(_, env) => env.clone(),
            other => panic!("{other:?}"),
        };
        let var = |v: &str| vec![("HOTLOOP_URING_DIRECT_FDS".to_string(), v.to_string())];
        assert_eq!((env(&specs[0]), env(&specs[1])), (var("1"), var("0")));
    }

    #[test]
    fn the_benchs_own_hotloop_variables_are_named_in_the_report() {
        let vars = |list: &[(&str, &str)]| {
            list.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))).collect::<Vec<_>>()
        };
        assert_eq!(env_note(vars(&[("PATH", "/bin")])), None);
        let note = env_note(vars(&[("HOTLOOP_DRIVER", "uring"), ("PATH", "/bin")])).unwrap();
        assert!(note.starts_with("not passed to the servers: HOTLOOP_DRIVER=uring "), "{note}");
    }

    #[test]
    fn lists_and_limits_parse() {
        let a = Cli::parse_from([
            "bench",
            "--quick",
            "--scenario",
            "churn,accept-burst",
            "--peers",
            "tokio,floor,floor-uring",
            "--out",
            "/tmp/x",
            "--repeats",
            "5",
        ])
        .bench;
        assert!(a.quick);
        assert_eq!(a.scenario, vec![ScenarioName::Churn, ScenarioName::AcceptBurst]);
        assert_eq!(a.peers, vec![PeerName::Tokio, PeerName::Floor, PeerName::FloorUring]);
        assert_eq!(a.repeats, Some(5));
        assert!(Cli::try_parse_from(["bench", "--repeats", "0"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--scenario", "nope"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--peers", "apache"]).is_err());
    }

    #[test]
    fn placement_splits_cpus() {
        let at = |cpus: &[usize], workers| {
            let p = placement(cpus, workers);
            (p.server_cpus, p.load_cpu, p.workers)
        };
        assert_eq!(at(&[0], None), (vec![], None, 1));
        assert_eq!(at(&[0, 1], None), (vec![0], Some(1), 1));
        assert_eq!(at(&[0, 1, 2, 3], None), (vec![0, 1], Some(2), 2));
        assert!(placement(&[0, 1], None).shared_note().is_none());
    }

    #[test]
    fn workers_set_the_placement() {
        let at = |cpus: &[usize], workers| {
            let p = placement(cpus, Some(workers));
            (p.server_cpus, p.load_cpu, p.workers)
        };
        // One worker on two CPUs is the default placement.
        assert_eq!(at(&[0, 1], 1), (vec![0], Some(1), 1));
        assert_eq!(at(&[0, 1, 2, 3], 1), (vec![0], Some(1), 1));
        assert_eq!(at(&[0, 1, 2, 3], 3), (vec![0, 1, 2], Some(3), 3));
        // Not enough CPUs for the load's own: the servers take them all.
        assert_eq!(at(&[0, 1], 2), (vec![0, 1], None, 2));
        assert_eq!(at(&[0, 1], 4), (vec![0, 1], None, 4));
        assert_eq!(at(&[5], 2), (vec![], None, 2));
        let note = placement(&[0, 1], Some(2)).shared_note().unwrap();
        assert!(note.contains("2 workers on CPUs [0, 1]"), "{note}");
        assert!(placement(&[0, 1, 2], Some(2)).shared_note().is_none());
    }

    #[test]
    fn workers_parse_within_limits() {
        assert_eq!(Cli::parse_from(["bench"]).bench.workers, None);
        assert_eq!(Cli::parse_from(["bench", "--workers", "2"]).bench.workers, Some(2));
        assert!(Cli::try_parse_from(["bench", "--workers", "0"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--workers", "1025"]).is_err());
    }
}
