//! What a benchmark measured: the load generator's report, the statistics
//! over repeats, the ratios that compare hotloop with its peers, and the
//! terminal tables.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// The JSON object `hotloop-bench load --json` prints.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LoadReport {
    /// The load mode (serial, burst, churn, keepalive).
    pub mode: String,
    /// The protocol spoken (echo, http).
    pub proto: String,
    /// Connections the load used.
    pub connections: u64,
    /// Requests (or echo exchanges) completed.
    pub completed: u64,
    /// Error counts; `total` at least.
    pub errors: BTreeMap<String, serde_json::Value>,
    /// Seconds the measured part took.
    pub elapsed_s: f64,
    /// Completed per second.
    pub rate_per_s: f64,
    /// Latency summary in microseconds.
    pub latency_us: Latency,
    /// Connection modes: latency from the request's send, in microseconds.
    pub request_latency_us: Option<Latency>,
    /// CPU seconds the load generator used.
    pub cpu_s: f64,
    /// Open loop: the generator's own lag per request, in microseconds.
    pub generator_lag_us: Option<Latency>,
    /// Open loop: latency less the generator's lag, in microseconds, over
    /// the requests none of whose segments the kernel retransmitted.
    pub server_latency_us: Option<Latency>,
    /// Open loop: requests during which their socket retransmitted.
    pub retransmitted: Option<u64>,
    /// Open loop: the starts the schedule intended in the measured time.
    pub offered: Option<u64>,
    /// Open loop: of those, starts due but never sent (the generator fell
    /// behind its schedule).
    pub not_sent: Option<u64>,
    /// Units with no reply and no error when the duration ended.
    pub unfinished: u64,
    /// The most connections the load held open at once.
    pub max_in_flight: u64,
    /// `[value_us, count]` pairs.
    pub histogram_us: Vec<(f64, u64)>,
}

impl LoadReport {
    /// Parses the JSON object in `stdout`: the whole output, or the text
    /// from the last line that opens an object (on one line or pretty-printed).
    pub fn parse(stdout: &str) -> Result<LoadReport, String> {
        if let Ok(report) = serde_json::from_str(stdout.trim()) {
            return Ok(report);
        }
        let mut last_error = "the load generator printed no JSON object".to_string();
        let starts = stdout.match_indices('\n').map(|(i, _)| i + 1).chain([0]);
        let mut starts: Vec<usize> = starts.filter(|&i| stdout[i..].starts_with('{')).collect();
        starts.sort_unstable();
        for &start in starts.iter().rev() {
            let mut stream =
                serde_json::Deserializer::from_str(&stdout[start..]).into_iter::<LoadReport>();
            match stream.next() {
                Some(Ok(report)) => return Ok(report),
                Some(Err(e)) => last_error = format!("the load generator's JSON: {e}"),
                None => {}
            }
        }
        Err(last_error)
    }

    /// The error total, 0 when absent.
    pub fn errors_total(&self) -> u64 {
        self.errors.get("total").and_then(serde_json::Value::as_u64).unwrap_or(0)
    }

    /// Failed attempts in percent of all that finished (completed or failed).
    pub fn error_pct(&self) -> f64 {
        let errors = self.errors_total();
        let attempts = self.completed + errors;
        if attempts == 0 {
            0.0
        } else {
            100.0 * errors as f64 / attempts as f64
        }
    }

    /// Whether an open-loop run fell behind its schedule: more than
    /// [`BEHIND_PCT_MAX`] of the starts due never sent, so a queue built up
    /// (a few due in the last milliseconds, while the generator waited for
    /// its CPU, are in its latencies at their age and void nothing).
    pub fn behind_schedule(&self) -> bool {
        match (self.offered, self.not_sent) {
            (Some(offered), Some(not_sent)) if not_sent > 0 => {
                offered == 0 || 100.0 * not_sent as f64 / offered as f64 > BEHIND_PCT_MAX
            }
            _ => false,
        }
    }
}

/// Failed attempts, in percent, above which a row gets no ratio.
pub const ERROR_PCT_MAX: f64 = 0.1;
/// Starts not sent, in percent of those due, above which an open-loop run
/// fell behind its schedule and its latencies, lower bounds then, get no
/// ratio.
pub const BEHIND_PCT_MAX: f64 = 1.0;
/// Metric key: failed attempts in percent ([`LoadReport::error_pct`]).
pub const METRIC_ERROR_PCT: &str = "error_pct";
/// Metric key: 1 when an open-loop run fell behind its schedule, else 0.
pub const METRIC_BEHIND: &str = "behind";
/// The suffix of a metric key whose figure is another's resolution: a
/// difference of the other smaller than the two rows' resolutions together
/// is not measured, and gets no ratio.
pub const RESOLUTION_SUFFIX: &str = "_res";

/// Latency figures in microseconds: the load generator's own summary.
pub use hotloop_bench::load::hist::LatencySummary as Latency;

