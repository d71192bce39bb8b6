//! The option values a user types (`--busy-poll`, `--driver`, `--register`,
//! `--accept`): any string gives a value or a clear error, never a panic.
#![no_main]

use hotloop::net::AcceptMode;
use hotloop::{BusyPoll, DriverKind, Registration};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(mode) = s.parse::<BusyPoll>() {
        // What it prints parses back to itself.
        assert_eq!(mode.to_string().parse::<BusyPoll>().unwrap(), mode);
    }
    let _ = s.parse::<DriverKind>();
    let _ = s.parse::<Registration>();
    let _ = s.parse::<AcceptMode>();
});
