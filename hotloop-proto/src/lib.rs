//! The HTTP wire format that the `hotloop` command, the bench's peer
//! servers and its load generator share, so that every server parses and
//! answers requests identically and the load generator reads their replies
//! the same way.
//!
//! It does no I/O: the request head parser ([`parse_request`]) and its
//! limits ([`head_within_limits`]), a request body's framing and its end
//! found for a server that drops it ([`Framing`], [`BodySkip`]), the canned
//! responses, the response reader ([`response`]) and, with the `hyper`
//! feature, the hyper service every hyper server runs ([`hyper_app`]).

#![warn(missing_docs)]

mod body;
#[cfg(feature = "hyper")]
pub mod hyper_app;
pub mod response;

pub use body::{Body, BodySkip, Framing, REQUEST_BODY_MAX_BYTES};

/// The most bytes a request head (request line and headers) may take in
/// all: nginx's default `large_client_header_buffers 4 8k` lets a head
/// take up to four 8 KiB buffers. A browser with a few KiB of cookies
/// sends more than 8 KiB.
pub const REQUEST_HEAD_MAX_BYTES: usize = 32 * 1024;

/// The most bytes one line of a request head may take, its line end
/// included: the request line or one header line (one of nginx's 8 KiB
/// header buffers; nginx answers a longer one 414 or 400, these servers
/// 431).
pub const REQUEST_LINE_MAX_BYTES: usize = 8 * 1024;

/// The most headers a request may carry by default (browsers send 10 to
/// 40; nginx has no count limit, only its header buffers).
pub const REQUEST_HEADERS_MAX: usize = 100;

/// The largest header-count limit [`parse_request_with`] accepts: each
/// header slot takes 32 bytes of the parsing thread's stack, 64 KiB for
/// this many.
pub const REQUEST_HEADERS_LIMIT_MAX: usize = 2048;

/// Whether `head`, the bytes of a request head (all of it, up to its
/// blank line, or what has come of it), keeps within
/// [`REQUEST_HEAD_MAX_BYTES`] in all and [`REQUEST_LINE_MAX_BYTES`] a
/// line, a line still coming counted as it stands (refused as soon as it
/// is too long, not at the head's end). A head no longer than one line's
/// limit costs one comparison; a longer one a look for its line ends.
pub fn head_within_limits(head: &[u8]) -> bool {
    if head.len() <= REQUEST_LINE_MAX_BYTES {
        return true;
    }
    // Each line with its LF: at most the limit.
    head.len() <= REQUEST_HEAD_MAX_BYTES
        && head.split(|&b| b == b'\n').all(|line| line.len() < REQUEST_LINE_MAX_BYTES)
}

/// The request method, for servers that answer `HEAD` as well as `GET`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET`.
    Get,
    /// `HEAD`: answered as `GET` without the body (RFC 9110 section 9.3.2).
    Head,
}

/// What [`parse_request_with`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseOptions {
    /// The most headers a request may carry (at most
    /// [`REQUEST_HEADERS_LIMIT_MAX`]; more is treated as that).
    pub max_headers: usize,
    /// Accept `HEAD` as well as `GET`.
    pub allow_head: bool,
    /// Accept a `GET` or `HEAD` with a body (nginx serves it, dropping
    /// the body): [`Request::Complete`] says how it is framed, and the
    /// server skips it ([`BodySkip`]) before the next request. Otherwise
    /// such a request is `501`.
    pub bodies: bool,
}

impl Default for ParseOptions {
    fn default() -> Self {
        ParseOptions { max_headers: REQUEST_HEADERS_MAX, allow_head: false, bodies: false }
    }
}

