//! Writing on plain TCP under the connection's timer: a buffer
//! ([`send`]) and a file's bytes by `sendfile` ([`send_file_tcp`]).

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hotloop::buf::{BufResult, IoBuf};
use hotloop::fs::File;
use hotloop::net::TcpStream;

use super::ConnTimer;

/// Bytes of a file one `sendfile` step sends (each step's wait is timed
/// on its own; see [`send_file_tcp`]).
pub const SEND_FILE_STEP_BYTES: u64 = 512 * 1024;

/// Writes all of `buf`, giving up when one write has made no progress for
/// `limit` (the client does not read); `Err` means the connection is done.
///
/// The usual case, one write that takes the whole buffer (at once on
/// epoll, at its completion on io_uring), files no timer of its own: a
/// wait runs on the connection's timer. A short write continues on the
/// heap, so its loop does not grow every connection's state.
pub(super) fn send<'s, 't, B: IoBuf>(
    stream: &'s TcpStream,
    buf: B,
    limit: Option<Duration>,
    timer: &'t mut ConnTimer,
) -> impl Future<Output = io::Result<()>> + use<'s, 't, B> {
    let step = Step::First { write: stream.write_owned(buf), timer };
    SendAll { stream, limit, due: None, step, rest: send_rest::<B> }
}

/// The future of [`send`]: the write, what bounds its wait, and nothing
/// else. Every answer waits in it, inside its connection's future, so it
/// is a named future rather than an `async` block, which would keep the
/// arguments beside the write and a wrapper around it (168 bytes with an
/// `Arc<[u8]>` answer, against 104 here).
struct SendAll<'s, 't, W, F, R> {
    stream: &'s TcpStream,
    limit: Option<Duration>,
    /// When the first write's wait runs out, set at its first poll that
    /// had to wait.
    due: Option<Instant>,
    step: Step<'t, W, R>,
    /// Makes the rest after a short write: [`send_rest`], a function item
    /// (no bytes), so the rest's future has a type and needs no pointer.
    rest: F,
}

enum Step<'t, W, R> {
    /// The first write (nearly always the only one), with the timer its
    /// wait uses.
    First { write: W, timer: &'t mut ConnTimer },
    /// After a short write, the rest, on the heap: only a client that
    /// reads slowly gets here.
    Rest(Pin<Box<R>>),
    /// Between the two.
    Moving,
}

impl<'s, 't, W, B, F, R> Future for SendAll<'s, 't, W, F, R>
where
    W: Future<Output = BufResult<usize, B>> + Unpin,
    B: IoBuf,
    F: Fn(&'s TcpStream, B, usize, Option<Duration>, &'t mut ConnTimer) -> R + Unpin,
    R: Future<Output = io::Result<()>>,
{
    type Output = io::Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Every field is `Unpin` (the write is the driver's named future,
        // the rest is boxed).
        let this = self.get_mut();
        if let Step::First { write, timer } = &mut this.step {
            let (res, buf) = match Pin::new(write).poll(cx) {
                Poll::Ready(out) => out,
                Poll::Pending if timer.write_timed_out(cx, this.limit, &mut this.due) => {
                    return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
                }
                Poll::Pending => return Poll::Pending,
            };
            let total = buf.bytes_init();
            match res? {
                0 if total > 0 => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                n if n >= total => return Poll::Ready(Ok(())),
                n => {
                    let Step::First { timer, .. } = std::mem::replace(&mut this.step, Step::Moving)
                    else {
                        unreachable!("matched above")
                    };
                    let rest = (this.rest)(this.stream, buf, n, this.limit, timer);
                    this.step = Step::Rest(Box::pin(rest));
                }
            }
        }
        match &mut this.step {
            Step::Rest(rest) => rest.as_mut().poll(cx),
            _ => unreachable!("a send is polled only until it returns"),
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
/// [`TcpStream::send_file`], in steps of [`SEND_FILE_STEP_BYTES`];
/// `UnexpectedEof` when the file ends first. `limit` bounds a time
/// without progress, as for every other write (nginx's `send_timeout`):
/// a step that has waited `limit` goes on if the client acknowledged
/// bytes meanwhile (`TcpStream::bytes_acked`; a step's own progress is
/// inside its future), so a slow reader is not cut while it reads.
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
        let mut send = pin!(stream.send_file(file, offset + done, step));
        // What the client had acknowledged as the step began (one
        // `getsockopt` per step: about 0.4 us, against the hundreds the
        // step's copying takes), read again each time the step has waited
        // its limit.
        let mut acked = limit.and_then(|_| stream.bytes_acked().ok());
        let sent = loop {
            match timer.write(send.as_mut(), limit).await {
                Ok(sent) => break sent?,
                Err(timed_out) => {
                    let now = stream.bytes_acked().ok();
                    match (acked, now) {
                        (Some(before), Some(now)) if now > before => acked = Some(now),
                        // No progress (or no way to tell): cut, as before.
                        _ => return Err(timed_out),
                    }
                }
            }
        };
        if sent < step {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        done += sent;
    }
    Ok(())
}
