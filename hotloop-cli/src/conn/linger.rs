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
    let until = Instant::now() + LINGER_MAX;
    loop {
        let due = (Instant::now() + LINGER_QUIET).min(until);
        let got = {
            let read = pin!(stream.read_some());
            timer.read(read, Some(due), true).await
        };
        if got.is_none() {
            return;
        }
    }
}
