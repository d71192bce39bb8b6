//! Where a task's output waits for whoever joins it: the slot shared by
//! [`JoinHandle`](super::JoinHandle), [`RemoteJoinHandle`], the blocking
//! pool and [`JoinSet`](super::JoinSet), and the error a join gives
//! ([`JoinError`]).
//!
//! # Implementation notes
//! The slot is the one part of a task that two threads may touch at once:
//! the task finishes on its worker while its handle (which is `Send` when
//! the output is) is polled, dropped or blocked on elsewhere. So it is a
//! mutex around the output, the finished flag and the waiting waker, and a
//! condition variable for a blocking `join`. The waker is woken after the
//! lock is released, so a waker that runs code (or takes another lock)
//! never does so under it. The lock is taken once when the task finishes
//! and once per poll of the handle; tasks spawned without a handle (the
//! connection handlers) have no slot at all.
//!
//! The condition variable is signalled only when a thread is blocked on
//! it (`blocked`, set under the lock before the wait): the standard
//! library's `notify_all` makes a `futex` system call whether or not
//! anyone waits, which would be one system call per finished task.
//!
//! Under `--cfg hotloop_loom` the mutex and condition variable are loom's,
//! and the test below checks that a poll racing the finish never loses the
//! wake nor the output.

use std::any::Any;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context as TaskContext, Poll, Waker};

use super::key::TaskKey;
use crate::loom::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Why a task produced no output.
pub enum JoinError {
    /// The task was aborted, or dropped when its worker shut down.
    Cancelled,
    /// The task panicked; the payload is the panic's.
    Panicked(Box<dyn Any + Send>),
}

impl JoinError {
    /// True if the task was cancelled.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, JoinError::Cancelled)
    }
    /// True if the task panicked.
    pub fn is_panic(&self) -> bool {
        matches!(self, JoinError::Panicked(_))
    }
}

impl fmt::Debug for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Cancelled => write!(f, "JoinError::Cancelled"),
            JoinError::Panicked(_) => write!(f, "JoinError::Panicked(..)"),
        }
    }
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Cancelled => write!(f, "task was cancelled"),
            JoinError::Panicked(_) => write!(f, "task panicked"),
        }
    }
}

impl std::error::Error for JoinError {}

/// As tokio's: a join error as an I/O error of kind `Other`, so a task
/// whose output is an `io::Result` can be awaited with one `?`
/// ([`run_local`](crate::task::run_local)). A panic's message, when it has
/// one, is in the error's.
impl From<JoinError> for std::io::Error {
    fn from(e: JoinError) -> Self {
        match e {
            JoinError::Cancelled => std::io::Error::other("task was cancelled"),
            JoinError::Panicked(payload) => {
                let msg = payload
                    .downcast_ref::<&str>()
                    .copied()
                    .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
                std::io::Error::other(match msg {
                    Some(msg) => format!("task panicked: {msg}"),
                    None => "task panicked".to_string(),
                })
            }
        }
    }
}

/// Told when a task of a [`JoinSet`](super::JoinSet) finishes: the set's
/// list of finished task ids and the waker of its `join_next`.
pub(crate) struct SetNotify {
    pub(crate) ready: Mutex<SetReady>,
}

/// The ids of a set's finished tasks not yet joined, and who waits for one.
#[derive(Default)]
pub(crate) struct SetReady {
    pub(crate) ids: VecDeque<u64>,
    pub(crate) waiter: Option<Waker>,
    /// By a task id's slab index, the generation of the last task there
    /// that finished: what the tasks' `AbortHandle`s read, so a set's
    /// task needs no flag of its own. A slot of the set's slab takes a new
    /// generation only once its task is joined (finished) or detached.
    finished_generations: Vec<u32>,
    /// Tasks detached from the set while running: a newer task in the
    /// same place may finish first, so their handles look here instead.
    detached: std::collections::HashSet<u64>,
}

