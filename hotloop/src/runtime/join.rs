//! Spawning tasks and waiting for them: `spawn`, `JoinHandle`, and a
//! task's side of its join slot (`TaskCompletion`), which takes the task's
//! panic from the context.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll, Waker};

use super::context::{self, Context};
use super::join_slot::{JoinError, JoinSlot, SetNotify};
use super::key::TaskKey;
use super::shared::WorkerShared;
use super::task::Task;
use crate::loom::sync::Arc;
use crate::stats;

/// An owned permission to await a task's output or abort it.
///
/// Dropping the handle detaches the task: it keeps running. The task runs
/// on the worker that spawned it, but the handle may go anywhere: it is
/// `Send` when the output is, so a `Send` future (an axum handler, a
/// future for another runtime) can spawn hotloop I/O and await its result.
pub struct JoinHandle<T> {
    slot: Arc<JoinSlot<T>>,
    key: TaskKey,
    /// The worker the task runs on: its inbox takes an abort sent from
    /// elsewhere. Holding it does not keep the worker's tasks alive.
    owner: std::sync::Arc<WorkerShared>,
    /// Which context of that worker (its `uid`) holds the task.
    owner_uid: u64,
}

impl<T> JoinHandle<T> {
    /// Cancels the task: its future is dropped at once (or, if the task is
    /// the one running now, as soon as its current poll returns; from
    /// another thread, at its worker's next turn). Awaiting the handle then
    /// gives `JoinError::Cancelled`, unless the task had already finished.
    pub fn abort(&self) {
        abort_task(&self.owner, self.owner_uid, self.key);
    }

    /// A handle that aborts the task without owning its output: it is
    /// `Send`, `Sync` and `Clone` whatever the output, so it can go to
    /// another task or thread while this handle awaits the output.
    pub fn abort_handle(&self) -> AbortHandle {
        self.abort_handle_with(Done::Flag(self.slot.done_flag()))
    }

    /// An `AbortHandle` that tells the task's finish by `done`.
    pub(crate) fn abort_handle_with(&self, done: Done) -> AbortHandle {
        AbortHandle { key: self.key, owner: self.owner.clone(), owner_uid: self.owner_uid, done }
    }

    /// True once the task has finished, was aborted, or panicked.
    pub fn is_finished(&self) -> bool {
        self.slot.is_finished()
    }

    /// The output if the task has finished and it was not taken yet;
    /// never waits.
    pub(crate) fn take_output(&self) -> Option<Result<T, JoinError>> {
        self.slot.take_output()
    }
}

/// Aborts task `key` of the context `owner_uid` on worker `owner`: at
/// once if that context runs on this thread, else through its inbox.
fn abort_task(owner: &WorkerShared, owner_uid: u64, key: TaskKey) {
    match context::current() {
        Some(cx) if cx.uid == owner_uid => abort_local(&cx, key),
        _ => owner.push_runnable(Box::new(move || {
            if let Some(cx) = context::current().filter(|cx| cx.uid == owner_uid) {
                abort_local(&cx, key);
            }
        })),
    }
}

/// Aborts task `key` of `cx`, the context running on this thread: marks
/// it and queues it, and the executor drops it at its turn in the run
/// queue (or after its poll, if it is running now), as tokio does. Not
/// here: the caller may hold a borrow the task's destructors take (a
/// registry of connections each removes itself from), and they would see
/// the caller's task-local values.
pub(crate) fn abort_local(cx: &Context, key: TaskKey) {
    let header = match cx.tasks.try_borrow_mut() {
        Ok(mut tasks) => tasks.get_mut(key).map(|task| {
            task.set_aborted();
            task.header.clone()
        }),
        Err(_) => {
            // Inside a move of the slab (a destructor it runs): again
            // once that is over.
            let owner_uid = cx.uid;
            cx.shared.push_runnable(Box::new(move || {
                if let Some(cx) = context::current().filter(|cx| cx.uid == owner_uid) {
                    abort_local(&cx, key);
                }
            }));
            None
        }
    };
    if let Some(header) = header {
        std::task::Wake::wake_by_ref(&header);
    }
}

/// Aborts a task without owning its output, as tokio's `AbortHandle`:
/// from [`JoinHandle::abort_handle`] or [`JoinSet::spawn`](super::JoinSet::spawn).
///
/// It is `Send`, `Sync` and `Clone` whatever the task's output, and
/// dropping it does nothing to the task.
#[derive(Clone)]
pub struct AbortHandle {
    key: TaskKey,
    owner: std::sync::Arc<WorkerShared>,
    owner_uid: u64,
    done: Done,
}

