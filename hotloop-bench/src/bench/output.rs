//! What the suite shows and writes: the terminal tables, `results.json` and
//! the SVG charts.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::report::{wrap, wrap_command, Scope, LINE_WIDTH_MAX};
use super::{chart, report, Ctx, ScenarioResult};

/// Prints a scenario's table, notes and comparisons on stdout.
pub fn print_result(result: &ScenarioResult) {
    print!("{}", render_result(result));
}

/// A scenario's table, notes and comparisons as printed, no line wider
/// than [`LINE_WIDTH_MAX`].
pub fn render_result(result: &ScenarioResult) -> String {
    let mut out = String::new();
    let mut put = |lines: Vec<String>| {
        for line in lines {
            let _ = writeln!(out, "{line}");
        }
    };
    put(vec![String::new()]);
    put(wrap(&format!("{}: {}", result.name, result.title), LINE_WIDTH_MAX, "== ", "   "));
    put(wrap(&format!("reference: {}", result.reference), LINE_WIDTH_MAX, "   ", "     "));
    for load in &result.loads {
        put(wrap_command(load, LINE_WIDTH_MAX, "   load: ", "           "));
    }
    for line in &result.setup {
        put(wrap(line, LINE_WIDTH_MAX, "   ", "     "));
    }
    if result.rows.is_empty() {
        put(vec![" (no figures: see above)".into()]);
    }
    out.push_str(&report::render_table(&result.rows, &result.columns));
    for row in &result.rows {
        for note in &row.notes {
            let text = format!("note [{}{}]: {note}", group_prefix(&row.group), row.label());
            out.extend(wrap(&text, LINE_WIDTH_MAX, "   ", "     ").into_iter().map(|l| l + "\n"));
        }
    }
    for row in &result.rows {
        for e in &row.excluded {
            let what = match e.scope {
                Scope::All => "no ratio",
                Scope::Latency => "no latency ratio",
            };
            let text =
                format!("* [{}{}]: {what}: {}", group_prefix(&row.group), row.label(), e.reason);
            out.extend(wrap(&text, LINE_WIDTH_MAX, "   ", "     ").into_iter().map(|l| l + "\n"));
        }
    }
    if !result.comparisons.is_empty() {
        out.push_str(" hotloop's ratio (hotloop / other):\n");
        for line in report::render_comparisons(&result.comparisons, &result.columns).lines() {
            let line = line.trim_start();
            out.extend(wrap(line, LINE_WIDTH_MAX, " ", "     ").into_iter().map(|l| l + "\n"));
        }
    }
    out
}

fn group_prefix(group: &str) -> String {
    if group.is_empty() {
        String::new()
    } else {
        format!("{group}: ")
    }
}

/// Writes a scenario's bar chart and latency chart into `out`; returns
/// the files written. A scenario none of whose rows has its headline
/// figure gets no bar chart (its table says why).
pub fn write_charts(out: &Path, result: &ScenarioResult) -> io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let Some(headline) = result.columns.first() else { return Ok(written) };
    let bars: Vec<(String, f64)> = result
        .rows
        .iter()
        // A row without the figure (a starved or failed configuration)
        // keeps its bar, drawn empty and labelled, rather than vanishing.
        .map(|r| {
            let value = r.get(headline.key).unwrap_or(f64::NAN);
            (format!("{}{}", group_prefix(&r.group), r.label()), value)
        })
        .collect();
    if bars.iter().any(|(_, v)| v.is_finite()) {
        let svg =
            chart::bars(&format!("{}: {}", result.name, headline.header), headline.header, &bars);
        let path = out.join(format!("{}-{}.svg", result.name, headline.key));
        std::fs::write(&path, svg)?;
        written.push(path);
    }
    let series: Vec<(String, Vec<(f64, u64)>)> = result
        .rows
        .iter()
        .filter(|r| !r.histogram_us.is_empty())
        .map(|r| (format!("{}{}", group_prefix(&r.group), r.label()), r.histogram_us.clone()))
        .collect();
    if !series.is_empty() {
        let svg = chart::latency_cdf(&format!("{}: latency distribution", result.name), &series);
        let path = out.join(format!("{}-latency.svg", result.name));
        std::fs::write(&path, svg)?;
        written.push(path);
    }
    Ok(written)
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

