//! `timers`: summarises the timer wheel's criterion results. Running
//! `cargo bench --bench wheel` takes too long for this suite, so it reads
//! what a previous run left in `target/criterion/**/new/estimates.json`.

use std::path::{Path, PathBuf};

use super::report::{Better, Column, Row, Summary};
use super::{Ctx, ScenarioResult};

/// How deep below `target/criterion` result files are looked for.
const SEARCH_DEPTH_MAX: usize = 6;

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> ScenarioResult {
    let mut result = ScenarioResult::new(
        "timers",
        "timer wheel micro-benchmarks (criterion medians, ns per iteration)",
        "neqo: a 16,384-slot wheel scanned every slot for one timer, up to 33% of CPU; \
         \"drain an empty timer\" 40.6 -> 25.8 µs",
        vec![Column { key: "median_ns", header: "median ns", decimals: 1, better: Better::Lower }],
    );
    let dirs = criterion_dirs(&ctx.exe);
    let Some(dir) = dirs.iter().find(|d| d.is_dir()) else {
        result.setup.push(format!(
            "no criterion results found (looked in {}); produce them with \
             `cargo bench -p hotloop --bench wheel`, then run `hotloop-bench bench --scenario timers`",
            dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
        ));
        return result;
    };
    let mut files = Vec::new();
    find_estimates(dir, 0, &mut files);
    files.sort();
    result.setup.push(format!("{} criterion results read from {}", files.len(), dir.display()));
    if files.is_empty() {
        result.setup.push("run `cargo bench -p hotloop --bench wheel` to produce them".into());
    }
    for file in files {
        match read_result(dir, &file) {
            Some(row) => result.rows.push(row),
            None => result.setup.push(format!("unreadable: {}", file.display())),
        }
    }
    result
}

/// Where criterion may have written: `$CARGO_TARGET_DIR`, `./target`, and
/// the target directory this executable was built into.
fn criterion_dirs(exe: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        dirs.push(PathBuf::from(t).join("criterion"));
    }
    dirs.push(PathBuf::from("target/criterion"));
    // target/<profile>/hotloop -> target/criterion, for the driven
    // executable and for this one.
    let this = std::env::current_exe().ok();
    for exe in [Some(exe), this.as_deref()].into_iter().flatten() {
        if let Some(target) = exe.parent().and_then(Path::parent) {
            let dir = target.join("criterion");
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    dirs
}

fn find_estimates(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    if depth > SEARCH_DEPTH_MAX {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        let estimates = path.join("estimates.json");
        if path.file_name().is_some_and(|n| n == "new") && estimates.is_file() {
            out.push(estimates);
        } else if path.file_name().is_some_and(|n| n != "report" && n != "base" && n != "change") {
            find_estimates(&path, depth + 1, out);
        }
    }
}

/// A row from one `new/estimates.json`, named from `new/benchmark.json`
/// when present, else from its directories.
fn read_result(root: &Path, estimates: &Path) -> Option<Row> {
    let text = std::fs::read_to_string(estimates).ok()?;
    let (median, low, high, mean) = parse_estimates(&text)?;
    let new_dir = estimates.parent()?;
    let (group, function) = std::fs::read_to_string(new_dir.join("benchmark.json"))
        .ok()
        .and_then(|t| parse_benchmark_id(&t))
        .or_else(|| {
            let rel = new_dir.parent()?.strip_prefix(root).ok()?;
            let parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            match parts.as_slice() {
                [one] => Some((one.clone(), one.clone())),
                [group, rest @ ..] => Some((group.clone(), rest.join("/"))),
                [] => None,
            }
        })?;
    let (server, config) = if function.eq_ignore_ascii_case("hotloop") {
        ("hotloop".to_string(), String::new())
    } else if function.to_ascii_lowercase().contains("hotloop") {
        ("hotloop".to_string(), function)
    } else {
        (function, String::new())
    };
    let mut row = Row::new(&group, &server, &config);
    let spread_pct = if median > 0.0 { (high - low) / median * 100.0 } else { 0.0 };
    row.metrics.insert(
        "median_ns".into(),
        Summary { median, min: low, max: high, spread_pct, values: vec![low, median, high] },
    );
    if let Some(m) = Summary::of(&[mean]) {
        row.metrics.insert("mean_ns".into(), m);
    }
    row.notes.clear();
    Some(row)
}

/// Median point estimate, its confidence bounds and the mean, in ns.
pub fn parse_estimates(text: &str) -> Option<(f64, f64, f64, f64)> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let median = &v["median"];
    let point = median["point_estimate"].as_f64()?;
    let low = median["confidence_interval"]["lower_bound"].as_f64().unwrap_or(point);
    let high = median["confidence_interval"]["upper_bound"].as_f64().unwrap_or(point);
    let mean = v["mean"]["point_estimate"].as_f64().unwrap_or(f64::NAN);
    Some((point, low, high, mean))
}

/// `(group_id, function_id or value_str)` from criterion's benchmark.json.
pub fn parse_benchmark_id(text: &str) -> Option<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let group = v["group_id"].as_str()?.to_string();
    let mut function = v["function_id"].as_str().map(str::to_string);
    if let Some(value) = v["value_str"].as_str() {
        function = Some(match function {
            Some(f) => format!("{f}/{value}"),
            None => value.to_string(),
        });
    }
    Some((group.clone(), function.unwrap_or(group)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_criterion_files() {
        let est = r#"{"mean":{"point_estimate":12.5},"median":{"point_estimate":10.0,
            "confidence_interval":{"confidence_level":0.95,"lower_bound":9.0,"upper_bound":11.0}}}"#;
        assert_eq!(parse_estimates(est), Some((10.0, 9.0, 11.0, 12.5)));
        let id = r#"{"group_id":"take_next empty","function_id":"hotloop","value_str":null}"#;
        assert_eq!(parse_benchmark_id(id), Some(("take_next empty".into(), "hotloop".into())));
    }

    #[test]
    fn summarises_a_results_tree() {
        let root = std::env::temp_dir().join(format!("hotloop-criterion-{}", std::process::id()));
        for (f, ns) in [("hotloop", 5.0), ("btreemap", 9.0)] {
            let dir = root.join("drain").join(f).join("new");
            std::fs::create_dir_all(&dir).unwrap();
            let est = format!(
                r#"{{"mean":{{"point_estimate":{ns}}},"median":{{"point_estimate":{ns}}}}}"#
            );
            std::fs::write(dir.join("estimates.json"), est).unwrap();
        }
        let mut files = Vec::new();
        find_estimates(&root, 0, &mut files);
        files.sort();
        let rows: Vec<Row> = files.iter().filter_map(|f| read_result(&root, f)).collect();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].server.as_str(), rows[0].group.as_str()), ("btreemap", "drain"));
        assert_eq!((rows[1].server.as_str(), rows[1].label().as_str()), ("hotloop", "hotloop"));
        assert_eq!(rows[1].get("median_ns"), Some(5.0));
        let _ = std::fs::remove_dir_all(&root);
    }
}
