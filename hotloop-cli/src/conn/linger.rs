//! The lingering close: once the server has ended its side of a
//! connection, what the client still sends is read and dropped before
//! the descriptor is closed.

use std::pin::pin;
use std::time::{Duration, Instant};

use super::{Conn, ConnTimer};

/// The most bytes a lingering close reads and drops.
pub(crate) const LINGER_BYTES_MAX: usize = 256 * 1024;
/// The longest a lingering close waits.
pub(crate) const LINGER_MAX: Duration = Duration::from_secs(2);

/// Reads and drops what the client sends after the server's end (its
/// write side shut down already), until the client's own end, for at most
/// [`LINGER_MAX`] and [`LINGER_BYTES_MAX`]; when the server stops, until
/// the connection has been quiet for the drain's idle quiet.
///
/// Closing with unread bytes makes the kernel send a reset, which can
/// destroy the last answer before the client reads it (RFC 9112 section
/// 9.6; nginx's `lingering_close`, with a shorter bound: 2 s rather than
/// nginx's 30 s, to free the descriptor sooner).
pub(crate) async fn linger<S: Conn>(stream: &mut S, timer: &mut ConnTimer) {
    let until = Instant::now() + LINGER_MAX;
    let mut drained = 0;
    while drained < LINGER_BYTES_MAX {
        let got = {
            let read = pin!(stream.read_some());
            timer.read(read, Some(until), true).await
        };
        match got {
            Some(b) => drained += b.len(),
            None => return,
        }
    }
}
