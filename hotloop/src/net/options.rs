//! Listener options: how a listening socket is set up and how it accepts.

use std::time::Duration;

use crate::driver::AcceptMode;

/// How a [`TcpListener`](super::TcpListener) is set up and how it accepts.
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
    /// Multishot or single-shot accept (io_uring). Default: multishot.
    pub accept_mode: AcceptMode,
    /// How long accepting pauses after `EMFILE`/`ENFILE`, so a full
    /// descriptor table does not make the loop spin. Default: 10 ms.
    pub resource_pause: Duration,
}

impl ListenerOptions {
    /// The default bound on connections accepted per wakeup, as DragonFly's
    /// `kern.ipc.soavailconn`.
    pub const ACCEPTS_PER_WAKEUP_DEFAULT: usize = 32;
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
        }
    }
}

/// How a [`serve`](super::serve) server is set up: its listeners and its
/// connection limits.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// The listener options every worker's listener gets.
    pub listener: ListenerOptions,
    /// The most connections open at once over all workers (`None`: no limit).
    /// At the limit the listeners stop accepting and the kernel's backlog
    /// holds new connections until one finishes; none is accepted and closed.
    pub maxconn: Option<usize>,
    /// The most connections open at once on one worker (`None`: no limit).
    pub maxconn_per_worker: Option<usize>,
}

impl From<ListenerOptions> for ServerOptions {
    fn from(listener: ListenerOptions) -> Self {
        ServerOptions { listener, ..Default::default() }
    }
}
