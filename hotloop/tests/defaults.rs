//! What a program gets from hotloop's default features: whatever a
//! handler on hotloop can reach of tokio must work by default, so the
//! default features host tokio's runtime parts (`tokio-time`); without
//! them `tokio::time::timeout` in an axum handler compiles and then panics.

use std::process::Command;

/// The features `cargo tree` resolves for hotloop built alone with its
/// defaults, as a program that depends on it gets them.
fn default_features() -> Option<Vec<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let out = match Command::new(cargo)
        .args(["tree", "--locked", "-p", "hotloop", "-e", "normal", "--depth", "0"])
        .args(["--prefix", "none", "--format", "{p}|{f}", "--manifest-path", manifest])
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
    let line = text.lines().find(|l| l.starts_with("hotloop v")).expect("hotloop is listed");
    let (_, features) = line.split_once('|').unwrap();
    Some(features.split(',').map(|f| f.trim().to_string()).collect())
}

#[test]
fn the_default_features_host_tokio_for_handlers() {
    let Some(features) = default_features() else { return };
    for wanted in ["tokio-time", "tokio-io", "macros"] {
        assert!(features.iter().any(|f| f == wanted), "`{wanted}` is not a default: {features:?}");
    }
}
