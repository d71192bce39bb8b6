//! A connection as the hand-written handlers see it (`serve echo`, `http`
//! and `static`): the [`Conn`] trait, its plain TCP form, the
//! connection's one timer ([`ConnTimer`]), the send path, the error
//! reply, the lingering close after it or after a last answer, the
//! client's bytes kept between reads ([`Pending`]), and a request body
//! read only to be dropped ([`discard_body`]).
//!
//! The handlers are generic over [`Conn`], so the plain path is compiled
//! for [`TcpStream`] itself (owned pooled buffers, no dynamic dispatch) and
//! the TLS path (`tls.rs`) separately for the TLS stream.
//!
//! Below every app: it imports no other module of the command but
//! `drain.rs` (the stop a connection's timer watches).

mod awaiting;
mod discard;
mod linger;
mod pending;
mod reject;
mod send;
mod timer;

use std::future::Future;
use std::io;
use std::net::Shutdown;
use std::ops::Deref;
use std::time::Duration;

use hotloop::buf::{IoBuf, PooledBuf};
use hotloop::net::{InputProbe, TcpStream};

pub(crate) use awaiting::Awaiting;
pub(crate) use discard::{discard_body, Discarded};
pub(crate) use linger::{linger, LINGER_QUIET};
pub(crate) use pending::Pending;
pub(crate) use reject::{answer_and_linger, reject};
use send::{send, send_file_tcp};
pub(crate) use timer::ConnTimer;

/// A connection the echo and http handlers serve: plain TCP, or TLS over it.
/// The handlers read and write in turn, never both at once, hence `&mut`.
///
/// The methods return `impl Future` rather than being `async fn`s so that
/// the `TcpStream` impl hands back the stream's own futures, with no
/// wrapper around them.
pub(crate) trait Conn {
    /// What a read returns.
    type Buf: IoBuf + Deref<Target = [u8]> + Default;

    /// Reads what has arrived; empty when the peer closed its side.
    /// Dropping the future loses no data the caller has not seen.
    fn read_some(&mut self) -> impl Future<Output = io::Result<Self::Buf>>;

    /// Writes all of `buf`, giving up with `TimedOut` when the writes make
    /// no progress for `limit` (the client does not read). `timer` is the
    /// connection's, which a write that has to wait may use. A failed send
    /// has cut the connection ([`Conn::cut`]).
    fn send<B: IoBuf + Deref<Target = [u8]>>(
        &mut self,
        buf: B,
        limit: Option<Duration>,
        timer: &mut ConnTimer,
    ) -> impl Future<Output = io::Result<()>>;

    /// Sends `len` bytes of `file` from `offset`, giving up as [`Conn::send`]
    /// does; `UnexpectedEof` when the file ends first (it shrank).
    fn send_file(
        &mut self,
        file: &hotloop::fs::File,
        offset: u64,
        len: u64,
        limit: Option<Duration>,
        timer: &mut ConnTimer,
    ) -> impl Future<Output = io::Result<()>>;

    /// Ends the writing side (after all that was sent).
    fn shutdown_write(&mut self) -> impl Future<Output = io::Result<()>>;

    /// Ends the connection now, whatever is still in flight on it: for a
    /// connection given up on (a write past its limit) before it is dropped.
    fn cut(&mut self) -> impl Future<Output = ()>;

    /// Called once the handler is done with the connection, before it is
    /// closed: `ending` says how the handler left it, and `limit` bounds
    /// any last write.
    fn finish(&mut self, ending: Ending, limit: Option<Duration>) -> impl Future<Output = ()>;

    /// A probe of the socket, for a peek at what waits in it while a read
    /// borrows the connection (see [`ConnTimer::read`]).
    fn input_probe(&self) -> InputProbe;
}

/// How a handler left its connection, which decides what closing it
/// takes ([`Conn::finish`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The client ended it, a read or a write failed, or a deadline
    /// passed with nothing owed to the client: close.
    Cut,
    /// The server ends it after a whole answer (`Connection: close`,
    /// HTTP/1.0, a stop); `unread` when the client had sent bytes after
    /// the answered request that were never parsed (a pipelining client,
    /// whose next bytes may still be on the way: nginx lingers then too).
    /// Closing with bytes unread in the socket sends a reset, which can
    /// destroy the answer's tail before the client reads it, so the close
    /// lingers then, or when the socket has input waiting.
    Answered { unread: bool },
    /// Closed gracefully already (an error reply and its lingering
    /// close, [`reject()`]): nothing is left to do.
    Lingered,
}

impl Conn for TcpStream {
    type Buf = PooledBuf;

    fn read_some(&mut self) -> impl Future<Output = io::Result<PooledBuf>> {
        self.read_pooled()
    }

    fn send<B: IoBuf + Deref<Target = [u8]>>(
        &mut self,
        buf: B,
        limit: Option<Duration>,
        timer: &mut ConnTimer,
    ) -> impl Future<Output = io::Result<()>> {
        send(self, buf, limit, timer)
    }

    fn send_file(
        &mut self,
        file: &hotloop::fs::File,
        offset: u64,
        len: u64,
        limit: Option<Duration>,
        timer: &mut ConnTimer,
    ) -> impl Future<Output = io::Result<()>> {
        send_file_tcp(self, file, offset, len, limit, timer)
    }

    fn shutdown_write(&mut self) -> impl Future<Output = io::Result<()>> {
        self.shutdown_with(Shutdown::Write)
    }

    /// Nothing before the drop: a plain write is an owned one, cancelled
    /// with its future, so no write outlives the stream, and closing the
    /// descriptor ends the connection.
    fn cut(&mut self) -> impl Future<Output = ()> {
        std::future::ready(())
    }

    /// After an answer the server closes on, with bytes of the client's
    /// left unread (in the handler's buffer, the driver's receive queue, or
    /// the socket: one peek, only here), shuts down writing and lingers ([`linger()`]); otherwise
    /// closing the descriptor is the end. The lingering is boxed: it is
    /// rare, and its state (a timer, a read) would otherwise be part of
    /// every connection's future.
    #[allow(clippy::manual_async_fn)]
    fn finish(&mut self, ending: Ending, _limit: Option<Duration>) -> impl Future<Output = ()> {
        async move {
            let Ending::Answered { unread } = ending else { return };
            if unread || self.input_pending().unwrap_or(false) {
                Box::pin(shut_and_linger(self)).await
            }
        }
    }

    fn input_probe(&self) -> InputProbe {
        TcpStream::input_probe(self)
    }
}

/// Shuts down writing (after all that was sent) and lingers.
async fn shut_and_linger(stream: &mut TcpStream) {
    if stream.shutdown_with(Shutdown::Write).await.is_ok() {
        linger(stream, &mut ConnTimer::new()).await;
    }
}