/// What parsing a buffered HTTP/1.1 request head found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// A whole request head of `len` bytes; `close` is true when the client
    /// asked for `Connection: close` or spoke HTTP/1.0 without keep-alive.
    Complete {
        /// Bytes of the head, including the blank line.
        len: usize,
        /// Whether the connection closes after the response.
        close: bool,
        /// The body after the head ([`Body::None`] unless
        /// [`ParseOptions::bodies`]).
        body: Body,
    },
    /// More bytes are needed.
    Partial,
    /// The bytes are not an HTTP/1.x request, or its `Host` fields are
    /// not as [`host_ok`] asks (none in HTTP/1.1, or more than one);
    /// answer 400 and close.
    Malformed,
    /// The head is larger than [`REQUEST_HEAD_MAX_BYTES`], has a line
    /// longer than [`REQUEST_LINE_MAX_BYTES`] or too many headers; answer
    /// 431 and close.
    TooLarge,
    /// A request these servers do not handle; answer with this status and
    /// close: 405 for a method other than GET (and HEAD), 501 for a
    /// request with a body (without [`ParseOptions::bodies`]) or with a
    /// transfer coding other than chunked, 400 or 413 for a body framed
    /// as [`Framing::body`] refuses, 505 for an HTTP version other than
    /// 1.0 or 1.1.
    Unsupported(u16),
}

/// Parses the request head at the start of `buf`: `GET` only, at most
/// [`REQUEST_HEADERS_MAX`] headers.
///
/// Request bodies are not supported (501): the bench's requests are `GET`s.
pub fn parse_request(buf: &[u8]) -> Request {
    parse_request_with(buf, ParseOptions::default()).0
}

/// Parses the request head at the start of `buf` with `options`; the
/// method is meaningful when the request is [`Request::Complete`].
pub fn parse_request_with(buf: &[u8], options: ParseOptions) -> (Request, Method) {
    let max = options.max_headers.clamp(1, REQUEST_HEADERS_LIMIT_MAX);
    // The default limit's slots (3.2 KB) on the stack; the largest (64 KB) only when asked for.
    if max <= REQUEST_HEADERS_MAX {
        parse_with_slots::<REQUEST_HEADERS_MAX>(buf, max, options)
    } else {
        parse_with_slots::<REQUEST_HEADERS_LIMIT_MAX>(buf, max, options)
    }
}

fn parse_with_slots<const N: usize>(
    buf: &[u8],
    max: usize,
    options: ParseOptions,
) -> (Request, Method) {
    // Uninitialised header slots: a large limit costs nothing per parse.
    let mut headers = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; N];
    let mut req = httparse::Request::new(&mut []);
    let parsed = req.parse_with_uninit_headers(buf, &mut headers[..max]);
    let mut method = Method::Get;
    let request = match parsed {
        Ok(httparse::Status::Complete(len)) if !head_within_limits(&buf[..len]) => {
            Request::TooLarge
        }
        Ok(httparse::Status::Complete(len)) => {
            let mut close = req.version == Some(0);
            let mut hosts = 0u32;
            let mut framing = Framing::default();
            // One walk: each name is compared until one matches (a
            // comparison of names of other lengths is one length check).
            for h in req.headers.iter() {
                if h.name.eq_ignore_ascii_case("host") {
                    hosts += 1;
                } else if h.name.eq_ignore_ascii_case("connection") {
                    if let Some(c) = connection_close(h.value) {
                        close = c;
                    }
                } else if h.name.eq_ignore_ascii_case("content-length") {
                    framing.content_length(h.value);
                } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                    framing.transfer_encoding(h.value);
                }
            }
            if !host_ok(hosts, req.version) {
                return (Request::Malformed, method);
            }
            match req.method {
                Some("GET") => {}
                Some("HEAD") if options.allow_head => method = Method::Head,
                _ => return (Request::Unsupported(405), method),
            }
            match framing.body(req.version) {
                Ok(Body::None) => Request::Complete { len, close, body: Body::None },
                Ok(body) if options.bodies => Request::Complete { len, close, body },
                Ok(_) => Request::Unsupported(501),
                Err(status) => Request::Unsupported(status),
            }
        }
        Ok(httparse::Status::Partial) if !head_within_limits(buf) => Request::TooLarge,
        Ok(httparse::Status::Partial) => Request::Partial,
        Err(httparse::Error::TooManyHeaders) => Request::TooLarge,
        Err(httparse::Error::Version) => Request::Unsupported(505),
        Err(_) => Request::Malformed,
    };
    (request, method)
}

/// Whether a request's `Host` fields are as RFC 9112 section 3.2 asks,
/// given `hosts` of them and the minor version: exactly one in HTTP/1.1,
/// at most one in HTTP/1.0 (which may leave it out). A server answers
/// any other request 400 (nginx does too).
pub fn host_ok(hosts: u32, minor_version: Option<u8>) -> bool {
    hosts == 1 || (hosts == 0 && minor_version == Some(0))
}

