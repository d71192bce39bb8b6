//! Files and directories on the worker's ring, as `tokio::fs` offers them.
//!
//! [`File`] reads and writes at offsets with owned buffers
//! ([`File::read_at`], [`File::write_at`]) and, with the default feature
//! `tokio-io`, is tokio's `AsyncRead`, `AsyncWrite` and `AsyncSeek`, with
//! tokio's semantics (a write is reported written at once and carried out
//! in the background, even after a drop; see [`File`]). The
//! free functions ([`read`], [`write()`], [`read_to_string`], [`metadata()`],
//! [`rename`], [`remove_file`], [`create_dir_all`], ...) do what their
//! `std::fs` namesakes do; so do [`read_dir`], [`copy`], [`canonicalize`],
//! [`remove_dir_all`], the links and [`set_permissions`], which run on the
//! blocking pool on both drivers, as tokio's do. Errors carry the
//! operation and the path in their message (`open /x/y: No such file or
//! directory (os error 2)`) and keep the `ErrorKind`.
//!
//! [`Dir`] opens files beneath a directory and refuses paths that leave
//! it (`..`, symbolic links pointing out), for serving files under a root.
//!
//! A [`File`] may be sent to a socket without copying its bytes through
//! user space: [`TcpStream::send_file`](crate::net::TcpStream::send_file).
//!
//! # Implementation notes
//! - On io_uring each call is one ring operation (`OPENAT`, `READ`,
//!   `WRITE`, `STATX`, `FSYNC`, `FTRUNCATE`, `RENAMEAT`, `UNLINKAT`,
//!   `MKDIRAT`; `OPENAT2` for [`Dir`]) submitted with the worker's other entries at the loop's
//!   next `io_uring_enter`; the kernel serves a read of cached pages
//!   inline and hands what would block to its own workers. The opcodes are
//!   probed once per process: one the kernel lacks (`FTRUNCATE` before
//!   Linux 6.9) goes to the blocking pool instead, and
//!   `HOTLOOP_URING_FS=0` sends them all there.
//! - On epoll each call is a job on the runtime's blocking pool
//!   ([`spawn_blocking`](crate::spawn_blocking)): a `Vec` buffer travels
//!   to the pool thread and back; another buffer type (not `Send`) is
//!   filled from a copy. A file that cannot seek (a FIFO) is read and
//!   written at its own position, the offset ignored, as io_uring does.
//! - With the clock paused, a file operation holds it on both drivers
//!   (a ring operation counts itself while it runs, a pool job is counted
//!   by the pool): see `time/paused.rs`.
//! - A file is shared (an `Arc`) by its handle and every operation in
//!   flight on it, so dropping a `File` while an operation runs closes the
//!   descriptor only after the kernel is done with it. An open whose future
//!   is dropped after the kernel took it still completes; the driver closes
//!   the descriptor it returns.
//! - Closing is a plain `close(2)` when the last holder lets go: for a
//!   regular file it does not wait for the device.

#[cfg(feature = "tokio-io")]
mod compat;
mod cursor;
mod dir;
mod error;
mod file;
mod metadata;
mod ops;
mod options;
mod pool_ops;

pub use dir::Dir;
pub use file::File;
pub use metadata::Metadata;
pub use options::OpenOptions;
pub use pool_ops::{
    canonicalize, copy, hard_link, read_dir, read_link, remove_dir_all, set_permissions, symlink,
    try_exists, DirEntry, ReadDir, READ_DIR_BATCH,
};

use std::io;
use std::path::Path;

use error::with_path;

/// True when file reads on this worker are io_uring operations, false
/// when they go to the blocking pool (the epoll driver, a ring without
/// `READ`, or `HOTLOOP_URING_FS=0`), or off a worker. A server can choose
/// by it how to send a small file: read into its own buffer where a read
/// costs no thread hop, [`TcpStream::send_file`](crate::net::TcpStream::send_file)
/// otherwise.
pub fn reads_on_ring() -> bool {
    ops::on_ring(crate::driver::FileOp::Read)
}

