//! Each file operation on the current worker: a ring operation on
//! io_uring where the kernel has its opcode, else a job on the blocking
//! pool. Errors here are bare; the public functions add the path.

use std::any::Any;
use std::ffi::CString;
use std::fs::File as StdFile;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use super::error::{not_on_worker, nul_in_path};
use super::{Metadata, OpenOptions};
use crate::buf::{self, BufResult, IoBuf, IoBufMut};
use crate::driver::{FileOp, FileRing};
use crate::runtime::current;

/// A file shared by its handle and the operations in flight on it.
pub(crate) type SharedFile = Arc<StdFile>;

/// The worker's io_uring driver, for one file operation on its ring: it
/// holds the worker's paused clock until the operation's future returns or
/// is dropped (`time/paused.rs`), as a blocking-pool job does on epoll.
struct Ring {
    driver: Rc<FileRing>,
    _held: Option<current::PausedClockHold>,
}

impl std::ops::Deref for Ring {
    type Target = Rc<FileRing>;

    fn deref(&self) -> &Rc<FileRing> {
        &self.driver
    }
}

/// The worker's io_uring driver if `op` runs on its ring; `Ok(None)` sends
/// it to the blocking pool.
fn ring(op: FileOp) -> io::Result<Option<Ring>> {
    let driver = current::try_with_driver(|d| d.ring_for(op).cloned()).ok_or_else(not_on_worker)?;
    Ok(driver.map(|driver| Ring { driver, _held: current::hold_paused_clock() }))
}

/// True when `op` runs on this worker's ring.
pub(super) fn on_ring(op: FileOp) -> bool {
    current::try_with_driver(|d| d.ring_for(op).is_some()).unwrap_or(false)
}

/// Runs `f` on the blocking pool.
async fn blocking<R: Send + 'static>(
    f: impl FnOnce() -> io::Result<R> + Send + 'static,
) -> io::Result<R> {
    let handle = current::try_spawn_blocking(f).ok_or_else(not_on_worker)?;
    match handle.await {
        Ok(r) => r,
        Err(e) => Err(io::Error::other(format!("the blocking pool dropped the job: {e}"))),
    }
}

/// `path` as a C string.
pub(super) fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| nul_in_path())
}

pub(super) async fn open(path: &Path, options: &OpenOptions) -> io::Result<StdFile> {
    let flags = options.flags()?;
    if let Some(ring) = ring(FileOp::Open)? {
        let fd = ring.open(c_path(path)?, flags, options.mode).await?;
        return Ok(StdFile::from(fd));
    }
    let (path, options) = (path.to_path_buf(), options.to_std());
    blocking(move || options.open(path)).await
}

pub(super) async fn open_beneath(
    dir: &SharedFile,
    path: &Path,
    options: &OpenOptions,
) -> io::Result<StdFile> {
    let flags = options.flags()?;
    // `openat2` refuses a mode without a file to create.
    let mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 { options.mode } else { 0 };
    if let Some(ring) = ring(FileOp::OpenBeneath)? {
        let fd = ring.open_beneath(dir, c_path(path)?, flags, mode).await?;
        return Ok(StdFile::from(fd));
    }
    let (dir, path) = (dir.clone(), c_path(path)?);
    blocking(move || {
        use std::os::fd::AsRawFd;
        crate::sys::open_beneath(dir.as_raw_fd(), &path, flags, mode).map(StdFile::from)
    })
    .await
}

/// Where `path` (relative, below `dir`) leads with every symbolic link
/// followed, as a path below `dir` without links, `.` or `..` (`.` for
/// `dir` itself); `None` if it leads outside `dir`, or cannot be
/// resolved. Both are resolved through `/proc/self/fd`, so the directory
/// is the one `dir` holds, however it was named when opened. Only a
/// where: the caller opens the answer beneath `dir` again, and the kernel
/// checks that open, so a link changed meanwhile leads nowhere else.
pub(super) async fn resolve_beneath(dir: &SharedFile, path: &Path) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    let (dir, path) = (dir.clone(), path.to_path_buf());
    blocking(move || {
        let named = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
        let root = std::fs::canonicalize(&named)?;
        let real = std::fs::canonicalize(named.join(&path))?;
        match real.strip_prefix(&root) {
            Ok(rest) if rest.as_os_str().is_empty() => Ok(Some(PathBuf::from("."))),
            Ok(rest) => Ok(Some(rest.to_path_buf())),
            Err(_) => Ok(None),
        }
    })
    .await
    .ok()
    .flatten()
}

