//! What an HTTP/2 backend says about its connection, read off its frames
//! as they pass, and the streams the proxy has open on it.
//!
//! Why: hyper's client neither tells the peer's
//! `SETTINGS_MAX_CONCURRENT_STREAMS` nor refuses a request above it: h2
//! queues the stream until another ends, while the request's header
//! timeout counts, and the timeout's `504` then blames a backend that was
//! only full. The pool counts the streams it hands out on each connection
//! against the peer's limit and opens another connection when every one
//! is full; it needs the limit for that, and whether the peer sent
//! `GOAWAY` (no new stream may go on that connection).
//!
//! Only the 9-byte frame headers are looked at, and the payloads of
//! `SETTINGS` frames (6 bytes a setting), in the plaintext (under TLS,
//! after decryption): a few comparisons per frame.

use std::cell::Cell;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Instant;

/// The streams assumed allowed until the peer's first `SETTINGS` has been
/// read (RFC 9113 section 6.5.2 recommends at least 100).
const DEFAULT_MAX_STREAMS: u32 = 100;

const SETTINGS: u8 = 4;
const GOAWAY: u8 = 7;
const ACK: u8 = 1;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 3;

/// One HTTP/2 backend connection's peer state, shared by its I/O (which
/// fills it in) and the pool (which reads it).
pub struct Peer {
    /// The peer's limit on the streams the proxy may have open at once.
    max_streams: Cell<u32>,
    /// The peer's first `SETTINGS` was read, or its end came.
    settled: Cell<bool>,
    /// The peer sent `GOAWAY`, or its end came: no new stream on it.
    going_away: Cell<bool>,
    /// Streams the proxy has open on the connection ([`Stream`]).
    open: Cell<u32>,
    /// When its last stream ended (or it opened).
    idle_since: Cell<Instant>,
    /// The wait for the first `SETTINGS` ([`Peer::settled`]).
    waker: Cell<Option<Waker>>,
}

impl Peer {
    /// A connection's state before the peer has said anything.
    pub fn new() -> Rc<Peer> {
        Rc::new(Peer {
            max_streams: Cell::new(DEFAULT_MAX_STREAMS),
            settled: Cell::new(false),
            going_away: Cell::new(false),
            open: Cell::new(0),
            idle_since: Cell::new(hotloop::time::now()),
            waker: Cell::new(None),
        })
    }

    /// Whether another stream may go on the connection now.
    pub fn has_room(&self) -> bool {
        !self.going_away.get() && self.open.get() < self.max_streams.get()
    }

    /// Whether the peer said `GOAWAY` (or ended the connection).
    pub fn going_away(&self) -> bool {
        self.going_away.get()
    }

    /// Streams open on it now.
    pub fn open_streams(&self) -> u32 {
        self.open.get()
    }

    /// When its last stream ended (or it opened).
    pub fn idle_since(&self) -> Instant {
        self.idle_since.get()
    }

    /// Counts one more stream open on the connection until the returned
    /// guard is dropped.
    pub fn take_stream(self: &Rc<Self>) -> Stream {
        self.open.set(self.open.get() + 1);
        Stream(self.clone())
    }

    /// Waits for the peer's first `SETTINGS` (the first frame a server
    /// sends, RFC 9113 section 3.4), or the connection's end.
    pub async fn settled(&self) {
        poll_fn(|cx| {
            if self.settled.get() {
                return Poll::Ready(());
            }
            self.waker.set(Some(cx.waker().clone()));
            Poll::Pending
        })
        .await
    }