/// The path of a request head, for the stats endpoint: the second word of
/// the request line, or `/` when there is none.
pub fn request_path(head: &[u8]) -> &str {
    let line_end = head.iter().position(|&b| b == b'\r' || b == b'\n').unwrap_or(head.len());
    let line = std::str::from_utf8(&head[..line_end]).unwrap_or("");
    line.split_whitespace().nth(1).unwrap_or("/")
}

/// Builds a `200 OK` response with a body of `body_len` bytes of `'x'`.
pub fn response_ok(body_len: usize, close: bool) -> Vec<u8> {
    let connection = if close { "close" } else { "keep-alive" };
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nServer: hotloop\r\nContent-Type: text/plain\r\nContent-Length: {body_len}\r\nConnection: {connection}\r\n\r\n"
    )
    .into_bytes();
    out.resize(out.len() + body_len, b'x');
    out
}

/// The head of [`response_ok`] alone: the answer to a `HEAD` request, with
/// the `Content-Length` the `GET` body would have.
pub fn response_ok_head(body_len: usize, close: bool) -> Vec<u8> {
    let mut out = response_ok(body_len, close);
    out.truncate(out.len() - body_len);
    out
}

/// A complete error response that closes the connection; a 405's `Allow`
/// names `GET` alone (see [`response_error_with`]).
pub fn response_error(status: u16) -> &'static [u8] {
    response_error_with(status, false)
}

/// [`response_error`] for a server that answers `HEAD` too when
/// `allow_head`: its 405 says `Allow: GET, HEAD`, every method it serves
/// (RFC 9110 section 15.5.6).
pub fn response_error_with(status: u16, allow_head: bool) -> &'static [u8] {
    match status {
        405 if allow_head => {
            b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        }
        431 => {
            b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        }
        408 => b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        413 => b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        405 => b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        501 => b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        505 => b"HTTP/1.1 505 HTTP Version Not Supported\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        _ => b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    }
}

/// What a `Connection` field's value says of the connection: `Some(true)`
/// if its tokens include `close`, `Some(false)` if they include
/// `keep-alive` (and not `close`), `None` if neither (RFC 9110 section
/// 7.6.1: a comma-separated list, any case, such as `TE, close`).
pub fn connection_close(value: &[u8]) -> Option<bool> {
    // The usual values are one token; a list is looked through.
    if value.eq_ignore_ascii_case(b"keep-alive") {
        return Some(false);
    }
    if value.eq_ignore_ascii_case(b"close") {
        return Some(true);
    }
    let mut keep_alive = false;
    for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
        if token.eq_ignore_ascii_case(b"close") {
            return Some(true);
        }
        keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
    }
    keep_alive.then_some(false)
}

