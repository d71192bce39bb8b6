//! Unix domain socket calls that std has but only on an owned socket
//! (datagrams), or not at all on stable (`SO_PEERCRED`).

use std::io;
use std::mem::{size_of, ManuallyDrop};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd};
use std::os::unix::net::UnixDatagram;

use super::cvt;

/// Runs `f` with a std `UnixDatagram` view of `fd`, which stays owned by
/// the caller: std's calls (`send_to`, `recv_from`, addresses) on a
/// descriptor the driver holds.
pub(crate) fn with_unix_datagram<R>(fd: BorrowedFd<'_>, f: impl FnOnce(&UnixDatagram) -> R) -> R {
    // SAFETY: `fd` is open for the whole borrow, and the view is never
    // dropped (`ManuallyDrop`), so it does not close what it does not own.
    let view = ManuallyDrop::new(unsafe { UnixDatagram::from_raw_fd(fd.as_raw_fd()) });
    f(&view)
}

/// The peer's process, user and group, as `SO_PEERCRED` reports them
/// (taken when the connection was made): `(pid, uid, gid)`.
pub(crate) fn peer_cred(fd: BorrowedFd<'_>) -> io::Result<(i32, u32, u32)> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the live `cred`
    // and updates `len`; `fd` is open for the borrow.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    Ok((cred.pid, cred.uid, cred.gid))
}
