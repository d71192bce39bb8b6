//! Socket hand-over between processes, for upgrades that refuse and cut
//! nothing, and systemd's socket activation (`LISTEN_FDS`).
//!
//! A [`Handover`] is the set of listening sockets a process got from
//! elsewhere (its predecessor, or systemd) and the set it offers to a
//! successor. Servers built with one ([`ServerOptions::handover`](super::ServerOptions::handover)) take an
//! inherited socket for their address instead of binding, and offer
//! theirs; once the process serves, [`Handover::ready`] tells the
//! predecessor to stop accepting and waits for a successor.
//!
//! ```no_run
//! use hotloop::net::{serve, Handover, ServerOptions};
//! # fn main() -> std::io::Result<()> {
//! let rt = hotloop::Runtime::new()?;
//! // The first process binds; a later one with the same path gets its sockets.
//! let handover = Handover::open("/run/app/upgrade.sock")?;
//! let options = ServerOptions { handover: Some(handover.clone()), ..Default::default() };
//! let server = serve(rt.handle(), "0.0.0.0:8080", options, |stream| async move { drop(stream) })?;
//! // The predecessor, if any, stops accepting and drains.
//! if let Err(e) = handover.ready() {
//!     // It goes on serving: answer what this process accepted, then exit
//!     // (returning at once would drop the runtime and cut it).
//!     server.drain_blocking(std::time::Duration::from_secs(30));
//!     return Err(e);
//! }
//! handover.wait_replaced(None); // until a successor has taken the sockets
//! server.drain_blocking(std::time::Duration::from_secs(30));
//! # Ok(()) }
//! ```
//!
//! # The exchange
//! Over a `SOCK_SEQPACKET` Unix socket at the path, which the first
//! process binds and every successor inherits with the others:
//! 1. A new process connects. The running one (its hand-over thread,
//!    started by [`Handover::ready`]) checks that the peer runs as the
//!    same user (root hands nothing to another user; the socket file is
//!    made mode 0600), then sends a header (`hotloop-handover 1 pid=P
//!    sockets=N`) and its sockets in messages of up to 64 descriptors
//!    (`SCM_RIGHTS`): every listening TCP socket of every server (all
//!    members of each `SO_REUSEPORT` group), the UDP sockets, Unix
//!    listeners, and the upgrade socket itself.
//! 2. The new process starts its servers on them and sends `ready`. A
//!    new process that ends first (it cannot start, it panics) closes the
//!    connection instead: the running one logs it, counts it
//!    (`upgrade_failures`) and goes on serving and waiting for another.
//!    One that says nothing for [`READY_WAIT`] (or what
//!    [`Handover::set_ready_wait`] set) from its connection (stuck in its
//!    start-up, stopped by a signal) is dropped the same way: the running
//!    one sends it `late` and closes the connection, so the next successor
//!    on the path is served. A `ready` that comes after the `late` is not
//!    taken: the late process's [`Handover::ready`] fails, and it must not
//!    serve.
//! 3. On `ready` the running process stops accepting (each server's
//!    accept loops end; on io_uring their accepts are cancelled and the
//!    last completion awaited, so no connection is taken on its behalf
//!    afterwards), answers `draining`, and drains what it holds. The new
//!    process's accept loops then try their backlogs once: the kernel
//!    wakes a single io_uring accept per connection, and if that was the
//!    old process's, cancelled before it ran, the connection would wait
//!    in the queue for the next one to arrive.
//!
//! A running process that stops on its own ([`Handover::close`]) while a
//! successor has its sockets and has not answered runs the stops of step 3
//! at once: that successor serves anyway (its `ready` finds this process
//! gone or silent), so nothing of this process may go on taking from the
//! sockets (a QUIC endpoint reading them would take its datagrams).
//!
//! # Implementation notes
//! The new process receives the very same sockets, not new members of a
//! `SO_REUSEPORT` group: a connection waiting in a socket's accept queue
//! belongs to the socket, not to the process, so none is lost while both
//! processes hold it, and none is lost when the old one closes its
//! descriptors. Binding new group members and closing the old ones would
//! reset whatever waited in the old members' queues (unless
//! `net.ipv4.tcp_migrate_req` is set, and even then not the requests a
//! closing listener's multishot accept had taken). For the same reason a
//! socket whose predecessor's worker count differs is still served whole:
//! the server spreads every inherited member over its workers.
//!
//! The descriptors are classified by the kernel (`SO_DOMAIN`, `SO_TYPE`,
//! `getsockname`, `SO_ACCEPTCONN`), not by the lines sent with them, the
//! same way for systemd's sockets and a predecessor's.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use socket2::{Domain, SockAddr, SockRef, Socket, Type};

use super::udp::UdpOptions;
use crate::stats::{count_event, LIFECYCLE};
use crate::sys;

/// How long a new process waits for the running one to send its sockets
/// (it may be busy with another successor).
pub const HANDOVER_WAIT: Duration = Duration::from_secs(30);

/// How long a successor waits for its predecessor to say it stopped
/// accepting, after it said it was ready.
pub const STOP_ACK_WAIT: Duration = Duration::from_secs(10);

/// How long a running process waits, by default, for a successor that
/// connected to say it is ready before it drops that one and waits for
/// another ([`Handover::set_ready_wait`] changes it). Under
/// [`HANDOVER_WAIT`], so a successor that connected behind one that hangs
/// still gets the sockets before it gives up; a successor's start-up
/// after it has the sockets (its servers, TLS files, a proxy's
/// configuration) takes far less.
pub const READY_WAIT: Duration = Duration::from_secs(20);

/// How often the hand-over thread looks whether it was closed while it
/// waits for a successor, in milliseconds.
const CLOSED_POLL_MS: i32 = 100;

/// The longest message of the exchange.
const MESSAGE_BYTES_MAX: usize = 16 * 1024;

