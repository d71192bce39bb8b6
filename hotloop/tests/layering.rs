//! The arrows that must never exist:
//! - `driver/` is a leaf. It reaches nothing of the runtime, the network
//!   layer or the timers, directly or through the buffer layer it shares
//!   with them.
//! - `buf/` imports no driver.
//! - `runtime/` imports nothing from `net/` (the network layer is built on
//!   the runtime, not the reverse).
//! - Nothing outside `runtime/` reads the worker's context: the rest of
//!   the crate asks `runtime/current.rs` for what it needs, so the
//!   context's fields stay the runtime's own.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// Lines of `files` that name one of `forbidden` (comments and the unit
/// tests at the end of a file aside: a test may drive the driver through
/// the runtime).
fn offences(files: &[PathBuf], forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        for (i, line) in text.lines().enumerate() {
            if line.trim() == "#[cfg(test)]" {
                break;
            }
            let code = line.split("//").next().unwrap_or("");
            if forbidden.iter().any(|f| code.contains(f)) {
                found.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    found
}

const ABOVE_THE_DRIVER: [&str; 4] = ["crate::runtime", "crate::net", "crate::time", "crate::hyper"];

#[test]
fn the_driver_imports_nothing_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = offences(&sources(&src.join("driver")), &ABOVE_THE_DRIVER);
    assert!(found.is_empty(), "driver/ reaches above itself:\n{}", found.join("\n"));
}

#[test]
fn what_the_driver_imports_imports_nothing_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut shared: Vec<PathBuf> =
        ["slab.rs", "stats.rs", "log.rs", "loom.rs"].iter().map(|f| src.join(f)).collect();
    shared.extend(sources(&src.join("sys")));
    shared.extend(sources(&src.join("buf")));
    let found = offences(&shared, &ABOVE_THE_DRIVER);
    assert!(found.is_empty(), "a module under the driver reaches above it:\n{}", found.join("\n"));
}

#[test]
fn the_buffer_layer_imports_no_driver() {
    // Owned buffers sit under the driver: the driver takes them, never the
    // reverse (the tokio read adapter that needs a socket lives in `net`).
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = offences(&sources(&src.join("buf")), &["crate::driver"]);
    assert!(found.is_empty(), "buf/ reaches into the driver:\n{}", found.join("\n"));
}

#[test]
fn the_runtime_imports_nothing_from_the_network_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = offences(&sources(&src.join("runtime")), &["crate::net", "super::net"]);
    assert!(found.is_empty(), "runtime/ reaches into net/:\n{}", found.join("\n"));
}

#[test]
fn only_the_runtime_reads_the_workers_context() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let runtime = src.join("runtime");
    let outside: Vec<PathBuf> =
        sources(&src).into_iter().filter(|f| !f.starts_with(&runtime)).collect();
    let found = offences(&outside, &["context::", "runtime::context", "runtime::{context"]);
    assert!(
        found.is_empty(),
        "reads the worker's context outside runtime/ (use `runtime::current`):\n{}",
        found.join("\n")
    );
}
