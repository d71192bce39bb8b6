//! The thread-per-core server helper: one `SO_REUSEPORT` listener per
//! worker (TCP) or one copy of the listening socket per worker (Unix),
//! each accepted connection handed to a handler task on the worker that
//! accepted it.
//!
//! # Implementation notes
//! A Unix socket path cannot be bound once per worker (`SO_REUSEPORT` does
//! not apply to `AF_UNIX`), so [`serve_unix`] binds once and gives every
//! worker a duplicate of the listening descriptor (`dup(2)`: the same
//! socket and accept queue). Each worker then runs the same accept loop as
//! for TCP, limits and draining included. The kernel hands each connection
//! to one of the accepts waiting on the socket: io_uring's accept waits
//! exclusively, so one ring is woken per connection; on epoll every
//! worker's epoll sees the socket become readable and the workers race for
//! the connection, the losers getting `EAGAIN` (a wakeup each, no harm).
//! The alternative, one accepting worker handing connections to the others,
//! would cost a cross-thread send per connection and make that worker the
//! bottleneck.
//!
//! One effect of sharing the socket: epoll forgets a registration only
//! when every descriptor of the socket is closed, so a worker whose copy
//! closed while others are still open keeps receiving the socket's events
//! until they close too. They carry the closed source's stale key and are
//! dropped (a wakeup each); all copies close when the server stops.
//!
//! A TCP server given sockets by a [`Handover`] may get more or fewer
//! than it has workers (its predecessor ran another count): worker `i`
//! accepts on sockets `i`, `i + workers`, ... (one accept loop each, the
//! first of them also taking the connections other workers hand it), and
//! a worker left without one accepts on a copy of socket `i % sockets`.
//!
//! Draining (a stop, or a hand-over to a successor) is one sequence,
//! whichever call starts it ([`Server::drain`], [`Server::drain_blocking`],
//! [`Server::stopped`] after [`Server::stop`], `shutdown_blocking`): the
//! accept loops stop (on io_uring their accepts are cancelled and the last
//! completion awaited), serve what the driver already accepted and, unless
//! a successor took the sockets over, what the kernel queued (closing the
//! socket would reset it); every handler is told through its
//! [`StopSignal`]; then the connections get until the deadline to finish,
//! and those still open are cut (each handler's future is dropped at its
//! next poll, which the cut forces by waking every task) and counted.

use crate::driver::Accepted;
use std::future::{poll_fn, Future};
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use super::balance::{hand_off, Handed, LaneGuard, Lanes};
use super::handover::{serves, Handover, Local};
use super::listener::{adopt_listener, bind_socket, connection_lost, Accept, TcpListener};
use super::options::{Balance, ListenerOptions, ServerOptions};
use super::slot::{Slot, SlotCount};
use super::stream::TcpStream;
use super::unix::{bind_unix_socket, UnixListener, UnixStream};
use crate::runtime::shared::WorkerShared;
use crate::runtime::{
    current, run_now_if_alone, spawn_detached_with, Handle, RemoteJoinHandle, TaskKey,
};
use crate::stats::{count_event, LIFECYCLE};

/// After a drain's deadline, how long the cut may take: a handler is
/// dropped at its worker's next poll, which a worker busy in a long
/// synchronous computation reaches only when that ends.
pub const DRAIN_CUT_WAIT: Duration = Duration::from_secs(1);

/// How long a stopping accept loop waits for io_uring to confirm that its
/// cancelled accept has ended (it takes one loop turn).
const ACCEPT_SETTLE_WAIT: Duration = Duration::from_secs(1);

/// How long a hand-over waits for a server's accept loops to stop.
const LOOPS_STOP_WAIT: Duration = Duration::from_secs(5);

/// The most connections an accept loop takes straight from its socket's
/// backlog when told to look there (past the bound of a turn: the
/// connections a lost wake-up left queued are few, and the loop's own
/// accepts take the rest).
const RECHECK_MAX: usize = 64;

/// During a drain, by default ([`ServerOptions::drain_idle_quiet`]), how
/// long a keep-alive connection between requests must have been quiet
/// before it is closed (and then only if a [`QuietCheck`](super::QuietCheck)
/// of its socket, made twice a loop turn apart, finds no bytes in it, none
/// received since its last progress, and none written that the client has
/// not acknowledged; quiet counts from that acknowledgement if it came
/// after the last progress). A client that just had an answer is
/// likely sending its next request: closing then would race it (the
/// request meets a closed socket, and the client sees the connection fail
/// instead of an answer with `Connection: close`). A connection idle for
/// longer is closed at once. One second: under 100 upgrades on a loaded
/// two-CPU machine, 200 ms let 21 of about 1,600 drained wrk connections
/// meet the close, their client stalled that long between an answer and
/// its next request. Used by `serve_hyper` and by `hotloop serve`.
pub const DRAIN_IDLE_QUIET: Duration = Duration::from_secs(1);

/// True if the peer of a connected socket has sent bytes (or its end of
/// stream) that nobody has read yet, in the kernel: a peek that takes
/// nothing. A read through the driver may not have seen such bytes yet
/// (on io_uring they reach the stream's queue with the completion of its
/// receive, a loop turn later), and closing then would meet the request
/// that just came. It does not see bytes that have left the socket
/// without reaching the reader (io_uring's buffer ring, a TLS record's
/// first segments): a drain asks a [`QuietCheck`](super::QuietCheck),
/// which looks for those too.
///
/// `socket` is the connection's descriptor (`as_raw_fd()`), taken while
/// the stream is open.
pub fn input_pending(socket: std::os::fd::RawFd) -> io::Result<bool> {
    crate::sys::input_pending(socket)
}

/// A running server. Dropping it does not stop it; call [`Server::stop`].
///
/// `A` is what it listens on: a `SocketAddr` for [`serve`], a path for
/// [`serve_unix`] (see [`UnixServer`]).
pub struct Server<A = SocketAddr> {
    local_addr: A,
    /// `local_addr` as the log lines show it.
    label: String,
    shared: Arc<ServerShared>,
    accept_loops: Vec<RemoteJoinHandle<io::Result<()>>>,
    /// The runtime, whose workers a drain's cut wakes.
    handle: Handle,
    /// [`ServerOptions::drain_timeout`], for [`Server::stopped`].
    drain_timeout: Duration,
    /// The hand-over that offers this server's sockets, and the id they
    /// are offered under.
    handover: Option<(Handover, u64)>,
}

/// A running [`serve_unix`] server: a [`Server`] that listens on a path.
pub type UnixServer = Server<PathBuf>;

struct ServerShared {
    stopped: Mutex<(bool, Vec<Waker>)>,
    /// `stopped.0`, read without the lock: an accept loop checks it on
    /// every poll, and the lock is shared by every worker.
    stopped_now: AtomicBool,
    /// Connections accepted and not yet finished, each counted from its
    /// accept (see `slot.rs`): those handed to another worker and not yet
    /// taken count too.
    active: AtomicUsize,
    /// Accept loops parked at the global limit, on any worker: a connection
    /// that finishes anywhere wakes them.
    slot_waiters: Mutex<Vec<Waker>>,
    /// `slot_waiters.len()`, read without the lock by finishing connections.
    slot_waiting: AtomicUsize,
    /// Set when a successor took the sockets over: the stopping accept
    /// loops leave the kernel's queue to it.
    handed_over: AtomicBool,
    /// Set at a drain's deadline: every handler still running ends at its
    /// next poll.
    cut: AtomicBool,
    /// Handlers ended by the cut.
    cut_count: AtomicUsize,
    /// Who waits for the connections or the accept loops to end.
    watch: Mutex<Watch>,
    watch_changed: Condvar,
    /// Raised each time the accept loops must look at their sockets'
    /// backlogs themselves (see [`ServerShared::recheck_backlogs`]).
    rechecks: AtomicU64,
    /// [`ServerOptions::drain_idle_quiet`].
    drain_idle_quiet: Duration,
    /// The timeout of the drain under way or to come, in milliseconds:
    /// [`ServerOptions::drain_timeout`] until a drain with a timeout of its
    /// own begins (see [`ServerShared::idle_close_after`]).
    drain_timeout_ms: AtomicU64,
}

