//! Accepting on io_uring: one multishot (or single) accept per listener,
//! its completions queued for `poll_accept`.
//!
//! # Implementation notes
//! - A listener's first `poll_accept` gives it a queue (a slot in the
//!   driver's listener slab, named by a generational key, never by the
//!   descriptor's number) and arms an `IORING_OP_ACCEPT` with
//!   `IORING_ACCEPT_MULTISHOT` (Linux 5.19+). From then on the kernel
//!   accepts every connection that arrives and posts one completion each,
//!   flagged `IORING_CQE_F_MORE` while the accept stays armed. The driver
//!   pushes each result onto the listener's queue, and `poll_accept` pops
//!   from it: the listener's per-turn bound (`net/listener.rs`) decides how
//!   many are taken per loop turn, exactly as on epoll.
//! - A completion without `F_MORE` ends the multishot (an error such as
//!   `EMFILE`, a full completion queue, a cancel). The next `poll_accept`
//!   that finds the queue empty arms it again (`multishot_rearms`). An
//!   error is queued like a connection, so the listener sees it in order.
//! - The queue is bounded by [`ACCEPT_QUEUE_MAX`]: when it fills, the
//!   multishot is cancelled, so connections wait in the kernel's backlog
//!   (where `listen(2)`'s bound applies) instead of as descriptors here.
//! - A task that polls takes one connection, whatever the room its owner
//!   set (`set_accept_room`): the room bounds what is accepted ahead of
//!   the owner, not what it asks for. A room that rises while tasks wait
//!   with no accept armed (a lower one stopped it) wakes them to arm one.
//! - In [`AcceptMode::Single`] mode each empty-queue `poll_accept` submits
//!   one plain accept, which completes once.
//! - Accepted sockets get `SOCK_CLOEXEC`. They stay blocking: io_uring
//!   never blocks the caller, and a blocking socket never sends an
//!   operation back with `EAGAIN`.
//! - With a file table (`HOTLOOP_URING_DIRECT_FDS`), a TCP listener's
//!   multishot accept fills its slots (`IORING_FILE_INDEX_ALLOC`): each
//!   connection is a direct socket, with no descriptor in the process. The
//!   kernel accepts a connection before it looks for a slot, and closes it
//!   if the table is full (`ENFILE`), so a direct accept is armed only
//!   while the table has room for every backlog that the direct accepts
//!   armed could take in one go (the listener's backlog, read from
//!   `TCP_INFO`, plus one; one for a single accept), checked at every
//!   completion too; short of it the multishot is stopped and the next
//!   one is a plain accept, which takes its descriptor before the
//!   connection. A bounded owner (accept pacing, a connection limit near),
//!   which takes connections one `accept4` at a time, arms one single
//!   direct accept instead while the table has a slot. An `ENFILE` all the same
//!   (a flood faster than the driver looks) turns direct accepts off for
//!   the driver's life, and is counted in `accept_errors_resources`.
//! - The accept holds the listening socket (a shared descriptor) until
//!   its last completion. Closing the listener drops its queue (closing
//!   every connection nobody took), withdraws an accept the kernel has not
//!   seen, and turns one it has into an orphan that is cancelled and closes
//!   whatever it still delivers.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::task::Waker;

use io_uring::{opcode, types};

use super::lifecycle::{FeedKind, Ops};
use super::multishot::{Stage, Then};
use super::ring::Ring;
use super::shared::{SharedFd, SockFd};
use crate::driver::config::AcceptMode;
use crate::slab::{Key, Slab};
use crate::stats;

/// The most accepted connections (or errors) queued per listener before
/// the multishot accept is cancelled until the queue drains.
pub(crate) const ACCEPT_QUEUE_MAX: usize = 1024;

/// A connection an accept took: a plain descriptor, or a direct socket
/// in the ring's file table.
pub(super) enum Taken {
    /// A plain descriptor.
    Fd(OwnedFd),
    /// A slot of the ring's file table.
    Direct(SockFd),
}

