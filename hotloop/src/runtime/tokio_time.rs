//! tokio's runtime parts for code that calls tokio inside hotloop tasks:
//! `tokio::time` (tower's and tower-http's timeout layers, libraries that
//! sleep, `tokio::time::timeout` in an axum handler), and whatever else of
//! tokio the program compiles in (`tokio::spawn`, `spawn_blocking`, and
//! `tokio::net` where tokio's `net` feature is on).
//!
//! # Implementation notes
//! One current-thread tokio runtime with every driver the build of tokio
//! has (`enable_all`: always the timer, the I/O reactor where tokio's `net`
//! feature is compiled in) runs on a thread of its own (`hotloop-tokio`),
//! made the first time a worker starts, and every worker enters its handle
//! while it runs, so `tokio::time::sleep` finds a timer. The thread sleeps
//! until the earliest tokio deadline or I/O event and wakes the task
//! through its hotloop waker (the worker's inbox); a future given to
//! `tokio::spawn` runs on that thread. Workers that never call tokio pay
//! one thread-local write when they start, nothing per turn, and the
//! process one sleeping thread (and, where tokio's reactor is compiled
//! in, its three descriptors), for the life of the process: the runtime
//! is made once and never shut down. A worker started inside another tokio
//! context keeps that one. tokio's timers do not follow hotloop's paused
//! time.

use std::sync::OnceLock;

/// The tokio runtime's handle, or `None` if it could not start.
static TOKIO: OnceLock<Option<tokio::runtime::Handle>> = OnceLock::new();

/// Keeps the tokio runtime entered on this thread while it lives.
pub(crate) struct Guard(#[allow(dead_code)] Option<tokio::runtime::EnterGuard<'static>>);

/// Enters the tokio runtime on this thread, unless a tokio runtime is
/// entered here already.
pub(crate) fn enter() -> Guard {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Guard(None);
    }
    Guard(TOKIO.get_or_init(start).as_ref().map(|h| h.enter()))
}

fn start() -> Option<tokio::runtime::Handle> {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            crate::log::warn(format_args!(
                "tokio's runtime for tokio calls in hotloop tasks did not start ({e}); \
                 tokio::time will panic"
            ));
            return None;
        }
    };
    let handle = rt.handle().clone();
    let thread = std::thread::Builder::new()
        .name("hotloop-tokio".into())
        .spawn(move || rt.block_on(std::future::pending::<()>()));
    match thread {
        Ok(_) => Some(handle),
        Err(e) => {
            crate::log::warn(format_args!("tokio's runtime thread did not start ({e})"));
            None
        }
    }
}
