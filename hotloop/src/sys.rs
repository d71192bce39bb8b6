//! Thin, checked wrappers over the Linux system calls hotloop makes.
//!
//! Every `unsafe` block in the crate outside `driver/` and `buf.rs` lives here.
//! Each wrapper turns the C convention (-1 and `errno`) into `io::Result`, so
//! the layers above never touch a raw return value.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering};

/// Converts a C return value into `io::Result`, reading `errno` on -1.
fn cvt<T: PartialOrd + Default>(ret: T) -> io::Result<T> {
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
/// (an absolute time: [`monotonic_ns`]'s clock). Re-arming replaces the
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

/// Reads into `len` bytes at `ptr`.
///
/// # Safety
/// `ptr..ptr+len` must be valid for writes for the duration of the call.
pub(crate) unsafe fn recv(fd: RawFd, ptr: *mut u8, len: usize) -> io::Result<usize> {
    // SAFETY: the caller guarantees the buffer; the address arguments are null.
    let n = cvt(unsafe { raw_recvfrom(fd, ptr, len, 0) })?;
    Ok(n as usize)
}

/// Reads into `len` bytes at `ptr` without blocking, even on a blocking socket.
///
/// # Safety
/// `ptr..ptr+len` must be valid for writes for the duration of the call.
pub(crate) unsafe fn recv_nowait(fd: RawFd, ptr: *mut u8, len: usize) -> io::Result<usize> {
    // SAFETY: the caller guarantees the buffer; the address arguments are null.
    let n = cvt(unsafe { raw_recvfrom(fd, ptr, len, libc::MSG_DONTWAIT) })?;
    Ok(n as usize)
}

/// Sends `len` bytes at `ptr`, never raising `SIGPIPE`.
///
/// # Safety
/// `ptr..ptr+len` must be valid for reads for the duration of the call.
pub(crate) unsafe fn send(fd: RawFd, ptr: *const u8, len: usize) -> io::Result<usize> {
    // SAFETY: the caller guarantees the buffer; the address arguments are
    // null. MSG_NOSIGNAL turns a write to a closed peer into EPIPE instead
    // of a signal.
    let n = cvt(unsafe {
        libc::syscall(
            libc::SYS_sendto,
            fd as libc::c_long,
            ptr,
            len,
            libc::MSG_NOSIGNAL as libc::c_long,
            std::ptr::null::<libc::sockaddr>(),
            0 as libc::c_long,
        )
    })?;
    Ok(n as usize)
}

/// `recvfrom(2)` without a source address, made with `syscall(2)` rather
/// than libc's `recv`: libc's wrappers are thread cancellation points, and
/// in a threaded process each call switches asynchronous cancellation on
/// and off around the system call (about 60 instructions per request on
/// the keep-alive path). hotloop never cancels threads.
///
/// # Safety
/// `ptr..ptr+len` must be valid for writes for the duration of the call.
#[inline]
unsafe fn raw_recvfrom(fd: RawFd, ptr: *mut u8, len: usize, flags: i32) -> libc::c_long {
    // SAFETY: the caller guarantees the buffer; null address and length
    // pointers tell the kernel not to report the source address.
    unsafe {
        libc::syscall(
            libc::SYS_recvfrom,
            fd as libc::c_long,
            ptr,
            len,
            flags as libc::c_long,
            std::ptr::null_mut::<libc::sockaddr>(),
            std::ptr::null_mut::<libc::socklen_t>(),
        )
    }
}

/// Sends the buffers described by `iov` in one call, never raising `SIGPIPE`.
///
/// # Safety
/// Every `iovec` must describe memory valid for reads for the duration of the call.
pub(crate) unsafe fn sendmsg(fd: RawFd, iov: &[libc::iovec]) -> io::Result<usize> {
    // SAFETY: a zeroed msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len();
    // SAFETY: `msg` points at `iov`, which the caller guarantees; both outlive the call.
    let n = cvt(unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) })?;
    Ok(n as usize)
}