/// What a drain waits for.
#[derive(Default)]
struct Watch {
    /// Per-worker accept tasks still running.
    loops: usize,
    /// Tasks waiting for the last connection to end.
    idle_wakers: Vec<Waker>,
}

impl ServerShared {
    fn new(options: &ServerOptions) -> ServerShared {
        ServerShared {
            stopped: Mutex::new((false, Vec::new())),
            stopped_now: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            slot_waiters: Mutex::new(Vec::new()),
            slot_waiting: AtomicUsize::new(0),
            handed_over: AtomicBool::new(false),
            cut: AtomicBool::new(false),
            cut_count: AtomicUsize::new(0),
            watch: Mutex::new(Watch::default()),
            watch_changed: Condvar::new(),
            rechecks: AtomicU64::new(0),
            drain_idle_quiet: options.drain_idle_quiet,
            drain_timeout_ms: AtomicU64::new(millis(options.drain_timeout)),
        }
    }

    /// Takes a slot under the global limit `global` (atomically: workers
    /// race for it); `None` if it is full.
    fn try_take_slot(self: &Arc<Self>, global: Option<usize>) -> Option<Slot> {
        let taken = match global {
            None => {
                self.active.fetch_add(1, Ordering::AcqRel);
                true
            }
            Some(max) => self
                .active
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
                .is_ok(),
        };
        taken.then(|| Slot::taken(self.clone()))
    }

    /// Takes a slot whatever the limit: for a connection a stopping server
    /// serves anyway (closing it would reset it).
    fn take_slot_anyway(self: &Arc<Self>) -> Slot {
        self.active.fetch_add(1, Ordering::AcqRel);
        Slot::taken(self.clone())
    }

    /// Makes every accept loop try its socket's backlog once, whatever its
    /// driver is waiting on: a predecessor that shared the sockets may have
    /// taken a connection's wake-up with it. On io_uring an armed accept
    /// waits as an exclusive waiter (the kernel wakes one of them per
    /// connection); a predecessor's accept that got the wake-up and was
    /// cancelled before it ran leaves the connection queued and this
    /// process's accepts asleep until the next one arrives.
    fn recheck_backlogs(&self) {
        self.rechecks.fetch_add(1, Ordering::AcqRel);
        // The loops' wakers stay filed for the stop: wake copies.
        let wakers = self.stopped.lock().unwrap_or_else(|e| e.into_inner()).1.clone();
        for w in wakers {
            w.wake();
        }
    }

    fn stop(&self) {
        let wakers = {
            let mut st = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
            st.0 = true;
            self.stopped_now.store(true, Ordering::Release);
            std::mem::take(&mut st.1)
        };
        for w in wakers {
            w.wake();
        }
    }

    /// Parks `waker` until a connection finishes on any worker.
    fn park_for_slot(&self, waker: &Waker) {
        let mut w = self.slot_waiters.lock().unwrap_or_else(|e| e.into_inner());
        if !w.iter().any(|x| x.will_wake(waker)) {
            w.push(waker.clone());
        }
        self.slot_waiting.store(w.len(), Ordering::SeqCst);
    }

    /// Gives back a connection's slot: wakes the accept loops parked at
    /// the global limit and, at the last one of a stopped server, its drain.
    fn release_slot(&self) {
        let before = self.active.fetch_sub(1, Ordering::SeqCst);
        self.wake_slot_waiters();
        // Only a stopped server's drain waits for the count to reach zero.
        if before == 1 && self.is_stopped() {
            self.notify_watchers();
        }
    }

    /// Wakes the accept loops parked at the global limit.
    fn wake_slot_waiters(&self) {
        // SeqCst pairs with the waiter's store of `slot_waiting` and its
        // re-read of `active`: either it sees the slot free, or this sees it waiting.
        if self.slot_waiting.load(Ordering::SeqCst) == 0 {
            return;
        }
        let wakers = {
            let mut w = self.slot_waiters.lock().unwrap_or_else(|e| e.into_inner());
            self.slot_waiting.store(0, Ordering::SeqCst);
            std::mem::take(&mut *w)
        };
        for w in wakers {
            w.wake();
        }
    }

    fn watch(&self) -> MutexGuard<'_, Watch> {
        self.watch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes whoever waits for the connections or the loops to end.
    fn notify_watchers(&self) {
        let wakers = std::mem::take(&mut self.watch().idle_wakers);
        self.watch_changed.notify_all();
        for w in wakers {
            w.wake();
        }
    }

    /// True once no connection is open; otherwise files `waker`, woken
    /// when the last one ends.
    fn poll_idle(&self, waker: &Waker) -> bool {
        if self.active.load(Ordering::SeqCst) == 0 {
            return true;
        }
        let mut w = self.watch();
        if !w.idle_wakers.iter().any(|x| x.will_wake(waker)) {
            w.idle_wakers.push(waker.clone());
        }
        // The last connection may have ended before the waker was filed.
        self.active.load(Ordering::SeqCst) == 0
    }

