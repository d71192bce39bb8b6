//! The rest of a written-behind send whose stream was dropped: the driver
//! keeps it going, part after part, under one operation key, until every
//! byte is sent, the socket fails or its deadline passes.

use std::os::fd::AsRawFd;
use std::time::Instant;

use io_uring::{opcode, squeue, types};

use super::SharedFd;

/// A `send` entry for `bytes` (no `SIGPIPE` on a closed peer).
pub(super) fn send_entry(fd: std::os::fd::RawFd, bytes: &[u8]) -> squeue::Entry {
    opcode::Send::new(types::Fd(fd), bytes.as_ptr(), bytes.len().min(u32::MAX as usize) as u32)
        .flags(libc::MSG_NOSIGNAL)
        .build()
}

/// The rest of a written-behind send whose stream was dropped, kept going
/// by the driver (its slot's state in `op.rs`).
pub(super) struct LingeringWrite {
    /// The bytes and how many of them the kernel has taken.
    buf: Vec<u8>,
    sent: usize,
    /// The socket, open until this write ends.
    fd: SharedFd,
    /// When the rest is given up.
    deadline: Instant,
    /// True while the entry in flight is a `POLLOUT` wait, not a send.
    awaiting_room: bool,
}

impl LingeringWrite {
    /// A lingering write of `buf[sent..]` on `fd`, given up at `deadline`.
    pub(super) fn new(buf: Vec<u8>, sent: usize, fd: SharedFd, deadline: Instant) -> Self {
        LingeringWrite { buf, sent, fd, deadline, awaiting_room: false }
    }

    /// The entry that sends what is left (the first, or after a part).
    pub(super) fn send_entry(&self) -> squeue::Entry {
        send_entry(self.fd.as_raw_fd(), &self.buf[self.sent..])
    }

    /// When the rest is given up.
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Takes the result `res` of the entry in flight; returns the next
    /// entry to submit under the same key, or `None` when the write is
    /// over (all sent, failed, or past its deadline).
    ///
    /// The returned entry points into `self.buf`, which stays in the
    /// driver's slot, at the same heap address, until the next completion.
    pub(super) fn next_entry(&mut self, res: i32) -> Option<squeue::Entry> {
        if self.awaiting_room {
            self.awaiting_room = false;
            if res < 0 {
                return None;
            }
        } else if res > 0 {
            self.sent += res as usize;
        } else if res == -libc::EAGAIN || res == -libc::EINTR {
            if Instant::now() >= self.deadline {
                return None;
            }
            self.awaiting_room = true;
            return Some(
                opcode::PollAdd::new(types::Fd(self.fd.as_raw_fd()), libc::POLLOUT as u32).build(),
            );
        } else {
            // The peer is gone (an error) or took nothing (0): nothing
            // more can be delivered.
            return None;
        }
        if self.sent >= self.buf.len() || Instant::now() >= self.deadline {
            return None;
        }
        Some(self.send_entry())
    }
}