/// The first systemd descriptor (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: RawFd = 3;

/// Set once this process has looked at `LISTEN_FDS`: the descriptors are
/// taken once, by the first [`Handover`] made.
static LISTEN_FDS_TAKEN: AtomicBool = AtomicBool::new(false);

/// What a listening socket is, as the kernel says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Local {
    /// A listening TCP socket bound to this address.
    Tcp(SocketAddr),
    /// A UDP socket bound to this address.
    Udp(SocketAddr),
    /// A listening Unix stream socket bound to this path.
    Unix(PathBuf),
}

impl fmt::Display for Local {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Local::Tcp(a) => write!(f, "tcp {a}"),
            Local::Udp(a) => write!(f, "udp {a}"),
            Local::Unix(p) => write!(f, "unix {}", p.display()),
        }
    }
}

/// The sockets a process got from its predecessor or from systemd, and
/// those it offers to a successor (see the module docs).
///
/// Cloning gives another handle on the same set.
#[derive(Clone)]
pub struct Handover {
    inner: Arc<Inner>,
}

struct Inner {
    /// The upgrade socket's path, if there is one.
    path: Option<PathBuf>,
    state: Mutex<State>,
    /// Signalled when a successor has taken over.
    changed: Condvar,
    /// Set by [`Handover::close`]: no successor is taken any more.
    closed: AtomicBool,
    /// How long a successor may take to say it is ready, in milliseconds
    /// ([`Handover::set_ready_wait`]).
    ready_wait_ms: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Received sockets no server has taken yet.
    inherited: Vec<(Local, OwnedFd)>,
    /// What systemd's `LISTEN_FDS` gave (some of `inherited`, until taken).
    activated: Vec<Local>,
    /// Copies of the sockets this process serves, by the id of what
    /// offered them.
    offered: Vec<(u64, Local, OwnedFd)>,
    /// What stops accepting when a successor takes over, by id; taken
    /// (so run once) when one does, or at [`Handover::close`] during an
    /// exchange.
    members: Vec<(u64, Arc<dyn Fn() + Send + Sync>)>,
    /// The sockets have gone to a successor that has not answered yet.
    exchanging: bool,
    /// What looks at the sockets' backlogs once the predecessor stopped
    /// accepting, by id.
    rechecks: Vec<(u64, Arc<dyn Fn() + Send + Sync>)>,
    next_id: u64,
    /// The process that handed its sockets over, until it is told to stop.
    predecessor: Option<(u32, Socket)>,
    /// Its pid, kept after.
    predecessor_pid: Option<u32>,
    /// The upgrade socket, until the hand-over thread takes it.
    upgrade: Option<OwnedFd>,
    readied: bool,
    /// The successor that took over.
    replaced_by: Option<u32>,
    wakers: Vec<Waker>,
}

impl Handover {
    /// A hand-over with systemd's sockets only: when `LISTEN_PID` names
    /// this process, the `LISTEN_FDS` descriptors from 3 on are taken
    /// (once per process), and servers built with this hand-over use them
    /// instead of binding their addresses. No upgrade socket.
    ///
    /// The first hand-over made removes `LISTEN_PID`, `LISTEN_FDS` and
    /// `LISTEN_FDNAMES` from the environment (a child must not take them
    /// for its own): make it at start-up, before threads that read the
    /// environment through C (`getenv`) run.
    pub fn inherit() -> io::Result<Handover> {
        let handover = Handover::with_path(None);
        handover.take_listen_fds()?;
        Ok(handover)
    }

    /// [`Handover::inherit`], and the upgrade socket at `path`: if a
    /// process listens there, its sockets are received now (waiting up to
    /// [`HANDOVER_WAIT`]) for this process's servers to take; otherwise
    /// this process is the first, binds its own addresses, and binds
    /// `path` (a socket file nobody listens on is replaced) to wait for a
    /// successor once [`ready`](Self::ready).
    ///
    /// Processes opening the same path at once take turns on an exclusive
    /// `flock` of `PATH.lock` (made beside it, mode 0600, and left there),
    /// so that only one binds: two refused by a stale file would both
    /// replace it, and the first one's fresh socket would be orphaned.
    pub fn open(path: impl AsRef<Path>) -> io::Result<Handover> {
        let path = path.as_ref();
        let handover = Handover::with_path(Some(path.to_path_buf()));
        handover.take_listen_fds()?;
        let sock = Socket::new(Domain::UNIX, Type::SEQPACKET, None)?;
        let addr = SockAddr::unix(path).map_err(|e| with_path(e, "upgrade socket", path))?;
        // Held from the connect to the bind and listen below.
        let turn = lock_beside(path)?;
        match connect_unix(&sock, &addr) {
            Ok(()) => {
                // Connected: the next process may look at the path.
                drop(turn);
                handover.receive(sock, path)?
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => handover.bind_upgrade(path, &addr)?,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                // A socket file nobody listens on: left by a process that
                // stopped. Anything else at the path is left alone, and the
                // bind below says the path is in use.
                if std::fs::symlink_metadata(path)
                    .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
                {
                    let _ = std::fs::remove_file(path);
                }
                handover.bind_upgrade(path, &addr)?
            }
            Err(e) => return Err(with_path(e, "connect to the upgrade socket", path)),
        }
        Ok(handover)
    }

