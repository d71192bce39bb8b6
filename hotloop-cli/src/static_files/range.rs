//! The `Range` request header (RFC 9110 section 14.2): one byte range.

/// What a `Range` header asks of a representation of `len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranged {
    /// Serve the whole representation: no header, one we do not parse, a
    /// unit other than bytes, or several ranges of which some exist
    /// (which a server may answer with the whole, RFC 9110 section 14.2).
    Full,
    /// Serve bytes `start..=end` (206).
    Part { start: u64, end: u64 },
    /// No range overlaps the representation (416), of one range or of
    /// several (nginx answers both 416).
    Unsatisfiable,
}

/// Interprets `header` (the value of `Range`) for `len` bytes. The unit
/// is matched in any case (RFC 9110 section 14.1: `Bytes=0-1` asks for
/// bytes too, as nginx reads it).
pub fn parse(header: Option<&[u8]>, len: u64) -> Ranged {
    let Some(value) = header.and_then(|h| std::str::from_utf8(h).ok()) else {
        return Ranged::Full;
    };
    let value = value.trim();
    let Some(spec) = value.get(..6).filter(|unit| unit.eq_ignore_ascii_case("bytes=")) else {
        return Ranged::Full;
    };
    let spec = &value[spec.len()..];
    if !spec.contains(',') {
        return one(spec, len).unwrap_or(Ranged::Full);
    }
    // Several: the whole file if any of them exists, 416 if none does; a
    // list with a range we do not parse is ignored, as one such range is.
    let mut ranges = 0;
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match one(part, len) {
            Some(Ranged::Unsatisfiable) => ranges += 1,
            Some(_) | None => return Ranged::Full,
        }
    }
    if ranges == 0 {
        Ranged::Full
    } else {
        Ranged::Unsatisfiable
    }
}

/// One range (`first-last`, `first-` or `-suffix`) of `len` bytes;
/// `None` when it is not one.
fn one(spec: &str, len: u64) -> Option<Ranged> {
    let (first, last) = spec.trim().split_once('-')?;
    let (first, last) = (first.trim(), last.trim());
    let number = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // More digits than a u64 holds: as large as can be.
        Some(s.parse().unwrap_or(u64::MAX))
    };
    if first.is_empty() {
        // `-n`: the last n bytes.
        let n = number(last)?;
        if n == 0 || len == 0 {
            return Some(Ranged::Unsatisfiable);
        }
        return Some(Ranged::Part { start: len.saturating_sub(n), end: len - 1 });
    }
    let start = number(first)?;
    let end = if last.is_empty() {
        u64::MAX
    } else {
        // `5-3` is not a valid range: the header is ignored.
        number(last).filter(|&end| end >= start)?
    };
    if start >= len {
        return Some(Ranged::Unsatisfiable);
    }
    Some(Ranged::Part { start, end: end.min(len - 1) })
}

#[cfg(test)]
mod tests {
    use super::{parse, Ranged};

    fn p(h: &str, len: u64) -> Ranged {
        parse(Some(h.as_bytes()), len)
    }

    #[test]
    fn single_ranges() {
        assert_eq!(p("bytes=0-0", 10), Ranged::Part { start: 0, end: 0 });
        assert_eq!(p("bytes=5-", 10), Ranged::Part { start: 5, end: 9 });
        assert_eq!(p("bytes=-5", 10), Ranged::Part { start: 5, end: 9 });
        assert_eq!(p("bytes=-50", 10), Ranged::Part { start: 0, end: 9 });
        assert_eq!(p("bytes=2-100", 10), Ranged::Part { start: 2, end: 9 });
        assert_eq!(p("bytes=9-9", 10), Ranged::Part { start: 9, end: 9 });
        assert_eq!(p("bytes = 1-2", 10), Ranged::Full, "no spaces around `=`");
        assert_eq!(p("Bytes=0-1", 10), Ranged::Part { start: 0, end: 1 }, "the unit in any case");
        assert_eq!(p("BYTES=-2", 10), Ranged::Part { start: 8, end: 9 });
        assert_eq!(p("bytes=1-99999999999999999999999", 10), Ranged::Part { start: 1, end: 9 });
    }

    #[test]
    fn unsatisfiable_and_ignored() {
        assert_eq!(p("bytes=10-", 10), Ranged::Unsatisfiable);
        assert_eq!(p("bytes=10-20", 10), Ranged::Unsatisfiable);
        assert_eq!(p("bytes=-0", 10), Ranged::Unsatisfiable);
        assert_eq!(p("bytes=0-", 0), Ranged::Unsatisfiable);
        assert_eq!(p("bytes=5-3", 10), Ranged::Full);
        assert_eq!(p("bytes=0-1,3-4", 10), Ranged::Full);
        assert_eq!(p("bytes=20-30,-0,10-", 10), Ranged::Unsatisfiable, "several, none there");
        assert_eq!(p("bytes=20-30, 9-", 10), Ranged::Full, "several, one there");
        assert_eq!(p("bytes=20-30,5-3", 10), Ranged::Full, "several, one not a range");
        assert_eq!(p("bytes=,", 10), Ranged::Full);
        assert_eq!(p("items=0-1", 10), Ranged::Full);
        assert_eq!(p("bytes=a-b", 10), Ranged::Full);
        assert_eq!(p("bytes=-", 10), Ranged::Full);
        assert_eq!(parse(None, 10), Ranged::Full);
    }
}
