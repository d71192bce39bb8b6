//! epoll, eventfd and timerfd: what the epoll driver and the wake-ups wait on.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use super::cvt;

/// Creates an epoll instance with close-on-exec set.
pub(crate) fn epoll_create() -> io::Result<OwnedFd> {
    // SAFETY: epoll_create1(2) takes no pointers; a non-negative return is a new fd we own.
    let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
    // SAFETY: `fd` was just returned by the kernel and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds `fd` to the interest list of `epfd`.
pub(crate) fn epoll_add(epfd: RawFd, fd: RawFd, events: u32, data: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: data };
    // SAFETY: `ev` is a valid epoll_event that lives across the call.
    cvt(unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) })?;
    Ok(())
}

/// Removes `fd` from the interest list of `epfd`: for a descriptor that
/// stays open (handed to another owner), which closing would not remove.
pub(crate) fn epoll_del(epfd: RawFd, fd: RawFd) -> io::Result<()> {
    // SAFETY: EPOLL_CTL_DEL ignores the event argument (null is allowed since Linux 2.6.9).
    cvt(unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) })?;
    Ok(())
}

/// Waits for events on `epfd`, filling `events`; returns how many arrived.
pub(crate) fn epoll_wait(
    epfd: RawFd,
    events: &mut [MaybeUninit<libc::epoll_event>],
    timeout_ms: i32,
) -> io::Result<usize> {
    let max = events.len().min(i32::MAX as usize) as i32;
    // SAFETY: the kernel writes at most `max` entries into `events`, which
    // has room for them. Made with syscall(2): libc's wrapper is a
    // cancellation point (see `raw_recvfrom`).
    let n = cvt(unsafe {
        libc::syscall(
            libc::SYS_epoll_wait,
            epfd as libc::c_long,
            events.as_mut_ptr(),
            max as libc::c_long,
            timeout_ms as libc::c_long,
        )
    })?;
    Ok(n as usize)
}

/// `EPIOCSPARAMS`: `_IOW(0x8A, 0x01, struct epoll_params)` (Linux 6.9).
const EPIOCSPARAMS: libc::c_ulong = 0x4008_8A01;

/// `struct epoll_params` from `<linux/eventpoll.h>`.
#[repr(C)]
struct EpollParams {
    busy_poll_usecs: u32,
    busy_poll_budget: u16,
    prefer_busy_poll: u8,
    pad: u8,
}

/// Asks the kernel to busy-poll NAPI queues inside `epoll_wait` on `epfd`.
pub(crate) fn epoll_set_busy_poll(epfd: RawFd, usecs: u32, budget: u16) -> io::Result<()> {
    let params = EpollParams {
        busy_poll_usecs: usecs,
        busy_poll_budget: budget,
        prefer_busy_poll: 1,
        pad: 0,
    };
    // SAFETY: EPIOCSPARAMS reads one `struct epoll_params`, which `params` is, for the call's duration.
    cvt(unsafe { libc::ioctl(epfd, EPIOCSPARAMS, &params as *const EpollParams) })?;
    Ok(())
}

/// Creates a non-blocking, close-on-exec eventfd.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd(2) takes no pointers; a non-negative return is a new fd we own.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
    // SAFETY: `fd` was just returned by the kernel and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Creates a non-blocking, close-on-exec timerfd on `CLOCK_MONOTONIC`.
pub(crate) fn timerfd() -> io::Result<OwnedFd> {
    // SAFETY: timerfd_create(2) takes no pointers; a non-negative return is a new fd we own.
    let fd = cvt(unsafe {
        libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC)
    })?;
    // SAFETY: `fd` was just returned by the kernel and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Arms a timerfd to expire once, at `deadline_ns` on `CLOCK_MONOTONIC`
/// (an absolute time: [`monotonic_ns`](super::monotonic_ns)'s clock). Re-arming replaces the
/// previous expiry and clears a count not yet read; a time already passed
/// expires at once.
pub(crate) fn timerfd_arm_at(fd: RawFd, deadline_ns: u64) -> io::Result<()> {
    // Zero would disarm; the clock's time zero is long past either way.
    let deadline_ns = deadline_ns.max(1);
    let spec = libc::itimerspec {
        it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
        it_value: libc::timespec {
            tv_sec: (deadline_ns / 1_000_000_000).min(i64::MAX as u64) as libc::time_t,
            tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
        },
    };
    // SAFETY: `spec` is a valid itimerspec that outlives the call; a null
    // old-value pointer is allowed.
    cvt(unsafe { libc::timerfd_settime(fd, libc::TFD_TIMER_ABSTIME, &spec, std::ptr::null_mut()) })
        .map(drop)
}

/// Adds one to an eventfd's counter, waking whoever polls it.
pub(crate) fn eventfd_signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64. EAGAIN (counter saturated) still leaves it readable, so the result is ignored.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Resets an eventfd's counter to zero.
pub(crate) fn eventfd_drain(fd: RawFd) {
    let mut value: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64. EAGAIN means it was already zero.
    unsafe { libc::read(fd, (&mut value as *mut u64).cast(), 8) };
}