/// A figure measured once per repeat, summarised.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// The median of `values`.
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
    /// `(max - min) / median` in percent; 0 for one value.
    pub spread_pct: f64,
    /// Every repeat's value, in run order.
    pub values: Vec<f64>,
}

impl Summary {
    /// Summarises `values`; `None` when there are none or any is not finite.
    pub fn of(values: &[f64]) -> Option<Summary> {
        if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let median = median(values);
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let spread_pct = if median != 0.0 { (max - min) / median.abs() * 100.0 } else { 0.0 };
        Some(Summary { median, min, max, spread_pct, values: values.to_vec() })
    }
}

/// The median; the mean of the middle two for an even count; NaN when empty.
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

/// Whether more or less of a figure is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    /// Throughput-like.
    Higher,
    /// Time- and cost-like.
    Lower,
}

/// How hotloop's figure compares: `hotloop / other`, so above 1 is more.
pub fn ratio(hotloop: f64, other: f64) -> Option<f64> {
    if other == 0.0 || !other.is_finite() || !hotloop.is_finite() {
        None
    } else {
        Some(hotloop / other)
    }
}

/// The best of `values` by `better`, with its index.
pub fn best(values: &[f64], better: Better) -> Option<(usize, f64)> {
    let mut found: Option<(usize, f64)> = None;
    for (i, &v) in values.iter().enumerate() {
        if !v.is_finite() {
            continue;
        }
        let wins = match (found, better) {
            (None, _) => true,
            (Some((_, b)), Better::Higher) => v > b,
            (Some((_, b)), Better::Lower) => v < b,
        };
        if wins {
            found = Some((i, v));
        }
    }
    found
}

/// One column of a scenario table.
#[derive(Debug, Clone, Serialize)]
pub struct Column {
    /// The metric key in [`Row::metrics`].
    pub key: &'static str,
    /// The header shown.
    pub header: &'static str,
    /// Decimal places shown.
    pub decimals: usize,
    /// Which way is better.
    pub better: Better,
}

/// One server configuration's figures in one scenario group.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The part of the scenario (a body size, a concurrency, a path).
    pub group: String,
    /// hotloop, tokio, monoio, floor, nginx, haproxy or h2o.
    pub server: String,
    /// The configuration, such as `uring multishot`.
    pub config: String,
    /// `None` when measured; otherwise why the server could not be.
    pub unavailable: Option<String>,
    /// Figures by metric key.
    pub metrics: BTreeMap<String, Summary>,
    /// The latency histogram of the repeat with the median primary figure.
    pub histogram_us: Vec<(f64, u64)>,
    /// Remarks, such as a repeat that failed.
    pub notes: Vec<String>,
    /// What the server reported about itself (`driver`, `busy_poll`).
    pub server_info: BTreeMap<String, String>,
    /// Workers (threads or processes) the server ran with; `None` where
    /// no server ran (criterion's results).
    pub workers: Option<usize>,
    /// Why the row is left out of hotloop's ratios, and for which figures.
    pub excluded: Vec<Exclusion>,
    /// Whether the server busy-polled: ratios compare a busy-polling
    /// configuration only with busy-polling servers, and the others only
    /// with the others.
    pub busy_polls: bool,
}

/// A reason a row takes no part in hotloop's ratios.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Exclusion {
    /// Which of its figures it voids.
    pub scope: Scope,
    /// Why, as the report prints it.
    pub reason: String,
}

/// The figures an [`Exclusion`] voids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Every figure: the row measured something else (errors, another
    /// setup, less work).
    All,
    /// Latencies only: the load fell behind its schedule, so they lack the
    /// starts it never sent.
    Latency,
}

/// Whether `key` is a latency (or another time a request took): the
/// figures an open loop that fell behind understates.
pub fn is_latency_metric(key: &str) -> bool {
    key.ends_with("_us") || key.ends_with("_ms")
}

impl Row {
    /// A row with no figures yet.
    pub fn new(group: &str, server: &str, config: &str) -> Row {
        Row {
            group: group.to_string(),
            server: server.to_string(),
            config: config.to_string(),
            unavailable: None,
            metrics: BTreeMap::new(),
            histogram_us: Vec::new(),
            notes: Vec::new(),
            server_info: BTreeMap::new(),
            workers: None,
            excluded: Vec::new(),
            busy_polls: false,
        }
    }

    /// Leaves the row out of hotloop's ratios for the figures of `scope`.
    pub fn exclude(&mut self, scope: Scope, reason: String) {
        let exclusion = Exclusion { scope, reason };
        if !self.excluded.contains(&exclusion) {
            self.excluded.push(exclusion);
        }
    }

    /// Why the row gives no ratio on `metric`, if it does not.
    pub fn excluded_from(&self, metric: &str) -> Option<&str> {
        self.excluded
            .iter()
            .find(|e| e.scope == Scope::All || is_latency_metric(metric))
            .map(|e| e.reason.as_str())
    }

