//! Files on the io_uring driver: `OPENAT`, `OPENAT2`, `READ`, `WRITE`, `STATX`,
//! `FSYNC`, `FTRUNCATE`, `RENAMEAT`, `UNLINKAT` and `MKDIRAT` as ring
//! operations, and a file sent on a socket.
//!
//! # Implementation notes
//! - A file operation names no socket of the driver's, so it is submitted
//!   unbound ([`Op::submit_unbound`]): its storage holds the file (an
//!   `Arc<File>` clone) and every path and buffer the entry points at,
//!   until its last completion, as a socket operation's does.
//! - An `OPENAT` whose future was dropped after submission may still open
//!   the file: its completion then carries a descriptor nobody will take.
//!   Its storage is an [`OpenPath`], by which the driver knows to close
//!   that descriptor (`unclaimed.rs`), whether the completion came after
//!   the cancel or before the drop, never taken.
//! - `send_file` is `sendfile(2)` from the worker, as on epoll: an
//!   accepted socket is blocking on io_uring, so it is made non-blocking
//!   while the file is sent (`sys::NonBlockingFor`), and a `POLL_ADD` waits
//!   for room when there is none, or when a call moved fewer bytes than
//!   asked (the socket filled up: retrying at once would move only the
//!   few bytes freed since, one system call each). Nothing else sends on
//!   the socket meanwhile (written-behind bytes are flushed first); an
//!   operation another task starts on it meanwhile gets `EAGAIN` instead
//!   of waiting in the kernel, which every socket operation handles (as on
//!   a socket this side connected, which is non-blocking). The alternative, two `SPLICE` operations per
//!   step (file -> pipe -> socket), is kept behind
//!   `HOTLOOP_URING_SEND_FILE=splice`: io_uring runs every splice on one of
//!   its kernel workers, which cost more CPU per byte than `sendfile`
//!   (BENCHMARKS.md, "Files").
//! - With splice, the kernel moves page references, the bytes never reach
//!   user space either. Pipes come from a small
//!   per-worker pool ([`PIPES_POOLED_MAX`]) and go back only empty: a send
//!   that fails or is dropped with bytes in its pipe closes that pipe
//!   (with its bytes) instead, once no splice holds it ([`Pipe::ends`]).
//!   A splice from the file that returns 0 means
//!   the file ended (it may have shrunk since the caller looked): the send
//!   stops there, short.

use std::ffi::CString;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;

use io_uring::{opcode, types};

use super::op::{is_retry, Op};
use super::shared::SharedFile;
use super::stream::StreamSource;
use super::unclaimed::OpenPath;
use super::Driver;
use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::coop;
use crate::driver::contract::StreamOps;
use crate::driver::probe;
use crate::sys;
use crate::sys::SENDFILE_CHUNK_MAX;

/// The most bytes one `READ` or `WRITE` asks for (as `read(2)` caps them).
const RW_CHUNK_MAX: usize = 0x7fff_f000;
/// The largest file offset (`-1`, that is `u64::MAX`, would mean "the
/// file's position" to the kernel).
const OFFSET_MAX: u64 = i64::MAX as u64;

fn offset_too_large() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "file offset too large")
}

/// The room asked for in a splice pipe: bytes moved per pair of splices.
const PIPE_BYTES: usize = 1024 * 1024;
/// The most empty pipes a worker keeps for later sends.
pub(super) const PIPES_POOLED_MAX: usize = 16;

/// One end of a pipe, shared with the splices that use it.
type PipeEnd = Rc<OwnedFd>;

/// A pipe a splice goes through.
pub(super) struct Pipe {
    rd: PipeEnd,
    wr: PipeEnd,
    /// The pipe's room in bytes.
    size: usize,
}

