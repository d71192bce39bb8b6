//! HTTP details an ordinary client meets: a 431 it can read, `HEAD`,
//! browser-sized header counts and heads, the `Host` a request must
//! carry, a 405 that names every method served, and a `GET` with a body.
//! Both drivers.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{read_response, Pipelined, Proc};
use hotloop::DriverKind;

fn serve(driver: &str, extra: &[&str]) -> (Proc, std::net::SocketAddr) {
    serve_app(driver, "http", extra)
}

/// `hotloop serve APP` with one worker on `driver`.
fn serve_app(driver: &str, app: &str, extra: &[&str]) -> (Proc, std::net::SocketAddr) {
    let mut args =
        vec!["serve", app, "--addr", "127.0.0.1:0", "--workers", "1", "--driver", driver];
    args.extend_from_slice(extra);
    let mut p = Proc::start(&args);
    let addr = p.addr_after(" on ");
    (p, addr)
}

/// A request with exactly `headers` headers.
fn head_with(headers: usize) -> String {
    let mut h = String::from("GET / HTTP/1.1\r\nHost: t\r\n");
    for i in 2..headers {
        h.push_str(&format!("X-Header-{i}: value\r\n"));
    }
    h + "Connection: close\r\n\r\n"
}

fn ask(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    reply
}

/// A client that sends far more than the head limit still reads its
/// 431: the server shuts down writing and drains before it closes,
/// instead of closing on unread bytes (which sends a reset).
#[hotloop::test(driver = "all")]
fn a_431_reaches_a_client_that_keeps_sending(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_p, addr) = serve(driver, &[]);
    for _ in 0..5 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        let huge =
            format!("GET / HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n", "a".repeat(128 * 1024));
        let sent = s.write_all(huge.as_bytes());
        std::thread::sleep(Duration::from_millis(50));
        let mut reply = String::new();
        let read = s.read_to_string(&mut reply);
        assert!(
            read.is_ok() && reply.starts_with("HTTP/1.1 431"),
            "{driver}: write {sent:?}, read {read:?}: {reply:?}"
        );
    }
}

/// `HEAD` gets the `GET` head, `Content-Length` included, and no body.
#[hotloop::test(driver = "all")]
fn head_is_answered_as_get_without_a_body(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_p, addr) = serve(driver, &["--body-size", "64"]);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // HEAD then GET on one connection: the GET's reply must follow the HEAD's head directly.
    s.write_all(
        b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    let (head, rest) = all.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK") && head.contains("Content-Length: 64"), "{all}");
    assert!(
        rest.starts_with("HTTP/1.1 200 OK"),
        "{driver}: a body followed the HEAD reply: {all:?}"
    );
    assert!(rest.ends_with(&"x".repeat(64)));
    // Keep-alive after HEAD works too.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    assert!(read_response(&mut s).contains("Connection: keep-alive"));
}

/// 33 headers (a browser with cookies and client hints) pass the
/// default limit of 100; `--max-headers` sets another.
#[hotloop::test(driver = "all")]
fn header_count_limit_is_an_option_with_a_browser_sized_default(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_p, addr) = serve(driver, &[]);
    let reply = ask(addr, head_with(33).as_bytes());
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{driver}: {reply}");
    let reply = ask(addr, head_with(100).as_bytes());
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{driver}: {reply}");
    let reply = ask(addr, head_with(101).as_bytes());
    assert!(reply.starts_with("HTTP/1.1 431"), "{driver}: {reply}");
    let (_p, addr) = serve(driver, &["--max-headers", "10"]);
    let reply = ask(addr, head_with(10).as_bytes());
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{driver}: {reply}");
    let reply = ask(addr, head_with(11).as_bytes());
    assert!(reply.starts_with("HTTP/1.1 431"), "{driver}: {reply}");
}

