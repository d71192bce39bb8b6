//! The process and its threads: CPU pinning, descriptor limits and
//! counts, memory given back to the kernel, huge pages.

use std::io;
use std::mem::size_of;

use super::cvt;

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

/// The soft open-file limit in force now (`RLIMIT_NOFILE`).
pub(crate) fn nofile_soft_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the live struct.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) })?;
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

/// A pidfd for child `pid` (`pidfd_open(2)`, Linux 5.3+): readable once the
/// process exits; close-on-exec, as every pidfd is.
pub(crate) fn pidfd_open(pid: u32) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "process id out of range"))?;
    // SAFETY: pidfd_open takes a pid and flags by value and touches no memory of ours.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: on success the call returned a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as std::os::fd::RawFd) })
}

/// The effective user id of this process.
pub(crate) fn effective_uid() -> u32 {
    // SAFETY: geteuid(2) takes nothing and cannot fail.
    unsafe { libc::geteuid() }
}