/// Burns about `micros` microseconds of CPU, standing in for an
/// application's own work per request (`--work-us`).
pub fn spin_work(micros: u64) {
    if micros == 0 {
        return;
    }
    let until = std::time::Instant::now() + std::time::Duration::from_micros(micros);
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_is_a_list_of_tokens() {
        assert_eq!(connection_close(b"close"), Some(true));
        assert_eq!(connection_close(b"Keep-Alive"), Some(false));
        assert_eq!(connection_close(b"TE, close"), Some(true));
        assert_eq!(connection_close(b"keep-alive, TE"), Some(false));
        assert_eq!(connection_close(b"Upgrade"), None);
        assert_eq!(connection_close(b"closed, keep-alived"), None);
    }

    #[test]
    fn parses_keepalive_and_close() {
        assert_eq!(
            parse_request(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
            Request::Complete { len: 27, close: false, body: Body::None }
        );
        assert!(matches!(
            parse_request(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
            Request::Complete { close: true, .. }
        ));
        assert!(matches!(
            parse_request(b"GET / HTTP/1.0\r\n\r\n"),
            Request::Complete { close: true, .. }
        ));
        assert_eq!(parse_request(b"GET / HTTP/1.1\r\nHo"), Request::Partial);
        assert_eq!(parse_request(b"\x00\x01garbage\r\n\r\n"), Request::Malformed);
        assert_eq!(parse_request(b"POST / HTTP/1.1\r\nHost: a\r\n\r\n"), Request::Unsupported(405));
        assert_eq!(
            parse_request(b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n"),
            Request::Unsupported(501)
        );
        assert_eq!(parse_request(b"GET / HTTP/2.0\r\n\r\n"), Request::Unsupported(505));
        assert!(matches!(
            parse_request(b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"),
            Request::Complete { .. }
        ));
        let big = vec![b'a'; REQUEST_HEAD_MAX_BYTES + 1];
        assert_eq!(parse_request(b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n"), Request::Unsupported(405));
        assert_eq!(parse_request(&[b"GET /".as_slice(), &big].concat()), Request::TooLarge);
    }

    #[test]
    fn head_and_header_count_limits() {
        let opts = ParseOptions { max_headers: 100, allow_head: true, bodies: false };
        assert_eq!(
            parse_request_with(b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n", opts),
            (Request::Complete { len: 28, close: false, body: Body::None }, Method::Head)
        );
        // `n` headers, `Host` among them.
        let head = |n: usize| {
            let mut h = String::from("GET / HTTP/1.1\r\nHost: a\r\n");
            for i in 1..n {
                h.push_str(&format!("X-H{i}: v\r\n"));
            }
            h + "\r\n"
        };
        // 33 headers, as browsers send, pass the default; 101 do not.
        assert!(matches!(parse_request(head(33).as_bytes()), Request::Complete { .. }));
        assert!(matches!(parse_request(head(100).as_bytes()), Request::Complete { .. }));
        assert_eq!(parse_request(head(101).as_bytes()), Request::TooLarge);
        let wide = ParseOptions { max_headers: 200, allow_head: false, bodies: false };
        assert!(matches!(
            parse_request_with(head(150).as_bytes(), wide).0,
            Request::Complete { .. }
        ));
        assert_eq!(parse_request_with(head(201).as_bytes(), wide).0, Request::TooLarge);
        let tight = ParseOptions { max_headers: 10, allow_head: false, bodies: false };
        assert_eq!(parse_request_with(head(11).as_bytes(), tight).0, Request::TooLarge);
        let r = response_ok_head(64, true);
        assert!(String::from_utf8(r)
            .unwrap()
            .ends_with("Content-Length: 64\r\nConnection: close\r\n\r\n"));
    }

    /// RFC 9112 section 3.2: an HTTP/1.1 request has exactly one `Host`;
    /// HTTP/1.0 may leave it out, but not repeat it.
    #[test]
    fn host_is_required_once() {
        let opts = ParseOptions { max_headers: 100, allow_head: true, bodies: false };
        let parse = |head: &[u8]| parse_request_with(head, opts).0;
        assert_eq!(parse(b"GET / HTTP/1.1\r\n\r\n"), Request::Malformed);
        assert_eq!(parse(b"GET / HTTP/1.1\r\nX: y\r\n\r\n"), Request::Malformed);
        assert_eq!(parse(b"GET / HTTP/1.1\r\nHost: a\r\nhOST: b\r\n\r\n"), Request::Malformed);
        assert_eq!(parse(b"GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n"), Request::Malformed);
        assert_eq!(parse(b"HEAD / HTTP/1.1\r\n\r\n"), Request::Malformed);
        // Before the method or a body is looked at, as nginx answers.
        assert_eq!(parse(b"POST / HTTP/1.1\r\n\r\n"), Request::Malformed);
        assert!(matches!(parse(b"GET / HTTP/1.1\r\nHOST: a\r\n\r\n"), Request::Complete { .. }));
        assert!(matches!(parse(b"GET / HTTP/1.1\r\nHost:\r\n\r\n"), Request::Complete { .. }));
        assert!(matches!(parse(b"GET / HTTP/1.0\r\n\r\n"), Request::Complete { .. }));
        assert!(matches!(parse(b"GET / HTTP/1.0\r\nHost: a\r\n\r\n"), Request::Complete { .. }));
    }

    /// A head may take 32 KiB in all and 8 KiB a line (nginx's default
    /// header buffers): a browser's 7 KiB cookie with 3 KiB of other
    /// fields passes; one 9 KiB line does not, whole or still coming, nor
    /// does a 40 KiB head of short lines. (Before, the whole head was
    /// limited to 8 KiB.)
    #[test]
    fn a_head_takes_32_kib_and_a_line_8_kib() {
        let head = |lines: &[String]| {
            let mut h = String::from("GET / HTTP/1.1\r\nHost: a\r\n");
            for line in lines {
                h.push_str(line);
                h.push_str("\r\n");
            }
            h + "\r\n"
        };
        let field = |name: &str, len: usize| format!("{name}: {}", "v".repeat(len));
        let browser = head(&[field("Cookie", 7 * 1024), field("X-A", 1024), field("X-B", 2048)]);
        assert!(matches!(parse_request(browser.as_bytes()), Request::Complete { .. }));
        let long_line = head(&[field("Cookie", 9 * 1024)]);
        assert_eq!(parse_request(long_line.as_bytes()), Request::TooLarge);
        assert_eq!(parse_request(&long_line.as_bytes()[..8300]), Request::TooLarge);
        // A line of exactly the limit, its CRLF included, passes.
        let exact = head(&[field("X", REQUEST_LINE_MAX_BYTES - 5)]);
        assert!(matches!(parse_request(exact.as_bytes()), Request::Complete { .. }));
        let exact_over = head(&[field("X", REQUEST_LINE_MAX_BYTES - 4)]);
        assert_eq!(parse_request(exact_over.as_bytes()), Request::TooLarge);
        // A long line that ended, in a head not yet whole.
        let long_first = format!("GET /{} HTTP/1.1\r\nHost: a\r\n", "a".repeat(9000));
        assert_eq!(parse_request(long_first.as_bytes()), Request::TooLarge);
        let lines: Vec<String> = (0..10).map(|i| field(&format!("X-{i}"), 4000)).collect();
        let big = head(&lines);
        assert!(big.len() > 40 * 1000);
        assert_eq!(parse_request(big.as_bytes()), Request::TooLarge);
        assert_eq!(parse_request(&big.as_bytes()[..33 * 1024]), Request::TooLarge);
        assert_eq!(parse_request(&big.as_bytes()[..31 * 1024]), Request::Partial);
    }

    /// With `bodies`, a GET or HEAD with a body is a request whose body
    /// the server skips; its framing is checked all the same.
    #[test]
    fn bodies_of_get_and_head_are_framed() {
        let opts = ParseOptions { bodies: true, allow_head: true, ..Default::default() };
        let parse = |head: &str| parse_request_with(head.as_bytes(), opts).0;
        let body = |head: &str| match parse(head) {
            Request::Complete { body, .. } => Ok(body),
            Request::Unsupported(status) => Err(status),
            other => panic!("{head:?}: {other:?}"),
        };
        assert_eq!(
            body("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n"),
            Ok(Body::Length(5))
        );
        assert_eq!(
            body("HEAD / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Ok(Body::Chunked)
        );
        assert_eq!(
            body("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err(400)
        );
        assert_eq!(
            body("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"),
            Err(400)
        );
        assert_eq!(body("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 2000000\r\n\r\n"), Err(413));
        assert_eq!(body("GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n"), Err(501));
        assert_eq!(
            body("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2000000\r\n\r\n"),
            Err(405),
            "the method first"
        );
        // Without `bodies`, as the bench's servers parse: 501.
        assert_eq!(
            parse_request(b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Request::Unsupported(501)
        );
    }

    #[test]
    fn a_405_allows_what_the_server_serves() {
        let allow = |reply: &[u8]| {
            let text = String::from_utf8(reply.to_vec()).unwrap();
            text.lines().find_map(|l| l.strip_prefix("Allow: ")).unwrap().to_string()
        };
        assert_eq!(allow(response_error(405)), "GET");
        assert_eq!(allow(response_error_with(405, false)), "GET");
        assert_eq!(allow(response_error_with(405, true)), "GET, HEAD");
        assert_eq!(response_error_with(400, true), response_error(400));
    }

    #[test]
    fn request_path_reads_the_request_line() {
        assert_eq!(request_path(b"GET /stats HTTP/1.1\r\nHost: x\r\n\r\n"), "/stats");
        assert_eq!(request_path(b"GET"), "/");
        assert_eq!(request_path(b"\xff\xfe /x"), "/");
    }

    #[test]
    fn response_has_exact_length() {
        let r = response_ok(1024, false);
        let text = String::from_utf8(r.clone()).unwrap();
        assert!(text.contains("Content-Length: 1024\r\n"));
        assert!(text.ends_with(&"x".repeat(1024)));
    }
}
