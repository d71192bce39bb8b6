//! Request bodies a server reads only to drop them (a `GET` or `HEAD`
//! that carries one, as nginx serves it): how a head frames its body
//! ([`Framing`], RFC 9112 section 6), and the body's end found as its
//! bytes come ([`BodySkip`], chunked coding by RFC 9112 section 7.1).

/// The most bytes of body a request may carry, chunk data counted
/// (nginx's default `client_max_body_size 1m`); more is `413`.
pub const REQUEST_BODY_MAX_BYTES: u64 = 1 << 20;

/// How a request's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// No body (no framing field, or `Content-Length: 0`).
    None,
    /// `Content-Length` bytes, at most [`REQUEST_BODY_MAX_BYTES`].
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// The framing fields of a request head, gathered as its fields are
/// walked; [`Framing::body`] then says what they frame.
#[derive(Debug, Default, Clone, Copy)]
pub struct Framing {
    length: Option<u64>,
    /// A `Content-Length` that is not a number, or two that differ.
    bad_length: bool,
    /// `Transfer-Encoding` fields seen (at most 2 counted).
    encodings: u8,
    /// Whether the (last) `Transfer-Encoding` is `chunked` alone.
    chunked: bool,
}

impl Framing {
    /// A `Content-Length` field's value. Repeated with the same value it
    /// is one (RFC 9110 section 8.6); with another, or not a number, the
    /// head is refused.
    pub fn content_length(&mut self, value: &[u8]) {
        let value = value.trim_ascii();
        // 19 digits cannot overflow a u64; a longer length is refused.
        let number =
            (!value.is_empty() && value.len() <= 19 && value.iter().all(u8::is_ascii_digit))
                .then(|| value.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')));
        match (number, self.length) {
            (Some(n), Some(seen)) if n != seen => self.bad_length = true,
            (Some(n), _) => self.length = Some(n),
            (None, _) => self.bad_length = true,
        }
    }

    /// A `Transfer-Encoding` field's value.
    pub fn transfer_encoding(&mut self, value: &[u8]) {
        self.encodings = self.encodings.saturating_add(1).min(2);
        self.chunked = value.trim_ascii().eq_ignore_ascii_case(b"chunked");
    }

    /// The body the fields frame in a request of HTTP/1.`minor`, or the
    /// status to refuse it with (and close): `400` for both fields, for
    /// `Transfer-Encoding` twice or in HTTP/1.0 (RFC 9112 section 6.1:
    /// a length that cannot be trusted), for a length not a number or
    /// two that differ; `501` for a coding other than `chunked` (as
    /// nginx); `413` for a length over [`REQUEST_BODY_MAX_BYTES`].
    pub fn body(&self, minor: Option<u8>) -> Result<Body, u16> {
        if self.encodings > 0 {
            if self.length.is_some() || self.bad_length || self.encodings > 1 || minor == Some(0) {
                return Err(400);
            }
            return if self.chunked { Ok(Body::Chunked) } else { Err(501) };
        }
        match (self.bad_length, self.length) {
            (true, _) => Err(400),
            (false, None | Some(0)) => Ok(Body::None),
            (false, Some(n)) if n > REQUEST_BODY_MAX_BYTES => Err(413),
            (false, Some(n)) => Ok(Body::Length(n)),
        }
    }
}

/// Where a [`BodySkip`] is in the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// This many bytes of a `Content-Length` body left.
    Length(u64),
    /// In a chunk-size; whether a digit came yet.
    Size {
        digits: bool,
    },
    /// In a chunk-size line's extensions.
    Extension,
    /// After the chunk-size line's CR.
    SizeLf,
    /// This many bytes of a chunk's data left.
    Data(u64),
    /// After a chunk's data: its CRLF.
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final CRLF).
    TrailerStart,
    /// Inside a trailer line.
    Trailer,
    /// After the final CR.
    FinalLf,
}

