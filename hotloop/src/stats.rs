//! Live counters, per worker and summed, readable at any time from any thread.
//!
//! Each worker is the only writer of its own `WorkerStats`, so a counter is
//! bumped with a relaxed load and store (no locked instruction on the hot
//! path); readers on other threads see values that are at most a few
//! increments old, which is what a monitoring snapshot needs.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Adds `n` to a counter that only the current worker writes.
#[inline]
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
}

/// Raises a high-water mark that only the current worker writes.
#[inline]
pub(crate) fn raise(counter: &AtomicU64, value: u64) {
    if value > counter.load(Relaxed) {
        counter.store(value, Relaxed);
    }
}

/// Declares the counters once: the live struct, the snapshot struct and the
/// list of names stay in step.
macro_rules! counters {
    ($( $(#[doc = $doc:literal])* $name:ident: $kind:ident, )*) => {
        /// The live counters of one worker, written only by that worker
        /// (read through [`Counters`] snapshots).
        #[derive(Debug, Default)]
        pub(crate) struct WorkerStats {
            $( $(#[doc = $doc])* pub(crate) $name: AtomicU64, )*
        }

        /// A copy of one worker's counters (or their sum) at one moment.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct Counters {
            $( $(#[doc = $doc])* pub $name: u64, )*
        }

        impl WorkerStats {
            /// Reads every counter.
            pub fn load(&self) -> Counters {
                Counters { $( $name: self.$name.load(Relaxed), )* }
            }
        }

        impl Counters {
            /// Every counter as (name, value, is it a high-water mark).
            pub fn fields(&self) -> Vec<(&'static str, u64, bool)> {
                vec![ $( (stringify!($name), self.$name, counters!(@is_max $kind)), )* ]
            }

            /// Each counter's doc comment, in the order of [`Counters::fields`]
            /// (the `# HELP` text of the Prometheus output).
            pub fn descriptions() -> Vec<&'static str> {
                vec![ $( concat!($($doc),*).trim(), )* ]
            }

            fn merge(&mut self, other: &Counters) {
                $( counters!(@merge $kind, self.$name, other.$name); )*
            }
        }
    };
    (@is_max sum) => { false };
    (@is_max max) => { true };
    (@merge sum, $a:expr, $b:expr) => { $a += $b };
    (@merge max, $a:expr, $b:expr) => { $a = $a.max($b) };
}

counters! {
    /// Connections accepted.
    accepted: sum,
    /// Loop turns in which at least one connection was accepted.
    accept_wakeups: sum,
    /// The most connections accepted in one loop turn.
    max_accepted_per_wakeup: max,
    /// Times the accept bound stopped a batch with connections still queued.
    accept_bound_hits: sum,
    /// `accept` failures for lack of descriptors or memory (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`).
    accept_errors_resources: sum,
    /// `accept` failures skipped because the connection died first (`ECONNABORTED`, `EPROTO`, `EPERM`, and the network errors accept(2) passes on, such as `ENETUNREACH`).
    accept_errors_aborted: sum,
    /// Other `accept` failures.
    accept_errors_other: sum,
    /// Connections accepted and closed before any handler had them: an
    /// accept's connection that arrived for a listener already closed (in
    /// its queue, or from an accept cancelled too late), or one whose
    /// stream could not be made. Each meets its client as a close, or a
    /// reset if its request had come; a drain should leave this at 0.
    accepted_unserved: sum,
    /// Times accepting paused because descriptors ran out.
    accept_pauses: sum,
    /// Times a server stopped accepting because it held its `maxconn` connections.
    maxconn_reached: sum,
    /// Connections this worker accepted and handed to a less loaded worker.
    handoffs_out: sum,
    /// Connections another worker accepted and handed to this one.
    handoffs_in: sum,
    /// Connections found waiting by a look at the backlog after a
    /// predecessor stopped accepting: each one's wake-up went to the
    /// predecessor's last accept (see `Handover::on_predecessor_stopped`).
    backlog_recheck_accepts: sum,
    /// Sockets registered with epoll (`epoll_ctl` ADD calls).
    registrations: sum,
    /// Sockets closed without ever being registered with epoll.
    registrations_avoided: sum,
    /// Events dropped because their generation tag named a closed socket.
    stale_events: sum,
    /// Poller calls that could block.
    poller_waits: sum,
    /// Poller calls with a zero timeout made while busy polling that found nothing.
    poller_spins: sum,
    /// I/O events or completions handled.
    poller_events: sum,
    /// Task polls.
    tasks_polled: sum,
    /// Tasks spawned.
    tasks_spawned: sum,
    /// Timers fired.
    timers_fired: sum,
    /// Times the driver armed its deadline timer (epoll's timerfd): only
    /// when the worker's earliest deadline came earlier than the armed one.
    timer_arms: sum,
    /// Wake-ups from other threads (eventfd).
    remote_wakeups: sum,
    /// Submission queue entries pushed (io_uring).
    submissions: sum,
    /// Stream writes a quiet worker sent with a non-blocking `send(2)`
    /// instead of a ring entry (io_uring).
    direct_sends: sum,
    /// Connections accepted as direct descriptors, slots of the ring's
    /// file table (io_uring, `HOTLOOP_URING_DIRECT_FDS=1`).
    direct_accepts: sum,
    /// Plain descriptors installed for direct sockets, for a system call
    /// or a hand-over (`IORING_OP_FIXED_FD_INSTALL`; io_uring).
    direct_fd_installs: sum,
    /// Stream writes sent zero-copy (`SEND_ZC`): the network device read
    /// the bytes from the writer's buffer (io_uring).
    send_zc: sum,
    /// Zero-copy stream writes the kernel copied after all, as it does for
    /// a local peer (loopback, a veth pair) or a device without
    /// scatter-gather; the socket's later writes are copied ones (io_uring).
    send_zc_copied: sum,
    /// `io_uring_enter` calls (io_uring).
    uring_enters: sum,
    /// Of those, the ones made between two task polls because the oldest
    /// queued entry had waited longer than the submit delay
    /// (`HOTLOOP_URING_SUBMIT_AFTER_US`, io_uring).
    early_submits: sum,
    /// Completions reaped (io_uring).
    completions: sum,
    /// Multishot accepts re-armed after the kernel ended one (io_uring).
    multishot_rearms: sum,
    /// Completion queue overflows reported by the kernel (io_uring).
    cq_overflows: sum,
    /// Operations cancelled because their future was dropped (io_uring).
    cancellations: sum,
    /// Times the submission queue was full and had to be flushed first (io_uring).
    sq_full: sum,
}

/// How one worker's driver was set up, fixed at start-up.
#[derive(Debug, Clone, Default)]
pub struct DriverInfo {
    /// `epoll` or `uring`.
    pub driver: &'static str,
    /// Why this driver was chosen (for `auto`, why io_uring was or was not used).
    pub reason: String,
    /// The busy-poll mode in force (`off`, `always`, `adaptive:<us>`).
    pub busy_poll: String,
    /// Whether the kernel's own busy polling (`EPIOCSPARAMS` or NAPI registration) took effect, and why not.
    pub kernel_busy_poll: String,
    /// True if `auto` wanted io_uring and fell back to epoll (the one case
    /// the runtime warns about); false when a driver was asked for by name
    /// (`Builder::driver` or `HOTLOOP_DRIVER`).
    pub fallback: bool,
}

/// The runtime's blocking pool at one moment (shared by every worker, so
/// not per worker).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BlockingCounters {
    /// Jobs waiting for a pool thread.
    pub queued: u64,
    /// Jobs running now.
    pub running: u64,
    /// Pool threads alive now (busy or idle).
    pub threads: u64,
    /// The most pool threads allowed (`Builder::max_blocking_threads`).
    pub threads_max: u64,
    /// Pool threads started since the runtime began.
    pub threads_started: u64,
    /// Jobs that have returned (or panicked).
    pub completed: u64,
}

impl BlockingCounters {
    /// Every field as (name, value, is it a gauge).
    pub fn fields(&self) -> [(&'static str, u64, bool); 6] {
        [
            ("blocking_queued", self.queued, true),
            ("blocking_running", self.running, true),
            ("blocking_threads", self.threads, true),
            ("blocking_threads_max", self.threads_max, true),
            ("blocking_threads_started", self.threads_started, false),
            ("blocking_completed", self.completed, false),
        ]
    }

    /// One sentence per field of [`BlockingCounters::fields`], in order
    /// (the `# HELP` text of the Prometheus output).
    pub fn descriptions() -> [&'static str; 6] {
        [
            "Blocking jobs queued for a pool thread.",
            "Blocking jobs running on pool threads.",
            "Threads in the blocking pool.",
            "The most threads the blocking pool may start.",
            "Threads the blocking pool has started.",
            "Blocking jobs finished.",
        ]
    }
}

/// Declares the process-wide event counters once: the live atomics, the
/// snapshot and the list of names and descriptions stay in step.
macro_rules! lifecycle {
    ($( #[doc = $doc:literal] $name:ident, )*) => {
        /// The live process-wide event counters (see [`LifecycleCounters`]).
        #[derive(Debug)]
        pub(crate) struct LifecycleAtomics {
            $( pub(crate) $name: AtomicU64, )*
        }

        /// Process-wide counts of rare events: socket hand-overs between
        /// processes, server drains, connections cut at a drain's deadline,
        /// certificate reloads. They belong to the process, not to a worker
        /// (a hand-over is made by a thread of its own), so every runtime's
        /// snapshot shows the same values.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct LifecycleCounters {
            $( #[doc = $doc] pub $name: u64, )*
        }

        /// The process's event counters.
        pub(crate) static LIFECYCLE: LifecycleAtomics =
            LifecycleAtomics { $( $name: AtomicU64::new(0), )* };

        impl LifecycleAtomics {
            fn load(&self) -> LifecycleCounters {
                LifecycleCounters { $( $name: self.$name.load(Relaxed), )* }
            }
        }

        impl LifecycleCounters {
            /// Every counter as (name, value).
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![ $( (stringify!($name), self.$name), )* ]
            }

            /// One sentence per counter of [`LifecycleCounters::fields`],
            /// in order (the `# HELP` text of the Prometheus output).
            pub fn descriptions() -> Vec<&'static str> {
                vec![ $( $doc.trim(), )* ]
            }
        }
    };
}

lifecycle! {
    /// Times this process took its listening sockets over from a predecessor (an upgrade).
    upgrades_in,
    /// Times this process handed its listening sockets to a successor, which then served them.
    upgrades_out,
    /// Successors that connected for the sockets and ended before they were ready; this process kept serving.
    upgrade_failures,
    /// Listening sockets received from a predecessor or from systemd (`LISTEN_FDS`).
    sockets_inherited,
    /// Server drains begun (a stop, or a hand-over to a successor).
    drains,
    /// Connections cut by a drain: still open at its deadline (those whose worker had not ended them when the drain returned included), or when a stop was forced before it (a second signal, SIGQUIT).
    drain_cut,
    /// TLS certificate reloads that took effect.
    tls_reloads,
    /// TLS certificate reloads refused (a file missing or bad); the previous certificate stayed.
    tls_reload_failures,
}

/// Adds one to a process-wide event counter (from any thread).
pub(crate) fn count_event(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Relaxed);
}

/// Records the start of a drain by a server that is not a
/// [`Server`](crate::net::Server) (one that serves QUIC endpoints, say):
/// it is counted in `drains` and logged as the event a `Server`'s drain
/// logs, so every drain of the process shows in the stats and in the
/// `tracing` events alike. `what` names the server in the event.
pub fn record_drain(what: &str, open: usize, timeout: std::time::Duration) {
    count_event(&LIFECYCLE.drains, 1);
    crate::log::info(format_args!(
        "{what}: draining: {open} connections open, cut after {timeout:?}"
    ));
}

/// Records the connections such a server cut at its drain's deadline
/// (`drain_cut`), with the warning a `Server`'s drain logs then; nothing
/// when `cut` is 0.
pub fn record_drain_cut(what: &str, cut: usize) {
    if cut == 0 {
        return;
    }
    count_event(&LIFECYCLE.drain_cut, cut as u64);
    crate::log::warn(format_args!("{what}: {cut} connections cut at the drain deadline"));
}

/// Records the connections a forced stop cut (a second signal or SIGQUIT
/// ended the process before its drain did), or that a server closed at
/// once for another reason (QUIC connections at an upgrade): counted in
/// `drain_cut` with the drains' cuts, with a warning; nothing when `cut`
/// is 0. `how` ends the warning: "by a forced stop", say.
pub fn record_cut(what: &str, cut: usize, how: &str) {
    if cut == 0 {
        return;
    }
    count_event(&LIFECYCLE.drain_cut, cut as u64);
    crate::log::warn(format_args!("{what}: {cut} connections cut {how}"));
}

/// One worker's load at one moment, as the connection balancing reads it
/// (gauges, not counters).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LoadGauges {
    /// The share of recent time the worker spent working, in per-mille
    /// (a moving average over 1 ms windows).
    pub busy_permille: u64,
    /// Tasks queued to run at the last measurement.
    pub run_queue: u64,
    /// Connections open on the worker that a server's handlers hold.
    pub connections: u64,
    /// Connections handed to the worker and not yet taken.
    pub incoming: u64,
}

impl LoadGauges {
    /// Every field as (name, value).
    pub fn fields(&self) -> [(&'static str, u64); 4] {
        [
            ("load_busy_permille", self.busy_permille),
            ("load_run_queue", self.run_queue),
            ("load_connections", self.connections),
            ("load_incoming", self.incoming),
        ]
    }

    /// One sentence per field of [`LoadGauges::fields`], in order (the
    /// `# HELP` text of the Prometheus output).
    pub fn descriptions() -> [&'static str; 4] {
        [
            "Share of recent time the worker spent working, in per-mille.",
            "Tasks queued to run on the worker.",
            "Connections open on the worker.",
            "Connections handed to the worker and not yet taken.",
        ]
    }
}

/// Counters of every worker at one moment, with their sum.
#[derive(Debug, Clone, Default)]
pub struct StatsSnapshot {
    /// Each worker's counters, by worker index.
    pub workers: Vec<Counters>,
    /// The counters of the thread that runs `Runtime::block_on`: it has a
    /// driver and timers of its own, so what its future does (a connect, a
    /// sleep) is counted here, apart from the workers'.
    pub block_on: Counters,
    /// The counters summed over workers (high-water marks take the maximum).
    pub total: Counters,
    /// How the drivers were set up (from worker 0; every worker is set up alike).
    pub info: DriverInfo,
    /// The blocking pool (jobs queued and running, threads).
    pub blocking: BlockingCounters,
    /// Each worker's load, by worker index (the workers only, not the
    /// `block_on` thread).
    pub loads: Vec<LoadGauges>,
    /// The process's hand-over, drain and reload events.
    pub lifecycle: LifecycleCounters,
}

impl StatsSnapshot {
    pub(crate) fn collect(
        workers: &[Arc<WorkerStats>],
        block_on: &WorkerStats,
        info: DriverInfo,
    ) -> Self {
        let workers: Vec<Counters> = workers.iter().map(|w| w.load()).collect();
        let block_on = block_on.load();
        let mut total = Counters::default();
        for w in workers.iter().chain(Some(&block_on)) {
            total.merge(w);
        }
        StatsSnapshot {
            workers,
            block_on,
            total,
            info,
            blocking: BlockingCounters::default(),
            loads: Vec::new(),
            lifecycle: LIFECYCLE.load(),
        }
    }

    /// The snapshot as one JSON object: the summed counters at the top level,
    /// the driver fields, `workers` as an array of per-worker objects, and
    /// `block_on` as the object of the thread that runs `Runtime::block_on`.
    pub fn to_json(&self) -> String {
        let mut out = String::from("{");
        for (name, value, _) in self.total.fields() {
            let _ = write!(out, "\"{name}\":{value},");
        }
        for (name, value, _) in self.blocking.fields() {
            let _ = write!(out, "\"{name}\":{value},");
        }
        for (name, value) in self.lifecycle.fields() {
            let _ = write!(out, "\"{name}\":{value},");
        }
        let _ = write!(
            out,
            "\"driver\":\"{}\",\"driver_reason\":\"{}\",\"busy_poll\":\"{}\",\"kernel_busy_poll\":\"{}\",\"workers\":[",
            self.info.driver,
            json_escape(&self.info.reason),
            self.info.busy_poll,
            json_escape(&self.info.kernel_busy_poll)
        );
        for (i, w) in self.workers.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push('{');
            let fields = w.fields();
            for (j, (name, value, _)) in fields.iter().enumerate() {
                let sep = if j + 1 < fields.len() { "," } else { "" };
                let _ = write!(out, "\"{name}\":{value}{sep}");
            }
            for (name, value) in self.loads.get(i).map(LoadGauges::fields).into_iter().flatten() {
                let _ = write!(out, ",\"{name}\":{value}");
            }
            out.push('}');
        }
        out.push_str("],\"block_on\":{");
        let fields = self.block_on.fields();
        for (j, (name, value, _)) in fields.iter().enumerate() {
            let sep = if j + 1 < fields.len() { "," } else { "" };
            let _ = write!(out, "\"{name}\":{value}{sep}");
        }
        out.push_str("}}");
        out
    }

    /// The snapshot in the Prometheus text exposition format, one series per worker.
    pub fn to_prometheus(&self) -> String {
        let mut out = String::new();
        let descriptions = Counters::descriptions();
        for (idx, (name, _, is_max)) in self.total.fields().into_iter().enumerate() {
            let kind = if is_max { "gauge" } else { "counter" };
            let suffix = if is_max { "" } else { "_total" };
            let help = prometheus_escape_help(descriptions[idx]);
            let _ = writeln!(out, "# HELP hotloop_{name}{suffix} {help}");
            let _ = writeln!(out, "# TYPE hotloop_{name}{suffix} {kind}");
            for (worker, w) in self.workers.iter().enumerate() {
                let value = w.fields()[idx].1;
                let _ = writeln!(out, "hotloop_{name}{suffix}{{worker=\"{worker}\"}} {value}");
            }
            // The `block_on` thread, named as such rather than as a worker.
            let value = self.block_on.fields()[idx].1;
            let _ = writeln!(out, "hotloop_{name}{suffix}{{worker=\"block_on\"}} {value}");
        }
        let load_help = LoadGauges::descriptions();
        for (idx, (name, _)) in LoadGauges::default().fields().into_iter().enumerate() {
            let _ =
                writeln!(out, "# HELP hotloop_{name} {}", prometheus_escape_help(load_help[idx]));
            let _ = writeln!(out, "# TYPE hotloop_{name} gauge");
            for (worker, l) in self.loads.iter().enumerate() {
                let _ =
                    writeln!(out, "hotloop_{name}{{worker=\"{worker}\"}} {}", l.fields()[idx].1);
            }
        }
        let blocking_help = BlockingCounters::descriptions();
        for (idx, (name, value, is_gauge)) in self.blocking.fields().into_iter().enumerate() {
            let (kind, suffix) = if is_gauge { ("gauge", "") } else { ("counter", "_total") };
            let help = prometheus_escape_help(blocking_help[idx]);
            let _ = writeln!(out, "# HELP hotloop_{name}{suffix} {help}");
            let _ = writeln!(out, "# TYPE hotloop_{name}{suffix} {kind}");
            let _ = writeln!(out, "hotloop_{name}{suffix} {value}");
        }
        let lifecycle_help = LifecycleCounters::descriptions();
        for (idx, (name, value)) in self.lifecycle.fields().into_iter().enumerate() {
            let help = prometheus_escape_help(lifecycle_help[idx]);
            let _ = writeln!(out, "# HELP hotloop_{name}_total {help}");
            let _ = writeln!(out, "# TYPE hotloop_{name}_total counter");
            let _ = writeln!(out, "hotloop_{name}_total {value}");
        }
        let _ = writeln!(
            out,
            "# HELP hotloop_driver_info The I/O driver and busy-poll mode in force (always 1).\n\
             # TYPE hotloop_driver_info gauge\n\
             hotloop_driver_info{{driver=\"{}\",busy_poll=\"{}\"}} 1",
            prometheus_escape_label(self.info.driver),
            prometheus_escape_label(&self.info.busy_poll)
        );
        out
    }
}

/// `# HELP` text as the exposition format wants it: backslash and newline escaped.
fn prometheus_escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A label value as the exposition format wants it: backslash, quote and newline escaped.
fn prometheus_escape_label(s: &str) -> String {
    prometheus_escape_help(s).replace('"', "\\\"")
}

fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_counters_and_keeps_maxima() {
        let a = Arc::new(WorkerStats::default());
        let b = Arc::new(WorkerStats::default());
        add(&a.accepted, 3);
        add(&b.accepted, 4);
        raise(&a.max_accepted_per_wakeup, 7);
        raise(&b.max_accepted_per_wakeup, 5);
        let main = WorkerStats::default();
        add(&main.accepted, 1);
        let mut snap = StatsSnapshot::collect(&[a, b], &main, DriverInfo::default());
        snap.loads =
            vec![LoadGauges::default(), LoadGauges { busy_permille: 640, ..Default::default() }];
        assert_eq!(snap.total.accepted, 8);
        assert_eq!(snap.workers.len(), 2, "the block_on thread is not a worker");
        assert!(snap.to_json().contains("\"block_on\":{\"accepted\":1,"));
        assert!(snap.to_prometheus().contains("hotloop_accepted_total{worker=\"block_on\"} 1"));
        assert_eq!(snap.total.max_accepted_per_wakeup, 7);
        assert!(snap.to_json().contains("\"accepted\":8,"));
        assert!(snap.to_prometheus().contains("hotloop_accepted_total{worker=\"1\"} 4"));
        assert!(snap.to_json().contains("\"blocking_queued\":0,"));
        assert!(snap.to_prometheus().contains("hotloop_blocking_running 0"));
        assert!(snap.to_json().contains("\"load_busy_permille\":640"));
        assert!(snap.to_prometheus().contains("hotloop_load_busy_permille{worker=\"1\"} 640"));
        assert!(snap.to_json().contains("\"drain_cut\":"));
        assert!(snap.to_prometheus().contains("# TYPE hotloop_upgrades_in_total counter"));
    }
}