/// Moves `buf` into a `Vec` without copying when it is one.
fn as_vec<B: 'static>(buf: B) -> Result<Vec<u8>, B> {
    let boxed: Box<dyn Any> = Box::new(buf);
    match boxed.downcast::<Vec<u8>>() {
        Ok(v) => Ok(*v),
        Err(other) => match other.downcast::<B>() {
            Ok(b) => Err(*b),
            Err(_) => unreachable!("a box made from a `B` holds a `B`"),
        },
    }
}

/// The inverse of [`as_vec`]: only called when `B` is `Vec<u8>`.
fn from_vec<B: 'static>(v: Vec<u8>) -> B {
    match (Box::new(v) as Box<dyn Any>).downcast::<B>() {
        Ok(b) => *b,
        Err(_) => unreachable!("`as_vec` succeeded, so `B` is `Vec<u8>`"),
    }
}

/// `pread`, or on a file that cannot seek (a pipe, a FIFO, a terminal:
/// `ESPIPE`) a plain `read`, since io_uring ignores the offset there too:
/// such a file reads alike on both drivers.
fn pread(file: &StdFile, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    match file.read_at(buf, offset) {
        Err(e) if e.raw_os_error() == Some(libc::ESPIPE) => {
            let mut stream = file;
            stream.read(buf)
        }
        res => res,
    }
}

/// `pwrite`, or on a file that cannot seek a plain `write` (see [`pread`]).
fn pwrite(file: &StdFile, buf: &[u8], offset: u64) -> io::Result<usize> {
    match file.write_at(buf, offset) {
        Err(e) if e.raw_os_error() == Some(libc::ESPIPE) => {
            let mut stream = file;
            stream.write(buf)
        }
        res => res,
    }
}

/// `pread` into a fresh zeroed `Vec` of `cap` bytes (or `vec`'s room).
fn pread_vec(file: &StdFile, mut vec: Vec<u8>, offset: u64) -> (io::Result<usize>, Vec<u8>) {
    let cap = vec.capacity();
    vec.clear();
    vec.resize(cap, 0);
    let res = loop {
        match pread(file, &mut vec, offset) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => break r,
        }
    };
    vec.truncate(*res.as_ref().unwrap_or(&0));
    (res, vec)
}

pub(super) async fn read_at<B: IoBufMut>(
    file: &SharedFile,
    mut buf: B,
    offset: u64,
) -> BufResult<usize, B> {
    match ring(FileOp::Read) {
        Ok(Some(ring)) => return ring.read_at(file, buf, offset).await,
        Ok(None) => {}
        Err(e) => return (Err(e), buf),
    }
    let file = file.clone();
    // A `Vec` goes to the pool and back; another buffer (not `Send`) is
    // filled from a copy.
    match as_vec(buf) {
        Ok(vec) => {
            let job = blocking(move || Ok(pread_vec(&file, vec, offset)));
            match job.await {
                Ok((res, vec)) => (res, from_vec(vec)),
                Err(e) => (Err(e), from_vec(Vec::new())),
            }
        }
        Err(b) => {
            buf = b;
            let cap = buf.bytes_total();
            let job = blocking(move || {
                let (res, vec) = pread_vec(&file, Vec::with_capacity(cap), offset);
                res.map(|_| vec)
            });
            match job.await {
                Ok(vec) => {
                    let n = buf::fill(&mut buf, &vec);
                    (Ok(n), buf)
                }
                Err(e) => (Err(e), buf),
            }
        }
    }
}

pub(super) async fn write_at<B: IoBuf>(
    file: &SharedFile,
    buf: B,
    offset: u64,
) -> BufResult<usize, B> {
    match ring(FileOp::Write) {
        Ok(Some(ring)) => return ring.write_at(file, buf, offset).await,
        Ok(None) => {}
        Err(e) => return (Err(e), buf),
    }
    let file = file.clone();
    let bytes = buf::init_bytes(&buf).to_vec();
    let res = blocking(move || loop {
        match pwrite(&file, &bytes, offset) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => break r,
        }
    })
    .await;
    (res, buf)
}

