//! The rest of a written-behind send that its stream no longer waits for
//! (the stream was dropped, or shut down in both directions): the driver
//! keeps it going, part after part, under one operation key, until every
//! byte is in the kernel, the socket fails or its deadline passes.
//!
//! # Implementation notes
//! - The stream reported these bytes written, so they reach the kernel
//!   or the connection is reset. A write that ends short (the socket
//!   failed, or its deadline cut it) sets `SO_LINGER` to zero and
//!   disconnects the socket (`connect(2)` to `AF_UNSPEC`, which resets a
//!   TCP connection at once, even while a stream still holds the
//!   descriptor): a plain close would send the end of stream after the
//!   bytes the kernel has, and the peer would take a cut stream for a
//!   complete one.
//! - A Unix stream socket has no reset (`SO_LINGER` does nothing on it,
//!   `connect(2)` to `AF_UNSPEC` fails with `EINVAL`), so a cut write would
//!   read as a clean end after the bytes the kernel has: its stream never
//!   writes behind (`write_behind.rs`), and no lingering write is one's.
//! - A write handed over by a shutdown of both directions shuts the write
//!   side once its last byte is in the kernel, so the end of stream follows
//!   the data (as the kernel sends the bytes it holds before the FIN), and
//!   tells the stream how it ended ([`Handover`]), for the stream's flush.

use std::cell::Cell;
use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue};

use super::shared::{SharedFd, SockFd};
use crate::slab::Key;

/// The send deadline: how long a write the stream accepted keeps going
/// after the stream stopped waiting for it (dropped, or shut down in both
/// directions) before it is cut and the connection reset (a peer that
/// never reads cannot hold the socket, or a thread driving the ring off
/// its turn, for longer).
pub(crate) const WRITE_LINGER: Duration = Duration::from_secs(5);

/// A `send` entry for `bytes` (no `SIGPIPE` on a closed peer).
pub(super) fn send_entry(fd: &SockFd, bytes: &[u8]) -> squeue::Entry {
    fd.entry(|t| {
        opcode::Send::new(t, bytes.as_ptr(), bytes.len().min(u32::MAX as usize) as u32)
            .flags(libc::MSG_NOSIGNAL)
            .build()
    })
}

/// The deadlines of the lingering writes, oldest first, each with the
/// key of its operation slot (whose state, `Lingering`, holds the write).
/// Every write gets the same linger time from when it starts, so the
/// first deadline is the nearest.
#[derive(Default)]
pub(super) struct Lingering {
    deadlines: VecDeque<(Instant, Key)>,
}

impl Lingering {
    /// Records the write in slot `key`, which is cut at `deadline`.
    pub(super) fn push(&mut self, deadline: Instant, key: Key) {
        self.deadlines.push_back((deadline, key));
    }

    /// Forgets the writes whose deadline has passed, handing each one's
    /// key to `cut` (which cancels it if it still goes). Reads the clock
    /// only when a write lingers.
    pub(super) fn take_expired(&mut self, mut cut: impl FnMut(Key)) {
        let Some(&(first, _)) = self.deadlines.front() else { return };
        let now = Instant::now();
        if first > now {
            return;
        }
        while let Some(&(deadline, key)) = self.deadlines.front() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_front();
            cut(key);
        }
    }

    /// The deadline of the first write `going` says still goes, forgetting
    /// those ahead of it that ended.
    pub(super) fn first(&mut self, going: impl Fn(Key) -> bool) -> Option<Instant> {
        while let Some(&(deadline, key)) = self.deadlines.front() {
            if going(key) {
                return Some(deadline);
            }
            self.deadlines.pop_front();
        }
        None
    }
}

/// What the entry in flight does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Sends `buf[sent..]`.
    Send,
    /// Waits for room (`POLLOUT`) after the kernel answered `EAGAIN`.
    AwaitRoom,
    /// Shuts the write side, after the last byte (a handover only).
    ShutWrite,
}

/// The rest of a written-behind send whose stream no longer waits for it,
/// kept going by the driver (its slot's state in `lifecycle.rs`).
pub(super) struct LingeringWrite {
    /// The bytes and how many of them the kernel has taken.
    buf: Vec<u8>,
    sent: usize,
    /// The socket, open until this write ends.
    fd: SharedFd,
    /// When the rest is given up.
    deadline: Instant,
    step: Step,
    /// Why the write ended short (an `errno`); 0 otherwise.
    errno: i32,
    /// The stream's side of a write a shutdown of both directions handed
    /// over: the write side is shut after the last byte.
    handover: Option<Rc<Handover>>,
}

/// How a write that its stream handed over (a shutdown of both
/// directions) ends, kept for the stream's flush.
#[derive(Default)]
pub(super) struct Handover {
    /// `None` while the write goes on; then 0 if every byte reached the
    /// kernel and the write side was shut, else the `errno` that ended it.
    outcome: Cell<Option<i32>>,
    /// The tasks waiting for the outcome (a flush; several tasks may
    /// share the stream).
    waiters: Cell<Vec<Waker>>,
}