    /// Blocks until no connection is open or `deadline` passes; true if none is.
    fn wait_idle_until(&self, deadline: Instant) -> bool {
        let mut w = self.watch();
        loop {
            if self.active.load(Ordering::SeqCst) == 0 {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            // Bounded waits: the wakeup of the last connection's end takes
            // the lock, but a check here between the load and the wait
            // could still miss it.
            let step = (deadline - now).min(Duration::from_millis(50));
            w = self.watch_changed.wait_timeout(w, step).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Blocks until every accept task has ended or `limit` has passed.
    fn wait_loops_ended(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut w = self.watch();
        while w.loops > 0 {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            w = self
                .watch_changed
                .wait_timeout(w, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// During a drain, how long a connection waiting for its client's next
    /// request must have been quiet before it is closed; `None` when the
    /// quiet time is at or above the drain's timeout, which promises that
    /// no idle connection is closed before the drain's deadline (each is
    /// closed after answering its next request, or cut at the deadline).
    /// Counted from the connection's last progress, the quiet time would
    /// be over at once for a connection idle that long before the stop.
    fn idle_close_after(&self) -> Option<Duration> {
        let timeout = Duration::from_millis(self.drain_timeout_ms.load(Ordering::Acquire));
        (self.drain_idle_quiet < timeout).then_some(self.drain_idle_quiet)
    }

    /// True once the server was told to stop (no waker filed).
    fn is_stopped(&self) -> bool {
        self.stopped_now.load(Ordering::Acquire)
    }

    /// True once the server was told to stop; otherwise files `waker`, to be
    /// woken when it is.
    fn poll_stopped(&self, waker: &Waker) -> bool {
        if self.is_stopped() {
            return true;
        }
        let mut st = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        if !st.0 && !st.1.iter().any(|w| w.will_wake(waker)) {
            st.1.push(waker.clone());
        }
        st.0
    }
}

/// One worker's view of its connections, for the per-worker limit.
struct WorkerConns {
    /// The server, whose count of active connections spans the workers.
    server: Arc<ServerShared>,
    /// The worker, whose published load counts the connections.
    worker: Arc<WorkerShared>,
    active: Cell<usize>,
    /// The accept loops parked because a limit was reached: a worker runs
    /// one per socket it was given (more than one after a hand-over from a
    /// process with more workers), and each must wake when a slot frees.
    waiting: RefCell<Vec<Waker>>,
    /// Set by this worker's accept loop when the server stops.
    stopping: Cell<bool>,
}

impl WorkerConns {
    fn new(server: Arc<ServerShared>, worker: Arc<WorkerShared>) -> Self {
        WorkerConns {
            server,
            worker,
            active: Cell::new(0),
            waiting: RefCell::new(Vec::new()),
            stopping: Cell::new(false),
        }
    }

    /// Marks the server as stopping on this worker and wakes every task
    /// on it, so the handlers that wait for [`StopSignal::stopping`] see
    /// it: no handler registers anywhere to be found (a list of them would
    /// cost every connection a slot), and a task that does not wait for
    /// the stop polls once more and parks.
    fn set_stopping(&self) {
        self.stopping.set(true);
        crate::runtime::wake_all();
    }
}

/// Tells a connection handler that its server is stopping (a drain, or a
/// successor took its sockets over), so it can end the connection cleanly
/// (finish the request in flight, then close) before the drain's deadline
/// cuts it.
/// Given to handlers by [`serve_with_stop`]; it belongs to the worker
/// that runs the handler.
#[derive(Clone)]
pub struct StopSignal {
    local: Rc<WorkerConns>,
}

impl StopSignal {
    /// True once [`Server::stop`] has been seen on this worker.
    pub fn is_stopping(&self) -> bool {
        self.local.stopping.get()
    }

    /// Completes once the server is stopping. Cheap to poll with every
    /// read: it reads a flag and registers nothing (the stop wakes every
    /// task of the worker).
    pub fn stopping(&self) -> Stopping {
        Stopping { local: self.local.clone() }
    }

    /// During a drain, how long a connection waiting for its client's next
    /// request must have been quiet before it is closed
    /// ([`ServerOptions::drain_idle_quiet`]).
    pub fn idle_quiet(&self) -> Duration {
        self.local.server.drain_idle_quiet
    }

    /// [`idle_quiet`](Self::idle_quiet) as this drain applies it: `None`
    /// when it is at or above the drain's timeout
    /// ([`ServerOptions::drain_timeout`], or the one [`Server::drain`] was
    /// given), where no connection is closed for being idle before the
    /// drain's deadline, however long it was idle before the stop; each is
    /// closed after answering its next request (haproxy's
    /// `idle-close-on-response`), or cut at the deadline.
    pub fn idle_close_after(&self) -> Option<Duration> {
        self.local.server.idle_close_after()
    }
}

impl std::fmt::Debug for StopSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopSignal").field("stopping", &self.is_stopping()).finish()
    }
}

/// The future of [`StopSignal::stopping`].
pub struct Stopping {
    local: Rc<WorkerConns>,
}

impl Stopping {
    /// [`StopSignal::idle_quiet`].
    pub fn idle_quiet(&self) -> Duration {
        self.local.server.drain_idle_quiet
    }

    /// [`StopSignal::idle_close_after`].
    pub fn idle_close_after(&self) -> Option<Duration> {
        self.local.server.idle_close_after()
    }
}

impl Future for Stopping {
    type Output = ();

    fn poll(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> Poll<()> {
        if self.local.stopping.get() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// Counts a connection as active, globally and on its worker, until
/// dropped. One pointer: every connection's task holds one.
struct ActiveGuard {
    local: Rc<WorkerConns>,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.local.active.set(self.local.active.get() - 1);
        self.local.worker.load.connection_closed();
        let waiting = std::mem::take(&mut *self.local.waiting.borrow_mut());
        for w in waiting {
            w.wake();
        }
        self.local.server.release_slot();
    }
}

impl SlotCount for ServerShared {
    fn release(&self) {
        self.release_slot();
    }
}

pin_project_lite::pin_project! {
    /// A connection's task: its handler, counted as active until it ends
    /// (one allocation with the handler's future, as `OnDone` makes), and
    /// cut (dropped, closing the connection) at its first poll after the
    /// server's drain deadline.
    struct Served<F> {
        #[pin]
        handler: F,
        guard: ActiveGuard,
    }
}

impl<F: Future<Output = ()>> Future for Served<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        let server = &this.guard.local.server;
        if server.cut.load(Ordering::Relaxed) {
            // Counted in `drain_cut` by the drain's report, with those the
            // cut had not ended by then.
            server.cut_count.fetch_add(1, Ordering::Relaxed);
            // Ending the task drops the handler, and its connection with it.
            return Poll::Ready(());
        }
        this.handler.poll(cx)
    }
}

/// Counts a per-worker accept task as running until dropped.
struct LoopRunning(Arc<ServerShared>);

impl Drop for LoopRunning {
    fn drop(&mut self) {
        self.0.watch().loops -= 1;
        self.0.notify_watchers();
    }
}

/// Starts a server on every worker of `handle`'s runtime: each worker gets
/// its own listener on `addr` (with `SO_REUSEPORT`, so the kernel spreads
/// connections across workers) and runs `handler(stream)` as a task for
/// each connection it accepts.
///
/// Port 0 picks a free port once; every worker then binds that port.
/// `options` is a [`ListenerOptions`] or, with connection limits, a
/// [`ServerOptions`].
pub fn serve<H, Fut>(
    handle: impl AsRef<Handle>,
    addr: impl ToSocketAddrs,
    options: impl Into<ServerOptions>,
    handler: H,
) -> io::Result<Server>
where
    H: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let handle = handle.as_ref();
    serve_with_stop(handle, addr, options, move |stream, _stop| handler(stream))
}

/// [`serve`], with a [`StopSignal`] for each handler, so that handlers can
/// wind their connections down when [`Server::stop`] is called instead of
/// being cut at the grace limit (`serve_hyper` uses it to make hyper
/// finish the request in flight and close).
pub fn serve_with_stop<H, Fut>(
    handle: impl AsRef<Handle>,
    addr: impl ToSocketAddrs,
    options: impl Into<ServerOptions>,
    handler: H,
) -> io::Result<Server>
where
    H: Fn(TcpStream, StopSignal) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let handle = handle.as_ref();
    let server_options = options.into();
    let (mut options, limits) = split_options(&server_options);
    if handle.workers() > 1 {
        options.reuse_port = true;
    }
    let wanted: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
    let handover = server_options.handover.as_ref();
    let inherited = handover.and_then(|h| {
        h.take(|l, fd| matches!(l, Local::Tcp(a) if wanted.iter().any(|w| serves(*w, *a, fd))))
    });
    let (local_addr, sockets) = match inherited {
        Some((Local::Tcp(local_addr), sockets)) => {
            for fd in &sockets {
                adopt_listener(fd, &options)?;
            }
            (local_addr, sockets)
        }
        _ => {
            let first = bind_socket(&wanted[..], &options).map_err(|e| match handover {
                Some(h) => h.explain_bind_error(e),
                None => e,
            })?;
            let local_addr = crate::sys::local_addr(std::os::fd::AsRawFd::as_raw_fd(&first))?;
            let mut sockets = vec![first];
            for _ in 1..handle.workers() {
                sockets.push(bind_socket(local_addr, &options)?);
            }
            (local_addr, sockets)
        }
    };
    let label = local_addr.to_string();
    start::<TcpListener, _, _, _>(
        handle,
        Bound { local_addr, label, local: Local::Tcp(local_addr), sockets },
        &server_options,
        options,
        limits,
        handler,
    )
}

/// [`serve`] over a Unix domain socket at `path`: every worker of
/// `handle`'s runtime accepts on a copy of one listening socket (see the
/// module notes) and runs `handler(stream)` as a task for each connection
/// it accepts.
///
/// Binding fails with `AddrInUse` if the path exists, unless
/// [`ListenerOptions::remove_stale_socket`] is set and the file is a socket
/// nobody listens on (one left by a previous run), or the server's
/// [`Handover`] holds the socket inherited from a predecessor. Stopping
/// the server leaves the socket file in place.
pub fn serve_unix<H, Fut>(
    handle: impl AsRef<Handle>,
    path: impl AsRef<Path>,
    options: impl Into<ServerOptions>,
    handler: H,
) -> io::Result<UnixServer>
where
    H: Fn(UnixStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let handle = handle.as_ref();
    serve_unix_with_stop(handle, path, options, move |stream, _stop| handler(stream))
}

/// [`serve_unix`], with a [`StopSignal`] for each handler (see [`serve_with_stop`]).
pub fn serve_unix_with_stop<H, Fut>(
    handle: impl AsRef<Handle>,
    path: impl AsRef<Path>,
    options: impl Into<ServerOptions>,
    handler: H,
) -> io::Result<UnixServer>
where
    H: Fn(UnixStream, StopSignal) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let handle = handle.as_ref();
    let path = path.as_ref();
    let server_options = options.into();
    let (options, limits) = split_options(&server_options);
    let inherited = server_options
        .handover
        .as_ref()
        .and_then(|h| h.take(|l, _| matches!(l, Local::Unix(p) if p == path)));
    let (sockets, bound_here) = match inherited {
        Some((_, sockets)) => (sockets, false),
        None => (vec![bind_unix_socket(path, &options)?], true),
    };
    let label = path.display().to_string();
    let local = Local::Unix(path.to_path_buf());
    let bound = Bound { local_addr: path.to_path_buf(), label, local, sockets };
    start::<UnixListener, _, _, _>(handle, bound, &server_options, options, limits, handler)
        .inspect_err(|_| {
            if bound_here {
                // The file is ours (the bind just made it) and nobody will accept on it.
                let _ = std::fs::remove_file(path);
            }
        })
}

/// The listener options and the connection limits of `options`.
fn split_options(options: &ServerOptions) -> (ListenerOptions, Limits) {
    let limits = Limits {
        global: options.maxconn,
        per_worker: options.maxconn_per_worker,
        balance: options.balance,
        loops: 1,
    };
    (options.listener.clone(), limits)
}

/// A server's listening sockets, bound or inherited.
struct Bound<A> {
    local_addr: A,
    /// `local_addr` as the log lines show it.
    label: String,
    /// `local_addr` as a hand-over names it.
    local: Local,
    sockets: Vec<OwnedFd>,
}

/// Which sockets each worker accepts on (see the module notes): socket
/// `i` goes to worker `i % workers`, and a worker left without one gets a
/// copy of socket `worker % sockets`.
fn spread(sockets: Vec<OwnedFd>, workers: usize) -> io::Result<Vec<Vec<OwnedFd>>> {
    let count = sockets.len();
    let mut per_worker: Vec<Vec<OwnedFd>> = (0..workers).map(|_| Vec::new()).collect();
    for (i, fd) in sockets.into_iter().enumerate() {
        per_worker[i % workers].push(fd);
    }
    for worker in count..workers {
        let copy = per_worker[worker % count][0].try_clone()?;
        per_worker[worker].push(copy);
    }
    Ok(per_worker)
}

/// Starts each worker's accept loops (see [`spread`]) and offers the
/// sockets to the hand-over, if any.
fn start<L, A, H, Fut>(
    handle: &Handle,
    bound: Bound<A>,
    server_options: &ServerOptions,
    options: ListenerOptions,
    limits: Limits,
    handler: H,
) -> io::Result<Server<A>>
where
    L: Accept,
    H: Fn(L::Stream, StopSignal) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let Bound { local_addr, label, local, sockets } = bound;
    if sockets.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no listening socket"));
    }
    let shared = Arc::new(ServerShared::new(server_options));
    let handover = match &server_options.handover {
        Some(h) => {
            let id = h.new_id();
            h.offer(id, &local, &sockets)?;
            let stopping = shared.clone();
            h.add_member(
                id,
                Arc::new(move || {
                    // A successor serves the sockets now: stop accepting,
                    // and leave the kernel's queue to it.
                    stopping.handed_over.store(true, Ordering::SeqCst);
                    stopping.stop();
                    stopping.wait_loops_ended(LOOPS_STOP_WAIT);
                }),
            );
            let rechecking = shared.clone();
            h.add_recheck(id, Arc::new(move || rechecking.recheck_backlogs()));
            Some((h.clone(), id))
        }
        None => None,
    };
    let per_worker = spread(sockets, handle.workers())?;
    shared.watch().loops = per_worker.len();
    let limits = Limits { loops: per_worker.len(), ..limits };
    let lanes = Arc::new(Lanes::new(limits.balance, handle.inner.workers.clone()));
    let handler = Arc::new(handler);
    let accept_loops = per_worker
        .into_iter()
        .enumerate()
        .map(|(worker, fds)| {
            let shared = shared.clone();
            let handler = handler.clone();
            let options = options.clone();
            let lanes = lanes.clone();
            handle.spawn_on(worker, move || async move {
                let _running = LoopRunning(shared.clone());
                // Whatever ends the first loop (a stop, an error, the
                // worker's loop failing) closes this worker's lane.
                let lane = LaneGuard { lanes: lanes.clone(), me: worker };
                let local = Rc::new(WorkerConns::new(shared.clone(), current::worker_shared()));
                let mut listeners = fds
                    .into_iter()
                    .map(|fd| L::from_fd(fd, options.clone()))
                    .collect::<io::Result<Vec<_>>>()?;
                let first = listeners.remove(0);
                // Further sockets on this worker (a predecessor had more
                // workers): an accept loop each, sharing the worker's counts.
                let more: Vec<_> = listeners
                    .into_iter()
                    .map(|listener| {
                        let (shared, handler) = (shared.clone(), handler.clone());
                        let (local, lanes) = (local.clone(), lanes.clone());
                        let place = Place { lanes, me: worker, primary: false };
                        crate::runtime::spawn(async move {
                            accept_loop(listener, shared, handler, limits, local, place).await
                        })
                    })
                    .collect();
                let place = Place { lanes, me: worker, primary: true };
                let mut result = accept_loop(first, shared, handler, limits, local, place).await;
                // Only the first loop takes what is handed to this worker:
                // after an error the connections handed here go elsewhere
                // rather than wait (holding their slots) for the other loops.
                drop(lane);
                for other in more {
                    let ended =
                        other.await.unwrap_or_else(|e| Err(io::Error::other(e.to_string())));
                    if result.is_ok() {
                        result = ended;
                    }
                }
                result
            })
        })
        .collect();
    Ok(Server {
        local_addr,
        label,
        shared,
        accept_loops,
        handle: handle.clone(),
        drain_timeout: server_options.drain_timeout,
        handover,
    })
}

