//! A connection's open streams (or HTTP/3 requests), counted so that a
//! stopping server closes the connection once they are done.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::rc::Rc;
use std::task::{Poll, Waker};

/// Waits until the connection's streams are done (`true`) or the client
/// closed it (`false`).
pub(super) async fn streams_done(streams: &Streams, conn: &quinn::Connection) -> bool {
    let mut closed = pin!(conn.closed());
    let mut done = pin!(streams.all_done());
    poll_fn(|cx| match done.as_mut().poll(cx) {
        Poll::Ready(()) => Poll::Ready(true),
        Poll::Pending => closed.as_mut().poll(cx).map(|_| false),
    })
    .await
}

/// A connection's open streams, and the task waiting for them to end.
#[derive(Default)]
pub(super) struct Streams {
    pub(super) open: Cell<usize>,
    waiter: Cell<Option<Waker>>,
}

impl Streams {
    /// Completes when no stream is open.
    pub(super) async fn all_done(&self) {
        poll_fn(|cx| {
            if self.open.get() == 0 {
                return Poll::Ready(());
            }
            self.waiter.set(Some(cx.waker().clone()));
            Poll::Pending
        })
        .await
    }
}

/// One open stream of [`Streams`], counted until dropped.
pub(super) struct Open(Rc<Streams>);

impl Open {
    pub(super) fn new(streams: Rc<Streams>) -> Self {
        streams.open.set(streams.open.get() + 1);
        Open(streams)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let left = self.0.open.get() - 1;
        self.0.open.set(left);
        if left == 0 {
            if let Some(w) = self.0.waiter.take() {
                w.wake();
            }
        }
    }
}
