//! Reading a server's reply incrementally, one read's bytes at a time.
//!
//! A reply arrives in however many pieces the kernel hands over, so each
//! reader keeps only what it needs to decide: the HTTP head until it is
//! complete, then a count of body bytes still owed; for echo, how many bytes
//! of the payload have come back.

/// The most bytes a response head may take before the reply counts as bad.
pub const RESPONSE_HEAD_MAX_BYTES: usize = 16 * 1024;

/// The most headers a response may carry.
const RESPONSE_HEADERS_MAX: usize = 32;

/// What a reader decided after the bytes it was fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// The reply is not complete yet.
    More,
    /// The reply is complete and good; `close` is true when the server said
    /// it closes the connection.
    Done {
        /// The server will close the connection after this reply.
        close: bool,
    },
    /// The reply is complete but its status was not 200.
    Status(u16),
    /// The bytes are not a valid reply.
    Bad(BadReason),
}

/// Why a reply was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadReason {
    /// The status line or headers do not parse.
    Malformed,
    /// The head is larger than [`RESPONSE_HEAD_MAX_BYTES`].
    HeadTooLarge,
    /// The body is framed in a way the load generator does not read
    /// (chunked transfer encoding, or no length on a kept-alive connection).
    Framing,
    /// More bytes arrived than the reply said it had.
    TrailingBytes,
    /// An echo reply differs from what was sent.
    EchoMismatch,
}

/// An incremental reader for one HTTP/1.1 response.
#[derive(Debug, Default)]
pub struct HttpReader {
    head: Vec<u8>,
    state: HttpState,
}

#[derive(Debug, Default, Clone, Copy)]
enum HttpState {
    #[default]
    Head,
    Body {
        remaining: u64,
        status: u16,
        close: bool,
    },
    /// No Content-Length: the body runs until the server closes.
    UntilEof {
        status: u16,
    },
}

impl HttpReader {
    /// A reader waiting for the first byte of a response.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the reader ready for the next response on the same connection.
    pub fn reset(&mut self) {
        self.head.clear();
        self.state = HttpState::Head;
    }

    /// Feeds bytes just read; `data` must not be empty.
    pub fn feed(&mut self, data: &[u8]) -> Progress {
        match self.state {
            HttpState::Head => {
                // Parse straight from `data` when nothing is buffered, which
                // is the common case of a head arriving in one read.
                let buffered = !self.head.is_empty();
                if buffered {
                    self.head.extend_from_slice(data);
                }
                let buf = if buffered { &self.head[..] } else { data };
                let (head_len, status, content_length, close) = match parse_head(buf) {
                    HeadParse::Partial if buf.len() > RESPONSE_HEAD_MAX_BYTES => {
                        return Progress::Bad(BadReason::HeadTooLarge)
                    }
                    HeadParse::Partial => {
                        if !buffered {
                            self.head.extend_from_slice(data);
                        }
                        return Progress::More;
                    }
                    HeadParse::Bad(reason) => return Progress::Bad(reason),
                    HeadParse::Complete { len, status, content_length, close } => {
                        (len, status, content_length, close)
                    }
                };
                let body_seen = (buf.len() - head_len) as u64;
                match content_length {
                    Some(cl) => {
                        self.state = HttpState::Body { remaining: cl, status, close };
                        self.body(body_seen)
                    }
                    None if close => {
                        self.state = HttpState::UntilEof { status };
                        Progress::More
                    }
                    None => Progress::Bad(BadReason::Framing),
                }
            }
            HttpState::Body { .. } => self.body(data.len() as u64),
            HttpState::UntilEof { .. } => Progress::More,
        }
    }

    /// Tells the reader the server closed the connection; returns whether
    /// that completed the reply (a body delimited by the close).
    pub fn eof(&mut self) -> Option<Progress> {
        match self.state {
            HttpState::UntilEof { status } => Some(finish(status, true)),
            _ => None,
        }
    }

    fn body(&mut self, n: u64) -> Progress {
        let HttpState::Body { remaining, status, close } = &mut self.state else {
            unreachable!("body() is only called in the Body state");
        };
        if n > *remaining {
            return Progress::Bad(BadReason::TrailingBytes);
        }
        *remaining -= n;
        if *remaining > 0 {
            return Progress::More;
        }
        finish(*status, *close)
    }
}

fn finish(status: u16, close: bool) -> Progress {
    if status == 200 {
        Progress::Done { close }
    } else {
        Progress::Status(status)
    }
}

enum HeadParse {
    Partial,
    Bad(BadReason),
    Complete { len: usize, status: u16, content_length: Option<u64>, close: bool },
}

fn parse_head(buf: &[u8]) -> HeadParse {
    let mut headers = [httparse::EMPTY_HEADER; RESPONSE_HEADERS_MAX];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return HeadParse::Partial,
        Err(httparse::Error::TooManyHeaders) => return HeadParse::Bad(BadReason::HeadTooLarge),
        Err(_) => return HeadParse::Bad(BadReason::Malformed),
    };
    let status = resp.code.unwrap_or(0);
    let mut close = resp.version == Some(0);
    let mut content_length = None;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let parsed =
                std::str::from_utf8(h.value).ok().and_then(|v| v.trim().parse::<u64>().ok());
            match parsed {
                Some(n) if content_length.is_none() || content_length == Some(n) => {
                    content_length = Some(n)
                }
                _ => return HeadParse::Bad(BadReason::Malformed),
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return HeadParse::Bad(BadReason::Framing);
        } else if h.name.eq_ignore_ascii_case("connection") {
            if h.value.eq_ignore_ascii_case(b"close") {
                close = true;
            } else if h.value.eq_ignore_ascii_case(b"keep-alive") {
                close = false;
            }
        }
    }
    // RFC 9112 section 6.3: these replies never have a body.
    if status == 204 || status == 304 || (100..200).contains(&status) {
        content_length = Some(0);
    }
    HeadParse::Complete { len, status, content_length, close }
}

