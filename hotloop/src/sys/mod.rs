//! Thin, checked wrappers over the Linux system calls hotloop makes.
//!
//! Every `unsafe` block in the crate outside `driver/` and `buf/` lives
//! here, in a file by topic: `poll.rs` (epoll, eventfd, timerfd),
//! `socket.rs`, `file.rs` (`sendfile`, pipes, `flock`), `unix.rs` (datagram calls on a borrowed
//! descriptor, `SO_PEERCRED`), `process.rs` (CPU pinning, limits, descriptor counts,
//! memory), `signal.rs` (the handler).
//! Each wrapper turns the C convention (-1 and `errno`) into `io::Result`, so
//! the layers above never touch a raw return value.

use std::io;

mod file;
mod poll;
mod process;
mod signal;
mod socket;
mod unix;

pub(crate) use file::*;
pub(crate) use poll::*;
pub(crate) use process::{
    advise_huge_pages, effective_uid, nofile_soft_limit, pidfd_open, pin_to_cpu,
};
pub use process::{open_fd_count, raise_nofile_limit, release_free_memory};
pub(crate) use signal::*;
pub(crate) use socket::*;
pub(crate) use unix::{peer_cred, with_unix_datagram};

/// Converts a C return value into `io::Result`, reading `errno` on -1.
pub(crate) fn cvt<T: PartialOrd + Default>(ret: T) -> io::Result<T> {
    if ret < T::default() {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock `Instant` reads on Linux,
/// here without `Instant`'s arithmetic, through the vDSO (no system call).
/// Its intervals never exceed `Instant`'s (were `Instant` ever to read
/// `CLOCK_BOOTTIME`, that clock only runs further, across a suspend).
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable `timespec` for the call's duration;
    // `CLOCK_MONOTONIC` exists on every Linux, so the call cannot fail and
    // `ts` is always written.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    // Both fields are non-negative for this clock.
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}
