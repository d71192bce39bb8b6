//! The future that waits for an in-flight operation, and what its drop
//! hands the driver (its slot's states, and what a dropped future does to
//! its slot, are in `lifecycle.rs`).
//!
//! # Ownership invariant
//! Everything an entry points to (buffer, iovec array, `msghdr`, socket
//! address) **and the socket itself** (a [`SharedFd`] clone) is owned by
//! the [`Op`] future while it waits, and by the slab once the future is
//! gone, until the last completion arrives. The descriptor cannot close,
//! and its number cannot be reused, while the kernel may still act on it.
//! An `Op` holds its driver, so it is always cancelled in the slab it was
//! made in, whichever runtime is current when it is dropped.

use std::any::Any;
use std::future::Future;
use std::io;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Instant;

use io_uring::squeue;

use super::lifecycle::Cqe;
use super::linger::WRITE_LINGER;
use super::linger::{Handover, LingeringWrite};
use super::shared::SharedFd;
use super::user_data::UserData;
use super::Driver;
use crate::driver::park::not_running;
use crate::slab::Key;

/// A submitted operation; resolves to its completion and its storage.
///
/// Dropping it before completion withdraws the entry if the kernel has not
/// seen it yet; otherwise it hands `T` and the socket to the driver, which
/// cancels the operation and frees them at its last completion.
pub(super) struct Op<T: 'static> {
    driver: Rc<Driver>,
    key: Key,
    /// The operation's memory and socket (none for operations on paths, or
    /// on files their storage holds); `None` once the future returned.
    data: Option<(T, Option<SharedFd>)>,
}

// `data` is never pinned: the kernel sees only the heap memory it points to.
impl<T> Unpin for Op<T> {}

impl<T: 'static> Op<T> {
    /// Queues `entry` for the driver's next enter.
    ///
    /// # Safety
    /// Every pointer in `entry` must point into memory that `data` owns and
    /// that stays at the same address when `data` moves (a heap block), or
    /// into memory that outlives the operation, and it must be valid for the
    /// kind of access the operation makes. `fd` must be the socket `entry`
    /// names.
    pub(super) unsafe fn submit(
        driver: &Rc<Driver>,
        fd: &SharedFd,
        entry: squeue::Entry,
        data: T,
    ) -> Result<Op<T>, (io::Error, T)> {
        // SAFETY: forwarded from the caller.
        unsafe { Self::submit_with(driver, Some(fd), entry, data) }
    }

    /// Queues `entry`, which names no socket of the driver's: a path, or a
    /// file that `data` itself holds open.
    ///
    /// # Safety
    /// As [`Op::submit`]; any descriptor `entry` names must stay open for
    /// as long as `data` lives (it holds it).
    pub(super) unsafe fn submit_unbound(
        driver: &Rc<Driver>,
        entry: squeue::Entry,
        data: T,
    ) -> Result<Op<T>, (io::Error, T)> {
        // SAFETY: forwarded from the caller.
        unsafe { Self::submit_with(driver, None, entry, data) }
    }

    /// # Safety
    /// As [`Op::submit`].
    unsafe fn submit_with(
        driver: &Rc<Driver>,
        fd: Option<&SharedFd>,
        entry: squeue::Entry,
        data: T,
    ) -> Result<Op<T>, (io::Error, T)> {
        if !driver.entered.get() {
            return Err((not_running(), data));
        }
        let Ok(mut st) = driver.state.try_borrow_mut() else {
            return Err((io::Error::other("io_uring driver busy: an operation was started from inside a waker or destructor"), data));
        };
        let key = st.submit_op(entry);
        drop(st);
        Ok(Op { driver: driver.clone(), key, data: Some((data, fd.cloned())) })
    }
}

impl<T: 'static> Op<T> {
    /// The `user_data` of the operation's completions.
    pub(super) fn user_data(&self) -> u64 {
        UserData::Op(self.key).to_u64()
    }
}

impl<T: 'static> Future for Op<T> {
    type Output = (Cqe, T);

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<(Cqe, T)> {
        self.get_mut().poll_with(Some(cx.waker()))
    }
}

impl<T: 'static> Op<T> {
    /// Polls the operation, parking `waker` if it has not completed;
    /// without a waker it only looks (a call that never waits must not
    /// take the place of a task that does).
    pub(super) fn poll_with(&mut self, waker: Option<&Waker>) -> Poll<(Cqe, T)> {
        let cqe = std::task::ready!(self.driver.state.borrow_mut().poll_op(self.key, waker));
        let (data, _fd) = self.data.take().expect("io_uring operation polled after it completed");
        Poll::Ready((cqe, data))
    }
}

