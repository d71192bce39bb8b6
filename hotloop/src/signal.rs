//! Process signals, for tasks and for a blocking `main`.
//!
//! - [`ctrl_c`] completes at the next SIGINT; [`signal`] returns a
//!   [`Signal`] listener whose [`recv`](Signal::recv) completes at each
//!   delivery of one signal, as `tokio::signal` does. Every listener of a
//!   signal sees each delivery, on any worker, any runtime, or no runtime.
//! - [`ShutdownSignals`] waits for the signals a server takes (SIGINT,
//!   SIGTERM, SIGQUIT, SIGHUP, SIGUSR1, SIGUSR2) on a thread that blocks,
//!   such as `main` while the workers serve.
//!
//! Once a signal has a listener, hotloop's handler stays installed for the
//! rest of the process, and the signal's default action (for most,
//! ending the process) no longer runs, even after every listener is gone.
//! SIGKILL and SIGSTOP cannot be caught, and SIGSEGV, SIGBUS, SIGILL and
//! SIGFPE report faults that a handler which returns would raise again:
//! [`signal`] refuses them with an error.
//!
//! # Implementation notes
//!
//! There is one delivery mechanism per process, as signal dispositions are
//! per process:
//!
//! 1. A `sigaction` handler (`SA_RESTART`, installed once per signal, the
//!    first time someone listens; it calls a handler installed before it)
//!    adds one to the signal's delivery counter and writes one byte to a
//!    non-blocking self-pipe. That is all it does: atomics and `write(2)`
//!    are async-signal-safe, wakers and locks are not. It lives in
//!    `sys/signal.rs`, with the crate's other `unsafe` system calls.
//! 2. One thread, `hotloop-signal`, started with the first listener,
//!    blocks in `read(2)` on the pipe. Each time it wakes it compares every
//!    counter with the last value it saw and wakes the wakers parked on the
//!    signals that moved. A task's waker reaches its worker through the
//!    worker's inbox and eventfd, as any cross-thread wake does.
//! 3. A [`Signal`] remembers the counter value it last took. It is ready
//!    when the counter has moved, so deliveries between two `recv` calls
//!    coalesce into one, and each listener counts for itself, so every
//!    listener sees every delivery.
//!
//! Why not the alternatives: a `signalfd` only receives signals blocked in
//! every thread, which a thread started by any library without the mask
//! breaks silently (it takes the signal and runs its default action). Why
//! not the pipe as a readable source in each worker's driver: the pipe is
//! one per process and the drivers are many, and the driver that drains it
//! first would hide the wake-up from the others (epoll reports readiness
//! only if the pipe is still readable when it looks). Signals are rare, so
//! one sleeping thread costs nothing on the hot path.

use std::fmt;
use std::fs::File;
use std::future::poll_fn;
use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use crate::sys;

/// A signal, by number; constructors name the common ones, as
/// `tokio::signal::unix::SignalKind` does.
///
/// `Debug` names the six signals [`ShutdownSignals`] takes (`Interrupt`,
/// `Terminate`, `Quit`, `Hangup`, `User1`, `User2`); `Display` gives the C
/// name (`SIGINT`) or the number.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SignalKind(libc::c_int);

impl SignalKind {
    /// The signal numbered `signum`. Any number is accepted here; [`signal`]
    /// refuses the ones that cannot be listened for.
    pub const fn from_raw(signum: libc::c_int) -> SignalKind {
        SignalKind(signum)
    }

    /// The signal's number.
    pub const fn as_raw_value(&self) -> libc::c_int {
        self.0
    }

    /// SIGINT (Ctrl-C).
    pub const fn interrupt() -> SignalKind {
        SignalKind(libc::SIGINT)
    }

    /// SIGTERM.
    pub const fn terminate() -> SignalKind {
        SignalKind(libc::SIGTERM)
    }

    /// SIGQUIT.
    pub const fn quit() -> SignalKind {
        SignalKind(libc::SIGQUIT)
    }

    /// SIGHUP.
    pub const fn hangup() -> SignalKind {
        SignalKind(libc::SIGHUP)
    }

    /// SIGUSR1.
    pub const fn user_defined1() -> SignalKind {
        SignalKind(libc::SIGUSR1)
    }

    /// SIGUSR2.
    pub const fn user_defined2() -> SignalKind {
        SignalKind(libc::SIGUSR2)
    }

    /// SIGALRM.
    pub const fn alarm() -> SignalKind {
        SignalKind(libc::SIGALRM)
    }

    /// SIGCHLD.
    pub const fn child() -> SignalKind {
        SignalKind(libc::SIGCHLD)
    }