/// `d` in whole milliseconds (saturating).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The connection limits of one server.
#[derive(Debug, Clone, Copy)]
struct Limits {
    global: Option<usize>,
    per_worker: Option<usize>,
    balance: Balance,
    /// The workers whose accept loops share `global`.
    loops: usize,
}

/// A connection for the accept loop: one it accepted, or one another
/// worker handed to it (with its slot).
enum Arrival {
    Accepted(Accepted),
    HandedIn(Handed),
}

/// Where an accept loop runs: its worker's lane among the server's, and
/// whether it is the worker's first loop (`primary`), which also takes
/// the connections other workers hand it.
struct Place {
    lanes: Arc<Lanes>,
    me: usize,
    primary: bool,
}

/// One listener's accept loop on its worker.
async fn accept_loop<L, H, Fut>(
    listener: L,
    shared: Arc<ServerShared>,
    handler: Arc<H>,
    limits: Limits,
    local: Rc<WorkerConns>,
    place: Place,
) -> io::Result<()>
where
    L: Accept,
    H: Fn(L::Stream, StopSignal) -> Fut + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let Place { lanes, me, primary } = place;
    let lanes = &*lanes;
    let balancing = lanes.enabled() && primary;
    // The lane this loop takes handed-in connections from, if any.
    let lane = balancing.then_some((lanes, me));
    // Starts the handler of a connection handed here; one whose stream
    // cannot be made is closed, freeing its slot.
    let serve_handed = |handed: Handed| {
        current::count(|s| &s.handoffs_in);
        match L::stream_from_accepted(Accepted::Fd(handed.fd)) {
            Ok(stream) => {
                start_handler(stream, handed.slot, &local, &*handler);
            }
            Err(_) => current::count(|s| &s.accepted_unserved),
        }
    };
    // The loop's waker is filed for the stop once (a task's waker does not
    // change); each poll after that reads an atomic, not the lock every
    // worker's accept loop shares.
    let mut stop_filed = false;
    // The last recheck of the backlog asked for, and how many more
    // connections this loop may take straight from it.
    let (mut recheck_seen, mut recheck_left) = (0, 0);
    loop {
        // A connection handed here holds its slot already: the server's
        // limit does not keep it waiting (its slot may be one this loop
        // would wait for), only this worker's own.
        let ready = || !at_limit(&shared, &local, limits) || handed_in(lane, &local, limits);
        if !ready() {
            current::count(|s| &s.maxconn_reached);
            // On io_uring this stops the armed accept: the clients that wait
            // do so in the kernel's backlog, not as descriptors here.
            listener.set_accept_room(Some(0));
            // Not chosen for hand-offs while it waits (it takes none).
            let per_worker = worker_full(&local, limits);
            if balancing && per_worker {
                lanes.set_full(me, true);
            }
            while !ready() && !shared.is_stopped() {
                wait_for_a_free_slot(&shared, &local, limits.global.is_some(), lane, ready).await;
            }
            if balancing && per_worker {
                lanes.set_full(me, false);
            }
        }
        // The driver accepts no further ahead than the slots left; at least
        // one if the check above found a slot: another worker may have
        // taken it since, and the connection is then held below until one
        // frees (a room of zero would only stop the accept this loop waits
        // on). No room while only a connection handed here may be served.
        let room = if at_limit(&shared, &local, limits) {
            Some(0)
        } else {
            room(&shared, &local, limits).map(|r| r.max(1))
        };
        listener.set_accept_room(room);
        let accepted = {
            let mut accept = pin!(listener.accept_fd());
            poll_fn(|cx| {
                let stopped = if stop_filed {
                    shared.is_stopped()
                } else {
                    stop_filed = true;
                    if balancing {
                        lanes.register(me, cx.waker());
                    }
                    shared.poll_stopped(cx.waker())
                };
                if stopped {
                    return Poll::Ready(None);
                }
                if let Some(handed) = if primary { lanes.take(me) } else { None } {
                    return Poll::Ready(Some(Ok(Arrival::HandedIn(handed))));
                }
                let rechecks = shared.rechecks.load(Ordering::Acquire);
                if rechecks != recheck_seen {
                    recheck_seen = rechecks;
                    recheck_left = RECHECK_MAX;
                }
                if recheck_left > 0 {
                    match listener.accept_fd_ready() {
                        Some(Ok(fd)) => {
                            recheck_left -= 1;
                            current::count(|s| &s.backlog_recheck_accepts);
                            return Poll::Ready(Some(Ok(Arrival::Accepted(fd))));
                        }
                        // An error (descriptors short, say) is the
                        // accept's to meet, with its pause.
                        Some(Err(_)) | None => recheck_left = 0,
                    }
                }
                accept.as_mut().poll(cx).map(|r| Some(r.map(Arrival::Accepted)))
            })
            .await
        };
        match accepted {
            None => {
                local.set_stopping();
                // No accept is left armed in the kernel for this listener
                // (io_uring's is cancelled, and its last completion awaited):
                // one armed while the socket is shared with a successor would
                // go on taking connections nobody here serves.
                listener.set_accept_room(Some(0));
                let settled = poll_fn(|cx| listener.poll_accept_settled(cx));
                if crate::time::timeout(ACCEPT_SETTLE_WAIT, settled).await.is_err() {
                    // What the accept still takes is closed with the
                    // listener, and counted in `accepted_unserved`.
                    crate::log::warn(format_args!(
                        "a stopping accept loop's cancelled accept had not ended after {} ms",
                        ACCEPT_SETTLE_WAIT.as_millis()
                    ));
                }
                // Without a successor the socket closes with this listener:
                // what the kernel already queued is served too, which
                // closing would reset. With one, the queue is the successor's.
                let backlog = !shared.handed_over.load(Ordering::SeqCst);
                serve_left_over(
                    &listener,
                    backlog,
                    || !at_limit(&shared, &local, limits),
                    |stream| {
                        start_handler(stream, shared.take_slot_anyway(), &local, &*handler);
                    },
                );
                // Connections other workers handed here were accepted, and
                // hold their slots: served whatever the limit, as a
                // connection held at the limit is once the server stops.
                if primary {
                    for handed in lanes.close(me) {
                        serve_handed(handed);
                    }
                }
                return Ok(());
            }
            Some(Ok(arrival)) => {
                let (accepted, slot) = match arrival {
                    Arrival::Accepted(accepted) => {
                        // The connection counts from here, wherever it is
                        // served: one handed to another worker takes its
                        // slot along, so none is accepted past the limit
                        // while it waits in that worker's lane.
                        let slot = loop {
                            if let Some(slot) = shared.try_take_slot(limits.global) {
                                break slot;
                            }
                            // Another worker took the last slot since the
                            // check above: hold the connection (it is not
                            // closed) until one frees, or the server stops.
                            if shared.is_stopped() {
                                break shared.take_slot_anyway();
                            }
                            // What is handed here meanwhile holds its slot,
                            // perhaps the one this waits for: served at once.
                            if handed_in(lane, &local, limits) {
                                if let Some(handed) = lanes.take(me) {
                                    serve_handed(handed);
                                }
                                continue;
                            }
                            current::count(|s| &s.maxconn_reached);
                            let free =
                                || !global_full(&shared, limits) || handed_in(lane, &local, limits);
                            let global = limits.global.is_some();
                            wait_for_a_free_slot(&shared, &local, global, lane, free).await;
                        };
                        match hand_off(lanes, me, accepted, slot) {
                            None => continue,
                            Some(kept) => kept,
                        }
                    }
                    Arrival::HandedIn(Handed { fd, slot }) => {
                        current::count(|s| &s.handoffs_in);
                        (Accepted::Fd(fd), slot)
                    }
                };
                // A connection whose stream cannot be made (its descriptor
                // is closed with the error, and its slot freed) is one the
                // peer sees reset.
                let Ok(stream) = L::stream_from_accepted(accepted) else {
                    current::count(|s| &s.accepted_unserved);
                    continue;
                };
                // This worker's own limit may have filled since the check
                // above (another of its loops, or a connection handed here
                // as it filled): hold the connection until one frees here.
                while worker_full(&local, limits) && !shared.is_stopped() {
                    current::count(|s| &s.maxconn_reached);
                    let free = || !worker_full(&local, limits);
                    wait_for_a_free_slot(&shared, &local, false, None, free).await;
                }
                let handler_task = start_handler(stream, slot, &local, &*handler);
                // Let the new handler run before the next accept: its
                // request is usually in its socket already (TCP_DEFER_ACCEPT),
                // and serving it first both answers sooner and gives the next
                // client time to arrive, so the next `accept4` finds it
                // rather than failing with EAGAIN (one system call less per
                // connection when clients come one at a time). With nothing
                // else waiting to run it is polled in place, which saves this
                // loop a wake and a poll of its own. Each such poll counts
                // against the worker's budget of polls per turn, so a burst
                // of connections that finish at once still lets the worker
                // look at I/O as often as the yields did.
                if !run_now_if_alone(handler_task) {
                    crate::runtime::yield_now().await;
                }
            }
            Some(Err(e)) => return Err(e),
        }
    }
}

