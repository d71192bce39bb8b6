//! Socket calls: receive and send (through `syscall(2)` where libc's
//! wrappers would be cancellation points), accept, close, options and
//! address conversion.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd, RawFd};

use super::cvt;

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

/// Sends `len` bytes at `ptr` without blocking, even on a blocking socket,
/// never raising `SIGPIPE`: `WouldBlock` when the socket has no room.
///
/// # Safety
/// `ptr..ptr+len` must be valid for reads for the duration of the call.
pub(crate) unsafe fn send_nowait(fd: RawFd, ptr: *const u8, len: usize) -> io::Result<usize> {
    // SAFETY: the caller guarantees the buffer. MSG_DONTWAIT makes this
    // one call non-blocking.
    let n = cvt(unsafe { raw_send(fd, ptr, len, libc::MSG_DONTWAIT) })?;
    Ok(n as usize)
}

/// Sends `len` bytes at `ptr`, never raising `SIGPIPE`.
///
/// # Safety
/// `ptr..ptr+len` must be valid for reads for the duration of the call.
pub(crate) unsafe fn send(fd: RawFd, ptr: *const u8, len: usize) -> io::Result<usize> {
    // SAFETY: the caller guarantees the buffer.
    let n = cvt(unsafe { raw_send(fd, ptr, len, 0) })?;
    Ok(n as usize)
}

/// `sendto(2)` with no address and `MSG_NOSIGNAL` added to `flags`, through
/// `syscall(2)`: a write to a closed peer is `EPIPE`, never a signal.
///
/// # Safety
/// `ptr..ptr+len` must be valid for reads for the duration of the call.
unsafe fn raw_send(fd: RawFd, ptr: *const u8, len: usize, flags: i32) -> libc::c_long {
    // SAFETY: the caller guarantees the buffer; the address arguments are null.
    unsafe {
        libc::syscall(
            libc::SYS_sendto,
            fd as libc::c_long,
            ptr,
            len,
            (libc::MSG_NOSIGNAL | flags) as libc::c_long,
            std::ptr::null::<libc::sockaddr>(),
            0 as libc::c_long,
        )
    }
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
    // SAFETY: the caller guarantees the buffers.
    unsafe { sendmsg_flags(fd, iov.as_ptr(), iov.len(), 0) }
}

/// `sendmsg(2)` of `count` buffers at `iov`, no address, no control data,
/// `MSG_NOSIGNAL` added to `flags`.
///
/// # Safety
/// `iov` must point at `count` `iovec`s, each describing memory valid for
/// reads for the duration of the call.
unsafe fn sendmsg_flags(
    fd: RawFd,
    iov: *const libc::iovec,
    count: usize,
    flags: i32,
) -> io::Result<usize> {
    // SAFETY: a zeroed msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov as *mut libc::iovec;
    msg.msg_iovlen = count;
    // SAFETY: `msg` points at the caller's buffers, which outlive the call.
    let n = cvt(unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | flags) })?;
    Ok(n as usize)
}

