//! Tasks: the slab that holds each worker's futures, and the waker that
//! puts a task back on its worker's run queue from any thread (woken in
//! `context.rs`, which owns the run queue).
//!
//! # Implementation notes
//! A task's future is `!Send` and lives only in its worker's slab; the waker
//! carries no pointer to it, only the task's key (slot index and generation)
//! and the worker's shared inbox. So a waker may be cloned, sent, woken and
//! dropped on any thread without ever touching the future, and a waker that
//! outlives its task wakes nothing: the generation no longer matches.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Waker;

use super::key::TaskKey;
use super::shared::WorkerShared;
use crate::slab::{Key, Slab};

/// The key the executor uses for the future passed to `block_on`.
pub(crate) const MAIN_TASK: TaskKey = u64::MAX;

/// A boxed task future.
pub(crate) type TaskFuture = Pin<Box<dyn Future<Output = ()>>>;

/// A live task: 40 bytes in its worker's slab, which every connection
/// pays (its abort flag lives in the header, which has room for it).
pub(crate) struct Task {
    /// The future; `None` while the executor is polling it.
    pub(crate) future: Option<TaskFuture>,
    /// The waker handed to the future, made once at spawn.
    pub(crate) waker: Waker,
    /// The waker's state, to clear its scheduled flag before each poll.
    pub(crate) header: Arc<TaskWaker>,
}

impl Task {
    /// True once `abort` was called while the task was being polled, or
    /// from outside its runtime: the executor drops it instead of polling it.
    pub(crate) fn is_aborted(&self) -> bool {
        self.header.aborted.load(Ordering::Relaxed)
    }

    /// Marks the task aborted (see [`Task::is_aborted`]).
    pub(crate) fn set_aborted(&self) {
        self.header.aborted.store(true, Ordering::Relaxed);
    }
}

/// The tasks of one worker, addressed by generational keys.
#[derive(Default)]
pub(crate) struct TaskSlab {
    slab: Slab<Task>,
    /// Wakers of finished tasks that nothing else referred to, kept for
    /// the next spawns: a connection's task then costs one allocation (its
    /// future), not two.
    spare_wakers: Vec<Arc<TaskWaker>>,
}

/// The most spare wakers a worker keeps.
const SPARE_WAKERS_MAX: usize = 1024;

impl TaskSlab {
    /// The key the next inserted task will get.
    pub(crate) fn next_key(&self) -> TaskKey {
        self.slab.vacant_key().to_u64()
    }

    /// Stores a task; returns its key, which equals `next_key()` before the call.
    pub(crate) fn insert(&mut self, task: Task) -> TaskKey {
        self.slab.insert(task).to_u64()
    }

    /// The task behind `key`, if it is still alive.
    pub(crate) fn get_mut(&mut self, key: TaskKey) -> Option<&mut Task> {
        self.slab.get_mut(Key::from_u64(key)?)
    }

    /// Every live task, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Task> {
        self.slab.iter().map(|(_, t)| t)
    }

    /// Removes the task behind `key`; a later key for this slot has a new generation.
    pub(crate) fn remove(&mut self, key: TaskKey) -> Option<Task> {
        self.slab.remove(Key::from_u64(key)?)
    }

    /// A waker for the task that will get `key`: a spare one if there is
    /// one, else a new one.
    pub(crate) fn waker_for(&mut self, key: TaskKey, worker: &Arc<WorkerShared>) -> Arc<TaskWaker> {
        if let Some(mut spare) = self.spare_wakers.pop() {
            // Spares are kept only while nothing else refers to them.
            if let Some(w) = Arc::get_mut(&mut spare) {
                w.key = key;
                *w.scheduled.get_mut() = false;
                *w.aborted.get_mut() = false;
                return spare;
            }
        }
        TaskWaker::new(key, worker.clone())
    }

    /// Drops a finished task (its future already dropped), keeping its
    /// waker as a spare if no clone of it is left anywhere (a clone held
    /// elsewhere could still wake it, and must find a stale key).
    pub(crate) fn retire(&mut self, task: Task) {
        let Task { future, waker, mut header } = task;
        debug_assert!(future.is_none(), "a task is retired after its future is dropped");
        drop(waker);
        if self.spare_wakers.len() < SPARE_WAKERS_MAX && Arc::get_mut(&mut header).is_some() {
            self.spare_wakers.push(header);
        }
    }

    /// Takes every task out, for shutdown.
    pub(crate) fn drain(&mut self) -> Vec<Task> {
        self.slab.drain()
    }
}

/// The waker of one task. Its `Wake` impl is in `context.rs`: a wake on
/// the task's own worker goes straight onto that context's run queue.
pub(crate) struct TaskWaker {
    pub(super) key: TaskKey,
    pub(super) worker: Arc<WorkerShared>,
    /// True while the task sits in a run queue, so repeated wakes enqueue it once.
    pub(super) scheduled: AtomicBool,
    /// The task's abort flag ([`Task::is_aborted`]): read and written only
    /// on the task's worker, here because the header had the room.
    aborted: AtomicBool,
}

impl TaskWaker {
    pub(crate) fn new(key: TaskKey, worker: Arc<WorkerShared>) -> Arc<Self> {
        Arc::new(TaskWaker {
            key,
            worker,
            scheduled: AtomicBool::new(false),
            aborted: AtomicBool::new(false),
        })
    }

    /// Marks the task as no longer queued; called just before it is polled,
    /// so that a wake during the poll queues it again.
    pub(crate) fn clear_scheduled(&self) {
        self.scheduled.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::mem::size_of;

    use super::*;

    /// Every task holds one slab entry and one header, a connection's
    /// included: their sizes are watched (the entry was 48 bytes with the
    /// abort flag beside it; the header's Arc block stays at 40 bytes).
    #[test]
    fn a_task_stays_small() {
        assert!(size_of::<Task>() <= 40, "{}", size_of::<Task>());
        assert!(size_of::<TaskWaker>() <= 24, "{}", size_of::<TaskWaker>());
    }
}
