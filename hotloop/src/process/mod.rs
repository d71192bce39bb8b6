//! Child processes, as `tokio::process` has them: [`Command`] builds and
//! spawns one, [`Child`] waits for it, kills it and holds its piped
//! standard streams.
//!
//! ```no_run
//! use hotloop::process::{Command, Stdio};
//!
//! # hotloop::Runtime::new()?.block_on(async {
//! let out = Command::new("echo").arg("hello").output().await?;
//! assert_eq!(out.stdout, b"hello\n");
//!
//! let mut child = Command::new("cat").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
//! let stdin = child.stdin.take().unwrap();
//! let (res, _) = stdin.write_all_owned(b"ping".to_vec()).await;
//! res?;
//! drop(stdin); // end of input: `cat` exits after echoing it
//! let stdout = child.stdout.take().unwrap();
//! let (n, buf) = stdout.read_owned(Vec::with_capacity(16)).await;
//! assert_eq!((n?, &buf[..]), (4, &b"ping"[..]));
//! assert!(child.wait().await?.success());
//! # Ok::<(), std::io::Error>(())
//! # })?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # Implementation notes
//! - Waiting takes no thread and no signal handler: each child gets a
//!   pidfd (`pidfd_open(2)`, Linux 5.3+), which becomes readable when the
//!   process exits. The worker's driver watches it like a socket (epoll:
//!   registered at the first wait; io_uring: a one-shot `POLL_ADD`), and
//!   the status is then collected with `waitpid` (through
//!   `std::process::Child::try_wait`, which also spawns the process).
//! - Piped streams are Unix stream socket pairs, not pipes, so they are
//!   [`UnixStream`](crate::net::UnixStream)s with everything those have on
//!   both drivers (owned-buffer and pooled reads, tokio's and futures' I/O
//!   traits): io_uring's receive operations need a socket. The child sees
//!   a socket on its descriptor; programs that read and write their
//!   standard streams do not tell the difference, but one that opens
//!   `/dev/stdout` (or `/dev/stdin`, `/dev/stderr`, `/proc/self/fd/N`) gets
//!   `ENXIO`, where tokio's pipes let it (`sh -c 'echo x >/dev/stderr'`):
//!   pass such a program a file or an inherited stream. Writing to a child that
//!   has exited fails with `BrokenPipe` and never raises `SIGPIPE`.
//! - A dropped [`Child`] whose process still runs is not left a zombie:
//!   on a worker's thread, a task waits for it and reaps it; dropped
//!   anywhere else (outside a worker, on `block_on`'s context), or with
//!   that task when its runtime is dropped, it goes to a process-wide
//!   list that one thread, alive only while the list holds a child, reaps
//!   (`orphans.rs`). With [`Command::kill_on_drop`] it is sent `SIGKILL`
//!   first.
//! - The piped input's last bytes, which on io_uring may still be in user
//!   space (written behind), reach the child before `wait` and
//!   `wait_with_output` close it.

mod child;
mod orphans;

use std::ffi::OsStr;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

pub use child::{Child, ChildStderr, ChildStdin, ChildStdout};
pub use std::process::{ExitStatus, Output};

/// What a child's standard stream is connected to.
#[derive(Debug)]
pub struct Stdio(StdioKind);

#[derive(Debug)]
enum StdioKind {
    Inherit,
    Null,
    Piped,
    Fd(OwnedFd),
}

impl Stdio {
    /// A new stream to the parent: the matching field of [`Child`]
    /// (`stdin`, `stdout`, `stderr`) holds its end.
    pub fn piped() -> Stdio {
        Stdio(StdioKind::Piped)
    }

    /// The parent's own stream.
    pub fn inherit() -> Stdio {
        Stdio(StdioKind::Inherit)
    }

    /// `/dev/null`.
    pub fn null() -> Stdio {
        Stdio(StdioKind::Null)
    }
}

impl From<OwnedFd> for Stdio {
    fn from(fd: OwnedFd) -> Stdio {
        Stdio(StdioKind::Fd(fd))
    }
}

impl From<std::fs::File> for Stdio {
    fn from(file: std::fs::File) -> Stdio {
        Stdio(StdioKind::Fd(file.into()))
    }
}

/// A process to spawn: program, arguments, environment, working
/// directory and standard streams, as `std::process::Command` (which it
/// wraps) and `tokio::process::Command` have them.
#[derive(Debug)]
pub struct Command {
    std: std::process::Command,
    stdin: Option<Stdio>,
    stdout: Option<Stdio>,
    stderr: Option<Stdio>,
    kill_on_drop: bool,
}

impl Command {
    /// A command that runs `program` (looked up on `PATH` if it has no `/`).
    pub fn new(program: impl AsRef<OsStr>) -> Command {
        Command {
            std: std::process::Command::new(program),
            stdin: None,
            stdout: None,
            stderr: None,
            kill_on_drop: false,
        }
    }

    /// Adds an argument.
    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Command {
        self.std.arg(arg);
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(&mut self, args: I) -> &mut Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.std.args(args);
        self
    }

    /// Sets an environment variable for the child.
    pub fn env(&mut self, key: impl AsRef<OsStr>, val: impl AsRef<OsStr>) -> &mut Command {
        self.std.env(key, val);
        self
    }

