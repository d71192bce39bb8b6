//! TLS for `hotloop serve echo|http|hyper|static`: the acceptor from
//! `--tls-cert` and `--tls-key`, and the hand-written handlers' [`Conn`]
//! over a TLS stream (a file is read and written through it).
//!
//! Over TLS the send timeout counts progress per TLS record: each piece of
//! up to [`TLS_WRITE_BYTES`] must be written and flushed to the socket
//! within `--send-timeout-ms` (rustls buffers what it encrypts, so progress
//! below a record is not visible from here).
//!
//! An idle connection holds no read buffer of its own: a read first waits
//! for rustls to have plaintext (its own buffer, [`read_when_ready`]), and
//! only then takes a buffer and copies it out, as plain TCP's
//! `read_pooled` takes a pooled buffer only once data is there. Before,
//! every idle TLS connection held a 16 KiB `Vec` in its pending read.
//!
//! A connection the server ends closes lingeringly, as nginx's
//! `lingering_close`: after its close_notify and the TCP write side, what
//! the client still sends is read and dropped until the client's own end
//! (its close_notify or FIN), until it has sent nothing for 2 s, for at
//! most 30 s in all, or until the server stops ([`linger()`]). A client ends a request with
//! `Connection: close` by sending its close_notify and shutting its side,
//! and closing on that unread record made the kernel answer with a reset,
//! which threw away the answer the client had not yet read (2 to 20 of 50
//! such clients got theirs). An error reply has closed so already
//! ([`Ending::Lingered`]): it is not done twice (a client that kept its
//! side open was held twice the bound).
//!
//! A connection given up on (a send, an error reply, or the closing or
//! the error reply's close_notify past its limit) is shut down both ways in
//! the kernel and reset before it is dropped ([`cut`]): on io_uring the TLS
//! stream's writes are written behind, and a send in flight would keep the
//! descriptor open after the drop (for up to the driver's write linger,
//! 5 s); the shutdown ends that send, and the connection, at once.

use std::future::poll_fn;
use std::io;
use std::net::Shutdown;
use std::ops::Deref;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hotloop::buf::IoBuf;
use hotloop::net::POOLED_BUFFER_BYTES;
use hotloop::time::timeout;
use hotloop::tls::{CertReloader, ServerTlsStream, TlsAcceptor};
use tokio::io::{AsyncBufRead, AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::conn::{linger, Conn, ConnTimer, Ending, LINGER_QUIET};
use crate::serve_args::ServeArgs;

/// The most plaintext written and flushed under one send-timeout clock:
/// one TLS record's worth.
pub const TLS_WRITE_BYTES: usize = 16 * 1024;

/// Says which files a configuration error came from.
pub fn identity_error(cert: &Path, key: &Path, e: io::Error) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("--tls-cert {} with --tls-key {}: {e}", cert.display(), key.display()),
    )
}

/// The acceptor for `--tls-cert`/`--tls-key` offering ALPN `alpn`, with
/// `--handshake-timeout-ms`, and its certificate, which SIGHUP reloads;
/// `None` without TLS flags.
pub fn acceptor(
    args: &ServeArgs,
    alpn: &[&[u8]],
) -> io::Result<Option<(TlsAcceptor, Arc<CertReloader>)>> {
    acceptor_from(
        args.tls_cert.as_deref(),
        args.tls_key.as_deref(),
        args.handshake_timeout_ms,
        alpn,
    )
}

/// [`acceptor`] from the flags' values, for a command whose flags are not
/// `serve`'s (`proxy --mode http`).
pub fn acceptor_from(
    cert: Option<&Path>,
    key: Option<&Path>,
    handshake_timeout_ms: u64,
    alpn: &[&[u8]],
) -> io::Result<Option<(TlsAcceptor, Arc<CertReloader>)>> {
    let (Some(cert_path), Some(key_path)) = (cert, key) else {
        return Ok(None);
    };
    let certs = CertReloader::from_pem_files(cert_path, key_path)
        .map_err(|e| identity_error(cert_path, key_path, e))?;
    let acceptor = TlsAcceptor::new(certs.server_config(alpn)?)
        .handshake_timeout(Duration::from_millis(handshake_timeout_ms));
    Ok(Some((acceptor, certs)))
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the client reads nothing")
}

/// Ends the connection now, whatever the TLS layer still has in flight:
/// the kernel's socket is shut down both ways and reset at the close.
///
/// The stream's own shutdown of both directions does not end a send in
/// flight: on io_uring it hands the bytes written behind to the driver,
/// which keeps sending them for up to its write linger (5 s), so a client
/// that reads nothing held the descriptor that long. Shut down in the
/// kernel, the send fails at once and the driver resets the connection.
/// `SO_LINGER` zero makes the close a reset on epoll too (the client sees
/// a cut, not a clean end after part of a reply); when it cannot be set
/// (a direct io_uring socket out of descriptors, on a kernel that sets it
/// only through one), the stream's own shutdown is left.
async fn cut(tls: &ServerTlsStream) {
    let tcp = tls.get_ref().0;
    if tcp.set_linger(Some(Duration::ZERO)).is_ok() {
        let _ = tcp.shutdown_now(Shutdown::Both);
    } else {
        let _ = tcp.shutdown_with(Shutdown::Both).await;
    }
}

impl Conn for ServerTlsStream {
    type Buf = Vec<u8>;

    async fn read_some(&mut self) -> io::Result<Vec<u8>> {
        read_when_ready(self).await
    }

