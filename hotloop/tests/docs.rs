//! The documents against the code, for what a test can check cheaply:
//! - every path the documents name in backticks (`hotloop/src/...`,
//!   `scripts/...`) exists, and every `.rs` file ARCHITECTURE.md names
//!   exists somewhere in the workspace;
//! - every source file of the runtime is named in ARCHITECTURE.md;
//! - `unsafe` appears only in the layers ARCHITECTURE.md names for it
//!   (`sys/`, `buf/` and `driver/`);
//! - README.md's crate table has a row for every workspace member;
//! - every `HOTLOOP_*` environment variable the documents name is read
//!   somewhere.
//!
//! These say nothing about whether a sentence is true; they catch the
//! names that go stale when code moves.

use std::path::{Path, PathBuf};

/// The workspace root (this crate's parent directory).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The documents that describe the code.
const DOCUMENTS: [&str; 3] = ["README.md", "ARCHITECTURE.md", "RELIABILITY.md"];

/// Every file under `dir` whose name ends with `ext`, `target/` left out.
fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                out.extend(files(&path, ext));
            }
        } else if name.ends_with(ext) {
            out.push(path);
        }
    }
    out
}

/// The text between each pair of backticks on a line.
fn ticked(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut parts = line.split('`');
        parts.next();
        while let (Some(inside), Some(_)) = (parts.next(), parts.next()) {
            out.push((i + 1, inside));
        }
    }
    out
}

/// The top-level directories a document's path may start with.
const TREES: [&str; 7] = [
    "hotloop/",
    "hotloop-cli/",
    "hotloop-bench/",
    "hotloop-proto/",
    "hotloop-macros/",
    "scripts/",
    "fuzz/",
];

#[test]
fn every_path_the_documents_name_exists() {
    let root = root();
    let mut missing = Vec::new();
    for doc in DOCUMENTS {
        let text = read(&root.join(doc));
        for (line, s) in ticked(&text) {
            // A command names its script first: `scripts/soak.sh 19400 30 epoll`.
            let path = s.split_whitespace().next().unwrap_or("").trim_end_matches([':', ',']);
            let looks_like_path =
                TREES.iter().any(|t| path.starts_with(t)) && !path.contains(['*', '{', '<']);
            if looks_like_path && !root.join(path).exists() {
                missing.push(format!("{doc}:{line}: `{path}`"));
            }
        }
    }
    assert!(missing.is_empty(), "paths named but not there:\n{}", missing.join("\n"));
}

#[test]
fn every_rust_file_architecture_names_exists() {
    let root = root();
    let names: std::collections::BTreeSet<String> = files(&root, ".rs")
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
        .collect();
    let mut missing = Vec::new();
    for (line, s) in ticked(&read(&root.join("ARCHITECTURE.md"))) {
        let Some(name) = s.rsplit('/').next() else { continue };
        let is_file_name = name.ends_with(".rs")
            && name.len() > 3
            && name[..name.len() - 3].chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if is_file_name && !names.contains(name) {
            missing.push(format!("ARCHITECTURE.md:{line}: `{s}`"));
        }
    }
    assert!(missing.is_empty(), "files named but not in the workspace:\n{}", missing.join("\n"));
}

#[test]
fn every_runtime_source_file_is_named_in_architecture() {
    let root = root();
    let architecture = read(&root.join("ARCHITECTURE.md"));
    let ticks: Vec<&str> = ticked(&architecture).into_iter().map(|(_, s)| s).collect();
    let src = root.join("hotloop/src");
    let mut unnamed = Vec::new();
    for file in files(&src, ".rs") {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        let rel = file.strip_prefix(&src).unwrap().to_string_lossy().to_string();
        let named = ticks.iter().any(|t| *t == name || t.ends_with(&format!("/{name}")));
        if !named {
            unnamed.push(rel);
        }
    }
    assert!(
        unnamed.is_empty(),
        "hotloop/src files ARCHITECTURE.md does not name (say what each holds):\n{}",
        unnamed.join("\n")
    );
}

