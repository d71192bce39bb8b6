//! The `tokio::fs` calls with no ring operation behind them: reading a
//! directory, copying, walking or resolving paths, links and permissions.
//! Each runs on the runtime's blocking pool on both drivers, as tokio's
//! do, and its error names the operation and the path.
//!
//! # Implementation notes
//! [`ReadDir`] reads [`READ_DIR_BATCH`] entries per blocking-pool job
//! (with each entry's type, which `getdents` reports with the name on most
//! file systems), so a directory of a thousand entries costs 32 thread
//! hops, not a thousand; the standard library's iterator travels to the
//! pool and back with each batch.

use std::collections::VecDeque;
use std::fs::{FileType, Permissions};
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::error::{not_on_worker, with_path};
use super::Metadata;
use crate::runtime::{current, RemoteJoinHandle};

/// Entries [`ReadDir`] reads per blocking-pool job (tokio's figure).
pub const READ_DIR_BATCH: usize = 32;

/// Runs `f` on the blocking pool; its error names `op` and `path`.
async fn pool<R: Send + 'static>(
    op: &'static str,
    path: &Path,
    f: impl FnOnce() -> io::Result<R> + Send + 'static,
) -> io::Result<R> {
    let job = current::try_spawn_blocking(f).ok_or_else(not_on_worker)?;
    match job.await {
        Ok(r) => r.map_err(|e| with_path(op, path, e)),
        Err(e) => Err(with_path(op, path, io::Error::other(format!("blocking pool: {e}")))),
    }
}

/// Copies the contents and permissions of the file `from` to `to`
/// (created or truncated); returns the bytes copied. As `std::fs::copy`,
/// which uses `copy_file_range` where the file system allows.
pub async fn copy(from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<u64> {
    let (from, to) = (from.as_ref().to_owned(), to.as_ref().to_owned());
    pool("copy", &from.clone(), move || std::fs::copy(from, to)).await
}

/// The absolute form of `path`, with every symbolic link, `.` and `..`
/// resolved.
pub async fn canonicalize(path: impl AsRef<Path>) -> io::Result<PathBuf> {
    let path = path.as_ref().to_owned();
    pool("canonicalize", &path.clone(), move || std::fs::canonicalize(path)).await
}

/// Removes the directory at `path` and everything in it (symbolic links
/// inside are removed, not followed).
pub async fn remove_dir_all(path: impl AsRef<Path>) -> io::Result<()> {
    let path = path.as_ref().to_owned();
    pool("remove_dir_all", &path.clone(), move || std::fs::remove_dir_all(path)).await
}

/// Makes `dst` a hard link to the file `src`.
pub async fn hard_link(src: impl AsRef<Path>, dst: impl AsRef<Path>) -> io::Result<()> {
    let (src, dst) = (src.as_ref().to_owned(), dst.as_ref().to_owned());
    pool("link", &dst.clone(), move || std::fs::hard_link(src, dst)).await
}

/// Makes `dst` a symbolic link to `src`.
pub async fn symlink(src: impl AsRef<Path>, dst: impl AsRef<Path>) -> io::Result<()> {
    let (src, dst) = (src.as_ref().to_owned(), dst.as_ref().to_owned());
    pool("symlink", &dst.clone(), move || std::os::unix::fs::symlink(src, dst)).await
}

/// Where the symbolic link at `path` points.
pub async fn read_link(path: impl AsRef<Path>) -> io::Result<PathBuf> {
    let path = path.as_ref().to_owned();
    pool("readlink", &path.clone(), move || std::fs::read_link(path)).await
}

/// Sets the permission bits of `path`.
pub async fn set_permissions(path: impl AsRef<Path>, perm: Permissions) -> io::Result<()> {
    let path = path.as_ref().to_owned();
    pool("chmod", &path.clone(), move || std::fs::set_permissions(path, perm)).await
}

/// True if `path` exists (following symbolic links); an error only when
/// that cannot be told (a directory on the way that cannot be searched).
pub async fn try_exists(path: impl AsRef<Path>) -> io::Result<bool> {
    let path = path.as_ref().to_owned();
    pool("stat", &path.clone(), move || path.try_exists()).await
}

/// The entries of the directory at `path` (not `.` and `..`), read
/// [`READ_DIR_BATCH`] at a time on the blocking pool.
pub async fn read_dir(path: impl AsRef<Path>) -> io::Result<ReadDir> {
    let path: Arc<Path> = path.as_ref().into();
    let opened = path.clone();
    let dir = pool("opendir", &path, move || std::fs::read_dir(&opened)).await?;
    Ok(ReadDir { path, state: State::Idle(Some(dir)), ready: VecDeque::new() })
}

/// A directory being read, from [`read_dir`]: [`next_entry`](ReadDir::next_entry)
/// until `None`, as tokio's `ReadDir`.
pub struct ReadDir {
    path: Arc<Path>,
    state: State,
    /// Entries of the last batch not yet handed out.
    ready: VecDeque<io::Result<DirEntry>>,
}

/// What a batch job hands back: the iterator (`None` once it ended) and
/// the entries it read.
type Batch = (Option<std::fs::ReadDir>, VecDeque<io::Result<DirEntry>>);

enum State {
    /// The iterator, here between batches; `None` once it ended.
    Idle(Option<std::fs::ReadDir>),
    /// A batch being read on the pool.
    Reading(RemoteJoinHandle<Batch>),
}

impl ReadDir {
    /// The next entry; `None` after the last one.
    ///
    /// # Cancel safety
    /// Cancel-safe: a batch being read when the future is dropped is kept
    /// for the next call.
    pub async fn next_entry(&mut self) -> io::Result<Option<DirEntry>> {
        std::future::poll_fn(|cx| self.poll_next_entry(cx)).await
    }

    /// The poll form of [`next_entry`](Self::next_entry).
    pub fn poll_next_entry(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<DirEntry>>> {
        loop {
            if let Some(entry) = self.ready.pop_front() {
                return Poll::Ready(entry.map(Some));
            }
            match &mut self.state {
                State::Idle(None) => return Poll::Ready(Ok(None)),
                State::Idle(dir) => {
                    let mut dir = dir.take();
                    let job = current::try_spawn_blocking(move || {
                        let mut batch = VecDeque::with_capacity(READ_DIR_BATCH);
                        while batch.len() < READ_DIR_BATCH {
                            let Some(next) = dir.as_mut().and_then(Iterator::next) else {
                                dir = None;
                                break;
                            };
                            batch.push_back(next.map(DirEntry::new));
                        }
                        (dir, batch)
                    });
                    match job {
                        Some(job) => self.state = State::Reading(job),
                        None => return Poll::Ready(Err(not_on_worker())),
                    }
                }
                State::Reading(job) => {
                    let batch = std::task::ready!(Pin::new(job).poll(cx));
                    match batch {
                        Ok((dir, entries)) => {
                            let path = &self.path;
                            self.ready = entries
                                .into_iter()
                                .map(|e| e.map_err(|e| with_path("readdir", path, e)))
                                .collect();
                            self.state = State::Idle(dir);
                        }
                        Err(e) => {
                            self.state = State::Idle(None);
                            let e = io::Error::other(format!("blocking pool: {e}"));
                            return Poll::Ready(Err(with_path("readdir", &self.path, e)));
                        }
                    }
                }
            }
        }
    }
}

impl std::fmt::Debug for ReadDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadDir").field("path", &self.path).finish_non_exhaustive()
    }
}

