//! The load generator's HTTP response reader, on arbitrary bytes fed in
//! arbitrary pieces (the first byte picks the piece size): it must reach
//! a verdict or ask for more, never panic or buffer without bound.
#![no_main]

use hotloop_proto::response::{HttpReader, Progress};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&piece, rest)) = data.split_first() else { return };
    let piece = usize::from(piece).max(1);
    let mut reader = HttpReader::new();
    for chunk in rest.chunks(piece) {
        match reader.feed(chunk) {
            Progress::More => {}
            Progress::Done { .. } | Progress::Status(_) | Progress::Bad(_) => {
                reader.reset();
            }
        }
    }
    let _ = reader.eof();
});