/// One listener's accept state.
pub(super) struct Listener {
    /// Accepted connections and errors, oldest first.
    queue: VecDeque<io::Result<Taken>>,
    /// The accept in flight, if any (its stage is in its slot).
    pub(super) op: Option<Key>,
    /// The tasks waiting in `poll_accept` (several tasks may accept on one listener).
    waiters: Vec<Waker>,
    /// True once a multishot accept has been armed (later arms are re-arms).
    armed_before: bool,
    /// True if `op` is a multishot accept.
    op_multishot: bool,
    /// The slots `op` may fill before the driver next looks, if it fills
    /// slots of the file table (the listener's backlog, and one).
    op_direct_headroom: Option<u32>,
    /// The socket's backlog if it is a TCP listener (`None` inside: not
    /// one), read once, when a direct accept is first considered.
    backlog: Option<Option<u32>>,
    /// The most connections the listener's owner will take before it says
    /// otherwise: the queue never holds more.
    room: usize,
}

impl Default for Listener {
    fn default() -> Self {
        Listener {
            queue: VecDeque::new(),
            op: None,
            waiters: Vec::new(),
            armed_before: false,
            op_multishot: false,
            op_direct_headroom: None,
            backlog: None,
            room: usize::MAX,
        }
    }
}

/// The listeners' accept queues, each in a slot named by a generational
/// key (never the descriptor's number).
pub(super) struct Listeners {
    queues: Slab<Listener>,
    /// Whether `AcceptMode::Multishot` really is multishot here.
    multishot: bool,
    /// False once the file table was found full (`ENFILE`): accepts are
    /// plain from then on.
    direct_allowed: bool,
}

impl Listeners {
    /// No listener yet; `multishot`: whether the kernel has multishot accept.
    pub(super) fn new(multishot: bool) -> Listeners {
        Listeners { queues: Slab::default(), multishot, direct_allowed: true }
    }

    /// The slots every direct accept armed may fill before the driver
    /// next looks.
    fn direct_headroom_armed(&self) -> u32 {
        self.queues
            .iter()
            .filter(|(_, l)| l.op.is_some())
            .filter_map(|(_, l)| l.op_direct_headroom)
            .sum()
    }

    /// The headroom a direct accept of the listener `lkey` on `fd` needs,
    /// if one may be armed now: a TCP listener, a file table, and room in
    /// it beside every other direct accept's for what this one may take:
    /// the listener's backlog and one if `multishot`, else one.
    fn direct_headroom(
        &mut self,
        ring: &Ring,
        lkey: Key,
        fd: &SharedFd,
        multishot: bool,
    ) -> Option<u32> {
        let table = ring.direct.as_ref()?;
        if !self.direct_allowed {
            return None;
        }
        let l = self.queues.get_mut(lkey)?;
        let backlog = (*l.backlog.get_or_insert_with(|| fd.raw_fd().and_then(listen_backlog)))?;
        let headroom = if multishot { backlog.saturating_add(1) } else { 1 };
        (table.free() >= self.direct_headroom_armed().saturating_add(headroom)).then_some(headroom)
    }

