//! `hotloop-bench bench` writes its results and charts without needing servers:
//! the timers scenario only reads criterion's output.

use std::process::Command;

#[test]
fn timers_scenario_summarises_criterion_results() {
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
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("== timers") && stdout.contains("btreemap"), "{stdout}");
    assert!(stdout.contains("x0.40"), "hotloop / best other should be 12/30: {stdout}");
    let results = std::fs::read_to_string(out.join("results.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&results).unwrap();
    assert_eq!(json["scenarios"][0]["name"], "timers");
    assert_eq!(json["scenarios"][0]["rows"].as_array().unwrap().len(), 2);
    let svg = std::fs::read_to_string(out.join("timers-median_ns.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("take_next empty"));
    let _ = std::fs::remove_dir_all(&dir);
}