/// Finds the end of a body as its bytes come, dropping them: a server
/// that does not read a request's body still has to find where the next
/// request starts. Chunk data counts against [`REQUEST_BODY_MAX_BYTES`],
/// and so do the chunked coding's own bytes (sizes, extensions, line
/// ends, trailers) apart, so a body that never ends is refused however it
/// is cut up.
#[derive(Debug, Clone)]
pub struct BodySkip {
    at: At,
    /// The current chunk's size, while its size line is read.
    size: u64,
    /// Chunk data seen.
    data: u64,
    /// Bytes of the chunked coding's own seen.
    framing: u64,
}

impl BodySkip {
    /// A skip of a body framed as `body` (not [`Body::None`]).
    pub fn new(body: Body) -> BodySkip {
        let at = match body {
            Body::Length(n) => At::Length(n),
            Body::Chunked => At::Size { digits: false },
            // Nothing to skip: done at the first byte, which is not taken.
            Body::None => At::Length(0),
        };
        BodySkip { at, size: 0, data: 0, framing: 0 }
    }

    /// Takes body bytes from the start of `bytes`: `Ok(Some(n))` when
    /// the body ended after `n` of them (the rest belong to what follows
    /// it), `Ok(None)` when all were body and more is to come, or the
    /// status to refuse the request with: `400` for a chunked coding that
    /// is not one, `413` for a body over [`REQUEST_BODY_MAX_BYTES`].
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Option<usize>, u16> {
        if self.at == At::Length(0) {
            return Ok(Some(0));
        }
        let mut i = 0;
        while i < bytes.len() {
            if let At::Length(left) | At::Data(left) = &mut self.at {
                let n = (*left).min((bytes.len() - i) as u64);
                *left -= n;
                i += n as usize;
                if *left == 0 {
                    if let At::Length(_) = self.at {
                        return Ok(Some(i));
                    }
                    self.at = At::DataCr;
                }
                continue;
            }
            let b = bytes[i];
            i += 1;
            self.framing += 1;
            if self.framing > REQUEST_BODY_MAX_BYTES {
                return Err(413);
            }
            self.at = match (self.at, b) {
                (At::Size { .. }, b) if b.is_ascii_hexdigit() => {
                    let digit = u64::from((b as char).to_digit(16).unwrap_or(0));
                    self.size = match self.size.checked_mul(16) {
                        Some(n) => n + digit,
                        None => return Err(413),
                    };
                    At::Size { digits: true }
                }
                (At::Size { digits: true }, b';' | b' ' | b'\t') => At::Extension,
                (At::Size { digits: true } | At::Extension, b'\r') => At::SizeLf,
                (At::Size { digits: true } | At::Extension | At::SizeLf, b'\n') => self.chunk()?,
                (At::Extension, _) => At::Extension,
                (At::DataCr, b'\r') => At::DataLf,
                (At::DataCr | At::DataLf, b'\n') => At::Size { digits: false },
                (At::TrailerStart, b'\r') => At::FinalLf,
                (At::TrailerStart | At::FinalLf, b'\n') => return Ok(Some(i)),
                (At::Trailer, b'\n') => At::TrailerStart,
                (At::TrailerStart | At::Trailer, _) => At::Trailer,
                _ => return Err(400),
            };
        }
        Ok(None)
    }

