//! The I/O driver boundary.
//!
//! # The contract
//! Every backend module provides the same types:
//! - `Driver`, one per worker, behind an `Rc` that every socket of the
//!   worker holds: `new(config, unpark, stats)` sets it up; `poll(park)`
//!   waits as the [`Park`] says (not at all, or until something happens
//!   or an absolute deadline passes), then wakes every task whose I/O
//!   became ready or completed, and returns how many events or
//!   completions it handled; `enter()` marks it as running on this thread
//!   until the guard drops (on io_uring the guard's drop first drives the
//!   ring until the bytes its streams reported written are in the kernel,
//!   or their send deadline passes: nobody enters it until the runtime
//!   comes back).
//! - A source per role, each a descriptor bound to one `Driver` with only
//!   its role's operations and state (`source.rs` here, and each
//!   backend's files of the same names). Each role's calls are listed once,
//!   in `contract.rs`: that list is the trait each backend's source
//!   implements (`ListenerOps`, `StreamOps`, `DatagramOps`,
//!   `ReadinessOps`) and the face's forwarding of each call, so a new
//!   operation is one line there and one method per backend:
//!   - [`ListenerSource`]: `poll_accept`/`accept_now`, `set_accept_room`.
//!   - [`StreamSource`]: owned-buffer `recv`/`send`/`send_vectored`,
//!     `connect`, `shutdown`, a readiness wait (`poll_readable`) with a
//!     non-blocking `try_recv` beside it, the borrowed-slice poll forms
//!     behind tokio's and futures' I/O traits, and `send_file` (a file's
//!     bytes to the socket without a copy through user space).
//!   - [`DatagramSource`]: owned `recv_msg`/`send_msg`, batched borrowed
//!     `poll_recv_batch`/`poll_send_batch`, `try_send_one` and `writable`
//!     (each backend's `udp.rs`; control messages are encoded in [`udp`]
//!     only).
//!   - [`ReadinessSource`]: a descriptor whose I/O is made elsewhere (a
//!     pidfd; a Unix datagram socket through std's calls), with waits for
//!     the next readiness that never answer from remembered state
//!     (`poll_next_readable`, `next_writable`).
//!
//! Two backends exist on Linux and both always compile: [`epoll`]
//! (readiness) and [`uring`] (completion). [`Driver`] and the sources are
//! enums over them, chosen once at start-up; every operation matches once
//! and calls its backend (a static call through the role's trait). File operations exist only on io_uring
//! (`uring/file.rs`): [`Driver::ring_for`] says whether the ring runs one,
//! and the file layer (`fs/`) uses the blocking pool otherwise. The
//! network layer (`net/`) sees only this module and `source.rs`.
//!
//! # Architecture invariants
//! - `driver/` imports nothing from `runtime/` or `net/`: the runtime
//!   enters the driver, never the reverse. Its inputs are a
//!   [`DriverConfig`], an [`Unpark`] and the worker's counters.
//! - Imports inside `driver/` run one way, bottom to top: `park.rs`,
//!   `config.rs`, `wake.rs`, `probe.rs`, `udp.rs`, `contract.rs` (each
//!   naming only those before it), then the backends `epoll/` and `uring/`
//!   (which name only those six, never each other nor the face), then the face:
//!   `source.rs` and this file. Inside `uring/` the order is written in
//!   its module doc. `hotloop/tests/layering.rs` checks both.
//! - A source holds its driver (an `Rc`), so an operation never looks up
//!   "the current runtime": it cannot reach another runtime's state, and
//!   nothing in here is `Send`.
//! - A source's type is its role: a stream cannot accept, a listener
//!   cannot read, and a stream carries no listener's or datagram
//!   socket's state.
//! - An operation owns everything the kernel may touch, the socket
//!   included, until its last completion (io_uring; see `uring/op.rs`).
//! - Waiting on a driver that is not entered on this thread (its runtime
//!   is not running here) is an error, not a hang.

mod config;
pub(crate) mod contract;
pub(crate) mod epoll;
mod park;
pub(crate) mod probe;
mod source;
pub(crate) mod udp;
pub(crate) mod uring;
mod wake;

pub use config::{AcceptMode, DriverKind, KernelBusyPoll, Registration};
pub(crate) use config::{DriverConfig, UringSwitches};
pub(crate) use park::Park;
pub(crate) use source::{
    DatagramSource, ListenerSource, ReadinessSource, StreamProbe, StreamSource,
};
pub(crate) use uring::Accepted;
pub(crate) use wake::Unpark;

/// The file operations a worker's ring runs (`uring/file.rs`), as `fs`
/// reaches them: through this name, given by [`Driver::ring_for`], and
/// never through the io_uring backend's own types.
pub(crate) type FileRing = uring::Driver;

use std::io;
use std::rc::Rc;
use std::sync::Arc;

use crate::stats::{DriverInfo, WorkerStats};

/// The driver one worker uses.
#[derive(Clone)]
pub(crate) enum Driver {
    /// Readiness-based, edge-triggered epoll.
    Epoll(Rc<epoll::Driver>),
    /// Completion-based io_uring.
    Uring(Rc<uring::Driver>),
}

