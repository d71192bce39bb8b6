//! `hotloop serve h3` seen through a raw HTTP/3 client on quinn, which
//! shows what an HTTP/3 library hides: the GOAWAY a stopping server sends
//! names the stream after the last request it took, and that request is
//! answered; a request whose client reads nothing (a small stream window,
//! the connection kept alive by PINGs) is reset at `--send-timeout-ms`,
//! and one whose HEADERS never come at `--header-timeout-ms`; the
//! connection ends with the client. Both drivers.

use crate::common;

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Proc;
use hotloop::{DriverKind, Runtime};
use quinn::{ClientConfig, Connection, RecvStream, SendStream, TransportConfig, VarInt};

const LIMIT: Duration = Duration::from_secs(20);
/// HTTP/3 frame types (RFC 9114 section 7.2).
const FRAME_DATA: u64 = 0x0;
const FRAME_HEADERS: u64 = 0x1;
const FRAME_SETTINGS: u64 = 0x4;
const FRAME_GOAWAY: u64 = 0x7;
/// The unidirectional stream type of the control stream.
const STREAM_CONTROL: u64 = 0x0;
/// Stream reset codes (RFC 9114 section 8.1).
const H3_REQUEST_REJECTED: u32 = 0x10b;
const H3_REQUEST_CANCELLED: u32 = 0x10c;

/// `hotloop serve h3` on `driver` with two workers, a stats endpoint and
/// `extra` flags: the process, its address, its stats address and the
/// client configuration.
fn serve_h3(driver: DriverKind, extra: &[&str]) -> (Proc, SocketAddr, SocketAddr, ClientConfig) {
    let dir = common::TempDir::new("h3");
    let cert = dir.join("cert.pem");
    let mut args = vec!["serve", "h3", "--addr", "127.0.0.1:0", "--workers", "2"];
    args.extend_from_slice(&["--driver", common::driver_arg(driver)]);
    args.extend_from_slice(&["--write-cert", cert.to_str().unwrap()]);
    args.extend_from_slice(&["--stats-addr", "127.0.0.1:0"]);
    args.extend_from_slice(extra);
    let mut p = Proc::start(&args);
    let addr = p.addr_after(" on ");
    let stats = p.addr_after("stats on ");
    assert!(p.wait_for_line("written to", LIMIT), "{:?}", p.seen);
    (p, addr, stats, common::quic_client_config(&cert, b"h3"))
}

/// The client's runtime: one worker on epoll, whatever the server's driver.
fn client_rt() -> Runtime {
    Runtime::builder().workers(1).driver(DriverKind::Epoll).build().unwrap()
}

/// A QUIC variable-length integer (RFC 9000 section 16).
fn varint(v: u64, out: &mut Vec<u8>) {
    match v {
        0..=63 => out.push(v as u8),
        64..=16_383 => out.extend_from_slice(&(v as u16 | 0x4000).to_be_bytes()),
        _ => out.extend_from_slice(&(v as u32 | 0x8000_0000).to_be_bytes()),
    }
}

/// Reads a variable-length integer from the front of `buf`.
fn take_varint(buf: &mut &[u8]) -> Option<u64> {
    let first = *buf.first()?;
    let len = 1 << (first >> 6);
    if buf.len() < len {
        return None;
    }
    let mut v = u64::from(first & 0x3f);
    for b in &buf[1..len] {
        v = v << 8 | u64::from(*b);
    }
    *buf = &buf[len..];
    Some(v)
}

/// One frame: type, length, payload.
fn frame(kind: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    varint(kind, &mut out);
    varint(payload.len() as u64, &mut out);
    out.extend_from_slice(payload);
    out
}

/// The frames of `buf` (whole ones), as (type, payload).
fn frames(mut buf: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    while let (Some(kind), Some(len)) = (take_varint(&mut buf), take_varint(&mut buf)) {
        let len = len as usize;
        if buf.len() < len {
            break;
        }
        out.push((kind, buf[..len].to_vec()));
        buf = &buf[len..];
    }
    out
}