impl<T: 'static> Drop for Op<T> {
    fn drop(&mut self) {
        let Some(data) = self.data.take() else {
            return;
        };
        let storage: Box<dyn Any> = Box::new(data);
        let free_now = match self.driver.state.try_borrow_mut() {
            Ok(mut st) => st.forget_op(self.key, storage),
            Err(_) => {
                // Dropped while the driver's state is borrowed (from a
                // destructor the driver runs): the kernel may still use the
                // memory, so it is leaked rather than freed.
                std::mem::forget(storage);
                None
            }
        };
        // Dropped outside the borrow: a buffer's destructor may do I/O.
        drop(free_now);
        self.driver.settle_op(self.key);
    }
}

impl<T: 'static> Op<T> {
    /// Wakes every task waiting on the operation (a socket's operation
    /// several tasks poll), before it is handed to the driver or dropped
    /// for a reason of the socket's, not of the tasks': they look again at
    /// what replaced it rather than wait on an operation nobody polls.
    pub(super) fn wake_waiters(&self) {
        let mut woken = Vec::new();
        if let Ok(mut st) = self.driver.state.try_borrow_mut() {
            st.take_op_waiters(self.key, &mut woken);
        }
        for w in woken {
            w.wake();
        }
    }

    /// Gives up the future but not the operation, for an owner that keeps
    /// its driver elsewhere: a [`ParkedOp`] is an `Op` without its driver
    /// (8 bytes less in every future that holds one across polls).
    pub(super) fn park(mut self) -> ParkedOp<T> {
        let (data, fd) = self.data.take().expect("an operation parked after it completed");
        ParkedOp { key: self.key, data: ManuallyDrop::new((data, fd)) }
    }
}

/// An operation whose future was given up between polls ([`Op::park`]):
/// its key, its storage and its socket, which stay owned here as the
/// ownership invariant requires. Its owner turns it back into the future
/// with [`ParkedOp::resume`] to poll it, and to drop it (which cancels it).
/// Dropped without that, it leaks its storage and socket rather than free
/// memory the kernel may still use.
pub(super) struct ParkedOp<T: 'static> {
    key: Key,
    data: ManuallyDrop<(T, Option<SharedFd>)>,
}

impl<T: 'static> ParkedOp<T> {
    /// The future again, on `driver`, which must be the driver the
    /// operation was submitted to.
    pub(super) fn resume(self, driver: &Rc<Driver>) -> Op<T> {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again, so `data` is taken
        // exactly once.
        let data = unsafe { ManuallyDrop::take(&mut this.data) };
        Op { driver: driver.clone(), key: this.key, data: Some(data) }
    }
}

impl Op<()> {
    /// Gives up the future but not the operation, and returns its key: for
    /// a one-shot poll kept across polls of its owner in a key's 12 bytes
    /// rather than an `Op`'s 32. The owner holds the driver and the socket
    /// the poll names for as long as it keeps the key, and ends the poll
    /// only through [`Op::resume`] (completed, or dropped to cancel it), so
    /// the ownership invariant holds as for any `Op`.
    pub(super) fn into_key(mut self) -> Key {
        // Without its storage, dropping the future leaves the slot alone.
        self.data = None;
        self.key
    }

    /// The poll on `fd` that [`Op::into_key`] gave up, as a future again.
    pub(super) fn resume(driver: &Rc<Driver>, fd: &SharedFd, key: Key) -> Op<()> {
        Op { driver: driver.clone(), key, data: Some(((), Some(fd.clone()))) }
    }
}

impl Op<Vec<u8>> {
    /// Hands a written-behind send, of which the kernel has taken `sent`
    /// bytes so far, to the driver, which sends the rest after this future
    /// is gone (its stream is being dropped, or, with `handover`, shut
    /// down in both directions): for at most [`WRITE_LINGER`].
    pub(super) fn linger(mut self, sent: usize, handover: Option<Rc<Handover>>) {
        let Some((buf, Some(fd))) = self.data.take() else { return };
        let write = LingeringWrite::new(buf, sent, fd, Instant::now() + WRITE_LINGER, handover);
        match self.driver.state.try_borrow_mut() {
            Ok(mut st) => st.linger(self.key, write),
            // Dropped from a destructor the driver runs: the kernel may
            // still use the buffer, so it is leaked rather than freed.
            Err(_) => write.abandon(),
        }
    }
}

/// True for results that mean "not now": the operation ran without
/// waiting (a non-blocking socket handled by a kernel worker) and should
/// wait for readiness and run again.
pub(super) fn is_retry(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR))
}
