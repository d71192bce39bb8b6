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
    /// io_uring switches for measuring or working around a kernel bug.
    pub(crate) uring_switches: UringSwitches,
}

/// Switches that turn io_uring features off, read from the environment in
/// one place ([`UringSwitches::from_env`]) when a runtime is built:
/// - `HOTLOOP_URING_MULTISHOT_RECV=0`: no multishot receive with a
///   provided-buffer ring, for streams or datagrams;
/// - `HOTLOOP_URING_MULTISHOT_RECVMSG=0`: none for datagrams alone;
/// - `HOTLOOP_URING_DGRAM_BUFFERS=N`: buffers in each datagram socket's
///   ring (a power of two up to 32768);
/// - `HOTLOOP_URING_FS=0`: file operations on the blocking pool, as on
///   epoll, instead of the ring;
/// - `HOTLOOP_URING_SEND_FILE=splice`: `send_file` by two `SPLICE`
///   operations per step instead of `sendfile(2)`;
/// - `HOTLOOP_URING_DIRECT_SEND=0`: every stream write through the ring
///   (an owned write as a `SEND` entry, a poll-form write written
///   behind), never first as a non-blocking `send(2)` or `sendmsg(2)`;
/// - `HOTLOOP_URING_SUBMIT_AFTER_US=N` (default 200): queued ring entries
///   are submitted between two task polls once the oldest has waited N
///   µs, rather than only when the turn's tasks are done; `off` keeps them
///   for the end of the turn;
/// - `HOTLOOP_URING_REGISTERED_RING=0`: every `io_uring_enter` names the
///   ring by its descriptor, which the kernel looks up each time, instead
///   of by its slot among the thread's registered rings
///   (`IORING_REGISTER_RING_FDS`);
/// - `HOTLOOP_URING_SEND_ZC=0`: no zero-copy sends (`SEND_ZC`) of owned
///   writes of shared buffers; `always`: send zero-copy to a local peer
///   too, and keep sending zero-copy on a socket whose sends the kernel
///   reported copied, which by default get copying sends (for measuring
///   what the copy costs);
/// - `HOTLOOP_URING_SEND_ZC_MIN_BYTES=N` (default 65536): the smallest
///   owned write sent zero-copy;
/// - `HOTLOOP_URING_RECV_INC=0`: the stream receive ring's buffers are
///   used whole, one per completion (4 KiB), instead of 64 KiB buffers
///   consumed a completion at a time (`IOU_PBUF_RING_INC`, Linux 6.12);
/// - `HOTLOOP_URING_DIRECT_FDS=1` (default 0): accepted TCP connections
///   are direct descriptors, slots of a file table the ring registers,
///   named `IOSQE_FIXED_FILE` by every entry (see `uring/accept.rs`);
/// - `HOTLOOP_URING_DIRECT_FDS_SLOTS=N` (default 16384, at most the soft
///   open-file limit, which the kernel applies): the table's slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UringSwitches {
    /// Multishot receive on streams (and datagrams) where the kernel has it.
    pub(crate) multishot_recv: bool,
    /// Multishot `RECVMSG` on datagram sockets where the kernel has it.
    pub(crate) multishot_recvmsg: bool,
    /// Buffers in each datagram socket's ring.
    pub(crate) dgram_buffers: u16,
    /// File operations as ring operations where the kernel has them.
    pub(crate) files_on_ring: bool,
    /// `send_file` by `SPLICE` through a pipe rather than `sendfile(2)`.
    pub(crate) send_file_splice: bool,
    /// Stream writes on a quiet worker try a non-blocking send first.
    pub(crate) direct_send: bool,
    /// The longest a ring entry waits, while tasks run, before it is
    /// submitted on its own (`None`: only at the end of the turn).
    pub(crate) submit_after_ns: Option<u64>,
    /// Enter the ring through a registered ring descriptor where the
    /// kernel allows it (Linux 5.18).
    pub(crate) registered_ring: bool,
    /// Owned stream writes of at least this many bytes go out as
    /// `SEND_ZC` where the kernel has it (`None`: never).
    pub(crate) send_zc_min_bytes: Option<usize>,
    /// Send zero-copy to a local peer too, and keep sending zero-copy on a
    /// socket after the kernel reported that it copied one such send.
    pub(crate) send_zc_when_copied: bool,
    /// The stream receive ring consumed incrementally where the kernel
    /// has it (`IOU_PBUF_RING_INC`).
    pub(crate) recv_incremental: bool,
    /// Accepted TCP connections as direct descriptors in a file table of
    /// this many slots (`None`: plain descriptors).
    pub(crate) direct_fd_slots: Option<u32>,
}

impl UringSwitches {
    /// Buffers in a datagram socket's ring unless the environment says otherwise.
    pub(crate) const DGRAM_BUFFERS_DEFAULT: u16 = 64;

    /// How long a ring entry may wait while tasks run, unless the
    /// environment says otherwise: at most one extra `io_uring_enter` per
    /// 200 µs of task time, so tens of cheap tasks still share one enter,
    /// while an answer queued before costly ones leaves within 200 µs and a
    /// task. With 60 µs requests under the accept storm, 50 µs cost 6% of
    /// the closed-loop rate for the same tail, and 500 µs gave back a third
    /// of the tail.
    pub(crate) const SUBMIT_AFTER_DEFAULT_US: u64 = 200;