/// A large answer the server closes after (`Connection: close`, HTTP/1.0)
/// reaches the client whole even when the client had pipelined more
/// requests behind it: the server shuts down writing and reads what is
/// left before it closes, since a close with unread bytes in the socket
/// sends a reset that destroys the answer's unsent tail. 8 MiB: more than
/// the socket buffers take, so the server is still writing when the
/// `Later` request comes.
#[hotloop::test(driver = "all")]
fn a_closing_answer_survives_pipelined_bytes(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_p, addr) = serve(driver, &["--body-size", "8388608"]);
    let closing = [
        "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        "GET / HTTP/1.0\r\nHost: t\r\n\r\n",
    ];
    for request in closing {
        for how in [Pipelined::Buffered, Pipelined::BeyondOneRead, Pipelined::Later] {
            let got = common::answer_with_pipelined_bytes(addr, request, how);
            let (promised, body) = common::body_lengths(&got);
            assert_eq!(
                (promised, body),
                (8 << 20, 8 << 20),
                "{driver}, {how:?}, {request:?}: the answer was cut short"
            );
        }
    }
}

/// A lingering close reads what the client still sends to its end, not
/// a fixed amount: a client that pipelines 1 MiB of requests behind a
/// closing one, while it reads its 8 MiB answer through a 4 KiB receive
/// buffer, gets the answer whole. Before, the server read and dropped
/// 256 KiB and closed on the rest: the kernel answered the unread bytes
/// with a reset that dropped the answer's unsent tail.
#[hotloop::test(driver = "all")]
fn a_lingering_close_reads_the_client_to_its_end(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let (_p, addr) = serve(driver, &["--body-size", "8388608"]);
    let got = common::answer_with_a_megabyte_pipelined_behind(addr);
    assert_eq!(
        common::body_lengths(&got),
        (8 << 20, 8 << 20),
        "{driver}: the answer was cut short"
    );
}

/// `serve http` and `serve static` (its root, kept until the end).
fn both_apps(driver: &str) -> Vec<(&'static str, Proc, std::net::SocketAddr, common::TempDir)> {
    ["http", "static"]
        .into_iter()
        .map(|app| {
            let root = common::TempDir::new("http-edges");
            std::fs::write(root.join("index.html"), "home").unwrap();
            let root_arg = root.join("");
            let extra =
                if app == "static" { vec!["--root", root_arg.to_str().unwrap()] } else { vec![] };
            let (p, addr) = serve_app(driver, app, &extra);
            (app, p, addr, root)
        })
        .collect()
}

/// RFC 9112 section 3.2: an HTTP/1.1 request without `Host`, or any
/// request with two, is answered 400 and the connection closed (nginx
/// answers so); HTTP/1.0 may leave it out. Both were served.
#[hotloop::test(driver = "all")]
fn a_request_needs_exactly_one_host(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    for (app, _p, addr, _root) in both_apps(driver) {
        for bad in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
            b"HEAD / HTTP/1.1\r\nAccept: */*\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX: y\r\nhost: a\r\n\r\n",
            b"GET / HTTP/1.0\r\nHost: a\r\nHOST: a\r\n\r\n",
        ] {
            let reply = ask(addr, bad);
            assert!(
                reply.starts_with("HTTP/1.1 400") && reply.contains("Connection: close\r\n"),
                "{driver} {app}: {:?} got {reply:?}",
                String::from_utf8_lossy(bad)
            );
        }
        for good in [
            &b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nhOsT: a\r\nConnection: close\r\n\r\n",
            b"GET / HTTP/1.0\r\n\r\n",
        ] {
            let reply = ask(addr, good);
            assert!(
                reply.starts_with("HTTP/1.1 200"),
                "{driver} {app}: {:?} got {reply:?}",
                String::from_utf8_lossy(good)
            );
        }
        // On a kept-alive connection too: the first request is answered,
        // the second, without `Host`, gets the 400 and the close.
        let reply = ask(addr, b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\n\r\n");
        let (first, second) = reply.split_once("HTTP/1.1 400").unwrap_or((&reply, ""));
        assert!(first.starts_with("HTTP/1.1 200"), "{driver} {app}: {reply:?}");
        assert!(second.contains("Connection: close\r\n"), "{driver} {app}: {reply:?}");
    }
}

/// A method other than `GET` and `HEAD` gets 405 with `Allow: GET, HEAD`:
/// every method the server serves (RFC 9110 section 15.5.6). `serve
/// http` said `Allow: GET`, though it answers `HEAD` too.
#[hotloop::test(driver = "all")]
fn a_405_allows_every_method_served(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    for (app, _p, addr, _root) in both_apps(driver) {
        for method in ["POST", "PUT", "DELETE"] {
            let request = format!("{method} / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
            let reply = ask(addr, request.as_bytes());
            let allow = reply.lines().find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("allow").then(|| value.trim().to_string())
            });
            assert!(reply.starts_with("HTTP/1.1 405"), "{driver} {app}: {reply:?}");
            assert_eq!(allow.as_deref(), Some("GET, HEAD"), "{driver} {app}: {reply:?}");
        }
    }
}