/// Accepts one connection as a non-blocking, close-on-exec socket.
///
/// The peer address is not asked for: io_uring's multishot accept cannot
/// return it either, so both drivers look it up only when asked.
pub(crate) fn accept(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: null address pointers are allowed and mean "don't report the
    // peer". Made with syscall(2): libc's wrapper is a cancellation point
    // (see `raw_recvfrom`).
    let conn = cvt(unsafe {
        libc::syscall(
            libc::SYS_accept4,
            fd as libc::c_long,
            std::ptr::null_mut::<libc::sockaddr>(),
            std::ptr::null_mut::<libc::socklen_t>(),
            (libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) as libc::c_long,
        )
    })?;
    // SAFETY: `conn` is a new fd from the kernel; we own it.
    Ok(unsafe { OwnedFd::from_raw_fd(conn as RawFd) })
}

/// Closes `fd` with syscall(2) rather than libc's `close`, a cancellation
/// point (see `raw_recvfrom`). Errors are ignored, as `OwnedFd`'s drop
/// does: the descriptor is released whatever close(2) returns on Linux.
pub(crate) fn close(fd: OwnedFd) {
    let fd = fd.into_raw_fd();
    // SAFETY: `fd` came out of an `OwnedFd`, so this is its only owner and
    // nothing uses the number after this call.
    unsafe { libc::syscall(libc::SYS_close, fd as libc::c_long) };
}

/// Creates a non-blocking, close-on-exec UDP socket for `addr`'s family.
pub(crate) fn udp_socket(addr: &SocketAddr) -> io::Result<OwnedFd> {
    let family = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: socket(2) takes no pointers; a non-negative return is a new fd we own.
    let fd = cvt(unsafe {
        libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0)
    })?;
    // SAFETY: `fd` was just returned by the kernel and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sets or clears `O_NONBLOCK`.
pub(crate) fn set_nonblocking(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl(2) with F_GETFL takes no pointers.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    let flags = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
    // SAFETY: fcntl(2) with F_SETFL takes an int.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) })?;
    Ok(())
}

/// Receives one message as `msg` describes; returns the bytes received.
///
/// # Safety
/// Every pointer in `msg` (name, iovecs, control) must be valid for writes
/// of the lengths it gives, for the duration of the call.
pub(crate) unsafe fn recvmsg(fd: RawFd, msg: &mut libc::msghdr, flags: i32) -> io::Result<usize> {
    // SAFETY: the caller guarantees the header's pointers.
    let n = cvt(unsafe { libc::recvmsg(fd, msg, flags) })?;
    Ok(n as usize)
}

/// Receives up to `msgs.len()` messages; returns how many arrived.
///
/// # Safety
/// As [`recvmsg`], for every header in `msgs`.
pub(crate) unsafe fn recvmmsg(
    fd: RawFd,
    msgs: &mut [libc::mmsghdr],
    flags: i32,
) -> io::Result<usize> {
    let len = msgs.len().min(u32::MAX as usize) as libc::c_uint;
    // SAFETY: the caller guarantees the headers' pointers; no timeout is passed.
    let n =
        cvt(unsafe { libc::recvmmsg(fd, msgs.as_mut_ptr(), len, flags, std::ptr::null_mut()) })?;
    Ok(n as usize)
}

/// Sends one message as `msg` describes, never raising `SIGPIPE`; returns the bytes sent.
///
/// # Safety
/// Every pointer in `msg` (name, iovecs, control) must be valid for reads
/// of the lengths it gives, for the duration of the call.
pub(crate) unsafe fn sendmsg_hdr(fd: RawFd, msg: &libc::msghdr, flags: i32) -> io::Result<usize> {
    // SAFETY: the caller guarantees the header's pointers.
    let n = cvt(unsafe { libc::sendmsg(fd, msg, flags | libc::MSG_NOSIGNAL) })?;
    Ok(n as usize)
}

/// Sends up to `msgs.len()` messages; returns how many the kernel took.
///
/// # Safety
/// As [`sendmsg_hdr`], for every header in `msgs`.
pub(crate) unsafe fn sendmmsg(
    fd: RawFd,
    msgs: &mut [libc::mmsghdr],
    flags: i32,
) -> io::Result<usize> {
    let len = msgs.len().min(u32::MAX as usize) as libc::c_uint;
    // SAFETY: the caller guarantees the headers' pointers.
    let n = cvt(unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), len, flags | libc::MSG_NOSIGNAL) })?;
    Ok(n as usize)
}

