//! Waiting for process signals without a signal handler.
//!
//! [`ShutdownSignals::block`] blocks SIGINT, SIGTERM, SIGQUIT, SIGHUP,
//! SIGUSR1 and SIGUSR2 in the calling thread; threads started afterwards (a
//! runtime's workers) inherit the mask, so the signals stay pending until
//! [`ShutdownSignals::wait`] or [`ShutdownSignals::wait_timeout`] takes one
//! with `sigwait(3)` / `sigtimedwait(2)`. Call `block` first thing in
//! `main`. A blocked signal never runs its default action, so SIGHUP and
//! the user signals no longer end the process: the caller decides.

use std::io;
use std::time::Duration;

/// The signals a server takes, blocked and waiting to be taken.
#[derive(Debug)]
pub struct ShutdownSignals {
    set: libc::sigset_t,
}

/// A signal that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM.
    Terminate,
    /// SIGQUIT.
    Quit,
    /// SIGHUP.
    Hangup,
    /// SIGUSR1.
    User1,
    /// SIGUSR2.
    User2,
}

impl Signal {
    /// True for the signals that ask the process to stop (SIGINT, SIGTERM,
    /// SIGQUIT).
    pub fn is_stop(self) -> bool {
        matches!(self, Signal::Interrupt | Signal::Terminate | Signal::Quit)
    }

    fn from_raw(sig: libc::c_int) -> Signal {
        match sig {
            libc::SIGINT => Signal::Interrupt,
            libc::SIGQUIT => Signal::Quit,
            libc::SIGHUP => Signal::Hangup,
            libc::SIGUSR1 => Signal::User1,
            libc::SIGUSR2 => Signal::User2,
            _ => Signal::Terminate,
        }
    }
}

const SIGNALS: [libc::c_int; 6] =
    [libc::SIGINT, libc::SIGTERM, libc::SIGQUIT, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2];

impl ShutdownSignals {
    /// Blocks the signals [`Signal`] names in the calling thread (and the
    /// threads it starts from now on).
    pub fn block() -> io::Result<ShutdownSignals> {
        // SAFETY: sigset_t is plain old data; sigemptyset initialises it next.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: each call takes a pointer to the live set; the signal numbers are valid.
        unsafe {
            libc::sigemptyset(&mut set);
            for sig in SIGNALS {
                libc::sigaddset(&mut set, sig);
            }
        }
        // SAFETY: passes the live set; the old mask is not asked for.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(ShutdownSignals { set })
    }

    /// Blocks until one of the signals arrives.
    pub fn wait(&self) -> io::Result<Signal> {
        let mut sig: libc::c_int = 0;
        // SAFETY: sigwait reads the live set and writes one int.
        let rc = unsafe { libc::sigwait(&self.set, &mut sig) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(Signal::from_raw(sig))
    }

    /// Waits up to `limit` for one of the signals; `None` if none came.
    pub fn wait_timeout(&self, limit: Duration) -> io::Result<Option<Signal>> {
        let ts = libc::timespec {
            tv_sec: limit.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: limit.subsec_nanos() as libc::c_long,
        };
        // SAFETY: sigtimedwait reads the live set and the timespec; no siginfo is asked for.
        let rc = unsafe { libc::sigtimedwait(&self.set, std::ptr::null_mut(), &ts) };
        if rc >= 0 {
            return Ok(Some(Signal::from_raw(rc)));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EINTR) => Ok(None),
            _ => Err(e),
        }
    }
}
