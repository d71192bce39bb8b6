//! Measuring one server configuration: start it, warm it up, run the load
//! `--repeats` times while reading the server's CPU time and counters, stop it.
//! Several configurations can be measured side by side, their repeats
//! interleaved; a busy-polling one is held stopped while another runs.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use super::report::{self, LoadReport, Row, Summary};
use super::server::{self, Running, ServerKind, ServerSpec, Workload};
use super::{
    figures_of, find_on_path, last_line, proc, Ctx, Figures, Histogram, LoadSpec, PeerName,
    METRIC_CPU_PER_1K, METRIC_CPU_UTIL, METRIC_IDLE_CPU, METRIC_RATE, WARMUP_MAX_FULL,
    WARMUP_MAX_QUICK, WARMUP_REQUESTS_FULL, WARMUP_REQUESTS_QUICK,
};

impl Ctx {
    /// The peers enabled for `proto`, as server specs; nginx, haproxy and
    /// h2o only speak HTTP here and appear only when found on PATH.
    pub fn peer_specs(&self, proto: &str, setup: &mut Vec<String>) -> Vec<ServerSpec> {
        let mut specs = Vec::new();
        for &peer in &self.peers {
            match peer {
                PeerName::Tokio => specs.push(ServerSpec::peer("tokio")),
                PeerName::Monoio => specs.push(ServerSpec::peer("monoio")),
                PeerName::Floor => specs.push(ServerSpec::peer("floor")),
                // Only where a scenario asks for it: see `floor_uring_spec`.
                PeerName::FloorUring => {}
                PeerName::Nginx | PeerName::Haproxy | PeerName::H2o => {
                    let name = match peer {
                        PeerName::Nginx => "nginx",
                        PeerName::Haproxy => "haproxy",
                        _ => "h2o",
                    };
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
                                kind: match peer {
                                    PeerName::Nginx => {
                                        ServerKind::Nginx { program, multi_accept: true }
                                    }
                                    PeerName::Haproxy => {
                                        ServerKind::Haproxy { program, maxaccept: None }
                                    }
                                    _ => ServerKind::H2o { program },
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

    /// The io_uring floor, if enabled: a `floor` row configured `io_uring`,
    /// so hotloop is compared with the better of the two floors.
    pub fn floor_uring_spec(&self) -> Option<ServerSpec> {
        self.peers.contains(&PeerName::FloorUring).then(|| ServerSpec {
            server: "floor".into(),
            config: "io_uring".into(),
            kind: ServerKind::Peer("floor-uring".into(), Vec::new()),
        })
    }

    /// The enabled floors with `--busy-poll` (`floor busy-poll`, `floor
    /// io_uring busy-poll`): the reference for hotloop's busy polling, which
    /// a floor that sleeps in the kernel is not.
    pub fn floor_busy_specs(&self) -> Vec<ServerSpec> {
        let mut specs = Vec::new();
        for (peer, name, config) in [
            (PeerName::Floor, "floor", "busy-poll"),
            (PeerName::FloorUring, "floor-uring", "io_uring busy-poll"),
        ] {
            if self.peers.contains(&peer) {
                specs.push(ServerSpec {
                    server: "floor".into(),
                    config: config.into(),
                    kind: ServerKind::Peer(name.into(), vec!["--busy-poll".into()]),
                });
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
        let mut rows = self.measure_side_by_side(group, std::slice::from_ref(spec), work, load);
        rows.pop().expect("one row per spec")
    }

    /// [`Ctx::measure`] for several servers at once, their repeats
    /// interleaved: all are started and warmed up, then each repeat runs
    /// the load against every server in turn. A shared machine's slow spell
    /// then falls on every server alike instead of on whichever one was
    /// being measured, and the medians compare, round by round. The servers
    /// wait idle on their CPU while another is measured; one that
    /// busy-polls ([`ServerSpec::busy_polls`]) would spin there, so it is
    /// held stopped (SIGSTOP) until its turn. Returns one row per spec, in
    /// order.
    pub fn measure_side_by_side(
        &mut self,
        group: &str,
        specs: &[ServerSpec],
        work: &Workload,
        load: &LoadSpec,
    ) -> Vec<Row> {
        self.measure_rounds(group, specs, work, load, None)
    }

    /// [`Ctx::measure_side_by_side`], and after each measured run the server
    /// is left idle for `idle_window` while its CPU time is read: the
    /// [`METRIC_IDLE_CPU`] figure, what busy polling costs with no load.
    pub fn measure_side_by_side_then_idle(
        &mut self,
        group: &str,
        specs: &[ServerSpec],
        work: &Workload,
        load: &LoadSpec,
        idle_window: Duration,
    ) -> Vec<Row> {
        self.measure_rounds(group, specs, work, load, Some(idle_window))
    }

    fn measure_rounds(
        &mut self,
        group: &str,
        specs: &[ServerSpec],
        work: &Workload,
        load: &LoadSpec,
        idle_window: Option<Duration>,
    ) -> Vec<Row> {
        // Alone, a busy-polling server takes no CPU from another.
        let hold_spinners = specs.len() > 1;
        let mut slots: Vec<Slot> = specs
            .iter()
            .map(|spec| {
                let label = if spec.config.is_empty() {
                    spec.server.clone()
                } else {
                    format!("{} {}", spec.server, spec.config)
                };
                Slot {
                    title: if group.is_empty() { label } else { format!("{group}: {label}") },
                    row: Row::new(group, &spec.server, &spec.config),
                    running: None,
                    held: hold_spinners && spec.busy_polls(),
                    samples: Vec::new(),
                    histograms: Vec::new(),
                }
            })
            .collect();
        for (slot, spec) in slots.iter_mut().zip(specs) {
            if let Some(why) = &self.load_missing {
                slot.row = Row::unavailable(group, &spec.server, &spec.config, why.clone());
                continue;
            }
            self.progress(&format!("{}: starting", slot.title));
            let running = match server::start(self, spec, work) {
                Ok(r) => r,
                Err(why) => {
                    self.progress(&format!("{}: unavailable: {why}", slot.title));
                    slot.row = Row::unavailable(group, &spec.server, &spec.config, why);
                    continue;
                }
            };
            slot.row.notes.extend(running.notes.iter().cloned());
            self.note_load(load, work.load_proto());
            let (warmup_requests, warmup_max) = if self.quick {
                (WARMUP_REQUESTS_QUICK, WARMUP_MAX_QUICK)
            } else {
                (WARMUP_REQUESTS_FULL, WARMUP_MAX_FULL)
            };
            let warmup = load.warmup_run(warmup_requests, warmup_max);
            if let Err(e) = self.run_load(&running, work.load_proto(), &warmup, &slot.title) {
                slot.row.notes.push(format!("warm-up failed: {e}"));
            }
            let mut running = running;
            if slot.held {
                running.set_stopped(true);
            }
            slot.running = Some(running);
        }
        for repeat in 1..=self.repeats {
            for slot in &mut slots {
                let Some(running) = slot.running.as_mut() else { continue };
                if slot.held {
                    running.set_stopped(false);
                }
                let measured = self.measure_once(running, work, load, &slot.title);
                let measured = match (measured, idle_window) {
                    (Ok((mut figures, histogram)), Some(window)) => {
                        if let Some(pct) = self.idle_cpu_pct(running, window) {
                            figures.insert(METRIC_IDLE_CPU.into(), pct);
                        }
                        Ok((figures, histogram))
                    }
                    (other, _) => other,
                };
                if slot.held {
                    running.set_stopped(true);
                }
                match measured {
                    Ok((figures, histogram)) => {
                        let rate = figures.get(METRIC_RATE).copied().unwrap_or(f64::NAN);
                        self.progress(&format!(
                            "{}: repeat {repeat}/{}: {} /s, p99 {} µs, server CPU {} s/1k",
                            slot.title,
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
                        slot.samples.push(figures);
                        slot.histograms.push(histogram);
                    }
                    Err(e) => {
                        self.progress(&format!("{}: repeat {repeat} failed: {e}", slot.title));
                        slot.row.notes.push(format!("repeat {repeat}: {e}"));
                    }
                }
                if running.exited() {
                    slot.row.notes.push("the server exited during the run".into());
                    slot.row.server_info = running.stats_text();
                    slot.running = None;
                }
            }
        }
        slots.into_iter().map(Slot::finish).collect()
    }

    fn measure_once(
        &mut self,
        running: &mut Running,
        work: &Workload,
        load: &LoadSpec,
        title: &str,
    ) -> Result<(Figures, Histogram), String> {
        let before = Reading { cpu_s: running.cpu_seconds(), stats: running.stats() };
        let started = Instant::now();
        let report = self.run_load(running, work.load_proto(), load, title)?;
        let wall_s = started.elapsed().as_secs_f64();
        let after = Reading { cpu_s: running.cpu_seconds(), stats: running.stats() };
        let f = run_figures(&report, wall_s, self.workers, &before, &after);
        Ok((f, report.histogram_us))
    }

    /// The server's CPU time over `window` with no load, in percent of one
    /// worker's CPU; read from /proc/PID/stat.
    fn idle_cpu_pct(&self, running: &Running, window: Duration) -> Option<f64> {
        let before = running.cpu_seconds()?;
        std::thread::sleep(window);
        let after = running.cpu_seconds()?;
        Some((after - before) / window.as_secs_f64() / self.workers as f64 * 100.0)
    }

    /// Runs `hotloop-bench load` against `running`, bounded in time.
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
        let (status, stdout) =
            proc::run_bounded("hotloop-bench load", cmd, &[], &log, load.timeout())
                .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("hotloop-bench load {status}: {}", last_line(&log)));
        }
        let report = LoadReport::parse(&stdout)?;
        if report.completed == 0 {
            return Err(format!("no request completed ({} errors)", report.errors_total()));
        }
        Ok(report)
    }
}

/// What is read of a server before and after a measured run.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    /// Its CPU seconds so far.
    pub cpu_s: Option<f64>,
    /// Its stats endpoint's counters.
    pub stats: Option<BTreeMap<String, f64>>,
}

/// The figures of one measured run: the load's report, lasting `wall_s`,
/// and what was read of the server (with `workers` workers) around it.
pub fn run_figures(
    report: &LoadReport,
    wall_s: f64,
    workers: usize,
    before: &Reading,
    after: &Reading,
) -> Figures {
    let mut f = figures_of(report);
    if let (Some(before), Some(after)) = (before.cpu_s, after.cpu_s) {
        let cpu = after - before;
        f.insert("server_cpu_s".into(), cpu);
        if report.completed > 0 {
            f.insert(METRIC_CPU_PER_1K.into(), cpu / report.completed as f64 * 1000.0);
        }
        f.insert(METRIC_CPU_UTIL.into(), cpu / wall_s / workers.max(1) as f64 * 100.0);
    }
    f.insert("wall_s".into(), wall_s);
    if let (Some(before), Some(after)) = (&before.stats, &after.stats) {
        for (key, value) in after {
            let delta = value - before.get(key).copied().unwrap_or(0.0);
            // Maxima are levels, not counters: report them as they are.
            let figure = if key.starts_with("max_") { *value } else { delta };
            f.insert(format!("stats_{key}"), figure);
        }
        let delta = |key: &str| {
            after.get(key).copied().unwrap_or(0.0) - before.get(key).copied().unwrap_or(0.0)
        };
        let accepted = delta("accepted");
        if accepted > 0.0 {
            f.insert("registrations_per_conn".into(), delta("registrations") / accepted);
            let wakeups = delta("accept_wakeups");
            if wakeups > 0.0 {
                f.insert("accepted_per_wakeup".into(), accepted / wakeups);
            }
        }
    }
    f
}

/// One server of [`Ctx::measure_side_by_side`] while it is measured.
struct Slot {
    title: String,
    row: Row,
    /// `None` once stopped, or if it never started (then `row` says why).
    running: Option<Running>,
    /// Busy-polls beside other servers: held stopped but for its turn.
    held: bool,
    samples: Vec<BTreeMap<String, f64>>,
    histograms: Vec<Histogram>,
}

impl Slot {
    /// Stops the server and folds its repeats into its row.
    fn finish(mut self) -> Row {
        if let Some(mut running) = self.running.take() {
            // Resumed, so it answers `GET /stats` and stops on SIGTERM.
            running.set_stopped(false);
            self.row.server_info = running.stats_text();
        }
        if self.row.unavailable.is_some() || !summarise(&mut self.row, &self.samples) {
            return self.row;
        }
        // Keep the histogram of the repeat with the median rate.
        let rates: Vec<f64> =
            self.samples.iter().map(|s| s.get(METRIC_RATE).copied().unwrap_or(0.0)).collect();
        let mid = report::median(&rates);
        let pick = rates
            .iter()
            .enumerate()
            .min_by(|a, b| (a.1 - mid).abs().total_cmp(&(b.1 - mid).abs()))
            .map_or(0, |(i, _)| i);
        self.row.histogram_us = self.histograms.swap_remove(pick);
        self.row
    }
}

/// Folds the repeats' figures into `row` as summaries (median and spread);
/// false, with `row` marked unavailable, if no repeat completed.
pub(super) fn summarise(row: &mut Row, samples: &[BTreeMap<String, f64>]) -> bool {
    if samples.is_empty() {
        let why = row.notes.last().cloned().unwrap_or_else(|| "no run completed".into());
        row.unavailable = Some(format!("load failed: {why}"));
        return false;
    }
    let keys: Vec<String> = samples.iter().flat_map(|s| s.keys().cloned()).collect();
    for key in keys {
        let values: Vec<f64> = samples.iter().filter_map(|s| s.get(&key).copied()).collect();
        if let Some(summary) = Summary::of(&values) {
            row.metrics.insert(key, summary);
        }
    }
    true
}
