//! The path extraction of the stats endpoint's request reader.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = hotloop_proto::request_path(data);
});
