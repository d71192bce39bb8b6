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
//! - The entry is removed when the upgrade runs or the connection ends.

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
    /// one per connection whose answer is being chosen).
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
