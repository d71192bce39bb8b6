//! The listener and its accept policy.
//!
//! # Implementation notes
//! The accept bound works per loop turn: after `accepts_per_wakeup_max`
//! connections in one turn, `accept` waits until the worker has polled its
//! driver again, so the connections just accepted (and every other task)
//! run before more are taken, as DragonFly's `soavailconn` and nginx
//! without `multi_accept` do. The listener stays ready in the meantime: on
//! edge-triggered epoll no new edge is needed, because the next `accept`
//! tries the syscall before waiting.
//!
//! With [`AcceptPacing`] the bound moves. At the first accept of each turn
//! the listener updates a budget: it halves when the worker is behind (the
//! previous turn, measured from this listener's first accept in it to the
//! first accept in this one, took longer than the target, or the run queue
//! is longer than its target) and grows by a step otherwise. A turn is only
//! timed when the previous one ended on the budget: the accept loop then
//! waits for the next driver poll, which does not block (a waker is queued
//! for after it), so the time measured is work, not idle waiting. The
//! budget also bounds how many connections the driver may accept ahead of
//! the loop, so on io_uring a paced listener never arms the multishot
//! accept (see `Acceptor::update_driver_room`).
//!
//! Near the open-file limit the listener takes one connection per turn, on
//! both drivers (on io_uring a multishot accept is stopped, so the kernel
//! does not fill the table in one go). The kernel hands out the lowest free
//! descriptor, so an accepted descriptor numbered within
//! [`SCARCE_RESERVE_MAX`] of the limit means at most that many are left;
//! the connections just accepted then get to open what they need (a
//! proxy's backend socket, a file) before the next accept takes another.
//! Running out (`EMFILE`) counts as scarce too. A run of failures is one
//! episode, logged when it begins and when accepting has worked for
//! [`EXHAUSTION_QUIET`] since its last failure.
//!
//! Before an accept that ran out of descriptors (`EMFILE`, `ENFILE`)
//! pauses, the worker's reclaimers run ([`on_descriptor_shortage`]): code
//! that keeps descriptors it can spare (a cache of open files) closes
//! them, and if any closed the accept is tried again at once, once. A
//! cache then never keeps a client out; the pause is for descriptors that
//! connections hold.

use std::cell::{Cell, RefCell};
use std::future::{poll_fn, Future};
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use socket2::{Domain, SockAddr, Socket, Type};

use super::options::{AcceptPacing, ListenerOptions};
use super::stream::TcpStream;
use crate::driver::{Accepted, ListenerSource};
use crate::runtime::{current, yield_to_driver};
use crate::stats;
use crate::sys;

/// The most descriptors left below the open-file limit at which accepting
/// slows to one connection per loop turn (a sixteenth of the limit, if
/// less, for small limits).
pub const SCARCE_RESERVE_MAX: u64 = 16;

/// How long accepting must work without a resource failure before a run
/// of failures is reported as over; shorter gaps are one episode.
pub const EXHAUSTION_QUIET: Duration = Duration::from_secs(1);

thread_local! {
    /// What code on this thread can close when descriptors run out (see
    /// [`on_descriptor_shortage`]).
    static RECLAIMERS: RefCell<Vec<Box<dyn Fn() -> usize>>> = const { RefCell::new(Vec::new()) };
}

/// Registers `reclaim` on the current thread (a worker): when an accept of
/// a listener on this worker fails because the process or the system has
/// no descriptor left (`EMFILE`, `ENFILE`), every function registered here
/// is called, and if together they closed any descriptor the accept is
/// tried again at once instead of pausing for
/// [`ListenerOptions::resource_pause`]. `reclaim` closes what it can spare
/// (the idle entries of a cache of open files) and returns how many
/// descriptors it closed. It must not register or reclaim again from
/// inside the call. Register once per worker: each registration is called.
pub fn on_descriptor_shortage(reclaim: impl Fn() -> usize + 'static) {
    RECLAIMERS.with(|r| r.borrow_mut().push(Box::new(reclaim)));
}

/// Runs this thread's reclaimers; how many descriptors they closed.
fn reclaim_descriptors() -> usize {
    RECLAIMERS.with(|r| match r.try_borrow() {
        Ok(reclaimers) => reclaimers.iter().map(|reclaim| reclaim()).sum(),
        // A reclaimer that accepts: nothing more to give.
        Err(_) => 0,
    })
}

