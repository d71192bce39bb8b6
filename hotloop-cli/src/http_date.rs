//! HTTP dates (RFC 9110 section 5.6.7) for any time. `httpdate` panics
//! for a time before 1970 or in the year 10000 or later, which a file's
//! modification time (it may be anything) or a clock set wrong can be:
//! such a time is said as the nearest date an HTTP date can say.
//!
//! The lowest of the command's modules: it imports none of them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The last second an HTTP date can say, 9999-12-31 23:59:59 UTC, after
/// the epoch.
const LATEST: Duration = Duration::from_secs(253_402_300_799);

/// `t` as an HTTP date, within 1970-01-01 00:00:00 and 9999-12-31
/// 23:59:59 (a time outside is said as the nearer of the two).
pub fn format(t: SystemTime) -> String {
    httpdate::fmt_http_date(t.clamp(UNIX_EPOCH, UNIX_EPOCH + LATEST))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_time_has_a_date() {
        let at = |secs| format(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(1_445_412_480), "Wed, 21 Oct 2015 07:28:00 GMT");
        assert_eq!(at(LATEST.as_secs()), "Fri, 31 Dec 9999 23:59:59 GMT");
        assert_eq!(at(LATEST.as_secs() + 1), "Fri, 31 Dec 9999 23:59:59 GMT");
        assert_eq!(at(1 << 38), "Fri, 31 Dec 9999 23:59:59 GMT");
        let before = UNIX_EPOCH - Duration::from_secs(86_400);
        assert_eq!(format(before), "Thu, 01 Jan 1970 00:00:00 GMT");
    }
}
