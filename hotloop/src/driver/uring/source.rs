//! What every socket role on the io_uring driver is: the descriptor,
//! shared with the operations the kernel holds on it, and the driver.
//! The ring entries every role submits on its socket start here.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll};

use io_uring::opcode;

use super::lifecycle::Cqe;
use super::op::Op;
use super::shared::{SharedFd, SockFd};
use super::Driver;
use crate::slab::Key;

/// A descriptor owned by one io_uring driver. It closes when its source
/// and every operation the kernel still holds on it are gone.
pub(super) struct SourceCore {
    /// Dropped by hand, before the settle in `Drop`: a direct socket's
    /// slot is given back as its last holder lets go, and that settle is
    /// what then submits the slot's close when no runtime is driving the
    /// ring.
    pub(super) fd: ManuallyDrop<SharedFd>,
    pub(super) driver: Rc<Driver>,
}

impl SourceCore {
    /// Wraps `fd` on `driver`.
    pub(super) fn new(driver: &Rc<Driver>, fd: OwnedFd) -> SourceCore {
        SourceCore { fd: ManuallyDrop::new(Rc::new(SockFd::plain(fd))), driver: driver.clone() }
    }

    /// Wraps `fd`, a socket of `driver` (a direct one's slot is in its
    /// ring's file table).
    pub(super) fn from_shared(driver: &Rc<Driver>, fd: SharedFd) -> SourceCore {
        SourceCore { fd: ManuallyDrop::new(fd), driver: driver.clone() }
    }

    /// The raw descriptor; a direct socket gets one installed on first
    /// use (`Driver::plain_fd`). -1 if that failed (descriptors ran out),
    /// so the system call it was for fails with `EBADF`.
    pub(super) fn fd(&self) -> RawFd {
        self.driver.plain_fd(&self.fd).unwrap_or(-1)
    }

    /// The descriptor, borrowed (the source's own reference keeps it
    /// open); a direct socket gets one installed on first use.
    ///
    /// # Panics
    /// If a direct socket's descriptor cannot be installed (the process
    /// is out of descriptors): `as_fd` cannot report an error.
    pub(super) fn as_fd(&self) -> BorrowedFd<'_> {
        match self.try_as_fd() {
            Ok(fd) => fd,
            Err(e) => panic!("installing a descriptor for a direct io_uring socket failed: {e}"),
        }
    }

    /// The descriptor, borrowed; a direct socket gets one installed on
    /// first use, and the error says why when that fails.
    pub(super) fn try_as_fd(&self) -> io::Result<BorrowedFd<'_>> {
        self.driver.plain_fd(&self.fd)?;
        Ok(self.fd.owned().expect("just installed").as_fd())
    }

    /// Queues `entry` with `data` as its storage.
    ///
    /// # Safety
    /// As [`Op::submit`]: every pointer in `entry` points into `data`'s
    /// stable heap memory (or nowhere), valid for the access made.
    pub(super) unsafe fn submit<T: 'static>(
        &self,
        entry: io_uring::squeue::Entry,
        data: T,
    ) -> Result<Op<T>, (io::Error, T)> {
        // SAFETY: forwarded from the caller; `self.fd` is the socket `entry` names.
        unsafe { Op::submit(&self.driver, &self.fd, entry, data) }
    }

    /// Waits until the socket reports one of `events` (a one-shot `POLL_ADD`).
    pub(super) async fn poll_events(&self, events: i16) -> io::Result<()> {
        let op = self.submit_poll(events)?;
        let (cqe, ()) = op.await;
        cqe.result().map(drop)
    }

    /// Submits a one-shot `POLL_ADD` for `events`.
    pub(super) fn submit_poll(&self, events: i16) -> io::Result<Op<()>> {
        let entry = self.fd.entry(|t| opcode::PollAdd::new(t, events as u32).build());
        // SAFETY: a poll entry points at no memory.
        unsafe { self.submit(entry, ()) }.map_err(|(e, ())| e)
    }

    /// Polls the one-shot `POLL_ADD` for `events` whose key `kept` holds,
    /// submitting one first if it holds none; an error is the submission's,
    /// the completion says how the poll ended. While it waits, only its key
    /// stays in `kept` (see [`Op::into_key`]); once it completes, `kept` is
    /// empty and the next call submits a new one. Every task that polls it
    /// is parked on it, and all are woken when it completes.
    pub(super) fn poll_kept(
        &self,
        kept: &Cell<Option<Key>>,
        events: i16,
        cx: &mut TaskContext<'_>,
    ) -> Poll<io::Result<Cqe>> {
        let mut op = match kept.take() {
            Some(key) => Op::resume(&self.driver, &self.fd, key),
            None => self.submit_poll(events)?,
        };
        match Pin::new(&mut op).poll(cx) {
            Poll::Pending => {
                kept.set(Some(op.into_key()));
                Poll::Pending
            }
            Poll::Ready((cqe, ())) => Poll::Ready(Ok(cqe)),
        }
    }

    /// Cancels the poll whose key `kept` holds, if any (when its source is
    /// dropped): the driver keeps the socket until its last completion.
    pub(super) fn cancel_kept(&self, kept: &Cell<Option<Key>>) {
        if let Some(key) = kept.take() {
            drop(Op::resume(&self.driver, &self.fd, key));
        }
    }
}

impl Drop for SourceCore {
    fn drop(&mut self) {
        // `fd` closes now if no operation holds it, else at the last one's
        // end. Outside the runtime, push that end along so the socket
        // really closes (and a listener stops accepting) now: a plain
        // descriptor closes with its last holder, a direct socket's slot
        // with the close entry the settle submits.
        // Only what still holds this socket is waited for.
        let sock = Rc::downgrade(&*self.fd);
        // SAFETY: `fd` is dropped here, once, and nothing uses it after.
        unsafe { ManuallyDrop::drop(&mut self.fd) };
        self.driver.settle_socket(&sock);
    }
}
