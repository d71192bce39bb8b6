//! tokio's timer for code that calls `tokio::time` inside hotloop tasks
//! (tower's and tower-http's timeout layers, libraries that sleep).
//!
//! # Implementation notes
//! One current-thread tokio runtime with only its time driver enabled
//! runs on a thread of its own (`hotloop-tokio-time`), made the first time
//! a worker starts, and every worker enters its handle while it runs, so
//! `tokio::time::sleep` finds a timer. The timer thread sleeps until the
//! earliest tokio deadline and wakes the task through its hotloop waker
//! (the worker's inbox). Workers that never call `tokio::time` pay one
//! thread-local write when they start, nothing per turn. A worker started
//! inside another tokio context keeps that one. tokio's timers do not
//! follow hotloop's paused time.

use std::sync::OnceLock;

/// The timer runtime's handle, or `None` if it could not start.
static TIMER: OnceLock<Option<tokio::runtime::Handle>> = OnceLock::new();

/// Keeps the timer runtime entered on this thread while it lives.
pub(crate) struct Guard(#[allow(dead_code)] Option<tokio::runtime::EnterGuard<'static>>);

/// Enters the timer runtime on this thread, unless a tokio runtime is
/// entered here already.
pub(crate) fn enter() -> Guard {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Guard(None);
    }
    Guard(TIMER.get_or_init(start).as_ref().map(|h| h.enter()))
}

fn start() -> Option<tokio::runtime::Handle> {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_time().build() {
        Ok(rt) => rt,
        Err(e) => {
            crate::log::warn(format_args!(
                "tokio's timer did not start ({e}); tokio::time will panic"
            ));
            return None;
        }
    };
    let handle = rt.handle().clone();
    let thread = std::thread::Builder::new()
        .name("hotloop-tokio-time".into())
        .spawn(move || rt.block_on(std::future::pending::<()>()));
    match thread {
        Ok(_) => Some(handle),
        Err(e) => {
            crate::log::warn(format_args!("tokio's timer thread did not start ({e})"));
            None
        }
    }
}
