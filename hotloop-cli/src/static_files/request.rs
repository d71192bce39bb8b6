//! The request head `serve static` reads, what it keeps of it
//! ([`Asked`]), and the response heads it writes.

use std::cell::RefCell;
use std::io::Write;
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use hotloop_proto::{Body, Framing, REQUEST_HEADERS_LIMIT_MAX, REQUEST_HEADERS_MAX};

use super::target;

/// What the handler needs of a request head; the slices point into the
/// buffer the head was parsed from.
#[derive(Debug)]
pub struct Head<'a> {
    /// Bytes of the head, including the blank line.
    pub len: usize,
    pub method: &'a str,
    pub target: &'a str,
    /// `Connection: close`, or HTTP/1.0 without keep-alive.
    pub close: bool,
    /// How the body is framed, or the status refusing the request for it
    /// (`hotloop_proto::Framing::body`).
    pub body: Result<Body, u16>,
    pub range: Option<&'a [u8]>,
    pub if_range: Option<&'a [u8]>,
    pub if_modified_since: Option<&'a [u8]>,
    pub if_none_match: Option<&'a [u8]>,
}

/// What parsing the buffered bytes found.
#[derive(Debug)]
pub enum Parsed<'a> {
    Complete(Head<'a>),
    /// More bytes are needed.
    Partial,
    /// Answer with this status and close (400, also for a `Host` missing
    /// from an HTTP/1.1 request or repeated; 431 for a head over
    /// `hotloop_proto::head_within_limits` or with too many headers; 505).
    Error(u16),
}

/// Parses the request head at the start of `buf`, with at most
/// `max_headers` headers.
pub fn parse(buf: &[u8], max_headers: usize) -> Parsed<'_> {
    let max = max_headers.clamp(1, REQUEST_HEADERS_LIMIT_MAX);
    // The default limit's slots on the stack; a larger limit on the heap.
    if max <= REQUEST_HEADERS_MAX {
        let mut slots =
            [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; REQUEST_HEADERS_MAX];
        parse_into(buf, &mut slots[..max])
    } else {
        let mut slots: Vec<_> = (0..max).map(|_| MaybeUninit::uninit()).collect();
        parse_into(buf, &mut slots)
    }
}

fn parse_into<'a>(buf: &'a [u8], slots: &mut [MaybeUninit<httparse::Header<'a>>]) -> Parsed<'a> {
    let mut req = httparse::Request::new(&mut []);
    match req.parse_with_uninit_headers(buf, slots) {
        Ok(httparse::Status::Complete(len)) if !hotloop_proto::head_within_limits(&buf[..len]) => {
            Parsed::Error(431)
        }
        Ok(httparse::Status::Complete(len)) => {
            let (Some(method), Some(target)) = (req.method, req.path) else {
                return Parsed::Error(400);
            };
            let mut head = Head {
                len,
                method,
                target,
                close: req.version == Some(0),
                body: Ok(Body::None),
                range: None,
                if_range: None,
                if_modified_since: None,
                if_none_match: None,
            };
            let mut hosts = 0u32;
            let mut framing = Framing::default();
            for h in req.headers.iter() {
                let name = h.name;
                if name.eq_ignore_ascii_case("host") {
                    hosts += 1;
                } else if name.eq_ignore_ascii_case("connection") {
                    if let Some(close) = hotloop_proto::connection_close(h.value) {
                        head.close = close;
                    }
                } else if name.eq_ignore_ascii_case("range") {
                    head.range = Some(h.value);
                } else if name.eq_ignore_ascii_case("if-modified-since") {
                    head.if_modified_since = Some(h.value);
                } else if name.eq_ignore_ascii_case("if-none-match") {
                    head.if_none_match = Some(h.value);
                } else if name.eq_ignore_ascii_case("if-range") {
                    head.if_range = Some(h.value);
                } else if name.eq_ignore_ascii_case("content-length") {
                    framing.content_length(h.value);
                } else if name.eq_ignore_ascii_case("transfer-encoding") {
                    framing.transfer_encoding(h.value);
                }
            }
            head.body = framing.body(req.version);
            // None in HTTP/1.1, or more than one: 400 (RFC 9112 section 3.2).
            if !hotloop_proto::host_ok(hosts, req.version) {
                return Parsed::Error(400);
            }
            Parsed::Complete(head)
        }
        Ok(httparse::Status::Partial) if !hotloop_proto::head_within_limits(buf) => {
            Parsed::Error(431)
        }
        Ok(httparse::Status::Partial) => Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => Parsed::Error(431),
        Err(httparse::Error::Version) => Parsed::Error(505),
        Err(_) => Parsed::Error(400),
    }
}

/// What answering a request takes of its head, copied out of the buffer
/// the head was read into, so that buffer goes back to the pool before
/// the answer: a connection sending a large file to a slow client holds
/// no read buffer (it held its 16 KiB one for the whole send). The usual
/// request copies nothing but its path (which the lookup needed anyway):
/// the conditional and range fields are rare.
pub struct Asked {
    /// `GET`; otherwise `HEAD`.
    pub get: bool,
    pub close: bool,
    /// The path beneath the root, or the status refusing the target.
    pub rel: Result<PathBuf, u16>,
    /// Whether the target's path ends in `/`.
    pub slash: bool,
    /// What follows the target's path (its query), kept by a directory's
    /// redirect.
    pub query: Box<str>,
    pub range: Option<Box<[u8]>>,
    pub if_range: Option<Box<[u8]>>,
    pub if_modified_since: Option<Box<[u8]>>,
    pub if_none_match: Option<Box<[u8]>>,
}

impl Asked {
    /// The request in `head` and how its body is framed, or the reply
    /// that refuses it and closes: 405 with `Allow` for a method other
    /// than `GET` and `HEAD` (whose body, if any, the lingering close
    /// reads and drops, so the close sends no reset over the reply), 400,
    /// 413 or 501 for a body framed as `hotloop_proto::Framing` refuses.
    pub fn take(head: &Head<'_>) -> Result<(Asked, Body), Vec<u8>> {
        let get = match head.method {
            "GET" => true,
            "HEAD" => false,
            _ => return Err(simple(405, "Allow: GET, HEAD\r\n", true, true)),
        };
        let body = head.body.map_err(|status| simple(status, "", true, get))?;
        let path = head.target.split(['?', '#']).next().unwrap_or("");
        let rel = target::relative_path(head.target).map_err(|refused| match refused {
            target::Refused::Traversal => 403,
            target::Refused::Malformed => 400,
        });
        let copy = |field: Option<&[u8]>| field.map(Box::<[u8]>::from);
        let asked = Asked {
            get,
            close: head.close,
            rel,
            slash: path.ends_with('/'),
            query: head.target[path.len()..].into(),
            range: copy(head.range),
            if_range: copy(head.if_range),
            if_modified_since: copy(head.if_modified_since),
            if_none_match: copy(head.if_none_match),
        };
        Ok((asked, body))
    }
}

/// The reason phrase of the statuses this server sends.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        301 => "Moved Permanently",
        304 => "Not Modified",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        416 => "Range Not Satisfiable",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// The current time as an HTTP date, formatted once per second per thread.
fn http_date_now() -> String {
    thread_local! {
        static CACHED: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != secs {
            *c = (secs, crate::http_date::format(now));
        }
        c.1.clone()
    })
}

