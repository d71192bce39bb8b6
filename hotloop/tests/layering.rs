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

mod imports;

use std::path::{Path, PathBuf};

use imports::{code_lines, declared_modules, module_of, names_after, order_in_doc, sources};

/// Lines of `files` that name one of `forbidden` (comments and the unit
/// tests at the end of a file aside: a test may drive the driver through
/// the runtime).
fn offences(files: &[PathBuf], forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in files {
        for (n, code) in code_lines(file) {
            if forbidden.iter().any(|f| code.contains(f)) {
                found.push(format!("{}:{n}: {}", file.display(), code.trim()));
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
    let mut shared: Vec<PathBuf> = ["slab.rs", "stats.rs", "log.rs", "loom.rs", "coop.rs"]
        .iter()
        .map(|f| src.join(f))
        .collect();
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

/// The modules of `driver/` that both backends use, bottom to top; each
/// names only those before it.
const DRIVER_SHARED: [&str; 6] = ["park", "config", "wake", "probe", "udp", "contract"];

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

/// Checks that each file of the folder `mod_rs` heads names (through
/// `prefixes`) only the modules before its own in the order of
/// `mod_rs`'s doc (from `from`), and that every module is in that order.
/// Returns what runs the wrong way, and the names each file gives that are
/// not modules (items of `mod_rs` itself, or of the layers above).
fn one_way(mod_rs: &Path, from: &str, prefixes: &[&str]) -> (Vec<String>, Vec<(String, String)>) {
    let order = order_in_doc(mod_rs, from);
    let declared = declared_modules(mod_rs);
    let mut wrong = Vec::new();
    let mut other = Vec::new();
    for module in declared.keys().filter(|m| !order.contains(m)) {
        wrong.push(format!(
            "{}: `{module}` is not in the order its doc gives after `{from}` (place it there)",
            mod_rs.display()
        ));
    }
    for file in sources(mod_rs.parent().unwrap()) {
        if file == mod_rs {
            continue;
        }
        let Some(module) = module_of(&file, &declared) else {
            wrong.push(format!(
                "{}: no `mod` line in {} names it",
                file.display(),
                mod_rs.display()
            ));
            continue;
        };
        let rank = order.iter().position(|m| *m == module).unwrap_or(order.len());
        for prefix in prefixes {
            for (line, name) in names_after(&file, prefix) {
                if !declared.contains_key(&name) {
                    other.push((name, format!("{}:{line}: {prefix}", file.display())));
                } else if !order[..rank].contains(&name) {
                    wrong.push(format!("{}:{line}: {prefix}{name}", file.display()));
                }
            }
        }
    }
    (wrong, other)
}

/// What the modules of `driver/uring/` may name of `uring/mod.rs` itself
/// (an arrow back up to the file that names them all): only the face, each
/// with the reason. The check fails on any other such name, and on an entry
/// here that no module names any more (take it out).
const URING_MOD_RS_ALLOWED: [(&str, &str); 1] = [(
    "Driver",
    "the driver's face, defined in mod.rs, is the owner that `source`, `listener`, \
         `readiness`, `udp`, `stream`, `file` and `op` reach the ring through",
)];

#[test]
fn uring_modules_name_only_modules_below_them() {
    let mod_rs = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/driver/uring/mod.rs");
    let (mut found, named) = one_way(&mod_rs, "# Layout", &["super::", "crate::driver::uring::"]);
    let mut used = Vec::new();
    for (name, at) in named {
        match URING_MOD_RS_ALLOWED.iter().find(|(allowed, _)| *allowed == name) {
            Some(_) => used.push(name),
            None => found.push(format!("{at}{name} (an item of uring/mod.rs: an arrow back up)")),
        }
    }
    for (name, _) in URING_MOD_RS_ALLOWED {
        if !used.iter().any(|u| u == name) {
            found.push(format!("`{name}` is allowed but no module names it: take it out"));
        }
    }
    assert!(found.is_empty(), "a uring module names one at or above it:\n{}", found.join("\n"));
}

#[test]
fn runtime_files_name_only_files_below_them() {
    let mod_rs = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/runtime/mod.rs");
    let (mut found, named) = one_way(&mod_rs, "# Layout", &["super::", "crate::runtime::"]);
    // `mod.rs` (the builder and `Runtime`, which name them all) is the top:
    // a file below names none of its items, not even a re-export, so every
    // arrow in the order is seen.
    found.extend(named.into_iter().map(|(name, at)| format!("{at}{name} (the face, mod.rs)")));
    assert!(
        found.is_empty(),
        "a runtime file names one at or above it (or the face, mod.rs):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_orders_come_from_the_module_docs() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let uring = order_in_doc(&src.join("driver/uring/mod.rs"), "# Layout");
    assert_eq!(uring.first().map(String::as_str), Some("bufring"), "{uring:?}");
    assert_eq!(uring.last().map(String::as_str), Some("file"), "{uring:?}");
    let runtime = order_in_doc(&src.join("runtime/mod.rs"), "# Layout");
    // `join` is named again in `handle`'s entry, after its own.
    let at = |m: &str| runtime.iter().position(|r| r == m).unwrap();
    assert!(at("key") == 0 && at("join") < at("handle") && at("current") == runtime.len() - 1);
    let declared = declared_modules(&src.join("runtime/mod.rs"));
    assert_eq!(declared["tokio_time"], ["tokio_time", "tokio_time_off"]);
    assert_eq!(imports::names_in_line("use super::{a::B, c, self};", "super::"), ["a", "c"]);
    assert_eq!(imports::names_in_line("x::super::y; my_crate::z", "crate::"), Vec::<String>::new());
    assert_eq!(imports::names_in_line("use super::*;", "super::"), ["*"]);
}
