//! Writing on plain TCP under the connection's timer: a buffer
//! ([`send`]) and a file's bytes by `sendfile` ([`send_file_tcp`]).

use std::future::Future;
use std::io;
use std::pin::pin;
use std::time::Duration;

use hotloop::buf::IoBuf;
use hotloop::fs::File;
use hotloop::net::TcpStream;

use super::ConnTimer;

/// Bytes of a file sent under one send-timeout clock (a client that takes
/// this much within the send timeout keeps its connection).
pub const SEND_FILE_STEP_BYTES: u64 = 512 * 1024;

/// Writes all of `buf`, giving up when one write has made no progress for
/// `limit` (the client does not read); `Err` means the connection is done.
///
/// The usual case, one write that takes the whole buffer (at once on
/// epoll, at its completion on io_uring), files no timer of its own: a
/// wait runs on the connection's timer. A short write continues on the
/// heap, so its loop does not grow every connection's state.
///
/// A block rather than an `async fn`, so its arguments are not stored
/// twice in every connection's future.
#[allow(clippy::manual_async_fn)]
pub(super) fn send<'s, 't, B: IoBuf>(
    stream: &'s TcpStream,
    buf: B,
    limit: Option<Duration>,
    timer: &'t mut ConnTimer,
) -> impl Future<Output = io::Result<()>> + use<'s, 't, B> {
    async move {
        let total = buf.bytes_init();
        let write = pin!(stream.write_owned(buf));
        let (res, buf) = timer.write(write, limit).await?;
        match res? {
            0 if total > 0 => Err(io::ErrorKind::WriteZero.into()),
            n if n >= total => Ok(()),
            n => Box::pin(send_rest(stream, buf, n, limit, timer)).await,
        }
    }
}

/// The rest of [`send`] after a short write: `done` bytes of `buf` are sent.
async fn send_rest<B: IoBuf>(
    stream: &TcpStream,
    mut buf: B,
    mut done: usize,
    limit: Option<Duration>,
    timer: &mut ConnTimer,
) -> io::Result<()> {
    let total = buf.bytes_init();
    while done < total {
        // Each write returns as soon as it moved any bytes, so the limit
        // runs from the last progress.
        let write = pin!(stream.write_owned(buf.slice(done..)));
        let (res, slice) = timer.write(write, limit).await?;
        buf = slice.into_inner();
        match res? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => done += n,
        }
    }
    Ok(())
}

/// Sends `len` bytes of `file` from `offset` on plain TCP with
/// [`TcpStream::send_file`], in steps of [`SEND_FILE_STEP_BYTES`] that
/// each must finish within `limit`; `UnexpectedEof` when the file ends
/// first.
pub(super) async fn send_file_tcp(
    stream: &TcpStream,
    file: &File,
    offset: u64,
    len: u64,
    limit: Option<Duration>,
    timer: &mut ConnTimer,
) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        let step = (len - done).min(SEND_FILE_STEP_BYTES);
        let send = pin!(stream.send_file(file, offset + done, step));
        let sent = timer.write(send, limit).await??;
        if sent < step {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        done += sent;
    }
    Ok(())
}
