//! Tasks, where a tokio user looks for them (`tokio::task`): spawning,
//! joining, aborting, groups of tasks, task-local values, yielding and
//! blocking work.
//!
//! Every task runs on the worker that spawned it; [`spawn_local`] is
//! [`spawn`] under tokio's name for a `!Send` task. [`run_local`] runs
//! hotloop I/O from code that must be `Send` (an axum handler) and gives
//! its result back as a `Send` future. [`task_local!`](macro@crate::task_local)
//! declares task-local keys ([`LocalKey`]). Each poll of a task may make
//! 128 I/O operations that complete without waiting before the next one
//! gives way to the worker's other tasks; [`unconstrained`] lifts that
//! budget for one future.

pub use crate::coop::{unconstrained, Unconstrained};
pub use crate::runtime::{
    run_local, spawn, spawn_blocking, wake_all, yield_now, AbortHandle, JoinError, JoinHandle,
    JoinSet, RemoteJoinHandle, RunLocal,
};
pub use crate::task_local::{AccessError, LocalKey, TaskLocalFuture};

/// [`spawn`] under the name tokio gives it for `!Send` futures: every
/// hotloop task stays on its worker, so the two are the same.
///
/// # Panics
/// Outside a hotloop worker.
pub fn spawn_local<F>(future: F) -> JoinHandle<F::Output>
where
    F: std::future::Future + 'static,
    F::Output: 'static,
{
    spawn(future)
}