    /// Marks the row from its own figures: errors above [`ERROR_PCT_MAX`]
    /// in any repeat leave it out of every ratio; a repeat that fell behind
    /// its open-loop schedule leaves its latencies out.
    pub fn flag_from_figures(&mut self) {
        if self.unavailable.is_some() {
            return;
        }
        let worst = |key: &str| self.metrics.get(key).map(|s| s.max);
        let errors = worst(METRIC_ERROR_PCT).filter(|p| *p > ERROR_PCT_MAX);
        let behind = worst(METRIC_BEHIND).is_some_and(|b| b > 0.0);
        let not_sent = worst("not_sent");
        if let Some(pct) = errors {
            self.exclude(
                Scope::All,
                format!(
                    "errors: {pct:.2}% of attempts failed in a repeat (above {ERROR_PCT_MAX}%)"
                ),
            );
        }
        if behind {
            let how_many = not_sent.map_or(String::new(), |n| {
                format!(" (up to {} due starts never sent in a repeat)", format_figure(n, 0))
            });
            self.exclude(
                Scope::Latency,
                format!(
                    "the load fell behind its open-loop schedule{how_many}: its latencies, those \
                     starts counted at their age when the run ended, are lower bounds"
                ),
            );
        }
    }

    /// A row for a server that could not be measured, and why.
    pub fn unavailable(group: &str, server: &str, config: &str, why: String) -> Row {
        Row { unavailable: Some(why), ..Row::new(group, server, config) }
    }

    /// The median of `key`, if measured.
    pub fn get(&self, key: &str) -> Option<f64> {
        self.metrics.get(key).map(|s| s.median)
    }

    /// `server config`, or the server alone.
    pub fn label(&self) -> String {
        if self.config.is_empty() {
            self.server.clone()
        } else {
            format!("{} {}", self.server, self.config)
        }
    }
}

/// hotloop against the floor and the best peer on one figure in one group.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The group compared within.
    pub group: String,
    /// The metric key.
    pub metric: String,
    /// The hotloop configuration compared (named by the scenario, not the
    /// best of several).
    pub hotloop: String,
    /// Its figure.
    pub hotloop_value: f64,
    /// Why hotloop's row gives no ratio on this figure, if it does not.
    pub hotloop_no_ratio: Option<String>,
    /// The floor's figure, if measured (the best floor row).
    pub floor_value: Option<f64>,
    /// hotloop / floor.
    pub vs_floor: Option<f64>,
    /// Why there is a floor figure but no ratio to it.
    pub floor_no_ratio: Option<String>,
    /// The best peer other than the floor, if any was measured and takes
    /// part in the ratios.
    pub best_peer: Option<String>,
    /// Its figure.
    pub best_peer_value: Option<f64>,
    /// hotloop / best peer.
    pub vs_best_peer: Option<f64>,
    /// Why there is a peer figure but no ratio to it.
    pub peer_no_ratio: Option<String>,
}

