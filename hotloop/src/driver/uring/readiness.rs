//! A descriptor the io_uring driver only watches (a pidfd, a Unix datagram
//! socket whose calls std makes): one-shot `POLL_ADD`s say when to try
//! again.

use std::cell::Cell;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use super::source::SourceCore;
use super::Driver;
use crate::driver::contract::ReadinessOps;
use crate::slab::Key;

/// A watched descriptor owned by one io_uring driver.
pub(crate) struct ReadinessSource {
    core: SourceCore,
    /// The `POLL_ADD` for `POLLIN` a wait is parked on, kept across polls
    /// by its key. Every task waiting to read is parked on it and woken by
    /// it (`waiters.rs`), as epoll's slot and tokio do.
    read_wait: Cell<Option<Key>>,
}

impl ReadinessSource {
    /// Wraps a descriptor.
    pub(crate) fn new(driver: &Rc<Driver>, fd: OwnedFd) -> ReadinessSource {
        ReadinessSource { core: SourceCore::new(driver, fd), read_wait: Cell::new(None) }
    }
}

impl ReadinessOps for ReadinessSource {
    /// The descriptor, borrowed.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.core.as_fd()
    }

    /// Ready once a one-shot `POLL_ADD` for `POLLIN` completes (see
    /// [`crate::driver::ReadinessSource::poll_next_readable`]); the entry is
    /// kept across polls, and a new one is made after each completion.
    fn poll_next_readable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        let cqe = std::task::ready!(self.core.poll_kept(&self.read_wait, libc::POLLIN, cx))?;
        Poll::Ready(cqe.result().map(drop))
    }

    /// Ready once the descriptor polls writable (a one-shot `POLL_ADD`).
    async fn next_writable(&self) -> io::Result<()> {
        self.core.poll_events(libc::POLLOUT).await
    }
}

impl Drop for ReadinessSource {
    fn drop(&mut self) {
        // A wait still parked is cancelled; the core then settles.
        self.core.cancel_kept(&self.read_wait);
    }
}
