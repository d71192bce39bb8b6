//! The server command's modules import one way, from the top down:
//! `serve/` (which app, and starting it) imports the apps (`quic/`,
//! `tls.rs`, `static_files/`), and they import the pieces below them
//! (`conn/`, `serve_args.rs`). An arrow back up would make a circle; this
//! test says which modules each of them may name. Inside `quic/`, each
//! module names only the modules before it in the order its `mod.rs`
//! lists, and only the command's modules it needs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Every `.rs` file of `module` (a file, or a directory and all it holds).
fn sources(src: &Path, module: &str) -> Vec<PathBuf> {
    let file = src.join(format!("{module}.rs"));
    if file.is_file() {
        return vec![file];
    }
    let mut out = Vec::new();
    let mut dirs = vec![src.join(module)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    assert!(!out.is_empty(), "no module {module} under {}", src.display());
    out
}

/// The top-level modules a line of code names through `crate::` (both
/// `crate::a::b` and `crate::{a, b::c}`).
fn named(code: &str, out: &mut BTreeSet<String>) {
    named_after(code, "crate::", out);
}

/// The first segment of every path that follows `prefix` in a line of
/// code (both `prefix` `a::b` and `prefix` `{a, b::c}`).
fn named_after(code: &str, prefix: &str, out: &mut BTreeSet<String>) {
    let ident = |s: &str| -> String {
        s.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
    };
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        rest = &rest[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The first segment of each path at the group's own level.
            let mut depth = 0;
            let mut start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        start = false;
                        out.insert(ident(&group[i..]));
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
}

/// The modules `module`'s code names (comments and unit tests aside), and
/// where.
fn imports(src: &Path, module: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for file in sources(src, module) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            if line.trim() == "#[cfg(test)]" {
                break;
            }
            let mut names = BTreeSet::new();
            named(line.split("//").next().unwrap_or(""), &mut names);
            let at = format!("{}:{}: {}", file.display(), i + 1, line.trim());
            found.extend(names.into_iter().map(|name| (name, at.clone())));
        }
    }
    found
}

#[test]
fn the_server_modules_import_only_downward() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // Each module, and the command's modules it may name.
    let allowed: [(&str, &[&str]); 6] = [
        ("serve_args", &["runtime_args"]),
        ("conn", &["drain"]),
        ("tls", &["conn", "serve_args"]),
        ("static_files", &["conn", "drain"]),
        ("quic", &["serve_args", "tls", "stats_server", "drain", "stop"]),
        ("http_proxy", &["proxy", "tls", "stats_server", "drain", "stop"]),
    ];
    let mut wrong = Vec::new();
    for (module, may) in allowed {
        for (name, at) in imports(&src, module) {
            if name != module && !may.contains(&name.as_str()) {
                wrong.push(format!("{module} names {name}: {at}"));
            }
        }
    }
    assert!(wrong.is_empty(), "an import against the layering:\n{}", wrong.join("\n"));
}

/// The modules of `quic/`, bottom to top as `quic/mod.rs` lists them, and
/// the command's modules each may name (`mod.rs`, the top, names any of
/// them and what `quic` as a whole may).
const QUIC_ORDER: [(&str, &[&str]); 8] = [
    ("settings", &["serve_args"]),
    ("config", &["serve_args", "tls"]),
    ("release", &[]),
    ("admission", &["drain", "serve_args"]),
    ("streams", &[]),
    ("echo", &["drain"]),
    ("http3", &["drain"]),
    ("connection", &[]),
];

/// The sibling modules `file` names through `super::` (both `super::a::b`
/// and `super::{a, b::c}`), with their lines.
fn siblings(file: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim() == "#[cfg(test)]" {
            break;
        }
        let mut names = BTreeSet::new();
        named_after(line.split("//").next().unwrap_or(""), "super::", &mut names);
        let at = format!("{}:{}: {}", file.display(), i + 1, line.trim());
        found.extend(names.into_iter().map(|name| (name, at.clone())));
    }
    found
}

#[test]
fn the_quic_modules_import_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let order: Vec<&str> = QUIC_ORDER.iter().map(|(m, _)| *m).collect();
    let mut wrong = Vec::new();
    for file in sources(&src, "quic") {
        let stem = file.file_stem().unwrap().to_str().unwrap();
        if stem == "mod" {
            continue;
        }
        let Some(rank) = order.iter().position(|m| *m == stem) else {
            wrong.push(format!("{}: not in QUIC_ORDER (place it there)", file.display()));
            continue;
        };
        for (name, at) in siblings(&file) {
            if !order[..rank].contains(&name.as_str()) {
                wrong.push(format!("quic/{stem} names super::{name}: {at}"));
            }
        }
        for (name, at) in imports(&src, &format!("quic/{stem}")) {
            if !QUIC_ORDER[rank].1.contains(&name.as_str()) {
                wrong.push(format!("quic/{stem} names crate::{name}: {at}"));
            }
        }
    }
    assert!(wrong.is_empty(), "a quic module names one at or above it:\n{}", wrong.join("\n"));
}

/// The modules of `http_proxy/`, bottom to top as its `mod.rs` lists them,
/// and the command's modules each may name.
const HTTP_PROXY_ORDER: [(&str, &[&str]); 7] = [
    ("config", &[]),
    ("stats", &["stats_server"]),
    ("headers", &[]),
    ("routes", &[]),
    ("pool", &[]),
    ("health", &["drain"]),
    ("forward", &[]),
];

#[test]
fn the_http_proxy_modules_import_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let order: Vec<&str> = HTTP_PROXY_ORDER.iter().map(|(m, _)| *m).collect();
    let mut wrong = Vec::new();
    for file in sources(&src, "http_proxy") {
        let stem = file.file_stem().unwrap().to_str().unwrap();
        if stem == "mod" {
            continue;
        }
        let Some(rank) = order.iter().position(|m| *m == stem) else {
            wrong.push(format!("{}: not in HTTP_PROXY_ORDER (place it there)", file.display()));
            continue;
        };
        for (name, at) in siblings(&file) {
            if !order[..rank].contains(&name.as_str()) {
                wrong.push(format!("http_proxy/{stem} names super::{name}: {at}"));
            }
        }
        for (name, at) in imports(&src, &format!("http_proxy/{stem}")) {
            if !HTTP_PROXY_ORDER[rank].1.contains(&name.as_str()) {
                wrong.push(format!("http_proxy/{stem} names crate::{name}: {at}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "an http_proxy module names one at or above it:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn nothing_imports_the_top() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let Some(module) = path.file_stem().and_then(|s| s.to_str()) else { continue };
        if module == "main" || module == "serve" {
            continue;
        }
        for (name, at) in imports(&src, module) {
            if name == "serve" {
                wrong.push(at);
            }
        }
    }
    assert!(wrong.is_empty(), "`serve/` is imported:\n{}", wrong.join("\n"));
}

#[test]
fn the_check_sees_imports() {
    let mut names = BTreeSet::new();
    named("use crate::{drain, stop::run, conn::{Conn, ConnTimer}};", &mut names);
    named("let x = crate::tls::acceptor(args);", &mut names);
    named("use crate::serve_args::ServeArgs;", &mut names);
    let names: Vec<_> = names.into_iter().collect();
    assert_eq!(names, ["conn", "drain", "serve_args", "stop", "tls"]);
}