/// A GET of `/`'s HEADERS frame: a QPACK field section of static-table
/// entries only (RFC 9204 appendix A), no dynamic table.
fn get_headers() -> Vec<u8> {
    // Required insert count 0, base 0; :method GET (17), :scheme https
    // (23), :path / (1); :authority (0) with the literal value.
    let mut section = vec![0x00, 0x00, 0xc0 | 17, 0xc0 | 23, 0xc1, 0x50, 9];
    section.extend_from_slice(b"localhost");
    frame(FRAME_HEADERS, &section)
}

/// Connects with `transport` and opens the client's control stream (its
/// SETTINGS, empty); the server's control stream is read by a task that
/// keeps the id of the last GOAWAY in the cell returned.
async fn connect(
    addr: SocketAddr,
    mut config: ClientConfig,
    transport: TransportConfig,
) -> (quinn::Endpoint, Connection, SendStream, Rc<Cell<Option<u64>>>) {
    config.transport_config(Arc::new(transport));
    let client = hotloop::quic::endpoint("127.0.0.1:0".parse().unwrap(), None).unwrap();
    let conn = client.connect_with(config, addr, "localhost").unwrap().await.unwrap();
    let mut control = conn.open_uni().await.unwrap();
    let mut first = Vec::new();
    varint(STREAM_CONTROL, &mut first);
    first.extend_from_slice(&frame(FRAME_SETTINGS, &[]));
    control.write_all(&first).await.unwrap();
    let goaway = Rc::new(Cell::new(None));
    let (seen, uni) = (goaway.clone(), conn.clone());
    drop(hotloop::spawn(async move {
        // The server's unidirectional streams: its control stream, QPACK's
        // two (unused here) and perhaps a grease stream.
        while let Ok(mut recv) = uni.accept_uni().await {
            let seen = seen.clone();
            drop(hotloop::spawn(async move {
                let mut got = Vec::new();
                while let Ok(Some(chunk)) = recv.read_chunk(usize::MAX, true).await {
                    got.extend_from_slice(&chunk.bytes);
                    let mut rest = &got[..];
                    if take_varint(&mut rest) != Some(STREAM_CONTROL) {
                        continue;
                    }
                    for (kind, payload) in frames(rest) {
                        if kind == FRAME_GOAWAY {
                            seen.set(take_varint(&mut &payload[..]));
                        }
                    }
                }
            }));
        }
    }));
    (client, conn, control, goaway)
}

/// Sends a GET on a new request stream.
async fn get(conn: &Connection) -> (SendStream, RecvStream) {
    let (mut send, recv) = conn.open_bi().await.unwrap();
    send.write_all(&get_headers()).await.unwrap();
    send.finish().unwrap();
    (send, recv)
}

/// A stopping server's GOAWAY names the stream after the last request it
/// accepted, and that request (1 MiB, read slowly through a 64 KiB stream
/// window, so it is in flight when the stop comes) is answered whole.
/// Before, GOAWAY named the request's own stream (h3 computes the id as
/// the last accepted plus the count asked, and 0 was asked), which tells
/// the client the request was not processed (RFC 9114 section 5.2): a
/// client may send it elsewhere again, while this server answers it.
#[hotloop::test(driver = "all")]
fn goaway_names_the_stream_after_the_last_request_taken(driver: DriverKind) {
    const BODY_BYTES: usize = 1 << 20;
    let body = BODY_BYTES.to_string();
    let (mut p, addr, _, config) = serve_h3(driver, &["--body-size", &body]);
    let mut transport = TransportConfig::default();
    transport.stream_receive_window(VarInt::from_u32(64 * 1024));
    client_rt().block_on(async move {
        hotloop::time::timeout(LIMIT, async {
            let (client, conn, _control, goaway) = connect(addr, config, transport).await;
            let (send, mut recv) = get(&conn).await;
            let id = u64::from(send.id());
            // The answer has begun, and waits for window, when the stop comes.
            let mut answer =
                recv.read_chunk(usize::MAX, true).await.unwrap().unwrap().bytes.to_vec();
            p.signal("TERM");
            hotloop::time::sleep(Duration::from_millis(300)).await;
            answer.extend_from_slice(&recv.read_to_end(2 * BODY_BYTES).await.unwrap());
            let got = frames(&answer);
            assert_eq!(got.first().map(|f| f.0), Some(FRAME_HEADERS), "{driver:?}");
            let body: usize = got.iter().filter(|f| f.0 == FRAME_DATA).map(|f| f.1.len()).sum();
            assert_eq!(body, BODY_BYTES, "{driver:?}");
            let named = goaway.get().expect("no GOAWAY before the answer's end");
            assert!(named > id, "{driver:?}: GOAWAY names stream {named}, the request's is {id}");
            conn.close(VarInt::from_u32(0), b"");
            client.wait_idle().await;
        })
        .await
        .unwrap();
        assert!(p.wait_exit(LIMIT).expect("exit").success());
    });
}