    /// SIGPIPE.
    pub const fn pipe() -> SignalKind {
        SignalKind(libc::SIGPIPE)
    }

    /// SIGWINCH.
    pub const fn window_change() -> SignalKind {
        SignalKind(libc::SIGWINCH)
    }

    /// True for the signals that ask the process to stop (SIGINT, SIGTERM,
    /// SIGQUIT).
    pub fn is_stop(self) -> bool {
        matches!(self.0, libc::SIGINT | libc::SIGTERM | libc::SIGQUIT)
    }

    fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            libc::SIGHUP => "SIGHUP",
            libc::SIGINT => "SIGINT",
            libc::SIGQUIT => "SIGQUIT",
            libc::SIGILL => "SIGILL",
            libc::SIGTRAP => "SIGTRAP",
            libc::SIGABRT => "SIGABRT",
            libc::SIGBUS => "SIGBUS",
            libc::SIGFPE => "SIGFPE",
            libc::SIGKILL => "SIGKILL",
            libc::SIGUSR1 => "SIGUSR1",
            libc::SIGSEGV => "SIGSEGV",
            libc::SIGUSR2 => "SIGUSR2",
            libc::SIGPIPE => "SIGPIPE",
            libc::SIGALRM => "SIGALRM",
            libc::SIGTERM => "SIGTERM",
            libc::SIGCHLD => "SIGCHLD",
            libc::SIGCONT => "SIGCONT",
            libc::SIGSTOP => "SIGSTOP",
            libc::SIGTSTP => "SIGTSTP",
            libc::SIGWINCH => "SIGWINCH",
            _ => return None,
        })
    }

    /// Why this signal cannot be listened for, if it cannot.
    fn refusal(self) -> Option<&'static str> {
        match self.0 {
            libc::SIGKILL | libc::SIGSTOP => {
                Some("the kernel does not let a process catch it")
            }
            libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE => Some(
                "it reports a fault in the thread that raised it, which a handler that returns would raise again",
            ),
            n if n <= 0 || n as usize >= sys::SIGNAL_SLOTS => Some("there is no such signal"),
            _ => None,
        }
    }
}

impl From<libc::c_int> for SignalKind {
    fn from(signum: libc::c_int) -> SignalKind {
        SignalKind(signum)
    }
}

impl From<SignalKind> for libc::c_int {
    fn from(kind: SignalKind) -> libc::c_int {
        kind.0
    }
}

impl fmt::Debug for SignalKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The names `ShutdownSignals` always printed, so log lines stay the same.
        let name = match self.0 {
            libc::SIGINT => "Interrupt",
            libc::SIGTERM => "Terminate",
            libc::SIGQUIT => "Quit",
            libc::SIGHUP => "Hangup",
            libc::SIGUSR1 => "User1",
            libc::SIGUSR2 => "User2",
            n => return f.debug_tuple("SignalKind").field(&n).finish(),
        };
        f.write_str(name)
    }
}

impl fmt::Display for SignalKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "signal {}", self.0),
        }
    }
}

/// Completes at the next SIGINT (Ctrl-C) after its first poll.
///
/// The first call installs hotloop's SIGINT handler, so from then on
/// Ctrl-C no longer ends the process by itself (see the module docs).
pub async fn ctrl_c() -> io::Result<()> {
    let mut interrupt = signal(SignalKind::interrupt())?;
    match interrupt.recv().await {
        Some(()) => Ok(()),
        None => Err(delivery_ended()),
    }
}

/// Starts listening for `kind`: the returned [`Signal`] sees every delivery
/// from now on.
///
/// Fails for SIGKILL, SIGSTOP, SIGSEGV, SIGBUS, SIGILL, SIGFPE and numbers
/// that name no signal, or if the handler or its thread cannot be set up.
pub fn signal(kind: SignalKind) -> io::Result<Signal> {
    if let Some(why) = kind.refusal() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot listen for {kind}: {why}"),
        ));
    }
    install(kind.0)?;
    Ok(Signal {
        kind,
        // Read after the handler is in place: what arrives from here on counts.
        seen: sys::signal_deliveries(kind.0),
        id: NEXT_LISTENER.fetch_add(1, Ordering::Relaxed),
    })
}

/// A listener for one signal, made by [`signal`]: like
/// `tokio::signal::unix::Signal`.
///
/// Each listener sees each delivery; deliveries that arrive while nobody
/// calls [`recv`](Signal::recv) coalesce into one. It may be moved between
/// threads and polled on any worker.
#[derive(Debug)]
pub struct Signal {
    kind: SignalKind,
    /// The delivery counter's value at the last delivery this listener took.
    seen: usize,
    /// Names this listener's parked waker.
    id: u64,
}

