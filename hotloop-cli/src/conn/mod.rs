//! A connection as the hand-written handlers see it (`serve echo`, `http`
//! and `static`): the [`Conn`] trait, its plain TCP form, the
//! connection's one timer ([`ConnTimer`]), the send path and the error
//! reply with its lingering close.
//!
//! The handlers are generic over [`Conn`], so the plain path is compiled
//! for [`TcpStream`] itself (owned pooled buffers, no dynamic dispatch) and
//! the TLS path (`tls.rs`) separately for the TLS stream.
//!
//! Below every app: it imports no other module of the command but
//! `drain.rs` (the stop a connection's timer watches).

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

pub(crate) use reject::{answer_and_linger, reject, LINGER_MAX};
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
    /// connection's, which a write that has to wait may use.
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

    /// Called once the handler is done with the connection, before it is
    /// closed; `limit` bounds any last write.
    fn finish(&mut self, limit: Option<Duration>) -> impl Future<Output = ()>;

    /// A probe of the socket, for a peek at what waits in it while a read
    /// borrows the connection (see [`ConnTimer::read`]).
    fn input_probe(&self) -> InputProbe;
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

    /// Nothing to do: closing the descriptor is the end.
    fn finish(&mut self, _limit: Option<Duration>) -> impl Future<Output = ()> {
        std::future::ready(())
    }

    fn input_probe(&self) -> InputProbe {
        TcpStream::input_probe(self)
    }
}