/// The `Last-Modified` of a file modified at `modified`, and whether it
/// is that time. A time ahead of the clock is replaced by the answer's
/// `Date` (RFC 9110 section 8.8.2.1: never later than `Date`), which also
/// keeps it within the years an HTTP date can say (a file dated in the
/// year 10000 made the formatting panic); it then says nothing of the
/// file's version.
pub fn last_modified(modified: SystemTime) -> (String, bool) {
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    if secs(modified) > secs(SystemTime::now()) {
        (http_date_now(), false)
    } else {
        (crate::http_date::format(modified), true)
    }
}

/// Writes a response head: the status line, `Server`, `Date`, the
/// `extra` header lines (each ending in CRLF), `Content-Length` and
/// `Connection`. `capacity` is reserved beyond the head (for a body that
/// follows in the same write).
pub fn head(
    status: u16,
    extra: &str,
    content_length: u64,
    close: bool,
    capacity: usize,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + extra.len() + capacity);
    let connection = if close { "close" } else { "keep-alive" };
    let _ = write!(
        out,
        "HTTP/1.1 {status} {}\r\nServer: hotloop\r\nDate: {}\r\n{extra}Content-Length: {content_length}\r\nConnection: {connection}\r\n\r\n",
        reason(status),
        http_date_now(),
    );
    out
}

/// A whole short response with a plain-text body naming the status.
pub fn simple(status: u16, extra: &str, close: bool, with_body: bool) -> Vec<u8> {
    let body = format!("{} {}\n", status, reason(status));
    let mut out = head(
        status,
        &format!("Content-Type: text/plain; charset=utf-8\r\n{extra}"),
        body.len() as u64,
        close,
        body.len(),
    );
    if with_body {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_handler_needs() {
        let req = b"GET /a%20b?q HTTP/1.1\r\nHost: x\r\nRange: bytes=0-0\r\nIf-Modified-Since: Wed, 21 Oct 2015 07:28:00 GMT\r\n\r\nGET";
        let Parsed::Complete(h) = parse(req, 100) else { panic!("not complete") };
        assert_eq!(
            (h.method, h.target, h.close, h.body),
            ("GET", "/a%20b?q", false, Ok(Body::None))
        );
        assert_eq!(h.range, Some(&b"bytes=0-0"[..]));
        assert!(h.if_modified_since.is_some());
        assert_eq!(h.len, req.len() - 3);
        let Parsed::Complete(h) = parse(b"HEAD / HTTP/1.0\r\n\r\n", 100) else { panic!() };
        assert!(h.close, "HTTP/1.0 closes by default");
        let Parsed::Complete(h) =
            parse(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n", 100)
        else {
            panic!()
        };
        assert_eq!(h.body, Ok(Body::Length(3)));
        assert!(matches!(parse(b"GET / HTTP/1.1\r\nHost:", 100), Parsed::Partial));
        assert!(matches!(parse(b"\x00garbage\r\n\r\n", 100), Parsed::Error(400)));
        assert!(matches!(parse(b"GET / HTTP/1.1\r\na: 1\r\nb: 2\r\n\r\n", 1), Parsed::Error(431)));
    }

    /// An HTTP/1.1 request needs exactly one `Host`; HTTP/1.0 may leave it out.
    #[test]
    fn host_is_required_once() {
        for head in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",
            b"HEAD / HTTP/1.0\r\nhost: a\r\nHOST: b\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\n",
        ] {
            assert!(matches!(parse(head, 100), Parsed::Error(400)), "{head:?}");
        }
        assert!(matches!(parse(b"GET / HTTP/1.0\r\n\r\n", 100), Parsed::Complete(_)));
        assert!(matches!(parse(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n", 100), Parsed::Complete(_)));
    }
}
