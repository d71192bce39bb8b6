//! `hotloop-bench bench` writes its results and charts without needing servers:
//! the timers scenario times its queues in process, and shows criterion's
//! results beside them when it finds them.

use std::process::Command;

#[test]
fn timers_scenario_measures_itself_and_shows_criterion_results() {
    let dir = std::env::temp_dir().join(format!("hotloop-bench-test-{}", std::process::id()));
    let target = dir.join("target");
    for (group, function, ns) in
        [("take_next empty", "hotloop", 12.0), ("take_next empty", "btreemap", 30.0)]
    {
        let new = target.join("criterion").join(group).join(function).join("new");
        std::fs::create_dir_all(&new).unwrap();
        let estimates =
            format!(r#"{{"mean":{{"point_estimate":{ns}}},"median":{{"point_estimate":{ns}}}}}"#);
        std::fs::write(new.join("estimates.json"), estimates).unwrap();
        let id = format!(r#"{{"group_id":"{group}","function_id":"{function}","value_str":null}}"#);
        std::fs::write(new.join("benchmark.json"), id).unwrap();
    }
    let out = dir.join("out");
    let output = Command::new(env!("CARGO_BIN_EXE_hotloop-bench"))
        .args(["bench", "--quick", "--scenario", "timers", "--out"])
        .arg(&out)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    // Its own figures: each case, hotloop's wheel beside the other queues.
    assert!(stdout.contains("== timers") && stdout.contains("neqo flat wheel"), "{stdout}");
    assert!(stdout.contains("take the next timer, none pending"), "{stdout}");
    // Criterion's, as a group of their own.
    assert!(
        stdout.contains("criterion take_next empty") && stdout.contains("btreemap"),
        "{stdout}"
    );
    assert!(stdout.contains("x0.40"), "hotloop / best other should be 12/30: {stdout}");
    let results = std::fs::read_to_string(out.join("results.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&results).unwrap();
    assert_eq!(json["scenarios"][0]["name"], "timers");
    let rows = json["scenarios"][0]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4 * 3 + 2);
    assert!(rows.iter().all(|r| r["metrics"]["median_ns"]["median"].as_f64().unwrap() > 0.0));
    let svg = std::fs::read_to_string(out.join("timers-median_ns.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("criterion take_next empty"));
    // What it prints fits 120 columns, and its last line says where the
    // charts are.
    for line in stdout.lines().chain(stderr.lines()) {
        assert!(line.chars().count() <= 120, "{} chars: {line}", line.chars().count());
    }
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.contains("charts (") && last.contains(&out.display().to_string()), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