    fn with_path(path: Option<PathBuf>) -> Handover {
        Handover {
            inner: Arc::new(Inner {
                path,
                state: Mutex::new(State::default()),
                changed: Condvar::new(),
                closed: AtomicBool::new(false),
                ready_wait_ms: AtomicU64::new(READY_WAIT.as_millis() as u64),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.lock()
    }

    /// The upgrade socket's path, if this hand-over has one.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// How long a successor that received this process's sockets may take
    /// to say it is ready ([`READY_WAIT`] unless set): after it, this
    /// process tells it `late`, closes the connection, counts a failed
    /// successor (`upgrade_failures`), goes on serving and waits for
    /// another. Counted from the successor's connection; at least 1 ms.
    pub fn set_ready_wait(&self, limit: Duration) {
        let ms = limit.as_millis().clamp(1, u128::from(u64::MAX)) as u64;
        self.inner.ready_wait_ms.store(ms, Ordering::Relaxed);
    }

    /// See [`Self::set_ready_wait`].
    pub fn ready_wait(&self) -> Duration {
        self.inner.ready_wait()
    }

    /// The pid of the process whose sockets this one received, if any.
    pub fn predecessor(&self) -> Option<u32> {
        self.lock().predecessor_pid
    }

    /// Received sockets no server has taken yet.
    pub fn inherited(&self) -> usize {
        self.lock().inherited.len()
    }

    /// Says that this process serves: received sockets no server took are
    /// closed (and logged: an address the new configuration dropped), the
    /// predecessor is told to stop accepting and drain (this waits up to
    /// [`STOP_ACK_WAIT`] for it to say it stopped), and with an upgrade
    /// socket a thread starts waiting for a successor. Once the
    /// predecessor stopped, the servers of this process (and whatever
    /// [`Self::on_predecessor_stopped`] filed) look at their backlogs once.
    /// Later calls do nothing.
    ///
    /// Call it last in start-up: once the predecessor is told, nobody else
    /// serves, so whatever can fail must have been done before. An error
    /// comes before the predecessor is told, or when it answers `late`
    /// (it had stopped waiting for this process, after its
    /// [ready wait](Self::set_ready_wait); the error's kind is
    /// `TimedOut`): either way the predecessor goes on serving, so this
    /// process must not (it should drain what it accepted and exit), and
    /// it takes no successor.
    ///
    /// A socket systemd gave (`LISTEN_FDS`) that no server took is an
    /// error (`InvalidInput`, naming it), not a socket closed with a
    /// warning: its clients would wait in its queue, which systemd keeps
    /// open, for ever.
    pub fn ready(&self) -> io::Result<()> {
        let (predecessor, unclaimed, upgrade, activated) = {
            let mut st = self.lock();
            if std::mem::replace(&mut st.readied, true) {
                return Ok(());
            }
            let unclaimed = std::mem::take(&mut st.inherited);
            let activated = std::mem::take(&mut st.activated);
            (st.predecessor.take(), unclaimed, st.upgrade.take(), activated)
        };
        let unserved: Vec<String> = unclaimed
            .iter()
            .filter(|(local, _)| activated.contains(local))
            .map(|(local, _)| local.to_string())
            .collect();
        if !unserved.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "socket activation: no server of this process serves the LISTEN_FDS socket \
                     {} (serve its address, or leave it out of the socket unit)",
                    unserved.join(", ")
                ),
            ));
        }
        for (local, _) in &unclaimed {
            crate::log::warn(format_args!(
                "hand-over: inherited socket {local} is not served by this process; closing it"
            ));
        }
        drop(unclaimed);
        // The thread is started first, as what can fail, and given the
        // upgrade socket once the predecessor is told: until then that one
        // still hands over to successors.
        let successors = match upgrade {
            Some(listener) => {
                let (give, take) = std::sync::mpsc::channel::<OwnedFd>();
                let inner = self.inner.clone();
                std::thread::Builder::new().name("hotloop-handover".into()).spawn(move || {
                    if let Ok(listener) = take.recv() {
                        serve_successors(&inner, listener);
                    }
                })?;
                Some((give, listener))
            }
            None => None,
        };
        if let Some((pid, conn)) = predecessor {
            conn.set_read_timeout(Some(STOP_ACK_WAIT))?;
            // Refused: the thread, never given the upgrade socket, ends.
            tell_predecessor(pid, &conn)?;
            // Whatever it answered, it takes no more connections: what it
            // left queued is this process's, and its last accepts may have
            // taken the wake-ups that would have told this process so.
            let rechecks: Vec<_> = self.lock().rechecks.iter().map(|(_, r)| r.clone()).collect();
            for recheck in rechecks {
                recheck();
            }
        }
        if let Some((give, listener)) = successors {
            // The thread waits on the other end for as long as it lives.
            let _ = give.send(listener);
        }
        Ok(())
    }

    /// True once a successor has taken the sockets over (this process no
    /// longer accepts; it should drain and exit).
    pub fn is_replaced(&self) -> bool {
        self.lock().replaced_by.is_some()
    }

    /// The pid of the successor that took the sockets over, once one has.
    pub fn successor(&self) -> Option<u32> {
        self.lock().replaced_by
    }

    /// Blocks until a successor has taken the sockets over (true), or
    /// `limit` has passed (false; `None` waits for ever).
    pub fn wait_replaced(&self, limit: Option<Duration>) -> bool {
        let deadline = limit.and_then(|l| Instant::now().checked_add(l));
        let mut st = self.lock();
        while st.replaced_by.is_none() {
            st = match deadline {
                None => self.inner.changed.wait(st).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    self.inner
                        .changed
                        .wait_timeout(st, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
        true
    }

    /// Completes once a successor has taken the sockets over.
    pub fn replaced(&self) -> Replaced {
        Replaced { handover: self.clone() }
    }

    /// Stops waiting for a successor (the process is stopping on its own):
    /// the hand-over thread ends within 100 ms and closes its copy of the
    /// upgrade socket, and a successor being started is not taken. Before
    /// [`ready`](Self::ready), the predecessor learns that this process
    /// will not serve (the connection closes) and goes on serving; `ready`
    /// then does nothing.
    ///
    /// A successor that has the sockets already and has not said it is
    /// ready serves them anyway (its predecessor is gone or silent: see
    /// its `ready`), so when one does, the hand-over's stops
    /// ([`Self::on_hand_over`]) run here, before this returns: a QUIC
    /// endpoint of this process must not go on reading the sockets it
    /// serves.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        let (untold, stops) = {
            let mut st = self.lock();
            st.readied = true;
            let stops = if st.exchanging { std::mem::take(&mut st.members) } else { Vec::new() };
            (st.predecessor.take(), stops)
        };
        drop(untold);
        for (_, stop) in stops {
            stop();
        }
    }

    /// `count` UDP sockets on `addr` for one endpoint per worker: the
    /// inherited ones bound to `addr` (port 0 matches any port on that
    /// address) whatever their number, or new ones bound with `options`
    /// (`reuse_port` must be on for more than one). They are offered to a
    /// successor from now on, for the life of the process.
    pub fn udp_sockets(
        &self,
        addr: SocketAddr,
        count: usize,
        options: &UdpOptions,
    ) -> io::Result<Vec<std::net::UdpSocket>> {
        let fds = match self.take(|l, fd| matches!(l, Local::Udp(a) if serves(addr, *a, fd))) {
            Some((_, fds)) => fds,
            None => {
                let first = bind_udp(addr, options)?;
                let bound = sys::local_addr(first.as_raw_fd())?;
                let mut fds = vec![first];
                for _ in 1..count.max(1) {
                    fds.push(bind_udp(bound, options)?);
                }
                fds
            }
        };
        let local = Local::Udp(sys::local_addr(fds[0].as_raw_fd())?);
        let id = self.new_id();
        self.offer(id, &local, &fds)?;
        Ok(fds.into_iter().map(std::net::UdpSocket::from).collect())
    }

    /// Runs `stop` on the hand-over thread when a successor is ready,
    /// before it is told this process stopped accepting, or in
    /// [`Self::close`] if a successor has the sockets then: it must return
    /// once this process takes nothing more from the offered sockets (a
    /// QUIC endpoint that stops reading its socket, say). It runs once at
    /// most. Servers built with this hand-over register their own.
    pub fn on_hand_over(&self, stop: impl Fn() + Send + Sync + 'static) {
        let id = self.new_id();
        self.lock().members.push((id, Arc::new(stop)));
    }

    /// Runs `recheck` in [`Self::ready`] once the predecessor has stopped
    /// accepting (or is gone): an accept loop of this process's own should
    /// then try its sockets' backlogs once without waiting to be woken.
    /// The kernel wakes one io_uring accept per arriving connection, and
    /// the predecessor's last accept may have been that one and been
    /// cancelled before it took the connection, which then waits for the
    /// next arrival. Servers built with this hand-over register their own.
    pub fn on_predecessor_stopped(&self, recheck: impl Fn() + Send + Sync + 'static) {
        let id = self.new_id();
        self.lock().rechecks.push((id, Arc::new(recheck)));
    }

    /// A new id for what [`Self::offer`] and [`Self::add_member`] file.
    pub(crate) fn new_id(&self) -> u64 {
        let mut st = self.lock();
        st.next_id += 1;
        st.next_id
    }

    /// Takes every inherited socket of the first kind and address `want`
    /// accepts (given the socket too), with that address.
    pub(crate) fn take(
        &self,
        want: impl Fn(&Local, &OwnedFd) -> bool,
    ) -> Option<(Local, Vec<OwnedFd>)> {
        let mut st = self.lock();
        let first = st.inherited.iter().find(|(l, fd)| want(l, fd))?.0.clone();
        let (taken, kept) =
            std::mem::take(&mut st.inherited).into_iter().partition(|(l, _)| *l == first);
        st.inherited = kept;
        st.activated.retain(|l| *l != first);
        Some((first, taken.into_iter().map(|(_, fd)| fd).collect()))
    }

    /// `e`, a bind's error, naming the TCP sockets systemd gave that no
    /// server took (an address that differs from the one bound may well
    /// hold the port).
    pub(crate) fn explain_bind_error(&self, e: io::Error) -> io::Error {
        let st = self.lock();
        let given: Vec<String> = st
            .inherited
            .iter()
            .filter(|(l, _)| matches!(l, Local::Tcp(_)) && st.activated.contains(l))
            .map(|(l, _)| l.to_string())
            .collect();
        if given.is_empty() {
            return e;
        }
        io::Error::new(
            e.kind(),
            format!("{e}; LISTEN_FDS gave {}, which this address does not name", given.join(", ")),
        )
    }

    /// Offers copies of `fds` (sockets on `local`) to a successor under `id`.
    pub(crate) fn offer(&self, id: u64, local: &Local, fds: &[OwnedFd]) -> io::Result<()> {
        let copies = fds.iter().map(|fd| fd.try_clone()).collect::<io::Result<Vec<_>>>()?;
        let mut st = self.lock();
        st.offered.extend(copies.into_iter().map(|fd| (id, local.clone(), fd)));
        Ok(())
    }

    /// Files `stop` under `id` (see [`Self::on_hand_over`]).
    pub(crate) fn add_member(&self, id: u64, stop: Arc<dyn Fn() + Send + Sync>) {
        self.lock().members.push((id, stop));
    }

    /// Files `recheck` under `id` (see [`Self::on_predecessor_stopped`]).
    pub(crate) fn add_recheck(&self, id: u64, recheck: Arc<dyn Fn() + Send + Sync>) {
        self.lock().rechecks.push((id, recheck));
    }

    /// Withdraws what was filed under `id`: its offered copies close, and
    /// its stop is not called.
    pub(crate) fn withdraw(&self, id: u64) {
        let mut st = self.lock();
        // The copies close here; a close never blocks on a listening socket.
        st.offered.retain(|o| o.0 != id);
        st.members.retain(|m| m.0 != id);
        st.rechecks.retain(|m| m.0 != id);
    }

    /// Takes systemd's sockets if `LISTEN_PID` names this process (once),
    /// and removes `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES` from the
    /// environment, as `sd_listen_fds(1)` does, so that a child does not
    /// take them for its own. A descriptor that is not a socket served here
    /// (a FIFO from `ListenFIFO=`, say) is closed with a warning.
    fn take_listen_fds(&self) -> io::Result<()> {
        if LISTEN_FDS_TAKEN.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        const NAMES: [&str; 3] = ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"];
        let pid = std::env::var("LISTEN_PID").ok();
        let count = std::env::var("LISTEN_FDS").ok();
        if pid.is_some() || count.is_some() {
            for name in NAMES {
                // std's own readers of the environment take the lock this
                // takes; C code reading it meanwhile on another thread
                // (`getenv`) would not. This runs once, in the first
                // hand-over made, which the docs place at start-up.
                std::env::remove_var(name);
            }
        }
        let Some(pid) = pid.and_then(|v| v.parse::<u32>().ok()) else {
            return Ok(());
        };
        if pid != std::process::id() {
            // Meant for another process (a parent that exec'd us, say).
            return Ok(());
        }
        let count = count
            .and_then(|v| v.parse::<RawFd>().ok())
            .filter(|n| (0..=4096).contains(n))
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "LISTEN_FDS is not a descriptor count")
            })?;
        // Every one is owned (and close-on-exec) before any is looked at, so
        // none is left open for a child whatever the others are.
        let fds: Vec<_> = (LISTEN_FDS_START..LISTEN_FDS_START + count)
            .map(|raw| (raw, sys::adopt_inherited_fd(raw)))
            .collect();
        let mut taken = Vec::new();
        for (raw, fd) in fds {
            let skipped = match fd.and_then(|fd| Ok((classify(&fd)?, fd))) {
                Ok((Kind::Socket(local), fd)) => match prepare_inherited(&fd, &local) {
                    Ok(()) => {
                        taken.push((local, fd));
                        continue;
                    }
                    Err(e) => format!("{local}: {e}"),
                },
                Ok((Kind::Upgrade | Kind::Other, _)) => {
                    "not a TCP, UDP or Unix stream socket".to_string()
                }
                Err(e) => e.to_string(),
            };
            crate::log::warn(format_args!(
                "LISTEN_FDS descriptor {raw} is not served ({skipped}); closing it"
            ));
        }
        count_event(&LIFECYCLE.sockets_inherited, taken.len() as u64);
        crate::log::info(format_args!(
            "socket activation: took {} sockets from LISTEN_FDS: {}",
            taken.len(),
            taken.iter().map(|(l, _)| l.to_string()).collect::<Vec<_>>().join(", ")
        ));
        let mut st = self.lock();
        st.activated.extend(taken.iter().map(|(l, _)| l.clone()));
        st.inherited.extend(taken);
        Ok(())
    }

    /// Receives a running process's sockets over `sock`, connected to `path`.
    fn receive(&self, sock: Socket, path: &Path) -> io::Result<()> {
        sock.set_read_timeout(Some(HANDOVER_WAIT))?;
        let late = |e: io::Error| {
            if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the process on the upgrade socket {} sent no sockets within {HANDOVER_WAIT:?}",
                        path.display()
                    ),
                )
            } else {
                with_path(e, "receiving sockets over", path)
            }
        };
        let mut buf = vec![0u8; MESSAGE_BYTES_MAX];
        let (n, _) = sys::recv_with_fds(sock.as_raw_fd(), &mut buf).map_err(late)?;
        let (pid, count) = parse_header(&buf[..n]).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the process on the upgrade socket {} is not a hotloop hand-over \
                     (it sent {:?})",
                    path.display(),
                    String::from_utf8_lossy(&buf[..n.min(64)])
                ),
            )
        })?;
        let mut fds = Vec::with_capacity(count);
        while fds.len() < count {
            let (n, got) = sys::recv_with_fds(sock.as_raw_fd(), &mut buf).map_err(late)?;
            if n == 0 && got.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("pid {pid} ended before it sent all its sockets"),
                ));
            }
            fds.extend(got);
        }
        let mut st = self.lock();
        let mut names = Vec::new();
        for fd in fds {
            match classify(&fd)? {
                Kind::Socket(local) => {
                    prepare_inherited(&fd, &local)?;
                    names.push(local.to_string());
                    st.inherited.push((local, fd));
                }
                Kind::Upgrade => st.upgrade = Some(fd),
                Kind::Other => {}
            }
        }
        st.predecessor = Some((pid, sock));
        st.predecessor_pid = Some(pid);
        drop(st);
        count_event(&LIFECYCLE.sockets_inherited, names.len() as u64);
        crate::log::info(format_args!(
            "hand-over: received {} sockets from pid {pid} over {}: {}",
            names.len(),
            path.display(),
            names.join(", ")
        ));
        Ok(())
    }

    /// Binds the upgrade socket at `path`: this process is the first.
    fn bind_upgrade(&self, path: &Path, addr: &SockAddr) -> io::Result<()> {
        let listener = Socket::new(Domain::UNIX, Type::SEQPACKET, None)?;
        listener.bind(addr).map_err(|e| with_path(e, "bind the upgrade socket", path))?;
        // Only this user may connect (a connection of another is refused
        // its sockets anyway, after the uid check).
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| with_path(e, "restrict the upgrade socket", path))?;
        listener.listen(16)?;
        listener.set_nonblocking(true)?;
        self.lock().upgrade = Some(listener.into());
        crate::log::info(format_args!(
            "hand-over: no process serves on {}; this one binds its addresses and waits there for a successor",
            path.display()
        ));
        Ok(())
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ready_wait(&self) -> Duration {
        Duration::from_millis(self.ready_wait_ms.load(Ordering::Relaxed))
    }
}

