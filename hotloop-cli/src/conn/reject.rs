//! The error reply (400, 405, 408, 431, 501, 505) and the lingering close
//! after it.

use std::time::Duration;

use hotloop_proto as proto;

use super::linger::{linger, LINGER_QUIET};
use super::{Conn, ConnTimer};

/// Answers with an error status and closes gracefully: shut down writing
/// (the client reads the reply, then the end of stream), then read and
/// drop what the client still sends ([`linger()`]). The handler then ends
/// with [`super::Ending::Lingered`]: nothing is left to do at the close.
pub(crate) async fn reject<S: Conn>(stream: &mut S, status: u16, write_limit: Option<Duration>) {
    answer_and_linger(stream, proto::response_error(status), write_limit).await
}

/// [`reject`] with a reply of the caller's (one that closes the
/// connection, such as `serve static`'s 405 with its `Allow` field).
///
/// A reply or an end that fails or runs out of time leaves the connection
/// cut ([`Conn::cut`]), as any other connection given up on: over TLS on
/// io_uring the record written behind would otherwise keep the descriptor
/// open after the drop, for up to the driver's write linger (5 s).
pub(crate) async fn answer_and_linger<S, B>(stream: &mut S, reply: B, write_limit: Option<Duration>)
where
    S: Conn,
    B: hotloop::buf::IoBuf + std::ops::Deref<Target = [u8]>,
{
    let mut timer = ConnTimer::new();
    // A failed send has cut the connection already.
    if stream.send(reply, write_limit, &mut timer).await.is_err() {
        return;
    }
    // Bounded as the reply was: over TLS the end is a close_notify record,
    // which waits for room in the socket like any write.
    let limit = write_limit.unwrap_or(LINGER_QUIET);
    if !matches!(hotloop::time::timeout(limit, stream.shutdown_write()).await, Ok(Ok(()))) {
        stream.cut().await;
        return;
    }
    linger(stream, &mut timer).await
}

#[cfg(test)]
mod tests {
    use std::future::{pending, ready, Future};
    use std::io;
    use std::ops::Deref;
    use std::time::{Duration, Instant};

    use hotloop::buf::IoBuf;
    use hotloop::DriverKind;

    use super::*;
    use crate::conn::Ending;

    /// A connection whose reply is taken and whose end (a TLS
    /// close_notify) never finds room unless `ends`, and whose client has
    /// ended its side; it records whether it was cut.
    struct Client {
        ends: bool,
        cut: bool,
    }

    impl Conn for Client {
        type Buf = Vec<u8>;

        fn read_some(&mut self) -> impl Future<Output = io::Result<Vec<u8>>> {
            ready(Ok(Vec::new()))
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

        async fn shutdown_write(&mut self) -> io::Result<()> {
            if !self.ends {
                pending::<()>().await;
            }
            Ok(())
        }

        async fn cut(&mut self) {
            self.cut = true;
        }

        fn finish(
            &mut self,
            _ending: Ending,
            _limit: Option<Duration>,
        ) -> impl Future<Output = ()> {
            ready(())
        }

        fn input_probe(&self) -> hotloop::net::InputProbe {
            unreachable!("an error reply's linger does not peek")
        }
    }

    /// An error reply whose end runs out of time cuts the connection
    /// (over TLS on io_uring, the dropped close_notify kept the
    /// descriptor open for the driver's write linger); one that ends in
    /// time is not cut.
    #[hotloop::test(driver = "all")]
    async fn an_end_past_its_limit_cuts_the_connection(_driver: DriverKind) {
        let limit = Duration::from_millis(50);
        let mut stalled = Client { ends: false, cut: false };
        let start = Instant::now();
        reject(&mut stalled, 400, Some(limit)).await;
        assert!(stalled.cut, "given up on without a cut");
        assert!(start.elapsed() >= limit, "{:?}", start.elapsed());
        let mut ended = Client { ends: true, cut: false };
        reject(&mut ended, 400, Some(limit)).await;
        assert!(!ended.cut);
    }
}
