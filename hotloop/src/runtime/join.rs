//! Spawning tasks and waiting for them: `spawn`, `JoinHandle`, `JoinError`.

use std::any::Any;
use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context as TaskContext, Poll, Waker};

use super::context::{self, Context};
use super::task::{Task, TaskKey};
use crate::stats;

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

/// Where a task's output waits for its `JoinHandle`.
struct JoinSlot<T> {
    output: Option<Result<T, JoinError>>,
    finished: bool,
    waiter: Option<Waker>,
    /// The task's key, so only its own panic is taken as its result.
    key: TaskKey,
}

/// Completes the join slot when the task finishes or is dropped unfinished.
struct Completion<T: 'static> {
    slot: Rc<RefCell<JoinSlot<T>>>,
}

impl<T: 'static> Completion<T> {
    fn finish(&self, result: Result<T, JoinError>) {
        let waiter = {
            let mut slot = self.slot.borrow_mut();
            if slot.finished {
                return;
            }
            slot.finished = true;
            slot.output = Some(result);
            slot.waiter.take()
        };
        if let Some(w) = waiter {
            w.wake();
        }
    }
}

impl<T: 'static> Drop for Completion<T> {
    fn drop(&mut self) {
        if self.slot.borrow().finished {
            return;
        }
        // Dropped unfinished: aborted, shut down, or panicked (the executor
        // parks the payload in the context before dropping the task).
        let key = self.slot.borrow().key;
        self.finish(Err(take_panic(key).map_or(JoinError::Cancelled, JoinError::Panicked)));
    }
}

/// The payload of the panic of task `key`, if that task is the one being
/// dropped because it panicked.
fn take_panic(key: TaskKey) -> Option<Box<dyn Any + Send>> {
    context::try_with(|cx| {
        let mut parked = cx.panic_payload.borrow_mut();
        match &*parked {
            Some((k, _)) if *k == key => parked.take().map(|(_, payload)| payload),
            _ => None,
        }
    })
    .flatten()
}

/// An owned permission to await a task's output or abort it.
///
/// Dropping the handle detaches the task: it keeps running.
/// A `JoinHandle` belongs to the worker that spawned the task (it is `!Send`).
pub struct JoinHandle<T> {
    slot: Rc<RefCell<JoinSlot<T>>>,
    key: TaskKey,
    /// The worker the task runs on; a `Weak` so that a handle kept inside
    /// a task does not keep its worker alive.
    owner: Weak<Context>,
}

impl<T> JoinHandle<T> {
    /// Cancels the task: its future is dropped at once (or, if the task is
    /// the one running now, as soon as its current poll returns). Awaiting
    /// the handle then gives `JoinError::Cancelled`, unless the task had
    /// already finished.
    pub fn abort(&self) {
        let Some(owner) = self.owner.upgrade() else {
            return; // the runtime is gone, and the task with it
        };
        let key = self.key;
        let current = context::try_with(|cx| std::ptr::eq(cx, &*owner)).unwrap_or(false);
        let removed = {
            let Ok(mut tasks) = owner.tasks.try_borrow_mut() else { return };
            match tasks.get_mut(key) {
                // Running now, or its runtime is not the one running here:
                // mark it, and its own worker drops it when it comes up.
                Some(task) if task.future.is_none() || !current => {
                    task.aborted = true;
                    if !current {
                        owner.run_queue.borrow_mut().push_back(key);
                    }
                    None
                }
                Some(_) => tasks.remove(key),
                None => None,
            }
        };
        // Dropped outside the borrow, and guarded: its destructors may touch
        // the runtime, or panic.
        super::worker::drop_guarded(removed);
    }