/// A client whose stream window is small (16 KiB), which reads nothing
/// and keeps its connection alive with PINGs, asks for 1 MiB: the server
/// resets the answer with H3_REQUEST_CANCELLED once a piece has waited
/// `--send-timeout-ms`, and the connection is gone from the count when the
/// client closes. Before, the answer waited for window for good, holding
/// its request, the connection's `--maxconn` slot and any drain.
#[hotloop::test(driver = "all")]
fn a_request_whose_client_reads_nothing_is_reset_at_the_send_timeout(driver: DriverKind) {
    let body = (1 << 20).to_string();
    let (mut p, addr, stats, config) =
        serve_h3(driver, &["--body-size", &body, "--send-timeout-ms", "200"]);
    let mut transport = TransportConfig::default();
    transport.stream_receive_window(VarInt::from_u32(16 * 1024));
    transport.keep_alive_interval(Some(Duration::from_millis(100)));
    client_rt().block_on(async move {
        let (client, conn, _control, _) = connect(addr, config, transport).await;
        let (_send, mut recv) = get(&conn).await;
        let start = Instant::now();
        let reset = hotloop::time::timeout(Duration::from_secs(5), recv.received_reset()).await;
        let reset = reset.unwrap_or_else(|_| panic!("{driver:?}: not reset within 5 s"));
        assert_eq!(reset.unwrap(), Some(VarInt::from_u32(H3_REQUEST_CANCELLED)), "{driver:?}");
        let took = start.elapsed();
        assert!(took < Duration::from_millis(1500), "{driver:?}: reset after {took:?}");
        conn.close(VarInt::from_u32(0), b"");
        let _ = hotloop::time::timeout(Duration::from_secs(1), client.wait_idle()).await;
    });
    let active = || common::stat(stats, "active_connections");
    assert!(common::wait_until(Duration::from_secs(5), || active() == 0), "{driver:?}");
    p.signal("TERM");
    assert!(p.wait_exit(LIMIT).expect("exit").success());
}

/// A request stream whose HEADERS never come (a frame type and nothing
/// more), on a connection kept alive by PINGs, is reset with
/// H3_REQUEST_REJECTED at `--header-timeout-ms`. Before, it was held for
/// as long as the client kept the connection alive.
#[hotloop::test(driver = "all")]
fn a_request_whose_headers_never_come_is_rejected_at_the_header_timeout(driver: DriverKind) {
    let (mut p, addr, _, config) = serve_h3(driver, &["--header-timeout-ms", "200"]);
    let mut transport = TransportConfig::default();
    transport.keep_alive_interval(Some(Duration::from_millis(100)));
    client_rt().block_on(async move {
        let (client, conn, _control, _) = connect(addr, config, transport).await;
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let mut started = Vec::new();
        varint(FRAME_HEADERS, &mut started);
        send.write_all(&started).await.unwrap();
        let start = Instant::now();
        let reset = hotloop::time::timeout(Duration::from_secs(5), recv.received_reset()).await;
        let reset = reset.unwrap_or_else(|_| panic!("{driver:?}: not reset within 5 s"));
        assert_eq!(reset.unwrap(), Some(VarInt::from_u32(H3_REQUEST_REJECTED)), "{driver:?}");
        let took = start.elapsed();
        assert!(took < Duration::from_millis(1500), "{driver:?}: reset after {took:?}");
        conn.close(VarInt::from_u32(0), b"");
        let _ = hotloop::time::timeout(Duration::from_secs(1), client.wait_idle()).await;
    });
    p.signal("TERM");
    assert!(p.wait_exit(LIMIT).expect("exit").success());
}