    async fn send<B: IoBuf + Deref<Target = [u8]>>(
        &mut self,
        buf: B,
        limit: Option<Duration>,
        // TLS writes go through the record layer's own futures, bounded
        // per piece below.
        _timer: &mut ConnTimer,
    ) -> io::Result<()> {
        for piece in buf.chunks(TLS_WRITE_BYTES) {
            let write = async {
                self.write_all(piece).await?;
                self.flush().await
            };
            let written = match limit {
                Some(t) => timeout(t, write).await.unwrap_or_else(|_| Err(timed_out())),
                None => write.await,
            };
            if let Err(e) = written {
                cut(self).await;
                return Err(e);
            }
        }
        Ok(())
    }

    /// Read and written through the TLS stream: the bytes must be
    /// encrypted, so they come to user space anyway.
    async fn send_file(
        &mut self,
        file: &hotloop::fs::File,
        offset: u64,
        len: u64,
        limit: Option<Duration>,
        timer: &mut ConnTimer,
    ) -> io::Result<()> {
        send_file_copying(self, file, offset, len, limit, timer).await
    }

    async fn shutdown_write(&mut self) -> io::Result<()> {
        // close_notify, then the TCP write side.
        self.shutdown().await
    }

    async fn cut(&mut self) {
        cut(self).await
    }

    /// Sends close_notify, so the client sees a clean end rather than a
    /// truncation, then closes lingeringly (see the module notes); after
    /// an error reply, which did both, nothing.
    async fn finish(&mut self, ending: Ending, limit: Option<Duration>) {
        if ending == Ending::Lingered {
            return;
        }
        let limit = limit.unwrap_or(LINGER_QUIET);
        if !matches!(timeout(limit, self.shutdown()).await, Ok(Ok(()))) {
            cut(self).await;
            return;
        }
        linger(self, &mut ConnTimer::new()).await;
    }

    fn input_probe(&self) -> hotloop::net::InputProbe {
        self.get_ref().0.input_probe()
    }
}

/// Reads what has arrived (empty at the end of the stream), taking a
/// buffer only once there is plaintext to put in it: while the peer is
/// quiet the wait holds no memory of its own (what the stream buffers, as
/// rustls does its records, stays the stream's).
///
/// Cancel-safe: what was decrypted and not copied out stays in the stream.
/// As many reads of the socket as one `read_buf` with the buffer taken
/// first: the wait reads until plaintext is there, and the copy goes on
/// reading until the socket would block, as `read_buf` does.
///
/// An error tokio-rustls keeps back behind bytes it returned (for its
/// next `poll_read`) is not seen by the wait, which reads on and meets
/// that error again, or the end: the connection ends either way. A wait
/// that would see it, a `poll_read` into no room, cost 2.9% more
/// instructions in all under callgrind (TLS `serve http`, keep-alive),
/// against 0.3% for this one.
async fn read_when_ready<S: AsyncBufRead + AsyncRead + Unpin>(
    stream: &mut S,
) -> io::Result<Vec<u8>> {
    let ended =
        poll_fn(|cx| Pin::new(&mut *stream).poll_fill_buf(cx).map_ok(<[u8]>::is_empty)).await?;
    if ended {
        return Ok(Vec::new());
    }
    let mut buf = Vec::with_capacity(POOLED_BUFFER_BYTES);
    stream.read_buf(&mut buf).await?;
    Ok(buf)
}

/// Sends `len` bytes of `file` from `offset` by reading it and writing
/// through `stream` (TLS); `UnexpectedEof` when the file ends first.
async fn send_file_copying<S: Conn>(
    stream: &mut S,
    file: &hotloop::fs::File,
    offset: u64,
    len: u64,
    limit: Option<Duration>,
    timer: &mut ConnTimer,
) -> io::Result<()> {
    const STEP: u64 = 64 * 1024;
    let mut done = 0;
    while done < len {
        let want = (len - done).min(STEP);
        let (res, mut buf) = file.read_at(Vec::with_capacity(want as usize), offset + done).await;
        let n = res?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.truncate(n.min(want as usize));
        done += buf.len() as u64;
        stream.send(buf, limit, timer).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use tokio::io::ReadBuf;

    use super::*;

    /// A stream whose bytes arrive when the test says, recording whether a
    /// read was ever handed a buffer.
    #[derive(Default)]
    struct Arrivals {
        queued: Vec<u8>,
        buffers_offered: usize,
    }

    impl AsyncRead for Arrivals {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            self.buffers_offered += 1;
            if self.queued.is_empty() {
                return Poll::Pending;
            }
            let n = self.queued.len().min(buf.remaining());
            buf.put_slice(&self.queued[..n]);
            self.queued.drain(..n);
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncBufRead for Arrivals {
        fn poll_fill_buf(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
            let this = self.get_mut();
            if this.queued.is_empty() {
                Poll::Pending
            } else {
                Poll::Ready(Ok(&this.queued))
            }
        }

        fn consume(mut self: Pin<&mut Self>, amt: usize) {
            self.queued.drain(..amt);
        }
    }

    /// The waiting read of an idle connection holds no buffer: none is
    /// handed to the stream until bytes are there, then one, sized as the
    /// plain path's pooled buffers.
    #[test]
    fn an_idle_read_holds_no_buffer() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut stream = Arrivals::default();
        {
            let mut read = pin!(read_when_ready(&mut stream));
            for _ in 0..3 {
                assert!(read.as_mut().poll(&mut cx).is_pending());
            }
        }
        assert_eq!(stream.buffers_offered, 0);
        stream.queued.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        let mut read = pin!(read_when_ready(&mut stream));
        let Poll::Ready(Ok(buf)) = read.as_mut().poll(&mut cx) else { panic!("not read") };
        assert_eq!(&buf[..], b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(buf.capacity(), POOLED_BUFFER_BYTES);
    }
}
