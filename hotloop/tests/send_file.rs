//! `send_file` on both drivers: a whole file, a range of one, ranges that
//! run past the end, a Unix stream, a client that stops reading mid-file
//! and then closes (the send fails instead of hanging), a send dropped
//! mid-file (the worker goes on at once), and a file
//! truncated during the send (it stops at the new end, sends nothing past
//! it and does not hang).

use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use hotloop::fs::{self, File};
use hotloop::net::{TcpListener, TcpStream, UnixStream};
use hotloop::spawn;
use hotloop::time::timeout;

const LIMIT: Duration = Duration::from_secs(20);

/// A file in the temporary directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    async fn with(name: &str, data: &[u8]) -> TempFile {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("hotloop-sf-{}-{n}-{name}", std::process::id()));
        fs::write(&p, data).await.unwrap();
        TempFile(p)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ (i / 251 % 256) as u8).collect()
}

/// A blocking client in a thread that reads everything until the server
/// closes; joined through the returned receiver.
fn read_all_client(addr: SocketAddr) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(LIMIT)).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let _ = tx.send(out);
    });
    rx
}

/// Accepts one connection, sends `offset..offset+len` of the file with
/// `send_file`, closes, and returns what `send_file` said and what the
/// client read.
async fn send_range(file: &File, offset: u64, len: u64) -> (u64, Vec<u8>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let got = read_all_client(listener.local_addr().unwrap());
    let (stream, _) = timeout(LIMIT, listener.accept()).await.unwrap().unwrap();
    let sent = timeout(LIMIT, stream.send_file(file, offset, len)).await.unwrap().unwrap();
    drop(stream);
    let got = hotloop::spawn_blocking(move || got.recv_timeout(LIMIT).unwrap()).await.unwrap();
    (sent, got)
}

#[hotloop::test(driver = "all")]
async fn sends_a_whole_file() {
    let data = pattern(5_000_000);
    let tmp = TempFile::with("whole", &data).await;
    let file = File::open(&tmp.0).await.unwrap();
    let (sent, got) = send_range(&file, 0, data.len() as u64).await;
    assert_eq!(sent, data.len() as u64);
    assert!(got == data, "the client got {} bytes, not the file", got.len());
    // The file's handle is still good, and sends again.
    let (sent, got) = send_range(&file, 0, data.len() as u64).await;
    assert_eq!(sent, data.len() as u64);
    assert!(got == data);
}

#[hotloop::test(driver = "all")]
async fn sends_ranges_and_stops_at_the_end() {
    let data = pattern(300_000);
    let tmp = TempFile::with("ranges", &data).await;
    let file = File::open(&tmp.0).await.unwrap();
    let (sent, got) = send_range(&file, 1000, 5000).await;
    assert_eq!((sent, &got[..]), (5000, &data[1000..6000]));
    let (sent, got) = send_range(&file, 0, 1).await;
    assert_eq!((sent, &got[..]), (1, &data[..1]));
    // Past the end: what there is, no more.
    let (sent, got) = send_range(&file, 299_990, 1_000_000).await;
    assert_eq!((sent, &got[..]), (10, &data[299_990..]));
    let (sent, got) = send_range(&file, 400_000, 10).await;
    assert_eq!((sent, got.len()), (0, 0), "from past the end nothing is sent");
    let (sent, got) = send_range(&file, 0, 0).await;
    assert_eq!((sent, got.len()), (0, 0));
    let empty = TempFile::with("empty", b"").await;
    let empty = File::open(&empty.0).await.unwrap();
    let (sent, got) = send_range(&empty, 0, 100).await;
    assert_eq!((sent, got.len()), (0, 0));
}

#[hotloop::test(driver = "all")]
async fn sends_on_a_unix_stream() {
    let data = pattern(2_000_000);
    let tmp = TempFile::with("unix", &data).await;
    let file = File::open(&tmp.0).await.unwrap();
    let (a, b) = UnixStream::pair().unwrap();
    let reader = spawn(async move {
        let mut out = Vec::new();
        loop {
            let (res, buf) = b.read_owned(Vec::with_capacity(65536)).await;
            match res.unwrap() {
                0 => return out,
                _ => out.extend_from_slice(&buf),
            }
        }
    });
    let sent = timeout(LIMIT, a.send_file(&file, 7, 1_500_000)).await.unwrap().unwrap();
    assert_eq!(sent, 1_500_000);
    drop(a);
    let got = timeout(LIMIT, reader).await.unwrap().unwrap();
    assert!(got[..] == data[7..1_500_007]);
}

