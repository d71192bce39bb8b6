//! Load-aware connection distribution: a worker that accepted a connection
//! may hand it to a less loaded worker of the same server.
//!
//! # Implementation notes
//! - Each worker of a server has a lane: a short queue of descriptors that
//!   other workers handed to it, with the waker of its accept loop. The
//!   lane's lock is taken only to hand a connection over or take one;
//!   the accept path itself reads atomics (the workers' published load,
//!   `runtime/load.rs`, and the lane's length), so no lock shared by all
//!   workers is on it.
//! - The choice is made on the accepting worker, right after `accept`,
//!   before anything is read: the connection moves as a descriptor and
//!   becomes a stream on the worker that serves it. With
//!   [`Balance::Load`] a worker busy for more than
//!   [`Balance::LOAD_BUSY_MIN_PERMILLE`] of its recent time hands the
//!   connection to the least busy worker if that one is
//!   [`Balance::LOAD_MARGIN_PERMILLE`] less busy, counting connections
//!   already on their way there. When the load decides nothing (the
//!   workers are idle, or within the margin of each other) the connection
//!   goes as with [`Balance::Count`], among the workers not the margin
//!   busier than this one: to the one holding the fewest connections, if
//!   it holds fewer than this one (Envoy's `exact_balance`). Without that
//!   fallback a burst of connections reaching idle workers stayed where
//!   the kernel's hash put them, which splits 8 connections 4/4 between
//!   two workers in only 27% of bursts.
//! - Other mechanisms were weighed. A reuseport eBPF program
//!   (`SO_ATTACH_REUSEPORT_EBPF`) reading a per-worker load map needs
//!   `CAP_BPF` (unprivileged BPF is off by default on current
//!   distributions), chooses at the SYN, before any load update, so a
//!   burst of SYNs all go to the worker that looked idlest, and indexes
//!   sockets by their order in the group, which shifts when one closes; a
//!   classic BPF program cannot read a map at all; `SO_INCOMING_CPU`
//!   follows the CPU that took the interrupt, not the load. A hand-off
//!   needs no privilege and works alike on both drivers; what it costs is
//!   a cross-thread wake per connection moved, and only a busy worker
//!   pays it.
//! - A connection travels with its slot in the server's count of
//!   connections (`slot.rs`), taken when it was accepted: the limit counts
//!   it while it waits in a lane, and the worker that takes it needs no
//!   free slot under the server's limit, only its own. A connection
//!   dropped in a lane frees its slot.
//! - A worker that can no longer take connections closes its lane: a
//!   worker whose server stopped (it serves what was queued), and one
//!   whose loop failed (its accept loop is dropped, and what was queued is
//!   handed on to another open lane of a live worker, or closed if there
//!   is none). A closed lane refuses hand-offs, and a refused connection
//!   is served where it was accepted, so none is lost; a dead worker is
//!   never chosen.

use crate::driver::Accepted;
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;

use super::options::Balance;
use super::slot::Slot;
use crate::runtime::current;
use crate::runtime::load::BUSY_FULL_PERMILLE;
use crate::runtime::shared::WorkerShared;

/// The lanes of one server, one per worker (lane `i` for worker `i`).
pub(crate) struct Lanes {
    mode: Balance,
    lanes: Vec<Lane>,
    workers: Vec<Arc<WorkerShared>>,
}

/// What other workers handed to one worker.
struct Lane {
    queue: Mutex<LaneQueue>,
    /// `queue.fds.len()`, read without the lock on every accept poll.
    queued: AtomicUsize,
    /// `queue.open`, read without the lock when choosing a worker.
    open: AtomicBool,
    /// The worker is at its own connection limit (`maxconn_per_worker`):
    /// its accept loop waits for a slot and takes nothing from the lane
    /// meanwhile, so a connection handed to it would wait too.
    full: AtomicBool,
}

/// A connection handed to another worker: its descriptor, and its slot in
/// the server's count, taken at its accept.
pub(crate) struct Handed {
    pub(crate) fd: OwnedFd,
    pub(crate) slot: Slot,
}

