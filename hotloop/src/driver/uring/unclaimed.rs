//! Descriptors the kernel hands back that nobody will take: a connection
//! an orphaned accept still delivers, or a file an `OPENAT` opened for a
//! future that was dropped. The driver closes them, so none leaks.
//!
//! # Implementation notes
//! - An open's storage is an [`OpenPath`]: its type is how the driver
//!   tells, from an operation's storage alone, that the result of a
//!   completion nobody took is a descriptor (`op::close_unclaimed`, called
//!   when a future forgets a completed operation and at a cancelled
//!   operation's last completion).
//! - This module sits below `op.rs`, which forgets futures, and
//!   `dispatch.rs`, which delivers completions; `file.rs`, which opens
//!   files, and `accept.rs` build on it. None of them is named here.

use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use io_uring::types;

use super::shared::SharedFile;

/// What an `OPENAT` or `OPENAT2` keeps alive: the path, and for `OPENAT2`
/// the `open_how` and the directory it resolves beneath. An operation
/// whose storage this is returns a new descriptor.
pub(super) struct OpenPath {
    _path: CString,
    _how: Option<Box<types::OpenHow>>,
    _dir: Option<SharedFile>,
}

impl OpenPath {
    /// The storage of an open of `path` (beneath `dir`, as `how` says, for
    /// `OPENAT2`).
    pub(super) fn new(
        path: CString,
        how: Option<Box<types::OpenHow>>,
        dir: Option<SharedFile>,
    ) -> OpenPath {
        OpenPath { _path: path, _how: how, _dir: dir }
    }
}

/// Closes the descriptor in `res`, the result of an accept or an open
/// that nobody will take, if it is one (a negative `res` is an error).
pub(super) fn close(res: i32) {
    if res >= 0 {
        // SAFETY: a non-negative accept or open result is a new descriptor
        // the kernel installed for an operation nobody waits for any more:
        // nothing else owns or will use it.
        drop(unsafe { OwnedFd::from_raw_fd(res as RawFd) });
    }
}