/// A TCP listening socket bound to one worker.
pub struct TcpListener {
    acceptor: Acceptor,
}

impl TcpListener {
    /// Binds with the default options.
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<TcpListener> {
        Self::bind_with(addr, ListenerOptions::default())
    }

    /// Binds with `options`.
    pub fn bind_with(
        addr: impl ToSocketAddrs,
        options: ListenerOptions,
    ) -> io::Result<TcpListener> {
        let fd = bind_socket(addr, &options)?;
        Self::from_fd(fd, options)
    }

    /// Wraps an already listening, non-blocking socket (see [`bind_socket`]).
    pub(crate) fn from_fd(fd: OwnedFd, options: ListenerOptions) -> io::Result<TcpListener> {
        Ok(TcpListener { acceptor: Acceptor::new(fd, options)? })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        sys::local_addr(self.acceptor.fd())
    }

    /// The options it was created with.
    pub fn options(&self) -> &ListenerOptions {
        self.acceptor.options()
    }

    /// Accepts a connection and looks up its peer address.
    ///
    /// A connection that was reset before its address could be read is
    /// skipped, as if it had died in the queue.
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        loop {
            let stream = self.accept_stream().await?;
            match stream.peer_addr() {
                Ok(addr) => return Ok((stream, addr)),
                Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => count_reset_in_queue(),
                Err(e) => return Err(e),
            }
        }
    }

    /// Accepts a connection without looking up its peer address (one
    /// syscall less; [`TcpStream::peer_addr`] finds it when needed).
    ///
    /// Running out of descriptors pauses accepting for
    /// [`ListenerOptions::resource_pause`] and counts the error; connections
    /// that died in the queue are skipped. Other errors are returned.
    pub async fn accept_stream(&self) -> io::Result<TcpStream> {
        TcpStream::from_accepted(self.acceptor.accept_fd().await?)
    }

    /// Says how many more connections the caller will take before it says
    /// otherwise (`None`: no limit). A server at its connection limit sets
    /// `Some(0)`. On io_uring the driver then accepts no more than that
    /// ahead of the caller (a multishot accept is stopped, single accepts
    /// are used below the limit), so the rest wait in the kernel's backlog
    /// and hold no descriptor; on epoll connections are only accepted when
    /// asked for anyway.
    pub fn set_accept_room(&self, room: Option<usize>) {
        self.acceptor.set_accept_room(room);
    }

    /// Accepts under the policy of [`Self::accept_stream`], handing back
    /// the descriptor (a server may pass it to another worker).
    pub(crate) async fn accept_fd(&self) -> io::Result<Accepted> {
        self.acceptor.accept_fd().await
    }

    /// Takes a connection only if one is ready now, ignoring the accept
    /// bound: for draining the queue when a server stops, so that the
    /// connections the kernel already accepted are served, not reset.
    pub fn accept_ready(&self) -> Option<io::Result<TcpStream>> {
        Some(self.acceptor.accept_fd_ready()?.and_then(TcpStream::from_accepted))
    }
}

impl AsRawFd for TcpListener {
    fn as_raw_fd(&self) -> RawFd {
        self.acceptor.fd()
    }
}

impl AsFd for TcpListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.acceptor.as_fd()
    }
}

/// What the accept loop needs of a listener: [`TcpListener`] and
/// [`UnixListener`](super::UnixListener) (monomorphised, so the TCP loop is what it was).
pub(crate) trait Accept: Sized + 'static {
    /// The connection type it hands to handlers.
    type Stream: 'static;
    fn from_fd(fd: OwnedFd, options: ListenerOptions) -> io::Result<Self>;
    /// Accepts under the listener's policy, without making a stream yet
    /// (the connection may be handed to another worker).
    fn accept_fd(&self) -> impl Future<Output = io::Result<Accepted>> + '_;
    /// A stream on the current worker over an accepted connection.
    fn stream_from_accepted(accepted: Accepted) -> io::Result<Self::Stream>;
    /// A connection from the driver's queue or the socket's backlog if one
    /// is there now, ignoring the accept bound, as a descriptor.
    fn accept_fd_ready(&self) -> Option<io::Result<Accepted>>;
    fn set_accept_room(&self, room: Option<usize>);
    /// Ready once the driver holds no accept in the kernel for this
    /// listener (see [`Acceptor::poll_accept_settled`]).
    fn poll_accept_settled(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()>;
    /// A connection the driver already accepted, never one from the
    /// socket's backlog, as a descriptor.
    fn take_accepted(&self) -> Option<io::Result<Accepted>>;
}