impl Signal {
    /// Waits for the next delivery. `None` means no delivery can come any
    /// more (the process's signal thread ended, which a failing `read` on
    /// its pipe would cause); it does not happen otherwise.
    pub async fn recv(&mut self) -> Option<()> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Polls for the next delivery, parking `cx`'s waker if none came since
    /// the last one taken; see [`recv`](Signal::recv).
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<()>> {
        if self.take() {
            return Poll::Ready(Some(()));
        }
        if !DISPATCH_ALIVE.load(Ordering::SeqCst) {
            return Poll::Ready(None);
        }
        {
            let mut parked = lock(&PARKED[self.slot()]);
            match parked.iter_mut().find(|(id, _)| *id == self.id) {
                Some((_, waker)) => waker.clone_from(cx.waker()),
                None => parked.push((self.id, cx.waker().clone())),
            }
        }
        // Looked at again after parking: a delivery counted between the first
        // look and the parking may have been dispatched before the waker was
        // there to be woken.
        if self.take() {
            return Poll::Ready(Some(()));
        }
        Poll::Pending
    }

    /// The signal this listener takes.
    pub fn kind(&self) -> SignalKind {
        self.kind
    }

    /// Takes a delivery if the counter moved since the last one taken.
    fn take(&mut self) -> bool {
        let now = sys::signal_deliveries(self.kind.0);
        if now == self.seen {
            return false;
        }
        self.seen = now;
        true
    }

    fn slot(&self) -> usize {
        self.kind.0 as usize
    }
}

impl Drop for Signal {
    fn drop(&mut self) {
        lock(&PARKED[self.slot()]).retain(|(id, _)| *id != self.id);
    }
}

/// The wakers parked on each signal, by listener id; the signal thread
/// takes and wakes them all when the signal's counter moves.
#[allow(clippy::type_complexity)]
static PARKED: [Mutex<Vec<(u64, Waker)>>; sys::SIGNAL_SLOTS] =
    [const { Mutex::new(Vec::new()) }; sys::SIGNAL_SLOTS];

static NEXT_LISTENER: AtomicU64 = AtomicU64::new(0);

/// False once the signal thread has ended; listeners then answer `None`.
static DISPATCH_ALIVE: AtomicBool = AtomicBool::new(true);

/// Which signals have hotloop's handler; the lock also orders the one-time
/// start of the pipe and the thread.
static INSTALLED: Mutex<[bool; sys::SIGNAL_SLOTS]> = Mutex::new([false; sys::SIGNAL_SLOTS]);

/// Whether the pipe and the thread were started (or why they could not be).
static STARTED: OnceLock<Result<(), String>> = OnceLock::new();

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing under these locks can leave the data half-changed.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn delivery_ended() -> io::Error {
    io::Error::other("hotloop's signal thread has ended: no signal can be delivered any more")
}

/// Installs the handler for `sig` once, starting the pipe and the signal
/// thread first if this is the first signal.
fn install(sig: libc::c_int) -> io::Result<()> {
    let mut installed = lock(&INSTALLED);
    if installed[sig as usize] {
        return Ok(());
    }
    STARTED
        .get_or_init(|| start().map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| io::Error::other(format!("could not start hotloop's signal thread: {e}")))?;
    sys::signal_install(sig).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("could not install a handler for {}: {e}", SignalKind(sig)),
        )
    })?;
    installed[sig as usize] = true;
    Ok(())
}

/// Makes the self-pipe and starts the thread that reads it. The handler
/// only writes to the pipe once it is set, so the thread is running first.
fn start() -> io::Result<()> {
    let (read, write) = sys::signal_pipe()?;
    let pipe = File::from(read);
    std::thread::Builder::new().name("hotloop-signal".into()).spawn(move || dispatch(pipe))?;
    sys::signal_set_pipe(write);
    Ok(())
}

/// The signal thread: waits for the handler's bytes and wakes the listeners
/// of every signal whose counter moved.
fn dispatch(mut pipe: File) {
    let mut seen = [0usize; sys::SIGNAL_SLOTS];
    // Many deliveries may be read at once; the counters say which signals.
    let mut bytes = [0u8; 64];
    loop {
        match pipe.read(&mut bytes) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
        for (sig, last) in seen.iter_mut().enumerate().skip(1) {
            let now = sys::signal_deliveries(sig as libc::c_int);
            if now != *last {
                *last = now;
                wake_all(sig);
            }
        }
    }
    // Not expected (the write end is never closed): say so to every listener.
    DISPATCH_ALIVE.store(false, Ordering::SeqCst);
    for sig in 1..sys::SIGNAL_SLOTS {
        wake_all(sig);
    }
}

