//! Listener options: how a listening socket is set up and how it accepts.

use std::time::Duration;

use super::handover::Handover;
use crate::driver::AcceptMode;

/// How a [`TcpListener`](super::TcpListener) or a
/// [`UnixListener`](super::UnixListener) is set up and how it accepts.
///
/// A Unix listener ignores the TCP-only fields (`reuse_port`, `nodelay`,
/// `defer_accept_secs`); `remove_stale_socket` is for Unix listeners only.
#[derive(Debug, Clone)]
pub struct ListenerOptions {
    /// `SO_REUSEPORT`: several listeners on one port, the kernel spreading
    /// connections between them (one per worker). Default: on.
    pub reuse_port: bool,
    /// The accept queue length passed to `listen(2)`. Default: 4096.
    pub backlog: u32,
    /// `TCP_DEFER_ACCEPT`: the kernel hands a connection over only once its
    /// first data has arrived (or after this many seconds). Default: off.
    pub defer_accept_secs: Option<u32>,
    /// The most connections accepted per loop turn before the listener lets
    /// other tasks and I/O run (`None`: until the queue is empty).
    /// Default: [`ListenerOptions::ACCEPTS_PER_WAKEUP_DEFAULT`].
    pub accepts_per_wakeup_max: Option<usize>,
    /// `TCP_NODELAY` on accepted sockets (set once on the listener; Linux
    /// copies it to every accepted socket). Default: on.
    pub nodelay: bool,
    /// Multishot or single-shot accept (io_uring). Default: multishot. With
    /// [`accept_pacing`](Self::accept_pacing) on, the listener takes one
    /// connection per `accept4` instead, so no more than its budget is
    /// accepted ahead of its loop (a multishot accept takes the whole
    /// backlog in one enter).
    pub accept_mode: AcceptMode,
    /// How long accepting pauses after `EMFILE`/`ENFILE`, so a full
    /// descriptor table does not make the loop spin. Default: 10 ms.
    pub resource_pause: Duration,
    /// Accept pacing: take fewer connections per loop turn while the worker
    /// is behind, more once it catches up, within `accepts_per_wakeup_max`
    /// (or [`ListenerOptions::ACCEPTS_PACED_MAX`] when that is `None`).
    /// `None`: the fixed bound alone. Default: on, with
    /// [`AcceptPacing::default`]: in the bench's storm scenario it kept
    /// established connections' p99 lower than the fixed bound of 32 at the
    /// same requests per CPU second (`BENCHMARKS.md`).
    pub accept_pacing: Option<AcceptPacing>,
    /// Unix listeners only: when the path holds a socket file that no
    /// process listens on (connecting to it is refused), remove it before
    /// binding. A socket someone listens on, or any other kind of file, is
    /// never removed: binding then fails with `AddrInUse`. Default: off, so
    /// an existing path makes `bind` fail with `AddrInUse`, as in std and tokio.
    pub remove_stale_socket: bool,
    /// Whether the connections this listener accepts count in the
    /// runtime's stats (`accepted`, `accept_wakeups`,
    /// `max_accepted_per_wakeup`). Off for a side listener, such as a
    /// stats or admin endpoint, whose connections would otherwise pass for
    /// the served application's. Default: on.
    pub count_in_stats: bool,
}

/// Accept pacing by the worker's own lag.
///
/// The listener keeps a budget of accepts per loop turn. At the first
/// accept of each turn it looks at how the loop is doing: if the last turn
/// took longer than `turn_target`, or more than `run_queue_target` tasks are
/// queued to run, the worker is behind and the budget halves (never below
/// one, so new connections still trickle in); otherwise it grows by
/// `accepts_increase`. Connections not taken wait in the kernel's accept
/// queue, where they cost the worker nothing, and the connections it
/// already has keep their share of each turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptPacing {
    /// A loop turn (from one driver poll to the next) longer than this
    /// means the worker is behind. Default: 1 ms.
    pub turn_target: Duration,
    /// More tasks than this queued to run means the worker is behind.
    /// Default: 32.
    pub run_queue_target: usize,
    /// How much the budget grows per turn while the worker keeps up.
    /// Default: 4.
    pub accepts_increase: usize,
}

impl Default for AcceptPacing {
    fn default() -> Self {
        AcceptPacing {
            turn_target: Duration::from_millis(1),
            run_queue_target: 32,
            accepts_increase: 4,
        }
    }
}

impl ListenerOptions {
    /// The default bound on connections accepted per wakeup, as DragonFly's
    /// `kern.ipc.soavailconn`.
    pub const ACCEPTS_PER_WAKEUP_DEFAULT: usize = 32;
    /// The most connections a paced listener takes per loop turn when
    /// `accepts_per_wakeup_max` is `None`.
    pub const ACCEPTS_PACED_MAX: usize = 256;
}

impl Default for ListenerOptions {
    fn default() -> Self {
        ListenerOptions {
            reuse_port: true,
            backlog: 4096,
            defer_accept_secs: None,
            accepts_per_wakeup_max: Some(Self::ACCEPTS_PER_WAKEUP_DEFAULT),
            nodelay: true,
            accept_mode: AcceptMode::Multishot,
            resource_pause: Duration::from_millis(10),
            accept_pacing: Some(AcceptPacing::default()),
            remove_stale_socket: false,
            count_in_stats: true,
        }
    }
}