impl Accept for TcpListener {
    type Stream = TcpStream;
    fn from_fd(fd: OwnedFd, options: ListenerOptions) -> io::Result<Self> {
        TcpListener::from_fd(fd, options)
    }
    fn accept_fd(&self) -> impl Future<Output = io::Result<Accepted>> + '_ {
        TcpListener::accept_fd(self)
    }
    fn stream_from_accepted(accepted: Accepted) -> io::Result<TcpStream> {
        TcpStream::from_accepted(accepted)
    }
    fn accept_fd_ready(&self) -> Option<io::Result<Accepted>> {
        self.acceptor.accept_fd_ready()
    }
    fn set_accept_room(&self, room: Option<usize>) {
        TcpListener::set_accept_room(self, room)
    }
    fn poll_accept_settled(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.acceptor.poll_accept_settled(cx)
    }
    fn take_accepted(&self) -> Option<io::Result<Accepted>> {
        self.acceptor.take_accepted()
    }
}

/// Counts a connection that was reset before its peer address could be read.
pub(crate) fn count_reset_in_queue() {
    current::count(|s| &s.accept_errors_aborted);
}

/// The accept policy over one listening socket, whatever its family: the
/// per-turn bound, pacing, and the pause after running out of descriptors.
/// [`TcpListener`] and [`UnixListener`](super::UnixListener) each hold one.
pub(crate) struct Acceptor {
    src: ListenerSource,
    options: ListenerOptions,
    /// The loop turn of the last accept, and how many were taken in it.
    batch_turn: Cell<u64>,
    batch_count: Cell<usize>,
    /// Accepting resumes at this instant after running out of descriptors.
    paused_until: Cell<Option<Instant>>,
    /// The current run of resource failures (out of descriptors or memory),
    /// so it is logged once when it begins and once when it ends, not at
    /// every retry.
    exhausted: Cell<Option<Exhaustion>>,
    /// Descriptors numbered at or above this are near the open-file limit.
    scarce_from: RawFd,
    /// True while descriptors are scarce: one accept per turn.
    scarce: Cell<bool>,
    /// How many connections the owner said it will take (`usize::MAX`: no limit).
    owner_room: Cell<usize>,
    /// With accept pacing: this turn's budget and when the turn's first accept came.
    pace_budget: Cell<usize>,
    pace_turn_started: Cell<Option<u64>>,
}

