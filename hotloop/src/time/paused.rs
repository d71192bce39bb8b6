//! Paused time for tests: [`pause`], [`advance`], [`resume`].
//!
//! # Implementation notes
//! Each worker has its own clock and wheel, so pausing acts on the
//! calling worker only (a `#[hotloop::test]` body and the tasks it spawns
//! share one). While paused, the loop's clock reads stop (an update
//! returns the paused time) and the loop never sleeps until a deadline:
//! when it has nothing to run it polls the driver without waiting, and
//! only if that brought no event, no message from another thread came in,
//! and no blocking-pool job is out, it moves the clock to the wheel's
//! next deadline (tokio's auto-advance). With no timer at all it blocks on
//! I/O as usual.

use std::time::Duration;

use crate::runtime::current;

/// Stops the current worker's clock: from now on its timers move only
/// with [`advance`], or when the worker has nothing else to do (then its
/// clock jumps to the next timer). Pausing a paused clock does nothing.
///
/// Deadlines made with `hotloop::time` (`sleep`, `timeout`, `interval`,
/// [`now`](super::now)) and everything built on them (server idle
/// timeouts, hyper's timers) follow the paused clock.
///
/// # Panics
/// Outside a hotloop worker.
pub fn pause() {
    current::pause_clock();
}

/// Starts the current worker's clock again, from the time it stands at
/// (it does not go back to the system clock's time if it moved ahead of
/// it). Resuming a running clock does nothing.
///
/// # Panics
/// Outside a hotloop worker.
pub fn resume() {
    current::resume_clock();
}

/// Moves the current worker's clock `by` forward, fires the timers that
/// are due by then, and yields, so the tasks they wake run before this
/// returns. On a running clock it moves the clock ahead of the system
/// clock by `by` for good.
///
/// # Panics
/// Outside a hotloop worker.
pub async fn advance(by: Duration) {
    current::advance_clock(by);
    crate::yield_now().await;
}
