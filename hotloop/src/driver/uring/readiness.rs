//! A descriptor the io_uring driver only watches (a pidfd, a Unix datagram
//! socket whose calls std makes): one-shot `POLL_ADD`s say when to try
//! again.

use std::cell::Cell;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Wake, Waker};

use super::source::SourceCore;
use super::Driver;
use crate::driver::contract::ReadinessOps;
use crate::slab::Key;

/// A watched descriptor owned by one io_uring driver.
pub(crate) struct ReadinessSource {
    core: SourceCore,
    /// The `POLL_ADD` for `POLLIN` a wait is parked on, kept across polls
    /// by its key.
    read_wait: Cell<Option<Key>>,
    /// Every task waiting to read: the kept poll wakes them all (through
    /// `read_waker`), as epoll's slot and tokio do. With the poll holding
    /// only the last poller's waker, a second task receiving on the same
    /// socket took the wake-up from the first, which then waited for good.
    read_waiters: Arc<Waiters>,
    read_waker: Waker,
}

/// The tasks waiting on one kept poll; woken all at once.
#[derive(Default)]
struct Waiters(Mutex<Vec<Waker>>);

impl Wake for Waiters {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let waiting = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        for w in waiting {
            w.wake();
        }
    }
}

impl ReadinessSource {
    /// Wraps a descriptor.
    pub(crate) fn new(driver: &Rc<Driver>, fd: OwnedFd) -> ReadinessSource {
        let read_waiters = Arc::new(Waiters::default());
        let read_waker = Waker::from(read_waiters.clone());
        ReadinessSource {
            core: SourceCore::new(driver, fd),
            read_wait: Cell::new(None),
            read_waiters,
            read_waker,
        }
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
        {
            let mut waiting = self.read_waiters.0.lock().unwrap_or_else(|e| e.into_inner());
            if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
                waiting.push(cx.waker().clone());
            }
        }
        let mut all = TaskContext::from_waker(&self.read_waker);
        let cqe = std::task::ready!(self.core.poll_kept(&self.read_wait, libc::POLLIN, &mut all))?;
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
