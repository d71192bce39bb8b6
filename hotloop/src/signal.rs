//! Waiting for SIGINT and SIGTERM without a signal handler.
//!
//! [`ShutdownSignals::block`] blocks both signals in the calling thread;
//! threads started afterwards (a runtime's workers) inherit the mask, so
//! the signals stay pending until [`ShutdownSignals::wait`] takes one with
//! `sigwait(3)`. Call `block` first thing in `main`.

use std::io;

/// SIGINT and SIGTERM, blocked and waiting to be taken.
#[derive(Debug)]
pub struct ShutdownSignals {
    set: libc::sigset_t,
}

/// A shutdown signal that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM.
    Terminate,
}

impl ShutdownSignals {
    /// Blocks SIGINT and SIGTERM in the calling thread (and the threads it
    /// starts from now on).
    pub fn block() -> io::Result<ShutdownSignals> {
        // SAFETY: sigset_t is plain old data; sigemptyset initialises it next.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: each call takes a pointer to the live set; the signal numbers are valid.
        unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
        }
        // SAFETY: passes the live set; the old mask is not asked for.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(ShutdownSignals { set })
    }

    /// Blocks until SIGINT or SIGTERM arrives.
    pub fn wait(&self) -> io::Result<Signal> {
        let mut sig: libc::c_int = 0;
        // SAFETY: sigwait reads the live set and writes one int.
        let rc = unsafe { libc::sigwait(&self.set, &mut sig) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(if sig == libc::SIGINT { Signal::Interrupt } else { Signal::Terminate })
    }
}