impl Acceptor {
    /// Wraps an already listening, non-blocking socket on the current worker's driver.
    pub(crate) fn new(fd: OwnedFd, options: ListenerOptions) -> io::Result<Acceptor> {
        let acceptor = Acceptor {
            src: current::with_driver(|d| ListenerSource::new(d, fd))?,
            batch_turn: Cell::new(u64::MAX),
            batch_count: Cell::new(0),
            paused_until: Cell::new(None),
            exhausted: Cell::new(None),
            scarce_from: scarce_from(),
            scarce: Cell::new(false),
            owner_room: Cell::new(usize::MAX),
            pace_budget: Cell::new(options.accept_pacing.map_or(1, |p| p.accepts_increase.max(1))),
            pace_turn_started: Cell::new(None),
            options,
        };
        // A paced listener bounds the driver from its first accept on.
        acceptor.update_driver_room();
        Ok(acceptor)
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.src.fd()
    }

    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        self.src.as_fd()
    }

    pub(crate) fn options(&self) -> &ListenerOptions {
        &self.options
    }

    /// Accepts a connection under the policy (see
    /// [`TcpListener::accept_stream`]).
    pub(crate) async fn accept_fd(&self) -> io::Result<Accepted> {
        let mut reclaimed = false;
        loop {
            if let Some(until) = self.paused_until.take() {
                crate::time::sleep_until(until).await;
            }
            if self.bound_reached() {
                current::count(|s| &s.accept_bound_hits);
                yield_to_driver().await;
            }
            let mode = self.options.accept_mode;
            let accept = poll_fn(|cx| self.src.poll_accept(cx, mode));
            // During a run of failures, waiting ends at the run's quiet
            // point too, so its end is reported even if no client comes.
            let result = match self.exhausted.get() {
                Some(run) => {
                    match crate::time::timeout_at(run.last_failure + EXHAUSTION_QUIET, accept).await
                    {
                        Ok(result) => result,
                        Err(_) => {
                            // The timer says the quiet spell is over.
                            if let Some(run) = self.exhausted.take() {
                                run.report_end();
                            }
                            continue;
                        }
                    }
                }
                None => accept.await,
            };
            match result {
                Ok(fd) => {
                    self.count_accept();
                    // A direct socket takes none of the process's descriptors.
                    self.set_scarce(fd.raw_fd().is_some_and(|raw| raw >= self.scarce_from));
                    self.end_exhaustion();
                    return Ok(fd);
                }
                Err(e)
                    if !reclaimed
                        && matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
                        && reclaim_descriptors() > 0 =>
                {
                    // Descriptors came back: once, try again without the
                    // pause (still one accept per turn: few are left).
                    reclaimed = true;
                    current::count(|s| &s.accept_errors_resources);
                    self.set_scarce(true);
                }
                Err(e) => self.on_accept_error(e)?,
            }
        }
    }

    /// See [`TcpListener::set_accept_room`].
    pub(crate) fn set_accept_room(&self, room: Option<usize>) {
        self.owner_room.set(room.unwrap_or(usize::MAX));
        self.update_driver_room();
    }

    /// Tells the driver how far ahead of the accept loop it may accept:
    /// the owner's room; at most one while descriptors are scarce; and,
    /// with pacing, the budget, whether the worker is behind or has caught
    /// up. Bounded, io_uring's driver does not arm its multishot accept,
    /// which takes a whole backlog in one enter, and takes connections one
    /// `accept4` at a time when asked, as epoll's loop does; the rest wait
    /// in the kernel's backlog. A worker that caught up during a quiet spell
    /// is the one a burst finds with the most waiting (a storm's handshakes
    /// retransmitted together fill the backlog at once): a multishot accept
    /// armed then took the whole backlog into one enter and ahead of the
    /// budget.
    fn update_driver_room(&self) {
        let mut room = self.owner_room.get();
        if self.options.accept_pacing.is_some() {
            room = room.min(self.pace_budget.get());
        }
        if self.scarce.get() {
            room = room.min(1);
        }
        self.src.set_accept_room(room);
    }

    /// Enters or leaves the scarce state (see the module notes).
    fn set_scarce(&self, scarce: bool) {
        if self.scarce.replace(scarce) != scarce {
            self.update_driver_room();
        }
    }

    /// The largest budget pacing gives a turn.
    fn pace_max(&self) -> usize {
        self.options.accepts_per_wakeup_max.unwrap_or(ListenerOptions::ACCEPTS_PACED_MAX).max(1)
    }

    /// See [`TcpListener::accept_ready`].
    pub(crate) fn accept_fd_ready(&self) -> Option<io::Result<Accepted>> {
        match self.src.accept_now(self.options.accept_mode)? {
            Ok(fd) => {
                self.count_accept();
                self.set_scarce(fd.raw_fd().is_some_and(|raw| raw >= self.scarce_from));
                self.end_exhaustion();
                Some(Ok(fd))
            }
            Err(e) => Some(Err(e)),
        }
    }

    /// Ready once the driver holds no accept in the kernel for this
    /// listener: after `set_accept_room(Some(0))`, io_uring's accept is
    /// cancelled and this waits for its last completion, so no connection
    /// is taken from the socket on this listener's behalf afterwards (on
    /// epoll, ready at once). A socket shared with another process (a
    /// successor during a hand-over) then loses no connection to an accept
    /// nobody would take.
    pub(crate) fn poll_accept_settled(
        &self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        self.src.poll_accept_settled(cx)
    }

    /// A connection the driver already accepted (io_uring's queue), never
    /// one from the socket's backlog; counted as accepted.
    pub(crate) fn take_accepted(&self) -> Option<io::Result<Accepted>> {
        let got = self.src.take_accepted()?;
        if got.is_ok() {
            self.count_accept();
        }
        Some(got)
    }

    /// True if this turn's batch is full.
    fn bound_reached(&self) -> bool {
        // The count first: until a batch is full, an accept then looks up
        // the turn only once, when it counts itself.
        self.batch_count.get() >= self.turn_limit() && self.batch_turn.get() == current::turn()
    }

    /// The most connections this turn may take.
    fn turn_limit(&self) -> usize {
        if self.scarce.get() {
            return 1;
        }
        match self.options.accept_pacing {
            Some(_) => self.pace_budget.get(),
            None => self.options.accepts_per_wakeup_max.unwrap_or(usize::MAX),
        }
    }

    fn count_accept(&self) {
        current::with_turn(|t| {
            let s = t.stats();
            let turn = t.number();
            if self.batch_turn.get() != turn {
                if let Some(pacing) = self.options.accept_pacing {
                    // The loop's clock of this turn: the pacing times whole
                    // turns, so it needs no clock read of its own.
                    self.pace(&pacing, turn, t.now_ns(), t.run_queue_len());
                }
                self.batch_turn.set(turn);
                self.batch_count.set(0);
                if self.options.count_in_stats {
                    stats::add(&s.accept_wakeups, 1);
                }
            }
            let n = self.batch_count.get() + 1;
            self.batch_count.set(n);
            if self.options.count_in_stats {
                stats::add(&s.accepted, 1);
                stats::raise(&s.max_accepted_per_wakeup, n as u64);
            }
        });
    }

    /// Updates the pacing budget at the first accept of `turn` (see the
    /// module notes).
    fn pace(&self, pacing: &AcceptPacing, turn: u64, now_ns: u64, run_queue_len: usize) {
        let max = self.pace_max();
        let budget = self.pace_budget.get();
        // The previous turn ended on the budget and this is the next one: it was all work.
        let timed =
            self.batch_turn.get().wrapping_add(1) == turn && self.batch_count.get() >= budget;
        let slow = timed
            && self.pace_turn_started.get().is_some_and(|t| {
                u128::from(now_ns.saturating_sub(t)) > pacing.turn_target.as_nanos()
            });
        let behind = slow || run_queue_len > pacing.run_queue_target;
        let next = if behind { budget / 2 } else { budget + pacing.accepts_increase };
        let next = next.clamp(1, max);
        self.pace_budget.set(next);
        self.pace_turn_started.set(Some(now_ns));
        if next != budget {
            self.update_driver_room();
        }
    }

    /// Ends a run of resource failures, saying how long it lasted, once
    /// accepting has worked for [`EXHAUSTION_QUIET`] since its last failure.
    fn end_exhaustion(&self) {
        if let Some(run) = self.exhausted.get() {
            if run.last_failure.elapsed() >= EXHAUSTION_QUIET {
                self.exhausted.set(None);
                run.report_end();
            }
        }
    }

    /// Classifies an accept error: `Ok` to keep accepting, `Err` to give up.
    fn on_accept_error(&self, e: io::Error) -> io::Result<()> {
        current::with_turn(|t| {
            let s = t.stats();
            match e.raw_os_error() {
                Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                    // Said once per run of failures, not per retry; the line
                    // at the run's end says how many there were. A run ends
                    // only after a quiet spell, so failures that come and go
                    // (descriptors freed one at a time) are one episode.
                    let now = Instant::now();
                    let run = match self.exhausted.get() {
                        Some(run) if now - run.last_failure < EXHAUSTION_QUIET => run,
                        earlier => {
                            if let Some(run) = earlier {
                                run.report_end();
                            }
                            crate::log::warn(format_args!(
                                "worker {}: accept failed ({e}); retrying every {:?} until it works (raise the open-file limit or lower maxconn)",
                                t.worker_index(), self.options.resource_pause
                            ));
                            Exhaustion {
                                worker: t.worker_index(),
                                since: now,
                                last_failure: now,
                                failures: 0,
                            }
                        }
                    };
                    self.exhausted.set(Some(Exhaustion {
                        last_failure: now,
                        failures: run.failures + 1,
                        ..run
                    }));
                    self.set_scarce(true);
                    stats::add(&s.accept_errors_resources, 1);
                    stats::add(&s.accept_pauses, 1);
                    self.paused_until.set(Some(Instant::now() + self.options.resource_pause));
                    Ok(())
                }
                // Giving up would leave the queue filling with nobody accepting.
                _ if connection_lost(&e) => {
                    stats::add(&s.accept_errors_aborted, 1);
                    Ok(())
                }
                _ => {
                    stats::add(&s.accept_errors_other, 1);
                    Err(e)
                }
            }
        })
    }
}