/// A head may take 32 KiB in all and 8 KiB a line, as nginx's default
/// header buffers (`large_client_header_buffers 4 8k`) allow: a browser's
/// 7 KiB cookie with 3 KiB of other fields is served, gathered across
/// reads when it comes in parts, and so is a 28 KB head of short lines
/// (both were 431: the whole head was limited to 8 KiB); one 9 KiB line,
/// or a 40 KB head, is 431.
#[hotloop::test(driver = "all")]
fn a_head_takes_32_kib_and_a_line_8_kib(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let field = |name: &str, len: usize| format!("{name}: {}\r\n", "v".repeat(len));
    let head =
        |fields: &str| format!("GET / HTTP/1.1\r\nHost: a\r\n{fields}Connection: close\r\n\r\n");
    let lines = |n: usize| (0..n).map(|i| field(&format!("X-{i}"), 4000)).collect::<String>();
    let browser =
        head(&[field("Cookie", 7 * 1024), field("X-A", 1024), field("X-B", 2048)].concat());
    for (app, _p, addr, _root) in both_apps(driver) {
        let reply = ask(addr, browser.as_bytes());
        assert!(reply.starts_with("HTTP/1.1 200"), "{driver} {app}: {reply:.80}");
        // In two parts, a read apart.
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&browser.as_bytes()[..6000]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        s.write_all(&browser.as_bytes()[6000..]).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 200"), "{driver} {app}: {reply:.80}");
        let reply = ask(addr, head(&lines(7)).as_bytes());
        assert!(reply.starts_with("HTTP/1.1 200"), "{driver} {app}: {reply:.80}");
        for too_large in [head(&field("Cookie", 9 * 1024)), head(&lines(10))] {
            let reply = ask(addr, too_large.as_bytes());
            assert!(reply.starts_with("HTTP/1.1 431"), "{driver} {app}: {reply:.80}");
        }
    }
}

/// A `GET` or `HEAD` with a body is served, as nginx serves it: the body
/// (a length, or chunked) is read and dropped before the answer, and a
/// request pipelined behind it is answered too, whether the body came
/// with the head or in parts after it. Before, `serve static` answered
/// 400 and `serve http` 501. A body framed ambiguously (a length and
/// chunked, two lengths that differ), a coding other than chunked, a
/// chunked body that is not one, or a length over 1 MiB is still refused.
#[hotloop::test(driver = "all")]
fn a_get_with_a_body_is_served_and_the_body_dropped(driver: DriverKind) {
    let driver = common::driver_arg(driver);
    let next = "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    for (app, _p, addr, _root) in both_apps(driver) {
        for with_body in [
            "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
            "GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            "HEAD / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
        ] {
            let reply = ask(addr, format!("{with_body}{next}").as_bytes());
            assert_eq!(
                reply.matches("HTTP/1.1 200 OK").count(),
                2,
                "{driver} {app}: {with_body:?} -> {reply:?}"
            );
        }
        // The body in parts after its head, the next request with its last part.
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let parts = [
            "GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            "3\r\nhel",
            "\r\n2\r\nlo\r\n0\r",
            &format!("\n\r\n{next}"),
        ];
        for part in parts {
            s.write_all(part.as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(30));
        }
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        assert_eq!(reply.matches("HTTP/1.1 200 OK").count(), 2, "{driver} {app}: {reply:?}");
        for (refused, status) in [
            ("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nhello", "400"),
            ("Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello", "400"),
            ("Content-Length: 2000000\r\n\r\n", "413"),
            ("Transfer-Encoding: gzip\r\n\r\n", "501"),
            ("Transfer-Encoding: chunked\r\n\r\nzz\r\n", "400"),
        ] {
            let request = format!("GET / HTTP/1.1\r\nHost: a\r\n{refused}{next}");
            let reply = ask(addr, request.as_bytes());
            assert!(
                reply.starts_with(&format!("HTTP/1.1 {status}")) && !reply.contains(" 200 OK"),
                "{driver} {app}: {refused:?} -> {reply:?}"
            );
        }
    }
}
