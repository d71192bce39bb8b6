//! From a request target to a path under the root: percent-decoding and
//! refusing what could leave it.

use std::path::{Path, PathBuf};

/// Why a target maps to no path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not a path at all (no leading `/`, bad percent-encoding, a NUL): 400.
    Malformed,
    /// A `..` segment, literal or percent-encoded: 403.
    Traversal,
}

/// The path of `target` relative to the root: the query and fragment
/// dropped, percent-decoded, empty and `.` segments skipped. `..` is
/// refused rather than resolved, and so is a decoded `/` inside a segment
/// (`%2F`), which would change how the path splits. An empty result is
/// the root itself.
pub fn relative_path(target: &str) -> Result<PathBuf, Refused> {
    let target = origin_form(target);
    let path = target.split(['?', '#']).next().unwrap_or("");
    let Some(path) = path.strip_prefix('/') else { return Err(Refused::Malformed) };
    let mut out = PathBuf::new();
    for raw in path.split('/') {
        let segment = decode(raw).ok_or(Refused::Malformed)?;
        if segment.contains(&0) || segment.contains(&b'/') {
            return Err(Refused::Malformed);
        }
        match &segment[..] {
            b"" | b"." => {}
            b".." => return Err(Refused::Traversal),
            _ => {
                use std::os::unix::ffi::OsStrExt;
                out.push(std::ffi::OsStr::from_bytes(&segment));
            }
        }
    }
    Ok(out)
}

/// An absolute-form target (`http://host/path`, which a server must take,
/// RFC 9112 section 3.2.2) as its path and what follows; any other target
/// as it is. The host is the server's to ignore: it serves one root.
fn origin_form(target: &str) -> &str {
    for scheme in ["http://", "https://"] {
        let named = target.get(..scheme.len()).is_some_and(|s| s.eq_ignore_ascii_case(scheme));
        if named {
            let rest = &target[scheme.len()..];
            return match rest.find(['/', '?', '#']) {
                Some(at) if rest.as_bytes()[at] == b'/' => &rest[at..],
                _ => "/",
            };
        }
    }
    target
}

/// `rel` (a path [`relative_path`] gave, not the root itself) as an
/// absolute path to put in a URL: one leading `/`, and each segment
/// percent-encoded but for the characters a path segment may hold as
/// they are (RFC 3986 `pchar`). Built from the normalised path, never
/// from the request's own target: a target such as `//host` would make a
/// `Location` a browser reads as another host.
pub fn url_path(rel: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for segment in rel.iter() {
        out.push('/');
        for &b in segment.as_bytes() {
            let plain = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&b);
            if plain {
                out.push(b as char);
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    out
}

/// Percent-decodes `s`; `None` for a `%` not followed by two hex digits.
fn decode(s: &str) -> Option<Vec<u8>> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::{relative_path, url_path, Refused};
    use std::path::{Path, PathBuf};

    #[test]
    fn a_url_path_has_one_leading_slash_and_encoded_segments() {
        let url = |target: &str| url_path(&relative_path(target).unwrap());
        assert_eq!(url("//evil.example"), "/evil.example");
        assert_eq!(url("///a//b/./c"), "/a/b/c");
        assert_eq!(url("/a%20b/%3F%23%25"), "/a%20b/%3F%23%25");
        assert_eq!(url("/caf%C3%A9/x:y@z"), "/caf%C3%A9/x:y@z");
        assert_eq!(url("http://host//evil.example"), "/evil.example");
        assert_eq!(url_path(Path::new("a\\b")), "/a%5Cb");
    }

    #[test]
    fn maps_targets() {
        assert_eq!(relative_path("/"), Ok(PathBuf::new()));
        assert_eq!(relative_path("/a/b.txt?x=1#f"), Ok(PathBuf::from("a/b.txt")));
        assert_eq!(relative_path("//a/./b"), Ok(PathBuf::from("a/b")));
        assert_eq!(relative_path("/with%20space"), Ok(PathBuf::from("with space")));
        assert_eq!(relative_path("/..a/b.."), Ok(PathBuf::from("..a/b..")));
        assert_eq!(relative_path("http://host/a/b.txt?x"), Ok(PathBuf::from("a/b.txt")));
        assert_eq!(relative_path("HTTPS://host:8443"), Ok(PathBuf::new()));
        assert_eq!(relative_path("http://host/../x"), Err(Refused::Traversal));
    }

    #[test]
    fn refuses_ways_out_and_garbage() {
        assert_eq!(relative_path("/../etc/passwd"), Err(Refused::Traversal));
        assert_eq!(relative_path("/a/../../x"), Err(Refused::Traversal));
        assert_eq!(relative_path("/%2e%2e/x"), Err(Refused::Traversal));
        assert_eq!(relative_path("/%2E%2E"), Err(Refused::Traversal));
        assert_eq!(relative_path("/.%2e/x"), Err(Refused::Traversal));
        assert_eq!(relative_path("/a%2f..%2f..%2fx"), Err(Refused::Malformed));
        assert_eq!(relative_path("/a%00b"), Err(Refused::Malformed));
        assert_eq!(relative_path("/a%zz"), Err(Refused::Malformed));
        assert_eq!(relative_path("/a%2"), Err(Refused::Malformed));
        assert_eq!(relative_path("a"), Err(Refused::Malformed));
        assert_eq!(relative_path("*"), Err(Refused::Malformed));
    }
}
