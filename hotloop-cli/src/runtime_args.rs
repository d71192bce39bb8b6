//! The runtime flags shared by `hotloop serve` and `hotloop proxy`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use hotloop::net::{
    AcceptMode, AcceptPacing, Balance, Handover, ListenerOptions, ServerOptions, READY_WAIT,
};
use hotloop::{BusyPoll, DriverKind, KernelBusyPoll, Registration, Runtime};

/// How the runtime and its listeners are set up.
#[derive(Args, Debug, Clone)]
pub struct RuntimeArgs {
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub workers: Option<usize>,
    /// I/O driver: auto, epoll or uring.
    #[arg(long, default_value = "auto")]
    pub driver: DriverKind,
    /// Busy polling: off, always, adaptive or adaptive:MICROS.
    #[arg(long, default_value = "off")]
    pub busy_poll: BusyPoll,
    /// Ask the kernel to busy-poll NAPI queues for this many microseconds per wait (0: off).
    #[arg(long, default_value_t = 0)]
    pub kernel_busy_poll_us: u32,
    /// Connections accepted per wakeup: a number or `unlimited`.
    #[arg(long, default_value = "32", value_parser = parse_max_accepts)]
    pub max_accepts: MaxAccepts,
    /// Accept pacing by the worker's lag: `off` (the fixed --max-accepts
    /// bound alone), `on` (a 1 ms turn target) or the turn target in
    /// microseconds; the budget stays within --max-accepts.
    #[arg(long, default_value = "on", value_parser = parse_accept_pacing)]
    pub accept_pacing: Pacing,
    /// TCP_DEFER_ACCEPT seconds, or `off`.
    #[arg(long, default_value = "off", value_parser = parse_defer_accept)]
    pub defer_accept: DeferAccept,
    /// io_uring accept: multishot or single.
    #[arg(long, default_value = "multishot")]
    pub accept: AcceptMode,
    /// epoll registration: lazy or eager.
    #[arg(long, default_value = "lazy")]
    pub register: Registration,
    /// Pin worker i to CPU i.
    #[arg(long)]
    pub pin: bool,
    /// Task polls per loop turn before the worker looks at I/O again (on
    /// io_uring, at most one `io_uring_enter` per turn reaps completions).
    #[arg(long, default_value_t = 61, value_parser = clap::value_parser!(u32).range(1..))]
    pub event_interval: u32,
    /// Listen backlog.
    #[arg(long, default_value_t = 4096)]
    pub backlog: u32,
    /// The most connections open at once over all workers (default: no
    /// limit; quic and h3: 4096).
    #[arg(long)]
    pub maxconn: Option<usize>,
    /// The most connections open at once on one worker (default: no limit).
    #[arg(long)]
    pub maxconn_per_worker: Option<usize>,
    /// Which worker serves a new connection: `load` (a busy worker hands
    /// it to the least busy one), `count` (the worker holding the fewest
    /// connections) or `kernel` (where the kernel's SO_REUSEPORT hash put it).
    #[arg(long, default_value = "load")]
    pub balance: Balance,
    /// Serve the live counters over HTTP on this address (GET /stats for JSON, /metrics for Prometheus).
    #[arg(long)]
    pub stats_addr: Option<String>,
    /// Drain timeout: once the process drains (SIGTERM or SIGINT, or a
    /// successor took its sockets over), how long open connections may
    /// take to finish before they are cut and counted, milliseconds
    /// (haproxy's `hard-stop-after`); the process exits as soon as the last
    /// one ends. `--grace-ms` is the same.
    #[arg(long, visible_alias = "grace-ms", default_value_t = 5000)]
    pub drain_timeout_ms: u64,
    /// During a drain, how long a keep-alive HTTP/1.1 connection waiting for
    /// its next request must have been quiet before it is closed,
    /// milliseconds (always on a read that finds nothing pending), counted
    /// from its last answer's end reaching the client (acknowledged by it),
    /// not from the write that handed it to the kernel. One that became
    /// quiet more recently is kept for its next request, answered with
    /// `Connection: close`. Closing a connection a request is arriving on
    /// makes that request fail for a client that does not retry; at or
    /// above `--drain-timeout-ms` no idle connection is closed before the
    /// drain's deadline, however long it was idle before the stop
    /// (haproxy's `idle-close-on-response`), and the drain lasts until each
    /// has sent again or the deadline cuts it.
    #[arg(long, default_value_t = 1000)]
    pub drain_idle_quiet_ms: u64,
    /// Upgrades: the first process started with PATH binds its addresses
    /// and waits on PATH (a Unix socket) for a successor; a later process
    /// started with the same PATH (a new build, new options) receives
    /// every listening socket over it, serves them, then tells the old one
    /// to drain. Nothing waiting in a listen queue is refused or lost. A
    /// successor that fails to start leaves the old process serving.
    #[arg(long, value_name = "PATH")]
    pub upgrade_socket: Option<PathBuf>,
    /// With --upgrade-socket: how long a successor that received the
    /// sockets may take to say it serves, milliseconds. One that says
    /// nothing by then (stuck in its start-up, stopped) is dropped: this
    /// process logs and counts it (`upgrade_failures`), goes on serving,
    /// and hands over to the next successor; the late one exits with an
    /// error if it says ready after. Under the 30 s a successor waits for
    /// the sockets, so one started behind a stuck one still gets them.
    #[arg(long, default_value_t = READY_WAIT.as_millis() as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub upgrade_ready_timeout_ms: u64,
}