/// Writes every scenario so far to `results.json`.
pub fn write_results(ctx: &Ctx, results: &[ScenarioResult]) -> io::Result<()> {
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

/// The limit on open files for this process (and so its children), raised
/// to the hard limit first.
pub fn open_files_limit() -> Option<u64> {
    hotloop::raise_nofile_limit().ok()
}

#[cfg(test)]
mod tests {
    use super::super::measure::{run_figures, summarise, Reading};
    use super::super::report::{LoadReport, Row};
    use super::super::{
        accept_burst, balance, churn, hyper, keepalive, serial, short_streams, storm, timers,
        ScenarioName,
    };
    use super::*;
    use std::collections::BTreeMap;
    use std::time::Duration;

    /// A load report with every figure a run can give, scaled by `k`.
    fn load_report(k: f64) -> LoadReport {
        let mut r = LoadReport {
            completed: 10_000,
            rate_per_s: 2_000.0 * k,
            elapsed_s: 5.0 * k,
            cpu_s: 0.5,
            histogram_us: vec![(50.0 * k, 9_000), (900.0 * k, 990), (12_000.0 * k, 10)],
            ..Default::default()
        };
        let l = &mut r.latency_us;
        (l.mean, l.p50, l.p90, l.p99, l.p999, l.max) =
            (90.0 * k, 50.0 * k, 120.0 * k, 900.0 * k, 12_000.0 * k, 15_000.0 * k);
        r.request_latency_us = Some(r.latency_us);
        r.generator_lag_us = Some(r.latency_us);
        r.server_latency_us = Some(r.latency_us);
        r
    }

    fn cpu(seconds: f64) -> super::super::proc::CpuTime {
        super::super::proc::CpuTime { seconds, resolution_s: 1e-6 }
    }

    fn counters(accepted: f64) -> BTreeMap<String, f64> {
        [("accepted", accepted), ("accept_wakeups", accepted / 8.0), ("registrations", 2.0)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    /// Three repeats' figures for one row, as the scenario's own code
    /// computes them from a run.
    fn repeats(name: ScenarioName, row: usize) -> Vec<BTreeMap<String, f64>> {
        (1..=3)
            .map(|repeat| {
                let k = 1.0 + 0.1 * (row + repeat) as f64;
                let r = load_report(k);
                match name {
                    ScenarioName::Storm => {
                        let (established, _) = storm::loads(500, storm::TIMING_QUICK);
                        storm::figures(&r, &load_report(k * 2.0), &established, 2.0)
                    }
                    ScenarioName::Balance => balance::trial_figures(
                        &[r.clone(), r.clone()],
                        &[load_report(k * 3.0)],
                        &[60.0 * k, 40.0],
                        &[9.0, 7.0],
                        3.0,
                    ),
                    _ => run_figures(
                        &r,
                        5.0,
                        1,
                        &Reading { cpu: Some(cpu(1.0)), stats: Some(counters(100.0)) },
                        &Reading { cpu: Some(cpu(1.5 * k)), stats: Some(counters(10_100.0)) },
                    ),
                }
            })
            .collect()
    }

    /// A scenario's result as a run of it gives one: its own columns, and
    /// rows whose figures come from its own code (the timers scenario's are
    /// measured), beside a server that could not start, with long setup
    /// lines, load commands and notes.
    fn fixture(name: ScenarioName) -> ScenarioResult {
        let columns = match name {
            ScenarioName::AcceptBurst => accept_burst::columns(),
            ScenarioName::Serial => serial::columns(),
            ScenarioName::Churn => churn::columns(),
            ScenarioName::Storm => storm::columns(2),
            ScenarioName::ShortStreams => short_streams::columns(),
            ScenarioName::Timers => timers::columns(),
            ScenarioName::Keepalive => keepalive::columns(),
            ScenarioName::Hyper => hyper::columns(),
            ScenarioName::Balance => balance::columns(),
        };
        let mut result = ScenarioResult::new(name.as_str(), &"a title ".repeat(20), "ref", columns);
        result.setup.push("a setup line that goes on and on ".repeat(8));
        result.setup.push(format!("a path: /{}", "very-long-directory-name/".repeat(8)));
        result
            .loads
            .push(format!("hotloop-bench load --addr 127.0.0.1:PORT {}", "--flag 1 ".repeat(30)));
        if name == ScenarioName::Timers {
            result.rows = timers::measure_all(Duration::from_millis(3));
        } else {
            for (i, config) in ["epoll max-accepts unlimited, a longer configuration name", "uring"]
                .into_iter()
                .enumerate()
            {
                let mut row = Row::new("concurrency 256", "hotloop", config);
                row.workers = Some(2);
                row.notes.push("repeat 2: a note that is rather long ".repeat(6));
                assert!(summarise(&mut row, &repeats(name, i)));
                row.histogram_us = load_report(1.0).histogram_us;
                result.rows.push(row);
            }
            let why = format!("exited at start: {}", "a long reason ".repeat(15));
            result.rows.push(Row::unavailable("concurrency 256", "floor", "busy-poll", why));
        }
        result.compare();
        result
    }

    #[test]
    fn no_printed_line_is_wider_than_120_columns() {
        for name in ScenarioName::ALL {
            let text = render_result(&fixture(name));
            for line in text.lines() {
                assert!(
                    line.chars().count() <= LINE_WIDTH_MAX,
                    "{}: {} chars: {line}",
                    name.as_str(),
                    line.chars().count()
                );
            }
            // Every row is still in the table, under every part of it.
            assert!(text.contains("unavailable: exited at start") || name == ScenarioName::Timers);
        }
    }

    #[test]
    fn rows_left_out_of_the_ratios_are_marked_and_say_why() {
        let mut result = fixture(ScenarioName::Churn);
        result.rows[1].exclude(
            crate::bench::report::Scope::All,
            "reference only: answers without the 60 µs of work".into(),
        );
        let text = render_result(&result);
        assert!(text.contains(" hotloop uring * "), "{text}");
        assert!(
            text.contains("* [concurrency 256: hotloop uring]: no ratio: reference only"),
            "{text}"
        );
        // Every table shows the errors.
        for name in ScenarioName::ALL {
            let columns = fixture(name).columns;
            let errors = columns.iter().any(|c| c.key.contains("errors"));
            assert!(errors || name == ScenarioName::Timers, "{}", name.as_str());
        }
    }

    #[test]
    fn every_scenarios_chart_has_a_bar_for_each_measured_row() {
        let guard = super::super::TestDir::new("charts");
        let dir = guard.path();
        for name in ScenarioName::ALL {
            let result = fixture(name);
            let written = write_charts(dir, &result).unwrap();
            let headline = result.columns[0].key;
            let bars_path = dir.join(format!("{}-{headline}.svg", name.as_str()));
            assert!(written.contains(&bars_path), "{}: no bar chart", name.as_str());
            let svg = std::fs::read_to_string(&bars_path).unwrap();
            let widths: Vec<f64> = svg
                .lines()
                .filter_map(|l| l.split("<rect x=\"300\"").nth(1))
                .filter_map(|r| r.split("width=\"").nth(1)?.split('"').next()?.parse().ok())
                .collect();
            let measured = result.rows.iter().filter(|r| r.unavailable.is_none()).count();
            assert_eq!(widths.len(), result.rows.len(), "{}", name.as_str());
            assert_eq!(
                widths.iter().filter(|w| **w > 0.0).count(),
                measured,
                "{}: {widths:?}",
                name.as_str()
            );
        }
        // No bar chart at all rather than one without bars.
        let mut empty = fixture(ScenarioName::Hyper);
        for row in &mut empty.rows {
            row.metrics.clear();
        }
        empty.name = "hyper-empty";
        assert!(write_charts(dir, &empty)
            .unwrap()
            .iter()
            .all(|p| !p.ends_with("hyper-empty-rate_per_s.svg")));
    }
}
