//! File calls made directly: `sendfile` on epoll, the pipe an io_uring
//! `splice` goes through, `openat2` for the blocking pool, and the `flock`
//! that gives processes opening one upgrade socket their turns.

use std::ffi::CStr;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use super::cvt;

/// The most bytes one `sendfile(2)` call moves (the kernel's own cap).
pub(crate) const SENDFILE_CHUNK_MAX: usize = 0x7fff_f000;

/// Sends up to `len` bytes of `file` from `offset` to the socket `sock`;
/// returns how many, 0 at the file's end. A non-blocking socket with no
/// room fails with `WouldBlock`.
///
/// A peer that has gone raises `SIGPIPE`, which Rust programs ignore by
/// default: the call then fails with `EPIPE`.
pub(crate) fn sendfile(sock: RawFd, file: RawFd, offset: u64, len: usize) -> io::Result<usize> {
    let mut off = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file offset too large"))?;
    let len = len.min(SENDFILE_CHUNK_MAX);
    // SAFETY: `off` is a valid, writable `off_t` for the call; the kernel
    // checks both descriptors and touches no other user memory.
    let n = cvt(unsafe { libc::sendfile(sock, file, &mut off, len) })?;
    Ok(n as usize)
}

/// A socket made non-blocking for as long as this guard lives, and given
/// back the file status flags it had when the guard is dropped.
///
/// `sendfile(2)` takes no `MSG_DONTWAIT`, so a send that must not block
/// on a blocking socket (io_uring's accepted ones are) needs the flag on
/// the descriptor. Setting it once for a whole file, rather than around
/// each call, saves two `fcntl(2)` calls per `sendfile`. Only for a socket
/// that nothing else uses meanwhile from another thread, which would see
/// it non-blocking; on the same thread, io_uring operations on a
/// non-blocking socket answer `EAGAIN` instead of waiting, which every
/// socket operation of the driver already handles.
pub(crate) struct NonBlockingFor {
    fd: RawFd,
    /// The flags to restore; `None` when the socket was non-blocking already.
    restore: Option<libc::c_int>,
}

impl NonBlockingFor {
    /// Makes `fd` non-blocking until the guard is dropped.
    pub(crate) fn set(fd: RawFd) -> io::Result<NonBlockingFor> {
        // SAFETY: F_GETFL takes no argument and touches no user memory.
        let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
        if flags & libc::O_NONBLOCK != 0 {
            return Ok(NonBlockingFor { fd, restore: None });
        }
        // SAFETY: F_SETFL takes an int and touches no user memory.
        cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
        Ok(NonBlockingFor { fd, restore: Some(flags) })
    }
}

impl Drop for NonBlockingFor {
    fn drop(&mut self) {
        if let Some(flags) = self.restore {
            // SAFETY: F_SETFL takes an int and touches no user memory. The
            // descriptor is still open: the guard lives inside a borrow of
            // the socket that owns it. A failure leaves the socket
            // non-blocking, which its operations handle.
            unsafe { libc::fcntl(self.fd, libc::F_SETFL, flags) };
        }
    }
}

/// A pipe (read end, write end), close-on-exec and blocking, with room
/// for `size_bytes` if the kernel allows that much (else its default).
pub(crate) fn pipe(size_bytes: usize) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors `pipe2` writes.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: `pipe2` succeeded, so both descriptors are open and ours alone.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let size = libc::c_int::try_from(size_bytes).unwrap_or(libc::c_int::MAX);
    // A smaller pipe only means more splices per file: failure is not an error.
    // SAFETY: F_SETPIPE_SZ takes an int and touches no user memory.
    let _ = unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, size) };
    Ok((rd, wr))
}

/// The room of the pipe `fd` in bytes.
pub(crate) fn pipe_size(fd: RawFd) -> io::Result<usize> {
    // SAFETY: F_GETPIPE_SZ touches no user memory.
    let n = cvt(unsafe { libc::fcntl(fd, libc::F_GETPIPE_SZ) })?;
    Ok(n as usize)
}

/// `openat2(dir, path, flags | O_CLOEXEC, mode)` with `RESOLVE_BENEATH`:
/// fails with `EXDEV` if resolving `path` would leave `dir`.
pub(crate) fn open_beneath(dir: RawFd, path: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `open_how` is plain integers; all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = u64::from(mode);
    how.resolve = libc::RESOLVE_BENEATH;
    // SAFETY: `path` is NUL-terminated and `how` a valid `open_how` of the
    // size passed, both alive for the call; the kernel checks `dir`.
    let fd = cvt(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    })?;
    // SAFETY: a successful openat2 returns a new descriptor only we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Takes an exclusive `flock` on the open file `fd`, waiting for it
/// (again if a signal interrupts the wait). Closing the file releases it.
pub(crate) fn lock_exclusive(fd: RawFd) -> io::Result<()> {
    loop {
        // SAFETY: `flock` takes a descriptor number and a flag; an invalid
        // or closed descriptor is an `EBADF` error, not undefined behaviour.
        match cvt(unsafe { libc::flock(fd, libc::LOCK_EX) }) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other.map(drop),
        }
    }
}