    fn settle(&self) {
        self.settled.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    fn ended(&self) {
        self.going_away.set(true);
        self.settle();
    }
}

/// One stream the proxy has open on an HTTP/2 connection: counted until
/// dropped (when its answer's body ended, or the exchange gave up).
pub struct Stream(Rc<Peer>);

impl Drop for Stream {
    fn drop(&mut self) {
        let open = self.0.open.get().saturating_sub(1);
        self.0.open.set(open);
        if open == 0 {
            self.0.idle_since.set(hotloop::time::now());
        }
    }
}

/// Where the peer's bytes are in its sequence of frames.
#[derive(Debug, Default)]
struct Scan {
    /// Payload bytes still to pass before the next frame header.
    skip: u32,
    /// Payload bytes of a `SETTINGS` frame still to read.
    settings: u32,
    /// The next frame header, as far as it has come.
    head: [u8; 9],
    have: u8,
    /// The setting being read, as far as it has come.
    entry: [u8; 6],
    entry_have: u8,
}

impl Scan {
    fn feed(&mut self, peer: &Peer, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.settings > 0 {
                let n = (self.settings as usize).min(bytes.len());
                for &b in &bytes[..n] {
                    self.entry[self.entry_have as usize] = b;
                    self.entry_have += 1;
                    if self.entry_have == 6 {
                        self.entry_have = 0;
                        let id = u16::from_be_bytes([self.entry[0], self.entry[1]]);
                        let value = u32::from_be_bytes([
                            self.entry[2],
                            self.entry[3],
                            self.entry[4],
                            self.entry[5],
                        ]);
                        if id == SETTINGS_MAX_CONCURRENT_STREAMS {
                            peer.max_streams.set(value);
                        }
                    }
                }
                self.settings -= n as u32;
                bytes = &bytes[n..];
                if self.settings == 0 {
                    peer.settle();
                }
                continue;
            }
            if self.skip > 0 {
                let n = (self.skip as usize).min(bytes.len());
                self.skip -= n as u32;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.have as usize).min(bytes.len());
            self.head[self.have as usize..self.have as usize + n].copy_from_slice(&bytes[..n]);
            self.have += n as u8;
            bytes = &bytes[n..];
            if self.have < 9 {
                continue;
            }
            self.have = 0;
            let len = u32::from_be_bytes([0, self.head[0], self.head[1], self.head[2]]);
            let (kind, flags) = (self.head[3], self.head[4]);
            match kind {
                SETTINGS if flags & ACK == 0 => {
                    self.entry_have = 0;
                    self.settings = len;
                    if len == 0 {
                        peer.settle();
                    }
                }
                GOAWAY => {
                    peer.going_away.set(true);
                    self.skip = len;
                }
                _ => self.skip = len,
            }
        }
    }
}

/// What an HTTP/2 backend connection's reads tell its [`Peer`]: the
/// frames as they pass, and the connection's end (also when the socket is
/// dropped).
pub struct FrameWatch {
    peer: Rc<Peer>,
    scan: Scan,
}

impl FrameWatch {
    /// A watch that keeps `peer` up to date.
    pub fn new(peer: Rc<Peer>) -> FrameWatch {
        FrameWatch { peer, scan: Scan::default() }
    }

    /// Takes in what a read gave: `got`, or the end (nothing read) or an
    /// error (`ok` false).
    pub fn read(&mut self, ok: bool, got: &[u8]) {
        if ok && !got.is_empty() {
            self.scan.feed(&self.peer, got);
        } else {
            self.peer.ended();
        }
    }
}

impl Drop for FrameWatch {
    fn drop(&mut self) {
        self.peer.ended();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags, 0, 0, 0, 0];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn the_stream_limit_and_goaway_are_read_across_any_split() {
        let mut bytes = frame(0, 0, b"data before");
        bytes.extend(frame(SETTINGS, 0, &[0, 4, 0, 0, 255, 255, 0, 3, 0, 0, 0, 2]));
        bytes.extend(frame(SETTINGS, ACK, &[]));
        bytes.extend(frame(GOAWAY, 0, &[0, 0, 0, 1, 0, 0, 0, 0]));
        for step in [1, 2, 5, 9, 1000] {
            let peer = Peer::new();
            let mut scan = Scan::default();
            for chunk in bytes.chunks(step) {
                scan.feed(&peer, chunk);
            }
            assert_eq!(peer.max_streams.get(), 2, "split by {step}");
            assert!(peer.settled.get() && peer.going_away(), "split by {step}");
        }
    }

    #[test]
    fn streams_are_counted_against_the_limit() {
        let peer = Peer::new();
        peer.max_streams.set(2);
        let a = peer.take_stream();
        assert!(peer.has_room());
        let b = peer.take_stream();
        assert!(!peer.has_room());
        drop(a);
        assert!(peer.has_room());
        drop(b);
        assert_eq!(peer.open_streams(), 0);
    }
}