    /// The smallest owned write sent zero-copy unless the environment says
    /// otherwise. A zero-copy send costs a second completion and pinning
    /// the pages, and where the kernel copies after all (a local peer) the
    /// copy too: forced on every write over a veth pair it cost 1.26x a
    /// copying send's CPU at 64 KiB and 1.02x at 1 MiB, 1.31x at 16 KiB
    /// (BENCHMARKS.md, "Zero-copy send").
    pub(crate) const SEND_ZC_MIN_DEFAULT_BYTES: usize = 64 * 1024;

    /// Slots in the file table of direct sockets unless the environment
    /// says otherwise: 16384 connections per worker before accepts turn
    /// plain, for 128 KiB of kernel memory per ring.
    pub(crate) const DIRECT_FD_SLOTS_DEFAULT: u32 = 16384;

    /// The switches as the environment sets them (a malformed buffer count
    /// is reported and the default used).
    pub(crate) fn from_env() -> Self {
        let off = |name: &str| std::env::var(name).is_ok_and(|v| v == "0");
        let multishot_recv = !off("HOTLOOP_URING_MULTISHOT_RECV");
        let dgram_buffers = match std::env::var("HOTLOOP_URING_DGRAM_BUFFERS") {
            Err(_) => Self::DGRAM_BUFFERS_DEFAULT,
            Ok(v) => match v.trim().parse::<u16>() {
                Ok(n) if n.is_power_of_two() && n <= 1 << 15 => n,
                _ => {
                    crate::log::warn(format_args!(
                        "HOTLOOP_URING_DGRAM_BUFFERS={v:?} is not a power of two from 1 to \
                         32768; using {}",
                        Self::DGRAM_BUFFERS_DEFAULT
                    ));
                    Self::DGRAM_BUFFERS_DEFAULT
                }
            },
        };
        UringSwitches {
            multishot_recv,
            multishot_recvmsg: multishot_recv && !off("HOTLOOP_URING_MULTISHOT_RECVMSG"),
            dgram_buffers,
            files_on_ring: !off("HOTLOOP_URING_FS"),
            send_file_splice: std::env::var("HOTLOOP_URING_SEND_FILE").is_ok_and(|v| v == "splice"),
            direct_send: !off("HOTLOOP_URING_DIRECT_SEND"),
            submit_after_ns: submit_after_from_env(),
            registered_ring: !off("HOTLOOP_URING_REGISTERED_RING"),
            send_zc_min_bytes: (!off("HOTLOOP_URING_SEND_ZC")).then(send_zc_min_from_env),
            send_zc_when_copied: std::env::var("HOTLOOP_URING_SEND_ZC")
                .is_ok_and(|v| v == "always"),
            recv_incremental: !off("HOTLOOP_URING_RECV_INC"),
            direct_fd_slots: std::env::var("HOTLOOP_URING_DIRECT_FDS")
                .is_ok_and(|v| v == "1")
                .then(direct_fd_slots_from_env),
        }
    }
}

/// `HOTLOOP_URING_SUBMIT_AFTER_US` in nanoseconds: `off` is `None`; a
/// malformed value is reported and the default used.
fn submit_after_from_env() -> Option<u64> {
    let default = Some(UringSwitches::SUBMIT_AFTER_DEFAULT_US * 1000);
    match std::env::var("HOTLOOP_URING_SUBMIT_AFTER_US") {
        Err(_) => default,
        Ok(v) if v.trim() == "off" => None,
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(us) if us <= 1_000_000 => Some(us * 1000),
            _ => {
                crate::log::warn(format_args!(
                    "HOTLOOP_URING_SUBMIT_AFTER_US={v:?} is neither `off` nor a number of \
                     microseconds up to 1000000; using {}",
                    UringSwitches::SUBMIT_AFTER_DEFAULT_US
                ));
                default
            }
        },
    }
}

/// `HOTLOOP_URING_DIRECT_FDS_SLOTS`: a malformed value (or 0) is reported
/// and the default used.
fn direct_fd_slots_from_env() -> u32 {
    let default = UringSwitches::DIRECT_FD_SLOTS_DEFAULT;
    match std::env::var("HOTLOOP_URING_DIRECT_FDS_SLOTS") {
        Err(_) => default,
        Ok(v) => match v.trim().parse::<u32>() {
            Ok(n) if (1..=1 << 20).contains(&n) => n,
            _ => {
                crate::log::warn(format_args!(
                    "HOTLOOP_URING_DIRECT_FDS_SLOTS={v:?} is not a number of slots from 1 to \
                     1048576; using {default}"
                ));
                default
            }
        },
    }
}

/// `HOTLOOP_URING_SEND_ZC_MIN_BYTES`: a malformed value (or one under 1
/// KiB, where the second completion alone costs more than the copy) is
/// reported and the default used.
fn send_zc_min_from_env() -> usize {
    let default = UringSwitches::SEND_ZC_MIN_DEFAULT_BYTES;
    match std::env::var("HOTLOOP_URING_SEND_ZC_MIN_BYTES") {
        Err(_) => default,
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n >= 1024 => n,
            _ => {
                crate::log::warn(format_args!(
                    "HOTLOOP_URING_SEND_ZC_MIN_BYTES={v:?} is not a number of bytes from 1024; \
                     using {default}"
                ));
                default
            }
        },
    }
}
