//! The server command's modules import one way, from the top down:
//! `serve/` (which app, and starting it) imports the apps (`quic/`,
//! `tls.rs`, `static_files/`), the apps and the proxies plug into the
//! server-mode skeleton (`mode.rs`), and they import the pieces below them
//! (`conn/`, `serve_args.rs`, `stop.rs`, `http_date.rs`). An arrow back up
//! would make a circle; this test says which modules each of them may
//! name. Inside
//! `quic/` and `http_proxy/`, each module names only the modules before it
//! in the order its `mod.rs` doc gives, and only the command's modules it
//! needs.
//!
//! The scanner is the runtime's (`hotloop/tests/layering/imports.rs`).

#[path = "../../hotloop/tests/layering/imports.rs"]
mod imports;

use std::path::{Path, PathBuf};

use imports::{declared_modules, module_of, names_after, names_in_line, order_in_doc, sources};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file of `module` (a file, or a directory and all it holds).
fn module_sources(module: &str) -> Vec<PathBuf> {
    let file = src().join(format!("{module}.rs"));
    if file.is_file() {
        return vec![file];
    }
    let out = sources(&src().join(module));
    assert!(!out.is_empty(), "no module {module} under {}", src().display());
    out
}

/// The command's modules `module`'s code names through `crate::`, and where.
fn imports(module: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for file in module_sources(module) {
        for (line, name) in names_after(&file, "crate::") {
            found.push((name, format!("{}:{line}", file.display())));
        }
    }
    found
}

#[test]
fn the_server_modules_import_only_downward() {
    // Each module, and the command's modules it may name.
    let allowed: [(&str, &[&str]); 10] = [
        ("http_date", &[]),
        ("serve_args", &["runtime_args"]),
        ("conn", &["drain"]),
        ("tls", &["conn", "serve_args"]),
        ("static_files", &["conn", "drain", "http_date"]),
        ("stop", &["drain"]),
        ("mode", &["runtime_args", "stats_server", "stop", "drain"]),
        ("proxy", &["mode", "runtime_args", "stats_server"]),
        ("quic", &["mode", "runtime_args", "serve_args", "tls", "stats_server", "drain", "stop"]),
        (
            "http_proxy",
            &["mode", "runtime_args", "proxy", "tls", "stats_server", "drain", "stop", "http_date"],
        ),
    ];
    let mut wrong = Vec::new();
    for (module, may) in allowed {
        for (name, at) in imports(module) {
            if name != module && !may.contains(&name.as_str()) {
                wrong.push(format!("{module} names {name}: {at}"));
            }
        }
    }
    assert!(wrong.is_empty(), "an import against the layering:\n{}", wrong.join("\n"));
}

/// Checks that each file of `folder` names only the sibling modules before
/// it in the order its `mod.rs` doc gives after `from`, and only the
/// command's modules `crate_modules` lets it (none for a module not listed).
fn one_way(folder: &str, from: &str, crate_modules: &[(&str, &[&str])]) -> Vec<String> {
    let mod_rs = src().join(folder).join("mod.rs");
    let order = order_in_doc(&mod_rs, from);
    let declared = declared_modules(&mod_rs);
    let mut wrong = Vec::new();
    for module in declared.keys().filter(|m| !order.contains(m)) {
        wrong.push(format!(
            "{folder}/{module}: not in the order of {folder}/mod.rs's doc (place it there)"
        ));
    }
    for file in sources(&src().join(folder)) {
        let Some(module) = module_of(&file, &declared) else { continue };
        let rank = order.iter().position(|m| *m == module).unwrap_or(order.len());
        for (line, name) in names_after(&file, "super::") {
            if !order[..rank].contains(&name) {
                wrong.push(format!(
                    "{folder}/{module} names super::{name}: {}:{line}",
                    file.display()
                ));
            }
        }
        let may = crate_modules.iter().find(|(m, _)| *m == module).map_or(&[][..], |(_, may)| may);
        for (line, name) in names_after(&file, "crate::") {
            if !may.contains(&name.as_str()) {
                wrong.push(format!(
                    "{folder}/{module} names crate::{name}: {}:{line}",
                    file.display()
                ));
            }
        }
    }
    wrong
}

#[test]
fn the_quic_modules_import_one_way() {
    let crate_modules: [(&str, &[&str]); 6] = [
        ("settings", &["serve_args"]),
        ("config", &["serve_args", "tls"]),
        ("admission", &["drain", "serve_args"]),
        ("echo", &["drain"]),
        ("http3", &["drain"]),
        ("connection", &["drain"]),
    ];
    let wrong = one_way("quic", "# Modules", &crate_modules);
    assert!(wrong.is_empty(), "a quic module names one at or above it:\n{}", wrong.join("\n"));
}

#[test]
fn the_http_proxy_modules_import_one_way() {
    let crate_modules: [(&str, &[&str]); 4] = [
        ("stats", &["stats_server"]),
        ("headers", &["http_date"]),
        ("pool", &["drain"]),
        ("health", &["drain"]),
    ];
    let wrong = one_way("http_proxy", "Modules name only those before them:", &crate_modules);
    assert!(
        wrong.is_empty(),
        "an http_proxy module names one at or above it:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn nothing_imports_the_top() {
    let mut wrong = Vec::new();
    for entry in std::fs::read_dir(src()).unwrap() {
        let path = entry.unwrap().path();
        let Some(module) = path.file_stem().and_then(|s| s.to_str()) else { continue };
        if module == "main" || module == "serve" {
            continue;
        }
        for (name, at) in imports(module) {
            if name == "serve" {
                wrong.push(at);
            }
        }
    }
    assert!(wrong.is_empty(), "`serve/` is imported:\n{}", wrong.join("\n"));
}

#[test]
fn the_check_sees_imports() {
    let mut names =
        names_in_line("use crate::{drain, stop::run, conn::{Conn, ConnTimer}};", "crate::");
    names.extend(names_in_line("let x = crate::tls::acceptor(args);", "crate::"));
    names.extend(names_in_line("use crate::serve_args::ServeArgs;", "crate::"));
    names.sort();
    assert_eq!(names, ["conn", "drain", "serve_args", "stop", "tls"]);
    let quic = order_in_doc(&src().join("quic/mod.rs"), "# Modules");
    assert_eq!(quic.first().map(String::as_str), Some("settings"), "{quic:?}");
    assert_eq!(quic.last().map(String::as_str), Some("connection"), "{quic:?}");
}