impl Handover {
    /// The poll form of [`Handover::poll_with`] (for tests).
    #[cfg(test)]
    pub(super) fn poll(&self, cx: &mut std::task::Context<'_>) -> Poll<io::Result<()>> {
        self.poll_with(Some(cx.waker()))
    }

    /// Ready once the handed-over write has ended: `Ok` if every byte
    /// reached the kernel before the write side was shut. Parks `waker`
    /// (beside any other task's) if given; without one it only looks.
    pub(super) fn poll_with(&self, waker: Option<&Waker>) -> Poll<io::Result<()>> {
        match self.outcome.get() {
            Some(0) => Poll::Ready(Ok(())),
            Some(errno) => Poll::Ready(Err(io::Error::from_raw_os_error(errno))),
            None => {
                if let Some(waker) = waker {
                    self.park(waker.clone());
                }
                Poll::Pending
            }
        }
    }

    /// Wakes `waker` when the write ends (once, however often it parks).
    fn park(&self, waker: Waker) {
        let mut waiters = self.waiters.take();
        if !waiters.iter().any(|w| w.will_wake(&waker)) {
            waiters.push(waker);
        }
        self.waiters.set(waiters);
    }

    /// Records the outcome; returns the tasks waiting for it.
    fn end(&self, errno: i32) -> Vec<Waker> {
        self.outcome.set(Some(errno));
        self.waiters.take()
    }
}

impl LingeringWrite {
    /// A lingering write of `buf[sent..]` on `fd`, given up at `deadline`;
    /// with `handover`, the write side is shut after the last byte.
    pub(super) fn new(
        buf: Vec<u8>,
        sent: usize,
        fd: SharedFd,
        deadline: Instant,
        handover: Option<Rc<Handover>>,
    ) -> Self {
        LingeringWrite { buf, sent, fd, deadline, step: Step::Send, errno: 0, handover }
    }

    /// The entry that goes on from here: the send of what is left or, once
    /// all is sent, the shutdown a handover asks for; `None` when nothing
    /// is left to do (then [`LingeringWrite::finish`] ends it).
    pub(super) fn first_entry(&mut self) -> Option<squeue::Entry> {
        if self.sent < self.buf.len() {
            self.step = Step::Send;
            return Some(send_entry(&self.fd, &self.buf[self.sent..]));
        }
        if self.handover.is_some() && self.step != Step::ShutWrite {
            self.step = Step::ShutWrite;
            return Some(self.fd.entry(|t| opcode::Shutdown::new(t, libc::SHUT_WR).build()));
        }
        None
    }

