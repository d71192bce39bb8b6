//! When one side of a proxied TCP connection fails (a reset), the other
//! side still gets every byte the proxy forwarded to it before, as it
//! would from the failed peer directly (the kernel delivers what came
//! before a reset), and then a reset; or a clean end, if its direction
//! had ended cleanly before the failure. A peer reading slowly still has
//! megabytes on their way in the proxy's socket when the failure comes.
//! Both drivers.

use crate::common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::Proc;
use hotloop::{DriverKind, Runtime};

/// What the failing side sends before it fails: 8 MiB.
const TOTAL: usize = 8 << 20;
/// How long the receiving side waits before it starts reading, so that
/// every buffer on the way fills.
const PAUSE: Duration = Duration::from_millis(300);
/// The receiving side reads a piece, then naps: slower than loopback,
/// so the proxy's socket toward it stays full.
const PIECE: usize = 64 * 1024;
const NAP: Duration = Duration::from_millis(1);
/// TCP's `FIN_WAIT1` in `/proc/net/tcp`: a socket whose side was shut
/// down, its FIN queued behind what it still has to send.
const FIN_WAIT1: u8 = 0x04;

fn proxy(driver: DriverKind, backend: SocketAddr) -> (Proc, SocketAddr) {
    common::tcp_proxy(driver, backend, "5000")
}

/// The state and the unacknowledged bytes (`SIOCOUTQ`'s count) of the
/// loopback TCP socket from `local` to `remote`, from `/proc/net/tcp`:
/// what the kernel holds for any socket of this host, the proxy's too.
fn tcp_socket(local: SocketAddr, remote: SocketAddr) -> Option<(u8, usize)> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let addr = |field: &str| -> Option<SocketAddr> {
        let (ip, port) = field.split_once(':')?;
        // The address is the network-order bytes printed as a native u32.
        let ip = Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.to_ne_bytes());
        Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_str_radix(port, 16).ok()?)))
    };
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if addr(f.get(1)?)? != local || addr(f.get(2)?)? != remote {
            return None;
        }
        let state = u8::from_str_radix(f.get(3)?, 16).ok()?;
        let tx_queue = usize::from_str_radix(f.get(4)?.split_once(':')?.0, 16).ok()?;
        Some((state, tx_queue))
    })
}

/// Resets `s` (`SO_LINGER` 0, then close) once its peer has acknowledged
/// everything it sent, its FIN too (`SIOCOUTQ` at zero, through the
/// runtime's probe): the reset then destroys nothing still unsent.
fn reset_once_acknowledged(s: TcpStream) {
    let rt = Runtime::builder().workers(1).driver(DriverKind::Epoll).build().unwrap();
    rt.block_on(async move {
        let s = hotloop::net::TcpStream::from_std(s).unwrap();
        let probe = s.input_probe();
        let deadline = Instant::now() + Duration::from_secs(20);
        while probe.unacknowledged_output().unwrap() > 0 {
            assert!(Instant::now() < deadline, "never acknowledged");
            hotloop::time::sleep(Duration::from_millis(1)).await;
        }
        s.set_linger(Some(Duration::ZERO)).unwrap();
    });
}

/// Reads slowly to the end; `between` runs after each piece. The bytes,
/// and how the stream ended (`Ok` for a clean end, the error for a reset).
fn read_slowly(
    s: &mut TcpStream,
    mut between: impl FnMut(&mut TcpStream, usize),
) -> (usize, std::io::Result<()>) {
    std::thread::sleep(PAUSE);
    let mut buf = vec![0u8; PIECE];
    let mut got = 0;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, Ok(())),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return (got, Err(e)),
        }
        between(s, got);
        std::thread::sleep(NAP);
    }
}

/// The backend answers 8 MiB, waits until the proxy has all of it, and
/// closes with the client's first bytes unread: a reset. The client, which
/// started reading late and reads slowly, still gets all 8 MiB, then the
/// reset.
#[hotloop::test(driver = "all")]
fn a_backend_reset_after_its_answer_still_delivers_the_whole_answer(driver: DriverKind) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let backend = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.write_all(&vec![b'd'; TOTAL]).unwrap();
        reset_once_acknowledged(s);
    });
    let (_p, addr) = proxy(driver, backend);
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.write_all(b"never read").unwrap();
    let (got, end) = read_slowly(&mut c, |_, _| {});
    assert_eq!(got, TOTAL, "the answer was cut; the stream ended with {end:?}");
    assert!(
        matches!(&end, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "the backend's reset reached the client as {end:?}"
    );
}

/// The backend answers 8 MiB and ends its side cleanly, then resets once
/// the proxy has all of it. The proxy has passed the clean end on (its
/// socket toward the client is shut down, megabytes still queued) when
/// the client sends more: the proxy's write of it to the backend fails.
/// The client still gets all 8 MiB and the clean end.
#[hotloop::test(driver = "all")]
fn a_backend_failing_after_its_clean_end_leaves_the_client_the_whole_answer(driver: DriverKind) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let backend = l.local_addr().unwrap();
    let (tx, backend_closed) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.write_all(&vec![b'd'; TOTAL]).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        reset_once_acknowledged(s);
        let _ = tx.send(());
    });
    let (_p, addr) = proxy(driver, backend);
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.write_all(b"never read").unwrap();
    let client = c.local_addr().unwrap();
    let (mut closed, mut sent_late) = (false, None);
    let (got, end) = read_slowly(&mut c, |c, _| {
        closed = closed || backend_closed.try_recv().is_ok();
        if !closed || sent_late.is_some() {
            return;
        }
        // Once the proxy has shut its side toward the client down with
        // bytes still queued: more from the client, which cannot reach
        // the closed backend.
        if let Some((FIN_WAIT1, queued)) = tcp_socket(addr, client) {
            sent_late = Some(queued);
            c.write_all(b"too late").unwrap();
        }
    });
    assert!(
        sent_late.is_some_and(|queued| queued > 0),
        "the client's late bytes went when the proxy had {sent_late:?} queued"
    );
    assert_eq!(got, TOTAL, "the answer was cut; the stream ended with {end:?}");
    assert!(end.is_ok(), "the backend's clean end reached the client as {end:?}");
}

/// The mirror of the first: the client uploads 8 MiB, waits until the
/// proxy has all of it, and resets. The backend, which started reading
/// late and reads slowly, still gets all 8 MiB, then the reset.
#[hotloop::test(driver = "all")]
fn a_client_reset_after_its_upload_still_delivers_the_whole_upload(driver: DriverKind) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let backend = l.local_addr().unwrap();
    let (tx, backend_got) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let _ = tx.send(read_slowly(&mut s, |_, _| {}));
    });
    let (_p, addr) = proxy(driver, backend);
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(&vec![b'u'; TOTAL]).unwrap();
    reset_once_acknowledged(c);
    let (got, end) = backend_got.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(got, TOTAL, "the upload was cut; the stream ended with {end:?}");
    assert!(
        matches!(&end, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "the client's reset reached the backend as {end:?}"
    );
}