/// Sets an integer socket option.
pub(crate) fn setsockopt_int(fd: RawFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: passes a pointer to a live i32 and its exact size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const i32).cast(),
            size_of::<i32>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// Reads an integer socket option.
pub(crate) fn getsockopt_int(fd: RawFd, level: i32, name: i32) -> io::Result<i32> {
    let mut value: i32 = 0;
    let mut len = size_of::<i32>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into the live i32.
    cvt(unsafe { libc::getsockopt(fd, level, name, (&mut value as *mut i32).cast(), &mut len) })?;
    Ok(value)
}

/// Shuts down one or both halves of a connection.
pub(crate) fn shutdown(fd: RawFd, how: std::net::Shutdown) -> io::Result<()> {
    let how = match how {
        std::net::Shutdown::Read => libc::SHUT_RD,
        std::net::Shutdown::Write => libc::SHUT_WR,
        std::net::Shutdown::Both => libc::SHUT_RDWR,
    };
    // SAFETY: shutdown(2) takes no pointers.
    cvt(unsafe { libc::shutdown(fd, how) })?;
    Ok(())
}

/// The local address of a socket.
pub(crate) fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    sockname(fd, libc::getsockname)
}

/// The peer address of a connected socket.
pub(crate) fn peer_addr(fd: RawFd) -> io::Result<SocketAddr> {
    sockname(fd, libc::getpeername)
}

/// The local address of a Unix domain socket, in std's form.
pub(crate) fn unix_local_addr(
    fd: std::os::fd::BorrowedFd<'_>,
) -> io::Result<std::os::unix::net::SocketAddr> {
    with_unix_stream(fd, |s| s.local_addr())
}

/// The peer address of a connected Unix domain socket, in std's form.
pub(crate) fn unix_peer_addr(
    fd: std::os::fd::BorrowedFd<'_>,
) -> io::Result<std::os::unix::net::SocketAddr> {
    with_unix_stream(fd, |s| s.peer_addr())
}

/// Calls `f` with `fd` seen as a std `UnixStream` that never closes it, so
/// std's address decoding (the only way to build its `SocketAddr`, unnamed
/// ones included) works on a descriptor someone else owns.
fn with_unix_stream<R>(
    fd: std::os::fd::BorrowedFd<'_>,
    f: impl FnOnce(&std::os::unix::net::UnixStream) -> R,
) -> R {
    use std::os::fd::AsRawFd;
    // SAFETY: `fd` is open for the whole call (it is borrowed across it);
    // the stream is only lent to `f` by reference, so it cannot escape, and
    // `ManuallyDrop` means it never closes the descriptor, whose ownership
    // stays with the lender.
    let stream = std::mem::ManuallyDrop::new(unsafe {
        std::os::unix::net::UnixStream::from_raw_fd(fd.as_raw_fd())
    });
    f(&stream)
}

type SocknameFn =
    unsafe extern "C" fn(libc::c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> libc::c_int;

fn sockname(fd: RawFd, f: SocknameFn) -> io::Result<SocketAddr> {
    let mut storage = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `storage` has room for any address and `len` says how much.
    cvt(unsafe { f(fd, storage.as_mut_ptr().cast(), &mut len) })?;
    // SAFETY: zero-initialised and then written by the kernel.
    sockaddr_to_std(unsafe { storage.assume_init_ref() })
}

/// Converts a kernel socket address into a `SocketAddr`.
pub(crate) fn sockaddr_to_std(storage: &libc::sockaddr_storage) -> io::Result<SocketAddr> {
    match storage.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in, which fits inside it.
            let a =
                unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Ok(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6, which fits inside it.
            let a = unsafe {
                &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Ok(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "unsupported address family")),
    }
}

/// Converts a `SocketAddr` into kernel form and its length.
pub(crate) fn std_to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_in fits inside sockaddr_storage, which is suitably aligned for it.
            let sin = unsafe {
                &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_in6 fits inside sockaddr_storage, which is suitably aligned for it.
            let sin6 = unsafe {
                &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// Pins the calling thread to one CPU.
pub(crate) fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain old data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes one bit inside `set`; `cpu` is reduced modulo the set's size.
    unsafe { libc::CPU_SET(cpu % (8 * size_of::<libc::cpu_set_t>()), &mut set) };
    // SAFETY: passes a live cpu_set_t and its exact size; pid 0 means the calling thread.
    cvt(unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) })?;
    Ok(())
}

