//! Operator events: what the runtime decided and why (driver chosen,
//! fallback, listeners paused, shutdown), never anything per operation.
//!
//! With the `tracing` feature (on by default) they are `tracing` events
//! with target `hotloop`. A warning is also printed to stderr when no
//! `tracing` subscriber is installed, so a fallback is never silent.

use std::fmt::Arguments;

/// Something an operator should act on (a fallback, descriptors running out).
pub(crate) fn warn(args: Arguments<'_>) {
    #[cfg(feature = "tracing")]
    {
        if tracing::dispatcher::has_been_set() {
            tracing::warn!(target: "hotloop", "{}", args);
            return;
        }
    }
    line(format_args!("hotloop: {args}"));
}

/// Writes one line to stderr. A stderr that fails (the terminal or pipe
/// that started the process went away) loses the line: `eprintln!` would
/// panic instead, and take a worker, a drain or the process with it.
pub(crate) fn line(args: Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}

/// Something worth knowing (the driver chosen, a limit reached, shutdown progress).
pub(crate) fn info(args: Arguments<'_>) {
    #[cfg(feature = "tracing")]
    tracing::info!(target: "hotloop", "{}", args);
    #[cfg(not(feature = "tracing"))]
    let _ = args;
}
