//! Without the `tokio-time` feature (on by default) no tokio runtime is
//! hosted: a task that calls `tokio::time` (or `tokio::spawn`) panics with
//! tokio's message, and the worker's panic report names the feature and
//! hotloop's own timers; a hyper service that does so is answered `500`.

/// Nothing to keep entered.
pub(crate) struct Guard;

/// Does nothing: the feature is off.
pub(crate) fn enter() -> Guard {
    Guard
}
