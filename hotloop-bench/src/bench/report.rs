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
}

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
    /// hotloop, tokio, monoio, floor, nginx or haproxy.
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
    /// The hotloop configuration with the best figure.
    pub hotloop: String,
    /// Its figure.
    pub hotloop_value: f64,
    /// The floor's figure, if measured.
    pub floor_value: Option<f64>,
    /// hotloop / floor.
    pub vs_floor: Option<f64>,
    /// The best peer other than the floor, if any was measured.
    pub best_peer: Option<String>,
    /// Its figure.
    pub best_peer_value: Option<f64>,
    /// hotloop / best peer.
    pub vs_best_peer: Option<f64>,
}

/// Compares hotloop's best row with the floor and the best other peer, for
/// each group and each metric in `metrics`.
pub fn compare(rows: &[Row], metrics: &[(&str, Better)]) -> Vec<Comparison> {
    let mut groups: Vec<&str> = Vec::new();
    for row in rows {
        if !groups.contains(&row.group.as_str()) {
            groups.push(&row.group);
        }
    }
    let mut out = Vec::new();
    for group in groups {
        for &(metric, better) in metrics {
            let in_group = |pred: &dyn Fn(&Row) -> bool| -> Vec<(&Row, f64)> {
                rows.iter()
                    .filter(|r| r.group == group && pred(r))
                    .filter_map(|r| r.get(metric).map(|v| (r, v)))
                    .collect()
            };
            let hotloop = in_group(&|r| r.server == "hotloop");
            let floor = in_group(&|r| r.server == "floor");
            let peers = in_group(&|r| r.server != "hotloop" && r.server != "floor");
            let pick = |list: &[(&Row, f64)]| {
                let values: Vec<f64> = list.iter().map(|&(_, v)| v).collect();
                best(&values, better).map(|(i, v)| (list[i].0.label(), v))
            };
            let Some((hotloop_label, hotloop_value)) = pick(&hotloop) else { continue };
            let floor_value = pick(&floor).map(|(_, v)| v);
            let best_peer = pick(&peers);
            out.push(Comparison {
                group: group.to_string(),
                metric: metric.to_string(),
                hotloop: hotloop_label,
                hotloop_value,
                floor_value,
                vs_floor: floor_value.and_then(|f| ratio(hotloop_value, f)),
                best_peer_value: best_peer.as_ref().map(|(_, v)| *v),
                vs_best_peer: best_peer.as_ref().and_then(|(_, v)| ratio(hotloop_value, *v)),
                best_peer: best_peer.map(|(l, _)| l),
            });
        }
    }
    out
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

/// Renders rows as a text table per group: the workers each server ran
/// with (when known), then a column per metric, the first one with its
/// spread over repeats.
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
            let _ = writeln!(out, "\n {group}");
        }
        let show_workers = rows.iter().any(|r| r.group == group && r.workers.is_some());
        let mut header = vec!["server".to_string()];
        if show_workers {
            header.push("workers".to_string());
        }
        let first_at = header.len();
        header.extend(columns.iter().map(|c| c.header.to_string()));
        if let Some(first) = columns.first() {
            header.insert(first_at + 1, format!("{} spread", first.header));
        }
        let mut lines = vec![header];
        for row in rows.iter().filter(|r| r.group == group) {
            let mut cells = vec![row.label()];
            if let Some(why) = &row.unavailable {
                cells.push(format!("unavailable: {why}"));
                lines.push(cells);
                continue;
            }
            if show_workers {
                cells.push(row.workers.map_or("-".into(), |w| w.to_string()));
            }
            for (i, column) in columns.iter().enumerate() {
                let summary = row.metrics.get(column.key);
                cells
                    .push(summary.map_or("-".into(), |s| format_figure(s.median, column.decimals)));
                if i == 0 {
                    cells.push(summary.map_or("-".into(), |s| {
                        if s.values.len() > 1 {
                            format!("±{:.1}%", s.spread_pct / 2.0)
                        } else {
                            "n=1".into()
                        }
                    }));
                }
            }
            lines.push(cells);
        }
        let count = lines.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..count)
            .map(|i| {
                // An "unavailable" note spans the row: it does not set a width.
                lines
                    .iter()
                    .filter(|l| i == 0 || l.len() == count)
                    .filter_map(|l| l.get(i))
                    .map(|c| c.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for (n, line) in lines.iter().enumerate() {
            let mut text = String::new();
            for (i, cell) in line.iter().enumerate() {
                let width = widths.get(i).copied().unwrap_or(0);
                if i == 0 || line.len() < count {
                    let _ = write!(text, " {cell:<width$} |");
                } else {
                    let _ = write!(text, " {cell:>width$} |");
                }
            }
            let _ = writeln!(out, "{}", text.trim_end_matches('|').trim_end());
            if n == 0 {
                let rule: usize = widths.iter().map(|w| w + 3).sum();
                let _ = writeln!(out, " {}", "-".repeat(rule.saturating_sub(2)));
            }
        }
    }
    out
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
        match (c.floor_value, c.vs_floor) {
            (Some(f), Some(r)) => {
                let _ = write!(line, "; vs floor {} = x{r:.2}", format_figure(f, decimals));
            }
            _ => line.push_str("; floor not measured"),
        }
        match (&c.best_peer, c.best_peer_value, c.vs_best_peer) {
            (Some(p), Some(v), Some(r)) => {
                let _ = write!(line, "; vs best peer {p} {} = x{r:.2}", format_figure(v, decimals));
            }
            _ => line.push_str("; no peer measured"),
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

    #[test]
    fn compare_picks_best_hotloop_floor_and_peer() {
        let rows = vec![
            row("1K", "hotloop", "unlimited", 100.0),
            row("1K", "hotloop", "32", 120.0),
            row("1K", "floor", "", 150.0),
            row("1K", "tokio", "", 90.0),
            row("1K", "monoio", "", 110.0),
            Row::unavailable("1K", "nginx", "", "not on PATH".into()),
            row("8K", "hotloop", "32", 50.0),
        ];
        let c = compare(&rows, &[("rate", Better::Higher)]);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].hotloop, "hotloop 32");
        assert_eq!(c[0].vs_floor, Some(0.8));
        assert_eq!(c[0].best_peer.as_deref(), Some("monoio"));
        assert!((c[0].vs_best_peer.unwrap() - 120.0 / 110.0).abs() < 1e-12);
        assert_eq!(c[1].vs_floor, None);
        assert_eq!(c[1].best_peer, None);
        let text = render_comparisons(&c, &[]);
        assert!(text.contains("x0.80") && text.contains("floor not measured"), "{text}");
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