/// A stopping accept loop's last connections, each handed to `serve`:
/// what the driver already accepted, which is this process's to serve
/// whatever the limit (closing it would reset it), then, with `backlog`,
/// what the socket's backlog holds, while `room` says so. A connection
/// whose stream cannot be made (its descriptor is closed with the error,
/// and its client sees a reset) is counted in `accepted_unserved`, and
/// the rest are still served; so are they after an accept that lost its
/// connection. Only an accept short of descriptors or memory ends the
/// backlog's turn: the next would fail the same way.
fn serve_left_over<L: Accept>(
    listener: &L,
    backlog: bool,
    mut room: impl FnMut() -> bool,
    mut serve: impl FnMut(L::Stream),
) {
    let mut take = |accepted: Accepted| match L::stream_from_accepted(accepted) {
        Ok(stream) => serve(stream),
        Err(_) => current::count(|s| &s.accepted_unserved),
    };
    while let Some(got) = listener.take_accepted() {
        // An accept that failed took no connection.
        if let Ok(accepted) = got {
            take(accepted);
        }
    }
    while backlog && room() {
        match listener.accept_fd_ready() {
            None => break,
            Some(Ok(accepted)) => take(accepted),
            Some(Err(e)) if connection_lost(&e) => {}
            Some(Err(_)) => break,
        }
    }
}

