//! The TCP proxy passes a half-close on as a half-close (haproxy and
//! `socat` do the same): a client that shuts down its sending side after
//! its request (`nc -N`, many HTTP/1.0 clients) still gets the whole
//! answer, sent slowly after the backend read the end, then a clean end
//! of stream; and a backend that shuts down its side still gets all the
//! client sends after it. Neither side sees a reset, and the idle timeout
//! counts the half-closed connection's one moving direction. Both drivers.

use crate::common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use common::Proc;
use hotloop::DriverKind;

/// What crosses the proxy after the other direction ended: 4 MiB.
const PIECE: usize = 64 * 1024;
const PIECES: usize = 64;
const TOTAL: usize = PIECE * PIECES;
/// Between pieces: the whole transfer (about 0.6 s) is longer than the
/// proxy's idle timeout, each gap far shorter.
const GAP: Duration = Duration::from_millis(10);
const IDLE_MS: &str = "300";

fn proxy(driver: DriverKind, backend: SocketAddr) -> (Proc, SocketAddr) {
    common::tcp_proxy(driver, backend, IDLE_MS)
}

/// Sends `TOTAL` bytes in pieces, with a pause between each.
fn send_slowly(s: &mut TcpStream) -> std::io::Result<()> {
    for i in 0..PIECES {
        s.write_all(&[b'a' + (i % 26) as u8; PIECE])?;
        std::thread::sleep(GAP);
    }
    Ok(())
}

/// Reads to the end: the bytes, and how the stream ended (`Ok` for a
/// clean end of stream, the error for a reset).
fn read_all(s: &mut TcpStream) -> (usize, std::io::Result<()>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, Ok(())),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return (got, Err(e)),
        }
    }
}

/// The client sends its request and shuts down its side; the backend
/// reads to that end, then answers 4 MiB slowly and closes. The client
/// gets every byte and a clean end.
#[hotloop::test(driver = "all")]
fn a_client_half_close_reaches_the_backend_and_the_answer_comes_whole(driver: DriverKind) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let (tx, backend_saw) = mpsc::channel();
    let backend = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut request = Vec::new();
        let read = s.read_to_end(&mut request).map(|_| request);
        let sent = send_slowly(&mut s).and_then(|()| s.shutdown(Shutdown::Write));
        let _ = tx.send((read, sent));
    });
    let (_p, addr) = proxy(driver, backend);
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.write_all(b"GET /big HTTP/1.0\r\n\r\n").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let (got, end) = read_all(&mut c);
    let (read, sent) = backend_saw.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(read.unwrap(), b"GET /big HTTP/1.0\r\n\r\n", "the backend's read of the request");
    assert!(sent.is_ok(), "the backend's answer ended with {sent:?}");
    assert!(end.is_ok(), "the client's read ended with {end:?} after {got} bytes");
    assert_eq!(got, TOTAL, "the answer was cut");
}

/// The mirror: the backend greets and shuts down its side at once while
/// the client still sends 4 MiB slowly. The client reads the greeting
/// and a clean end, and every byte it sends after reaches the backend,
/// which then reads the client's own end.
#[hotloop::test(driver = "all")]
fn a_backend_half_close_reaches_the_client_and_the_upload_comes_whole(driver: DriverKind) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let (tx, backend_saw) = mpsc::channel();
    let backend = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let _ = s.write_all(b"hello; send on").and_then(|()| s.shutdown(Shutdown::Write));
        let _ = tx.send(read_all(&mut s));
    });
    let (_p, addr) = proxy(driver, backend);
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut greeting = Vec::new();
    let end = c.read_to_end(&mut greeting);
    assert!(end.is_ok(), "the client's read ended with {end:?}");
    assert_eq!(greeting, b"hello; send on");
    let sent = send_slowly(&mut c);
    assert!(sent.is_ok(), "the client's upload ended with {sent:?}");
    c.shutdown(Shutdown::Write).unwrap();
    let (got, end) = backend_saw.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(end.is_ok(), "the backend's read ended with {end:?} after {got} bytes");
    assert_eq!(got, TOTAL, "the upload was cut");
    // Both ends closed cleanly: the client reads a clean end still.
    assert_eq!(c.read(&mut [0u8; 1]).unwrap(), 0);
}
