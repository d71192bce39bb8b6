//! `File`: an open file whose operations run on the worker's ring (or the
//! blocking pool), with owned buffers.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::Path;
use std::sync::Arc;

use super::error::with_path;
use super::ops::{self, SharedFile};
use super::{Metadata, OpenOptions};
use crate::buf::{BufResult, IoBuf, IoBufMut};

/// An open file.
///
/// The positioned operations (`read_at`, `write_at`) take `&self` and an
/// owned buffer, which comes back with the result, as the stream methods
/// do: on io_uring the kernel may write into the buffer after the future
/// was dropped, so the operation keeps it (and the file) until the kernel
/// is done. With the default feature `tokio-io`, `File` is also tokio's
/// `AsyncRead`, `AsyncWrite` and `AsyncSeek`, at a cursor of its own that
/// [`File::read_to_end`] uses too.
///
/// Dropping a `File` closes it once no operation holds it any more.
pub struct File {
    pub(super) file: SharedFile,
    pub(super) path: Arc<Path>,
    /// Where the cursor-based reads and writes are.
    pub(super) pos: u64,
    #[cfg(feature = "tokio-io")]
    pub(super) io: super::compat::State,
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File")
            .field("fd", &self.file.as_raw_fd())
            .field("path", &self.path)
            .field("pos", &self.pos)
            .finish()
    }
}

impl File {
    /// Opens `path` for reading.
    pub async fn open(path: impl AsRef<Path>) -> io::Result<File> {
        OpenOptions::new().read(true).open(path).await
    }

    /// Opens `path` for writing, creating it or truncating it.
    pub async fn create(path: impl AsRef<Path>) -> io::Result<File> {
        OpenOptions::new().write(true).create(true).truncate(true).open(path).await
    }

    /// Opens `path` for writing, failing if it exists.
    pub async fn create_new(path: impl AsRef<Path>) -> io::Result<File> {
        OpenOptions::new().read(true).write(true).create_new(true).open(path).await
    }

    /// An [`OpenOptions`] to set up.
    pub fn options() -> OpenOptions {
        OpenOptions::new()
    }

    pub(super) async fn open_with(path: &Path, options: &OpenOptions) -> io::Result<File> {
        let file = ops::open(path, options).await.map_err(|e| with_path("open", path, e))?;
        Ok(File::wrap(file, path.into()))
    }

    pub(super) fn wrap(file: std::fs::File, path: Arc<Path>) -> File {
        File {
            file: Arc::new(file),
            path,
            pos: 0,
            #[cfg(feature = "tokio-io")]
            io: Default::default(),
        }
    }

    /// Wraps a file opened by the standard library.
    pub fn from_std(file: std::fs::File) -> File {
        File::wrap(file, Path::new("<file>").into())
    }

    /// The path the file was opened with (as its errors name it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn shared(&self) -> &SharedFile {
        &self.file
    }

    /// Reads into `buf` (from its start up to its capacity for a `Vec`)
    /// from `offset`; `Ok(0)` at the end of the file. The file's cursor
    /// does not move.
    pub async fn read_at<B: IoBufMut>(&self, buf: B, offset: u64) -> BufResult<usize, B> {
        let (res, buf) = ops::read_at(&self.file, buf, offset).await;
        (res.map_err(|e| with_path("read", &self.path, e)), buf)
    }

    /// Writes the initialised bytes of `buf` at `offset`; may write fewer.
    /// The file's cursor does not move.
    pub async fn write_at<B: IoBuf>(&self, buf: B, offset: u64) -> BufResult<usize, B> {
        let (res, buf) = ops::write_at(&self.file, buf, offset).await;
        (res.map_err(|e| with_path("write", &self.path, e)), buf)
    }

    /// Writes all of `buf` at `offset`.
    pub async fn write_all_at<B: IoBuf>(&self, buf: B, offset: u64) -> BufResult<(), B> {
        let total = buf.bytes_init();
        let mut done = 0;
        let mut slice = buf.slice(..);
        while done < total {
            let (res, s) = self.write_at(slice, offset + done as u64).await;
            let buf = s.into_inner();
            match res {
                Ok(0) => return (Err(io::ErrorKind::WriteZero.into()), buf),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return (Err(e), buf),
            }
            slice = buf.slice(done..);
        }
        (Ok(()), slice.into_inner())
    }

    /// Reads from the cursor to the end of the file, appending to `buf`;
    /// returns how many bytes were read and moves the cursor past them.
    ///
    /// This owned-buffer form shadows `AsyncReadExt::read_to_end` in
    /// method calls; call that one as `AsyncReadExt::read_to_end(&mut file, &mut v)`.
    pub async fn read_to_end(&mut self, buf: Vec<u8>) -> BufResult<usize, Vec<u8>> {
        let (res, buf) = ops::read_to_end(&self.file, buf, self.pos).await;
        match res {
            Ok(n) => {
                self.pos += n as u64;
                (Ok(n), buf)
            }
            Err(e) => (Err(with_path("read", &self.path, e)), buf),
        }
    }

    /// Flushes the file's data and metadata to the device (`fsync`).
    pub async fn sync_all(&self) -> io::Result<()> {
        ops::sync(&self.file, false).await.map_err(|e| with_path("fsync", &self.path, e))
    }

    /// Flushes the file's data to the device (`fdatasync`).
    pub async fn sync_data(&self) -> io::Result<()> {
        ops::sync(&self.file, true).await.map_err(|e| with_path("fdatasync", &self.path, e))
    }

    /// The file's metadata (`statx`).
    pub async fn metadata(&self) -> io::Result<Metadata> {
        ops::metadata_file(&self.file).await.map_err(|e| with_path("stat", &self.path, e))
    }

    /// Truncates or extends the file to `len` bytes (`ftruncate`); the
    /// cursor does not move.
    pub async fn set_len(&self, len: u64) -> io::Result<()> {
        ops::set_len(&self.file, len).await.map_err(|e| with_path("truncate", &self.path, e))
    }
}

impl AsRawFd for File {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl AsFd for File {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}
