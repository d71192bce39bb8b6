//! How long a driver's poll may block, and the error of a wait on a
//! driver whose runtime is not running on this thread. Both backends use
//! them; the runtime says how to park.

use std::io;

/// How long one poll of a driver may block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Park {
    /// Do not block: take what is ready.
    Skip,
    /// Block until something happens or, if given, until this time on
    /// `CLOCK_MONOTONIC` in nanoseconds (`sys::monotonic_ns`'s clock).
    ///
    /// A deadline rather than a timeout: a driver that keeps a timer of
    /// its own armed (epoll's timerfd) re-arms it only when the deadline
    /// moves earlier, instead of setting up a kernel timer for every
    /// wait.
    Until(Option<u64>),
}

/// The error of an operation that would wait on a driver whose runtime is
/// not running on this thread.
pub(crate) fn not_running() -> io::Error {
    io::Error::other(
        "this socket belongs to a hotloop runtime that is not running on this thread: \
         use it inside the `block_on` or the worker that created it",
    )
}