impl SetReady {
    /// True once the task `id` of the set has finished.
    fn has_finished(&self, id: u64) -> bool {
        if !self.detached.is_empty() && self.detached.contains(&id) {
            return false;
        }
        let (index, generation) = (id as u32 as usize, (id >> 32) as u32);
        self.finished_generations.get(index).is_some_and(|&g| g != 0 && !newer(generation, g))
    }

    /// Records that the running task `id` left the set.
    pub(crate) fn detached(&mut self, id: u64) {
        self.detached.insert(id);
    }
}

/// True if slab generation `a` came after `b` (generations wrap).
fn newer(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

impl SetNotify {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(SetNotify { ready: Mutex::new(SetReady::default()) })
    }

    /// True once task `id` of the set has finished (for its `AbortHandle`).
    pub(crate) fn has_finished(&self, id: u64) -> bool {
        lock(&self.ready).has_finished(id)
    }

    /// Records that task `id` finished and wakes the set's waiter; a task
    /// detached from the set only clears its mark (nothing joins it, so
    /// its id would pile up in the list and wake the waiter for nothing).
    fn finished(&self, id: u64) {
        let waiter = {
            let mut ready = lock(&self.ready);
            let detached = !ready.detached.is_empty() && ready.detached.remove(&id);
            if !detached {
                ready.ids.push_back(id);
            }
            let (index, generation) = (id as u32 as usize, (id >> 32) as u32);
            if ready.finished_generations.len() <= index {
                ready.finished_generations.resize(index + 1, 0);
            }
            // A detached task of an older generation may finish after a
            // newer one in the same slot: the newer record stays.
            let last = &mut ready.finished_generations[index];
            if *last == 0 || newer(generation, *last) {
                *last = generation;
            }
            if detached {
                None
            } else {
                ready.waiter.take()
            }
        };
        if let Some(w) = waiter {
            w.wake();
        }
    }
}

/// The shared slot of one task's output.
pub(crate) struct JoinSlot<T> {
    state: Mutex<SlotState<T>>,
    ready: Condvar,
}

struct SlotState<T> {
    output: Option<Result<T, JoinError>>,
    finished: bool,
    waiter: Option<Waker>,
    /// True while a thread is blocked in [`JoinSlot::wait`]: only then
    /// does the finish signal the condition variable.
    blocked: bool,
    /// The task's key on its worker once spawned, so that only its own
    /// panic is taken as its result.
    key: Option<TaskKey>,
    /// The set the task belongs to, and its id there.
    set: Option<(Arc<SetNotify>, u64)>,
    /// An abort that came through a [`RemoteJoinHandle`] before the task
    /// was spawned on its worker: the task is then never spawned.
    abort_requested: bool,
    /// How a [`RemoteJoinHandle`], which holds only this slot, aborts the
    /// task: set by `Handle::spawn_on`, taken by the first abort or the
    /// finish. A blocking job has none.
    aborter: Option<Aborter>,
    /// Shared with the task's `AbortHandle`s (made for the first one), so
    /// they tell whether it finished without holding its output's type.
    done: Option<std::sync::Arc<AtomicBool>>,
}

/// What a [`RemoteJoinHandle`] calls to abort its task: it sends the abort
/// to the task's worker.
pub(crate) type Aborter = Box<dyn FnOnce() + Send>;

