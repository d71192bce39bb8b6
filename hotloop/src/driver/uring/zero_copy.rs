//! What keeps a zero-copy send's bytes alive after its future returned:
//! a `SEND_ZC` posts its result first and a notification once the kernel
//! no longer reads the pages, so another handle on the bytes
//! (`IoBuf::share`) waits here, by the send's `user_data`, until then.
//! The notification also says whether the kernel copied the bytes after
//! all; a socket that it copied for is marked, and its stream's later
//! writes are plain sends.

use std::any::Any;
use std::collections::HashMap;
use std::rc::{Rc, Weak};

use super::shared::{SharedFd, SockFd};

/// The keeps of the sends in flight, and the sockets marked as copied.
#[derive(Default)]
pub(super) struct ZeroCopyKeeps {
    /// By the send's `user_data`, until its notification.
    keeps: HashMap<u64, Keep>,
    /// Sockets whose zero-copy sends a notification said were copied after
    /// their stream took the result (a stream takes its mark at its next
    /// write, or forgets it when dropped), by `SockFd::mark`.
    copied_fds: Vec<i64>,
}

/// One send's keep.
struct Keep {
    /// Another handle on the bytes, never read.
    _bytes: Box<dyn Any>,
    /// The socket, to tell its stream if the kernel copied (only while it
    /// is open: the number cannot have been reused).
    fd: Weak<SockFd>,
}

impl ZeroCopyKeeps {
    /// Keeps `bytes`, another handle on the bytes of the zero-copy send
    /// `user_data` on `fd`, until its notification.
    pub(super) fn keep(&mut self, user_data: u64, bytes: Box<dyn Any>, fd: &SharedFd) {
        self.keeps.insert(user_data, Keep { _bytes: bytes, fd: Rc::downgrade(fd) });
    }

    /// The notification of the send `user_data`: its keep, if it has one,
    /// goes to `freed` (true), and its socket is marked if the kernel
    /// `copied`. False: no keep (the send's future had not taken its
    /// result, so its slot holds the buffer).
    pub(super) fn on_notification(
        &mut self,
        user_data: u64,
        copied: bool,
        freed: &mut Vec<Box<dyn Any>>,
    ) -> bool {
        let Some(keep) = self.keeps.remove(&user_data) else { return false };
        if let Some(fd) = keep.fd.upgrade().filter(|_| copied) {
            let fd = fd.mark();
            if !self.copied_fds.contains(&fd) {
                self.copied_fds.push(fd);
            }
        }
        freed.push(Box::new(keep));
        true
    }

    /// True (once) if `fd` was marked as copied; forgets the mark.
    pub(super) fn take_copied_mark(&mut self, fd: i64) -> bool {
        let before = self.copied_fds.len();
        self.copied_fds.retain(|&f| f != fd);
        self.copied_fds.len() != before
    }

    /// True while the kernel may still read some kept bytes.
    pub(super) fn is_empty(&self) -> bool {
        self.keeps.is_empty()
    }

    /// Leaks every keep: for a ring torn down while the kernel may still
    /// read them (freeing would hand it freed memory).
    pub(super) fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.keeps));
    }
}