impl fmt::Debug for Handover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("Handover")
            .field("path", &self.inner.path)
            .field("predecessor", &st.predecessor_pid)
            .field("inherited", &st.inherited.len())
            .field("offered", &st.offered.len())
            .field("replaced_by", &st.replaced_by)
            .finish()
    }
}

/// The future of [`Handover::replaced`].
pub struct Replaced {
    handover: Handover,
}

impl std::future::Future for Replaced {
    type Output = ();

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.handover.lock();
        if st.replaced_by.is_some() {
            return Poll::Ready(());
        }
        if !st.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            st.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// True if a socket bound to `have` serves what `want` asks for: the same
/// address, or any port on the same address when `want` asks for port 0.
pub(crate) fn same_address(want: SocketAddr, have: SocketAddr) -> bool {
    want == have || (want.port() == 0 && want.ip() == have.ip())
}

/// True if the inherited socket `fd`, bound to `have`, serves what `want`
/// asks for: [`same_address`], or, for the IPv4 wildcard (`0.0.0.0`), the
/// IPv6 wildcard of the same port on a socket that takes IPv4 too
/// (`IPV6_V6ONLY` off). That is the socket systemd makes for
/// `ListenStream=8080`, which `--addr 0.0.0.0:8080` means: closing it as
/// unclaimed and binding `0.0.0.0:8080` beside it would fail (the port is
/// in use).
pub(crate) fn serves(want: SocketAddr, have: SocketAddr, fd: &OwnedFd) -> bool {
    if same_address(want, have) {
        return true;
    }
    let wildcards = match (want, have) {
        (SocketAddr::V4(w), SocketAddr::V6(h)) => {
            w.ip().is_unspecified()
                && h.ip().is_unspecified()
                && (w.port() == 0 || w.port() == h.port())
        }
        _ => false,
    };
    wildcards && SockRef::from(fd).only_v6().is_ok_and(|only| !only)
}

/// What a received descriptor is.
enum Kind {
    Socket(Local),
    /// A listening `SOCK_SEQPACKET` Unix socket: the upgrade socket.
    Upgrade,
    Other,
}

fn classify(fd: &OwnedFd) -> io::Result<Kind> {
    let sock = SockRef::from(fd);
    let domain = sock.domain()?;
    let ty = sock.r#type()?;
    let local = sock.local_addr()?;
    Ok(if domain == Domain::UNIX {
        if ty == Type::SEQPACKET {
            Kind::Upgrade
        } else if ty == Type::STREAM && sock.is_listener()? {
            match local.as_pathname() {
                Some(p) => Kind::Socket(Local::Unix(p.to_path_buf())),
                None => Kind::Other,
            }
        } else {
            Kind::Other
        }
    } else {
        match (local.as_socket(), ty) {
            (Some(a), t) if t == Type::STREAM && sock.is_listener()? => Kind::Socket(Local::Tcp(a)),
            (Some(a), t) if t == Type::DGRAM => Kind::Socket(Local::Udp(a)),
            _ => Kind::Other,
        }
    })
}

/// A listener this process will accept on without blocking, whatever the
/// process that made it did (systemd's sockets are blocking).
fn prepare_inherited(fd: &OwnedFd, local: &Local) -> io::Result<()> {
    match local {
        Local::Tcp(_) | Local::Unix(_) => sys::set_nonblocking(fd.as_raw_fd(), true),
        // The driver sets a datagram socket's mode when it wraps it.
        Local::Udp(_) => Ok(()),
    }
}

fn bind_udp(addr: SocketAddr, options: &UdpOptions) -> io::Result<OwnedFd> {
    let fd = sys::udp_socket(&addr)?;
    if options.reuse_port {
        sys::setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    }
    if let (SocketAddr::V6(_), Some(only)) = (addr, options.only_v6) {
        sys::setsockopt_int(fd.as_raw_fd(), libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, only as i32)?;
    }
    SockRef::from(&fd).bind(&SockAddr::from(addr))?;
    Ok(fd)
}

fn parse_header(bytes: &[u8]) -> Option<(u32, usize)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut words = text.split_whitespace();
    if words.next()? != "hotloop-handover" || words.next()? != "1" {
        return None;
    }
    let (mut pid, mut count) = (None, None);
    for w in words {
        if let Some(v) = w.strip_prefix("pid=") {
            pid = v.parse().ok();
        } else if let Some(v) = w.strip_prefix("sockets=") {
            count = v.parse().ok();
        }
    }
    Some((pid?, count?))
}

