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

use std::future::{poll_fn, Future};
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use std::cell::Cell;
use std::rc::Rc;

use super::balance::{hand_off, LaneGuard, Lanes};
use super::listener::{bind_socket, Accept, TcpListener};
use super::options::{Balance, ListenerOptions, ServerOptions};
use super::stream::TcpStream;
use super::unix::{bind_unix_socket, UnixListener, UnixStream};
use crate::runtime::shared::WorkerShared;
use crate::runtime::{
    current, run_now_if_alone, spawn_detached_with, Handle, OnDone, RemoteJoinHandle, TaskKey,
};

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
}

/// A running [`serve_unix`] server: a [`Server`] that listens on a path.
pub type UnixServer = Server<PathBuf>;

struct ServerShared {
    stopped: Mutex<(bool, Vec<Waker>)>,
    /// `stopped.0`, read without the lock: an accept loop checks it on
    /// every poll, and the lock is shared by every worker.
    stopped_now: AtomicBool,
    active: AtomicUsize,
    /// Accept loops parked at the global limit, on any worker: a connection
    /// that finishes anywhere wakes them.
    slot_waiters: Mutex<Vec<Waker>>,
    /// `slot_waiters.len()`, read without the lock by finishing connections.
    slot_waiting: AtomicUsize,
}

impl ServerShared {
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
    /// The accept loop, parked because a limit was reached.
    waiting: Cell<Option<Waker>>,
    /// Set by this worker's accept loop when the server stops.
    stopping: Cell<bool>,
}

