//! The `hotloop` command links one runtime: `cargo tree` of its normal
//! (non-dev) dependencies holds no other.
//!
//! "Another runtime" means a crate that schedules tasks or owns a reactor:
//! monoio, mio, async-std, smol, glommio, tokio-uring, compio, async-io,
//! and tokio with a scheduler (`rt`, `rt-multi-thread`) or its reactor
//! (`net`, which brings mio). tokio's I/O traits alone (hyper's h2 uses
//! `tokio` with `io-util`) are fine.

use std::process::Command;

/// Crates that bring a runtime of their own, whatever their features.
const RUNTIME_CRATES: [&str; 8] =
    ["monoio", "mio", "async-std", "smol", "glommio", "tokio-uring", "compio", "async-io"];

/// tokio features that compile a scheduler or a reactor.
const TOKIO_RUNTIME_FEATURES: [&str; 3] = ["rt", "rt-multi-thread", "net"];

/// `(crate, features)` for every package in `hotloop-cli`'s normal dependency graph.
fn normal_dependencies() -> Option<Vec<(String, Vec<String>)>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let out = match Command::new(cargo)
        .args(["tree", "--locked", "-p", "hotloop-cli", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}|{f}", "--manifest-path", manifest])
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!("skipped: cargo could not run ({e})");
            return None;
        }
    };
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    Some(
        text.lines()
            .filter_map(|line| {
                let (package, features) = line.split_once('|')?;
                let name = package.split_whitespace().next()?.to_string();
                let features = features
                    .split(',')
                    .map(str::trim)
                    .filter(|f| !f.is_empty())
                    .map(String::from)
                    .collect();
                Some((name, features))
            })
            .collect(),
    )
}

#[test]
fn the_server_command_links_no_other_runtime() {
    let Some(deps) = normal_dependencies() else { return };
    assert!(deps.iter().any(|(name, _)| name == "hotloop"), "hotloop itself is listed: {deps:?}");
    let mut found = Vec::new();
    for (name, features) in &deps {
        if RUNTIME_CRATES.contains(&name.as_str()) {
            found.push(name.clone());
        }
        if name == "tokio" {
            for f in features.iter().filter(|f| TOKIO_RUNTIME_FEATURES.contains(&f.as_str())) {
                found.push(format!("tokio feature `{f}`"));
            }
        }
    }
    found.sort();
    found.dedup();
    assert!(
        found.is_empty(),
        "`hotloop-cli` pulls in another runtime: {}; see `cargo tree -p hotloop-cli -e normal -i CRATE`",
        found.join(", ")
    );
}