/// Where an [`AbortHandle`] reads whether its task finished.
#[derive(Clone)]
pub(crate) enum Done {
    /// A flag the task's join slot sets (made for the first handle).
    Flag(std::sync::Arc<std::sync::atomic::AtomicBool>),
    /// The task's set, which records its tasks' finishes anyway, and the
    /// task's id there: a set's task needs no allocation for its handle.
    InSet(Arc<SetNotify>, u64),
}

impl AbortHandle {
    /// Cancels the task, as [`JoinHandle::abort`] does (from any thread;
    /// nothing if it has finished).
    pub fn abort(&self) {
        abort_task(&self.owner, self.owner_uid, self.key);
    }

    /// True once the task has finished, was aborted, or panicked.
    pub fn is_finished(&self) -> bool {
        match &self.done {
            Done::Flag(flag) => flag.load(std::sync::atomic::Ordering::Acquire),
            Done::InSet(set, id) => set.has_finished(*id),
        }
    }
}

impl fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AbortHandle").field("finished", &self.is_finished()).finish()
    }
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle").field("finished", &self.is_finished()).finish()
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, JoinError>;

    /// A result found ready takes a unit of the task's budget (`coop.rs`).
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        crate::coop::poll_budgeted(cx, |cx| self.slot.poll_output(cx.waker()))
    }
}

/// Spawns a future on the current worker and returns a handle to its output.
///
/// The future need not be `Send`: it never leaves this worker. The handle
/// is `Send` when the output is.
///
/// # Panics
/// Outside a hotloop worker.
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    spawn_in_set(future, None)
}

/// Runs `future` as a task of this worker and returns a `Send` future of
/// its result, for code that must be `Send` (an axum handler, a tower
/// service) and awaits hotloop I/O, files or processes, whose futures are
/// not.
///
/// The future is spawned at once (so it is never held across an
/// `.await` of the caller), runs on this worker, and its output comes
/// back through the returned [`RunLocal`], which is `Send` when the
/// output is. A panic or an abort of the task becomes an error of the
/// output's own type through `From<JoinError>` (`io::Error` has it), so
/// one `?` or `map_err` handles both. Dropping the `RunLocal` before it
/// finishes aborts the task, as dropping the future awaited in place
/// would cancel it.
///
/// ```no_run
/// use axum::http::StatusCode;
///
/// /// An axum handler: its future must be `Send`, `hotloop::fs::read`'s is not.
/// async fn motd() -> Result<Vec<u8>, StatusCode> {
///     hotloop::task::run_local(hotloop::fs::read("/etc/motd"))
///         .await
///         .map_err(|_| StatusCode::NOT_FOUND)
/// }
///
/// let app: axum::Router = axum::Router::new().route("/motd", axum::routing::get(motd));
/// ```
///
/// For an output that is not a `Result`, [`spawn`] returns a `Send`
/// [`JoinHandle`] the same way, whose output is `Result<T, JoinError>`.
///
/// # Panics
/// Outside a hotloop worker.
pub fn run_local<F, T, E>(future: F) -> RunLocal<T, E>
where
    F: Future<Output = Result<T, E>> + 'static,
    T: 'static,
    E: From<JoinError> + 'static,
{
    RunLocal { handle: spawn(future), done: false }
}

/// The future of [`run_local`]: the task's output, its panic or abort as
/// an error of the output's type. `Send` when the output is. Dropping it
/// unfinished aborts the task.
#[must_use = "dropping it aborts the task; await it"]
pub struct RunLocal<T, E> {
    handle: JoinHandle<Result<T, E>>,
    done: bool,
}

impl<T, E: From<JoinError>> Future for RunLocal<T, E> {
    type Output = Result<T, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let out = std::task::ready!(Pin::new(&mut self.handle).poll(cx));
        self.done = true;
        Poll::Ready(out.unwrap_or_else(|e| Err(E::from(e))))
    }
}

impl<T, E> Drop for RunLocal<T, E> {
    fn drop(&mut self) {
        if !self.done {
            self.handle.abort();
        }
    }
}

impl<T, E> fmt::Debug for RunLocal<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunLocal").field("finished", &self.handle.is_finished()).finish()
    }
}

/// [`spawn`], telling `set` when the task finishes.
pub(crate) fn spawn_in_set<F>(
    future: F,
    set: Option<(Arc<SetNotify>, u64)>,
) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    // The key the task will get, so the slot is made whole (no lock to
    // record it afterwards); nothing is spawned in between.
    let (key, owner, owner_uid) =
        context::with(|cx| (cx.tasks.borrow().next_key(), cx.shared.clone(), cx.uid));
    let slot = JoinSlot::new(set, Some(key));
    let completion = TaskCompletion(slot.clone());
    let spawned =
        spawn_detached_with(move || OnDone::new(future, move |out| completion.0.finish(Ok(out))));
    debug_assert_eq!(spawned, key);
    JoinHandle { slot, key, owner, owner_uid }
}

