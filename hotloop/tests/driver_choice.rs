//! Choosing a driver by name (`HOTLOOP_DRIVER=epoll`) is reported in the
//! stats, not as a warning on stderr: a program run that way prints
//! nothing of hotloop's own.

use std::process::Command;

/// Run in a child process by the test below (with `HOTLOOP_DRIVER` set):
/// builds a runtime, checks what it reports, and prints nothing itself.
#[test]
#[ignore = "run by `a_driver_chosen_by_name_prints_no_warning` in a child process"]
fn child_builds_a_runtime() {
    let rt = hotloop::Runtime::builder().workers(2).build().unwrap();
    let info = rt.stats().info;
    assert_eq!(info.driver, "epoll");
    assert!(!info.fallback);
    assert!(info.reason.contains("HOTLOOP_DRIVER"), "{}", info.reason);
    rt.block_on(async { hotloop::time::sleep(std::time::Duration::from_millis(1)).await });
}

#[test]
fn a_driver_chosen_by_name_prints_no_warning() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &harness_name("child_builds_a_runtime"),
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HOTLOOP_DRIVER", "epoll")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "the child test did not run:\n{stdout}");
    assert!(!stderr.contains("hotloop"), "hotloop wrote to stderr:\n{stderr}");
}

/// The name the test harness knows `name` by: prefixed with this file's
/// module path below the test crate (`file::name` in `tests/suite.rs`, just
/// `name` in a binary of its own), for running one test in a child.
fn harness_name(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_string(),
    }
}
