//! Measuring one server configuration: start it, warm it up, run the load
//! `--repeats` times while reading the server's CPU time and counters, stop it.
//! Several configurations can be measured side by side, their repeats
//! interleaved; a busy-polling one is held stopped while another runs.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use super::report::{self, LoadReport, Row, Scope, Summary};
use super::server::{self, Running, ServerKind, ServerSpec, Workload};
use super::{
    figures_of, find_on_path, last_line, proc, Ctx, Figures, Histogram, LoadSpec, PeerName,
    METRIC_CPU_PER_1K, METRIC_CPU_PER_1K_RES, METRIC_CPU_UTIL, METRIC_IDLE_CPU, METRIC_RATE,
    WARMUP_MAX_FULL, WARMUP_MAX_QUICK, WARMUP_REQUESTS_FULL, WARMUP_REQUESTS_QUICK,
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
                    row: Row {
                        busy_polls: spec.busy_polls(),
                        ..Row::new(group, &spec.server, &spec.config)
                    },
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
            mark_row(&mut slot.row, spec, work, &running);
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
        let before = Reading { cpu: running.cpu_time(), stats: running.stats() };
        let started = Instant::now();
        let report = self.run_load(running, work.load_proto(), load, title)?;
        let wall_s = started.elapsed().as_secs_f64();
        let after = Reading { cpu: running.cpu_time(), stats: running.stats() };
        let f = run_figures(&report, wall_s, self.workers, &before, &after);
        Ok((f, report.histogram_us))
    }

    /// The server's CPU time over `window` with no load, in percent of one
    /// worker's CPU; read from its CPU clock.
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

/// Marks a row at its server's start: a peer that skips the workload's
/// per-request work is a reference row, and a setup other than the one
/// named is relabelled; neither takes part in the ratios.
pub(super) fn mark_row(row: &mut Row, spec: &ServerSpec, work: &Workload, running: &Running) {
    if work.work_us > 0 && !spec.does_work() {
        row.exclude(
            Scope::All,
            format!(
                "reference only: answers without the {} µs of work per request the other servers do",
                work.work_us
            ),
        );
    }
    if let Some((suffix, why)) = &running.substituted {
        row.config = format!("{} {suffix}", row.config).trim().to_string();
        row.exclude(Scope::All, why.clone());
    }
}

/// What is read of a server before and after a measured run.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    /// Its CPU time so far.
    pub cpu: Option<proc::CpuTime>,
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
    if let (Some(before), Some(after)) = (before.cpu, after.cpu) {
        let cpu = after.seconds - before.seconds;
        // A difference of two readings is known to within the clock's step.
        let resolution = before.resolution_s.max(after.resolution_s);
        f.insert("server_cpu_s".into(), cpu);
        f.insert("server_cpu_res_s".into(), resolution);
        if report.completed > 0 {
            let per_1k = 1000.0 / report.completed as f64;
            f.insert(METRIC_CPU_PER_1K.into(), cpu * per_1k);
            f.insert(METRIC_CPU_PER_1K_RES.into(), resolution * per_1k);
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

#[cfg(test)]
mod tests {
    use super::super::proc::CpuTime;
    use super::*;

    fn report(completed: u64) -> LoadReport {
        LoadReport { completed, ..Default::default() }
    }

    #[test]
    fn cpu_per_request_carries_the_clocks_resolution() {
        let reading = |seconds, resolution_s| Reading {
            cpu: Some(CpuTime { seconds, resolution_s }),
            stats: None,
        };
        // 1,000 connections, 30 ms of CPU read on a 10 ms clock: known to
        // within 0.01 s per 1,000.
        let f = run_figures(&report(1_000), 0.5, 1, &reading(1.0, 0.01), &reading(1.03, 0.01));
        assert!((f[METRIC_CPU_PER_1K] - 0.03).abs() < 1e-12);
        assert!((f[METRIC_CPU_PER_1K_RES] - 0.01).abs() < 1e-12);
        let f = run_figures(&report(1_000), 0.5, 1, &reading(1.0, 1e-6), &reading(1.03, 1e-6));
        assert!(f[METRIC_CPU_PER_1K_RES] < 1e-5);
    }

    #[test]
    fn peers_without_the_work_and_substituted_setups_are_marked() {
        let work = Workload { proto: "http".into(), body_size: 1024, work_us: 60 };
        let running = Running::for_tests();
        let nginx = ServerSpec {
            server: "nginx".into(),
            config: String::new(),
            kind: ServerKind::Nginx { program: "nginx".into(), multi_accept: true },
        };
        let mut row = Row::new("1K body", "nginx", "");
        mark_row(&mut row, &nginx, &work, &running);
        assert!(row.excluded_from("rate_per_s").unwrap().contains("60 µs of work"));
        // Without work per request, nginx is a peer like any other.
        let mut row = Row::new("", "nginx", "");
        mark_row(&mut row, &nginx, &Workload { work_us: 0, ..work.clone() }, &running);
        assert!(row.excluded.is_empty());
        // A floor does the work.
        let mut row = Row::new("", "floor", "");
        mark_row(&mut row, &ServerSpec::peer("floor"), &work, &running);
        assert!(row.excluded.is_empty());
        // Busy polling moved to the backend: a label of its own, no ratio.
        let mut running = Running::for_tests();
        running.substituted =
            Some(("(busy-poll always on the backend)".into(), "substituted: refused".into()));
        let spec = ServerSpec {
            server: "hotloop".into(),
            config: "proxy busy-poll always".into(),
            kind: ServerKind::Proxy { busy_poll: "always".into(), http: false },
        };
        let mut row = Row::new("TCP forwarding", "hotloop", &spec.config);
        mark_row(&mut row, &spec, &Workload { work_us: 0, ..work }, &running);
        assert_eq!(row.config, "proxy busy-poll always (busy-poll always on the backend)");
        assert_eq!(row.excluded_from("rate_per_s"), Some("substituted: refused"));
    }
}