/// An entry of a directory, from [`ReadDir::next_entry`].
#[derive(Debug, Clone)]
pub struct DirEntry {
    entry: Arc<std::fs::DirEntry>,
    /// Read with the entry on the pool; `None` where the file system did
    /// not report it with the name.
    file_type: Option<FileType>,
}

impl DirEntry {
    fn new(entry: std::fs::DirEntry) -> DirEntry {
        let file_type = entry.file_type().ok();
        DirEntry { entry: Arc::new(entry), file_type }
    }

    /// The entry's full path: the directory's path joined with its name.
    pub fn path(&self) -> PathBuf {
        self.entry.path()
    }

    /// The entry's name in its directory.
    pub fn file_name(&self) -> std::ffi::OsString {
        self.entry.file_name()
    }

    /// The entry's inode number, from the directory itself.
    pub fn ino(&self) -> u64 {
        std::os::unix::fs::DirEntryExt::ino(&*self.entry)
    }

    /// The entry's type (not following a symbolic link): known already on
    /// most file systems, else asked on the blocking pool.
    pub async fn file_type(&self) -> io::Result<FileType> {
        if let Some(t) = self.file_type {
            return Ok(t);
        }
        let entry = self.entry.clone();
        pool("lstat", &self.path(), move || entry.file_type()).await
    }

    /// The entry's metadata (not following a symbolic link), on the
    /// blocking pool.
    pub async fn metadata(&self) -> io::Result<Metadata> {
        let entry = self.entry.clone();
        pool("lstat", &self.path(), move || entry.metadata().map(|m| Metadata::from_std(&m))).await
    }
}