/// How many more connections this worker may take now (`None`: no limit).
fn room(shared: &ServerShared, local: &WorkerConns, limits: Limits) -> Option<usize> {
    let worker = limits.per_worker.map(|max| max.saturating_sub(local.active.get()));
    // Each worker's driver may take its share of the global slots left
    // ahead (rounded up, so a slot left is anyone's): were each allowed
    // them all, a burst that reached every worker's armed accept at once
    // would be accepted several times over the limit, the excess held as
    // descriptors instead of waiting in the kernel's backlog.
    let global = limits.global.map(|max| {
        max.saturating_sub(shared.active.load(Ordering::Acquire)).div_ceil(limits.loops.max(1))
    });
    match (worker, global) {
        (Some(w), Some(g)) => Some(w.min(g)),
        (w, g) => w.or(g),
    }
}

/// True if the worker or the server is at its connection limit.
fn at_limit(shared: &ServerShared, local: &WorkerConns, limits: Limits) -> bool {
    worker_full(local, limits) || global_full(shared, limits)
}

/// True if the worker is at its own limit (`maxconn_per_worker`).
fn worker_full(local: &WorkerConns, limits: Limits) -> bool {
    limits.per_worker.is_some_and(|max| local.active.get() >= max)
}

/// True if the server is at its global limit (`maxconn`).
fn global_full(shared: &ServerShared, limits: Limits) -> bool {
    limits.global.is_some_and(|max| shared.active.load(Ordering::SeqCst) >= max)
}

/// True if a connection waits in `lane` (this loop's, if it takes any)
/// and this worker may serve it: it holds its slot under the server's
/// limit, so only the worker's own limit can keep it waiting.
fn handed_in(lane: Option<(&Lanes, usize)>, local: &WorkerConns, limits: Limits) -> bool {
    lane.is_some_and(|(lanes, me)| lanes.has_queued(me)) && !worker_full(local, limits)
}

/// Waits until `ready()` says a slot may be free, or the server stops;
/// woken when a connection finishes on this worker or (`global`) on any
/// worker, or a connection is handed to `lane`.
async fn wait_for_a_free_slot(
    shared: &ServerShared,
    local: &WorkerConns,
    global: bool,
    lane: Option<(&Lanes, usize)>,
    ready: impl Fn() -> bool,
) {
    poll_fn(|cx| {
        // Filed before the check: a hand-off after it wakes this task.
        if let Some((lanes, me)) = lane {
            lanes.register(me, cx.waker());
        }
        if ready() || shared.poll_stopped(cx.waker()) {
            return Poll::Ready(());
        }
        {
            let mut waiting = local.waiting.borrow_mut();
            if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
                waiting.push(cx.waker().clone());
            }
        }
        if global {
            shared.park_for_slot(cx.waker());
            // A connection may have finished elsewhere between the check and parking.
            if ready() {
                return Poll::Ready(());
            }
        }
        Poll::Pending
    })
    .await
}

/// Starts the handler of a connection holding `slot` in the server's
/// `active` count, which the handler's guard frees when it ends.
fn start_handler<S, H, Fut>(stream: S, slot: Slot, local: &Rc<WorkerConns>, handler: &H) -> TaskKey
where
    H: Fn(S, StopSignal) -> Fut + 'static,
    Fut: Future<Output = ()> + 'static,
{
    slot.pass_to_handler();
    local.active.set(local.active.get() + 1);
    local.worker.load.connection_opened();
    let guard = ActiveGuard { local: local.clone() };
    let stop = StopSignal { local: local.clone() };
    spawn_detached_with(move || Served { handler: handler(stream, stop), guard })
}

impl<A: Clone> Server<A> {
    /// The address every worker listens on (for [`serve_unix`], the path).
    pub fn local_addr(&self) -> A {
        self.local_addr.clone()
    }
}

impl<A> Server<A> {
    /// Connections accepted and not yet finished, over all workers.
    pub fn active_connections(&self) -> usize {
        self.shared.active.load(Ordering::Acquire)
    }