    /// A chunk-size line ended: its data follows, or the trailers after
    /// the last chunk.
    fn chunk(&mut self) -> Result<At, u16> {
        let size = std::mem::take(&mut self.size);
        if size == 0 {
            return Ok(At::TrailerStart);
        }
        self.data = self.data.saturating_add(size);
        if self.data > REQUEST_BODY_MAX_BYTES {
            return Err(413);
        }
        Ok(At::Data(size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framing(fields: &[(&str, &str)], minor: u8) -> Result<Body, u16> {
        let mut f = Framing::default();
        for (name, value) in fields {
            match *name {
                "cl" => f.content_length(value.as_bytes()),
                _ => f.transfer_encoding(value.as_bytes()),
            }
        }
        f.body(Some(minor))
    }

    #[test]
    fn a_head_frames_its_body_or_is_refused() {
        assert_eq!(framing(&[], 1), Ok(Body::None));
        assert_eq!(framing(&[("cl", "0")], 1), Ok(Body::None));
        assert_eq!(framing(&[("cl", " 5 ")], 1), Ok(Body::Length(5)));
        assert_eq!(framing(&[("cl", "5"), ("cl", "5")], 1), Ok(Body::Length(5)));
        assert_eq!(framing(&[("cl", "5"), ("cl", "6")], 1), Err(400));
        assert_eq!(framing(&[("cl", "-5")], 1), Err(400));
        assert_eq!(framing(&[("cl", "+5")], 1), Err(400));
        assert_eq!(framing(&[("cl", "5, 5")], 1), Err(400));
        assert_eq!(framing(&[("cl", "")], 1), Err(400));
        assert_eq!(framing(&[("cl", "99999999999999999999")], 1), Err(400));
        assert_eq!(framing(&[("cl", "1048576")], 1), Ok(Body::Length(1 << 20)));
        assert_eq!(framing(&[("cl", "1048577")], 1), Err(413));
        assert_eq!(framing(&[("te", "chunked")], 1), Ok(Body::Chunked));
        assert_eq!(framing(&[("te", "Chunked")], 1), Ok(Body::Chunked));
        assert_eq!(framing(&[("te", "chunked")], 0), Err(400));
        assert_eq!(framing(&[("te", "gzip")], 1), Err(501));
        assert_eq!(framing(&[("te", "gzip, chunked")], 1), Err(501));
        assert_eq!(framing(&[("te", "chunked"), ("te", "chunked")], 1), Err(400));
        assert_eq!(framing(&[("cl", "5"), ("te", "chunked")], 1), Err(400));
        assert_eq!(framing(&[("te", "chunked"), ("cl", "0")], 1), Err(400));
    }

    /// Feeds `bytes` in pieces of `step`; where the body ended.
    fn skip(body: Body, bytes: &[u8], step: usize) -> Result<Option<usize>, u16> {
        let mut s = BodySkip::new(body);
        let mut at = 0;
        for piece in bytes.chunks(step) {
            match s.feed(piece)? {
                Some(n) => return Ok(Some(at + n)),
                None => at += piece.len(),
            }
        }
        Ok(None)
    }

    #[test]
    fn the_end_of_a_body_is_found_however_it_is_split() {
        let chunked =
            b"5\r\nhello\r\n1a;ext=\"v\"\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-T: 1\r\n\r\nGET";
        for step in [1, 2, 3, 7, 100] {
            assert_eq!(skip(Body::Length(5), b"helloGET", step), Ok(Some(5)), "{step}");
            assert_eq!(skip(Body::Length(5), b"hel", step), Ok(None), "{step}");
            assert_eq!(skip(Body::Chunked, chunked, step), Ok(Some(chunked.len() - 3)), "{step}");
            assert_eq!(skip(Body::Chunked, b"0\r\n\r\nG", step), Ok(Some(5)), "{step}");
            assert_eq!(skip(Body::Chunked, b"3\nabc\n0\n\nG", step), Ok(Some(9)), "{step}");
            assert_eq!(skip(Body::Chunked, b"5\r\nhel", step), Ok(None), "{step}");
        }
    }

    #[test]
    fn a_bad_or_endless_chunked_body_is_refused() {
        for bad in [&b"x\r\n"[..], b"\r\n", b";\r\n", b"5\r\nhelloX", b"0\r\n\rX", b"5 5\r\n"] {
            assert!(matches!(skip(Body::Chunked, bad, 1), Err(400) | Ok(None)), "{bad:?}");
        }
        assert_eq!(skip(Body::Chunked, b"x\r\n", 1), Err(400));
        assert_eq!(skip(Body::Chunked, b"5\r\nhelloX", 1), Err(400));
        assert_eq!(skip(Body::Chunked, b"ffffffffffffffffff\r\n", 1), Err(413));
        assert_eq!(skip(Body::Chunked, b"100001\r\n", 1), Err(413));
        let many = b"1\r\nx\r\n".repeat(250_000);
        assert_eq!(skip(Body::Chunked, &many, 4096), Err(413));
        let long_extension = [b"1;".as_slice(), &vec![b'e'; 2 << 20]].concat();
        assert_eq!(skip(Body::Chunked, &long_extension, 4096), Err(413));
    }
}
