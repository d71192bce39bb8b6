//! A worker's load as the other workers see it: the share of recent time
//! it spent working, its run queue and its live connections, published in
//! atomics that only the worker writes.
//!
//! # Implementation notes
//! - The loop measures its idle time: the time it slept in the driver, and
//!   the time of busy-polling spins that found nothing. Every
//!   [`LOAD_WINDOW_NS`] (at the first turn after one has passed) it turns
//!   the window into a busy share in per-mille and folds it into a moving
//!   average (a quarter of the new window each time), then publishes it
//!   with the time of the update. A turn costs one comparison; a turn that
//!   ran tasks and then sleeps or spins, one more clock read (when the
//!   idle time began); a turn that ran none takes the time the last poll
//!   returned, so an idle spin reads no extra clock.
//! - A worker that sleeps publishes nothing while it sleeps, and one stuck
//!   in a long task cannot publish: a reader tells them apart by the
//!   worker's doorbell (set only while it may sleep in the driver). A
//!   sleeping worker's figure decays with the time since its update; a
//!   worker that has not updated for two windows and is not asleep is
//!   taken as fully busy.
//! - `incoming` counts connections another worker handed to this one and
//!   it has not yet taken: a reader adds them, so a burst of hand-offs does
//!   not all go to the worker that looked idlest at its start.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// The measuring window of the busy share, in nanoseconds.
pub(crate) const LOAD_WINDOW_NS: u64 = 1_000_000;

/// Per-mille of a fully busy worker.
pub(crate) const BUSY_FULL_PERMILLE: u32 = 1000;

/// One worker's published load. Written by its worker (except
/// `incoming`), read by any thread.
#[derive(Debug, Default)]
pub(crate) struct WorkerLoad {
    /// The moving average of the busy share, in per-mille.
    busy_permille: AtomicU32,
    /// When `busy_permille` was last updated (`CLOCK_MONOTONIC` ns).
    updated_ns: AtomicU64,
    /// Tasks queued to run at the last update.
    run_queue: AtomicU32,
    /// Connections open on this worker that a server's handlers hold.
    connections: AtomicU64,
    /// Connections handed to this worker and not yet taken.
    incoming: AtomicU64,
}

impl WorkerLoad {
    /// Worker: a connection is now held here.
    pub(crate) fn connection_opened(&self) {
        self.connections.store(self.connections.load(Relaxed) + 1, Relaxed);
    }

    /// Worker: a connection held here has ended.
    pub(crate) fn connection_closed(&self) {
        self.connections.store(self.connections.load(Relaxed).saturating_sub(1), Relaxed);
    }

    /// Any thread: a connection is on its way to this worker.
    pub(crate) fn incoming_added(&self) {
        self.incoming.fetch_add(1, Relaxed);
    }

    /// Worker: a connection handed here was taken (or handed on).
    pub(crate) fn incoming_taken(&self) {
        let _ = self.incoming.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
    }

    /// Connections open here, plus those on their way.
    pub(crate) fn connections_and_incoming(&self) -> u64 {
        self.connections.load(Relaxed) + self.incoming.load(Relaxed)
    }

    /// Connections on their way here.
    pub(crate) fn incoming(&self) -> u64 {
        self.incoming.load(Relaxed)
    }

    /// The busy share at `now_ns` (`CLOCK_MONOTONIC`), in per-mille, with
    /// `asleep` saying whether the worker may be sleeping in its driver
    /// (see the module notes).
    pub(crate) fn busy_at(&self, now_ns: u64, asleep: bool) -> u32 {
        let busy = self.busy_permille.load(Relaxed);
        let age = now_ns.saturating_sub(self.updated_ns.load(Relaxed));
        if age <= 2 * LOAD_WINDOW_NS {
            busy
        } else if asleep {
            (u64::from(busy) * LOAD_WINDOW_NS / age) as u32
        } else {
            BUSY_FULL_PERMILLE
        }
    }

    /// The figures the stats endpoint shows.
    pub(crate) fn snapshot(&self, now_ns: u64, asleep: bool) -> crate::stats::LoadGauges {
        crate::stats::LoadGauges {
            busy_permille: u64::from(self.busy_at(now_ns, asleep)),
            run_queue: u64::from(self.run_queue.load(Relaxed)),
            connections: self.connections.load(Relaxed),
            incoming: self.incoming.load(Relaxed),
        }
    }
}

/// The worker's own side of the measurement: idle time in the current
/// window. Only the worker touches it.
#[derive(Debug, Default)]
pub(crate) struct LoadMeter {
    window_start_ns: std::cell::Cell<u64>,
    idle_ns: std::cell::Cell<u64>,
}

impl LoadMeter {
    /// Counts `ns` of the loop's time as idle.
    pub(crate) fn idle(&self, ns: u64) {
        self.idle_ns.set(self.idle_ns.get() + ns);
    }

    /// At the end of a turn (`now_ns` on `CLOCK_MONOTONIC`): closes the
    /// window if it has run its length and publishes the new average.
    #[inline]
    pub(crate) fn turn_ended(&self, now_ns: u64, run_queue: usize, load: &WorkerLoad) {
        if self.window_start_ns.get() == 0 {
            // The first turn opens the first window.
            self.window_start_ns.set(now_ns);
            return;
        }
        let elapsed = now_ns.saturating_sub(self.window_start_ns.get());
        if elapsed < LOAD_WINDOW_NS {
            return;
        }
        let idle = self.idle_ns.get().min(elapsed);
        let busy = ((elapsed - idle) * u64::from(BUSY_FULL_PERMILLE) / elapsed) as u32;
        let old = load.busy_permille.load(Relaxed);
        load.busy_permille.store((old * 3 + busy) / 4, Relaxed);
        load.updated_ns.store(now_ns, Relaxed);
        load.run_queue.store(run_queue.min(u32::MAX as usize) as u32, Relaxed);
        self.window_start_ns.set(now_ns);
        self.idle_ns.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_window_raises_the_average_and_an_idle_one_lowers_it() {
        let load = WorkerLoad::default();
        let meter = LoadMeter::default();
        let mut now = 10 * LOAD_WINDOW_NS;
        meter.turn_ended(now, 0, &load);
        for _ in 0..20 {
            now += LOAD_WINDOW_NS;
            meter.turn_ended(now, 3, &load);
        }
        assert!(load.busy_at(now, false) > 990, "{}", load.busy_at(now, false));
        assert_eq!(load.snapshot(now, false).run_queue, 3);
        for _ in 0..20 {
            now += LOAD_WINDOW_NS;
            meter.idle(LOAD_WINDOW_NS);
            meter.turn_ended(now, 0, &load);
        }
        assert!(load.busy_at(now, false) < 10, "{}", load.busy_at(now, false));
    }

    #[test]
    fn a_silent_worker_is_busy_unless_it_sleeps() {
        let load = WorkerLoad::default();
        let meter = LoadMeter::default();
        let mut now = LOAD_WINDOW_NS;
        for _ in 0..20 {
            now += LOAD_WINDOW_NS;
            meter.turn_ended(now, 0, &load);
        }
        let later = now + 100 * LOAD_WINDOW_NS;
        assert_eq!(load.busy_at(later, false), BUSY_FULL_PERMILLE);
        assert!(load.busy_at(later, true) < 20);
    }
}
