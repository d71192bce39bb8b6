//! A minimal HTTP/1.1 responder: every request gets a fixed body.
//! Keep-alive by default; `Connection: close` (or HTTP/1.0) closes after
//! the response.
//!
//! ```text
//! cargo run --release --example http -- 127.0.0.1:8080 1024
//! curl -v http://127.0.0.1:8080/
//! ```

use std::sync::Arc;

use hotloop::net::{serve, ListenerOptions, TcpStream};
use hotloop::Runtime;

/// The most bytes a request head may take before the server gives up.
const REQUEST_HEAD_MAX_BYTES: usize = 8 * 1024;

/// Finds the end of a request head; returns its length and whether the
/// client asked to close.
fn parse_head(buf: &[u8]) -> Option<(usize, bool)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&buf[..end]).unwrap_or("").to_ascii_lowercase();
    let close = head.contains("\r\nconnection: close") || head.starts_with("get / http/1.0");
    Some((end, close))
}

fn response(body_size: usize, close: bool) -> Arc<[u8]> {
    let connection = if close { "close" } else { "keep-alive" };
    let mut r = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {body_size}\r\nContent-Type: text/plain\r\nConnection: {connection}\r\n\r\n"
    )
    .into_bytes();
    r.resize(r.len() + body_size, b'x');
    r.into()
}

async fn serve_http(stream: TcpStream, keep_alive: Arc<[u8]>, close: Arc<[u8]>) {
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = Vec::with_capacity(4096);
    loop {
        // Answer every complete request already buffered (pipelining).
        while let Some((len, wants_close)) = parse_head(&pending) {
            pending.drain(..len);
            let reply = if wants_close { close.clone() } else { keep_alive.clone() };
            let (res, _) = stream.write_all_owned(reply).await;
            if res.is_err() || wants_close {
                return;
            }
        }
        if pending.len() > REQUEST_HEAD_MAX_BYTES {
            let _ = stream
                .write_all_owned(&b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n\r\n"[..])
                .await;
            return;
        }
        let (read, b) = stream.read_owned(buf).await;
        buf = b;
        match read {
            Ok(0) | Err(_) => return,
            Ok(_) => pending.extend_from_slice(&buf),
        }
    }
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:8080".into());
    let body_size: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(64);
    let rt = Runtime::builder().build()?;
    let (keep_alive, close) = (response(body_size, false), response(body_size, true));
    let server = serve(rt.handle(), addr.as_str(), ListenerOptions::default(), move |stream| {
        serve_http(stream, keep_alive.clone(), close.clone())
    })?;
    println!(
        "http server on {} with {} workers, {body_size}-byte body",
        server.local_addr(),
        rt.handle().workers()
    );
    rt.block_on(server.stopped())
}
