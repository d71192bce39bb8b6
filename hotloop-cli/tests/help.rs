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
    assert!(help("serve").contains("at most 2 s"), "the lingering close is undocumented");
}