/// Locks `m`, ignoring poison: every critical section here leaves the
/// state whole (no user code runs under these locks).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<T> JoinSlot<T> {
    /// An empty slot; `set` is the join set to tell when it is filled,
    /// `key` the task's key if it is known already.
    pub(crate) fn new(set: Option<(Arc<SetNotify>, u64)>, key: Option<TaskKey>) -> Arc<Self> {
        Arc::new(JoinSlot {
            state: Mutex::new(SlotState {
                output: None,
                finished: false,
                waiter: None,
                blocked: false,
                key,
                set,
                abort_requested: false,
                aborter: None,
                done: None,
            }),
            ready: Condvar::new(),
        })
    }

    /// Records the key of the task spawned for this slot.
    pub(crate) fn set_key(&self, key: TaskKey) {
        lock(&self.state).key = Some(key);
    }

    /// Stores the task's result (the first one only) and wakes its waiter
    /// and its set.
    pub(crate) fn finish(&self, result: Result<T, JoinError>) {
        let (waiter, set, blocked, aborter) = {
            let mut st = lock(&self.state);
            if st.finished {
                return;
            }
            st.finished = true;
            st.output = Some(result);
            if let Some(done) = &st.done {
                done.store(true, Ordering::Release);
            }
            (st.waiter.take(), st.set.take(), st.blocked, st.aborter.take())
        };
        // Dropped outside the lock: it holds this slot.
        drop(aborter);
        // A thread that blocks after the lock was released finds the
        // output before it waits, so no signal can be missed.
        if blocked {
            self.ready.notify_all();
        }
        if let Some(w) = waiter {
            w.wake();
        }
        if let Some((set, id)) = set {
            set.finished(id);
        }
    }

    /// The output if it is there; else files `waker` to be woken when it is.
    ///
    /// # Panics
    /// If the output was already taken.
    pub(crate) fn poll_output(&self, waker: &Waker) -> Poll<Result<T, JoinError>> {
        let mut st = lock(&self.state);
        if let Some(out) = st.output.take() {
            return Poll::Ready(out);
        }
        assert!(!st.finished, "a join handle was polled after it returned its output");
        match &st.waiter {
            Some(w) if w.will_wake(waker) => {}
            _ => st.waiter = Some(waker.clone()),
        }
        Poll::Pending
    }

    /// The output if it is there, without filing a waker.
    pub(crate) fn take_output(&self) -> Option<Result<T, JoinError>> {
        lock(&self.state).output.take()
    }

    /// Blocks the calling thread until the output is there.
    pub(crate) fn wait(&self) -> Result<T, JoinError> {
        let mut st = lock(&self.state);
        loop {
            if let Some(out) = st.output.take() {
                return out;
            }
            st.blocked = true;
            st = self.ready.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// True once the task has finished, was aborted, or panicked.
    pub(crate) fn is_finished(&self) -> bool {
        lock(&self.state).finished
    }

    /// The task's key on its worker, once it is spawned there.
    pub(crate) fn key(&self) -> Option<TaskKey> {
        lock(&self.state).key
    }

    /// Files how a [`RemoteJoinHandle`] aborts the task.
    pub(crate) fn set_aborter(&self, aborter: Aborter) {
        let mut st = lock(&self.state);
        if !st.finished {
            st.aborter = Some(aborter);
        }
    }

    /// True if the task was aborted before it was spawned (or a blocking
    /// job before it started).
    pub(crate) fn abort_requested(&self) -> bool {
        lock(&self.state).abort_requested
    }

    /// Aborts the task through its aborter, once; does nothing once the
    /// task has finished. A blocking job has no aborter: the flag alone
    /// keeps it from starting.
    fn abort_remote(&self) {
        let aborter = {
            let mut st = lock(&self.state);
            if st.finished {
                return;
            }
            st.abort_requested = true;
            st.aborter.take()
        };
        if let Some(abort) = aborter {
            abort();
        }
    }

    /// The flag the task's `AbortHandle`s read: true once it finished.
    pub(crate) fn done_flag(&self) -> std::sync::Arc<AtomicBool> {
        let mut st = lock(&self.state);
        let finished = st.finished;
        st.done.get_or_insert_with(|| std::sync::Arc::new(AtomicBool::new(finished))).clone()
    }

    /// `None` once the slot is finished; else the task's key, if known.
    pub(crate) fn unfinished_key(&self) -> Option<Option<TaskKey>> {
        let st = lock(&self.state);
        (!st.finished).then_some(st.key)
    }
}

/// The blocking pool's side of a slot: finishes it with the job's
/// result, or, if the job is dropped unrun (at shutdown), with `Cancelled`.
/// A task's side, which also takes the task's panic, is `TaskCompletion`
/// in `join.rs`.
pub(crate) struct Completion<T: 'static>(pub(crate) Arc<JoinSlot<T>>);

impl<T: 'static> Drop for Completion<T> {
    fn drop(&mut self) {
        // A no-op if the job finished it.
        self.0.finish(Err(JoinError::Cancelled));
    }
}

