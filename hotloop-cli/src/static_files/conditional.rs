//! Conditional requests (RFC 9110 section 13) on a file: its entity tag,
//! as nginx makes it, and what `If-None-Match`, `If-Modified-Since` and
//! `If-Range` say of the version the client holds.

use std::time::{SystemTime, UNIX_EPOCH};

/// The entity tag of a file modified at `modified` with `len` bytes, as
/// nginx makes it: the time in seconds and the length, in hex, quoted.
pub fn etag(modified: SystemTime, len: u64) -> String {
    let secs = modified.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("\"{secs:x}-{len:x}\"")
}

/// Whether an `If-None-Match` value names `etag` by the weak comparison
/// (RFC 9110 section 8.8.3.2: a `W/` on either side is not looked at), or
/// is `*` (any version of a file that is there). A list is read up to
/// anything that is not an entity tag.
pub fn etag_listed(value: &[u8], etag: &str) -> bool {
    let value = value.trim_ascii();
    if value == b"*" {
        return true;
    }
    let ours = etag.strip_prefix("W/").unwrap_or(etag).as_bytes();
    let mut rest = value;
    loop {
        rest = rest.trim_ascii_start();
        while let [b',', tail @ ..] = rest {
            rest = tail.trim_ascii_start();
        }
        if rest.is_empty() {
            return false;
        }
        let tag = rest.strip_prefix(b"W/").unwrap_or(rest);
        // An entity tag is quoted, and its opaque part holds no quote.
        let Some(end) = tag.iter().skip(1).position(|&b| b == b'"') else { return false };
        if tag[0] != b'"' {
            return false;
        }
        if &tag[..end + 2] == ours {
            return true;
        }
        rest = &tag[end + 2..];
    }
}

/// Whether the client's copy is the file's version (304): by
/// `If-None-Match` when the request has it (RFC 9110 section 13.1.3:
/// `If-Modified-Since` is then not looked at), its list naming the
/// file's entity tag by the weak comparison; otherwise by
/// `If-Modified-Since` naming the file's modification time exactly, to
/// the second `Last-Modified` says (nginx's default `if_modified_since
/// exact`: a file put back to an older version has an older time, which
/// a client holding the newer must not take as its own).
pub fn not_modified(
    if_none_match: Option<&[u8]>,
    if_modified_since: Option<&[u8]>,
    modified: SystemTime,
    etag: &str,
) -> bool {
    if let Some(list) = if_none_match {
        return etag_listed(list, etag);
    }
    let Some(since) = if_modified_since.and_then(|h| std::str::from_utf8(h).ok()) else {
        return false;
    };
    let Ok(since) = httpdate::parse_http_date(since.trim()) else { return false };
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    secs(modified) == secs(since)
}

/// Whether an `If-Range` validator names the file's version, so the range
/// is served (RFC 9110 section 13.1.5): an entity tag by the strong
/// comparison (a weak one never does), a date only when it is the
/// `Last-Modified` sent (`last_modified`, `None` when that is not the
/// file's own time) exactly.
pub fn if_range_matches(value: &[u8], etag: &str, last_modified: Option<&str>) -> bool {
    let value = value.trim_ascii();
    if value.starts_with(b"\"") || value.starts_with(b"W/") {
        return value == etag.as_bytes();
    }
    last_modified.is_some_and(|date| value == date.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `If-None-Match` lists are read as RFC 9110 section 8.8.3 has them.
    #[test]
    fn if_none_match_names_an_etag_weakly() {
        let etag = etag(UNIX_EPOCH + std::time::Duration::from_secs(0x5f2b3c4d), 10);
        assert_eq!(etag, "\"5f2b3c4d-a\"");
        for listed in [
            "\"5f2b3c4d-a\"",
            "W/\"5f2b3c4d-a\"",
            " \"x\", \"5f2b3c4d-a\"",
            "\"a,b\",W/\"5f2b3c4d-a\" ",
            "*",
        ] {
            assert!(etag_listed(listed.as_bytes(), &etag), "{listed}");
        }
        for not_listed in ["\"5f2b3c4d-b\"", "5f2b3c4d-a", "\"x\" junk \"5f2b3c4d-a\"", "", "\""] {
            assert!(!etag_listed(not_listed.as_bytes(), &etag), "{not_listed}");
        }
    }
}