    /// When the rest is given up.
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// True once the write is to be given up: past its deadline.
    fn past_deadline(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// Takes the result `res` of the entry in flight; returns the next
    /// entry to submit under the same key, or `None` when the write is
    /// over (all sent, failed, or past its deadline): then
    /// [`LingeringWrite::finish`] ends it.
    ///
    /// The returned entry points into `self.buf`, which stays in the
    /// driver's slot, at the same heap address, until the next completion.
    pub(super) fn next_entry(&mut self, res: i32) -> Option<squeue::Entry> {
        match self.step {
            Step::ShutWrite => {
                self.errno = -res.min(0);
                return None;
            }
            Step::AwaitRoom if res < 0 => {
                self.errno = cut_or(-res);
                return None;
            }
            Step::AwaitRoom => {}
            Step::Send if res > 0 => self.sent += res as usize,
            Step::Send if res == -libc::EAGAIN || res == -libc::EINTR => {
                if self.past_deadline() {
                    self.errno = libc::ETIMEDOUT;
                    return None;
                }
                self.step = Step::AwaitRoom;
                return Some(
                    self.fd.entry(|t| opcode::PollAdd::new(t, libc::POLLOUT as u32).build()),
                );
            }
            // The peer is gone (an error), took nothing (0), or the
            // deadline cut the send (`ECANCELED`): nothing more goes.
            Step::Send => {
                self.errno = if res < 0 { cut_or(-res) } else { libc::EPIPE };
                return None;
            }
        }
        if self.sent < self.buf.len() && self.past_deadline() {
            self.errno = libc::ETIMEDOUT;
            return None;
        }
        self.first_entry()
    }

    /// Ends the write: one that ended short resets the connection, so the
    /// peer never takes what it got for the whole stream. Returns the
    /// tasks waiting for its outcome.
    pub(super) fn finish(&mut self) -> Vec<Waker> {
        if self.sent < self.buf.len() && self.errno == 0 {
            self.errno = libc::ETIMEDOUT;
        }
        if self.errno != 0 {
            abort(&self.fd);
        }
        self.handover.take().map(|h| h.end(self.errno)).unwrap_or_default()
    }

    /// Gives the write up where the driver cannot keep it (its state is
    /// borrowed, or the slot is gone): the connection is reset, and the
    /// buffer leaked, since the kernel may still read it.
    pub(super) fn abandon(mut self) {
        self.errno = libc::EIO;
        drop(self.finish());
        std::mem::forget(self);
    }
}

/// The `errno` a lingering write reports for `errno`: a send the deadline
/// cut (cancelled) timed out.
fn cut_or(errno: i32) -> i32 {
    if errno == libc::ECANCELED {
        libc::ETIMEDOUT
    } else {
        errno
    }
}

/// Resets the connection on `fd`: its peer reads an error, never a clean
/// end of stream after a cut.
/// A direct socket is reset through the plain descriptor its stream
/// installed when the write began to linger (`write_behind.rs`); without
/// one (the install failed) it closes as it is.
fn abort(fd: &SharedFd) {
    let Some(fd) = fd.owned() else { return };
    // Whoever closes the descriptor last then resets the connection.
    let _ = socket2::SockRef::from(fd).set_linger(Some(Duration::ZERO));
    // The reset goes now, while a stream may still hold the descriptor:
    // `connect(2)` to `AF_UNSPEC` disconnects a TCP socket, with a reset
    // from an open state. Other sockets refuse it and reset (or, as a
    // Unix stream socket, end) at the close.
    let unspec =
        libc::sockaddr { sa_family: libc::AF_UNSPEC as libc::sa_family_t, sa_data: [0; 14] };
    // SAFETY: passes a live `sockaddr` and its size; connect(2) only reads it.
    unsafe {
        libc::connect(
            std::os::fd::AsRawFd::as_raw_fd(fd),
            &unspec,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::OwnedFd;
    use std::task::{Context as TaskContext, Waker};

    use super::*;

    /// The opcode of `entry`.
    fn op(entry: squeue::Entry) -> u8 {
        entry.get_opcode() as u8
    }

    /// A connected loopback pair: ours as a shared descriptor, and the peer.
    fn pair() -> (SharedFd, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (peer, _) = l.accept().unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (Rc::new(SockFd::plain(OwnedFd::from(ours))), peer)
    }

    /// A handed-over write sends its parts, then shuts the write side, and
    /// only then tells the stream it ended well.
    #[test]
    fn a_handover_shuts_the_write_side_after_the_last_byte() {
        let (fd, _peer) = pair();
        let handover = Rc::new(Handover::default());
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut write = LingeringWrite::new(vec![1; 100], 20, fd, deadline, Some(handover.clone()));
        assert_eq!(op(write.first_entry().unwrap()), opcode::Send::CODE);
        let next = write.next_entry(30).expect("the rest is sent");
        assert_eq!(op(next), opcode::Send::CODE);
        assert_eq!(op(write.next_entry(-libc::EAGAIN).unwrap()), opcode::PollAdd::CODE);
        assert_eq!(op(write.next_entry(libc::POLLOUT as i32).unwrap()), opcode::Send::CODE);
        let shut = write.next_entry(50).expect("the write side is shut after the last byte");
        assert_eq!(op(shut), opcode::Shutdown::CODE);
        let mut cx = TaskContext::from_waker(Waker::noop());
        assert!(handover.poll(&mut cx).is_pending(), "ended before the shutdown");
        assert!(write.next_entry(0).is_none());
        drop(write.finish());
        assert!(matches!(handover.poll(&mut cx), Poll::Ready(Ok(()))));
    }

    /// A write cut at its deadline resets the connection at once, even
    /// while a stream still holds the descriptor: the peer reads an error,
    /// not an end of stream after what it got.
    #[test]
    fn a_write_cut_short_resets_the_connection() {
        let (fd, mut peer) = pair();
        let handover = Rc::new(Handover::default());
        let mut write = LingeringWrite::new(
            vec![1; 100],
            0,
            fd.clone(),
            Instant::now(),
            Some(handover.clone()),
        );
        assert!(write.next_entry(-libc::ECANCELED).is_none());
        drop(write.finish());
        drop(write);
        assert!(Rc::strong_count(&fd) == 1, "the stream's own reference is the last");
        let err = peer.read(&mut [0; 16]).expect_err("a clean end after a cut");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        let mut cx = TaskContext::from_waker(Waker::noop());
        match handover.poll(&mut cx) {
            Poll::Ready(Err(e)) => assert_eq!(e.kind(), io::ErrorKind::TimedOut),
            other => panic!("the flush got {other:?}"),
        }
    }

    /// Writes past their deadline are cut, every one, and leave no
    /// deadline to wake for.
    #[test]
    fn writes_past_their_deadline_are_cut() {
        let past = Instant::now() - Duration::from_secs(1);
        let (tcp, _tcp_peer) = pair();
        let mut write = LingeringWrite::new(vec![1; 100], 0, tcp, past, None);
        assert!(write.next_entry(-libc::EAGAIN).is_none(), "a late write waits for no room");
        let mut slots = crate::slab::Slab::default();
        let (first, second) = (slots.insert(()), slots.insert(()));
        let mut lingering = Lingering::default();
        lingering.push(past, first);
        lingering.push(past, second);
        let mut cut = Vec::new();
        lingering.take_expired(|k| cut.push(k));
        assert_eq!(cut, [first, second]);
        assert_eq!(lingering.first(|_| true), None, "no deadline left to wake for");
    }
}
