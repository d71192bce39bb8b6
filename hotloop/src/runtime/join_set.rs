//! `JoinSet`: a group of tasks on the current worker, joined in the order
//! they finish.
//!
//! # Implementation notes
//! Each task's join slot knows its set and its id there: when the task
//! finishes (returns, panics or is aborted) the slot pushes the id onto
//! the set's list of finished tasks and wakes `join_next`. So `join_next`
//! costs the same with ten tasks or ten thousand: it pops an id and takes
//! that task's output, without polling the others. A task that
//! `detach_all` let go reports nothing when it finishes.

use std::fmt;
use std::future::Future;
use std::task::{Context as TaskContext, Poll};

use super::join::{spawn_in_set, AbortHandle, Done, JoinHandle};
use super::join_slot::{lock, JoinError, SetNotify};
use crate::loom::sync::Arc;
use crate::slab::{Key, Slab};

/// A set of tasks spawned on the current worker, awaited in the order
/// they finish, as tokio's `JoinSet`.
///
/// Dropping the set aborts every task still in it.
///
/// ```
/// use hotloop::task::JoinSet;
///
/// # hotloop::Runtime::new()?.block_on(async {
/// let mut set = JoinSet::new();
/// for i in 0..10u64 {
///     set.spawn(async move {
///         hotloop::time::sleep(std::time::Duration::from_millis(10 - i)).await;
///         i
///     });
/// }
/// let mut sum = 0;
/// while let Some(result) = set.join_next().await {
///     sum += result.expect("no task panicked");
/// }
/// assert_eq!(sum, 45);
/// # });
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct JoinSet<T> {
    /// The handles, keyed by each task's id in the set (a generational
    /// slab key: a stale id finds nothing).
    tasks: Slab<JoinHandle<T>>,
    notify: Arc<SetNotify>,
}