    /// A function that reads [`Server::active_connections`] from any
    /// thread, for monitoring.
    pub fn active_connections_reader(&self) -> impl Fn() -> usize + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || shared.active.load(Ordering::Acquire)
    }

    /// Stops accepting on every worker and closes the listeners; every
    /// handler is told through its [`StopSignal`]. Connections already
    /// accepted keep running: [`Server::stopped`] (or [`Server::drain`])
    /// waits for them, up to the drain deadline.
    pub fn stop(&self) {
        crate::log::info(format_args!(
            "server on {}: stopping accepts, {} connections in flight",
            self.label,
            self.active_connections()
        ));
        self.shared.stop();
    }

    /// True once a successor took this server's sockets over (through its
    /// [`Handover`]); the server then accepts no more and should be drained.
    pub fn is_handed_over(&self) -> bool {
        self.shared.handed_over.load(Ordering::SeqCst)
    }

    /// Drains the server: stops accepting (as [`Server::stop`]), waits for
    /// the accept loops to serve what was already accepted, then for every
    /// connection to finish, up to `timeout` from the call; what is still
    /// open then is cut (see the module notes). Handlers learn of the drain
    /// through their [`StopSignal`].
    pub async fn drain(mut self, timeout: Duration) -> Drained {
        let (started, open) = self.begin_drain(timeout);
        let _ = self.end_accept_loops().await;
        self.finish_drain(started, open, timeout).await
    }

    /// [`Server::drain`], blocking the calling thread (which must not be
    /// one of the runtime's workers).
    pub fn drain_blocking(mut self, timeout: Duration) -> Drained {
        let (started, open) = self.begin_drain(timeout);
        for l in std::mem::take(&mut self.accept_loops) {
            let _ = l.join();
        }
        let deadline = started + timeout;
        if !self.shared.wait_idle_until(deadline) {
            self.cut();
            self.shared.wait_idle_until(Instant::now() + DRAIN_CUT_WAIT);
        }
        self.report(started, open)
    }

    /// Stops accepting, then waits (blocking the calling thread, which must
    /// not be a worker) until every connection has finished or `grace` has
    /// passed, cutting the rest: [`Server::drain_blocking`]. Returns how
    /// many connections were cut.
    pub fn shutdown_blocking(self, grace: Duration) -> usize {
        self.drain_blocking(grace).cut
    }

    /// Waits until every accept loop has ended (after [`Server::stop`], or
    /// because one failed); then, if the server was stopped, drains it:
    /// waits for its connections to finish, up to
    /// [`ServerOptions::drain_timeout`] from now, and cuts the rest.
    /// Returns the first error of an accept loop.
    pub async fn stopped(mut self) -> io::Result<()> {
        let first = self.end_accept_loops().await;
        if self.shared.is_stopped() {
            let timeout = self.drain_timeout;
            let (started, open) = self.begin_drain(timeout);
            self.finish_drain(started, open, timeout).await;
        }
        first
    }

    /// Awaits every accept loop; the first error.
    async fn end_accept_loops(&mut self) -> io::Result<()> {
        let mut first = Ok(());
        for l in std::mem::take(&mut self.accept_loops) {
            let ended = match l.await {
                Ok(r) => r,
                Err(e) => Err(io::Error::other(e.to_string())),
            };
            if first.is_ok() {
                first = ended;
            }
        }
        first
    }

    /// The start of every drain: the sockets are no longer offered to a
    /// successor (a drain without one closes them), the drain is counted
    /// and logged, and accepting stops. Returns when it began and how many
    /// connections were open.
    fn begin_drain(&mut self, timeout: Duration) -> (Instant, usize) {
        if let Some((handover, id)) = self.handover.take() {
            handover.withdraw(id);
        }
        let open = self.active_connections();
        count_event(&LIFECYCLE.drains, 1);
        let why = if self.is_handed_over() { "handed over to a successor" } else { "stopping" };
        crate::log::info(format_args!(
            "server on {}: draining ({why}): {open} connections open, cut after {timeout:?}",
            self.label
        ));
        // Before the stop, whose wake-up the handlers read it after.
        self.shared.drain_timeout_ms.store(millis(timeout), Ordering::Release);
        self.shared.stop();
        (Instant::now(), open)
    }

    /// Waits for the connections up to the deadline, cuts the rest.
    async fn finish_drain(&self, started: Instant, open: usize, timeout: Duration) -> Drained {
        let idle = poll_fn(|cx| {
            if self.shared.poll_idle(cx.waker()) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        });
        if crate::time::timeout_at(started + timeout, idle).await.is_err() {
            self.cut();
            let idle = poll_fn(|cx| {
                if self.shared.poll_idle(cx.waker()) {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            });
            let _ = crate::time::timeout(DRAIN_CUT_WAIT, idle).await;
        }
        self.report(started, open)
    }

    /// Cuts every connection still open: each handler ends at its next
    /// poll, and every task of every worker is woken for it.
    fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        for worker in 0..self.handle.workers() {
            // Detached: the task runs once on the worker and ends.
            drop(self.handle.spawn_on(worker, || async {
                crate::runtime::wake_all();
            }));
        }
    }

    /// What the drain did, logged; `drain_cut` counts the connections cut
    /// and those still open (cut, but not yet polled again: a process that
    /// exits after the drain never ends them otherwise), so the counter
    /// says what the report says.
    fn report(&self, started: Instant, open: usize) -> Drained {
        let cut = self.shared.cut_count.load(Ordering::SeqCst);
        let drained =
            Drained { open, cut, left: self.active_connections(), took: started.elapsed() };
        count_event(&LIFECYCLE.drain_cut, (drained.cut + drained.left) as u64);
        if cut > 0 || drained.left > 0 {
            crate::log::warn(format_args!(
                "server on {}: drained in {:?}; {cut} connections cut at the drain deadline{}",
                self.label,
                drained.took,
                if drained.left > 0 {
                    format!(", {} not yet ended (their workers are busy)", drained.left)
                } else {
                    String::new()
                }
            ));
        } else {
            crate::log::info(format_args!(
                "server on {}: drained in {:?}; every connection finished",
                self.label, drained.took
            ));
        }
        drained
    }
}

