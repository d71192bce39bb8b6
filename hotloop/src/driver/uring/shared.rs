//! The descriptor and file types an operation holds: the kernel may still
//! use a socket or file after its owner dropped it, so every operation
//! keeps its own reference until its last completion.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::Arc;

/// A descriptor shared by a socket and the operations the kernel holds on
/// it; closed when the last holder drops it.
pub(crate) type SharedFd = Rc<OwnedFd>;

/// A file shared by its handle and the operations the kernel holds on it.
pub(crate) type SharedFile = Arc<File>;
