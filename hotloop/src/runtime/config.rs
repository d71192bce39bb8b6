//! The settings a runtime is built with.

use std::time::Duration;

/// Which I/O driver the workers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DriverKind {
    /// Readiness-based: epoll, edge-triggered, with lazy registration.
    Epoll,
    /// Completion-based: io_uring.
    Uring,
    /// io_uring when the kernel allows it, epoll otherwise (the reason is
    /// reported in the stats). The `HOTLOOP_DRIVER` environment variable
    /// (`epoll` or `uring`) overrides it.
    #[default]
    Auto,
}

impl std::str::FromStr for DriverKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "epoll" => Ok(DriverKind::Epoll),
            "uring" | "io_uring" | "io-uring" => Ok(DriverKind::Uring),
            "auto" => Ok(DriverKind::Auto),
            other => Err(format!("unknown driver `{other}`: expected auto, epoll or uring")),
        }
    }
}

/// Whether the poller sleeps when there is nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BusyPoll {
    /// Sleep in the kernel until an event or the next timer.
    #[default]
    Off,
    /// Never sleep: poll with a zero timeout in a loop (haproxy's
    /// `busy-polling`). Costs a whole core per worker, idle or not.
    Always,
    /// Keep polling with a zero timeout for at most `spin_budget` after the
    /// last event, then sleep, so an idle worker costs nothing.
    Adaptive {
        /// How long to spin after the last event before sleeping.
        spin_budget: Duration,
    },
}

impl BusyPoll {
    /// The default spin budget of adaptive mode.
    pub const ADAPTIVE_SPIN_BUDGET_DEFAULT: Duration = Duration::from_micros(200);
}

impl std::fmt::Display for BusyPoll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BusyPoll::Off => write!(f, "off"),
            BusyPoll::Always => write!(f, "always"),
            BusyPoll::Adaptive { spin_budget } => write!(f, "adaptive:{}", spin_budget.as_micros()),
        }
    }
}

impl std::str::FromStr for BusyPoll {
    type Err = String;
    /// Parses `off`, `always`, `adaptive` or `adaptive:MICROS`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(BusyPoll::Off),
            "always" => Ok(BusyPoll::Always),
            "adaptive" => Ok(BusyPoll::Adaptive { spin_budget: Self::ADAPTIVE_SPIN_BUDGET_DEFAULT }),
            other => match other.strip_prefix("adaptive:").map(str::parse::<u64>) {
                Some(Ok(us)) => Ok(BusyPoll::Adaptive { spin_budget: Duration::from_micros(us) }),
                _ => Err(format!(
                    "unknown busy-poll mode `{other}`: expected off, always, adaptive or adaptive:MICROS"
                )),
            },
        }
    }
}

/// When a socket is registered with epoll.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Registration {
    /// Only when an operation on it first returns `WouldBlock`; a socket
    /// that never has to wait is never registered.
    #[default]
    Lazy,
    /// As soon as it is created or accepted (the usual design, kept so the
    /// difference can be measured).
    Eager,
}

impl std::str::FromStr for Registration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lazy" => Ok(Registration::Lazy),
            "eager" => Ok(Registration::Eager),
            other => Err(format!("unknown registration mode `{other}`: expected lazy or eager")),
        }
    }
}

/// The kernel's own busy polling inside `epoll_wait` (`EPIOCSPARAMS`, Linux 6.9)
/// or io_uring's NAPI registration. It only helps on devices with NAPI queues:
/// loopback traffic has no NAPI id, so there only user-space spinning helps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelBusyPoll {
    /// Microseconds the kernel may spin per wait.
    pub busy_poll_us: u32,
    /// Packets handled per spin.
    pub budget: u16,
}

/// Everything a worker needs to know about how it was configured.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) workers: usize,
    pub(crate) pin_cpus: bool,
    pub(crate) driver: DriverKind,
    pub(crate) busy_poll: BusyPoll,
    pub(crate) kernel_busy_poll: Option<KernelBusyPoll>,
    pub(crate) event_interval: u32,
    pub(crate) registration: Registration,
    pub(crate) events_per_poll_max: usize,
    pub(crate) uring_entries: u32,
    pub(crate) max_blocking_threads: usize,
    pub(crate) blocking_keep_alive: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            pin_cpus: false,
            driver: DriverKind::Auto,
            busy_poll: BusyPoll::Off,
            kernel_busy_poll: None,
            event_interval: 61,
            registration: Registration::Lazy,
            events_per_poll_max: 1024,
            uring_entries: 1024,
            max_blocking_threads: super::blocking::BLOCKING_THREADS_MAX_DEFAULT,
            blocking_keep_alive: super::blocking::BLOCKING_KEEP_ALIVE_DEFAULT,
        }
    }
}