/// Whether `line` of Rust code (comments left out) has the keyword
/// `unsafe`, not as part of a longer name (`unsafe_op_in_unsafe_fn`).
fn has_unsafe(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    let bytes = code.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    code.match_indices("unsafe").any(|(at, _)| {
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let after = bytes.get(at + "unsafe".len()).copied();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

#[test]
fn unsafe_lives_only_in_the_layers_architecture_names() {
    let root = root();
    // ARCHITECTURE.md's syscalls row names the layers; the test follows it.
    let architecture = read(&root.join("ARCHITECTURE.md"));
    let row = architecture
        .lines()
        .find(|l| l.starts_with("| syscalls |"))
        .expect("ARCHITECTURE.md has a syscalls row");
    assert!(
        row.contains("with `buf/` and `driver/`, the only places with `unsafe`"),
        "ARCHITECTURE.md's syscalls row no longer says where `unsafe` lives: update this test"
    );
    let src = root.join("hotloop/src");
    let allowed = ["sys", "buf", "driver"].map(|d| src.join(d));
    let mut found = Vec::new();
    for file in files(&src, ".rs") {
        if allowed.iter().any(|d| file.starts_with(d)) {
            continue;
        }
        for (i, line) in read(&file).lines().enumerate() {
            if has_unsafe(line) {
                found.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "`unsafe` outside sys/, buf/ and driver/ (move it there, or change ARCHITECTURE.md):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_unsafe_check_sees_unsafe() {
    assert!(has_unsafe("    let x = unsafe { f() };"));
    assert!(has_unsafe("unsafe impl Send for X {}"));
    assert!(!has_unsafe("#![deny(unsafe_op_in_unsafe_fn)]"));
    assert!(!has_unsafe("    // SAFETY: no unsafe here"));
    assert!(!has_unsafe("let not_unsafe = 1;"));
}

#[test]
fn the_readme_lists_every_workspace_crate() {
    let root = root();
    let manifest = read(&root.join("Cargo.toml"));
    let members_at = manifest.find("members").expect("a workspace members list");
    let list = &manifest[members_at..];
    let list = &list[list.find('[').unwrap() + 1..list.find(']').unwrap()];
    let members: Vec<&str> = list.split(',').map(|m| m.trim().trim_matches('"')).collect();
    assert!(members.len() > 1, "members not found in {list}");
    let readme = read(&root.join("README.md"));
    let missing: Vec<&&str> =
        members.iter().filter(|m| !readme.contains(&format!("\n| `{m}` |"))).collect();
    assert!(missing.is_empty(), "README.md's crate table has no row for {missing:?}");
}

#[test]
fn every_environment_variable_the_documents_name_is_read() {
    let root = root();
    let mut code = String::new();
    for tree in ["hotloop", "hotloop-cli", "hotloop-bench", "scripts", ".ci"] {
        for ext in [".rs", ".sh", ".py", "run"] {
            for f in files(&root.join(tree), ext) {
                code.push_str(&read(&f));
            }
        }
    }
    let mut missing = Vec::new();
    for doc in DOCUMENTS.iter().chain(&["BENCHMARKS.md"]) {
        let text = read(&root.join(doc));
        for (at, _) in text.match_indices("HOTLOOP_") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !code.contains(&name) && !missing.contains(&name) {
                missing.push(name);
            }
        }
    }
    assert!(missing.is_empty(), "variables the documents name that nothing reads: {missing:?}");
}

/// With `autotests = false`, a test file that is neither a module of its
/// package's `tests/suite.rs` nor a `[[test]]` of its own would never run:
/// nothing would say so.
#[test]
fn every_test_file_is_built() {
    for package in ["hotloop", "hotloop-cli"] {
        let dir = root().join(package);
        let suite = read(&dir.join("tests/suite.rs"));
        let manifest = read(&dir.join("Cargo.toml"));
        for file in files(&dir.join("tests"), "rs") {
            if file.parent() != Some(dir.join("tests").as_path()) {
                continue; // helpers under tests/common
            }
            let name = file.file_stem().unwrap().to_str().unwrap();
            if name == "suite" {
                continue;
            }
            let in_suite = suite.lines().any(|l| l.trim() == format!("mod {name};"));
            let own_binary = manifest.split("[[test]]").skip(1).any(|section| {
                let section = section.split("\n[").next().unwrap_or("");
                section.contains(&format!("name = \"{name}\""))
            });
            assert!(
                in_suite != own_binary,
                "{package}/tests/{name}.rs must be either a module of tests/suite.rs or a [[test]] of its own (in the suite: {in_suite}, own binary: {own_binary})"
            );
        }
    }
}
