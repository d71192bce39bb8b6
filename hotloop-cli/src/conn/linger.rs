//! The lingering close: once the server has ended its side of a
//! connection, what the client still sends is read and dropped before
//! the descriptor is closed.

use std::pin::pin;
use std::time::{Duration, Instant};

use super::{Conn, ConnTimer};

/// The longest a lingering close waits in all (nginx's `lingering_time`).
pub(crate) const LINGER_MAX: Duration = Duration::from_secs(30);
/// How long a lingering close waits for the client's next bytes: it ends
/// once the client has sent nothing for this long (nginx's
/// `lingering_timeout`, with a shorter bound: 2 s rather than 5 s, to free
/// the descriptor sooner). Also the longest a TLS end waits to write its
/// close_notify before it lingers.
pub(crate) const LINGER_QUIET: Duration = Duration::from_secs(2);

/// Reads and drops what the client sends after the server's end (its
/// write side shut down already), until the client's own end, until the
/// client has sent nothing for [`LINGER_QUIET`], or for at most
/// [`LINGER_MAX`] in all; when the server stops, until the connection has
/// been quiet for the drain's idle quiet.
///
/// Closing with unread bytes makes the kernel send a reset, which can
/// destroy the last answer before the client reads it (RFC 9112 section
/// 9.6; nginx's `lingering_close`), and so do bytes that reach the socket
/// after its close. The wait is counted from the client's last bytes, not
/// from the answer: a client still sending (a request body the server
/// refused, a run of pipelined requests) is read to its end, as nginx
/// reads it; what the server still has to send does not matter, since a
/// close with nothing unread leaves the kernel sending it.
pub(crate) async fn linger<S: Conn>(stream: &mut S, timer: &mut ConnTimer) {
    linger_for(stream, timer, LINGER_MAX).await
}

/// [`linger()`] for at most `max` in all. The limit is checked before
/// each read, not only by the read's deadline: a read that finds bytes
/// waiting returns them before its deadline is looked at, so a client
/// that keeps sending would otherwise be read for as long as it sends
/// (nginx's `lingering_time` is a bound on the whole close too).
async fn linger_for<S: Conn>(stream: &mut S, timer: &mut ConnTimer, max: Duration) {
    let until = Instant::now() + max;
    loop {
        let now = Instant::now();
        if now >= until {
            return;
        }
        let due = (now + LINGER_QUIET).min(until);
        let got = {
            let read = pin!(stream.read_some());
            timer.read(read, Some(due), true).await
        };
        if got.is_none() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::{ready, Future};
    use std::io;
    use std::ops::Deref;

    use hotloop::buf::IoBuf;
    use hotloop::DriverKind;

    use super::*;
    use crate::conn::Ending;

    /// A client whose bytes are always there to read, until `sends_for`
    /// has passed (then its end).
    struct Streaming {
        since: Instant,
        sends_for: Duration,
    }

    impl Conn for Streaming {
        type Buf = Vec<u8>;

        fn read_some(&mut self) -> impl Future<Output = io::Result<Vec<u8>>> {
            ready(Ok(if self.since.elapsed() < self.sends_for { vec![b'x'; 64] } else { vec![] }))
        }

        fn send<B: IoBuf + Deref<Target = [u8]>>(
            &mut self,
            _buf: B,
            _limit: Option<Duration>,
            _timer: &mut ConnTimer,
        ) -> impl Future<Output = io::Result<()>> {
            ready(Ok(()))
        }

        fn send_file(
            &mut self,
            _file: &hotloop::fs::File,
            _offset: u64,
            _len: u64,
            _limit: Option<Duration>,
            _timer: &mut ConnTimer,
        ) -> impl Future<Output = io::Result<()>> {
            ready(Err(io::ErrorKind::Unsupported.into()))
        }

        fn shutdown_write(&mut self) -> impl Future<Output = io::Result<()>> {
            ready(Ok(()))
        }

        fn cut(&mut self) -> impl Future<Output = ()> {
            ready(())
        }

        fn finish(
            &mut self,
            _ending: Ending,
            _limit: Option<Duration>,
        ) -> impl Future<Output = ()> {
            ready(())
        }

        fn input_probe(&self) -> hotloop::net::InputProbe {
            unreachable!("a linger does not peek")
        }
    }

    /// A client that keeps sending is read for the lingering close's
    /// limit, not for as long as it sends: each read found bytes waiting
    /// and returned them before its deadline was looked at, so the limit
    /// never ended the close.
    #[hotloop::test(driver = "all")]
    async fn a_client_that_keeps_sending_is_lingered_on_for_the_limit_only(_driver: DriverKind) {
        let max = Duration::from_millis(100);
        let mut client = Streaming { since: Instant::now(), sends_for: Duration::from_secs(3) };
        linger_for(&mut client, &mut ConnTimer::new(), max).await;
        let took = client.since.elapsed();
        assert!(took >= max && took < Duration::from_secs(2), "lingered {took:?}");
    }
}