/// Raises the soft open-file limit to the hard limit; returns the limit now in force.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the live struct.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) })?;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit reads one live rlimit.
        cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) })?;
    }
    Ok(lim.rlim_cur)
}

/// The number of descriptors this process has open (entries of `/proc/self/fd`).
pub fn open_fd_count() -> io::Result<usize> {
    // read_dir itself holds one descriptor while counting; subtract it.
    Ok(std::fs::read_dir("/proc/self/fd")?.count().saturating_sub(1))
}

/// Gives the free memory the C allocator keeps back to the kernel (glibc's
/// `malloc_trim(0)`, which also releases free pages inside its heaps);
/// returns whether any was released. glibc keeps what a burst of
/// connections freed for reuse, so a server's resident size stays at its
/// peak until this is called; it takes each arena's lock while it walks the
/// arena's free chunks (milliseconds for a heap of tens of MB), so call it
/// from a thread with no latency to keep, after many connections ended.
/// Without glibc, nothing.
pub fn release_free_memory() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim(3) takes no pointers; it works on the
        // allocator's own state under the allocator's locks, and moves no
        // live allocation.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}

/// Asks the kernel to back `len` bytes at `addr` (page-aligned, inside a
/// live allocation of the caller) with transparent huge pages. A hint: a
/// kernel that declines changes nothing.
pub(crate) fn advise_huge_pages(addr: usize, len: usize) {
    // SAFETY: the caller's range lies inside one of its live allocations;
    // `MADV_HUGEPAGE` only changes how the kernel backs those pages, never
    // their contents, and frees or moves nothing.
    unsafe {
        libc::madvise(addr as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
    }
}

// Signals. The handler and the state it touches live here because the
// handler is the one piece of code that runs inside a signal: it may only
// use lock-free atomics and `write(2)` (signal-safety(7)). `signal.rs`
// builds everything else on these four functions, in safe code.

/// Signal numbers the handler has room for: Linux's `_NSIG` is 65 (1..=64).
pub(crate) const SIGNAL_SLOTS: usize = 65;

/// Deliveries per signal number, counted by the handler.
static SIGNAL_COUNTS: [AtomicUsize; SIGNAL_SLOTS] = [const { AtomicUsize::new(0) }; SIGNAL_SLOTS];

/// The write end of the self-pipe the handler writes one byte to; -1 until
/// [`signal_set_pipe`] sets it.
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);

/// The handler that was installed before ours, so ours can call it too.
/// `SIG_DFL` (0) and `SIG_IGN` (1) are never called.
struct PreviousHandler {
    /// Its address, as `sa_sigaction` holds it.
    action: usize,
    /// Its flags: `SA_SIGINFO` says which signature it has.
    flags: libc::c_int,
}

/// Per signal, the handler ours chains to, or null. One pointer to an
/// immutable pair, never two values: a signal that lands between two
/// stores must not pair one handler's address with another's flags and
/// call it through the wrong signature. A replaced pair is leaked, since
/// a handler running on another thread may still be reading it (a few
/// words per install, and installs happen once per signal).
static SIGNAL_PREVIOUS: [AtomicPtr<PreviousHandler>; SIGNAL_SLOTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; SIGNAL_SLOTS];

/// Records the handler `old` as the one `slot`'s handler chains to.
fn signal_set_previous(slot: usize, old: &libc::sigaction) {
    let pair =
        Box::into_raw(Box::new(PreviousHandler { action: old.sa_sigaction, flags: old.sa_flags }));
    // The pair replaced is leaked on purpose (see `SIGNAL_PREVIOUS`).
    SIGNAL_PREVIOUS[slot].store(pair, Ordering::SeqCst);
}

/// How many times `sig` has arrived since its handler was installed (it
/// wraps; only changes matter).
pub(crate) fn signal_deliveries(sig: libc::c_int) -> usize {
    usize::try_from(sig)
        .ok()
        .and_then(|i| SIGNAL_COUNTS.get(i))
        .map_or(0, |count| count.load(Ordering::SeqCst))
}

