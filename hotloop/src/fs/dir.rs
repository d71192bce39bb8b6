//! `Dir`: a directory that files are opened beneath, never outside.

use std::io;
use std::path::Path;
use std::sync::Arc;

use super::error::with_path;
use super::ops::{self, SharedFile};
use super::{File, OpenOptions};

/// An open directory whose [`Dir::open_file`] refuses any path that
/// resolves outside it: `..` above it, an absolute path, or a symbolic
/// link (anywhere in the path) that points out. The kernel checks this as
/// it resolves the path (`openat2` with `RESOLVE_BENEATH`), so a link
/// swapped in between a check and the open cannot escape either. A link
/// that leads back inside however it is written (an absolute target
/// under the directory, by the name it was opened with or any other, or
/// `../dir/file`) is followed. For a server that serves files under a
/// root.
///
/// `Dir` is `Send` and `Sync`, and cheap to clone: one directory can be
/// shared by every worker.
#[derive(Debug, Clone)]
pub struct Dir {
    dir: SharedFile,
    path: Arc<Path>,
}

impl Dir {
    /// Opens the directory at `path`.
    pub async fn open(path: impl AsRef<Path>) -> io::Result<Dir> {
        let path = path.as_ref();
        let mut options = OpenOptions::new();
        options.read(true).custom_flags(libc::O_DIRECTORY);
        let file = ops::open(path, &options).await.map_err(|e| with_path("open", path, e))?;
        Ok(Dir { dir: Arc::new(file), path: path.into() })
    }

    /// Opens the directory at `path` with a blocking call, for setting up
    /// before a runtime runs (it is what a server does at start).
    pub fn open_blocking(path: impl AsRef<Path>) -> io::Result<Dir> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = path.as_ref();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| with_path("open", path, e))?;
        Ok(Dir { dir: Arc::new(file), path: path.into() })
    }

    /// The path the directory was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `path`, relative to this directory, with `options`. A path
    /// that would leave the directory fails with `PermissionDenied`
    /// ("resolves outside"); a missing one with `NotFound`. The error names
    /// the directory joined with `path`.
    ///
    /// A symbolic link is judged by where it leads, not by how it is
    /// written: the kernel refuses, as it resolves, any link with an
    /// absolute target and any step above the directory, and then the
    /// path is resolved again with every link followed; if it lands inside
    /// the directory, that place is opened beneath it (the kernel checking
    /// again). A `..` or an absolute `path` given here is refused as it is.
    pub async fn open_file(
        &self,
        path: impl AsRef<Path>,
        options: &OpenOptions,
    ) -> io::Result<File> {
        let path = path.as_ref();
        let full = || self.path.join(path);
        let opened = match ops::open_beneath(&self.dir, path, options).await {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) && !leaves_lexically(path) => {
                match ops::resolve_beneath(&self.dir, path).await {
                    Some(inside) => ops::open_beneath(&self.dir, &inside, options).await,
                    None => Err(e),
                }
            }
            opened => opened,
        };
        let file = opened.map_err(|e| {
            let e = if e.raw_os_error() == Some(libc::EXDEV) {
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("the path resolves outside {}", self.path.display()),
                )
            } else {
                e
            };
            with_path("open", &full(), e)
        })?;
        Ok(File::wrap(file, full().into(), options.append))
    }
}

/// True for a path that names a way out by itself: absolute, or with a
/// `..` step. Only links are resolved again; these stay refused.
fn leaves_lexically(path: &Path) -> bool {
    use std::path::Component;
    path.components()
        .any(|c| matches!(c, Component::RootDir | Component::Prefix(_) | Component::ParentDir))
}