struct LaneQueue {
    fds: VecDeque<Handed>,
    /// The accept loop of the lane's worker.
    waker: Option<Waker>,
    open: bool,
}

impl Lanes {
    /// Lanes for `workers` (every worker of the runtime, in order).
    pub(crate) fn new(mode: Balance, workers: Vec<Arc<WorkerShared>>) -> Lanes {
        let lanes = workers
            .iter()
            .map(|_| Lane {
                queue: Mutex::new(LaneQueue { fds: VecDeque::new(), waker: None, open: true }),
                queued: AtomicUsize::new(0),
                open: AtomicBool::new(true),
                full: AtomicBool::new(false),
            })
            .collect();
        Lanes { mode, lanes, workers }
    }

    /// True if connections may move between workers at all.
    pub(crate) fn enabled(&self) -> bool {
        self.mode != Balance::Kernel && self.lanes.len() > 1
    }

    /// The worker that should serve a connection `me` just accepted, if
    /// not `me` (`now_ns`: the time on `CLOCK_MONOTONIC`).
    pub(crate) fn target(&self, me: usize, now_ns: u64) -> Option<usize> {
        if !self.enabled() {
            return None;
        }
        match self.mode {
            Balance::Kernel => None,
            Balance::Load => self.least_busy(me, now_ns),
            Balance::Count => self.fewest_connections(me),
        }
    }

