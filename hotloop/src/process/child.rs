//! A spawned child: its pidfd on the worker's driver, its piped streams,
//! waiting, killing, and reaping when dropped.

use std::future::Future;
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::process::{ExitStatus, Output};
use std::task::{Context as TaskContext, Poll};

use super::{orphans, Stdio, StdioKind};
use crate::driver::ReadinessSource;
use crate::net::UnixStream;
use crate::runtime::current;

/// The parent's end of a child's piped standard input: a Unix stream
/// socket (see the module notes). Dropping it (or shutting down its write
/// side) ends the child's input.
pub type ChildStdin = UnixStream;
/// The parent's end of a child's piped standard output.
pub type ChildStdout = UnixStream;
/// The parent's end of a child's piped standard error.
pub type ChildStderr = UnixStream;

/// Which of the child's standard streams.
#[derive(Clone, Copy)]
pub(super) enum Stream {
    In,
    Out,
    Err,
}

/// Sets `which` of `cmd` as `cfg` says; returns the parent's end of a pipe.
pub(super) fn connect(
    cfg: Option<Stdio>,
    cmd: &mut std::process::Command,
    which: Stream,
) -> io::Result<Option<UnixStream>> {
    let Some(Stdio(kind)) = cfg else { return Ok(None) };
    let (theirs, ours) = match kind {
        StdioKind::Inherit => (std::process::Stdio::inherit(), None),
        StdioKind::Null => (std::process::Stdio::null(), None),
        StdioKind::Fd(fd) => (std::process::Stdio::from(fd), None),
        StdioKind::Piped => {
            // Close-on-exec, and blocking: the child's end stays as programs expect.
            let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
            let ours = UnixStream::from_own_fd(OwnedFd::from(ours))?;
            (std::process::Stdio::from(OwnedFd::from(theirs)), Some(ours))
        }
    };
    set(cmd, which, theirs);
    Ok(ours)
}

fn set(cmd: &mut std::process::Command, which: Stream, stdio: std::process::Stdio) {
    match which {
        Stream::In => cmd.stdin(stdio),
        Stream::Out => cmd.stdout(stdio),
        Stream::Err => cmd.stderr(stdio),
    };
}

/// Puts a stream that was set back to inherited, so the command no
/// longer holds the child's end of a pipe (the parent would never see
/// the end of the child's output while it does).
pub(super) fn release(cmd: &mut std::process::Command, which: Stream) {
    set(cmd, which, std::process::Stdio::inherit());
}

/// A running (or exited, not yet waited for) child process, as tokio's
/// `Child`.
///
/// Dropping it leaves the process running (unless the command set
/// [`kill_on_drop`](super::Command::kill_on_drop)), and it is reaped once
/// it exits: by a task on this worker, or, where none runs for as long as
/// the process may (outside a worker, on `block_on`'s context, as the
/// runtime is dropped), by a process-wide reaper thread.
#[derive(Debug)]
pub struct Child {
    /// The parent's end of the child's input, if it was piped.
    pub stdin: Option<ChildStdin>,
    /// The parent's end of the child's output, if it was piped.
    pub stdout: Option<ChildStdout>,
    /// The parent's end of the child's error stream, if it was piped.
    pub stderr: Option<ChildStderr>,
    /// Always `Some`, except while being dropped (moved to its reaper).
    process: Option<Process>,
    kill_on_drop: bool,
}

/// The process and the pidfd that says when it exited.
struct Process {
    std: std::process::Child,
    pidfd: ReadinessSource,
    /// Set once the process was reaped.
    status: Option<ExitStatus>,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("pid", &self.std.id())
            .field("status", &self.status)
            .finish()
    }
}

impl Process {
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = self.std.try_wait()?;
        }
        Ok(self.status)
    }

    /// Ready with the exit status once the process has exited (and is reaped).
    fn poll_wait(&mut self, cx: &mut TaskContext<'_>) -> Poll<io::Result<ExitStatus>> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Poll::Ready(Ok(status));
            }
            std::task::ready!(self.pidfd.poll_next_readable(cx))?;
        }
    }
}

impl Child {
    pub(super) fn new(
        mut std: std::process::Child,
        stdin: Option<UnixStream>,
        stdout: Option<UnixStream>,
        stderr: Option<UnixStream>,
        kill_on_drop: bool,
    ) -> io::Result<Child> {
        // The pid cannot be reused before this process reaps it, so the
        // pidfd names this child.
        let pidfd = match crate::sys::pidfd_open(std.id())
            .and_then(|fd| current::with_driver(|d| ReadinessSource::new(d, fd)))
        {
            Ok(src) => src,
            Err(e) => {
                let _ = std.kill();
                let _ = std.wait();
                return Err(io::Error::new(
                    e.kind(),
                    format!("pidfd_open failed ({e}); hotloop::process needs Linux 5.3 or later"),
                ));
            }
        };
        Ok(Child {
            stdin,
            stdout,
            stderr,
            process: Some(Process { std, pidfd, status: None }),
            kill_on_drop,
        })
    }

    fn process(&mut self) -> &mut Process {
        self.process.as_mut().expect("a child's process is there until it is dropped")
    }

    /// The process id, until the process has been waited for (then
    /// `None`, as the id may name another process by now).
    pub fn id(&self) -> Option<u32> {
        let p = self.process.as_ref()?;
        p.status.is_none().then(|| p.std.id())
    }