    /// Handles a completion of the accept `key` of `listener`, whose
    /// stage (`stage`) has taken it; `direct`: it fills slots of the file
    /// table.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_completion(
        &mut self,
        ring: &mut Ring,
        stage: &mut Stage,
        listener: Key,
        key: Key,
        res: i32,
        direct: bool,
        last: bool,
        woken: &mut Vec<Waker>,
    ) {
        let taken = match (res, direct, &ring.direct) {
            (res, true, Some(table)) if res >= 0 => {
                stats::add(&ring.stats.direct_accepts, 1);
                Ok(Taken::Direct(table.filled(res as u32)))
            }
            // SAFETY: an accept completion's non-negative result is a descriptor the kernel
            // just installed for this process; nothing else owns it.
            (res, _, _) if res >= 0 => Ok(Taken::Fd(unsafe { OwnedFd::from_raw_fd(res) })),
            (res, true, _) if res == -libc::ENFILE => {
                // The table was full: the kernel closed the connection it
                // had accepted. Plain accepts from now on.
                if self.direct_allowed {
                    crate::log::warn(format_args!(
                        "io_uring's file table of direct sockets was full (ENFILE); accepting \
                         plain descriptors from now on"
                    ));
                }
                self.direct_allowed = false;
                stats::add(&ring.stats.accept_errors_resources, 1);
                Err(None)
            }
            (res, _, _) if res == -libc::ECANCELED => Err(None),
            (res, _, _) => Err(Some(io::Error::from_raw_os_error(-res))),
        };
        let armed_headroom = self.direct_headroom_armed();
        let free = ring.direct.as_ref().map_or(0, |t| t.free());
        let Some(l) = self.queues.get_mut(listener) else {
            // Unreachable by construction (closing a listener orphans its accept
            // first); still, never leak a descriptor (a slot goes back as
            // `taken` drops).
            if taken.is_ok() {
                stats::add(&ring.stats.accepted_unserved, 1);
            }
            drop(taken);
            return;
        };
        match taken {
            Ok(t) => l.queue.push_back(Ok(t)),
            Err(Some(e)) => l.queue.push_back(Err(e)),
            Err(None) => {}
        }
        if last {
            if l.op == Some(key) {
                l.op = None;
            }
        } else if (l.queue.len() >= l.room.min(ACCEPT_QUEUE_MAX)
            || (direct && (free < armed_headroom || !self.direct_allowed)))
            && stage.cancel() == Then::Cancel
        {
            // A full queue, or a file table short of the room the direct
            // accepts may fill before the driver next looks: stopped, and
            // armed again (then plain, if the table is still short) when
            // the queue is taken from.
            ring.push_cancel(key);
        }
        woken.append(&mut l.waiters);
    }

    /// Takes one queued connection of the listener `key` (made on first
    /// use), arming an accept if none is in flight. With a waker, parks it
    /// when the queue is empty.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn poll_accept(
        &mut self,
        ops: &mut Ops,
        ring: &mut Ring,
        key: &mut Option<Key>,
        fd: &SharedFd,
        mode: AcceptMode,
        room: usize,
        waker: Option<&Waker>,
    ) -> Option<io::Result<Taken>> {
        let lkey = *key.get_or_insert_with(|| self.queues.insert(Listener::default()));
        // Multishot only when the owner takes whatever comes: one multishot
        // enter can accept a whole backlog, which a bound could not hold.
        let multishot = mode == AcceptMode::Multishot && self.multishot && room >= ACCEPT_QUEUE_MAX;
        let l = self.queues.get_mut(lkey).expect("a live listener's accept queue was freed");
        l.room = room;
        if let Some(r) = l.queue.pop_front() {
            return Some(r);
        }
        // From here a task that asks for a connection takes one (an
        // `accept4`, or a single accept armed), whatever the room: the room
        // bounds what is accepted ahead of the owner, not what it asks for.
        // At zero nothing would be accepted or armed, and the task would
        // wait for a wake-up nothing sends (a server whose last slot another
        // worker took between its check and its accept).
        // A bounded owner (accept pacing while its worker is behind, or a
        // connection limit near) takes connections straight from the
        // kernel's backlog, one `accept4` each when it asks, as epoll's
        // accept loop does; the accept armed below only wakes it.
        let raw = fd.raw_fd().expect("a listening socket has a plain descriptor");
        let direct_in_flight = l.op.is_some() && l.op_direct_headroom.is_some();
        let direct_headroom =
            if l.op.is_none() { self.direct_headroom(ring, lkey, fd, multishot) } else { None };
        // With direct descriptors, a bounded owner's connection comes from a
        // single direct accept instead (no system call accepts into the
        // ring's table), while the table has a slot for it.
        if mode == AcceptMode::Multishot
            && !multishot
            && direct_headroom.is_none()
            && !direct_in_flight
        {
            match crate::sys::accept_blocking(raw) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                other => return Some(other.map(Taken::Fd)),
            }
        }
        let l = self.queues.get_mut(lkey).expect("just looked up");
        if l.op.is_none() {
            // A slot has no close-on-exec flag (the kernel refuses it with
            // a slot, `EINVAL`): it is not in the process's table at all.
            let cloexec = if direct_headroom.is_some() { 0 } else { libc::SOCK_CLOEXEC };
            let entry = if multishot {
                fd.entry(|t| {
                    opcode::AcceptMulti::new(t)
                        .allocate_file_index(direct_headroom.is_some())
                        .flags(cloexec)
                        .build()
                })
            } else {
                fd.entry(|t| {
                    opcode::Accept::new(t, std::ptr::null_mut(), std::ptr::null_mut())
                        .file_index(direct_headroom.map(|_| types::DestinationSlot::auto_target()))
                        .flags(cloexec)
                        .build()
                })
            };
            if multishot {
                if l.armed_before {
                    stats::add(&ring.stats.multishot_rearms, 1);
                }
                l.armed_before = true;
            }
            // An accept entry points at no memory (null address pointers).
            let kind =
                if direct_headroom.is_some() { FeedKind::AcceptDirect } else { FeedKind::Accept };
            let op = ops.submit_feed(ring, entry, kind, lkey, fd);
            l.op = Some(op);
            l.op_multishot = multishot;
            l.op_direct_headroom = direct_headroom;
        }
        if let Some(waker) = waker {
            let l = self.queues.get_mut(lkey).expect("just looked up");
            if !l.waiters.iter().any(|w| w.will_wake(waker)) {
                l.waiters.push(waker.clone());
            }
        }
        None
    }

    /// True once no accept of the listener `key` is in flight: a stopped
    /// accept's last completion has come, so the kernel accepts nothing
    /// more for it. Parks `waker` until then otherwise (every completion
    /// of the accept wakes the listener's waiters).
    pub(super) fn poll_accept_settled(&mut self, key: Key, waker: &Waker) -> bool {
        let Some(l) = self.queues.get_mut(key) else { return true };
        if l.op.is_none() {
            return true;
        }
        if !l.waiters.iter().any(|w| w.will_wake(waker)) {
            l.waiters.push(waker.clone());
        }
        false
    }

    /// Takes one queued connection of the listener `key` without arming
    /// anything or parking.
    pub(super) fn take_queued(&mut self, key: Key) -> Option<io::Result<Taken>> {
        self.queues.get_mut(key)?.queue.pop_front()
    }

    /// Sets how many connections the listener's owner will take from now
    /// on. At or below what is queued, an accept in flight is stopped
    /// (withdrawn, or cancelled), so further connections wait in the
    /// kernel's backlog. A room that rises while tasks wait with no accept
    /// armed (a lower room stopped it) wakes them into `woken`, to arm one.
    pub(super) fn set_accept_room(
        &mut self,
        ops: &mut Ops,
        ring: &mut Ring,
        key: Option<Key>,
        room: usize,
        woken: &mut Vec<Waker>,
    ) {
        let Some(l) = key.and_then(|k| self.queues.get_mut(k)) else { return };
        let rose = room > l.room;
        l.room = room;
        if rose && l.op.is_none() {
            woken.append(&mut l.waiters);
        }
        // A bounded owner stops a multishot accept whatever is queued: one
        // enter could accept a whole backlog ahead of it.
        let bounded_multishot = l.op_multishot && room < ACCEPT_QUEUE_MAX;
        if l.queue.len() < room && !bounded_multishot {
            return;
        }
        let Some(op) = l.op else { return };
        // Once: an accept being cancelled is left to its last completion.
        if ops.stop_feed(ring, op) == Then::Free {
            l.op = None;
        }
    }

    /// Forgets the listener `key`: closes the connections nobody took and
    /// detaches its accept.
    pub(super) fn release_listener(&mut self, ops: &mut Ops, ring: &mut Ring, key: Key) {
        if let Some(l) = self.queues.remove(key) {
            let unserved = l.queue.iter().filter(|t| t.is_ok()).count();
            stats::add(&ring.stats.accepted_unserved, unserved as u64);
            if let Some(op) = l.op {
                // An accept the kernel has is cancelled, and closes whatever
                // it still delivers.
                ops.orphan_feed(ring, op);
            }
            // Dropping `l` closes its queue's connections.
        }
    }

    /// Forgets every listener (the driver is dropped).
    pub(super) fn release_all(&mut self, ops: &mut Ops, ring: &mut Ring) {
        for key in self.queues.keys() {
            self.release_listener(ops, ring, key);
        }
    }
}

/// `TCP_LISTEN` in `tcpi_state` (`include/net/tcp_states.h`).
const TCP_LISTEN: u8 = 10;

/// The backlog of the listening TCP socket `fd` (`TCP_INFO` reports a
/// listener's `sk_max_ack_backlog` as `tcpi_sacked`): at most this many
/// connections, and one, wait in its accept queue. `None` for a socket
/// that is not TCP (a Unix listener keeps plain accepts).
fn listen_backlog(fd: RawFd) -> Option<u32> {
    // SAFETY: `tcp_info` is plain data; all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is writable for `len` bytes and `len` points to its size.
    let res = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (res == 0 && info.tcpi_state == TCP_LISTEN).then_some(info.tcpi_sacked)
}