/// The accepts-per-wakeup bound as given on the command line.
#[derive(Debug, Clone, Copy)]
pub struct MaxAccepts(pub Option<usize>);

/// The accept pacing setting as given on the command line.
#[derive(Debug, Clone, Copy)]
pub struct Pacing(pub Option<AcceptPacing>);

fn parse_accept_pacing(s: &str) -> Result<Pacing, String> {
    match s {
        "off" => Ok(Pacing(None)),
        "on" => Ok(Pacing(Some(AcceptPacing::default()))),
        n => match n.parse::<u64>() {
            Ok(us) if us > 0 => Ok(Pacing(Some(AcceptPacing {
                turn_target: Duration::from_micros(us),
                ..AcceptPacing::default()
            }))),
            _ => Err(format!("`{n}` is not `off`, `on` or a turn target in microseconds")),
        },
    }
}

/// The TCP_DEFER_ACCEPT setting as given on the command line.
#[derive(Debug, Clone, Copy)]
pub struct DeferAccept(pub Option<u32>);

fn parse_max_accepts(s: &str) -> Result<MaxAccepts, String> {
    match s {
        "unlimited" | "none" => Ok(MaxAccepts(None)),
        n => match n.parse::<usize>() {
            Ok(0) => Err("--max-accepts must be at least 1 (or `unlimited`)".into()),
            Ok(n) => Ok(MaxAccepts(Some(n))),
            Err(_) => Err(format!("`{n}` is not a number or `unlimited`")),
        },
    }
}

fn parse_defer_accept(s: &str) -> Result<DeferAccept, String> {
    match s {
        "off" | "0" => Ok(DeferAccept(None)),
        n => n
            .parse::<u32>()
            .map(|v| DeferAccept(Some(v)))
            .map_err(|_| format!("`{n}` is not seconds or `off`")),
    }
}

impl RuntimeArgs {
    /// Builds the runtime these flags describe.
    pub fn build_runtime(&self) -> std::io::Result<Runtime> {
        let mut b = Runtime::builder()
            .driver(self.driver)
            .busy_poll(self.busy_poll)
            .registration(self.register)
            .pin_cpus(self.pin)
            .event_interval(self.event_interval);
        if let Some(n) = self.workers {
            b = b.workers(n);
        }
        if self.kernel_busy_poll_us > 0 {
            b = b.kernel_busy_poll(Some(KernelBusyPoll {
                busy_poll_us: self.kernel_busy_poll_us,
                budget: 64,
            }));
        }
        b.build()
    }

    /// The listener options these flags describe.
    pub fn listener_options(&self) -> ListenerOptions {
        ListenerOptions {
            backlog: self.backlog,
            defer_accept_secs: self.defer_accept.0,
            accepts_per_wakeup_max: self.max_accepts.0,
            accept_pacing: self.accept_pacing.0,
            accept_mode: self.accept,
            ..ListenerOptions::default()
        }
    }

    /// Where the listening sockets come from: a predecessor on
    /// `--upgrade-socket` (this process is the first if none serves
    /// there), or systemd (`LISTEN_FDS` naming this process); otherwise the
    /// servers bind.
    pub fn handover(&self) -> std::io::Result<Handover> {
        match &self.upgrade_socket {
            Some(path) => {
                let handover = Handover::open(path)?;
                handover.set_ready_wait(Duration::from_millis(self.upgrade_ready_timeout_ms));
                Ok(handover)
            }
            None => Handover::inherit(),
        }
    }

    /// The server options (listener options, connection limits, drain
    /// timeout, and where the sockets come from) these flags describe.
    pub fn server_options(&self, handover: &Handover) -> ServerOptions {
        ServerOptions {
            listener: self.listener_options(),
            maxconn: self.maxconn,
            maxconn_per_worker: self.maxconn_per_worker,
            balance: self.balance,
            drain_timeout: self.drain_timeout(),
            drain_idle_quiet: self.drain_idle_quiet(),
            handover: Some(handover.clone()),
        }
    }

    /// How long a drain may take before what is open is cut.
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_timeout_ms)
    }

    /// During a drain, how long an idle keep-alive connection must have
    /// been quiet before it is closed.
    pub fn drain_idle_quiet(&self) -> Duration {
        Duration::from_millis(self.drain_idle_quiet_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_pacing_parses_off_on_and_a_target() {
        assert_eq!(parse_accept_pacing("off").unwrap().0, None);
        assert_eq!(parse_accept_pacing("on").unwrap().0, Some(AcceptPacing::default()));
        let p = parse_accept_pacing("500").unwrap().0.unwrap();
        assert_eq!(p.turn_target, Duration::from_micros(500));
        assert!(parse_accept_pacing("0").is_err());
        assert!(parse_accept_pacing("fast").is_err());
    }

    #[test]
    fn event_interval_defaults_to_61_and_refuses_0() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            runtime: RuntimeArgs,
        }
        assert_eq!(Cli::try_parse_from(["hotloop"]).unwrap().runtime.event_interval, 61);
        let set = Cli::try_parse_from(["hotloop", "--event-interval", "256"]).unwrap();
        assert_eq!(set.runtime.event_interval, 256);
        assert!(Cli::try_parse_from(["hotloop", "--event-interval", "0"]).is_err());
    }

    #[test]
    fn max_accepts_parses_a_number_or_unlimited() {
        assert_eq!(parse_max_accepts("unlimited").unwrap().0, None);
        assert_eq!(parse_max_accepts("32").unwrap().0, Some(32));
        assert!(parse_max_accepts("0").is_err());
    }
}
