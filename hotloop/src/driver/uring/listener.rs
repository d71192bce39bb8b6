//! A listening socket on the io_uring driver: its connections come from
//! the accept queue the driver keeps for it (`accept.rs`), each a plain
//! descriptor or a direct socket in the ring's file table.

use std::cell::Cell;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use super::accept::Taken;
use super::shared::SharedFd;
use super::source::SourceCore;
use super::Driver;
use crate::coop;
use crate::driver::config::AcceptMode;
use crate::driver::contract::ListenerOps;
use crate::driver::park::not_running;
use crate::slab::Key;
use crate::sys;

/// A connection a listener accepted.
pub(crate) enum Accepted {
    /// A plain descriptor.
    Fd(OwnedFd),
    /// A direct socket in the accepting driver's file table.
    Direct(DirectSocket),
}

impl Accepted {
    /// The plain descriptor, if it is one (a direct socket takes none of
    /// the process's descriptors).
    pub(crate) fn raw_fd(&self) -> Option<RawFd> {
        match self {
            Accepted::Fd(fd) => Some(std::os::fd::AsRawFd::as_raw_fd(fd)),
            Accepted::Direct(_) => None,
        }
    }

    /// The connection as a plain descriptor (a direct socket gets one, and
    /// gives its slot back): for another worker or thread. On failure
    /// (descriptors ran out) the connection comes back with the error.
    pub(crate) fn into_fd(self) -> Result<OwnedFd, (io::Error, Accepted)> {
        let d = match self {
            Accepted::Fd(fd) => return Ok(fd),
            Accepted::Direct(d) => d,
        };
        if let Err(e) = d.driver.plain_fd(&d.fd) {
            return Err((e, Accepted::Direct(d)));
        }
        match Rc::try_unwrap(d.fd) {
            Ok(sock) => Ok(sock.into_plain().expect("just installed")),
            Err(fd) => Err((
                io::Error::other("a direct socket still in use cannot be handed on"),
                Accepted::Direct(DirectSocket { fd, driver: d.driver }),
            )),
        }
    }

    /// Wraps what the driver's queue held.
    fn from_taken(taken: Taken, driver: &Rc<Driver>) -> Accepted {
        match taken {
            Taken::Fd(fd) => Accepted::Fd(fd),
            Taken::Direct(fd) => {
                Accepted::Direct(DirectSocket { fd: Rc::new(fd), driver: driver.clone() })
            }
        }
    }
}

/// A connection accepted as a direct socket: a slot in one worker's ring,
/// usable only there until it gets a plain descriptor ([`Accepted::into_fd`]).
pub(crate) struct DirectSocket {
    fd: SharedFd,
    driver: Rc<Driver>,
}

impl DirectSocket {
    /// The driver whose ring holds the slot.
    pub(crate) fn driver(&self) -> &Rc<Driver> {
        &self.driver
    }

    /// The driver and the socket, for a stream on that driver.
    pub(super) fn into_parts(self) -> (Rc<Driver>, SharedFd) {
        (self.driver, self.fd)
    }
}

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

    /// Takes one queued connection, or arms an accept and parks the task.
    pub(crate) fn poll_accept(
        &self,
        cx: &mut TaskContext<'_>,
        mode: AcceptMode,
    ) -> Poll<io::Result<Accepted>> {
        let driver = &self.core.driver;
        if !driver.entered.get() {
            return Poll::Ready(Err(not_running()));
        }
        // A connection the multishot accept queued is taken without
        // waiting: under the task's budget (`coop.rs`).
        std::task::ready!(coop::poll_proceed(cx));
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
            Some(r) => {
                coop::spend();
                Poll::Ready(r.map(|t| Accepted::from_taken(t, driver)))
            }
            None => Poll::Pending,
        }
    }

    /// Takes one connection only if one is ready now: from the accept
    /// queue, else straight from the kernel's backlog with a non-blocking
    /// `accept4` (the multishot may not have run since the connection came
    /// in). For draining a listener when a server stops.
    pub(crate) fn accept_now(&self, mode: AcceptMode) -> Option<io::Result<Accepted>> {
        let _ = mode; // every mode drains the same queue and backlog
        if let Some(r) = self.take_accepted() {
            return Some(r);
        }
        match sys::accept(self.fd()) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            other => Some(other.map(Accepted::Fd)),
        }
    }

    /// Takes one connection the driver has already accepted, never the
    /// socket's backlog.
    pub(crate) fn take_accepted(&self) -> Option<io::Result<Accepted>> {
        let key = self.queue.get()?;
        let taken = self.core.driver.state.borrow_mut().take_queued(key)?;
        Some(taken.map(|t| Accepted::from_taken(t, &self.core.driver)))
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

    /// Sets how many connections the owner will take from now on: no more
    /// are accepted ahead into the queue, and at zero the armed accept stops.
    /// A room that rises wakes the tasks an accept stopped before left
    /// waiting, woken once the driver's state is released. Zero is passed
    /// on even when it was zero already: a task may have armed a single
    /// accept since (a task that asks takes one), which it stops.
    fn set_accept_room(&self, room: usize) {
        if self.room.replace(room) != room || room == 0 {
            let mut woken = Vec::new();
            self.core.driver.state.borrow_mut().set_accept_room(self.queue.get(), room, &mut woken);
            for w in woken {
                w.wake();
            }
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
