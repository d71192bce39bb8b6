//! An HTTP/2 connection's I/O, which tells a stream's frames from the
//! connection's own as they pass.
//!
//! Why: the idle timeout counts from the last progress, and on HTTP/2 a
//! byte read or written is not progress by itself. A client that sends a
//! PING every few seconds (answered by a PING of ours) and nothing else
//! would keep a connection, and every stream on it waiting for its
//! request's body or for flow-control window, open for good. So on HTTP/2
//! only the frames of a stream move the idle clock: `HEADERS`,
//! `CONTINUATION` and `DATA` with a payload, either way; `PING`,
//! `SETTINGS`, `WINDOW_UPDATE`, `PRIORITY`, `RST_STREAM` and `GOAWAY` do
//! not (nginx's HTTP/2 idle timeout ignores them too).
//!
//! Only the 9-byte frame headers are looked at, in the plaintext (under
//! TLS, after decryption): a few comparisons per frame.

use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::rt::ReadBufCursor;

use super::deadline::{Socket, TimedIo};

/// The client's connection preface, which comes before its first frame.
const PREFACE_LEN: u32 = 24;

/// `DATA`, `HEADERS` and `CONTINUATION`: the frame types of a stream's
/// request or answer.
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const CONTINUATION: u8 = 9;

/// Where a direction's bytes are in the sequence of frames.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct FrameScan {
    /// Bytes still to pass before the next frame header: the rest of a
    /// payload (or of the client's preface).
    skip: u32,
    /// The next frame header, as far as it has come.
    head: [u8; 9],
    /// How much of [`FrameScan::head`] has come.
    have: u8,
}

impl FrameScan {
    /// A scan of what the client sends, from its preface on.
    pub(super) fn client() -> Self {
        FrameScan { skip: PREFACE_LEN, ..Default::default() }
    }

    /// A scan of what the server writes (frames from the first byte).
    pub(super) fn server() -> Self {
        FrameScan::default()
    }

    /// Takes `bytes` in; true if a stream's frame header was among them.
    pub(super) fn feed(&mut self, mut bytes: &[u8]) -> bool {
        let mut stream = false;
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = bytes.len().min(self.skip as usize);
                self.skip -= n as u32;
                bytes = &bytes[n..];
                continue;
            }
            let have = usize::from(self.have);
            let n = bytes.len().min(9 - have);
            self.head[have..have + n].copy_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if have + n < 9 {
                self.have = (have + n) as u8;
                break;
            }
            self.have = 0;
            let len = u32::from_be_bytes([0, self.head[0], self.head[1], self.head[2]]);
            self.skip = len;
            stream |= match self.head[3] {
                HEADERS | CONTINUATION => true,
                DATA => len > 0,
                _ => false,
            };
        }
        stream
    }
}

/// The I/O hyper's HTTP/2 state gets: the connection's [`TimedIo`],
/// scanning both directions for a stream's frames.
pub(super) struct H2Io<I: Socket> {
    pub(super) io: TimedIo<I>,
    read: FrameScan,
    write: FrameScan,
}

impl<I: Socket> H2Io<I> {
    /// `io`, whose client has sent `prefix` (its preface first), not yet
    /// handed to hyper.
    pub(super) fn new(io: TimedIo<I>, prefix: &[u8]) -> Self {
        let mut read = FrameScan::client();
        if read.feed(prefix) {
            io.progress.stream_moved();
        }
        H2Io { io, read, write: FrameScan::server() }
    }

    /// Records what a write took of `bufs` (`n` bytes).
    fn wrote(&mut self, bufs: &[std::io::IoSlice<'_>], mut n: usize) {
        let mut stream = false;
        for buf in bufs {
            if n == 0 {
                break;
            }
            let take = buf.len().min(n);
            stream |= self.write.feed(&buf[..take]);
            n -= take;
        }
        if stream {
            self.io.progress.stream_moved();
        }
    }
}

impl<I: tokio::io::AsyncRead + Socket + Unpin> hyper::rt::Read for H2Io<I> {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let (io, scan) = (&mut this.io, &mut this.read);
        crate::buf::poll_read_hyper(buf, |rb| {
            let poll = Pin::new(&mut io.io).poll_read(cx, rb);
            io.progress.read(&poll, !rb.filled().is_empty());
            if scan.feed(rb.filled()) {
                io.progress.stream_moved();
            }
            poll
        })
    }
}

impl<I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Socket + Unpin> hyper::rt::Write
    for H2Io<I>
{
    #[inline]
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = poll {
            self.wrote(&[std::io::IoSlice::new(buf)], n);
        }
        poll
    }

    #[inline]
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = poll {
            self.wrote(bufs, n);
        }
        poll
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        hyper::rt::Write::is_write_vectored(&self.io)
    }

    #[inline]
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    #[inline]
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, len: usize) -> Vec<u8> {
        let mut f = (len as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, 0, 0, 0, 0, 1]);
        f.extend(vec![7u8; len]);
        f
    }

    #[test]
    fn only_a_streams_frames_count_however_the_bytes_are_cut() {
        let mut client = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        client.extend(frame(4, 6)); // SETTINGS
        client.extend(frame(6, 8)); // PING
        client.extend(frame(8, 4)); // WINDOW_UPDATE
        client.extend(frame(0, 0)); // an empty DATA
        let mut whole = FrameScan::client();
        assert!(!whole.feed(&client), "no stream frame yet");
        // A HEADERS frame (whose payload looks like a PING's header), cut
        // at every byte.
        let mut headers = frame(1, 12);
        headers[9..18].copy_from_slice(&frame(6, 8)[..9]);
        let mut seen = 0;
        for b in headers.chunks(1) {
            seen += usize::from(whole.feed(b));
        }
        assert_eq!(seen, 1);
        assert!(!whole.feed(&frame(6, 8)));
        assert!(whole.feed(&frame(0, 3)), "DATA with a payload");
        assert!(whole.feed(&frame(9, 3)), "CONTINUATION");
        let mut server = FrameScan::server();
        assert!(!server.feed(&frame(4, 0)));
        assert!(server.feed(&[frame(6, 8), frame(1, 5)].concat()));
    }
}
