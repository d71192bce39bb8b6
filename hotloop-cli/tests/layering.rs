//! The server command's modules import one way, from the top down:
//! `serve/` (which app, and starting it) imports the apps (`quic.rs`,
//! `tls.rs`, `static_files/`), and they import the pieces below them
//! (`conn/`, `serve_args.rs`). An arrow back up would make a circle; this
//! test says which modules each of them may name.

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
    let ident = |s: &str| -> String {
        s.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
    };
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
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
    let allowed: [(&str, &[&str]); 5] = [
        ("serve_args", &["runtime_args"]),
        ("conn", &["drain"]),
        ("tls", &["conn", "serve_args"]),
        ("static_files", &["conn", "drain"]),
        ("quic", &["serve_args", "tls", "stats_server", "drain", "stop"]),
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
