//! What every socket role on the epoll driver is: a descriptor, its
//! driver, and its registration, made lazily the first time an operation
//! has to wait (or at once in eager mode, and always for listeners), kept
//! until close. The waits every role builds on live here: try the
//! syscall, and only when it would block, register (once) and park.

use std::cell::Cell;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use super::{bit, Direction, Driver, HANGUP};
use crate::coop;
use crate::driver::config::Registration;
use crate::driver::park::not_running;
use crate::slab::Key;
use crate::sys;

/// A descriptor owned by one epoll driver, closed when dropped.
pub(super) struct SourceCore {
    /// Taken out and closed by `Drop`.
    fd: ManuallyDrop<OwnedFd>,
    driver: Rc<Driver>,
    /// The epoll slot, once registered.
    token: Cell<Option<Key>>,
}

impl SourceCore {
    /// Wraps a descriptor; in eager mode, registers it now.
    pub(super) fn new(driver: &Rc<Driver>, fd: OwnedFd) -> io::Result<SourceCore> {
        let core = Self::unregistered(driver, fd);
        if driver.registration == Registration::Eager {
            core.register()?;
        }
        Ok(core)
    }

    /// Wraps a descriptor that will surely wait (a listener): registers it now.
    pub(super) fn registered(driver: &Rc<Driver>, fd: OwnedFd) -> io::Result<SourceCore> {
        let core = Self::unregistered(driver, fd);
        core.register()?;
        Ok(core)
    }

    fn unregistered(driver: &Rc<Driver>, fd: OwnedFd) -> SourceCore {
        SourceCore { fd: ManuallyDrop::new(fd), driver: driver.clone(), token: Cell::new(None) }
    }

    fn register(&self) -> io::Result<Key> {
        let key = self.driver.poller.borrow_mut().register(self.fd.as_raw_fd())?;
        self.token.set(Some(key));
        Ok(key)
    }

    /// Gives the descriptor up, open, out of this driver: removed from
    /// the interest list if it was registered (closing it would have done
    /// that; a descriptor that stays open stays listed otherwise, and its
    /// events would wake this worker for another's socket). On failure the
    /// source comes back unchanged.
    pub(super) fn into_fd(self) -> Result<OwnedFd, (SourceCore, io::Error)> {
        if let Some(key) = self.token.get() {
            let res = self.driver.poller.borrow_mut().deregister(self.fd(), key);
            if let Err(e) = res {
                return Err((self, e));
            }
            self.token.set(None);
        }
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped, so `Drop` does not take `fd` again;
        // it is taken once, here.
        let fd = unsafe { ManuallyDrop::take(&mut this.fd) };
        // SAFETY: the driver handle is read out once and `this` is never used
        // or dropped again, so it is dropped exactly once (here).
        drop(unsafe { std::ptr::read(&this.driver) });
        Ok(fd)
    }

    /// The raw descriptor.
    pub(super) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The descriptor, borrowed.
    pub(super) fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// True unless the socket is registered and the last operation in
    /// `dir` drained it with no event since.
    pub(super) fn is_ready(&self, dir: Direction) -> bool {
        match self.token.get() {
            None => true,
            Some(key) => self.driver.poller.borrow_mut().slot(key).ready & bit(dir) != 0,
        }
    }

    /// Records that an operation in `dir` drained the socket (sticky after a hang-up).
    pub(super) fn clear_ready(&self, dir: Direction) {
        if let Some(key) = self.token.get() {
            let mut poller = self.driver.poller.borrow_mut();
            let slot = poller.slot(key);
            if slot.ready & HANGUP == 0 {
                slot.ready &= !bit(dir);
            }
        }
    }

    /// Parks the task until the socket is ready in `dir`, registering it
    /// first if this is its first wait.
    fn park<R>(&self, cx: &mut TaskContext<'_>, dir: Direction) -> Poll<io::Result<R>> {
        if !self.driver.entered.get() {
            return Poll::Ready(Err(not_running()));
        }
        let key = match self.token.get() {
            Some(k) => k,
            None => match self.register() {
                Ok(k) => k,
                Err(e) => return Poll::Ready(Err(e)),
            },
        };
        let mut poller = self.driver.poller.borrow_mut();
        let slot = poller.slot(key);
        if slot.ready & HANGUP == 0 {
            slot.ready &= !bit(dir);
        }
        slot.park(dir, cx.waker());
        Poll::Pending
    }

    /// Ready once an event said the socket is ready in `dir` and no
    /// operation has drained it since; parks otherwise. An unregistered
    /// socket parks (and so registers): its caller just saw it would block.
    /// Found ready, it takes a unit of the task's budget (`coop.rs`).
    pub(super) fn poll_ready(
        &self,
        cx: &mut TaskContext<'_>,
        dir: Direction,
    ) -> Poll<io::Result<()>> {
        match self.token.get() {
            Some(_) if self.is_ready(dir) => coop::poll_budgeted(cx, |_| Poll::Ready(Ok(()))),
            _ => self.park(cx, dir),
        }
    }

    /// Runs `op` until it stops returning `WouldBlock`, parking in between.
    /// An `op` that completes takes a unit of the task's budget; with none
    /// left, the task is woken and `op` is not run (`coop.rs`).
    pub(super) fn poll_io<R>(
        &self,
        cx: &mut TaskContext<'_>,
        dir: Direction,
        mut op: impl FnMut() -> io::Result<R>,
    ) -> Poll<io::Result<R>> {
        // Registered and drained in this direction: wait for the next edge
        // without a syscall that would only say EAGAIN.
        if !self.is_ready(dir) {
            return self.park(cx, dir);
        }
        std::task::ready!(coop::poll_proceed(cx));
        loop {
            match op() {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                r => {
                    coop::spend();
                    return Poll::Ready(r);
                }
            }
        }
        // The socket has nothing for us: only now does it need to be registered.
        self.park(cx, dir)
    }

    /// [`SourceCore::poll_io`] for reads and writes of `asked` bytes: one
    /// that moves fewer bytes drained the socket's queue (or filled its
    /// send buffer), so the next one waits for an edge instead of trying.
    pub(super) fn poll_io_bytes(
        &self,
        cx: &mut TaskContext<'_>,
        dir: Direction,
        asked: usize,
        op: impl FnMut() -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        let polled = self.poll_io(cx, dir, op);
        if let Poll::Ready(Ok(n)) = polled {
            if n > 0 && n < asked {
                self.clear_ready(dir);
            }
        }
        polled
    }

    /// Parks until the next event in `dir`, consuming one that came since
    /// the last wait.
    pub(super) fn poll_next(
        &self,
        cx: &mut TaskContext<'_>,
        dir: Direction,
    ) -> Poll<io::Result<()>> {
        if self.token.get().is_some() && self.is_ready(dir) {
            std::task::ready!(coop::poll_proceed(cx));
            coop::spend();
            // An event came since the last wait: consume it.
            self.clear_ready(dir);
            return Poll::Ready(Ok(()));
        }
        self.park(cx, dir)
    }
}

impl Drop for SourceCore {
    fn drop(&mut self) {
        // Closing the descriptor removes it from epoll's interest list;
        // events already queued for it carry a key that is stale from here
        // on and are dropped.
        if let Ok(mut poller) = self.driver.poller.try_borrow_mut() {
            poller.release(self.token.get());
        }
        // SAFETY: `fd` is taken once, here, and the source is not used again.
        let fd = unsafe { ManuallyDrop::take(&mut self.fd) };
        sys::close(fd);
    }
}
