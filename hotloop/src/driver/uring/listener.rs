//! A listening socket on the io_uring driver: its connections come from
//! the accept queue the driver keeps for it (`accept.rs`).

use std::cell::Cell;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use super::source::SourceCore;
use super::Driver;
use crate::driver::config::AcceptMode;
use crate::driver::contract::ListenerOps;
use crate::driver::park::not_running;
use crate::slab::Key;
use crate::sys;

/// A listening socket owned by one io_uring driver.
pub(crate) struct ListenerSource {
    core: SourceCore,
    /// The accept queue, once the socket has been accepted on.
    queue: Cell<Option<Key>>,
    /// How many connections the owner will take (see `set_accept_room`).
    room: Cell<usize>,
}

impl ListenerSource {
    /// Wraps a listening socket.
    pub(crate) fn new(driver: &Rc<Driver>, fd: OwnedFd) -> ListenerSource {
        ListenerSource {
            core: SourceCore::new(driver, fd),
            queue: Cell::new(None),
            room: Cell::new(usize::MAX),
        }
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

    /// Takes one queued connection, or arms an accept and parks the task.
    fn poll_accept(&self, cx: &mut TaskContext<'_>, mode: AcceptMode) -> Poll<io::Result<OwnedFd>> {
        let driver = &self.core.driver;
        if !driver.entered.get() {
            return Poll::Ready(Err(not_running()));
        }
        let mut key = self.queue.get();
        let room = self.room.get();
        let got = driver.state.borrow_mut().poll_accept(
            &mut key,
            &self.core.fd,
            mode,
            room,
            Some(cx.waker()),
        );
        self.queue.set(key);
        match got {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }

    /// Takes one connection only if one is ready now: from the accept
    /// queue, else straight from the kernel's backlog with a non-blocking
    /// `accept4` (the multishot may not have run since the connection came
    /// in). For draining a listener when a server stops.
    fn accept_now(&self, mode: AcceptMode) -> Option<io::Result<OwnedFd>> {
        let _ = mode; // every mode drains the same queue and backlog
        if let Some(key) = self.queue.get() {
            if let Some(r) = self.core.driver.state.borrow_mut().take_queued(key) {
                return Some(r);
            }
        }
        match sys::accept(self.fd()) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            other => Some(other),
        }
    }

    /// Ready once the kernel holds no accept for this listener (after
    /// `set_accept_room(0)` stopped it): from then on no connection is
    /// taken from the socket's backlog on this listener's behalf, and
    /// [`Self::take_accepted`] finds every one that was.
    fn poll_accept_settled(&self, cx: &mut TaskContext<'_>) -> Poll<()> {
        let Some(key) = self.queue.get() else { return Poll::Ready(()) };
        if !self.core.driver.entered.get() {
            // Nothing can complete while the driver does not run.
            return Poll::Ready(());
        }
        if self.core.driver.state.borrow_mut().poll_accept_settled(key, cx.waker()) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Takes one connection the driver has already accepted, never the
    /// socket's backlog.
    fn take_accepted(&self) -> Option<io::Result<OwnedFd>> {
        let key = self.queue.get()?;
        self.core.driver.state.borrow_mut().take_queued(key)
    }

    /// Sets how many connections the owner will take from now on: no more
    /// are accepted ahead into the queue, and at zero the armed accept stops.
    fn set_accept_room(&self, room: usize) {
        if self.room.replace(room) != room {
            self.core.driver.state.borrow_mut().set_accept_room(self.queue.get(), room);
        }
    }
}

impl Drop for ListenerSource {
    fn drop(&mut self) {
        // The queue's connections nobody took are closed, and the accept
        // in flight is withdrawn or cancelled; the core then settles, so a
        // listener dropped outside its runtime stops accepting now.
        if let Some(key) = self.queue.get() {
            if let Ok(mut st) = self.core.driver.state.try_borrow_mut() {
                st.release_listener(key);
            }
        }
    }
}
