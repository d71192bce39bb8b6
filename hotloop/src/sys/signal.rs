//! The signal handler and the state it touches.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering};

use super::cvt;
use super::socket::set_nonblocking;

// The handler and the state it touches live here because the
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
