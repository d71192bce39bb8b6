//! Errors that name the operation and the path they concern.

use std::error::Error;
use std::fmt;
use std::io;
use std::path::Path;

/// An error from the file system with what was being done and to which path.
#[derive(Debug)]
struct PathError {
    op: &'static str,
    path: Box<Path>,
    source: io::Error,
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.op, self.path.display(), self.source)
    }
}

impl Error for PathError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.source)
    }
}

/// Wraps `e` so its message starts with `op` and `path` (`open /x/y: No
/// such file or directory (os error 2)`); the `ErrorKind` stays, and the
/// original error is its source.
pub(super) fn with_path(op: &'static str, path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), PathError { op, path: path.into(), source: e })
}

/// The error for a path that holds a NUL byte, which no system call takes.
pub(super) fn nul_in_path() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte")
}

/// The error of a file operation made off a hotloop worker.
pub(super) fn not_on_worker() -> io::Error {
    io::Error::other(
        "hotloop::fs must be used on a hotloop worker: call it from inside \
         `Runtime::block_on` or a task spawned there",
    )
}