    fn candidates(&self, me: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.lanes.len()).filter(move |&j| {
            j != me
                && self.lanes[j].open.load(Ordering::Acquire)
                && !self.lanes[j].full.load(Ordering::Acquire)
                && !self.workers[j].dead.load(Ordering::Acquire)
        })
    }

    /// [`Balance::Load`]: by busy share while this worker is busy and
    /// another is clearly less so; otherwise the load says nothing (idle
    /// workers, or shares within the margin), and the choice falls to
    /// counts among the workers not clearly busier than this one, so that
    /// a burst reaching idle workers is spread as evenly as by
    /// [`Balance::Count`], not as unevenly as the kernel's hash.
    fn least_busy(&self, me: usize, now_ns: u64) -> Option<usize> {
        let mine = self.workers[me].load.busy_at(now_ns, false);
        if mine >= Balance::LOAD_BUSY_MIN_PERMILLE {
            let score = |j: usize| {
                let incoming = self.workers[j].load.incoming().min(u64::from(u32::MAX)) as u32;
                self.workers[j]
                    .busy_at(now_ns)
                    .saturating_add(incoming.saturating_mul(Balance::LOAD_INCOMING_PERMILLE))
            };
            let (best, best_score) =
                self.candidates(me).map(|j| (j, score(j))).min_by_key(|&(_, s)| s)?;
            if best_score.saturating_add(Balance::LOAD_MARGIN_PERMILLE) <= mine {
                return Some(best);
            }
        }
        // A worker that published nothing for two windows while awake reads
        // as fully busy: it may be stuck in a task, so counts never choose it.
        let busier = mine.saturating_add(Balance::LOAD_MARGIN_PERMILLE).min(BUSY_FULL_PERMILLE);
        self.fewest_among(me, |j| self.workers[j].busy_at(now_ns) < busier)
    }

    fn fewest_connections(&self, me: usize) -> Option<usize> {
        self.fewest_among(me, |_| true)
    }

    /// The worker holding the fewest connections (those on their way
    /// included) among the candidates `eligible` admits, if it holds fewer
    /// than `me` (ties stay).
    fn fewest_among(&self, me: usize, eligible: impl Fn(usize) -> bool) -> Option<usize> {
        let mine = self.workers[me].load.connections_and_incoming();
        let (best, count) = self
            .candidates(me)
            .filter(|&j| eligible(j))
            .map(|j| (j, self.workers[j].load.connections_and_incoming()))
            .min_by_key(|&(_, c)| c)?;
        (count < mine).then_some(best)
    }

    /// Hands `handed` to worker `to`; gives it back if that worker's lane is closed.
    pub(crate) fn offer(&self, to: usize, handed: Handed) -> Result<(), Handed> {
        let lane = &self.lanes[to];
        let waker = {
            let mut q = lane.queue.lock().unwrap_or_else(|e| e.into_inner());
            if !q.open {
                return Err(handed);
            }
            self.workers[to].load.incoming_added();
            q.fds.push_back(handed);
            lane.queued.store(q.fds.len(), Ordering::Release);
            q.waker.clone()
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// Says whether worker `me` is at its own connection limit: a full
    /// worker is not handed connections (see [`Lane::full`]).
    pub(crate) fn set_full(&self, me: usize, full: bool) {
        if let Some(lane) = self.lanes.get(me) {
            lane.full.store(full, Ordering::Release);
        }
    }

    /// Files the accept loop of worker `me`, woken when a connection is
    /// handed to it.
    pub(crate) fn register(&self, me: usize, waker: &Waker) {
        let mut q = self.lanes[me].queue.lock().unwrap_or_else(|e| e.into_inner());
        if !q.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            q.waker = Some(waker.clone());
        }
    }

    /// True if a connection waits in worker `me`'s lane (only that
    /// worker's accept loop takes from it, so its next [`Lanes::take`]
    /// finds one).
    pub(crate) fn has_queued(&self, me: usize) -> bool {
        self.lanes[me].queued.load(Ordering::Acquire) > 0
    }

    /// Takes a connection handed to worker `me`, if there is one.
    pub(crate) fn take(&self, me: usize) -> Option<Handed> {
        let lane = &self.lanes[me];
        if lane.queued.load(Ordering::Acquire) == 0 {
            return None;
        }
        let fd = {
            let mut q = lane.queue.lock().unwrap_or_else(|e| e.into_inner());
            let fd = q.fds.pop_front();
            lane.queued.store(q.fds.len(), Ordering::Release);
            fd
        };
        if fd.is_some() {
            self.workers[me].load.incoming_taken();
        }
        fd
    }

    /// Closes worker `me`'s lane: nothing more is handed to it. Returns
    /// what was handed to it and not yet taken.
    pub(crate) fn close(&self, me: usize) -> Vec<Handed> {
        let lane = &self.lanes[me];
        let fds = {
            let mut q = lane.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.open = false;
            lane.open.store(false, Ordering::Release);
            q.waker = None;
            lane.queued.store(0, Ordering::Release);
            Vec::from(std::mem::take(&mut q.fds))
        };
        for _ in &fds {
            self.workers[me].load.incoming_taken();
        }
        fds
    }

    /// Hands each of `handed` to some other open lane than `me`'s, of a
    /// worker still alive; a connection no lane takes is closed, freeing
    /// its slot (no worker of the server is left to serve it). A dead
    /// worker whose accept loop never ran never closed its lane.
    pub(crate) fn hand_on(&self, me: usize, handed: Vec<Handed>) {
        'fds: for mut conn in handed {
            for j in (0..self.lanes.len())
                .filter(|&j| j != me && !self.workers[j].dead.load(Ordering::Acquire))
            {
                match self.offer(j, conn) {
                    Ok(()) => continue 'fds,
                    Err(back) => conn = back,
                }
            }
            crate::log::warn(format_args!(
                "a connection handed to worker {me} was closed: no worker of its server is accepting"
            ));
        }
    }
}

/// Hands a connection just accepted on worker `me`, with its `slot`, to a
/// less loaded worker if the balance says so (`None`: it was handed
/// over); else, or if the chosen worker refuses it, gives both back to be
/// served here. A direct io_uring socket gets a plain descriptor to
/// travel with (kept here if that fails).
pub(crate) fn hand_off(
    lanes: &Lanes,
    me: usize,
    accepted: Accepted,
    slot: Slot,
) -> Option<(Accepted, Slot)> {
    if !lanes.enabled() {
        return Some((accepted, slot));
    }
    let now = current::clock_monotonic_ns();
    let Some(to) = lanes.target(me, now) else { return Some((accepted, slot)) };
    let fd = match accepted.into_fd() {
        Ok(fd) => fd,
        Err((_, accepted)) => return Some((accepted, slot)),
    };
    match lanes.offer(to, Handed { fd, slot }) {
        Ok(()) => {
            current::count(|s| &s.handoffs_out);
            None
        }
        Err(Handed { fd, slot }) => Some((Accepted::Fd(fd), slot)),
    }
}