pub(super) async fn metadata_file(file: &SharedFile) -> io::Result<Metadata> {
    if let Some(ring) = ring(FileOp::Statx)? {
        return Ok(Metadata::from_statx(&ring.statx_file(file).await?));
    }
    let file = file.clone();
    blocking(move || file.metadata().map(|m| Metadata::from_std(&m))).await
}

pub(super) async fn metadata_path(path: &Path, follow: bool) -> io::Result<Metadata> {
    if let Some(ring) = ring(FileOp::Statx)? {
        return Ok(Metadata::from_statx(&ring.statx_path(c_path(path)?, follow).await?));
    }
    let path = path.to_path_buf();
    blocking(move || {
        let m = if follow { std::fs::metadata(path) } else { std::fs::symlink_metadata(path) };
        m.map(|m| Metadata::from_std(&m))
    })
    .await
}

pub(super) async fn sync(file: &SharedFile, data_only: bool) -> io::Result<()> {
    if let Some(ring) = ring(FileOp::Fsync)? {
        return ring.fsync(file, data_only).await;
    }
    let file = file.clone();
    blocking(move || if data_only { file.sync_data() } else { file.sync_all() }).await
}

pub(super) async fn set_len(file: &SharedFile, len: u64) -> io::Result<()> {
    if let Some(ring) = ring(FileOp::Ftruncate)? {
        return ring.ftruncate(file, len).await;
    }
    let file = file.clone();
    blocking(move || file.set_len(len)).await
}

pub(super) async fn rename(from: &Path, to: &Path) -> io::Result<()> {
    if let Some(ring) = ring(FileOp::Rename)? {
        return ring.rename(c_path(from)?, c_path(to)?).await;
    }
    let (from, to) = (from.to_path_buf(), to.to_path_buf());
    blocking(move || std::fs::rename(from, to)).await
}

/// Removes a file, or an empty directory with `dir`.
pub(super) async fn remove(path: &Path, dir: bool) -> io::Result<()> {
    if let Some(ring) = ring(FileOp::Unlink)? {
        return ring.unlink(c_path(path)?, dir).await;
    }
    let path = path.to_path_buf();
    blocking(move || if dir { std::fs::remove_dir(path) } else { std::fs::remove_file(path) }).await
}

pub(super) async fn mkdir(path: &Path, mode: u32) -> io::Result<()> {
    if let Some(ring) = ring(FileOp::Mkdir)? {
        return ring.mkdir(c_path(path)?, mode).await;
    }
    let path = path.to_path_buf();
    blocking(move || std::fs::DirBuilder::new().mode(mode).create(path)).await
}

/// Reads from `offset` to the end of the file, appending to `vec`.
pub(super) async fn read_to_end(
    file: &SharedFile,
    mut vec: Vec<u8>,
    mut offset: u64,
) -> BufResult<usize, Vec<u8>> {
    let start = vec.len();
    match ring(FileOp::Read) {
        Ok(Some(ring)) => loop {
            if vec.capacity() - vec.len() < READ_CHUNK_MIN {
                vec.reserve(vec.capacity().max(READ_CHUNK_FIRST));
            }
            let (res, tail) = ring.read_at(file, buf::Tail(vec), offset).await;
            vec = tail.0;
            match res {
                Ok(0) => return (Ok(vec.len() - start), vec),
                Ok(n) => offset += n as u64,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return (Err(e), vec),
            }
        },
        Ok(None) => {}
        Err(e) => return (Err(e), vec),
    }
    let file = file.clone();
    let job = blocking(move || {
        let mut chunk = vec![0u8; READ_CHUNK_FIRST];
        let res = loop {
            match pread(&file, &mut chunk, offset) {
                Ok(0) => break Ok(vec.len() - start),
                Ok(n) => {
                    vec.extend_from_slice(&chunk[..n]);
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        Ok((res, vec))
    });
    match job.await {
        Ok((res, vec)) => (res, vec),
        Err(e) => (Err(e), Vec::new()),
    }
}

/// The first read of a file of unknown size asks for this many bytes.
const READ_CHUNK_FIRST: usize = 16 * 1024;
/// A read asks for at least this much room (else the buffer grows first).
const READ_CHUNK_MIN: usize = 4096;
