//! Tasks, where a tokio user looks for them (`tokio::task`): spawning,
//! joining, groups of tasks, yielding and blocking work.
//!
//! Every task runs on the worker that spawned it; [`spawn_local`] is
//! [`spawn`] under tokio's name for a `!Send` task.

pub use crate::runtime::{
    spawn, spawn_blocking, wake_all, yield_now, JoinError, JoinHandle, JoinSet, RemoteJoinHandle,
};

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