impl Pipe {
    /// Both ends, for an operation's storage. A splice holds the pipe's
    /// lock while it waits (for room in the socket, say), and closing
    /// either end takes that lock: were the pipe closed while a cancelled
    /// splice still ran, the close would block the worker until the splice
    /// ended, and the cancel (submitted at the worker's next enter) would
    /// never be sent. So the pipe closes only after its last operation.
    fn ends(&self) -> (PipeEnd, PipeEnd) {
        (self.rd.clone(), self.wr.clone())
    }
}

/// `statx` results: the kernel writes the whole struct.
fn boxed_statx() -> Box<MaybeUninit<libc::statx>> {
    Box::new(MaybeUninit::zeroed())
}

impl Driver {
    /// Opens `path` (`openat(AT_FDCWD, path, flags | O_CLOEXEC, mode)`).
    pub(crate) async fn open(
        self: &Rc<Self>,
        path: CString,
        flags: i32,
        mode: u32,
    ) -> io::Result<OwnedFd> {
        let entry = opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr())
            .flags(flags | libc::O_CLOEXEC)
            .mode(mode)
            .build();
        let storage = OpenPath::new(path, None, None);
        // SAFETY: the entry points at the path's heap bytes (NUL-terminated),
        // which the op owns until its last completion.
        let op = unsafe { Op::submit_unbound(self, entry, storage) }.map_err(|(e, _)| e)?;
        let (cqe, _path) = op.await;
        let fd = cqe.result()?;
        // SAFETY: a successful OPENAT returns a new descriptor that only this call owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }

