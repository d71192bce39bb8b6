//! A listening socket on the epoll driver: one `accept4` per connection,
//! parked on readiness when the backlog is empty.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use super::source::SourceCore;
use super::{Direction, Driver};
use crate::driver::config::AcceptMode;
use crate::driver::contract::ListenerOps;
use crate::sys;

/// A listening socket owned by one epoll driver, closed when dropped.
pub(crate) struct ListenerSource {
    core: SourceCore,
}

impl ListenerSource {
    /// Wraps a listening socket, which always ends up waiting: registers it now.
    pub(crate) fn new(driver: &Rc<Driver>, fd: OwnedFd) -> io::Result<ListenerSource> {
        Ok(ListenerSource { core: SourceCore::registered(driver, fd)? })
    }

    /// Takes one connection, or parks the task until one comes. Every
    /// accept mode is one `accept4` per connection on epoll.
    pub(crate) fn poll_accept(
        &self,
        cx: &mut TaskContext<'_>,
        _mode: AcceptMode,
    ) -> Poll<io::Result<OwnedFd>> {
        self.core.poll_io(cx, Direction::Read, || sys::accept(self.fd()))
    }

    /// Takes one connection only if one is ready now.
    pub(crate) fn accept_now(&self, _mode: AcceptMode) -> Option<io::Result<OwnedFd>> {
        // Straight to the syscall: an edge for a connection that just came
        // in may not have been polled yet.
        match sys::accept(self.fd()) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            other => Some(other),
        }
    }

    /// None: epoll holds no accepted connection for the listener.
    pub(crate) fn take_accepted(&self) -> Option<io::Result<OwnedFd>> {
        None
    }
}

impl ListenerOps for ListenerSource {
    /// The raw descriptor.
    fn fd(&self) -> RawFd {
        self.core.fd()
    }

    /// The descriptor, borrowed.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.core.as_fd()
    }

    /// Ready at once: epoll accepts only when asked, so nothing is ever
    /// accepted on the listener's behalf.
    fn poll_accept_settled(&self, _cx: &mut TaskContext<'_>) -> Poll<()> {
        Poll::Ready(())
    }

    /// Nothing to do on epoll: a connection is accepted only when asked
    /// for, so the kernel's backlog holds the rest already.
    fn set_accept_room(&self, _room: usize) {}
}
