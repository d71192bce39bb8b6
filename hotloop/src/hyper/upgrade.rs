//! HTTP/1.1 upgrades (`Upgrade: websocket`, `101 Switching Protocols`) on
//! connections that [`serve_hyper`](super::serve_hyper) serves.
//!
//! hyper hands an upgraded connection over only when its I/O is `Send`
//! (`with_upgrades`), and a hotloop stream is not: it belongs to its
//! worker. So the connection does it: a request that asks for an upgrade
//! carries an [`OnUpgrade`] in its extensions; a service that answers it
//! `101` gives it the function that runs the new protocol
//! ([`OnUpgrade::run`]); once hyper has written the `101` and stopped, the
//! connection takes its I/O back from hyper (`into_parts`, with the bytes
//! the client sent after its request) and runs that function's future in
//! place of hyper, as the same task. The connection's idle and send
//! timeouts still bound it, and it counts as open until the future ends.
//!
//! # Implementation notes
//!
//! - An extension must be `Send + Sync`, and the function need not be, so
//!   the extension holds only a key (the connection's record's address,
//!   unique while the connection lives) into a thread-local table of the
//!   worker that serves the connection. [`OnUpgrade::run`] must be called
//!   on that worker (from the service's future, as services are run);
//!   called anywhere else it gives the function back.
//! - The entry is removed when the upgrade runs, when the request's
//!   answer begins without the service having asked for it to run (an
//!   answer other than `101`: a request without a body is answered once
//!   its first byte is written), or when the connection ends. So the
//!   table holds only the upgrades being answered, not one entry for
//!   every connection whose client once offered one (`curl` offers `h2c`
//!   with every request over `http://`).

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};

use super::deadline::{Socket, TimedIo};
use super::tracked::Rewind;

/// The future that runs an upgraded connection.
pub(super) type Tunnel = Pin<Box<dyn Future<Output = ()>>>;
/// What a service registers: given the connection, its new protocol.
pub(super) type Start = Box<dyn FnOnce(Upgraded) -> Tunnel>;

thread_local! {
    /// This worker's registered upgrades, by connection key (a few at most:
    /// one per connection whose upgrade request is being answered).
    static STARTS: RefCell<Vec<(usize, Option<Start>)>> = const { RefCell::new(Vec::new()) };
}

/// In the extensions of an HTTP/1.1 request that asks for an upgrade (it
/// has an `Upgrade` field): answer `101 Switching Protocols` and call
/// [`OnUpgrade::run`] to take the connection over once the answer is out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnUpgrade {
    key: usize,
}

impl OnUpgrade {
    pub(super) fn new(key: usize) -> OnUpgrade {
        STARTS.with(|s| {
            let mut s = s.borrow_mut();
            if !s.iter().any(|(k, _)| *k == key) {
                s.push((key, None));
            }
        });
        OnUpgrade { key }
    }

    /// Runs `protocol(connection)` on the connection once the service's
    /// `101` answer has been written. Call it on the worker that serves the
    /// request (from the service's future) and only when answering `101`;
    /// otherwise (another thread, or the connection is gone) `protocol`
    /// comes back as the error. A later call replaces an earlier one.
    pub fn run<F, Fut>(&self, protocol: F) -> Result<(), F>
    where
        F: FnOnce(Upgraded) -> Fut + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        STARTS.with(|s| {
            let mut s = s.borrow_mut();
            match s.iter_mut().find(|(k, _)| *k == self.key) {
                Some((_, slot)) => {
                    *slot = Some(Box::new(move |io| Box::pin(protocol(io)) as Tunnel));
                    Ok(())
                }
                None => Err(protocol),
            }
        })
    }
}

/// Takes the function registered for connection `key`, and forgets the key.
pub(super) fn take(key: usize) -> Option<Start> {
    STARTS.with(|s| {
        let mut s = s.borrow_mut();
        let at = s.iter().position(|(k, _)| *k == key)?;
        s.swap_remove(at).1
    })
}

/// Forgets connection `key`'s offer unless the service asked for its
/// upgrade to run; true if no entry is left.
pub(super) fn forget_unrun(key: usize) -> bool {
    STARTS.with(|s| {
        let mut s = s.borrow_mut();
        match s.iter().position(|(k, _)| *k == key) {
            Some(at) if s[at].1.is_none() => {
                s.swap_remove(at);
                true
            }
            Some(_) => false,
            None => true,
        }
    })
}