/// What a drain did ([`Server::drain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Connections open when the drain began.
    pub open: usize,
    /// Connections cut at the deadline.
    pub cut: usize,
    /// Connections still open when the drain returned: cut, but on a
    /// worker that had not polled them again within [`DRAIN_CUT_WAIT`].
    pub left: usize,
    /// How long the drain took.
    pub took: Duration,
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::VecDeque;
    use std::os::fd::{AsRawFd, RawFd};

    use super::*;

    thread_local! {
        /// The connections (by descriptor) whose stream cannot be made.
        static BROKEN: RefCell<Vec<RawFd>> = const { RefCell::new(Vec::new()) };
    }

    /// A listener whose accepts, driver queue and backlog are given; its
    /// stream is the connection's descriptor, which cannot be made for
    /// those in `BROKEN` (a registration that fails, say).
    #[derive(Default)]
    struct Scripted {
        taken: RefCell<VecDeque<io::Result<Accepted>>>,
        backlog: RefCell<VecDeque<io::Result<Accepted>>>,
        /// What `accept_fd` hands out, in turn; once it is empty an accept
        /// waits for ever.
        incoming: Rc<RefCell<VecDeque<Accepted>>>,
        /// Runs as `accept_fd` hands out its next connection: what another
        /// worker does between the loop's look at the limit and its accept.
        meanwhile: RefCell<Option<Box<dyn FnOnce()>>>,
    }

    impl Accept for Scripted {
        type Stream = OwnedFd;
        fn from_fd(_: OwnedFd, _: ListenerOptions) -> io::Result<Self> {
            unreachable!("made by the test")
        }
        fn accept_fd(&self) -> impl Future<Output = io::Result<Accepted>> + '_ {
            poll_fn(|_| {
                let Some(accepted) = self.incoming.borrow_mut().pop_front() else {
                    return Poll::Pending;
                };
                if let Some(meanwhile) = self.meanwhile.borrow_mut().take() {
                    meanwhile();
                }
                Poll::Ready(Ok(accepted))
            })
        }
        fn stream_from_accepted(accepted: Accepted) -> io::Result<OwnedFd> {
            let Accepted::Fd(fd) = accepted else { unreachable!("plain descriptors only") };
            if BROKEN.with(|b| b.borrow().contains(&fd.as_raw_fd())) {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            Ok(fd)
        }
        fn accept_fd_ready(&self) -> Option<io::Result<Accepted>> {
            self.backlog.borrow_mut().pop_front()
        }
        fn set_accept_room(&self, _: Option<usize>) {}
        fn poll_accept_settled(&self, _: &mut Context<'_>) -> Poll<()> {
            Poll::Ready(())
        }
        fn take_accepted(&self) -> Option<io::Result<Accepted>> {
            self.taken.borrow_mut().pop_front()
        }
    }

    /// A stopping loop's connection whose stream cannot be made is counted
    /// in `accepted_unserved`, and the connections after it are served,
    /// from the driver's queue and from the backlog; an accept that lost
    /// its connection does not end the backlog's turn, one out of
    /// descriptors does.
    #[test]
    fn a_left_over_connection_without_a_stream_is_counted_and_the_rest_served() {
        let rt = crate::Runtime::builder().workers(1).build().unwrap();
        let (served, left) = rt.block_on(async {
            let fds: Vec<OwnedFd> =
                (0..6).map(|_| std::fs::File::open("/dev/null").unwrap().into()).collect();
            let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
            BROKEN.with(|b| b.borrow_mut().extend([raw[1], raw[3]]));
            let mut fds = fds.into_iter().map(|fd| Ok(Accepted::Fd(fd)));
            let err = |code| Err(io::Error::from_raw_os_error(code));
            let mut next = || fds.next().unwrap();
            let listener = Scripted {
                taken: RefCell::new(VecDeque::from([next(), err(libc::EMFILE), next(), next()])),
                backlog: RefCell::new(VecDeque::from([
                    next(),
                    err(libc::ECONNABORTED),
                    next(),
                    err(libc::EMFILE),
                    next(),
                ])),
                ..Default::default()
            };
            let mut served = Vec::new();
            serve_left_over(&listener, true, || true, |s| served.push(s.as_raw_fd()));
            let left = listener.backlog.borrow().len();
            (served == [raw[0], raw[2], raw[4]], left)
        });
        assert!(served, "the connections after the one without a stream were not all served");
        assert_eq!(left, 1, "the backlog's turn ends at an accept out of descriptors");
        assert_eq!(rt.stats().block_on.accepted_unserved, 2);
    }

    fn dev_null() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    /// The drivers to run on: io_uring too where it can run.
    fn drivers() -> Vec<crate::DriverKind> {
        let mut drivers = vec![crate::DriverKind::Epoll];
        if !crate::__private::skip_uring_test() {
            drivers.push(crate::DriverKind::Uring);
        }
        drivers
    }

    /// Runs `test` on worker 0 of a two-worker runtime on `driver`, given
    /// the lanes of a server on it and a server's state. Worker 1 runs no
    /// accept loop: what is handed to it waits in its lane.
    fn on_worker_0<T, F, Fut>(driver: crate::DriverKind, test: F) -> T
    where
        F: FnOnce(Arc<Lanes>, Arc<ServerShared>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
        T: Send + 'static,
    {
        let rt = crate::Runtime::builder().workers(2).driver(driver).build().unwrap();
        let lanes = Arc::new(Lanes::new(Balance::Count, rt.handle().inner.workers.clone()));
        let shared = Arc::new(ServerShared::new(&ServerOptions::default()));
        rt.handle().spawn_on(0, move || test(lanes, shared)).join().unwrap()
    }

    /// Worker 0's primary accept loop on `listener`, as a task.
    fn spawn_loop<H, Fut>(
        listener: Scripted,
        shared: &Arc<ServerShared>,
        lanes: &Arc<Lanes>,
        global: usize,
        handler: H,
    ) -> crate::runtime::JoinHandle<io::Result<()>>
    where
        H: Fn(OwnedFd, StopSignal) -> Fut + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let limits =
            Limits { global: Some(global), per_worker: None, balance: Balance::Count, loops: 2 };
        let local = Rc::new(WorkerConns::new(shared.clone(), current::worker_shared()));
        let place = Place { lanes: lanes.clone(), me: 0, primary: true };
        crate::runtime::spawn(accept_loop(
            listener,
            shared.clone(),
            Arc::new(handler),
            limits,
            local,
            place,
        ))
    }

    /// Waits (up to 5 s) until `done()`.
    async fn until(mut done: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            if Instant::now() >= deadline {
                return false;
            }
            crate::time::sleep(Duration::from_millis(2)).await;
        }
        true
    }

    /// A connection handed to a worker that has not taken it yet counts
    /// against the server's limit from its accept: the accepting worker
    /// takes no more than the limit, however long it waits in the lane.
    /// Before, it counted only once taken, and worker 0 accepted a third
    /// connection at a limit of two while the second waited in worker 1's
    /// lane. A connection left in a lane frees its slot when dropped.
    #[test]
    fn a_connection_waiting_in_a_lane_counts_against_the_limit() {
        for driver in drivers() {
            let (accepted, active, in_lane, after) =
                on_worker_0(driver, |lanes, shared| async move {
                    let listener = Scripted::default();
                    listener.incoming.borrow_mut().extend((0..6).map(|_| Accepted::Fd(dev_null())));
                    let incoming = listener.incoming.clone();
                    let serving = spawn_loop(listener, &shared, &lanes, 2, |fd, stop| async move {
                        stop.stopping().await;
                        drop(fd);
                    });
                    // Count balancing keeps the first connection (ties stay)
                    // and hands the second to worker 1, which holds none.
                    crate::time::sleep(Duration::from_millis(50)).await;
                    let accepted = 6 - incoming.borrow().len();
                    let active = shared.active.load(Ordering::SeqCst);
                    let in_lane = lanes.has_queued(1);
                    shared.stop();
                    serving.await.unwrap().unwrap();
                    // Worker 0's handler ends at the stop; worker 1's lane closes.
                    drop(lanes.close(1));
                    until(|| shared.active.load(Ordering::SeqCst) == 0).await;
                    (accepted, active, in_lane, shared.active.load(Ordering::SeqCst))
                });
            assert!(in_lane, "{driver:?}: nothing was handed to worker 1");
            assert_eq!(accepted, 2, "{driver:?}: connections accepted at a limit of 2");
            assert_eq!(active, 2, "{driver:?}: the connection in the lane is not counted");
            assert_eq!(after, 0, "{driver:?}: slots left taken after the stop");
        }
    }

    /// An accept loop waiting for a slot under the server's limit serves
    /// what other workers hand it: those connections hold their slots,
    /// perhaps the very ones it waits for. So at the top of the loop, and
    /// while it holds a connection of its own that found the last slot
    /// gone; and a stopping loop serves what its lane holds on the slots
    /// they hold, counting none twice.
    #[test]
    fn a_loop_at_the_limit_serves_the_connections_handed_to_it() {
        for driver in drivers() {
            let (served, stop_count, after) = on_worker_0(driver, |lanes, shared| async move {
                let handed = |shared: &Arc<ServerShared>| {
                    let slot = shared.try_take_slot(Some(1)).expect("the slot is free");
                    Handed { fd: dev_null(), slot }
                };
                // The only slot goes to a connection handed to worker 0,
                // once its loop waits at the limit.
                let first = handed(&shared);
                let listener = Scripted::default();
                // Its own connection, accepted after the first ends: as it
                // is, another worker takes the slot and hands its
                // connection here.
                listener.incoming.borrow_mut().push_back(Accepted::Fd(dev_null()));
                let (other_shared, other_lanes) = (shared.clone(), lanes.clone());
                *listener.meanwhile.borrow_mut() = Some(Box::new(move || {
                    assert!(other_lanes.offer(0, handed(&other_shared)).is_ok());
                }));
                let served = Rc::new(Cell::new(0));
                let count = served.clone();
                let serving = spawn_loop(listener, &shared, &lanes, 1, move |fd, _| {
                    count.set(count.get() + 1);
                    async move {
                        crate::time::sleep(Duration::from_millis(20)).await;
                        drop(fd);
                    }
                });
                crate::time::sleep(Duration::from_millis(20)).await;
                assert!(lanes.offer(0, first).is_ok());
                if !until(|| served.get() == 3).await {
                    return (served.get(), 1, 0);
                }
                let served = served.get();
                // Handed in as the server stops: the stopping loop serves
                // it, on its own slot.
                until(|| shared.active.load(Ordering::SeqCst) == 0).await;
                assert!(lanes.offer(0, handed(&shared)).is_ok());
                shared.stop();
                serving.await.unwrap().unwrap();
                let stop_count = shared.active.load(Ordering::SeqCst);
                until(|| shared.active.load(Ordering::SeqCst) == 0).await;
                (served, stop_count, shared.active.load(Ordering::SeqCst))
            });
            assert_eq!(served, 3, "{driver:?}: a loop at the limit left connections waiting");
            assert_eq!(stop_count, 1, "{driver:?}: the stopping loop's connection counted twice");
            assert_eq!(after, 0, "{driver:?}: slots left taken after the stop");
        }
    }
}