/// True if a failed accept lost one connection and the listener is fine:
/// the connection died before it was taken, or (accept(2): "the network
/// errors defined for the protocol", passed on from the new socket) its
/// path failed. The next accept may succeed.
pub(crate) fn connection_lost(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::EPROTO
                | libc::EPERM
                | libc::EINTR
                | libc::ENETDOWN
                | libc::ENOPROTOOPT
                | libc::EHOSTDOWN
                | libc::ENONET
                | libc::EHOSTUNREACH
                | libc::EOPNOTSUPP
                | libc::ENETUNREACH
        )
    )
}

/// One run of accept failures for lack of resources.
#[derive(Clone, Copy)]
struct Exhaustion {
    worker: usize,
    since: Instant,
    last_failure: Instant,
    failures: u64,
}

impl Exhaustion {
    fn report_end(&self) {
        crate::log::warn(format_args!(
            "worker {}: accepting again after {} failed accepts over {:?}",
            self.worker,
            self.failures,
            self.last_failure - self.since
        ));
    }
}

/// The descriptor number from which descriptors count as scarce, from the
/// open-file limit in force when the listener is made.
fn scarce_from() -> RawFd {
    let limit = sys::nofile_soft_limit().unwrap_or(u64::MAX);
    let reserve = (limit / 16).clamp(1, SCARCE_RESERVE_MAX);
    limit.saturating_sub(reserve).min(RawFd::MAX as u64) as RawFd
}

