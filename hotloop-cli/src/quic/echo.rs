//! `serve quic`: every bidirectional stream a client opens gets back what
//! it sends, until the client finishes the stream; then the server
//! finishes its side.

use std::rc::Rc;
use std::sync::Arc;

use hotloop::time::timeout;
use quinn::{RecvStream, SendStream, VarInt};

use super::settings::{Settings, CLOSE_REASON, CLOSE_STOPPING, RESET_SEND_TIMEOUT};
use super::streams::{streams_done, Open, Streams};
use crate::drain;

/// The most bytes taken from a stream per read (it is written back as it
/// is, so a stream's echo holds at most this much of its own).
const CHUNK_BYTES_MAX: usize = 64 * 1024;

/// A task per stream; when the server stops, the open streams finish and
/// the connection closes.
pub(super) async fn echo_connection(conn: quinn::Connection, settings: &Arc<Settings>) {
    let streams = Rc::new(Streams::default());
    loop {
        match drain::until_stop(conn.accept_bi()).await {
            Some(Ok((send, recv))) => {
                let open = Open::new(streams.clone());
                drop(hotloop::spawn(echo_stream(send, recv, open, settings.clone())));
            }
            // Closed by the client, timed out or lost.
            Some(Err(_)) => return,
            None => break,
        }
    }
    // Stopping: the streams in flight are answered, then the connection closes.
    if streams_done(&streams, &conn).await {
        conn.close(VarInt::from_u32(CLOSE_STOPPING), CLOSE_REASON);
    }
    // The endpoint sends the close; `conn` going out of scope does not undo it.
}

/// Echoes one stream until the client finishes it, then finishes ours and
/// waits until the client has everything.
async fn echo_stream(mut send: SendStream, mut recv: RecvStream, _open: Open, s: Arc<Settings>) {
    loop {
        match recv.read_chunk(CHUNK_BYTES_MAX, true).await {
            Ok(Some(chunk)) => {
                hotloop_proto::spin_work(s.work_us);
                let write = send.write_chunk(chunk.bytes);
                let written = match s.send_timeout {
                    Some(t) => matches!(timeout(t, write).await, Ok(Ok(()))),
                    None => write.await.is_ok(),
                };
                if !written {
                    let _ = send.reset(VarInt::from_u32(RESET_SEND_TIMEOUT));
                    let _ = recv.stop(VarInt::from_u32(RESET_SEND_TIMEOUT));
                    return;
                }
            }
            Ok(None) => break,
            // Reset by the client, or the connection is gone.
            Err(_) => return,
        }
    }
    if send.finish().is_ok() {
        // Until the client has acknowledged it all: a stop closing the
        // connection now would lose the end of the echo.
        let _ = send.stopped().await;
    }
}
