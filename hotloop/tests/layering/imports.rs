//! The import scanner both layering tests share (`hotloop/tests/layering.rs`
//! and `hotloop-cli/tests/layering.rs`, which includes this file by
//! `#[path]`): which modules a file names, and the order a module doc
//! gives its modules in, so each order is written once, in the doc.
//!
//! It reads source text, not the compiler's view: a path is what follows
//! `super::`, `crate::` or another prefix in code (comments, and the unit
//! tests at the end of a file, left out), as `use` lines and paths in
//! expressions write it.

#![allow(dead_code)] // each test uses its own subset

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, in name order.
pub fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The code lines of `file`, numbered from 1, with comments and the unit
/// tests at the end of the file left out (the loom tests,
/// `#[cfg(all(test, hotloop_loom))]`, too).
pub fn code_lines(file: &Path) -> Vec<(usize, String)> {
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

/// The first segment of every path that follows `prefix` in `code`, with
/// the number of the line it starts on (`line_of[byte]`): `prefix` then
/// `a::B` gives `a`, a group `prefix{a::B, c}` (over several lines, as
/// `rustfmt` wraps it) gives `a` and `c`, and a glob gives `*`. `self` in
/// a group is left out; so is a prefix that ends a longer name
/// (`my_crate::` is not `crate::`), and `super::super::x` for `super::`.
fn names_in(code: &str, line_of: &[usize], prefix: &str) -> Vec<(usize, String)> {
    let ident = |s: &str| -> String {
        let s = s.trim();
        if s.starts_with('*') {
            return "*".to_string();
        }
        s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
    };
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find(prefix) {
        let start = from + at;
        from = start + prefix.len();
        let before = &code[..start];
        if before.ends_with("super::")
            || before.ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '$')
        {
            continue;
        }
        let rest = &code[from..];
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

/// [`names_in`] over `file`'s code ([`code_lines`]).
pub fn names_after(file: &Path, prefix: &str) -> Vec<(usize, String)> {
    let mut text = String::new();
    let mut line_of = Vec::new();
    for (n, line) in code_lines(file) {
        line_of.resize(line_of.len() + line.len() + 1, n);
        text.push_str(&line);
        text.push('\n');
    }
    names_in(&text, &line_of, prefix)
}

/// [`names_in`] over one line of code, for tests of the scanner.
pub fn names_in_line(code: &str, prefix: &str) -> Vec<String> {
    let line_of = vec![1; code.len() + 1];
    names_in(code, &line_of, prefix).into_iter().map(|(_, name)| name).collect()
}

/// The modules `mod_rs` declares (`mod a;`, `pub(crate) mod a;`), each
/// with the stem of its file (`#[path = "a_off.rs"] mod a;` gives `a` ->
/// `a_off`; a module declared twice under two `cfg`s is one module with
/// two files).
pub fn declared_modules(mod_rs: &Path) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut path = None;
    for (_, line) in code_lines(mod_rs) {
        let line = line.trim();
        if let Some(p) = line.strip_prefix("#[path = \"").and_then(|p| p.strip_suffix("\"]")) {
            path = Some(p.trim_end_matches(".rs").to_string());
            continue;
        }
        let decl = line.strip_prefix("pub(crate) ").or(line.strip_prefix("pub ")).unwrap_or(line);
        if let Some(name) = decl.strip_prefix("mod ").and_then(|n| n.strip_suffix(';')) {
            let stem = path.take().unwrap_or_else(|| name.to_string());
            out.entry(name.to_string()).or_default().push(stem);
        } else if !line.starts_with("#[") {
            path = None;
        }
    }
    out
}

/// The order, bottom to top, that `mod_rs`'s module doc gives its modules
/// in: the modules it declares, as they first appear in backticks in the
/// doc from the line holding `from` (a heading such as `# Layout`, or the
/// sentence that begins the list) to the next heading. A module the doc
/// leaves out is not in the order (the caller says to place it there).
pub fn order_in_doc(mod_rs: &Path, from: &str) -> Vec<String> {
    let text = std::fs::read_to_string(mod_rs).unwrap();
    let doc: Vec<&str> = text
        .lines()
        .map_while(|l| l.trim_start().strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect();
    let start = doc
        .iter()
        .position(|l| l.contains(from))
        .unwrap_or_else(|| panic!("{}: no `{from}` in the module doc", mod_rs.display()));
    let mut section = doc[start].split_once(from).map_or("", |(_, rest)| rest).to_string();
    for line in &doc[start + 1..] {
        if line.starts_with('#') {
            break;
        }
        section.push('\n');
        section.push_str(line);
    }
    let declared = declared_modules(mod_rs);
    let mut order: Vec<String> = Vec::new();
    for (i, span) in section.split('`').enumerate() {
        // The odd pieces are inside backticks.
        if i % 2 == 1 && declared.contains_key(span) && !order.iter().any(|m| m == span) {
            order.push(span.to_string());
        }
    }
    order
}

/// The module a file of the folder `mod_rs` heads is: its own stem, or
/// the module a `#[path]` names it for. `None` for `mod.rs` itself and a
/// file no declaration names.
pub fn module_of(file: &Path, declared: &BTreeMap<String, Vec<String>>) -> Option<String> {
    let stem = file.file_stem()?.to_str()?;
    if stem == "mod" {
        return None;
    }
    declared.iter().find(|(_, stems)| stems.iter().any(|s| s == stem)).map(|(m, _)| m.clone())
}