/// Wakes every listener parked on `sig`. A waker that panics is reported
/// and skipped: one bad waker must not end the thread, which would leave
/// every later wait for a signal in the process hanging.
fn wake_all(sig: usize) {
    let parked = std::mem::take(&mut *lock(&PARKED[sig]));
    // Woken outside the lock: a waker may run code that polls a listener.
    for (_, waker) in parked {
        let woken = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| waker.wake()));
        if woken.is_err() {
            crate::log::warn(format_args!(
                "a signal listener's waker panicked when woken; the other listeners are woken"
            ));
        }
    }
}

/// The signals a server takes, waited for by a thread that blocks.
///
/// Built on the same delivery as [`signal`]: one listener for each of
/// SIGINT, SIGTERM, SIGQUIT, SIGHUP, SIGUSR1 and SIGUSR2, polled with a
/// waker that wakes this thread.
#[derive(Debug)]
pub struct ShutdownSignals {
    listeners: Mutex<Vec<Signal>>,
    woken: Arc<ThreadWake>,
}

/// A waker for a thread that waits on a condition variable.
#[derive(Debug, Default)]
struct ThreadWake {
    woken: Mutex<bool>,
    cond: Condvar,
}

impl Wake for ThreadWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        *lock(&self.woken) = true;
        self.cond.notify_all();
    }
}

const SHUTDOWN_SIGNALS: [SignalKind; 6] = [
    SignalKind::interrupt(),
    SignalKind::terminate(),
    SignalKind::quit(),
    SignalKind::hangup(),
    SignalKind::user_defined1(),
    SignalKind::user_defined2(),
];

impl ShutdownSignals {
    /// Starts taking SIGINT, SIGTERM, SIGQUIT, SIGHUP, SIGUSR1 and SIGUSR2:
    /// from now on each one that arrives waits for [`wait`](Self::wait)
    /// instead of running its default action, so SIGHUP and the user
    /// signals no longer end the process (the caller decides). Call it first
    /// thing in `main`. The name is from when it blocked the signals; it no
    /// longer changes any thread's signal mask.
    pub fn block() -> io::Result<ShutdownSignals> {
        let listeners =
            SHUTDOWN_SIGNALS.iter().map(|&kind| signal(kind)).collect::<io::Result<_>>()?;
        Ok(ShutdownSignals { listeners: Mutex::new(listeners), woken: Arc::default() })
    }

    /// Blocks until one of the signals arrives.
    pub fn wait(&self) -> io::Result<SignalKind> {
        loop {
            if let Some(sig) = self.wait_until(None)? {
                return Ok(sig);
            }
        }
    }

    /// Waits up to `limit` for one of the signals; `None` if none came.
    pub fn wait_timeout(&self, limit: Duration) -> io::Result<Option<SignalKind>> {
        // A limit too far to represent is no limit.
        self.wait_until(Instant::now().checked_add(limit))
    }

    /// A stop signal (SIGINT, SIGTERM or SIGQUIT) that arrived and was not
    /// waited for yet, taken; the others are left for [`wait`](Self::wait).
    /// Does not block.
    pub fn take_stop(&self) -> Option<SignalKind> {
        let waker = Waker::from(self.woken.clone());
        let mut cx = Context::from_waker(&waker);
        let mut listeners = lock(&self.listeners);
        listeners
            .iter_mut()
            .filter(|l| l.kind().is_stop())
            .find_map(|l| matches!(l.poll_recv(&mut cx), Poll::Ready(Some(()))).then(|| l.kind()))
    }

    fn wait_until(&self, deadline: Option<Instant>) -> io::Result<Option<SignalKind>> {
        let waker = Waker::from(self.woken.clone());
        let mut cx = Context::from_waker(&waker);
        let mut listeners = lock(&self.listeners);
        loop {
            // Cleared before looking, so a delivery after the look is not slept through.
            *lock(&self.woken.woken) = false;
            for listener in listeners.iter_mut() {
                match listener.poll_recv(&mut cx) {
                    Poll::Ready(Some(())) => return Ok(Some(listener.kind())),
                    Poll::Ready(None) => return Err(delivery_ended()),
                    Poll::Pending => {}
                }
            }
            let mut woken = lock(&self.woken.woken);
            while !*woken {
                woken = match deadline {
                    None => self.woken.cond.wait(woken).unwrap_or_else(PoisonError::into_inner),
                    Some(deadline) => {
                        let now = Instant::now();
                        if now >= deadline {
                            return Ok(None);
                        }
                        self.woken
                            .cond
                            .wait_timeout(woken, deadline - now)
                            .unwrap_or_else(PoisonError::into_inner)
                            .0
                    }
                };
            }
        }
    }
}
