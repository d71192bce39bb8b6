//! A descriptor the epoll driver only watches (a pidfd, a Unix datagram
//! socket whose calls std makes): waits for its next edge.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use super::source::SourceCore;
use super::{Direction, Driver};
use crate::driver::contract::ReadinessOps;

/// A watched descriptor owned by one epoll driver, closed when dropped.
pub(crate) struct ReadinessSource {
    core: SourceCore,
}

impl ReadinessSource {
    /// Wraps a descriptor; in eager mode, registers it now.
    pub(crate) fn new(driver: &Rc<Driver>, fd: OwnedFd) -> io::Result<ReadinessSource> {
        Ok(ReadinessSource { core: SourceCore::new(driver, fd)? })
    }

    /// Parks until the next write event.
    pub(crate) fn poll_next_writable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        self.core.poll_next(cx, Direction::Write)
    }
}

impl ReadinessOps for ReadinessSource {
    /// The descriptor, borrowed.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.core.as_fd()
    }

    /// Parks until the next read event (see
    /// [`crate::driver::ReadinessSource::poll_next_readable`]).
    fn poll_next_readable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        self.core.poll_next(cx, Direction::Read)
    }

    /// Parks until the next write event.
    async fn next_writable(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_next_writable(cx)).await
    }
}