/// Creates the self-pipe: `(read end, write end)`, both close-on-exec, the
/// write end non-blocking (a handler must never block; a full pipe already
/// holds a wake-up) and the read end blocking.
pub(crate) fn signal_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds: [libc::c_int; 2] = [-1, -1];
    // SAFETY: pipe2(2) writes two ints into `fds`, which has room for them.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both fds were just returned by the kernel and nothing else owns them.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    set_nonblocking(write.as_raw_fd(), true)?;
    Ok((read, write))
}

/// Makes `write` the pipe the handler writes to, for the rest of the
/// process: a handler may run at any moment, so the descriptor is never
/// closed (one per process).
pub(crate) fn signal_set_pipe(write: OwnedFd) {
    let fd = write.into_raw_fd();
    let old = SIGNAL_PIPE.swap(fd, Ordering::SeqCst);
    debug_assert_eq!(old, -1, "the signal pipe is set once per process");
}

/// Installs hotloop's handler for `sig` (`SA_RESTART`, so system calls the
/// signal interrupts restart instead of failing with `EINTR`). A handler
/// that was there before (not `SIG_DFL` or `SIG_IGN`) keeps running: ours
/// calls it after counting. Call once per signal; the caller keeps track.
pub(crate) fn signal_install(sig: libc::c_int) -> io::Result<()> {
    let Some(slot) = usize::try_from(sig).ok().filter(|&i| i > 0 && i < SIGNAL_SLOTS) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no signal numbered {sig}"),
        ));
    };
    // SAFETY: sigaction is plain old data; all-zero is a valid value (SIG_DFL, no flags).
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only reads the current one into `old`, which lives across the call.
    cvt(unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) })?;
    // Recorded before ours is installed, so a signal that lands right after
    // the install already finds the handler to chain to.
    signal_set_previous(slot, &old);

    // SAFETY: as above, all-zero is a valid sigaction; every field used is set below.
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = on_signal;
    new.sa_sigaction = handler as usize;
    new.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    // SAFETY: sigemptyset initialises the live mask: nothing else is blocked while the handler runs.
    unsafe { libc::sigemptyset(&mut new.sa_mask) };
    // SAFETY: `new` is a valid action whose handler is async-signal-safe (see `on_signal`); `old` is live.
    cvt(unsafe { libc::sigaction(sig, &new, &mut old) })?;
    // Someone may have changed it between the two calls: chain to what was really replaced.
    signal_set_previous(slot, &old);
    Ok(())
}

/// The signal handler: counts the delivery, writes one byte to the
/// self-pipe, and calls the handler that was installed before. Only
/// lock-free atomics and `write(2)`, both async-signal-safe; `errno` is
/// saved and restored, because the interrupted code may be about to read it.
extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: __errno_location returns this thread's errno, valid for the thread's life.
    let errno = unsafe { *libc::__errno_location() };
    let slot = usize::try_from(sig).ok().filter(|&i| i < SIGNAL_SLOTS);
    if let Some(slot) = slot {
        SIGNAL_COUNTS[slot].fetch_add(1, Ordering::SeqCst);
    }
    let fd = SIGNAL_PIPE.load(Ordering::SeqCst);
    if fd >= 0 {
        let byte = sig as u8;
        // SAFETY: writes one byte from a live local. The pipe is non-blocking and
        // never closed; EAGAIN (pipe full) means a wake-up is already waiting.
        unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
    }
    let pair = slot.map_or(std::ptr::null_mut(), |i| SIGNAL_PREVIOUS[i].load(Ordering::SeqCst));
    // SAFETY: a non-null pointer here came from `Box::into_raw` in
    // `signal_set_previous`, is never freed, and the pair is never written after.
    if let Some(previous) = unsafe { pair.as_ref() } {
        let action = previous.action;
        if action != libc::SIG_DFL && action != libc::SIG_IGN {
            if previous.flags & libc::SA_SIGINFO != 0 {
                // SAFETY: sigaction(2) returned this address, with these flags, as an
                // SA_SIGINFO handler of this signal, so it has this signature and stays valid.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(action) };
                f(sig, info, context);
            } else {
                // SAFETY: sigaction(2) returned this address, with these flags, as a plain
                // handler of this signal.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(action) };
                f(sig);
            }
        }
    }
    // SAFETY: as above; restores the interrupted code's errno.
    unsafe { *libc::__errno_location() = errno };
}