    /// Waits for the process to exit and returns its status. Closes the
    /// child's piped input first, once every byte written to it is in
    /// the kernel, so a child that reads to its end gets all of it and is
    /// not left waiting for more. Cancel-safe: the input stays in `stdin`
    /// until it is closed.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        std::future::poll_fn(|cx| {
            self.poll_close_stdin(cx);
            let status = std::task::ready!(self.process().poll_wait(cx));
            // A child that exits without reading its input to the end
            // does not keep the wait going.
            self.stdin = None;
            Poll::Ready(status)
        })
        .await
    }

    /// Closes the piped input once every byte written to it is in the
    /// kernel. On io_uring the last write may still be in user space
    /// (written behind, `driver/uring/write_behind.rs`): it goes out
    /// before the end of input. The flush fails only if the child closed
    /// its input (`EPIPE`), which a wait does not report.
    fn poll_close_stdin(&mut self, cx: &mut TaskContext<'_>) {
        if self.stdin.as_ref().is_some_and(|s| s.poll_flush_writes(cx).is_ready()) {
            self.stdin = None;
        }
    }

    /// The exit status if the process has exited; never waits.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.process().try_wait()
    }

    /// Sends `SIGKILL` without waiting for the process to end. Does
    /// nothing if it was already waited for.
    pub fn start_kill(&mut self) -> io::Result<()> {
        let p = self.process();
        if p.status.is_some() {
            return Ok(());
        }
        p.std.kill()
    }

    /// Sends `SIGKILL` and waits for the process to end.
    pub async fn kill(&mut self) -> io::Result<()> {
        self.start_kill()?;
        self.wait().await.map(drop)
    }

    /// Reads the child's piped output and error streams to their ends
    /// while waiting for it to exit, and returns them with its status.
    /// Streams that were not piped come back empty.
    pub async fn wait_with_output(mut self) -> io::Result<Output> {
        // The input is flushed and closed, and both output streams read,
        // at once: a child that fills one stream while the parent reads
        // only the other, or that writes as it reads its input, would
        // never finish.
        let mut stdout = collect(self.stdout.take());
        let mut stderr = collect(self.stderr.take());
        std::future::poll_fn(|cx| {
            self.poll_close_stdin(cx);
            let (out, err) = (stdout.poll(cx)?, stderr.poll(cx)?);
            if out.is_ready() && err.is_ready() {
                Poll::Ready(Ok::<_, io::Error>(()))
            } else {
                Poll::Pending
            }
        })
        .await?;
        let status = self.wait().await?;
        Ok(Output { status, stdout: stdout.into_bytes(), stderr: stderr.into_bytes() })
    }
}

/// One output stream read to its end, for `wait_with_output`.
enum Collect<F> {
    Reading(Pin<Box<F>>),
    Done(Vec<u8>),
}

impl<F: Future<Output = io::Result<Vec<u8>>>> Collect<F> {
    /// Ready (once the bytes are kept) when the stream has ended.
    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        if let Collect::Reading(read) = self {
            let bytes = std::task::ready!(read.as_mut().poll(cx))?;
            *self = Collect::Done(bytes);
        }
        Poll::Ready(Ok(()))
    }

    /// The bytes, once done (nothing if the read did not end).
    fn into_bytes(self) -> Vec<u8> {
        match self {
            Collect::Done(bytes) => bytes,
            Collect::Reading(_) => Vec::new(),
        }
    }
}

/// Reads `stream` to its end; a stream that was not piped is empty.
fn collect(stream: Option<UnixStream>) -> Collect<impl Future<Output = io::Result<Vec<u8>>>> {
    match stream {
        Some(s) => Collect::Reading(Box::pin(read_to_end(s))),
        None => Collect::Done(Vec::new()),
    }
}

/// Everything `stream` gives until its end.
async fn read_to_end(stream: UnixStream) -> io::Result<Vec<u8>> {
    const CHUNK_BYTES: usize = 16 * 1024;
    let mut out = Vec::new();
    let mut chunk = Vec::with_capacity(CHUNK_BYTES);
    loop {
        let (res, buf) = stream.read_owned(chunk).await;
        match res? {
            0 => return Ok(out),
            _ => out.extend_from_slice(&buf),
        }
        chunk = buf;
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let Some(mut process) = self.process.take() else { return };
        if process.status.is_some() {
            return;
        }
        if self.kill_on_drop {
            let _ = process.std.kill();
        }
        if !matches!(process.try_wait(), Ok(None)) {
            return; // reaped now, or it cannot be
        }
        // Still running: reaped when it exits, so it does not stay a
        // zombie. A worker's loop runs until its runtime is dropped, so a
        // task there waits (and hands the process on if it is dropped
        // first); anywhere else, the process-wide reaper does.
        if current::on_worker_thread() {
            let mut reaping = Reaping(Some(process));
            crate::runtime::spawn_detached(async move {
                let _ = std::future::poll_fn(|cx| reaping.poll(cx)).await;
            });
        } else {
            orphans::adopt(process.std);
        }
    }
}

/// A dropped child's process that a task waits to reap; if the task is
/// dropped first (with its runtime), the process goes to the process-wide
/// reaper.
struct Reaping(Option<Process>);

impl Reaping {
    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Poll<io::Result<ExitStatus>> {
        match &mut self.0 {
            Some(process) => process.poll_wait(cx),
            None => Poll::Ready(Err(io::ErrorKind::NotFound.into())),
        }
    }
}

impl Drop for Reaping {
    fn drop(&mut self) {
        if let Some(process) = self.0.take() {
            if process.status.is_none() {
                orphans::adopt(process.std);
            }
        }
    }
}