/// A `Send` handle to a task spawned on a worker from another thread
/// (see [`Handle::spawn_on`](crate::Handle::spawn_on)).
pub struct RemoteJoinHandle<T> {
    pub(crate) slot: Arc<JoinSlot<T>>,
}

impl<T> RemoteJoinHandle<T> {
    /// Blocks the calling thread until the task finishes. Do not call it
    /// on a hotloop worker: it would stop that worker.
    pub fn join(self) -> Result<T, JoinError> {
        self.slot.wait()
    }

    /// True once the task has finished.
    pub fn is_finished(&self) -> bool {
        self.slot.is_finished()
    }

    /// Cancels the task from any thread, as
    /// [`JoinHandle::abort`](super::JoinHandle::abort) does: the abort
    /// goes through the worker's inbox, and the task's future is dropped
    /// at that worker's next turn (if it has not started yet, it never
    /// runs). Awaiting or joining the handle then gives
    /// `JoinError::Cancelled`, unless the task had already finished.
    ///
    /// A job of the blocking pool ([`spawn_blocking`](crate::spawn_blocking))
    /// that has not started is not run, and gives `JoinError::Cancelled`;
    /// one that has started runs to its end (a thread cannot be stopped),
    /// as with tokio.
    pub fn abort(&self) {
        self.slot.abort_remote();
    }
}

impl<T> Future for RemoteJoinHandle<T> {
    type Output = Result<T, JoinError>;

    /// A result found ready takes a unit of the task's budget (`coop.rs`).
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        crate::coop::poll_budgeted(cx, |cx| self.slot.poll_output(cx.waker()))
    }
}

#[cfg(all(test, hotloop_loom))]
mod loom_tests {
    use super::{JoinSlot, SetNotify};
    use loom::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Poll, Wake, Waker};

    struct Flag(AtomicBool);

    impl Wake for Flag {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A handle polled on one thread while the task finishes on another
    /// either gets the output at once or is woken, and the set hears of
    /// the finish exactly once: no interleaving loses either.
    #[test]
    fn a_poll_racing_the_finish_loses_neither_output_nor_wake() {
        loom::model(|| {
            let set = SetNotify::new();
            let slot = JoinSlot::<u32>::new(Some((set.clone(), 7)), None);
            let worker = {
                let slot = slot.clone();
                loom::thread::spawn(move || slot.finish(Ok(5)))
            };
            let flag = std::sync::Arc::new(Flag(AtomicBool::new(false)));
            let waker = Waker::from(flag.clone());
            let first = slot.poll_output(&waker);
            worker.join().unwrap();
            match first {
                Poll::Ready(out) => assert_eq!(out.ok(), Some(5)),
                Poll::Pending => {
                    assert!(flag.0.load(Ordering::SeqCst), "the finish did not wake the handle");
                    assert_eq!(slot.take_output().and_then(Result::ok), Some(5));
                }
            }
            assert_eq!(super::lock(&set.ready).ids.iter().copied().collect::<Vec<_>>(), vec![7]);
        });
    }

    /// A thread blocked in `wait` while the task finishes on another is
    /// always woken with the output, though the finish signals the
    /// condition variable only when it sees a thread blocked.
    #[test]
    fn a_blocking_wait_racing_the_finish_gets_the_output() {
        loom::model(|| {
            let slot = JoinSlot::<u32>::new(None, None);
            let worker = {
                let slot = slot.clone();
                loom::thread::spawn(move || slot.finish(Ok(9)))
            };
            assert_eq!(slot.wait().ok(), Some(9));
            worker.join().unwrap();
        });
    }
}