/// An exclusive `flock` on `PATH.lock`, held until the file is dropped
/// (see [`Handover::open`]). The file is never removed: a process that
/// removed it could leave two others locking two different files. `None`
/// when it cannot be made (a directory this user may not write in, where
/// it could not bind the upgrade socket either: it can only connect to
/// one, which needs no turn).
fn lock_beside(path: &Path) -> io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&name)
    {
        Ok(file) => file,
        Err(_) => return Ok(None),
    };
    sys::lock_exclusive(file.as_raw_fd()).map_err(|e| with_path(e, "lock", Path::new(&name)))?;
    Ok(Some(file))
}

/// Connects `sock` to the Unix socket `addr`, again if a signal
/// interrupted the wait for room in its backlog (nothing was connected
/// then, unlike a TCP connect).
fn connect_unix(sock: &Socket, addr: &SockAddr) -> io::Result<()> {
    loop {
        match sock.connect(addr) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

fn with_path(e: io::Error, doing: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{doing} {}: {e}", path.display()))
}

/// The successor's side of step 3: `ready`, then the predecessor's word
/// that it stopped accepting (`conn` reads with a timeout). Once `ready`
/// may have reached the predecessor this process serves whatever comes
/// back, save `late`: the predecessor had stopped waiting for it and goes
/// on serving (`Err`, `TimedOut`).
fn tell_predecessor(pid: u32, conn: &Socket) -> io::Result<()> {
    if let Err(e) = sys::send_with_fds(conn.as_raw_fd(), b"ready\n", &[]) {
        // A predecessor that gave up on this process said so before it
        // closed, and its word waits here still; otherwise it stopped on
        // its own meanwhile, and this process serves either way.
        let _ = conn.set_nonblocking(true);
        if answered_late(conn) {
            return Err(late(pid));
        }
        crate::log::warn(format_args!("hand-over: pid {pid} is gone ({e}); serving alone"));
        count_event(&LIFECYCLE.upgrades_in, 1);
        return Ok(());
    }
    let mut buf = [0u8; 64];
    match sys::recv_with_fds(conn.as_raw_fd(), &mut buf) {
        Ok((n, _)) if buf[..n].starts_with(b"draining") => crate::log::info(format_args!(
            "hand-over: pid {pid} stopped accepting and drains; this process serves alone"
        )),
        Ok((n, _)) if buf[..n].starts_with(b"late") => return Err(late(pid)),
        Ok(_) => crate::log::warn(format_args!(
            "hand-over: pid {pid} ended before it said it stopped accepting; serving alone"
        )),
        Err(e) => crate::log::warn(format_args!(
            "hand-over: no word from pid {pid} that it stopped accepting ({e}); serving"
        )),
    }
    count_event(&LIFECYCLE.upgrades_in, 1);
    Ok(())
}

/// True if the predecessor's next message on `conn` is `late`.
fn answered_late(conn: &Socket) -> bool {
    let mut buf = [0u8; 64];
    matches!(sys::recv_with_fds(conn.as_raw_fd(), &mut buf), Ok((n, _)) if buf[..n].starts_with(b"late"))
}

/// The error of a successor whose predecessor stopped waiting for it.
fn late(pid: u32) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "hand-over: pid {pid} stopped waiting for this process to be ready and goes on \
             serving; this process does not take over"
        ),
    )
}