/// Reads the whole file at `path`.
pub async fn read(path: impl AsRef<Path>) -> io::Result<Vec<u8>> {
    let mut file = File::open(path).await?;
    let (res, buf) = file.read_to_end(Vec::new()).await;
    res.map(|_| buf)
}

/// Reads the whole file at `path` as UTF-8; `InvalidData` if it is not.
pub async fn read_to_string(path: impl AsRef<Path>) -> io::Result<String> {
    let path = path.as_ref();
    let bytes = read(path).await?;
    String::from_utf8(bytes).map_err(|_| {
        with_path(
            "read",
            path,
            io::Error::new(io::ErrorKind::InvalidData, "stream did not contain valid UTF-8"),
        )
    })
}

/// Writes `contents` to the file at `path`, creating or truncating it.
pub async fn write(path: impl AsRef<Path>, contents: impl AsRef<[u8]>) -> io::Result<()> {
    let file = File::create(path).await?;
    let (res, _) = file.write_all_at(contents.as_ref().to_vec(), 0).await;
    res
}

/// Metadata of `path`, following symbolic links.
pub async fn metadata(path: impl AsRef<Path>) -> io::Result<Metadata> {
    let path = path.as_ref();
    ops::metadata_path(path, true).await.map_err(|e| with_path("stat", path, e))
}

/// Metadata of `path` itself, not following a final symbolic link.
pub async fn symlink_metadata(path: impl AsRef<Path>) -> io::Result<Metadata> {
    let path = path.as_ref();
    ops::metadata_path(path, false).await.map_err(|e| with_path("lstat", path, e))
}

/// Renames `from` to `to`, replacing `to` if it exists.
pub async fn rename(from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
    let (from, to) = (from.as_ref(), to.as_ref());
    ops::rename(from, to).await.map_err(|e| with_path("rename", from, e))
}

/// Removes the file at `path`.
pub async fn remove_file(path: impl AsRef<Path>) -> io::Result<()> {
    let path = path.as_ref();
    ops::remove(path, false).await.map_err(|e| with_path("remove", path, e))
}

/// Removes the empty directory at `path`.
pub async fn remove_dir(path: impl AsRef<Path>) -> io::Result<()> {
    let path = path.as_ref();
    ops::remove(path, true).await.map_err(|e| with_path("rmdir", path, e))
}

/// Creates the directory `path` (mode `0o777` less the umask); its parent
/// must exist.
pub async fn create_dir(path: impl AsRef<Path>) -> io::Result<()> {
    let path = path.as_ref();
    ops::mkdir(path, 0o777).await.map_err(|e| with_path("mkdir", path, e))
}

/// Creates the directory `path` and any missing parents; an existing
/// directory is not an error (another file there is).
pub async fn create_dir_all(path: impl AsRef<Path>) -> io::Result<()> {
    let path = path.as_ref();
    create_dir_all_inner(path).await.map_err(|e| with_path("mkdir", path, e))
}

async fn create_dir_all_inner(path: &Path) -> io::Result<()> {
    // The missing ancestors, deepest first, found by walking up until one
    // exists (or is made by someone else meanwhile).
    let mut missing = Vec::new();
    let mut at = Some(path);
    while let Some(dir) = at {
        if dir.as_os_str().is_empty() {
            break;
        }
        match ops::mkdir(dir, 0o777).await {
            Ok(()) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing.push(dir);
                at = dir.parent();
            }
            // Made by someone else meanwhile, or the deepest existing ancestor.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if !ops::metadata_path(dir, true).await?.is_dir() {
                    return Err(e);
                }
                break;
            }
            Err(e) => return Err(e),
        }
    }
    while let Some(dir) = missing.pop() {
        match ops::mkdir(dir, 0o777).await {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if !ops::metadata_path(dir, true).await?.is_dir() {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