impl<T: 'static> JoinSet<T> {
    /// An empty set.
    pub fn new() -> Self {
        JoinSet { tasks: Slab::default(), notify: SetNotify::new() }
    }

    /// Spawns `future` on the current worker as a task of this set, and
    /// returns a handle that aborts it (as tokio's `JoinSet::spawn`); the
    /// task stays in the set until joined either way.
    ///
    /// # Panics
    /// Outside a hotloop worker.
    pub fn spawn<F>(&mut self, future: F) -> AbortHandle
    where
        F: Future<Output = T> + 'static,
    {
        let id = self.tasks.vacant_key().to_u64();
        let handle = spawn_in_set(future, Some((self.notify.clone(), id)));
        let abort = handle.abort_handle_with(Done::InSet(self.notify.clone(), id));
        let inserted = self.tasks.insert(handle);
        debug_assert_eq!(inserted.to_u64(), id);
        abort
    }

    /// Waits for the next task to finish and returns its result; `None`
    /// once the set is empty. Cancel-safe: a result is taken only in the
    /// poll that returns it.
    pub async fn join_next(&mut self) -> Option<Result<T, JoinError>> {
        std::future::poll_fn(|cx| self.poll_join_next(cx)).await
    }

    /// The result of a task that has finished, if there is one; never waits.
    pub fn try_join_next(&mut self) -> Option<Result<T, JoinError>> {
        loop {
            let id = lock(&self.notify.ready).ids.pop_front()?;
            if let Some(out) = self.take_finished(id) {
                return Some(out);
            }
        }
    }

    /// The poll form of [`join_next`](Self::join_next). A result found
    /// ready takes a unit of the task's budget (see [`crate::task::unconstrained`]).
    pub fn poll_join_next(
        &mut self,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<T, JoinError>>> {
        crate::coop::poll_budgeted(cx, |cx| self.poll_join_next_now(cx))
    }

    /// [`JoinSet::poll_join_next`] outside the budget.
    fn poll_join_next_now(
        &mut self,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<T, JoinError>>> {
        loop {
            let id = {
                let mut ready = lock(&self.notify.ready);
                match ready.ids.pop_front() {
                    Some(id) => id,
                    None if self.tasks.is_empty() => return Poll::Ready(None),
                    None => {
                        // Filed under the lock the finishing task takes: no
                        // finish between the check and this is missed.
                        match &ready.waiter {
                            Some(w) if w.will_wake(cx.waker()) => {}
                            _ => ready.waiter = Some(cx.waker().clone()),
                        }
                        return Poll::Pending;
                    }
                }
            };
            if let Some(out) = self.take_finished(id) {
                return Poll::Ready(Some(out));
            }
        }
    }

    /// Waits for every task and returns their outputs in the order they
    /// finished.
    ///
    /// # Panics
    /// If a task panicked (the panic is resumed here) or was aborted, as
    /// tokio's `join_all` does.
    pub async fn join_all(mut self) -> Vec<T> {
        let mut out = Vec::with_capacity(self.len());
        while let Some(result) = self.join_next().await {
            match result {
                Ok(v) => out.push(v),
                Err(JoinError::Panicked(payload)) => std::panic::resume_unwind(payload),
                Err(JoinError::Cancelled) => panic!("a task of the JoinSet was aborted"),
            }
        }
        out
    }

    /// The output of task `id`, removed from the set.
    fn take_finished(&mut self, id: u64) -> Option<Result<T, JoinError>> {
        let handle = self.tasks.remove(Key::from_u64(id)?)?;
        handle.take_output()
    }
}

impl<T> JoinSet<T> {
    /// The tasks in the set: running, or finished and not yet joined.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// True if the set holds no task.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Aborts every task in the set. They stay in it until joined, each
    /// then giving `JoinError::Cancelled` (or its output, if it had
    /// already finished).
    pub fn abort_all(&mut self) {
        for (_, handle) in self.tasks.iter() {
            handle.abort();
        }
    }

    /// Aborts every task and waits until each is gone, discarding their
    /// results.
    pub async fn shutdown(&mut self)
    where
        T: 'static,
    {
        self.abort_all();
        while self.join_next().await.is_some() {}
    }

    /// Removes every task from the set without aborting them: they keep running.
    pub fn detach_all(&mut self) {
        {
            // Under the lock a finish takes: a task not finished here
            // finishes after, and clears its mark then.
            let mut ready = lock(&self.notify.ready);
            for (id, handle) in self.tasks.iter() {
                if !handle.is_finished() {
                    ready.detached(id.to_u64());
                }
            }
            ready.ids.clear();
        }
        drop(self.tasks.drain());
    }
}

impl<T: 'static> Default for JoinSet<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Drop for JoinSet<T> {
    fn drop(&mut self) {
        self.abort_all();
    }
}

impl<T> fmt::Debug for JoinSet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinSet").field("len", &self.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::JoinSet;
    use crate::runtime::join_slot::lock;

    /// Detached tasks that finish later report nothing to the set they
    /// left: its list of finished ids stays empty.
    #[test]
    fn detached_tasks_do_not_report_to_the_set() {
        const TASKS: usize = 1000;
        let rt = crate::Runtime::builder().workers(1).build().unwrap();
        rt.block_on(async {
            let mut set = JoinSet::new();
            let ended = Rc::new(Cell::new(0));
            for _ in 0..TASKS {
                let ended = ended.clone();
                set.spawn(async move {
                    crate::yield_now().await;
                    ended.set(ended.get() + 1);
                });
            }
            let notify = set.notify.clone();
            set.detach_all();
            assert!(set.is_empty());
            for _ in 0..100 {
                if ended.get() == TASKS {
                    break;
                }
                crate::yield_now().await;
            }
            assert_eq!(ended.get(), TASKS, "the detached tasks ran to their end");
            assert_eq!(lock(&notify.ready).ids.len(), 0, "detached tasks reported to the set");
        });
    }
}