/// Compares each hotloop configuration named in `compared` (in every group
/// that has it) with the best floor row and the best other peer that
/// busy-poll as it does, on each metric in `metrics`. Rows excluded for a metric (errors, another setup,
/// peers that skip the work, latencies of a load that fell behind) take no
/// part; a difference smaller than the two rows' resolutions together
/// (the `KEY_res` figure) gives no ratio.
pub fn compare<'r>(
    rows: &'r [Row],
    metrics: &[(&str, Better)],
    compared: &[String],
) -> Vec<Comparison> {
    let mut groups: Vec<&str> = Vec::new();
    for row in rows {
        if !groups.contains(&row.group.as_str()) {
            groups.push(&row.group);
        }
    }
    let mut out = Vec::new();
    for group in groups {
        let in_group = |r: &&Row| r.group == group && r.unavailable.is_none();
        for config in compared {
            let Some(hotloop) =
                rows.iter().filter(in_group).find(|r| r.server == "hotloop" && &r.config == config)
            else {
                continue;
            };
            for &(metric, better) in metrics {
                let Some(hotloop_value) = hotloop.get(metric) else { continue };
                let candidates = |pred: &dyn Fn(&Row) -> bool| -> Vec<(&'r Row, f64)> {
                    rows.iter()
                        .filter(in_group)
                        .filter(|r| pred(r) && r.excluded_from(metric).is_none())
                        .filter(|r| r.busy_polls == hotloop.busy_polls)
                        .filter_map(|r| r.get(metric).map(|v| (r, v)))
                        .collect()
                };
                let pick = |list: &[(&'r Row, f64)]| -> Option<(&'r Row, f64)> {
                    let values: Vec<f64> = list.iter().map(|&(_, v)| v).collect();
                    best(&values, better).map(|(i, v)| (list[i].0, v))
                };
                let floor = pick(&candidates(&|r| r.server == "floor"));
                let peer = pick(&candidates(&|r| r.server != "hotloop" && r.server != "floor"));
                let hotloop_no_ratio = hotloop.excluded_from(metric).map(str::to_string);
                let versus = |other: Option<(&Row, f64)>| -> (Option<f64>, Option<String>) {
                    let Some((row, value)) = other else { return (None, None) };
                    if hotloop_no_ratio.is_some() {
                        return (None, None);
                    }
                    if let Some(step) = resolution(hotloop, row, metric) {
                        if (hotloop_value - value).abs() <= step {
                            return (
                                None,
                                Some(format!(
                                    "no ratio: the difference is within what the clock resolves ({})",
                                    format_figure(step, 4)
                                )),
                            );
                        }
                    }
                    (ratio(hotloop_value, value), None)
                };
                let (vs_floor, floor_no_ratio) = versus(floor);
                let (vs_best_peer, peer_no_ratio) = versus(peer);
                out.push(Comparison {
                    group: group.to_string(),
                    metric: metric.to_string(),
                    hotloop: hotloop.label(),
                    hotloop_value,
                    hotloop_no_ratio,
                    floor_value: floor.map(|(_, v)| v),
                    vs_floor,
                    floor_no_ratio,
                    best_peer: peer.map(|(r, _)| r.label()),
                    best_peer_value: peer.map(|(_, v)| v),
                    vs_best_peer,
                    peer_no_ratio,
                });
            }
        }
    }
    out
}

/// The least difference of `metric` between rows `a` and `b` that is
/// measured: their resolutions (`METRIC_res`) together, when both have one.
fn resolution(a: &Row, b: &Row, metric: &str) -> Option<f64> {
    let key = format!("{metric}{RESOLUTION_SUFFIX}");
    // The coarsest repeat's, so a median difference is held to it.
    let step = |r: &Row| r.metrics.get(&key).map(|s| s.max);
    Some(step(a)? + step(b)?)
}

/// Formats a figure with `decimals` places and thousands separators.
pub fn format_figure(value: f64, decimals: usize) -> String {
    if !value.is_finite() {
        return "-".to_string();
    }
    let text = format!("{:.*}", decimals, value.abs());
    let (int, frac) = text.split_once('.').map_or((text.as_str(), None), |(i, f)| (i, Some(f)));
    let mut grouped = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let sign =
        if value < 0.0 && text.chars().any(|c| c.is_ascii_digit() && c != '0') { "-" } else { "" };
    match frac {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

/// The widest line the suite prints, in characters.
pub const LINE_WIDTH_MAX: usize = 120;

/// Breaks `text` at spaces into lines of at most `width` characters, the
/// first starting with `first`, the others with `rest`; a word longer than
/// a whole line is cut.
pub fn wrap(text: &str, width: usize, first: &str, rest: &str) -> Vec<String> {
    let words = text.split(' ').filter(|w| !w.is_empty()).map(str::to_string);
    wrap_words(words, width, first, rest, "")
}

/// [`wrap`] for a shell command: every line but the last ends with ` \`,
/// so the lines paste back into a shell as one command, and an option
/// stays on the line of its value.
pub fn wrap_command(text: &str, width: usize, first: &str, rest: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        match words.last_mut() {
            Some(option)
                if option.starts_with("--") && !option.contains(' ') && !word.starts_with('-') =>
            {
                option.push(' ');
                option.push_str(word);
            }
            _ => words.push(word.to_string()),
        }
    }
    wrap_words(words.into_iter(), width, first, rest, " \\")
}

fn wrap_words(
    words: impl Iterator<Item = String>,
    width: usize,
    first: &str,
    rest: &str,
    cont: &str,
) -> Vec<String> {
    let len = |s: &str| s.chars().count();
    let room = |indent: &str| width.saturating_sub(len(indent) + len(cont)).max(8);
    let mut lines = Vec::new();
    let mut line = first.to_string();
    let mut empty = true;
    for word in words {
        let indent = if lines.is_empty() { first } else { rest };
        let used = len(&line) - len(indent);
        let extra = if empty { 0 } else { 1 };
        if !empty && used + extra + len(&word) > room(indent) {
            lines.push(format!("{line}{cont}"));
            line = rest.to_string();
            empty = true;
        }
        let mut word: Vec<char> = word.chars().collect();
        // A word longer than a line is cut into whole lines.
        loop {
            let room = room(if lines.is_empty() { first } else { rest });
            if !empty || word.len() <= room {
                break;
            }
            let cut: String = word.drain(..room).collect();
            lines.push(format!("{line}{cut}{cont}"));
            line = rest.to_string();
        }
        if !empty {
            line.push(' ');
        }
        line.extend(word);
        empty = false;
    }
    lines.push(line);
    lines
}

/// Renders rows as a text table per group: the workers each server ran
/// with (when known), then a column per metric, the first one with its
/// spread over repeats. A table wider than [`LINE_WIDTH_MAX`] is cut into
/// several, each repeating the server column.
pub fn render_table(rows: &[Row], columns: &[Column]) -> String {
    let mut groups: Vec<&str> = Vec::new();
    for row in rows {
        if !groups.contains(&row.group.as_str()) {
            groups.push(&row.group);
        }
    }
    let mut out = String::new();
    for group in groups {
        if !group.is_empty() {
            for line in wrap(group, LINE_WIDTH_MAX, "\n ", "   ") {
                let _ = writeln!(out, "{line}");
            }
        }
        render_group(&mut out, rows.iter().filter(|r| r.group == group), columns);
    }
    out
}

/// One group's table (or tables, when it is too wide for one).
fn render_group<'a>(out: &mut String, rows: impl Iterator<Item = &'a Row>, columns: &[Column]) {
    let rows: Vec<&Row> = rows.collect();
    let show_workers = rows.iter().any(|r| r.workers.is_some());
    // The leading columns, repeated in every part, then the figures.
    let mut lead = vec![vec!["server".to_string()]];
    if show_workers {
        lead.push(vec!["workers".to_string()]);
    }
    let mut figures: Vec<Vec<String>> = Vec::new();
    for (i, column) in columns.iter().enumerate() {
        figures.push(vec![column.header.to_string()]);
        if i == 0 {
            figures.push(vec![format!("{} spread", column.header)]);
        }
    }
    let measured: Vec<&Row> = rows.iter().copied().filter(|r| r.unavailable.is_none()).collect();
    for row in &measured {
        // Marked: a row left out of some ratio; the report says why below.
        let mark = if row.excluded.is_empty() { "" } else { " *" };
        lead[0].push(format!("{}{mark}", row.label()));
        if show_workers {
            lead[1].push(row.workers.map_or("-".into(), |w| w.to_string()));
        }
        let mut at = 0;
        for (i, column) in columns.iter().enumerate() {
            let summary = row.metrics.get(column.key);
            figures[at]
                .push(summary.map_or("-".into(), |s| format_figure(s.median, column.decimals)));
            at += 1;
            if i == 0 {
                figures[at].push(summary.map_or("-".into(), |s| {
                    if s.values.len() > 1 {
                        format!("±{:.1}%", s.spread_pct / 2.0)
                    } else {
                        "n=1".into()
                    }
                }));
                at += 1;
            }
        }
    }
    let width = |cells: &[String]| cells.iter().map(|c| c.chars().count()).max().unwrap_or(0);
    // An unavailable row's label sets the server column's width too.
    let label_width = rows.iter().map(|r| r.label().chars().count()).max().unwrap_or(0);
    let lead_widths: Vec<usize> = lead
        .iter()
        .enumerate()
        .map(|(i, c)| if i == 0 { width(c).max(label_width) } else { width(c) })
        .collect();
    let figure_widths: Vec<usize> = figures.iter().map(|c| width(c)).collect();
    // Each cell takes its width and 3 more (" " before, " |" after); the
    // rule under the header is one longer than the widest line.
    let lead_room: usize = lead_widths.iter().map(|w| w + 3).sum();
    let mut parts: Vec<std::ops::Range<usize>> = Vec::new();
    let mut start = 0;
    while start < figures.len() {
        let mut end = start + 1;
        let mut used = lead_room + figure_widths[start] + 3;
        while end < figures.len() && used + figure_widths[end] + 3 <= LINE_WIDTH_MAX + 1 {
            used += figure_widths[end] + 3;
            end += 1;
        }
        parts.push(start..end);
        start = end;
    }
    if parts.is_empty() {
        parts.push(0..0);
    }
    for (p, part) in parts.iter().enumerate() {
        if p > 0 {
            out.push('\n');
        }
        // Line 0 is the header, then one line per measured row.
        let render = |out: &mut String, line: usize| {
            let lead_cells = lead.iter().zip(&lead_widths).map(|(c, w)| (&c[line], *w));
            let figure_cells = part.clone().map(|i| (&figures[i][line], figure_widths[i]));
            let mut text = String::new();
            for (i, (cell, width)) in lead_cells.chain(figure_cells).enumerate() {
                // The server's name goes left, everything else right.
                if i == 0 {
                    let _ = write!(text, " {cell:<width$} |");
                } else {
                    let _ = write!(text, " {cell:>width$} |");
                }
            }
            let _ = writeln!(out, "{}", text.trim_end_matches('|').trim_end());
        };
        render(out, 0);
        let rule: usize = lead_room + part.clone().map(|i| figure_widths[i] + 3).sum::<usize>();
        let _ = writeln!(out, " {}", "-".repeat(rule.saturating_sub(2)));
        for line in 1..=measured.len() {
            render(out, line);
        }
        // Rows without figures say why, once, under the first part.
        if p == 0 {
            for row in rows.iter().filter(|r| r.unavailable.is_some()) {
                let why = row.unavailable.as_deref().unwrap_or_default();
                let first = format!(" {:<label_width$} | ", row.label());
                let rest = " ".repeat(first.chars().count());
                for line in wrap(&format!("unavailable: {why}"), LINE_WIDTH_MAX, &first, &rest) {
                    let _ = writeln!(out, "{line}");
                }
            }
        }
    }
}

/// Renders comparisons as one line each.
pub fn render_comparisons(comparisons: &[Comparison], columns: &[Column]) -> String {
    let mut out = String::new();
    for c in comparisons {
        let decimals = columns.iter().find(|col| col.key == c.metric).map_or(2, |col| col.decimals);
        let header = columns
            .iter()
            .find(|col| col.key == c.metric)
            .map_or(c.metric.as_str(), |col| col.header);
        let group = if c.group.is_empty() { String::new() } else { format!("[{}] ", c.group) };
        let mut line =
            format!(" {group}{header}: {} {}", c.hotloop, format_figure(c.hotloop_value, decimals));
        if let Some(why) = &c.hotloop_no_ratio {
            let _ = writeln!(out, "{line}; no ratio: {why}");
            continue;
        }
        match (c.floor_value, c.vs_floor, &c.floor_no_ratio) {
            (Some(f), Some(r), _) => {
                let _ = write!(line, "; vs floor {} = x{r:.2}", format_figure(f, decimals));
            }
            (Some(f), None, Some(why)) => {
                let _ = write!(line, "; vs floor {}: {why}", format_figure(f, decimals));
            }
            _ => line.push_str("; floor not measured"),
        }
        match (&c.best_peer, c.best_peer_value, c.vs_best_peer, &c.peer_no_ratio) {
            (Some(p), Some(v), Some(r), _) => {
                let _ = write!(line, "; vs best peer {p} {} = x{r:.2}", format_figure(v, decimals));
            }
            (Some(p), Some(v), None, Some(why)) => {
                let _ = write!(line, "; vs best peer {p} {}: {why}", format_figure(v, decimals));
            }
            _ => line.push_str("; no comparable peer measured"),
        }
        let _ = writeln!(out, "{line}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(group: &str, server: &str, config: &str, value: f64) -> Row {
        let mut r = Row::new(group, server, config);
        r.metrics.insert("rate".into(), Summary::of(&[value]).unwrap());
        r
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn summary_spread_is_range_over_median() {
        let s = Summary::of(&[90.0, 100.0, 110.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (100.0, 90.0, 110.0));
        assert!((s.spread_pct - 20.0).abs() < 1e-9);
        assert_eq!(Summary::of(&[5.0]).unwrap().spread_pct, 0.0);
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[1.0, f64::NAN]).is_none());
    }

    #[test]
    fn ratios_and_best() {
        assert_eq!(ratio(8540.0, 4270.0), Some(2.0));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(best(&[3.0, 9.0, 1.0], Better::Higher), Some((1, 9.0)));
        assert_eq!(best(&[3.0, 9.0, 1.0], Better::Lower), Some((2, 1.0)));
        assert_eq!(best(&[f64::NAN, 2.0], Better::Lower), Some((1, 2.0)));
        assert_eq!(best(&[], Better::Lower), None);
    }

    fn compared(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn compare_takes_the_named_hotloop_row_and_the_best_floor_and_peer() {
        let rows = vec![
            row("1K", "hotloop", "unlimited", 100.0),
            row("1K", "hotloop", "32", 120.0),
            row("1K", "floor", "", 150.0),
            row("1K", "tokio", "", 90.0),
            row("1K", "monoio", "", 110.0),
            Row::unavailable("1K", "nginx", "", "not on PATH".into()),
            row("8K", "hotloop", "32", 50.0),
        ];
        let c = compare(&rows, &[("rate", Better::Higher)], &compared(&["unlimited"]));
        // The named configuration, not the best hotloop row (120, "32"),
        // and only in the groups that have it.
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].hotloop.as_str(), c[0].hotloop_value), ("hotloop unlimited", 100.0));
        assert_eq!(c[0].vs_floor, Some(100.0 / 150.0));
        assert_eq!(c[0].best_peer.as_deref(), Some("monoio"));
        let c = compare(&rows, &[("rate", Better::Higher)], &compared(&["32"]));
        assert_eq!(c.len(), 2);
        assert_eq!(c[1].vs_floor, None);
        assert_eq!(c[1].best_peer, None);
        let text = render_comparisons(&c, &[]);
        assert!(text.contains("x0.80") && text.contains("floor not measured"), "{text}");
        assert!(compare(&rows, &[("rate", Better::Higher)], &[]).is_empty());
    }

    #[test]
    fn compare_leaves_out_excluded_rows_and_unresolved_differences() {
        let mut nginx = row("", "nginx", "", 500.0);
        nginx.exclude(Scope::All, "reference only: no work".into());
        let mut errors = row("", "tokio", "", 400.0);
        errors.metrics.insert(METRIC_ERROR_PCT.into(), Summary::of(&[0.0, 2.5]).unwrap());
        errors.flag_from_figures();
        let rows =
            vec![row("", "hotloop", "default", 100.0), nginx, errors, row("", "monoio", "", 80.0)];
        let c = compare(&rows, &[("rate", Better::Higher)], &compared(&["default"]));
        // nginx (no work) and tokio (2.5% errors) would win; both are out.
        assert_eq!(c[0].best_peer.as_deref(), Some("monoio"));
        assert!(rows[2].excluded_from("rate").unwrap().contains("2.50%"));

        // A hotloop row with errors gets no ratio at all.
        let mut bad = row("", "hotloop", "default", 100.0);
        bad.metrics.insert(METRIC_ERROR_PCT.into(), Summary::of(&[0.2]).unwrap());
        bad.flag_from_figures();
        let c = compare(
            &[bad, row("", "floor", "", 90.0)],
            &[("rate", Better::Higher)],
            &compared(&["default"]),
        );
        assert!(c[0].hotloop_no_ratio.is_some() && c[0].vs_floor.is_none());
        assert!(render_comparisons(&c, &[]).contains("no ratio: errors"));

        // Behind schedule: latencies out, throughput still compared.
        let mut late = row("", "floor", "", 90.0);
        late.metrics.insert("p99_us".into(), Summary::of(&[9_000.0]).unwrap());
        late.metrics.insert(METRIC_BEHIND.into(), Summary::of(&[0.0, 1.0]).unwrap());
        late.metrics.insert("not_sent".into(), Summary::of(&[0.0, 412.0]).unwrap());
        late.flag_from_figures();
        let mut hot = row("", "hotloop", "default", 100.0);
        hot.metrics.insert("p99_us".into(), Summary::of(&[300.0]).unwrap());
        let rows = [hot, late];
        let metrics = [("rate", Better::Higher), ("p99_us", Better::Lower)];
        let c = compare(&rows, &metrics, &compared(&["default"]));
        assert_eq!(c[0].vs_floor, Some(100.0 / 90.0));
        assert_eq!((c[1].floor_value, c[1].vs_floor), (None, None));
        assert!(
            rows[1].excluded[0].reason.contains("up to 412 due starts"),
            "{:?}",
            rows[1].excluded
        );

        // A CPU difference below both rows' resolution gives no ratio.
        let cpu = |server: &str, v: f64, res: f64| {
            let mut r = row("", server, if server == "hotloop" { "default" } else { "" }, 0.0);
            r.metrics.insert("cpu".into(), Summary::of(&[v]).unwrap());
            r.metrics.insert("cpu_res".into(), Summary::of(&[res]).unwrap());
            r
        };
        let rows = [
            cpu("hotloop", 0.0300, 0.010),
            cpu("floor", 0.0290, 0.010),
            cpu("tokio", 0.0600, 0.010),
        ];
        let c = compare(&rows, &[("cpu", Better::Lower)], &compared(&["default"]));
        assert_eq!(c[0].vs_floor, None);
        assert!(c[0].floor_no_ratio.as_deref().unwrap().contains("resolves"));
        assert_eq!(c[0].vs_best_peer, Some(0.5));
        let text = render_comparisons(&c, &[]);
        assert!(text.contains("vs floor 0.03: no ratio"), "{text}");
    }

    #[test]
    fn busy_polling_is_compared_with_busy_polling() {
        let busy = |server: &str, config: &str, v: f64| Row {
            busy_polls: true,
            ..row("", server, config, v)
        };
        let rows = vec![
            row("", "hotloop", "off", 100.0),
            busy("hotloop", "always", 150.0),
            row("", "floor", "", 110.0),
            busy("floor", "busy-poll", 160.0),
        ];
        let c = compare(&rows, &[("rate", Better::Higher)], &compared(&["off", "always"]));
        assert_eq!(c[0].floor_value, Some(110.0));
        assert_eq!(c[1].floor_value, Some(160.0));
    }

    #[test]
    fn load_reports_say_when_they_fell_behind_and_how_many_failed() {
        let mut r = LoadReport {
            completed: 999,
            offered: Some(1_000),
            not_sent: Some(1),
            ..Default::default()
        };
        assert!(!r.behind_schedule());
        r.not_sent = Some(11);
        assert!(r.behind_schedule());
        r.offered = Some(100_000);
        assert!(!r.behind_schedule());
        r.offered = Some(0);
        assert!(r.behind_schedule());
        r.errors.insert("total".into(), 1.into());
        assert!((r.error_pct() - 0.1).abs() < 1e-12);
        assert_eq!(LoadReport::default().error_pct(), 0.0);
    }

    #[test]
    fn figures_get_thousands_separators() {
        assert_eq!(format_figure(1234567.891, 1), "1,234,567.9");
        assert_eq!(format_figure(999.0, 0), "999");
        assert_eq!(format_figure(-4640.0, 0), "-4,640");
        assert_eq!(format_figure(f64::NAN, 0), "-");
    }

    #[test]
    fn table_shows_unavailable_servers_and_spread() {
        let mut r = row("", "hotloop", "epoll", 1.0);
        r.metrics.insert("rate".into(), Summary::of(&[90.0, 100.0, 110.0]).unwrap());
        let rows = vec![r, Row::unavailable("", "floor", "", "exited at start".into())];
        let columns =
            [Column { key: "rate", header: "req/s", decimals: 0, better: Better::Higher }];
        let text = render_table(&rows, &columns);
        assert!(text.contains("±10.0%"), "{text}");
        assert!(text.contains("unavailable: exited at start"), "{text}");
        assert!(!text.contains("workers"), "{text}");
    }

    #[test]
    fn long_lines_wrap_at_spaces_within_the_width() {
        let text = "alpha beta gamma delta epsilon";
        assert_eq!(wrap(text, 16, "> ", "  "), ["> alpha beta", "  gamma delta", "  epsilon"]);
        assert_eq!(wrap("short", 120, "   ", "     "), ["   short"]);
        // A word longer than a line is cut, so no line is wider.
        let cut = wrap(&"x".repeat(30), 12, "", "  ");
        assert!(cut.iter().all(|l| l.chars().count() <= 12), "{cut:?}");
        assert_eq!(cut.concat().replace(' ', ""), "x".repeat(30));
        // Characters, not bytes: a µ counts once.
        assert_eq!(wrap("µµµµ µµµµ", 9, "", ""), ["µµµµ µµµµ"]);
    }

    #[test]
    fn commands_wrap_into_lines_a_shell_joins() {
        let cmd = "hotloop-bench load --addr 127.0.0.1:PORT --mode churn --connections 19000 --json --pin 1";
        let lines = wrap_command(cmd, 44, "   load: ", "     ");
        assert!(lines.iter().all(|l| l.chars().count() <= 44), "{lines:?}");
        assert!(lines[..lines.len() - 1].iter().all(|l| l.ends_with(" \\")));
        // An option and its value stay together.
        assert!(lines.iter().any(|l| l.contains("--connections 19000")), "{lines:?}");
        let joined: Vec<&str> = lines.iter().map(|l| l.trim_end_matches(" \\").trim()).collect();
        assert_eq!(joined.join(" "), format!("load: {cmd}"));
    }

    #[test]
    fn a_wide_table_is_cut_into_parts_that_fit() {
        let columns: Vec<Column> = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"]
            .into_iter()
            .map(|key| Column { key, header: key, decimals: 0, better: Better::Lower })
            .collect();
        let mut r = Row::new("", "hotloop", &"a long configuration name ".repeat(2));
        for c in &columns {
            r.metrics.insert(c.key.into(), Summary::of(&[123_456_789_012.0, 2.0]).unwrap());
        }
        let text =
            render_table(&[r, Row::unavailable("", "floor", "", "x ".repeat(100))], &columns);
        assert!(text.lines().all(|l| l.chars().count() <= LINE_WIDTH_MAX), "{text}");
        // Every column is shown once, and every part names the servers.
        let headers: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(" server "))
            .flat_map(|l| l.split('|').skip(1).map(str::trim))
            .collect();
        let mut expected: Vec<String> = columns.iter().map(|c| c.header.to_string()).collect();
        expected.insert(1, "alpha spread".into());
        assert_eq!(headers, expected, "{text}");
        let parts = text.matches(" server ").count();
        assert!(parts > 1 && text.matches(" hotloop a long").count() == parts, "{text}");
        assert_eq!(text.matches("unavailable").count(), 1, "{text}");
    }

    #[test]
    fn table_shows_each_rows_workers() {
        let mut one = row("", "hotloop", "epoll", 1.0);
        one.workers = Some(1);
        let mut two = row("", "floor", "", 2.0);
        two.workers = Some(2);
        let columns =
            [Column { key: "rate", header: "req/s", decimals: 0, better: Better::Higher }];
        let text = render_table(&[one, two], &columns);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("server") && lines[0].contains("| workers | req/s |"), "{text}");
        assert!(lines[2].starts_with(" hotloop epoll |       1 |"), "{text}");
        assert!(lines[3].starts_with(" floor         |       2 |"), "{text}");
    }

    #[test]
    fn load_report_parses_the_contract_and_tolerates_extra_lines() {
        let out = "warming up\n{\"mode\":\"burst\",\"proto\":\"echo\",\"connections\":10,\"completed\":10,\
                   \"errors\":{\"total\":1,\"connect\":1},\"elapsed_s\":0.5,\"rate_per_s\":20.0,\
                   \"latency_us\":{\"mean\":1,\"stdev\":0,\"p50\":1,\"p90\":1,\"p99\":2,\"p999\":2,\"max\":3},\
                   \"histogram_us\":[[1,9],[3,1]]}\n";
        let r = LoadReport::parse(out).unwrap();
        assert_eq!(r.completed, 10);
        assert_eq!(r.errors_total(), 1);
        assert_eq!(r.latency_us.p99, 2.0);
        assert_eq!(r.histogram_us, vec![(1.0, 9), (3.0, 1)]);
        assert!(LoadReport::parse("no json").is_err());
        let pretty = "starting\n{\n  \"completed\": 7,\n  \"rate_per_s\": 1.5\n}\nbye\n";
        assert_eq!(LoadReport::parse(pretty).unwrap().completed, 7);
        assert!(LoadReport::parse("{\"completed\": \"x\"}").unwrap_err().contains("JSON"));
    }
}