/// An upgraded connection: the bytes the client sent after its request,
/// then the connection itself, with tokio's I/O traits.
pub struct Upgraded {
    read_buf: Bytes,
    io: Box<dyn TunnelIo>,
}

impl std::fmt::Debug for Upgraded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upgraded").field("read_buf", &self.read_buf.len()).finish()
    }
}

impl Upgraded {
    pub(super) fn new<I>(io: Rewind<TimedIo<I>>, read_buf: Bytes) -> Upgraded
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Socket + Unpin + 'static,
    {
        // What hyper had not parsed comes first, then what it had not read.
        let mut first = read_buf.to_vec();
        first.extend_from_slice(&io.prefix);
        Upgraded { read_buf: Bytes::from(first), io: Box::new(io.io) }
    }
}

/// A served connection's I/O, whatever its stream.
trait TunnelIo {
    fn read(
        &mut self,
        cx: &mut Context<'_>,
        rb: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>>;
    fn write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>>;
    fn flush(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>>;
    fn shutdown(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>>;
}

impl<I> TunnelIo for TimedIo<I>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Socket + Unpin,
{
    fn read(
        &mut self,
        cx: &mut Context<'_>,
        rb: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.poll_tunnel_read(cx, rb)
    }
    fn write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.poll_tunnel_write(cx, buf)
    }
    fn flush(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.poll_tunnel_flush(cx)
    }
    fn shutdown(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.poll_tunnel_shutdown(cx)
    }
}

impl tokio::io::AsyncRead for Upgraded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.read_buf.is_empty() {
            let n = self.read_buf.len().min(buf.remaining());
            buf.put_slice(&self.read_buf[..n]);
            self.read_buf.advance(n);
            return Poll::Ready(Ok(()));
        }
        self.io.read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Upgraded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.io.write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.io.flush(cx)
    }

    /// Shuts the write side only: the client may go on sending.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.io.shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::time::Duration;

    use hyper::service::service_fn;

    use super::*;

    /// The drivers to run on: io_uring too where it can run.
    fn drivers() -> Vec<crate::DriverKind> {
        let mut drivers = vec![crate::DriverKind::Epoll];
        if !crate::__private::skip_uring_test() {
            drivers.push(crate::DriverKind::Uring);
        }
        drivers
    }

    /// Reads one answer (a head with `Content-Length`, and its body).
    fn answer(s: &mut std::net::TcpStream) -> String {
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        while !got.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut byte).unwrap();
            got.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
        let len: usize = head
            .split("content-length: ")
            .nth(1)
            .and_then(|v| v.split("\r\n").next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).unwrap();
        got.extend(body);
        String::from_utf8_lossy(&got).into_owned()
    }

    /// Twenty kept-alive connections each send three requests offering an
    /// upgrade (`curl` offers `h2c` so over `http://`) that are answered
    /// 200: the worker's table of offers is empty once they are answered.
    /// Before, each connection kept its entry until it closed, and every
    /// offer scanned them all.
    #[test]
    fn offers_answered_without_an_upgrade_leave_no_entry() {
        for driver in drivers() {
            let rt = crate::Runtime::builder().workers(1).driver(driver).build().unwrap();
            let server = crate::hyper::serve_hyper(
                rt.handle(),
                "127.0.0.1:0",
                crate::net::ListenerOptions::default(),
                || {
                    service_fn(|_req| async {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            "no upgrade".to_string(),
                        ))
                    })
                },
            )
            .unwrap();
            let mut clients: Vec<_> = (0..20)
                .map(|_| {
                    let s = std::net::TcpStream::connect(server.local_addr()).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    s
                })
                .collect();
            for _ in 0..3 {
                for s in &mut clients {
                    s.write_all(
                        b"GET / HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings\r\n\
                          Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n",
                    )
                    .unwrap();
                    let got = answer(s);
                    assert!(got.starts_with("HTTP/1.1 200"), "{driver:?}: {got}");
                }
            }
            let entries = rt
                .handle()
                .spawn_on(0, || async { STARTS.with(|s| s.borrow().len()) })
                .join()
                .unwrap();
            assert_eq!(entries, 0, "{driver:?}: entries left for 20 kept-alive connections");
            drop(clients);
        }
    }
}