#[hotloop::test(driver = "all")]
async fn a_client_that_stops_reading_and_closes_ends_the_send() {
    let data = pattern(64 << 20);
    let tmp = TempFile::with("stall", &data).await;
    let file = File::open(&tmp.0).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let client = thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(LIMIT)).unwrap();
        let mut buf = vec![0u8; 100_000];
        s.read_exact(&mut buf).unwrap();
        // Stops reading while the server still has megabytes to send, then closes.
        thread::sleep(Duration::from_millis(300));
        drop(s);
        buf
    });
    let (stream, _) = timeout(LIMIT, listener.accept()).await.unwrap().unwrap();
    let res = timeout(LIMIT, stream.send_file(&file, 0, data.len() as u64))
        .await
        .expect("send_file hung on a client that closed");
    let e = res.expect_err("a closed client cannot have taken 64 MiB");
    assert!(
        matches!(e.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset),
        "{e:?}"
    );
    let first = hotloop::spawn_blocking(move || client.join().unwrap()).await.unwrap();
    assert!(first[..] == data[..100_000]);
    // The worker still sends files afterwards (a pipe with bytes left in it
    // was not reused).
    let (sent, got) = send_range(&file, 10, 70_000).await;
    assert_eq!((sent, &got[..]), (70_000, &data[10..70_010]));
}

#[hotloop::test(driver = "all")]
async fn a_file_truncated_during_the_send_stops_at_its_new_end() {
    const LEN: usize = 48 << 20;
    const CUT: u64 = 1 << 20;
    let data = pattern(LEN);
    let tmp = TempFile::with("shrink", &data).await;
    let file = File::open(&tmp.0).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let path = tmp.0.clone();
    let client = thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(LIMIT)).unwrap();
        let mut out = vec![0u8; 200_000];
        s.read_exact(&mut out).unwrap();
        // The server is mid-file (blocked on a full socket): the file shrinks.
        thread::sleep(Duration::from_millis(100));
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(CUT).unwrap();
        s.read_to_end(&mut out).unwrap();
        out
    });
    let (stream, _) = timeout(LIMIT, listener.accept()).await.unwrap().unwrap();
    let sent = timeout(LIMIT, stream.send_file(&file, 0, LEN as u64))
        .await
        .expect("send_file hung on a file that shrank")
        .unwrap();
    drop(stream);
    let got = hotloop::spawn_blocking(move || client.join().unwrap()).await.unwrap();
    assert!(sent < LEN as u64, "the send stopped early");
    assert_eq!(got.len() as u64, sent, "the client got exactly what was reported");
    // The bytes the file still has arrive unchanged, in order. Bytes past
    // the new end that were handed to the socket before the cut travel as
    // references to the file's pages, and may show the truncation (zeros):
    // that is what zero-copy sending means, in any server.
    let first_bad = got.iter().zip(&data).position(|(a, b)| a != b);
    assert!(
        first_bad.is_none_or(|at| at as u64 >= CUT),
        "byte {first_bad:?} of the file's first {CUT} differs ({sent} sent)"
    );
    assert!(got.len() as u64 >= CUT.min(sent));
    // A later send of the new file sends only what is left.
    let (sent, _) = send_range(&file, 0, LEN as u64).await;
    assert_eq!(sent, CUT);
}

#[hotloop::test(driver = "all")]
async fn a_connected_client_socket_sends_too() {
    // On io_uring a socket this side connected is non-blocking (accepted
    // ones are blocking): the send waits for room instead of failing.
    let data = pattern(8_000_000);
    let tmp = TempFile::with("client", &data).await;
    let file = File::open(&tmp.0).await.unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(LIMIT)).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        out
    });
    let stream = TcpStream::connect(addr).await.unwrap();
    let sent =
        timeout(LIMIT, stream.send_file(&file, 0, data.len() as u64)).await.unwrap().unwrap();
    assert_eq!(sent, data.len() as u64);
    drop(stream);
    let got = hotloop::spawn_blocking(move || server.join().unwrap()).await.unwrap();
    assert!(got == data);
}

#[hotloop::test(driver = "all")]
async fn a_send_dropped_mid_file_does_not_stall_the_worker() {
    let data = pattern(32 << 20);
    let tmp = TempFile::with("dropped", &data).await;
    let file = File::open(&tmp.0).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Reads a little, then nothing; closes after two seconds, which would
    // end a worker stalled on the dropped send (so a failure is bounded).
    let client = thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        let mut buf = vec![0u8; 100_000];
        s.read_exact(&mut buf).unwrap();
        thread::sleep(Duration::from_secs(2));
    });
    let (stream, _) = timeout(LIMIT, listener.accept()).await.unwrap().unwrap();
    let start = std::time::Instant::now();
    // The send waits for a client that does not read: the timeout drops it.
    let res =
        timeout(Duration::from_millis(300), stream.send_file(&file, 0, data.len() as u64)).await;
    assert!(res.is_err(), "the send cannot finish");
    drop(stream);
    let dropped_after = start.elapsed();
    assert!(
        dropped_after < Duration::from_millis(1500),
        "dropping the send stalled the worker until the client left ({dropped_after:?})"
    );
    hotloop::spawn_blocking(move || client.join().unwrap()).await.unwrap();
    let (sent, got) = send_range(&file, 5, 200_000).await;
    assert_eq!((sent, &got[..]), (200_000, &data[5..200_005]));
}