/// The hand-over thread: waits on the upgrade socket for a successor,
/// hands it everything, and on its `ready` stops this process accepting.
/// Ends once one has taken over, or the hand-over is closed.
fn serve_successors(inner: &Arc<Inner>, listener: OwnedFd) {
    let me = sys::effective_uid();
    while !inner.closed.load(Ordering::SeqCst) {
        match sys::wait_readable(listener.as_raw_fd(), CLOSED_POLL_MS) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(e) => {
                crate::log::warn(format_args!(
                    "hand-over: waiting on the upgrade socket failed ({e}); no upgrade can take over now"
                ));
                return;
            }
        }
        let conn = match SockRef::from(&listener).accept() {
            Ok((conn, _)) => conn,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                crate::log::warn(format_args!("hand-over: accept on the upgrade socket: {e}"));
                continue;
            }
        };
        let (pid, uid) = match sys::peer_cred(conn.as_fd()) {
            Ok((pid, uid, _)) => (pid as u32, uid),
            Err(_) => continue,
        };
        // Root included: a process of another user must not get sockets
        // that root bound.
        if uid != me {
            crate::log::warn(format_args!(
                "hand-over: pid {pid} runs as uid {uid}, not {me}; it gets no socket"
            ));
            continue;
        }
        let _ = conn.set_nonblocking(false);
        // Counted from here: a successor that stops reading mid-way is
        // dropped at the same time as one that never says it is ready.
        // (No deadline for a wait past what an `Instant` can hold.)
        let deadline = Instant::now().checked_add(inner.ready_wait());
        let _ = conn.set_write_timeout(Some(inner.ready_wait()));
        let handed = hand_over(inner, &conn, pid, &listener, deadline);
        inner.lock().exchanging = false;
        match handed {
            Ok(()) => {
                let wakers = {
                    let mut st = inner.lock();
                    st.replaced_by = Some(pid);
                    // What was offered now belongs to the successor too; this
                    // process's copies go.
                    st.offered.clear();
                    std::mem::take(&mut st.wakers)
                };
                inner.changed.notify_all();
                for w in wakers {
                    w.wake();
                }
                return;
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                count_event(&LIFECYCLE.upgrade_failures, 1);
                crate::log::warn(format_args!(
                    "hand-over: successor pid {pid} did not say it was ready within {:?}; \
                     dropped it: this process keeps serving and waits for another",
                    inner.ready_wait()
                ));
            }
            Err(e) => {
                count_event(&LIFECYCLE.upgrade_failures, 1);
                crate::log::warn(format_args!(
                    "hand-over: successor pid {pid} failed before it served ({e}); this process keeps serving"
                ));
            }
        }
    }
}

