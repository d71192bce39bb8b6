//! `File`: an open file whose operations run on the worker's ring (or the
//! blocking pool), with owned buffers.

use std::cell::{Cell, RefCell};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::Path;
use std::sync::Arc;

use super::cursor::State;
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
/// # Through tokio's traits
/// As with `tokio::fs::File`, a write through `AsyncWrite` is reported
/// written once its bytes are copied, and is carried out in the
/// background: the next write, flush or seek through the traits waits for
/// it, and so does every method here (`read_at` sees it, `set_len` comes
/// after it). Its error comes back from the next write, [`flush`], shutdown,
/// [`File::sync_all`] or [`File::sync_data`] (tokio's `sync_all` reports
/// only the `fsync`).
///
/// Dropping a `File` loses no write already reported as written: the last
/// one is carried out by its own task on the worker, and even if the
/// runtime stops first, it is written as the task is dropped. Its error
/// then has nobody to go to: call [`flush`] or `sync_all` before dropping
/// the file to see it. A read ahead is never lost either: the cursor is
/// where the caller stopped, whatever was read ahead of it, so a seek,
/// a write or [`File::read_to_end`] after a small read goes on from there.
///
/// A file opened with [`OpenOptions::append`] writes at its end; after such
/// a write through the traits the cursor is at the end. `File::from_std`
/// cannot tell that a file was opened for appending, and keeps counting
/// from its cursor.
///
/// [`flush`]: https://docs.rs/tokio/latest/tokio/io/trait.AsyncWriteExt.html#method.flush
///
/// Dropping a `File` closes it once no operation holds it any more.
pub struct File {
    pub(super) file: SharedFile,
    pub(super) path: Arc<Path>,
    /// The caller's position for the cursor-based reads and writes; bytes
    /// read ahead of it wait in `cursor`.
    pub(super) pos: Cell<u64>,
    /// Opened with `O_APPEND`: the kernel writes at the end (read by the
    /// traits' writes only).
    #[cfg_attr(not(feature = "tokio-io"), allow(dead_code))]
    pub(super) append: bool,
    /// What the tokio traits left: bytes read ahead, the operation in
    /// flight, a write's error.
    pub(super) cursor: RefCell<State>,
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File")
            .field("fd", &self.file.as_raw_fd())
            .field("path", &self.path)
            .field("pos", &self.pos.get())
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
        Ok(File::wrap(file, path.into(), options.append))
    }

    pub(super) fn wrap(file: std::fs::File, path: Arc<Path>, append: bool) -> File {
        File { file: Arc::new(file), path, pos: Cell::new(0), append, cursor: RefCell::default() }
    }

    /// Wraps a file opened by the standard library; the cursor starts at
    /// the file's own position (as tokio's does: bytes written through std
    /// before are not written over), or at 0 where it has none (a pipe).
    pub fn from_std(file: std::fs::File) -> File {
        use std::io::Seek;
        let pos = (&file).stream_position().unwrap_or(0);
        let file = File::wrap(file, Path::new("<file>").into(), false);
        file.pos.set(pos);
        file
    }

    /// The standard library's file, once every operation started through
    /// the traits has finished (the error of a write through them is then
    /// lost: flush first to see it). Its own position is set to this
    /// file's cursor, so reading or writing on with it goes on where this
    /// file stopped.
    ///
    /// While an operation whose future was dropped still holds the file on
    /// the ring, the file returned is a duplicate of its descriptor.
    pub async fn into_std(self) -> std::fs::File {
        self.settle().await;
        let pos = self.pos.get();
        let mut shared = self.file;
        let std = loop {
            match Arc::try_unwrap(shared) {
                Ok(file) => break file,
                Err(held) => match held.try_clone() {
                    Ok(dup) => break dup,
                    // Out of descriptors: wait for the last holder instead
                    // (a cancelled operation lets go at its completion).
                    Err(_) => {
                        shared = held;
                        crate::time::sleep(std::time::Duration::from_millis(1)).await;
                    }
                },
            }
        };
        // A file that cannot seek (a pipe) has no position to set.
        let _ = (&std).seek(SeekFrom::Start(pos));
        std
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
        self.settle().await;
        let (res, buf) = ops::read_at(&self.file, buf, offset).await;
        (res.map_err(|e| with_path("read", &self.path, e)), buf)
    }

    /// Writes the initialised bytes of `buf` at `offset`; may write fewer.
    /// The file's cursor does not move.
    pub async fn write_at<B: IoBuf>(&self, buf: B, offset: u64) -> BufResult<usize, B> {
        self.settle().await;
        // What was read ahead may be what this write changes.
        self.cursor.borrow_mut().forget_read_ahead();
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
    pub async fn read_to_end(&mut self, mut buf: Vec<u8>) -> BufResult<usize, Vec<u8>> {
        self.settle().await;
        // Bytes read ahead through the traits come first.
        let ahead = {
            let mut st = self.cursor.borrow_mut();
            buf.extend_from_slice(&st.buf[st.start..]);
            let n = st.unread();
            st.forget_read_ahead();
            n
        };
        self.pos.set(self.pos.get() + ahead as u64);
        let (res, buf) = ops::read_to_end(&self.file, buf, self.pos.get()).await;
        match res {
            Ok(n) => {
                self.pos.set(self.pos.get() + n as u64);
                (Ok(ahead + n), buf)
            }
            Err(e) => (Err(with_path("read", &self.path, e)), buf),
        }
    }

    /// Flushes the file's data and metadata to the device (`fsync`), after
    /// the writes made through the traits; if one of them failed, that is
    /// the error.
    pub async fn sync_all(&self) -> io::Result<()> {
        self.settle().await;
        if let Some(e) = self.take_write_err() {
            return Err(e);
        }
        ops::sync(&self.file, false).await.map_err(|e| with_path("fsync", &self.path, e))
    }

    /// Flushes the file's data to the device (`fdatasync`), after the
    /// writes made through the traits; if one of them failed, that is the
    /// error.
    pub async fn sync_data(&self) -> io::Result<()> {
        self.settle().await;
        if let Some(e) = self.take_write_err() {
            return Err(e);
        }
        ops::sync(&self.file, true).await.map_err(|e| with_path("fdatasync", &self.path, e))
    }

    /// The file's metadata (`statx`), with the writes made through the
    /// traits done.
    pub async fn metadata(&self) -> io::Result<Metadata> {
        self.settle().await;
        ops::metadata_file(&self.file).await.map_err(|e| with_path("stat", &self.path, e))
    }

    /// Truncates or extends the file to `len` bytes (`ftruncate`), after the
    /// writes made through the traits; the cursor does not move.
    pub async fn set_len(&self, len: u64) -> io::Result<()> {
        self.settle().await;
        self.cursor.borrow_mut().forget_read_ahead();
        ops::set_len(&self.file, len).await.map_err(|e| with_path("truncate", &self.path, e))
    }
}

impl From<std::fs::File> for File {
    fn from(file: std::fs::File) -> File {
        File::from_std(file)
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