    /// Sets several environment variables for the child.
    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut Command
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        self.std.envs(vars);
        self
    }

    /// Removes an environment variable from the child's environment.
    pub fn env_remove(&mut self, key: impl AsRef<OsStr>) -> &mut Command {
        self.std.env_remove(key);
        self
    }

    /// Starts the child with an empty environment (plus what `env` adds).
    pub fn env_clear(&mut self) -> &mut Command {
        self.std.env_clear();
        self
    }

    /// The child's working directory.
    pub fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut Command {
        self.std.current_dir(dir);
        self
    }

    /// The child's standard input (default: inherited; `null` for `output`).
    pub fn stdin(&mut self, cfg: impl Into<Stdio>) -> &mut Command {
        self.stdin = Some(cfg.into());
        self
    }

    /// The child's standard output (default: inherited; piped for `output`).
    pub fn stdout(&mut self, cfg: impl Into<Stdio>) -> &mut Command {
        self.stdout = Some(cfg.into());
        self
    }

    /// The child's standard error (default: inherited; piped for `output`).
    pub fn stderr(&mut self, cfg: impl Into<Stdio>) -> &mut Command {
        self.stderr = Some(cfg.into());
        self
    }

    /// Sends the child `SIGKILL` when its [`Child`] is dropped before the
    /// process exited (default: off, the process keeps running).
    pub fn kill_on_drop(&mut self, kill: bool) -> &mut Command {
        self.kill_on_drop = kill;
        self
    }

    /// The wrapped `std::process::Command`, for what this builder does
    /// not offer (`std::os::unix::process::CommandExt`: `uid`, `gid`,
    /// `process_group`, `pre_exec`).
    pub fn as_std_mut(&mut self) -> &mut std::process::Command {
        &mut self.std
    }

    /// Starts the process on the current worker. The `Stdio` settings are
    /// used up: a second spawn inherits the streams not set again.
    ///
    /// A program that cannot be found fails with `ErrorKind::NotFound`,
    /// and the error names it. Outside a hotloop worker (whose driver
    /// waits for the child) it fails before starting anything.
    pub fn spawn(&mut self) -> io::Result<Child> {
        let (stdin, stdout, stderr) = (self.stdin.take(), self.stdout.take(), self.stderr.take());
        self.spawn_with(stdin, stdout, stderr)
    }

    fn spawn_with(
        &mut self,
        stdin: Option<Stdio>,
        stdout: Option<Stdio>,
        stderr: Option<Stdio>,
    ) -> io::Result<Child> {
        if !crate::runtime::current::on_worker() {
            return Err(io::Error::other(
                "hotloop::process::Command::spawn must be called on a hotloop worker \
                 (inside Runtime::block_on or a task spawned there)",
            ));
        }
        let (stdin_set, stdout_set, stderr_set) =
            (stdin.is_some(), stdout.is_some(), stderr.is_some());
        let connected = (|| {
            let stdin = child::connect(stdin, &mut self.std, child::Stream::In)?;
            let stdout = child::connect(stdout, &mut self.std, child::Stream::Out)?;
            let stderr = child::connect(stderr, &mut self.std, child::Stream::Err)?;
            Ok::<_, io::Error>((stdin, stdout, stderr))
        })();
        let spawned = match &connected {
            Ok(_) => self.std.spawn().map_err(|e| self.spawn_error(e)),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        };
        // The command lets go of the child's ends of the pipes, spawned or
        // not, so no descriptor stays behind in it.
        for (set, which) in [
            (stdin_set, child::Stream::In),
            (stdout_set, child::Stream::Out),
            (stderr_set, child::Stream::Err),
        ] {
            if set {
                child::release(&mut self.std, which);
            }
        }
        let (stdin, stdout, stderr) = connected?;
        Child::new(spawned?, stdin, stdout, stderr, self.kill_on_drop)
    }

    /// Says which program could not be started, and what to check.
    fn spawn_error(&self, e: io::Error) -> io::Error {
        let program = Path::new(self.std.get_program()).display();
        let hint = match e.kind() {
            io::ErrorKind::NotFound => " (is it installed, and on PATH?)",
            io::ErrorKind::PermissionDenied => " (is it executable?)",
            _ => "",
        };
        io::Error::new(e.kind(), format!("cannot run `{program}`: {e}{hint}"))
    }

    /// Runs the process to its end and returns its exit status; its
    /// standard streams are inherited unless set. Streams set to piped are
    /// closed on the parent's side before the wait (as tokio's and std's
    /// `status`): nothing reads them, and a child writing more than a pipe
    /// holds would otherwise block on it for good.
    pub async fn status(&mut self) -> io::Result<ExitStatus> {
        let mut child = self.spawn()?;
        drop(child.stdout.take());
        drop(child.stderr.take());
        // The input, if piped, is closed by the wait.
        child.wait().await
    }

    /// Runs the process to its end with its output and error streams piped
    /// (unless set otherwise) and its input from `/dev/null` (unless set),
    /// and returns everything it wrote.
    pub async fn output(&mut self) -> io::Result<Output> {
        let stdin = self.stdin.take().unwrap_or_else(Stdio::null);
        let stdout = self.stdout.take().unwrap_or_else(Stdio::piped);
        let stderr = self.stderr.take().unwrap_or_else(Stdio::piped);
        self.spawn_with(Some(stdin), Some(stdout), Some(stderr))?.wait_with_output().await
    }
}