impl WorkerConns {
    fn new(server: Arc<ServerShared>, worker: Arc<WorkerShared>) -> Self {
        WorkerConns {
            server,
            worker,
            active: Cell::new(0),
            waiting: Cell::new(None),
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

/// Tells a connection handler that its server is stopping, so it can end
/// the connection cleanly (finish the request in flight, then close)
/// before the grace period of [`Server::shutdown_blocking`] runs out.
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
        self.local.server.active.fetch_sub(1, Ordering::SeqCst);
        self.local.active.set(self.local.active.get() - 1);
        self.local.worker.load.connection_closed();
        if let Some(w) = self.local.waiting.take() {
            w.wake();
        }
        self.local.server.wake_slot_waiters();
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
    let (mut options, limits) = split_options(options.into());
    if handle.workers() > 1 {
        options.reuse_port = true;
    }
    let first = bind_socket(addr, &options)?;
    let local_addr = crate::sys::local_addr(std::os::fd::AsRawFd::as_raw_fd(&first))?;
    let mut sockets = vec![first];
    for _ in 1..handle.workers() {
        sockets.push(bind_socket(local_addr, &options)?);
    }
    let label = local_addr.to_string();
    Ok(start::<TcpListener, _, _, _>(handle, local_addr, label, sockets, options, limits, handler))
}

/// [`serve`] over a Unix domain socket at `path`: every worker of
/// `handle`'s runtime accepts on a copy of one listening socket (see the
/// module notes) and runs `handler(stream)` as a task for each connection
/// it accepts.
///
/// Binding fails with `AddrInUse` if the path exists, unless
/// [`ListenerOptions::remove_stale_socket`] is set and the file is a socket
/// nobody listens on (one left by a previous run). Stopping the server
/// leaves the socket file in place.
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
    let (options, limits) = split_options(options.into());
    let first = bind_unix_socket(path, &options)?;
    let mut sockets = Vec::with_capacity(handle.workers());
    for _ in 1..handle.workers() {
        match first.try_clone() {
            Ok(fd) => sockets.push(fd),
            Err(e) => {
                // The file is ours (the bind just made it) and nobody will accept on it.
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        }
    }
    sockets.insert(0, first);
    let label = path.display().to_string();
    Ok(start::<UnixListener, _, _, _>(
        handle,
        path.to_path_buf(),
        label,
        sockets,
        options,
        limits,
        handler,
    ))
}

/// The listener options and the connection limits of `options`.
fn split_options(options: ServerOptions) -> (ListenerOptions, Limits) {
    let limits = Limits {
        global: options.maxconn,
        per_worker: options.maxconn_per_worker,
        balance: options.balance,
    };
    (options.listener, limits)
}

/// Starts one accept loop per socket, socket `i` on worker `i`.
fn start<L, A, H, Fut>(
    handle: &Handle,
    local_addr: A,
    label: String,
    sockets: Vec<OwnedFd>,
    options: ListenerOptions,
    limits: Limits,
    handler: H,
) -> Server<A>
where
    L: Accept,
    H: Fn(L::Stream, StopSignal) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let shared = Arc::new(ServerShared {
        stopped: Mutex::new((false, Vec::new())),
        stopped_now: AtomicBool::new(false),
        active: AtomicUsize::new(0),
        slot_waiters: Mutex::new(Vec::new()),
        slot_waiting: AtomicUsize::new(0),
    });
    let lanes = Arc::new(Lanes::new(limits.balance, handle.inner.workers.clone()));
    let handler = Arc::new(handler);
    let accept_loops = sockets
        .into_iter()
        .enumerate()
        .map(|(worker, fd)| {
            let shared = shared.clone();
            let handler = handler.clone();
            let options = options.clone();
            let lanes = lanes.clone();
            handle.spawn_on(worker, move || async move {
                // Whatever ends the loop (a stop, an error, the worker's
                // loop failing) closes this worker's lane first.
                let lane = LaneGuard { lanes, me: worker };
                let listener = L::from_fd(fd, options)?;
                accept_loop(listener, shared, handler, limits, &lane).await
            })
        })
        .collect();
    Server { local_addr, label, shared, accept_loops }
}

/// The connection limits of one server.
#[derive(Debug, Clone, Copy)]
struct Limits {
    global: Option<usize>,
    per_worker: Option<usize>,
    balance: Balance,
}

/// A connection for the accept loop: one it accepted, or one another
/// worker handed to it.
enum Arrival {
    Accepted(OwnedFd),
    HandedIn(OwnedFd),
}

async fn accept_loop<L, H, Fut>(
    listener: L,
    shared: Arc<ServerShared>,
    handler: Arc<H>,
    limits: Limits,
    lane: &LaneGuard,
) -> io::Result<()>
where
    L: Accept,
    H: Fn(L::Stream, StopSignal) -> Fut + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let local = Rc::new(WorkerConns::new(shared.clone(), current::worker_shared()));
    let (lanes, me) = (&*lane.lanes, lane.me);
    let balancing = lanes.enabled();
    // The loop's waker is filed for the stop once (a task's waker does not
    // change); each poll after that reads an atomic, not the lock every
    // worker's accept loop shares.
    let mut stop_filed = false;
    loop {
        if at_limit(&shared, &local, limits) {
            current::count(|s| &s.maxconn_reached);
            // On io_uring this stops the armed accept: the clients that wait
            // do so in the kernel's backlog, not as descriptors here.
            listener.set_accept_room(Some(0));
            while at_limit(&shared, &local, limits) && !shared.is_stopped() {
                wait_for_a_free_slot(&shared, &local, limits).await;
            }
        }
        // The driver accepts no further ahead than the slots left.
        listener.set_accept_room(room(&shared, &local, limits));
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
                if let Some(fd) = lanes.take(me) {
                    return Poll::Ready(Some(Ok(Arrival::HandedIn(fd))));
                }
                accept.as_mut().poll(cx).map(|r| Some(r.map(Arrival::Accepted)))
            })
            .await
        };
        match accepted {
            None => {
                local.set_stopping();
                // Stopping: serve what the kernel already accepted into our
                // queue; closing the listener would reset those connections.
                while !at_limit(&shared, &local, limits) {
                    let Some(Ok(stream)) = listener.accept_ready() else { break };
                    shared.active.fetch_add(1, Ordering::AcqRel);
                    start_handler(stream, &local, &*handler);
                }
                // Connections other workers handed here were accepted:
                // served whatever the limit, as a connection held at the
                // limit is once the server stops.
                for fd in lanes.close(me) {
                    let Ok(stream) = L::stream_from_fd(fd) else { continue };
                    shared.active.fetch_add(1, Ordering::AcqRel);
                    start_handler(stream, &local, &*handler);
                }
                return Ok(());
            }
            Some(Ok(arrival)) => {
                let fd = match arrival {
                    Arrival::Accepted(fd) => match hand_off(lanes, me, fd) {
                        None => continue,
                        Some(fd) => fd,
                    },
                    Arrival::HandedIn(fd) => {
                        current::count(|s| &s.handoffs_in);
                        fd
                    }
                };
                // A connection whose stream cannot be made (its descriptor
                // is closed with the error) is one the peer sees reset.
                let Ok(stream) = L::stream_from_fd(fd) else { continue };
                // Another worker may have taken the last slot since the check
                // above: hold the connection (it is not closed) until one frees.
                while !try_reserve(&shared, &local, limits) {
                    if shared.is_stopped() {
                        shared.active.fetch_add(1, Ordering::AcqRel);
                        break;
                    }
                    current::count(|s| &s.maxconn_reached);
                    wait_for_a_free_slot(&shared, &local, limits).await;
                }
                let handler_task = start_handler(stream, &local, &*handler);
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

/// How many more connections this worker may take now (`None`: no limit).
fn room(shared: &ServerShared, local: &WorkerConns, limits: Limits) -> Option<usize> {
    let worker = limits.per_worker.map(|max| max.saturating_sub(local.active.get()));
    let global = limits.global.map(|max| max.saturating_sub(shared.active.load(Ordering::Acquire)));
    match (worker, global) {
        (Some(w), Some(g)) => Some(w.min(g)),
        (w, g) => w.or(g),
    }
}

fn at_limit(shared: &ServerShared, local: &WorkerConns, limits: Limits) -> bool {
    limits.per_worker.is_some_and(|max| local.active.get() >= max)
        || limits.global.is_some_and(|max| shared.active.load(Ordering::SeqCst) >= max)
}

/// Waits until a slot may be free: a connection finished on this worker
/// or, under a global limit, on any worker; or the server stops.
async fn wait_for_a_free_slot(shared: &ServerShared, local: &WorkerConns, limits: Limits) {
    poll_fn(|cx| {
        if !at_limit(shared, local, limits) || shared.poll_stopped(cx.waker()) {
            local.waiting.take();
            return Poll::Ready(());
        }
        local.waiting.set(Some(cx.waker().clone()));
        if limits.global.is_some() {
            shared.park_for_slot(cx.waker());
            // A connection may have finished elsewhere between the check and parking.
            if !at_limit(shared, local, limits) {
                local.waiting.take();
                return Poll::Ready(());
            }
        }
        Poll::Pending
    })
    .await
}

/// Takes a slot under the global limit (atomically: workers race for it)
/// and the per-worker one; false if either is full.
fn try_reserve(shared: &ServerShared, local: &WorkerConns, limits: Limits) -> bool {
    if limits.per_worker.is_some_and(|max| local.active.get() >= max) {
        return false;
    }
    match limits.global {
        None => {
            shared.active.fetch_add(1, Ordering::AcqRel);
            true
        }
        Some(max) => shared
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .is_ok(),
    }
}

/// Starts the handler of a connection whose slot in the server's `active`
/// count is already taken.
fn start_handler<S, H, Fut>(stream: S, local: &Rc<WorkerConns>, handler: &H) -> TaskKey
where
    H: Fn(S, StopSignal) -> Fut + 'static,
    Fut: Future<Output = ()> + 'static,
{
    local.active.set(local.active.get() + 1);
    local.worker.load.connection_opened();
    let guard = ActiveGuard { local: local.clone() };
    let stop = StopSignal { local: local.clone() };
    spawn_detached_with(move || OnDone::new(handler(stream, stop), move |()| drop(guard)))
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

    /// Stops accepting on every worker and closes the listeners.
    /// Connections already accepted keep running.
    pub fn stop(&self) {
        crate::log::info(format_args!(
            "server on {}: stopping accepts, {} connections in flight",
            self.label,
            self.active_connections()
        ));
        self.shared.stop();
    }

    /// Stops accepting, then waits (blocking the calling thread, which must
    /// not be a worker) until every connection has finished or `grace` has
    /// passed. Returns how many connections were still active.
    pub fn shutdown_blocking(self, grace: Duration) -> usize {
        self.stop();
        for l in self.accept_loops {
            let _ = l.join();
        }
        let deadline = Instant::now() + grace;
        while self.shared.active.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let left = self.shared.active.load(Ordering::Acquire);
        crate::log::info(format_args!(
            "server on {}: stopped, {left} connections cut at the grace limit",
            self.label
        ));
        left
    }

    /// Waits until every accept loop has ended (after [`Server::stop`], or
    /// because one failed); returns the first error.
    pub async fn stopped(self) -> io::Result<()> {
        let mut first = Ok(());
        for l in self.accept_loops {
            match l.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    if first.is_ok() {
                        first = Err(e);
                    }
                }
                Err(e) => {
                    if first.is_ok() {
                        first = Err(io::Error::other(e.to_string()));
                    }
                }
            }
        }
        first
    }
}