    /// Opens `path` relative to the directory `dir`, refusing (`EXDEV`)
    /// any resolution that leaves it: `..` above it, an absolute path or a
    /// symbolic link pointing out (`openat2` with `RESOLVE_BENEATH`).
    pub(crate) async fn open_beneath(
        self: &Rc<Self>,
        dir: &SharedFile,
        path: CString,
        flags: i32,
        mode: u32,
    ) -> io::Result<OwnedFd> {
        let how = Box::new(
            types::OpenHow::new()
                .flags((flags | libc::O_CLOEXEC) as u64)
                .mode(u64::from(mode))
                .resolve(libc::RESOLVE_BENEATH),
        );
        let entry =
            opcode::OpenAt2::new(types::Fd(dir.as_raw_fd()), path.as_ptr(), &*how as *const _)
                .build();
        let storage = OpenPath::new(path, Some(how), Some(dir.clone()));
        // SAFETY: the entry points at the path's heap bytes and the boxed
        // `open_how`; the op owns both, and the directory, until its last completion.
        let op = unsafe { Op::submit_unbound(self, entry, storage) }.map_err(|(e, _)| e)?;
        let (cqe, _storage) = op.await;
        let fd = cqe.result()?;
        // SAFETY: a successful OPENAT2 returns a new descriptor that only this call owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }

    /// Reads into `buf` (from its start up to its capacity) from `offset`.
    pub(crate) async fn read_at<B: IoBufMut>(
        self: &Rc<Self>,
        file: &SharedFile,
        mut buf: B,
        offset: u64,
    ) -> BufResult<usize, B> {
        if offset > OFFSET_MAX {
            return (Err(offset_too_large()), buf);
        }
        let len = buf.bytes_total().min(RW_CHUNK_MAX) as u32;
        let entry = opcode::Read::new(types::Fd(file.as_raw_fd()), buf.stable_mut_ptr(), len)
            .offset(offset)
            .build();
        // SAFETY: the entry points at `len` writable bytes of `buf`, at a fixed
        // address while it moves; the op owns `buf` and the file until its last completion.
        let op = match unsafe { Op::submit_unbound(self, entry, (buf, file.clone())) } {
            Ok(op) => op,
            Err((e, (buf, _))) => return (Err(e), buf),
        };
        let (cqe, (mut buf, _)) = op.await;
        match cqe.result() {
            Ok(n) => {
                // SAFETY: the kernel wrote `n` bytes at the start of the buffer.
                unsafe { buf.set_init(n as usize) };
                (Ok(n as usize), buf)
            }
            Err(e) => (Err(e), buf),
        }
    }

    /// Writes the initialised bytes of `buf` at `offset`; may write fewer.
    pub(crate) async fn write_at<B: IoBuf>(
        self: &Rc<Self>,
        file: &SharedFile,
        buf: B,
        offset: u64,
    ) -> BufResult<usize, B> {
        if offset > OFFSET_MAX {
            return (Err(offset_too_large()), buf);
        }
        let len = buf.bytes_init().min(RW_CHUNK_MAX) as u32;
        let entry = opcode::Write::new(types::Fd(file.as_raw_fd()), buf.stable_ptr(), len)
            .offset(offset)
            .build();
        // SAFETY: the entry points at `len` initialised bytes of `buf`, at a fixed
        // address while it moves; the op owns `buf` and the file until its last completion.
        let op = match unsafe { Op::submit_unbound(self, entry, (buf, file.clone())) } {
            Ok(op) => op,
            Err((e, (buf, _))) => return (Err(e), buf),
        };
        let (cqe, (buf, _)) = op.await;
        (cqe.result().map(|n| n as usize), buf)
    }

    /// `statx` of an open file.
    pub(crate) async fn statx_file(self: &Rc<Self>, file: &SharedFile) -> io::Result<libc::statx> {
        self.statx(Some(file.clone()), CString::default(), libc::AT_EMPTY_PATH).await
    }

    /// `statx` of a path; `follow` follows a final symbolic link.
    pub(crate) async fn statx_path(
        self: &Rc<Self>,
        path: CString,
        follow: bool,
    ) -> io::Result<libc::statx> {
        let flags = if follow { 0 } else { libc::AT_SYMLINK_NOFOLLOW };
        self.statx(None, path, flags).await
    }

    async fn statx(
        self: &Rc<Self>,
        file: Option<SharedFile>,
        path: CString,
        flags: i32,
    ) -> io::Result<libc::statx> {
        let mut out = boxed_statx();
        let dirfd = file.as_ref().map_or(libc::AT_FDCWD, |f| f.as_raw_fd());
        let entry = opcode::Statx::new(
            types::Fd(dirfd),
            path.as_ptr(),
            out.as_mut_ptr().cast::<types::statx>(),
        )
        .flags(flags)
        .mask(libc::STATX_BASIC_STATS | libc::STATX_BTIME)
        .build();
        // SAFETY: the entry points at the path's heap bytes and the boxed
        // result, both owned by the op until its last completion, as is the file.
        let op =
            unsafe { Op::submit_unbound(self, entry, (out, path, file)) }.map_err(|(e, _)| e)?;
        let (cqe, (out, _, _)) = op.await;
        cqe.result()?;
        // SAFETY: a successful STATX wrote the whole struct (and it started zeroed).
        Ok(unsafe { out.assume_init_read() })
    }

    /// `fsync` (`fdatasync` with `data_only`).
    pub(crate) async fn fsync(
        self: &Rc<Self>,
        file: &SharedFile,
        data_only: bool,
    ) -> io::Result<()> {
        let mut entry = opcode::Fsync::new(types::Fd(file.as_raw_fd()));
        if data_only {
            entry = entry.flags(types::FsyncFlags::DATASYNC);
        }
        // SAFETY: the entry points at no memory; the op holds the file.
        let op =
            unsafe { Op::submit_unbound(self, entry.build(), file.clone()) }.map_err(|(e, _)| e)?;
        op.await.0.result().map(drop)
    }

    /// `ftruncate`.
    pub(crate) async fn ftruncate(self: &Rc<Self>, file: &SharedFile, len: u64) -> io::Result<()> {
        let entry = opcode::Ftruncate::new(types::Fd(file.as_raw_fd()), len).build();
        // SAFETY: the entry points at no memory; the op holds the file.
        let op = unsafe { Op::submit_unbound(self, entry, file.clone()) }.map_err(|(e, _)| e)?;
        op.await.0.result().map(drop)
    }

    /// `renameat(AT_FDCWD, from, AT_FDCWD, to)`.
    pub(crate) async fn rename(self: &Rc<Self>, from: CString, to: CString) -> io::Result<()> {
        let entry = opcode::RenameAt::new(
            types::Fd(libc::AT_FDCWD),
            from.as_ptr(),
            types::Fd(libc::AT_FDCWD),
            to.as_ptr(),
        )
        .build();
        // SAFETY: the entry points at both paths' heap bytes, owned by the op
        // until its last completion.
        let op = unsafe { Op::submit_unbound(self, entry, (from, to)) }.map_err(|(e, _)| e)?;
        op.await.0.result().map(drop)
    }

    /// `unlinkat` of a file, or of an empty directory with `dir`.
    pub(crate) async fn unlink(self: &Rc<Self>, path: CString, dir: bool) -> io::Result<()> {
        let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
        let entry =
            opcode::UnlinkAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr()).flags(flags).build();
        // SAFETY: the entry points at the path's heap bytes, owned by the op.
        let op = unsafe { Op::submit_unbound(self, entry, path) }.map_err(|(e, _)| e)?;
        op.await.0.result().map(drop)
    }