/// What the hand-over sends: a line naming each offered socket and a
/// copy of it (`dup`), then the upgrade socket's. The copies are made
/// under the lock and owned by the caller: a drain on another thread may
/// withdraw (close) the offered ones while the hand-over sends, and a
/// number sent after its close could name whatever the process opened
/// next (a client's connection, a file).
fn to_send(inner: &Inner, listener: &OwnedFd) -> io::Result<(Vec<String>, Vec<OwnedFd>)> {
    let st = inner.lock();
    st.offered
        .iter()
        .map(|(_, l, fd)| Ok((l.to_string(), fd.try_clone()?)))
        .chain(std::iter::once(Ok(("upgrade".to_string(), listener.try_clone()?))))
        .collect()
}

/// Steps 1 to 3 with one successor; `Err` if it never got ready (of kind
/// `TimedOut` if not by `deadline`, when it has been told `late`).
fn hand_over(
    inner: &Arc<Inner>,
    conn: &Socket,
    pid: u32,
    listener: &OwnedFd,
    deadline: Option<Instant>,
) -> io::Result<()> {
    {
        // Checked under the lock `close` takes: either it finds the
        // exchange begun (and runs the stops), or the sockets never go.
        let mut st = inner.lock();
        if inner.closed.load(Ordering::SeqCst) {
            return Err(io::Error::other("this process began stopping on its own first"));
        }
        st.exchanging = true;
    }
    let (lines, copies) = to_send(inner, listener)?;
    let fds: Vec<RawFd> = copies.iter().map(|fd| fd.as_raw_fd()).collect();
    let header = format!("hotloop-handover 1 pid={} sockets={}\n", std::process::id(), fds.len());
    sys::send_with_fds(conn.as_raw_fd(), header.as_bytes(), &[])?;
    for (names, fds) in
        lines.chunks(sys::FDS_PER_MESSAGE_MAX).zip(fds.chunks(sys::FDS_PER_MESSAGE_MAX))
    {
        sys::send_with_fds(conn.as_raw_fd(), names.join("\n").as_bytes(), fds)?;
    }
    // The successor holds its own now.
    drop(copies);
    crate::log::info(format_args!(
        "hand-over: sent {} sockets to pid {pid}; waiting for it to serve",
        fds.len() - 1
    ));
    // Step 2: wait for `ready` until the deadline, unless this process is
    // told to stop meanwhile. A successor that hangs (stuck in its start,
    // stopped by a signal) must not hold the path for ever: whoever comes
    // next waits behind it.
    loop {
        if inner.closed.load(Ordering::SeqCst) {
            return Err(io::Error::other("this process began stopping on its own first"));
        }
        let left = deadline.map_or(Duration::MAX, |d| d.saturating_duration_since(Instant::now()));
        if left.is_zero() {
            // Said before the close: a `ready` it sends from now on finds
            // this word, not `draining`, and that process does not serve.
            let _ = sys::send_with_fds(conn.as_raw_fd(), b"late\n", &[]);
            return Err(io::Error::new(io::ErrorKind::TimedOut, "it did not say it was ready"));
        }
        let wait_ms = left.as_millis().clamp(1, CLOSED_POLL_MS as u128) as i32;
        if sys::wait_readable(conn.as_raw_fd(), wait_ms)? {
            break;
        }
    }
    let mut buf = [0u8; 64];
    let (n, _) = sys::recv_with_fds(conn.as_raw_fd(), &mut buf)?;
    if !buf[..n].starts_with(b"ready") {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "it closed the upgrade connection without saying it was ready",
        ));
    }
    // Step 3.
    crate::log::info(format_args!(
        "hand-over: pid {pid} serves the sockets; this process stops accepting and drains"
    ));
    let members = std::mem::take(&mut inner.lock().members);
    for (_, stop) in members {
        stop();
    }
    let _ = sys::send_with_fds(conn.as_raw_fd(), b"draining\n", &[]);
    count_event(&LIFECYCLE.upgrades_out, 1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_names_the_pid_and_the_count() {
        assert_eq!(parse_header(b"hotloop-handover 1 pid=42 sockets=3\n"), Some((42, 3)));
        assert_eq!(parse_header(b"hotloop-handover 2 pid=42 sockets=3\n"), None);
        assert_eq!(parse_header(b"hello"), None);
    }

    #[test]
    fn port_zero_matches_any_port_on_the_address() {
        let a: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert!(same_address(a, a));
        assert!(same_address("127.0.0.1:0".parse().unwrap(), a));
        assert!(!same_address("127.0.0.2:0".parse().unwrap(), a));
        assert!(!same_address("127.0.0.1:8081".parse().unwrap(), a));
    }

    /// The sockets a hand-over sends are its own copies: a drain on another
    /// thread that withdraws the offered ones (closing them) while the
    /// hand-over sends, and the process opening more meanwhile (accepts,
    /// files) that get the freed numbers, leave them the offered sockets.
    #[test]
    fn the_sockets_sent_stay_the_offered_ones_when_a_drain_withdraws_them() {
        let handover = Handover::with_path(None);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let id = handover.new_id();
        handover.offer(id, &Local::Tcp(addr), &[OwnedFd::from(listener)]).unwrap();
        let upgrade = OwnedFd::from(Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap());
        let (lines, fds) = to_send(&handover.inner, &upgrade).unwrap();
        handover.withdraw(id);
        let _reused: Vec<std::fs::File> =
            (0..8).map(|_| std::fs::File::open("/dev/null").unwrap()).collect();
        assert_eq!(lines, [format!("tcp {addr}"), "upgrade".to_string()]);
        let sent = sys::local_addr(fds[0].as_raw_fd()).map_err(|e| e.to_string());
        assert_eq!(sent, Ok(addr), "the first socket sent is no longer the offered one");
    }

    /// systemd's `ListenStream=PORT` socket, `[::]:PORT` taking IPv4 too,
    /// serves the IPv4 wildcard of that port (or of port 0); one that
    /// takes IPv6 alone does not, nor does another port.
    #[test]
    fn the_ipv4_wildcard_matches_a_dual_stack_ipv6_wildcard() {
        let socket = |only_v6| {
            let s = Socket::new(Domain::IPV6, Type::STREAM, None).unwrap();
            s.set_only_v6(only_v6).unwrap();
            s.bind(&"[::]:0".parse::<SocketAddr>().unwrap().into()).unwrap();
            let have = s.local_addr().unwrap().as_socket().unwrap();
            (OwnedFd::from(s), have)
        };
        let (dual, have) = socket(false);
        let want = |port| SocketAddr::from(([0, 0, 0, 0], port));
        assert!(serves(want(have.port()), have, &dual));
        assert!(serves(want(0), have, &dual));
        assert!(!serves(want(have.port().wrapping_add(1)), have, &dual));
        assert!(!serves(SocketAddr::from(([127, 0, 0, 1], have.port())), have, &dual));
        let (v6, have) = socket(true);
        assert!(!serves(want(have.port()), have, &v6));
    }
}