/// A task's side of its join slot: finishes it with the output, or, if the
/// task is dropped unfinished, with `Cancelled` (or its panic).
pub(crate) struct TaskCompletion<T: 'static>(pub(crate) Arc<JoinSlot<T>>);

impl<T: 'static> Drop for TaskCompletion<T> {
    fn drop(&mut self) {
        let Some(key) = self.0.unfinished_key() else { return };
        // Dropped unfinished: aborted, shut down, or panicked (the executor
        // parks the payload in the context before dropping the task).
        let panic = key.and_then(take_panic);
        self.0.finish(Err(panic.map_or(JoinError::Cancelled, JoinError::Panicked)));
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

/// Spawns a future whose output nobody awaits (a connection handler): no
/// join slot is allocated. Returns the task's key.
#[inline]
pub(crate) fn spawn_detached<F: Future<Output = ()> + 'static>(future: F) -> TaskKey {
    spawn_detached_with(move || future)
}

/// [`spawn_detached`] for the future `make` returns, built straight into
/// its heap allocation: a connection handler's future (hundreds of bytes,
/// most of them states not yet entered) is then neither built on the
/// stack nor copied whole to the heap.
#[inline]
pub(crate) fn spawn_detached_with<F, M>(make: M) -> TaskKey
where
    F: Future<Output = ()> + 'static,
    M: FnOnce() -> F,
{
    // Boxed first, so the future is copied at most once, onto the heap,
    // rather than again at every call below.
    let future: Box<F> = Box::write(Box::new_uninit(), make());
    spawn_boxed(Box::into_pin(future))
}

fn spawn_boxed(future: super::task::TaskFuture) -> TaskKey {
    context::with(|cx| {
        let mut tasks = cx.tasks.borrow_mut();
        let key = tasks.next_key();
        let header = tasks.waker_for(key, &cx.shared);
        let waker = Waker::from(header.clone());
        let inserted = tasks.insert(Task { future: Some(future), waker: waker.clone(), header });
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

/// Polls the task `key` now, inside the caller's poll, if it is the only
/// task waiting to run (typically just spawned); true if it was polled.
///
/// For the accept loop: serving a new connection's first poll in place
/// gives the order a [`yield_now`] would (the new task, then the loop)
/// without the loop's own wake, queueing and poll. With other tasks
/// waiting it does nothing, so a new task never runs ahead of them. It
/// takes two polls from the turn's budget, the two that the yield would
/// have cost, and declines when they are not left: the worker gets back
/// to its driver as often as it would have.
pub(crate) fn run_now_if_alone(key: TaskKey) -> bool {
    // The context is held by its own handle, not through the thread's cell:
    // the poll below runs with that cell free, as the loop's polls do (a
    // task that drops a `Runtime` briefly installs that runtime's context
    // in it).
    let Some(cx) = context::current() else { return false };
    let left = cx.polls_left.get();
    if left < 2 {
        return false;
    }
    {
        let mut queue = cx.run_queue.borrow_mut();
        if queue.len() != 1 || queue.front() != Some(&key) {
            return false;
        }
        queue.pop_front();
    }
    cx.polls_left.set(left - 2);
    super::worker::run_task(&cx, key);
    true
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

/// Wakes every task of the current worker once, and the future its
/// `block_on` runs, if any; returns how many tasks it woke.
///
/// A correct future takes a wake it did not ask for as a reason to look
/// again (it polls, finds nothing new and parks), so this is harmless to
/// every task and reaches the ones parked on waits no list records. It is
/// how a graceful stop reaches idle connections without a registration
/// per connection: set a flag the tasks check when they wait, then call
/// this on each worker ([`Handle::spawn_on`](super::Handle::spawn_on)).
/// The tasks run in the worker's next turn; the caller's own task is
/// woken too. It costs one wake per task, so it is for rare events.
///
/// # Panics
/// Outside a hotloop worker.
pub fn wake_all() -> usize {
    // Collected first: a wake on this worker pushes onto its run queue,
    // which must not happen while the task slab is borrowed.
    // Through each task's header, not its `waker` field: the task being
    // polled (the caller's own) has a no-op there until its poll ends.
    let headers: Vec<_> = context::with(|cx| {
        // A worker without a `block_on` future skips the entry; one whose
        // future is already queued polls it once more.
        cx.run_queue.borrow_mut().push_back(super::task::MAIN_TASK);
        cx.tasks.borrow().iter().map(|t| t.header.clone()).collect()
    });
    let woken = headers.len();
    for header in headers {
        std::task::Wake::wake_by_ref(&header);
    }
    woken
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
