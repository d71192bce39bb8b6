//! The tasks parked on one wait (an operation, a stream's receive) beyond
//! its first: several tasks may wait on one socket (an `Rc` stream read
//! by two tasks, one waiting for room while another writes), and each
//! must be woken, as epoll's slot and tokio wake them all.
//!
//! # Implementation notes
//! - A wait keeps its first waker inline (an `Option<Waker>` in its slot);
//!   only a second, different task spills into [`MoreWaiters`], a list per
//!   wait kept beside the slab, keyed by the wait's slab key. The common
//!   single-waiter path stays one compare (`will_wake`), and no slot grows.
//! - Parked wakers are not pruned when a task gives up (a timeout): they
//!   are woken with the rest, a wake-up a correct future takes as a reason
//!   to look again, and gone with the wait.

use std::task::Waker;

use crate::slab::Key;

/// The tasks parked beyond the first on the waits of one slab, by the
/// wait's key; empty (no allocation) while no wait has a second task.
#[derive(Default)]
pub(super) struct MoreWaiters {
    lists: Vec<(Key, Vec<Waker>)>,
}

impl MoreWaiters {
    /// Parks `waker` on the wait `key`, whose first waker is `first`: there
    /// if it has none, beside it here if it is another task's.
    #[inline]
    pub(super) fn park(&mut self, first: &mut Option<Waker>, key: Key, waker: &Waker) {
        match first {
            None => *first = Some(waker.clone()),
            Some(w) if w.will_wake(waker) => {}
            Some(_) => self.park_more(key, waker),
        }
    }

    #[cold]
    fn park_more(&mut self, key: Key, waker: &Waker) {
        let list = match self.lists.iter().position(|(k, _)| *k == key) {
            Some(i) => &mut self.lists[i].1,
            None => {
                self.lists.push((key, Vec::new()));
                &mut self.lists.last_mut().expect("just pushed").1
            }
        };
        if !list.iter().any(|w| w.will_wake(waker)) {
            list.push(waker.clone());
        }
    }

    /// Moves the tasks parked beyond the first on `key` into `out` (the
    /// wait ended, or has something for them).
    #[inline]
    pub(super) fn take_into(&mut self, key: Key, out: &mut Vec<Waker>) {
        if !self.lists.is_empty() {
            self.take_more(key, Some(out));
        }
    }

    /// Forgets the tasks parked beyond the first on `key` (its wait is gone
    /// with everything that could poll it).
    #[inline]
    pub(super) fn forget(&mut self, key: Key) {
        if !self.lists.is_empty() {
            self.take_more(key, None);
        }
    }

    #[cold]
    fn take_more(&mut self, key: Key, out: Option<&mut Vec<Waker>>) {
        if let Some(i) = self.lists.iter().position(|(k, _)| *k == key) {
            let (_, mut list) = self.lists.swap_remove(i);
            if let Some(out) = out {
                out.append(&mut list);
            }
        }
    }

    /// Waits with tasks beyond their first (for tests).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lists.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Wake, Waker};

    use super::MoreWaiters;
    use crate::slab::Slab;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn counter() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    /// The first task stays inline; another spills, once however often it
    /// polls; both are handed out together, and nothing is left.
    #[test]
    fn every_distinct_task_is_parked_once_and_handed_out() {
        let mut slab = Slab::default();
        let (key, other) = (slab.insert(()), slab.insert(()));
        let mut more = MoreWaiters::default();
        let (mut first, mut first_other) = (None, None);
        let ((a, wa), (b, wb)) = (counter(), counter());
        more.park(&mut first, key, &wa);
        more.park(&mut first, key, &wa);
        assert_eq!(more.len(), 0, "one task needs no list");
        more.park(&mut first, key, &wb);
        more.park(&mut first, key, &wb);
        more.park(&mut first_other, other, &wb);
        assert_eq!(more.len(), 1);
        let mut out = Vec::new();
        out.extend(first.take());
        more.take_into(key, &mut out);
        assert_eq!(out.len(), 2);
        out.drain(..).for_each(Waker::wake);
        assert_eq!((a.0.load(Ordering::Relaxed), b.0.load(Ordering::Relaxed)), (1, 1));
        assert_eq!(more.len(), 0);
        more.park(&mut first_other, other, &wa);
        more.forget(other);
        assert_eq!(more.len(), 0);
    }
}