    /// True once the task has finished, was aborted, or panicked.
    pub fn is_finished(&self) -> bool {
        self.slot.borrow().finished
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, JoinError>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let mut slot = self.slot.borrow_mut();
        if let Some(out) = slot.output.take() {
            return Poll::Ready(out);
        }
        assert!(!slot.finished, "JoinHandle polled after it returned its output");
        match &slot.waiter {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => slot.waiter = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

/// Spawns a future on the current worker and returns a handle to its output.
///
/// The future need not be `Send`: it never leaves this worker.
///
/// # Panics
/// Outside a hotloop worker.
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    let slot =
        Rc::new(RefCell::new(JoinSlot { output: None, finished: false, waiter: None, key: 0 }));
    let completion = Completion { slot: slot.clone() };
    let key = spawn_detached(OnDone::new(future, move |out| completion.finish(Ok(out))));
    slot.borrow_mut().key = key;
    let owner = context::current().map_or_else(Weak::new, |cx| Rc::downgrade(&cx));
    JoinHandle { slot, key, owner }
}

/// Spawns a future whose output nobody awaits (a connection handler): no
/// join slot is allocated. Returns the task's key.
#[inline]
pub(crate) fn spawn_detached<F: Future<Output = ()> + 'static>(future: F) -> TaskKey {
    // Boxed first, so the future (a connection handler's can be a kilobyte)
    // is copied once, onto the heap, rather than again at every call below.
    spawn_boxed(Box::pin(future))
}

fn spawn_boxed(future: super::task::TaskFuture) -> TaskKey {
    context::with(|cx| {
        let mut tasks = cx.tasks.borrow_mut();
        let key = tasks.next_key();
        let header = tasks.waker_for(key, &cx.shared);
        let waker = Waker::from(header.clone());
        let inserted = tasks.insert(Task {
            future: Some(future),
            waker: waker.clone(),
            header,
            aborted: false,
        });
        debug_assert_eq!(inserted, key);
        drop(tasks);
        stats::add(&cx.shared.stats.tasks_spawned, 1);
        waker.wake();
        key
    })
}

pin_project_lite::pin_project! {
    /// Runs `future`, then hands its output to `on_done`.
    ///
    /// A struct rather than an `async` block: an `async` block that awaits a
    /// future it captured stores that future twice (rust-lang/rust#62958),
    /// doubling the memory of every task.
    pub(crate) struct OnDone<F, C> {
        #[pin]
        future: F,
        on_done: Option<C>,
    }
}

impl<F: Future, C: FnOnce(F::Output)> OnDone<F, C> {
    pub(crate) fn new(future: F, on_done: C) -> Self {
        OnDone { future, on_done: Some(on_done) }
    }
}

impl<F: Future, C: FnOnce(F::Output)> Future for OnDone<F, C> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
        let this = self.project();
        let out = std::task::ready!(this.future.poll(cx));
        if let Some(done) = this.on_done.take() {
            done(out);
        }
        Poll::Ready(())
    }
}

/// Yields to the other tasks of this worker once.
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(move |cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// Waits until the worker has polled its driver once more, so that I/O and
/// timers get their turn before the caller continues.
pub(crate) async fn yield_to_driver() {
    let start_turn = context::with(|cx| cx.turn.get());
    std::future::poll_fn(move |task_cx| {
        context::with(|cx| {
            if cx.turn.get() != start_turn {
                Poll::Ready(())
            } else {
                cx.after_poll.borrow_mut().push(task_cx.waker().clone());
                Poll::Pending
            }
        })
    })
    .await
}

/// The shared state behind a [`RemoteJoinHandle`].
pub(crate) struct RemoteSlot<T> {
    state: Mutex<RemoteState<T>>,
    ready: Condvar,
}

struct RemoteState<T> {
    output: Option<Result<T, JoinError>>,
    finished: bool,
    waiter: Option<Waker>,
    /// The task's key on its worker, once spawned.
    key: Option<TaskKey>,
}

impl<T> RemoteSlot<T> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(RemoteSlot {
            state: Mutex::new(RemoteState {
                output: None,
                finished: false,
                waiter: None,
                key: None,
            }),
            ready: Condvar::new(),
        })
    }

    /// Records the key of the task spawned for this slot.
    pub(crate) fn set_key(&self, key: TaskKey) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).key = Some(key);
    }

    pub(crate) fn finish(&self, result: Result<T, JoinError>) {
        let waiter = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.finished {
                return;
            }
            st.finished = true;
            st.output = Some(result);
            st.waiter.take()
        };
        self.ready.notify_all();
        if let Some(w) = waiter {
            w.wake();
        }
    }
}

/// A `Send` handle to a task spawned on a worker from another thread
/// (see [`Handle::spawn_on`](crate::Handle::spawn_on)).
pub struct RemoteJoinHandle<T> {
    pub(crate) slot: Arc<RemoteSlot<T>>,
}

impl<T> RemoteJoinHandle<T> {
    /// Blocks the calling thread until the task finishes. Do not call it
    /// on a hotloop worker: it would stop that worker.
    pub fn join(self) -> Result<T, JoinError> {
        let mut st = self.slot.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(out) = st.output.take() {
                return out;
            }
            st = self.slot.ready.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// True once the task has finished.
    pub fn is_finished(&self) -> bool {
        self.slot.state.lock().unwrap_or_else(|e| e.into_inner()).finished
    }
}

impl<T> Future for RemoteJoinHandle<T> {
    type Output = Result<T, JoinError>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let mut st = self.slot.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(out) = st.output.take() {
            return Poll::Ready(out);
        }
        st.waiter = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// Finishes a remote slot as cancelled if the task is dropped unfinished.
pub(crate) struct RemoteCompletion<T: Send + 'static>(pub(crate) Arc<RemoteSlot<T>>);

impl<T: Send + 'static> Drop for RemoteCompletion<T> {
    fn drop(&mut self) {
        let key = {
            let st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.finished {
                return;
            }
            st.key
        };
        let panic = key.and_then(take_panic);
        self.0.finish(Err(panic.map_or(JoinError::Cancelled, JoinError::Panicked)));
    }
}