/// Sends `bufs` in order in one call without blocking, even on a blocking
/// socket, never raising `SIGPIPE`: `WouldBlock` when the socket has no
/// room. At most `IOV_MAX` (1024) buffers are offered; the count says how
/// many bytes went.
pub(crate) fn send_vectored_nowait(fd: RawFd, bufs: &[std::io::IoSlice<'_>]) -> io::Result<usize> {
    let bufs = &bufs[..bufs.len().min(1024)];
    // SAFETY: `IoSlice` is ABI-compatible with `iovec` on Unix (its
    // documented guarantee), and the slices are borrowed for the call.
    unsafe { sendmsg_flags(fd, bufs.as_ptr().cast(), bufs.len(), libc::MSG_DONTWAIT) }
}

/// Accepts one connection as a non-blocking, close-on-exec socket.
///
/// The peer address is not asked for: io_uring's multishot accept cannot
/// return it either, so both drivers look it up only when asked.
pub(crate) fn accept(fd: RawFd) -> io::Result<OwnedFd> {
    accept4(fd, libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
}

/// Accepts one connection as a blocking, close-on-exec socket: what
/// io_uring's own accept makes, for a driver whose operations wait in the
/// kernel rather than fail with `EAGAIN`.
pub(crate) fn accept_blocking(fd: RawFd) -> io::Result<OwnedFd> {
    accept4(fd, libc::SOCK_CLOEXEC)
}

fn accept4(fd: RawFd, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: null address pointers are allowed and mean "don't report the
    // peer". Made with syscall(2): libc's wrapper is a cancellation point
    // (see `raw_recvfrom`).
    let conn = cvt(unsafe {
        libc::syscall(
            libc::SYS_accept4,
            fd as libc::c_long,
            std::ptr::null_mut::<libc::sockaddr>(),
            std::ptr::null_mut::<libc::socklen_t>(),
            flags as libc::c_long,
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

/// `SO_LINGER`'s value for `linger`, as `setsockopt(2)` takes it: `None`
/// off, else on with the time in whole seconds (the kernel keeps no less).
pub(crate) fn linger(linger: Option<std::time::Duration>) -> libc::linger {
    libc::linger {
        l_onoff: i32::from(linger.is_some()),
        l_linger: linger.map_or(0, |d| d.as_secs().min(i32::MAX as u64) as i32),
    }
}

/// `SO_ATTACH_REUSEPORT_CBPF`, the asm-generic value (x86-64, arm64 and
/// most others; libc names it for Android only).
#[cfg(feature = "quic")]
const SO_ATTACH_REUSEPORT_CBPF: i32 = 51;

/// Attaches the classic BPF program `filter` to the `SO_REUSEPORT` group of
/// `fd` (`SO_ATTACH_REUSEPORT_CBPF`): for each datagram, the kernel runs it
/// on the UDP payload and takes its result as the index of the group's
/// socket that gets it (one out of range: the usual hash of the addresses).
#[cfg(feature = "quic")]
pub(crate) fn attach_reuseport_cbpf(fd: RawFd, filter: &[libc::sock_filter]) -> io::Result<()> {
    let len = u16::try_from(filter.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "BPF program too long"))?;
    let prog = libc::sock_fprog { len, filter: filter.as_ptr().cast_mut() };
    // SAFETY: passes a pointer to a live `sock_fprog` and its exact size; the
    // program it points at lives for the call, and the kernel copies it.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            (&prog as *const libc::sock_fprog).cast(),
            size_of::<libc::sock_fprog>() as libc::socklen_t,
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

/// True if a connected socket's peer is on this host as far as its
/// addresses tell: a loopback address, or the socket's own address (a
/// connection to one of the host's addresses goes through loopback). A
/// socket whose addresses cannot be read (not an internet socket) is not.
pub(crate) fn peer_is_local(fd: RawFd) -> bool {
    let (Ok(peer), Ok(local)) = (peer_addr(fd), local_addr(fd)) else { return false };
    let peer = canonical_ip(peer.ip());
    peer.is_loopback() || peer == canonical_ip(local.ip())
}

/// `ip`, with an IPv4-mapped IPv6 address as its IPv4 address.
fn canonical_ip(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
        v4 => v4,
    }
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

/// The most descriptors [`send_with_fds`] attaches to one message and
/// [`recv_with_fds`] takes from one (the kernel's own bound is 253).
pub(crate) const FDS_PER_MESSAGE_MAX: usize = 64;

/// Control space for `n` descriptors, in `u64`s so that the `cmsghdr` at
/// its start is aligned.
fn fd_control_space(n: usize) -> Vec<u64> {
    // SAFETY: CMSG_SPACE only computes a length.
    let bytes = unsafe { libc::CMSG_SPACE((n * size_of::<RawFd>()) as u32) } as usize;
    vec![0u64; bytes.div_ceil(size_of::<u64>())]
}

/// Sends `bytes` as one message on a connected Unix socket, with `fds`
/// attached (`SCM_RIGHTS`: the receiver gets its own descriptors for the
/// same open files); never raises `SIGPIPE`. At most
/// [`FDS_PER_MESSAGE_MAX`] descriptors.
pub(crate) fn send_with_fds(fd: RawFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    if fds.len() > FDS_PER_MESSAGE_MAX {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many descriptors"));
    }
    let mut iov =
        libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    let mut control = fd_control_space(fds.len());
    // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = control.len() * size_of::<u64>();
        // SAFETY: `msg` names a control buffer of `msg_controllen` bytes,
        // aligned for `cmsghdr` and large enough for one header and
        // `fds.len()` descriptors (CMSG_SPACE above), so the first header
        // and its data lie inside it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                std::mem::size_of_val(fds),
            );
        }
    }
    loop {
        // SAFETY: every pointer in `msg` (the iovec over `bytes`, the control
        // buffer) is live and valid for reads of its length for the call.
        match unsafe { sendmsg_hdr(fd, &msg, 0) } {
            // Interrupted before it sent anything (a message goes whole or
            // not at all): again. A socket with a send timeout reports an
            // interruption as `EINTR` even where the call would restart.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Receives one message into `buf` on a connected Unix socket, with the
/// descriptors attached to it (up to [`FDS_PER_MESSAGE_MAX`], each
/// close-on-exec). A message that carried more than that is an error,
/// and the descriptors that did arrive are closed. A wait interrupted by a
/// signal (or by task work the kernel runs on the thread, as io_uring's)
/// waits again: a socket with a receive timeout, as the hand-over's, sees
/// `EINTR` there even where the call would otherwise restart.
pub(crate) fn recv_with_fds(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    loop {
        match recv_with_fds_once(fd, buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

fn recv_with_fds_once(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut control = fd_control_space(FDS_PER_MESSAGE_MAX);
    // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len() * size_of::<u64>();
    // SAFETY: the iovec covers `buf` and the control buffer is live and
    // writable for the lengths `msg` gives.
    let n = unsafe { recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) }?;
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg_controllen` bytes of the control
    // buffer with well-formed headers; CMSG_FIRSTHDR/NXTHDR stay inside
    // them, and an SCM_RIGHTS header's data is `cmsg_len - CMSG_LEN(0)`
    // bytes of descriptors, new in this process and owned by nobody else.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / size_of::<RawFd>() {
                    let raw = std::ptr::read_unaligned(data.add(i * size_of::<RawFd>()).cast());
                    fds.push(OwnedFd::from_raw_fd(raw));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        // Dropping `fds` closes what did arrive.
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a message carried more descriptors than one message may",
        ));
    }
    Ok((n, fds))
}

/// Waits up to `timeout_ms` milliseconds for `fd` to be readable (or
/// hung up); true if it is.
pub(crate) fn wait_readable(fd: RawFd, timeout_ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one live pollfd, and its count.
    match cvt(unsafe { libc::poll(&mut pfd, 1, timeout_ms) }) {
        Ok(n) => Ok(n > 0),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
        Err(e) => Err(e),
    }
}

/// Takes ownership of descriptor `raw`, which this process inherited
/// from whoever started it (systemd's `LISTEN_FDS` start at 3), marking
/// it close-on-exec so a child does not inherit it in turn. Fails with
/// `EBADF` if nothing is open there.
pub(crate) fn adopt_inherited_fd(raw: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl(2) with F_GETFD takes no pointers; it fails on a
    // number that is not an open descriptor.
    let flags = cvt(unsafe { libc::fcntl(raw, libc::F_GETFD) })?;
    // SAFETY: as above, F_SETFD takes an int.
    cvt(unsafe { libc::fcntl(raw, libc::F_SETFD, flags | libc::FD_CLOEXEC) })?;
    // SAFETY: `raw` is open (F_GETFD succeeded) and was handed to this
    // process to own; the caller takes it once (see `net/handover.rs`).
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// True if the peer of a connected TCP socket has ended its side (its FIN
/// came: `TCP_INFO`'s state is past `ESTABLISHED` on the receiving side),
/// whether or not bytes before it are still unread.
#[cfg(feature = "hyper")]
pub(crate) fn peer_ended(fd: RawFd) -> io::Result<bool> {
    // `tcpi_state` is the first byte of `struct tcp_info`; the kernel
    // copies no more than the length it is given.
    let mut info = [0u8; 8];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: `info` is `len` live bytes, and `len` a live socklen_t.
    cvt(unsafe {
        libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, info.as_mut_ptr().cast(), &mut len)
    })?;
    const TIME_WAIT: u8 = 6;
    const CLOSE: u8 = 7;
    const CLOSE_WAIT: u8 = 8;
    const LAST_ACK: u8 = 9;
    const CLOSING: u8 = 11;
    Ok(len >= 1 && matches!(info[0], TIME_WAIT | CLOSE | CLOSE_WAIT | LAST_ACK | CLOSING))
}

/// The bytes of a TCP connection its peer has acknowledged
/// (`tcpi_bytes_acked` of `TCP_INFO`, Linux 4.1+): how far a send has got
/// as the peer sees it, however the bytes were handed to the kernel.
pub(crate) fn tcp_bytes_acked(fd: RawFd) -> io::Result<u64> {
    // `tcpi_bytes_acked` is the `u64` at byte 120 of `struct tcp_info`
    // (after the 2.6 fields and the two pacing rates).
    let mut acked = [0u8; 8];
    tcp_info_field(fd, 120, &mut acked, "tcpi_bytes_acked")?;
    Ok(u64::from_ne_bytes(acked))
}

/// How long ago the last segment carrying data from the peer of a TCP
/// connection arrived (`tcpi_last_data_recv` of `TCP_INFO`), as the
/// kernel counts it: in whole milliseconds, from its tick (1 to 10 ms).
/// Bytes the kernel has already handed on (to an io_uring buffer ring,
/// say) count, as well as bytes still in the socket.
pub(crate) fn tcp_since_data_received(fd: RawFd) -> io::Result<std::time::Duration> {
    // `tcpi_last_data_recv` is the `u32` at byte 52 of `struct tcp_info`:
    // after its eight one-byte fields, nine `u32`s (from `tcpi_rto` to
    // `tcpi_fackets`), `tcpi_last_data_sent` and `tcpi_last_ack_sent`.
    let mut ms = [0u8; 4];
    tcp_info_field(fd, 52, &mut ms, "tcpi_last_data_recv")?;
    Ok(std::time::Duration::from_millis(u64::from(u32::from_ne_bytes(ms))))
}

/// How long ago the last acknowledgement from the peer of a TCP connection
/// arrived (`tcpi_last_ack_recv` of `TCP_INFO`), as the kernel counts it:
/// in whole milliseconds, from its tick (1 to 10 ms). Every segment the
/// peer sends carries one: those that acknowledge this side's data, and
/// the window updates its reads send once its receive buffer was full.
pub(crate) fn tcp_since_ack_received(fd: RawFd) -> io::Result<std::time::Duration> {
    // `tcpi_last_ack_recv` is the `u32` after `tcpi_last_data_recv` (byte 56).
    let mut ms = [0u8; 4];
    tcp_info_field(fd, 56, &mut ms, "tcpi_last_ack_recv")?;
    Ok(std::time::Duration::from_millis(u64::from(u32::from_ne_bytes(ms))))
}

/// The bytes written to a connected TCP socket that its peer has not
/// acknowledged yet, sent or still queued (`ioctl(SIOCOUTQ)`, which is
/// `TIOCOUTQ` on Linux): 0 once everything written has reached the peer.
pub(crate) fn unacknowledged_output(fd: RawFd) -> io::Result<usize> {
    let mut queued: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one `int` through the pointer, which is live.
    cvt(unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued as *mut libc::c_int) })?;
    Ok(usize::try_from(queued).unwrap_or(0))
}

/// Copies the bytes of `TCP_INFO` from `at` into `out`; `Unsupported`
/// (naming the field, `what`) if the kernel's `struct tcp_info` ends
/// before them.
fn tcp_info_field(fd: RawFd, at: usize, out: &mut [u8], what: &str) -> io::Result<()> {
    // The kernel copies no more than the length it is given, and says
    // how much it did.
    let mut info = [0u8; 160];
    let end = at + out.len();
    let mut len = end.min(info.len()) as libc::socklen_t;
    // SAFETY: `info` is at least `len` live bytes, and `len` a live socklen_t.
    cvt(unsafe {
        libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, info.as_mut_ptr().cast(), &mut len)
    })?;
    if (len as usize) < end {
        return Err(io::Error::new(io::ErrorKind::Unsupported, format!("TCP_INFO without {what}")));
    }
    out.copy_from_slice(&info[at..end]);
    Ok(())
}

/// True if a connected socket has bytes nobody has read, or the peer's
/// end of stream, waiting in the kernel (a one-byte `MSG_PEEK`, which
/// takes nothing); false if a read would block.
pub(crate) fn input_pending(fd: RawFd) -> io::Result<bool> {
    let mut byte = 0u8;
    // SAFETY: the buffer is one live byte; the address arguments are null.
    match cvt(unsafe { raw_recvfrom(fd, &mut byte, 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) }) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
        Err(e) => Err(e),
    }
}
