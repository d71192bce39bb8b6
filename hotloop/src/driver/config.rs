//! What a driver is built from: which backend, and its few settings.

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

/// How a listener asks the driver for connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AcceptMode {
    /// io_uring: one submission keeps accepting until the kernel stops it
    /// (Linux 5.19+). On epoll, the same as `Single`.
    #[default]
    Multishot,
    /// One submission (or one `accept4`) per connection.
    Single,
}

impl std::str::FromStr for AcceptMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "multishot" => Ok(AcceptMode::Multishot),
            "single" | "singleshot" => Ok(AcceptMode::Single),
            other => Err(format!("unknown accept mode `{other}`: expected multishot or single")),
        }
    }
}

/// The settings one driver is built with: a few numbers, not the
/// runtime's configuration.
#[derive(Debug, Clone)]
pub(crate) struct DriverConfig {
    /// Which backend.
    pub(crate) kind: DriverKind,
    /// When epoll registers a socket.
    pub(crate) registration: Registration,
    /// The most events (epoll) or completions (io_uring) handled per poll.
    pub(crate) events_per_poll_max: usize,
    /// Submission queue entries of the io_uring.
    pub(crate) uring_entries: u32,
    /// The kernel's own busy polling, where it applies.
    pub(crate) kernel_busy_poll: Option<KernelBusyPoll>,
}
