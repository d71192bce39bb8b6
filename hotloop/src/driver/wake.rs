//! Waking a driver's poll from another thread.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::sys;

/// An eventfd that ends a driver's wait when written; `Send` and `Sync`,
/// so other threads can hold it while the driver stays on its own thread.
#[derive(Debug)]
pub(crate) struct Unpark {
    fd: OwnedFd,
}

impl Unpark {
    /// A new, unsignalled eventfd.
    pub(crate) fn new() -> io::Result<Unpark> {
        Ok(Unpark { fd: sys::eventfd()? })
    }

    /// Ends the driver's current or next wait.
    pub(crate) fn unpark(&self) {
        sys::eventfd_signal(self.fd.as_raw_fd());
    }

    /// The descriptor the driver polls.
    pub(super) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Resets the eventfd after a wake was seen.
    pub(super) fn drain(&self) {
        sys::eventfd_drain(self.fd.as_raw_fd());
    }
}