    /// `mkdirat(AT_FDCWD, path, mode)`.
    pub(crate) async fn mkdir(self: &Rc<Self>, path: CString, mode: u32) -> io::Result<()> {
        let entry =
            opcode::MkDirAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr()).mode(mode).build();
        // SAFETY: the entry points at the path's heap bytes, owned by the op.
        let op = unsafe { Op::submit_unbound(self, entry, path) }.map_err(|(e, _)| e)?;
        op.await.0.result().map(drop)
    }

    /// An empty pipe from the pool, or a new one.
    fn take_pipe(&self) -> io::Result<Pipe> {
        if let Some(pipe) = self.pipes.borrow_mut().pop() {
            return Ok(pipe);
        }
        let (rd, wr) = sys::pipe(PIPE_BYTES)?;
        let size = sys::pipe_size(wr.as_raw_fd())?;
        Ok(Pipe { rd: Rc::new(rd), wr: Rc::new(wr), size })
    }

    /// Keeps an empty pipe for the next send.
    fn give_back_pipe(&self, pipe: Pipe) {
        let mut pipes = self.pipes.borrow_mut();
        if pipes.len() < PIPES_POOLED_MAX {
            pipes.push(pipe);
        }
    }
}

impl StreamSource {
    /// Sends up to `len` bytes of `file` from `offset` on this socket,
    /// stopping early at the file's end. Returns the bytes sent, and the
    /// error that stopped it before `len`, if one did.
    pub(super) async fn send_file_from_worker(
        &self,
        file: &SharedFile,
        offset: u64,
        len: u64,
    ) -> (u64, io::Result<()>) {
        // Bytes the poll-form writes accepted go first.
        if let Err(e) = self.flush_written_behind().await {
            return (0, Err(e));
        }
        // `sendfile(2)` from the worker by default; with the `splice`
        // switch, two `SPLICE` operations per step (to measure one against
        // the other), as for a direct socket without a plain descriptor
        // (the system call cannot name it).
        if (self.core.driver.switches.send_file_splice || self.core.fd.raw_fd().is_none())
            && probe::opcode_supported(opcode::Splice::CODE)
        {
            return self.send_file_splice(file, offset, len).await;
        }
        // The stream's own sends are done (flushed above, and owned sends
        // complete before they return), so nothing else sends on the
        // socket while it is non-blocking for this file.
        let _nonblocking = match sys::NonBlockingFor::set(self.fd()) {
            Ok(guard) => guard,
            Err(e) => return (0, Err(e)),
        };
        let mut sent = 0u64;
        while sent < len {
            // A step to a socket with room never waits: each takes a unit
            // of the task's budget, and gives way when none is left (`coop.rs`).
            coop::step().await;
            let want = usize::try_from(len - sent).unwrap_or(usize::MAX).min(SENDFILE_CHUNK_MAX);
            let res = sys::sendfile(self.fd(), file.as_raw_fd(), offset + sent, want);
            let room = match res {
                // The file ended (perhaps shrunk): stop short.
                Ok(0) => break,
                // A short count almost always means the socket is full
                // (nginx reads it so too): the next call waits for room
                // rather than moving the few bytes freed meanwhile. If the
                // file ended instead, the wait ends at once and the next
                // call says so.
                Ok(n) if n < want => {
                    sent += n as u64;
                    false
                }
                Ok(n) => {
                    sent += n as u64;
                    true
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
                Err(e) => return (sent, Err(e)),
            };
            if !room && sent < len {
                if let Err(e) = self.core.poll_events(libc::POLLOUT).await {
                    return (sent, Err(e));
                }
            }
        }
        (sent, Ok(()))
    }

    /// [`StreamSource::send_file`] by `SPLICE` through a pooled pipe.
    async fn send_file_splice(
        &self,
        file: &SharedFile,
        offset: u64,
        len: u64,
    ) -> (u64, io::Result<()>) {
        let pipe = match self.core.driver.take_pipe() {
            Ok(pipe) => pipe,
            Err(e) => return (0, Err(e)),
        };
        let mut sent = 0;
        while sent < len {
            let want = (len - sent).min(pipe.size as u64) as u32;
            let Some(from) = offset.checked_add(sent).and_then(|o| i64::try_from(o).ok()) else {
                return (
                    sent,
                    Err(io::Error::new(io::ErrorKind::InvalidInput, "file offset too large")),
                );
            };
            let entry = opcode::Splice::new(
                types::Fd(file.as_raw_fd()),
                from,
                types::Fd(pipe.wr.as_raw_fd()),
                -1,
                want,
            )
            .build();
            // SAFETY: a splice entry points at no memory; the op holds the file
            // and both ends of the pipe until its last completion.
            let op = match unsafe {
                Op::submit_unbound(&self.core.driver, entry, (file.clone(), pipe.ends()))
            } {
                Ok(op) => op,
                Err((e, _)) => return (sent, Err(e)),
            };
            let filled = match op.await.0.result() {
                // The file ended (perhaps shrunk): stop short.
                Ok(0) => break,
                Ok(n) => n,
                // The pipe is still empty: it can be used again.
                Err(e) => {
                    self.core.driver.give_back_pipe(pipe);
                    return (sent, Err(e));
                }
            };
            let mut left = filled;
            while left > 0 {
                let entry = self.core.fd.entry(|sock| {
                    opcode::Splice::new(types::Fd(pipe.rd.as_raw_fd()), -1, sock, -1, left).build()
                });
                // SAFETY: a splice entry points at no memory; the op holds the
                // socket, and both ends of the pipe in its storage, until its last completion.
                let op = match unsafe { self.core.submit(entry, pipe.ends()) } {
                    Ok(op) => op,
                    Err((e, _)) => return (sent, Err(e)),
                };
                match op.await.0.result() {
                    Ok(0) => return (sent, Err(io::ErrorKind::WriteZero.into())),
                    Ok(n) => {
                        left -= n;
                        sent += u64::from(n);
                    }
                    // A non-blocking socket (one this side connected) with no room.
                    Err(e) if is_retry(&e) => {
                        if let Err(e) = self.core.poll_events(libc::POLLOUT).await {
                            return (sent, Err(e));
                        }
                    }
                    // The pipe keeps what was not sent: it is closed with it.
                    Err(e) => return (sent, Err(e)),
                }
            }
        }
        self.core.driver.give_back_pipe(pipe);
        (sent, Ok(()))
    }
}