/// How a [`serve`](super::serve) server is set up: its listeners, its
/// connection limits, how long it drains, and where its sockets come from.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The listener options every worker's listener gets.
    pub listener: ListenerOptions,
    /// The most connections open at once over all workers (`None`: no limit).
    /// At the limit the listeners stop accepting and the kernel's backlog
    /// holds new connections until one finishes; none is accepted and closed.
    pub maxconn: Option<usize>,
    /// The most connections open at once on one worker (`None`: no limit).
    pub maxconn_per_worker: Option<usize>,
    /// Which worker serves a new connection. Default: [`Balance::Load`].
    pub balance: Balance,
    /// How long [`Server::stopped`](super::Server::stopped) lets open
    /// connections finish after a stop before it cuts them (haproxy's
    /// `hard-stop-after`). [`Server::drain`](super::Server::drain) takes
    /// its own. Default: [`ServerOptions::DRAIN_TIMEOUT_DEFAULT`].
    pub drain_timeout: Duration,
    /// During a drain, how long a keep-alive connection waiting for its
    /// next request must have been quiet before it is closed (always on a
    /// read that finds nothing pending, and only if a
    /// [`QuietCheck`](super::QuietCheck) finds nothing on its way in the
    /// kernel, either way). Quiet counts from the connection's last
    /// progress, or from its client's acknowledgement of the last answer's
    /// end if that came later: a write returns once the kernel has taken
    /// its bytes, and a client reading a long answer slowly is not idle.
    /// A connection that became quiet more recently waits for its next
    /// request, which is answered with `Connection: close` (HTTP/2: the
    /// GOAWAY is sent at once, whatever this is). Closing a connection on
    /// which a request is arriving races it: the client sees its
    /// connection fail, and only a client that retries gets its answer. At
    /// or above the drain's timeout (`drain_timeout`, or the one
    /// [`Server::drain`](super::Server::drain) is given), no idle
    /// connection is closed before the drain's deadline, however long it
    /// was idle before the stop: each is closed after answering its next
    /// request (haproxy's `idle-close-on-response`), at the cost of a
    /// drain that lasts until every such client has sent again or the
    /// deadline cuts it. Used by [`serve_hyper`](crate::hyper::serve_hyper)
    /// and read through
    /// [`StopSignal::idle_close_after`](super::StopSignal::idle_close_after).
    /// Default: [`DRAIN_IDLE_QUIET`](super::DRAIN_IDLE_QUIET).
    pub drain_idle_quiet: Duration,
    /// Where the listening sockets may come from: a socket this
    /// [`Handover`] inherited (from a predecessor, or systemd) on the
    /// server's address is used instead of binding, and the server's
    /// sockets are offered to a successor, which stops this server's
    /// accepts when it takes them. Default: none (the server binds).
    pub handover: Option<Handover>,
}

impl ServerOptions {
    /// The default drain timeout: 30 s, the grace period Kubernetes gives
    /// a pod between SIGTERM and SIGKILL.
    pub const DRAIN_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            listener: ListenerOptions::default(),
            maxconn: None,
            maxconn_per_worker: None,
            balance: Balance::default(),
            drain_timeout: Self::DRAIN_TIMEOUT_DEFAULT,
            drain_idle_quiet: super::DRAIN_IDLE_QUIET,
            handover: None,
        }
    }
}

/// Which worker serves a connection a server accepts.
///
/// The kernel's `SO_REUSEPORT` hash puts each new TCP connection in one
/// worker's accept queue, whatever that worker's load. With `Load` or
/// `Count`, the worker that accepted it may hand it, as a descriptor, to
/// another worker of the same server before anything is read from it
/// (see `net/balance.rs`). A Unix server's workers share one accept queue,
/// so whichever is free takes the next connection; hand-offs apply the same.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Balance {
    /// The kernel's hash alone: a connection stays where it was accepted.
    Kernel,
    /// A worker busy for more than [`Balance::LOAD_BUSY_MIN_PERMILLE`] of
    /// its recent time hands a new connection to the least busy worker,
    /// if that one is at least [`Balance::LOAD_MARGIN_PERMILLE`] less busy.
    /// When the load decides nothing (idle workers, or busy shares within
    /// the margin) it places the connection as `Count` does, among the
    /// workers not the margin busier than this one, so a burst reaching
    /// idle workers is spread as evenly as by counting. It costs a few
    /// atomic reads per accepted connection, and a hand-off when counts
    /// differ.
    #[default]
    Load,
    /// Every connection goes to the worker holding the fewest connections
    /// (ties stay), as Envoy's `exact_balance` does: equal counts, whatever
    /// each connection costs.
    Count,
}

impl Balance {
    /// Below this busy share (per-mille) a worker keeps what it accepts.
    pub const LOAD_BUSY_MIN_PERMILLE: u32 = 300;
    /// A connection moves only to a worker at least this much (per-mille)
    /// less busy than the one that accepted it.
    pub const LOAD_MARGIN_PERMILLE: u32 = 150;
    /// What a connection already on its way to a worker adds to that
    /// worker's busy share (per-mille) when the next one is placed.
    pub const LOAD_INCOMING_PERMILLE: u32 = 100;
}

impl std::str::FromStr for Balance {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "kernel" => Ok(Balance::Kernel),
            "load" => Ok(Balance::Load),
            "count" => Ok(Balance::Count),
            other => Err(format!("unknown balance `{other}`: expected kernel, load or count")),
        }
    }
}

impl std::fmt::Display for Balance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Balance::Kernel => "kernel",
            Balance::Load => "load",
            Balance::Count => "count",
        })
    }
}

impl From<ListenerOptions> for ServerOptions {
    fn from(listener: ListenerOptions) -> Self {
        ServerOptions { listener, ..Default::default() }
    }
}
