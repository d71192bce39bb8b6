//! What the suite shows and writes: the terminal tables, `results.json` and
//! the SVG charts.

use std::io;
use std::path::Path;

use serde::Serialize;

use super::{chart, report, Ctx, ScenarioResult};

/// Prints a scenario's table, notes and comparisons on stdout.
pub fn print_result(result: &ScenarioResult) {
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

/// Writes a scenario's bar chart and latency chart into `out`.
pub fn write_charts(out: &Path, result: &ScenarioResult) -> io::Result<()> {
    let Some(headline) = result.columns.first() else { return Ok(()) };
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