impl std::fmt::Debug for TcpListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpListener")
            .field("fd", &self.acceptor.fd())
            .field("addr", &self.local_addr().ok())
            .finish()
    }
}

/// Creates a non-blocking listening socket with `options` applied.
/// Needs no runtime: the server helper binds on one thread and hands the
/// socket to a worker.
pub(crate) fn bind_socket(
    addr: impl ToSocketAddrs,
    options: &ListenerOptions,
) -> io::Result<OwnedFd> {
    let mut last_err = None;
    for addr in addr.to_socket_addrs()? {
        match bind_one(&addr, options) {
            Ok(fd) => return Ok(fd),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err
        .unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to bind to")))
}

/// Applies `options` to a listening socket this process did not bind (a
/// predecessor's, or systemd's), as far as a bound socket allows: the
/// backlog (`listen(2)` again), `TCP_NODELAY` and `TCP_DEFER_ACCEPT`.
/// `SO_REUSEPORT` stays as it was bound.
pub(crate) fn adopt_listener(fd: &OwnedFd, options: &ListenerOptions) -> io::Result<()> {
    let socket = socket2::SockRef::from(fd);
    socket.set_nonblocking(true)?;
    if options.nodelay {
        socket.set_tcp_nodelay(true)?;
    }
    let defer = options.defer_accept_secs.map_or(0, |secs| secs.min(i32::MAX as u32) as i32);
    sys::setsockopt_int(fd.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT, defer)?;
    socket.listen(options.backlog.min(i32::MAX as u32) as i32)
}

fn bind_one(addr: &SocketAddr, options: &ListenerOptions) -> io::Result<OwnedFd> {
    let socket = Socket::new(Domain::for_address(*addr), Type::STREAM.nonblocking(), None)?;
    socket.set_reuse_address(true)?;
    if options.reuse_port {
        socket.set_reuse_port(true)?;
    }
    if options.nodelay {
        socket.set_tcp_nodelay(true)?;
    }
    if let Some(secs) = options.defer_accept_secs {
        sys::setsockopt_int(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            secs.min(i32::MAX as u32) as i32,
        )?;
    }
    socket.bind(&SockAddr::from(*addr))?;
    socket.listen(options.backlog.min(i32::MAX as u32) as i32)?;
    Ok(socket.into())
}
