//! Paused time for tests: [`pause`], [`advance`], [`resume`].
//!
//! # What holds a paused clock
//! A paused clock jumps to the next timer only when nothing on the worker
//! can happen without it: no task to run, no I/O event found by a poll of
//! the driver that does not wait, no message from another thread, and no
//! work in flight that ends only in real time. This is tokio's rule (it
//! auto-advances only with no work to run and nothing on its blocking pool),
//! and the work that holds the clock is:
//! - a job on the runtime's blocking pool ([`spawn_blocking`](crate::spawn_blocking)),
//!   queued or running, whichever worker queued it, until its result has
//!   reached the task: the pool counts a job as ended only after it handed
//!   the result over (`runtime/blocking.rs`). Everything built on the pool
//!   holds the clock this way: `hotloop::fs` on epoll (or for an opcode the
//!   ring lacks, or with `HOTLOOP_URING_FS=0`), and a host-name lookup;
//! - a file operation on the worker's io_uring ring (`hotloop::fs`), from
//!   its first poll until its future returns or is dropped (`fs/ops.rs`
//!   counts it in the worker's clock): file work waits in real time on
//!   both drivers, as it does in tokio, where it runs on the blocking pool.
//!
//! While such work is out, the loop waits for it (its wake through the
//! inbox, its completion, or the pool's unpark when its last job ends,
//! for a job whose result goes to no task of this worker) instead of
//! jumping (`runtime/worker.rs`, `paused_clock_held`). I/O does not hold the clock, as in tokio: a socket,
//! a child's piped stdio, a child's exit (its pidfd is watched by the
//! driver), a signal, `send_file` (which waits for the socket), or a task
//! on another worker. (A FIFO read through `hotloop::fs` is a file
//! operation, and holds it.)
//! A `timeout` around such a wait fires at once when nothing else is left
//! to do.
//!
//! # Implementation notes
//! Each worker has its own clock and wheel, so pausing acts on the
//! calling worker only (a `#[hotloop::test]` body and the tasks it spawns
//! share one). While paused, the loop's clock reads stop (an update
//! returns the paused time) and the loop never sleeps until a deadline:
//! when it has nothing to run it polls the driver without waiting, and
//! only if that brought no event, no message from another thread came in,
//! and no work that holds the clock is out, it moves the clock to the
//! wheel's next deadline (tokio's auto-advance). With no timer at all it
//! blocks on I/O as usual.

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
/// if that is ahead of the system clock (it does not go back); from the
/// system clock's time if the paused time is behind it, so that timers
/// due in between fire at once (tokio's clock instead goes on from the
/// paused instant, behind the system clock for good). Resuming a running
/// clock does nothing.
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
/// The clock ends about 584 years after it started: an advance past that
/// (`Duration::MAX`) stops there, where every deadline is due, so every
/// timer fires and a sleep made afterwards completes at once (tokio
/// panics instead).
///
/// # Panics
/// Outside a hotloop worker.
pub async fn advance(by: Duration) {
    current::advance_clock(by);
    crate::yield_now().await;
}
