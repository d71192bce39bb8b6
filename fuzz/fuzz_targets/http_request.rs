//! The HTTP request parser every hotloop server uses, on arbitrary bytes,
//! whole and split at every point the way reads split them.
#![no_main]

use hotloop_proto::{parse_request, Request, REQUEST_HEAD_MAX_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let whole = parse_request(data);
    if let Request::Complete { len, .. } = whole {
        assert!(len <= data.len() && len <= REQUEST_HEAD_MAX_BYTES);
    }
    // A server sees the same bytes in pieces: every prefix must agree with the whole.
    for cut in 0..data.len().min(256) {
        match (parse_request(&data[..cut]), whole) {
            (Request::Complete { len, close, .. }, Request::Complete { len: l2, close: c2, .. }) => {
                assert_eq!((len, close), (l2, c2), "a prefix parsed differently from the whole");
            }
            (Request::Complete { .. }, other) => panic!("a prefix completed but the whole is {other:?}"),
            _ => {}
        }
    }
});
