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
//! - Inside `driver/`, imports run one way: the modules every backend
//!   shares name only those below them, the backends name only those
//!   (never each other, nor the face above them), and inside `uring/` each
//!   module names only the modules below it in the order its module doc
//!   gives.
//! - Inside `runtime/`, imports run one way too: each file names only the
//!   files below it in the order `runtime/mod.rs` lists, and never the
//!   face (`mod.rs`) above them.

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

/// The code lines of `file`, numbered from 1, with comments and the unit
/// tests at the end of the file left out (as [`offences`] reads them; the
/// loom tests, `#[cfg(all(test, hotloop_loom))]`, too).
fn code_lines(file: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed == "#[cfg(test)]" || trimmed.starts_with("#[cfg(all(test,") {
            break;
        }
        out.push((i + 1, line.split("//").next().unwrap_or("").to_string()));
    }
    out
}

/// The first segment of every path that follows `prefix` in `file`'s
/// code, with its line: `prefix` then `a::B` gives `a`, and a group
/// `prefix{a::B, c}` (over several lines, as `rustfmt` wraps it) gives
/// `a` and `c`. `self` in a group is left out.
fn names_after(file: &Path, prefix: &str) -> Vec<(usize, String)> {
    let lines = code_lines(file);
    let mut text = String::new();
    let mut line_of = Vec::new();
    for (n, line) in &lines {
        for _ in 0..=line.len() {
            line_of.push(*n);
        }
        text.push_str(line);
        text.push('\n');
    }
    let ident = |s: &str| -> String {
        s.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
    };
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(prefix) {
        let start = from + at;
        from = start + prefix.len();
        // `super::super::x` is not `super::x`: leave it to its own prefix.
        if text[..start].ends_with("super::") {
            continue;
        }
        let rest = &text[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item = String::new();
            let mut items = Vec::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => {
                        items.push(std::mem::take(&mut item));
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                item.push(c);
            }
            items.push(item);
            for item in items {
                let name = ident(&item);
                if !name.is_empty() && name != "self" {
                    found.push((line_of[start], name));
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                found.push((line_of[start], name));
            }
        }
    }
    found
}

/// The modules of `driver/` that both backends use, bottom to top; each
/// names only those before it.
const DRIVER_SHARED: [&str; 5] = ["park", "config", "wake", "probe", "udp"];

/// The modules of `driver/uring/`, bottom to top, as `uring/mod.rs` lists
/// them; each names only those before it (`mod.rs`, which defines the
/// state they all extend, is not among them).
const URING_ORDER: [&str; 19] = [
    "bufring",
    "linger",
    "unclaimed",
    "lifecycle",
    "ring",
    "op",
    "accept",
    "pooled",
    "dgram",
    "dispatch",
    "turn",
    "teardown",
    "source",
    "readiness",
    "listener",
    "write_behind",
    "stream",
    "udp",
    "file",
];

#[test]
fn the_modules_the_backends_share_name_only_those_below_them() {
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/driver");
    let mut found = Vec::new();
    for (i, module) in DRIVER_SHARED.iter().enumerate() {
        let file = driver.join(format!("{module}.rs"));
        for prefix in ["super::", "crate::driver::"] {
            for (line, name) in names_after(&file, prefix) {
                if !DRIVER_SHARED[..i].contains(&name.as_str()) {
                    found.push(format!("{}:{line}: {prefix}{name}", file.display()));
                }
            }
        }
    }
    assert!(found.is_empty(), "a shared driver module reaches up:\n{}", found.join("\n"));
}

#[test]
fn the_backends_name_only_the_shared_driver_modules() {
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/driver");
    let mut found = Vec::new();
    for backend in ["epoll", "uring"] {
        for file in sources(&driver.join(backend)) {
            // From the backend's `mod.rs`, `super::` is `driver/`; from the
            // files beside it, `super::super::` is.
            let up = if file.file_name().is_some_and(|f| f == "mod.rs") {
                "super::"
            } else {
                "super::super::"
            };
            for prefix in [up, "crate::driver::"] {
                for (line, name) in names_after(&file, prefix) {
                    if !DRIVER_SHARED.contains(&name.as_str()) {
                        found.push(format!("{}:{line}: {prefix}{name}", file.display()));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "a backend reaches the face of driver/ or the other backend:\n{}",
        found.join("\n")
    );
}

#[test]
fn uring_modules_name_only_modules_below_them() {
    let uring = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/driver/uring");
    let mut found = Vec::new();
    for file in sources(&uring) {
        let stem = file.file_stem().unwrap().to_str().unwrap().to_string();
        if stem == "mod" {
            continue;
        }
        let Some(rank) = URING_ORDER.iter().position(|m| *m == stem) else {
            found.push(format!("{}: not in URING_ORDER (place it there)", file.display()));
            continue;
        };
        for prefix in ["super::", "crate::driver::uring::"] {
            for (line, name) in names_after(&file, prefix) {
                let above = URING_ORDER[rank..].contains(&name.as_str());
                if above {
                    found.push(format!("{}:{line}: {prefix}{name}", file.display()));
                }
            }
        }
    }
    assert!(found.is_empty(), "a uring module names one at or above it:\n{}", found.join("\n"));
}

/// The files of `runtime/`, bottom to top, as `runtime/mod.rs` lists them;
/// each names only those before it. `mod.rs` (the builder and `Runtime`,
/// which name them all) is the top: a file below names none of its items,
/// not even a re-export, so every arrow in the order is seen.
const RUNTIME_ORDER: [&str; 14] = [
    "key",
    "load",
    "tokio_time",
    "join_slot",
    "blocking",
    "config",
    "shared",
    "task",
    "context",
    "worker",
    "join",
    "handle",
    "join_set",
    "current",
];

#[test]
fn runtime_files_name_only_files_below_them() {
    let runtime = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/runtime");
    let mut found = Vec::new();
    for file in sources(&runtime) {
        let stem = file.file_stem().unwrap().to_str().unwrap().to_string();
        if stem == "mod" {
            continue;
        }
        // The stand-in compiled without the feature is the same module.
        let module = if stem == "tokio_time_off" { "tokio_time" } else { stem.as_str() };
        let Some(rank) = RUNTIME_ORDER.iter().position(|m| *m == module) else {
            found.push(format!("{}: not in RUNTIME_ORDER (place it there)", file.display()));
            continue;
        };
        for prefix in ["super::", "crate::runtime::"] {
            for (line, name) in names_after(&file, prefix) {
                if !RUNTIME_ORDER[..rank].contains(&name.as_str()) {
                    found.push(format!("{}:{line}: {prefix}{name}", file.display()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "a runtime file names one at or above it (or the face, mod.rs):\n{}",
        found.join("\n")
    );
}