/// Closes a worker's lane when its first accept loop ends for any reason,
/// and hands on what was still queued in it (after a normal stop the loop
/// has already served it, so nothing is left).
pub(crate) struct LaneGuard {
    pub(crate) lanes: Arc<Lanes>,
    pub(crate) me: usize,
}

impl Drop for LaneGuard {
    fn drop(&mut self) {
        let left = self.lanes.close(self.me);
        if !left.is_empty() {
            self.lanes.hand_on(self.me, left);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::slot::SlotCount;
    use crate::runtime::load::{LoadMeter, LOAD_WINDOW_NS};

    fn workers(n: usize) -> Vec<Arc<WorkerShared>> {
        (0..n).map(|i| WorkerShared::new(i).unwrap()).collect()
    }

    /// A server's count of connections, for the slots of the connections
    /// handed in these tests.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl SlotCount for Count {
        fn release(&self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl Count {
        fn open(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// A connection to hand over, counted in `count`.
    fn a_connection(count: &Arc<Count>) -> Handed {
        count.0.fetch_add(1, Ordering::SeqCst);
        let fd = std::fs::File::open("/dev/null").unwrap().into();
        Handed { fd, slot: Slot::taken(count.clone()) }
    }

    /// Publishes `busy` per-mille for `worker`, as of `now`.
    fn set_busy(worker: &WorkerShared, busy_permille: u64, now: u64) {
        let meter = LoadMeter::default();
        let mut t = now - 40 * LOAD_WINDOW_NS;
        meter.turn_ended(t, 0, &worker.load);
        while t < now {
            t += LOAD_WINDOW_NS;
            meter.idle(LOAD_WINDOW_NS * (1000 - busy_permille) / 1000);
            meter.turn_ended(t, 0, &worker.load);
        }
    }

    #[test]
    fn count_sends_a_connection_to_the_worker_with_fewest() {
        let w = workers(3);
        let lanes = Lanes::new(Balance::Count, w.clone());
        assert_eq!(lanes.target(0, 0), None, "ties stay");
        w[0].load.connection_opened();
        w[0].load.connection_opened();
        w[1].load.connection_opened();
        assert_eq!(lanes.target(0, 0), Some(2));
        assert_eq!(lanes.target(2, 0), None);
    }

    #[test]
    fn load_moves_a_connection_only_from_a_busy_worker_to_a_much_idler_one() {
        let now = 100 * LOAD_WINDOW_NS;
        let w = workers(2);
        let lanes = Lanes::new(Balance::Load, w.clone());
        set_busy(&w[0], 250, now);
        set_busy(&w[1], 0, now);
        assert_eq!(lanes.target(0, now), None, "not busy enough to move anything");
        set_busy(&w[0], 900, now);
        assert_eq!(lanes.target(0, now), Some(1));
        set_busy(&w[1], 800, now);
        assert_eq!(lanes.target(0, now), None, "within the margin");
        // Connections already on their way count against the idle worker.
        set_busy(&w[1], 0, now);
        for _ in 0..9 {
            w[1].load.incoming_added();
        }
        assert_eq!(lanes.target(0, now), None);
    }

    #[test]
    fn load_falls_to_counts_when_the_workers_are_equally_loaded() {
        let now = 100 * LOAD_WINDOW_NS;
        let w = workers(3);
        let lanes = Lanes::new(Balance::Load, w.clone());
        for (i, busy) in [(0, 0), (1, 0), (2, 0)] {
            set_busy(&w[i], busy, now);
        }
        assert_eq!(lanes.target(0, now), None, "equal counts stay");
        w[0].load.connection_opened();
        assert_eq!(lanes.target(0, now), Some(1), "idle workers: the fewest connections");
        w[1].load.incoming_added();
        assert_eq!(lanes.target(0, now), Some(2), "connections on their way count");
        // Busy, but within the margin of each other: still by counts.
        for (i, busy) in [(0, 600), (1, 500), (2, 650)] {
            set_busy(&w[i], busy, now);
        }
        assert_eq!(lanes.target(0, now), Some(2));
        // A worker the margin busier than this one gets nothing by counts.
        set_busy(&w[2], 800, now);
        assert_eq!(lanes.target(0, now), None);
        set_busy(&w[0], 0, now);
        set_busy(&w[1], 200, now);
        set_busy(&w[2], 0, now);
        assert_eq!(lanes.target(0, now), Some(2), "the idle worker, not the one 20 points busier");
    }

    #[test]
    fn counts_never_choose_a_worker_that_stopped_publishing_its_load() {
        let now = 100 * LOAD_WINDOW_NS;
        let w = workers(2);
        let lanes = Lanes::new(Balance::Load, w.clone());
        set_busy(&w[1], 0, now);
        let later = now + 10 * LOAD_WINDOW_NS;
        set_busy(&w[0], 0, later);
        w[0].load.connection_opened();
        assert_eq!(lanes.target(0, later), None, "worker 1 may be stuck in a task");
        set_busy(&w[1], 0, later);
        assert_eq!(lanes.target(0, later), Some(1));
    }

    #[test]
    fn a_closed_lane_or_a_dead_worker_is_never_chosen_and_gives_the_connection_back() {
        let w = workers(3);
        let lanes = Lanes::new(Balance::Count, w.clone());
        let count = Arc::new(Count::default());
        for _ in 0..5 {
            w[0].load.connection_opened();
        }
        w[1].load.connection_opened();
        assert!(lanes.offer(2, a_connection(&count)).is_ok());
        assert_eq!(w[2].load.incoming(), 1);
        // Worker 2's lane closes with a connection in it: it is handed on.
        let left = lanes.close(2);
        assert_eq!(left.len(), 1);
        assert_eq!(w[2].load.incoming(), 0);
        lanes.hand_on(2, left);
        assert!(lanes.take(0).is_some() || lanes.take(1).is_some(), "the connection was lost");
        assert_eq!(lanes.target(0, 0), Some(1), "the closed lane is skipped");
        assert!(lanes.offer(2, a_connection(&count)).is_err(), "a closed lane takes nothing");
        w[1].die();
        assert_eq!(lanes.target(0, 0), None, "a dead worker is skipped");
    }

    /// A connection keeps its slot on its way from lane to lane, and frees
    /// it when no lane takes it, or when the lanes are dropped with it.
    #[test]
    fn a_connection_no_worker_serves_frees_its_slot() {
        let w = workers(3);
        let lanes = Lanes::new(Balance::Count, w.clone());
        let count = Arc::new(Count::default());
        assert!(lanes.offer(1, a_connection(&count)).is_ok());
        assert!(lanes.offer(1, a_connection(&count)).is_ok());
        // Worker 2 died before its accept loop ran: its lane is open, but
        // nothing is handed on to it.
        w[2].die();
        let left = lanes.close(1);
        lanes.hand_on(1, left);
        assert_eq!(count.open(), 2, "a connection handed on keeps its slot");
        assert!(lanes.has_queued(0));
        let left = lanes.close(0);
        assert_eq!(left.len(), 2, "both went to worker 0, the only live worker accepting");
        lanes.hand_on(0, left);
        assert_eq!(count.open(), 0, "the connections no lane took still count");
        // The slot of what a lane still holds when the lanes go.
        let lanes = Lanes::new(Balance::Count, workers(2));
        assert!(lanes.offer(1, a_connection(&count)).is_ok());
        assert_eq!(count.open(), 1);
        drop(lanes);
        assert_eq!(count.open(), 0, "the connection left in a lane still counts");
    }

    #[test]
    fn the_kernel_placement_and_a_single_worker_move_nothing() {
        let w = workers(2);
        w[0].load.connection_opened();
        assert_eq!(Lanes::new(Balance::Kernel, w.clone()).target(0, 0), None);
        assert_eq!(Lanes::new(Balance::Count, workers(1)).target(0, 0), None);
    }
}
