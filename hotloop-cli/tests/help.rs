//! `--help` documents every timeout with its default.

use std::process::Command;

fn help(command: &str) -> String {
    let out =
        Command::new(env!("CARGO_BIN_EXE_hotloop")).args([command, "--help"]).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn help_documents_every_timeout_with_its_default() {
    for (command, flags) in [
        (
            "serve",
            &[
                "--idle-timeout-ms",
                "--header-timeout-ms",
                "--send-timeout-ms",
                "--drain-timeout-ms",
            ][..],
        ),
        ("proxy", &["--connect-timeout-ms", "--idle-timeout-ms", "--drain-timeout-ms"][..]),
    ] {
        let text = help(command);
        for flag in flags {
            let at =
                text.find(&format!("{flag} <")).unwrap_or_else(|| panic!("{command}: no {flag}"));
            let entry = &text[at..];
            let entry = &entry[..entry[2..].find("\n      --").map_or(entry.len(), |e| e + 2)];
            assert!(entry.contains("[default: "), "{command} {flag} has no default: {entry}");
        }
        assert!(text.contains("Timeouts"), "{command}: no timeout summary");
        assert!(text.contains("--upgrade-socket"), "{command}: upgrades undocumented");
        assert!(
            text.contains("SIGHUP") && text.contains("SIGQUIT"),
            "{command}: signals undocumented"
        );
    }
    assert!(help("serve").contains("sent nothing for 2 s"), "the lingering close is undocumented");
}

/// Every timeout flag of `serve` and `proxy` that takes 0 says what 0 means.
#[test]
fn help_says_what_a_timeout_of_zero_means() {
    for (command, flags) in [
        ("serve", &["--idle-timeout-ms", "--header-timeout-ms", "--send-timeout-ms"][..]),
        ("proxy", &["--idle-timeout-ms", "--header-timeout-ms", "--send-timeout-ms"][..]),
    ] {
        let text = help(command);
        for flag in flags {
            let at =
                text.find(&format!("{flag} <")).unwrap_or_else(|| panic!("{command}: no {flag}"));
            let entry = &text[at..];
            let entry = &entry[..entry[2..].find("\n      --").map_or(entry.len(), |e| e + 2)];
            assert!(entry.contains("0: never"), "{command} {flag} does not say what 0 is: {entry}");
        }
    }
}

/// The names of the values clap lists under `Possible values:` after
/// `heading` in a `--help` text, and the summary line above that list.
fn possible_values<'a>(text: &'a str, heading: &str) -> (&'a str, Vec<&'a str>) {
    let at = text.find(heading).unwrap_or_else(|| panic!("no {heading} in:\n{text}"));
    let rest = &text[at + heading.len()..];
    let list_at = rest.find("Possible values:").expect("clap lists the possible values");
    let summary = rest[..list_at].trim();
    let values = rest[list_at..]
        .lines()
        .skip(1)
        .map_while(|l| l.trim().strip_prefix("- "))
        .map(|l| l.split(':').next().unwrap().trim())
        .collect();
    (summary, values)
}

#[test]
fn serve_help_names_every_app() {
    let text = help("serve");
    let (summary, apps) = possible_values(&text, "\n  <APP>\n");
    assert!(apps.len() >= 6, "too few apps found: {apps:?}");
    for app in &apps {
        let named = summary.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| w == *app);
        assert!(named, "`serve --help` summary of <APP> leaves out {app}: {summary:?}");
    }
    // The command's own summary names each kind of server too.
    let top = Command::new(env!("CARGO_BIN_EXE_hotloop")).arg("--help").output().unwrap();
    let top = String::from_utf8(top.stdout).unwrap();
    let serve = top.lines().find(|l| l.trim_start().starts_with("serve ")).unwrap();
    for kind in ["echo", "HTTP", "hyper", "static", "QUIC", "HTTP/3"] {
        assert!(serve.contains(kind), "`hotloop --help` says of serve: {serve:?}, without {kind}");
    }
}
