//! The settings a runtime is built with.

use std::time::Duration;

use crate::driver::DriverConfig;
pub use crate::driver::{DriverKind, KernelBusyPoll, Registration};

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
    pub(crate) blocking_shutdown_timeout: Duration,
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
            blocking_shutdown_timeout: super::blocking::BLOCKING_SHUTDOWN_TIMEOUT_DEFAULT,
        }
    }
}

impl Config {
    /// The part of the configuration the I/O driver is built from.
    pub(crate) fn driver_config(&self) -> DriverConfig {
        DriverConfig {
            kind: self.driver,
            registration: self.registration,
            events_per_poll_max: self.events_per_poll_max,
            uring_entries: self.uring_entries,
            kernel_busy_poll: self.kernel_busy_poll,
            uring_switches: crate::driver::UringSwitches::from_env(),
        }
    }
}