/// Checks an echo reply against the payload that was sent.
#[derive(Debug, Default)]
pub struct EchoReader {
    received: usize,
}

impl EchoReader {
    /// A reader waiting for the first echoed byte.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the reader ready for the next echo on the same connection.
    pub fn reset(&mut self) {
        self.received = 0;
    }

    /// Feeds bytes just read, comparing them with `payload`.
    pub fn feed(&mut self, payload: &[u8], data: &[u8]) -> Progress {
        let end = self.received + data.len();
        if end > payload.len() {
            return Progress::Bad(BadReason::TrailingBytes);
        }
        if payload[self.received..end] != *data {
            return Progress::Bad(BadReason::EchoMismatch);
        }
        self.received = end;
        if end == payload.len() {
            Progress::Done { close: false }
        } else {
            Progress::More
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate as proto;

    fn feed_in_pieces(bytes: &[u8], piece: usize) -> Vec<Progress> {
        let mut r = HttpReader::new();
        bytes.chunks(piece).map(|c| r.feed(c)).collect()
    }

    #[test]
    fn whole_response_in_one_read() {
        let resp = proto::response_ok(100, false);
        let mut r = HttpReader::new();
        assert_eq!(r.feed(&resp), Progress::Done { close: false });
        r.reset();
        assert_eq!(r.feed(&proto::response_ok(0, true)), Progress::Done { close: true });
    }

    #[test]
    fn response_split_at_every_size() {
        let resp = proto::response_ok(300, true);
        for piece in 1..resp.len() {
            let got = feed_in_pieces(&resp, piece);
            let (last, rest) = got.split_last().unwrap();
            assert_eq!(*last, Progress::Done { close: true }, "piece {piece}");
            assert!(rest.iter().all(|p| *p == Progress::More), "piece {piece}");
        }
    }

    #[test]
    fn content_length_is_honoured() {
        let mut r = HttpReader::new();
        assert_eq!(r.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab"), Progress::More);
        assert_eq!(r.feed(b"cd"), Progress::More);
        assert_eq!(r.feed(b"e"), Progress::Done { close: false });
        let mut r = HttpReader::new();
        assert_eq!(
            r.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab"),
            Progress::Bad(BadReason::TrailingBytes)
        );
    }

    #[test]
    fn body_until_close() {
        let mut r = HttpReader::new();
        assert_eq!(r.feed(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc"), Progress::More);
        assert_eq!(r.feed(b"def"), Progress::More);
        assert_eq!(r.eof(), Some(Progress::Done { close: true }));
        let mut r = HttpReader::new();
        assert_eq!(r.feed(b"HTTP/1.1 200 OK\r\n\r\n"), Progress::Bad(BadReason::Framing));
    }

    #[test]
    fn bad_status_and_garbage() {
        let mut r = HttpReader::new();
        assert_eq!(r.feed(proto::response_error(400)), Progress::Status(400));
        let mut r = HttpReader::new();
        assert_eq!(r.feed(b"HTTP/1.1 503 Busy\r\nContent-Length: 2\r\n\r\n"), Progress::More);
        assert_eq!(r.feed(b"no"), Progress::Status(503));
        let mut r = HttpReader::new();
        assert_eq!(r.feed(b"SSH-2.0-OpenSSH\r\n\r\n"), Progress::Bad(BadReason::Malformed));
        let mut r = HttpReader::new();
        assert_eq!(
            r.feed(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"),
            Progress::Bad(BadReason::Malformed)
        );
        let mut r = HttpReader::new();
        assert_eq!(
            r.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Progress::Bad(BadReason::Framing)
        );
    }

    #[test]
    fn oversized_head_is_bad() {
        let mut r = HttpReader::new();
        assert_eq!(r.feed(b"HTTP/1.1 200 OK\r\n"), Progress::More);
        let filler = vec![b'a'; RESPONSE_HEAD_MAX_BYTES];
        assert_eq!(r.feed(&filler), Progress::Bad(BadReason::HeadTooLarge));
    }

    #[test]
    fn eof_mid_reply_is_not_completion() {
        let mut r = HttpReader::new();
        assert_eq!(r.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab"), Progress::More);
        assert_eq!(r.eof(), None);
    }

    #[test]
    fn echo_checks_length_and_content() {
        let payload = b"0123456789";
        let mut e = EchoReader::new();
        assert_eq!(e.feed(payload, b"0123"), Progress::More);
        assert_eq!(e.feed(payload, b"456789"), Progress::Done { close: false });
        e.reset();
        assert_eq!(e.feed(payload, b"01x"), Progress::Bad(BadReason::EchoMismatch));
        e.reset();
        assert_eq!(e.feed(payload, b"0123456789a"), Progress::Bad(BadReason::TrailingBytes));
    }
}