impl Driver {
    /// Creates the driver `config` asks for; `Auto` probes the kernel and
    /// falls back to epoll. The returned info says which and why.
    pub(crate) fn new(
        config: &DriverConfig,
        unpark: Arc<Unpark>,
        stats: Arc<WorkerStats>,
    ) -> io::Result<(Driver, DriverInfo)> {
        let (requested, by) = match std::env::var("HOTLOOP_DRIVER").ok().as_deref() {
            Some(s) if !s.is_empty() => (
                s.parse().map_err(|e: String| io::Error::new(io::ErrorKind::InvalidInput, e))?,
                " (HOTLOOP_DRIVER)",
            ),
            _ => (config.kind, ""),
        };
        let mut fallback = false;
        let (use_uring, mut reason) = match requested {
            DriverKind::Epoll => (false, format!("epoll was requested{by}")),
            DriverKind::Uring => (true, format!("io_uring was requested{by}")),
            DriverKind::Auto => match probe::uring_support() {
                Ok(()) => (
                    true,
                    "auto: the kernel supports every io_uring feature hotloop uses".to_string(),
                ),
                Err(why) => {
                    fallback = true;
                    (false, format!("auto: {why}; using epoll"))
                }
            },
        };
        if use_uring {
            match uring::Driver::new(config, unpark.clone(), stats.clone()) {
                Ok((driver, kernel_busy_poll, ring_fd)) => {
                    let info = DriverInfo {
                        driver: "uring",
                        reason: format!("{reason}; {ring_fd}"),
                        busy_poll: String::new(),
                        kernel_busy_poll,
                        fallback: false,
                    };
                    return Ok((Driver::Uring(driver), info));
                }
                // The probe's small ring worked but this one did not: auto still falls back.
                Err(e) if requested == DriverKind::Auto => {
                    fallback = true;
                    reason = format!("auto: io_uring setup failed ({e}); using epoll");
                }
                Err(e) => return Err(e),
            }
        }
        let (driver, kernel_busy_poll) = epoll::Driver::new(config, unpark, stats)?;
        let info = DriverInfo {
            driver: "epoll",
            reason,
            busy_poll: String::new(),
            kernel_busy_poll,
            fallback,
        };
        Ok((Driver::Epoll(driver), info))
    }

    /// Waits for I/O as `park` says and wakes the tasks it concerns.
    pub(crate) fn poll(&self, park: Park) -> io::Result<usize> {
        match self {
            Driver::Epoll(d) => d.poll(park),
            Driver::Uring(d) => d.poll(park),
        }
    }

    /// Called by the worker after each task poll (io_uring: submits entries
    /// that have waited too long; epoll has nothing to do).
    #[inline]
    pub(crate) fn after_task_poll(&self) {
        if let Driver::Uring(d) = self {
            d.after_task_poll();
        }
    }

    /// Marks the driver as running on this thread until the guard drops:
    /// only then may its sources wait.
    pub(crate) fn enter(&self) -> EnterGuard {
        let entered = match self {
            Driver::Epoll(d) => d.entered(),
            Driver::Uring(d) => d.entered(),
        };
        entered.set(true);
        EnterGuard { driver: self.clone() }
    }
}

/// A file operation the io_uring driver runs as a ring operation where
/// the kernel has its opcode (`uring/file.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileOp {
    /// `OPENAT`.
    Open,
    /// `OPENAT2`.
    OpenBeneath,
    /// `READ`.
    Read,
    /// `WRITE`.
    Write,
    /// `STATX`.
    Statx,
    /// `FSYNC`.
    Fsync,
    /// `FTRUNCATE` (Linux 6.9).
    Ftruncate,
    /// `RENAMEAT`.
    Rename,
    /// `UNLINKAT`.
    Unlink,
    /// `MKDIRAT`.
    Mkdir,
}

impl FileOp {
    fn code(self) -> u8 {
        use io_uring::opcode;
        match self {
            FileOp::Open => opcode::OpenAt::CODE,
            FileOp::OpenBeneath => opcode::OpenAt2::CODE,
            FileOp::Read => opcode::Read::CODE,
            FileOp::Write => opcode::Write::CODE,
            FileOp::Statx => opcode::Statx::CODE,
            FileOp::Fsync => opcode::Fsync::CODE,
            FileOp::Ftruncate => opcode::Ftruncate::CODE,
            FileOp::Rename => opcode::RenameAt::CODE,
            FileOp::Unlink => opcode::UnlinkAt::CODE,
            FileOp::Mkdir => opcode::MkDirAt::CODE,
        }
    }
}

impl Driver {
    /// The io_uring driver if this is one and its kernel has `op`;
    /// `None` means the caller runs the operation another way (the
    /// blocking pool for files, `sendfile` for sockets).
    pub(crate) fn ring_for(&self, op: FileOp) -> Option<&Rc<FileRing>> {
        match self {
            Driver::Uring(d) if d.switches.files_on_ring && probe::opcode_supported(op.code()) => {
                Some(d)
            }
            Driver::Uring(_) | Driver::Epoll(_) => None,
        }
    }
}

/// Keeps a driver entered; see [`Driver::enter`].
pub(crate) struct EnterGuard {
    driver: Driver,
}

impl Drop for EnterGuard {
    fn drop(&mut self) {
        match &self.driver {
            Driver::Epoll(d) => d.entered().set(false),
            // Nobody enters the ring until the runtime comes back: it
            // settles what it still owes first (`uring::Driver::leave`).
            Driver::Uring(d) => d.leave(),
        }
    }
}
