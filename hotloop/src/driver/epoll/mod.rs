//! The epoll driver: edge-triggered, with lazy registration.
//!
//! # Implementation notes
//! - A socket is added to the interest list (`EPOLL_CTL_ADD`) only the first
//!   time an operation on it returns `WouldBlock`, for both directions at
//!   once and edge-triggered, and stays there until it is closed: no
//!   `EPOLL_CTL_MOD`/`DEL` per operation, and no syscall at all for a
//!   socket that never had to wait (with `TCP_DEFER_ACCEPT`, most short
//!   connections). Closing the descriptor removes it from the interest list;
//!   a socket handed to another owner open (`TcpStream::into_std`) is
//!   removed with `EPOLL_CTL_DEL`, since a descriptor that stays open would
//!   stay listed.
//! - An unregistered socket's operations always try the syscall first. Once
//!   registered, a socket's slot keeps one readiness bit per direction: set
//!   by an event, cleared by `WouldBlock` or by a read or write that moved
//!   fewer bytes than asked (the kernel's queue is drained; the next bytes
//!   raise a new edge). An operation whose bit is clear parks without a
//!   syscall, which saves the `EAGAIN` read after every request on a
//!   keep-alive connection. Because `EPOLL_CTL_ADD` reports a socket that is
//!   already ready, and edges that arrive after a drain are queued in the
//!   kernel, no wake-up is lost.
//! - `epoll_data` carries the slot's generational key (`generation << 32 |
//!   index`), as haproxy does: an event for a socket that was closed and
//!   whose slot was reused carries the old generation and is dropped.
//! - Wakers are woken after the poller's state is released, so a waker
//!   that runs code of its own can never find the driver borrowed.
//! - A wait until a deadline sleeps in `epoll_wait` without a timeout, on
//!   a timerfd in the interest list that stays armed across waits and is
//!   re-armed only when a deadline comes earlier than the armed one (an
//!   expiry that comes too early costs one spare turn). A timeout on
//!   every `epoll_wait` had the kernel set up and cancel a timer on every
//!   sleep, though the worker's earliest deadline (in a server, a
//!   connection's idle or header timeout) seldom moves.
//! - `source.rs` is what every socket role shares: the descriptor, the
//!   driver, the registration and the waits built on it. `stream.rs`,
//!   `listener.rs`, `udp.rs` and `readiness.rs` each add one role's
//!   operations on top and name nothing but `source.rs` and this file.

mod listener;
mod readiness;
mod source;
mod stream;
mod udp;

pub(crate) use listener::ListenerSource;
pub(crate) use readiness::ReadinessSource;
pub(crate) use stream::{SendOwned, StreamSource};
pub(crate) use udp::DatagramSource;

use std::cell::{Cell, RefCell};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::task::Waker;

use super::config::{DriverConfig, Registration};
use super::park::Park;
use super::wake::Unpark;
use crate::slab::{Key, Slab};
use crate::stats::{self, WorkerStats};
use crate::sys;

/// The token of the worker's eventfd (no slab key reaches it).
const WAKE_TOKEN: u64 = u64::MAX;
/// The token of the worker's timerfd (no slab key reaches it either).
const TIMER_TOKEN: u64 = u64::MAX - 1;

/// Interest for every registered socket: both directions, edge-triggered.
const INTEREST: u32 = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;

/// The socket may have bytes to read (or connections to accept).
const READABLE: u8 = 1;
/// The socket may have room to write.
const WRITABLE: u8 = 2;
/// The peer closed or the connection failed: a short read may still leave
/// an end of file or an error to report, and no new edge will say so, so
/// readiness is never cleared again.
const HANGUP: u8 = 4;

/// What the driver keeps per registered socket: 48 bytes, which every
/// idle connection that has waited once pays.
struct IoSlot {
    /// Readiness bits, [`READABLE`], [`WRITABLE`] and [`HANGUP`].
    ready: u8,
    /// The task waiting to read (or accept).
    reader: Option<Waker>,
    /// The task waiting to write (or for a connect).
    writer: Option<Waker>,
    /// Further tasks parked beside those (a listener shared by several
    /// accepting tasks parks them all), made when a second distinct task
    /// parks: two inline lists would cost every socket 48 bytes more.
    more: Option<Box<MoreWakers>>,
}

/// The tasks parked on a socket beyond the first in each direction.
#[derive(Default)]
struct MoreWakers {
    readers: Vec<Waker>,
    writers: Vec<Waker>,
}

impl IoSlot {
    fn new() -> IoSlot {
        IoSlot { ready: READABLE | WRITABLE, reader: None, writer: None, more: None }
    }

    fn park(&mut self, dir: Direction, waker: &Waker) {
        let first = match dir {
            Direction::Read => &mut self.reader,
            Direction::Write => &mut self.writer,
        };
        match first {
            None => *first = Some(waker.clone()),
            Some(w) if w.will_wake(waker) => {}
            Some(_) => self.park_more(dir, waker),
        }
    }

    #[cold]
    fn park_more(&mut self, dir: Direction, waker: &Waker) {
        let more = self.more.get_or_insert_with(Box::default);
        let list = match dir {
            Direction::Read => &mut more.readers,
            Direction::Write => &mut more.writers,
        };
        if !list.iter().any(|w| w.will_wake(waker)) {
            list.push(waker.clone());
        }
    }

    fn take_into(&mut self, dir: Direction, out: &mut Vec<Waker>) {
        // Called for both directions of every event, and usually finds one
        // waker or none: tested branches, not `extend`/`append`'s generic
        // reserve-and-copy (about 40 instructions a call).
        let first = match dir {
            Direction::Read => &mut self.reader,
            Direction::Write => &mut self.writer,
        };
        if let Some(w) = first.take() {
            out.push(w);
        }
        if let Some(more) = &mut self.more {
            let list = match dir {
                Direction::Read => &mut more.readers,
                Direction::Write => &mut more.writers,
            };
            if !list.is_empty() {
                out.append(list);
            }
        }
    }
}

/// Which way an operation waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Waiting to read or accept.
    Read,
    /// Waiting to write or for a connect to finish.
    Write,
}

fn bit(dir: Direction) -> u8 {
    match dir {
        Direction::Read => READABLE,
        Direction::Write => WRITABLE,
    }
}

/// One worker's epoll driver: the poller, and whether it is entered.
pub(crate) struct Driver {
    poller: RefCell<Poller>,
    registration: Registration,
    entered: Cell<bool>,
    /// Wakers collected by a poll, woken once the poller is released.
    woken: RefCell<Vec<Waker>>,
}

/// The epoll instance and its registered sockets.
struct Poller {
    epfd: OwnedFd,
    events: Vec<MaybeUninit<libc::epoll_event>>,
    slots: Slab<IoSlot>,
    unpark: Arc<Unpark>,
    /// Wakes `epoll_wait` at a deadline (see the module notes).
    timer: OwnedFd,
    /// When `timer` expires (`CLOCK_MONOTONIC` nanoseconds); `None` once
    /// it has, or before it was first armed.
    timer_armed: Option<u64>,
    stats: Arc<WorkerStats>,
}

impl Driver {
    /// Creates the epoll instance and registers the unpark eventfd.
    /// Returns the driver and a sentence on kernel busy polling.
    pub(crate) fn new(
        config: &DriverConfig,
        unpark: Arc<Unpark>,
        stats: Arc<WorkerStats>,
    ) -> io::Result<(Rc<Driver>, String)> {
        let epfd = sys::epoll_create()?;
        let timer = sys::timerfd()?;
        // The driver's own two descriptors, edge-triggered: the wake-up
        // eventfd and the deadline timerfd.
        for (fd, token) in [(unpark.fd(), WAKE_TOKEN), (timer.as_raw_fd(), TIMER_TOKEN)] {
            sys::epoll_add(epfd.as_raw_fd(), fd, (libc::EPOLLIN | libc::EPOLLET) as u32, token)?;
        }
        let kernel_busy_poll = match config.kernel_busy_poll {
            None => "off".to_string(),
            Some(p) => match sys::epoll_set_busy_poll(epfd.as_raw_fd(), p.busy_poll_us, p.budget) {
                Ok(()) => format!(
                    "on: EPIOCSPARAMS {} us, budget {} (only NAPI devices benefit; loopback has none)",
                    p.busy_poll_us, p.budget
                ),
                Err(e) => format!("not applied: EPIOCSPARAMS failed ({e}); needs Linux 6.9+"),
            },
        };
        let poller = Poller {
            epfd,
            events: vec![MaybeUninit::uninit(); config.events_per_poll_max],
            slots: Slab::default(),
            unpark,
            timer,
            timer_armed: None,
            stats,
        };
        let driver = Driver {
            poller: RefCell::new(poller),
            registration: config.registration,
            entered: Cell::new(false),
            woken: RefCell::new(Vec::new()),
        };
        Ok((Rc::new(driver), kernel_busy_poll))
    }

    /// True while the runtime that owns the driver runs on this thread.
    pub(crate) fn entered(&self) -> &Cell<bool> {
        &self.entered
    }

    /// Waits for events as `park` says and wakes the parked tasks.
    pub(crate) fn poll(&self, park: Park) -> io::Result<usize> {
        let mut woken = std::mem::take(&mut *self.woken.borrow_mut());
        let n = self.poller.borrow_mut().poll(park, &mut woken)?;
        for w in woken.drain(..) {
            w.wake();
        }
        *self.woken.borrow_mut() = woken;
        Ok(n)
    }
}

impl Poller {
    /// Adds `fd` to the interest list; returns its key.
    fn register(&mut self, fd: RawFd) -> io::Result<Key> {
        let key = self.slots.insert(IoSlot::new());
        if let Err(e) = sys::epoll_add(self.epfd.as_raw_fd(), fd, INTEREST, key.to_u64()) {
            self.slots.remove(key);
            return Err(e);
        }
        stats::add(&self.stats.registrations, 1);
        Ok(key)
    }

    /// Takes a registered socket that stays open out of the interest list
    /// and forgets its slot (with any parked wakers).
    fn deregister(&mut self, fd: RawFd, key: Key) -> io::Result<()> {
        sys::epoll_del(self.epfd.as_raw_fd(), fd)?;
        drop(self.slots.remove(key));
        Ok(())
    }

    /// Forgets a socket that is about to be closed.
    fn release(&mut self, key: Option<Key>) {
        match key {
            // Dropping the slot drops any parked wakers; its key goes stale.
            Some(k) => drop(self.slots.remove(k)),
            None => stats::add(&self.stats.registrations_avoided, 1),
        }
    }

    /// Makes the timerfd expire no later than `deadline`: re-armed (one
    /// system call) only when it is not armed or armed for later.
    fn arm_timer(&mut self, deadline: u64) -> io::Result<()> {
        if self.timer_armed.is_some_and(|armed| armed <= deadline) {
            return Ok(());
        }
        sys::timerfd_arm_at(self.timer.as_raw_fd(), deadline)?;
        stats::add(&self.stats.timer_arms, 1);
        self.timer_armed = Some(deadline);
        Ok(())
    }

    fn slot(&mut self, key: Key) -> &mut IoSlot {
        self.slots.get_mut(key).expect("a registered source's epoll slot was freed under it")
    }

    /// Waits for events and collects the wakers of the tasks they concern.
    fn poll(&mut self, park: Park, woken: &mut Vec<Waker>) -> io::Result<usize> {
        let timeout_ms = match park {
            Park::Skip => 0,
            Park::Until(deadline) => {
                if let Some(deadline) = deadline {
                    self.arm_timer(deadline)?;
                }
                -1
            }
        };
        let n = match sys::epoll_wait(self.epfd.as_raw_fd(), &mut self.events, timeout_ms) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(e),
        };
        for i in 0..n {
            // SAFETY: epoll_wait initialised the first `n` entries.
            let ev = unsafe { self.events[i].assume_init_read() };
            let (token, flags) = (ev.u64, ev.events);
            if token == WAKE_TOKEN {
                self.unpark.drain();
                continue;
            }
            if token == TIMER_TOKEN {
                // Edge-triggered: the expiry is reported once, and the next
                // arming clears its count, so it is never read.
                self.timer_armed = None;
                continue;
            }
            let Some(s) = Key::from_u64(token).and_then(|k| self.slots.get_mut(k)) else {
                stats::add(&self.stats.stale_events, 1);
                continue;
            };
            // A hang-up is for good: every later operation ends at once, so
            // the readiness stays. An error alone is not: on a datagram
            // socket (an ICMP port unreachable, a peer that went away) the
            // next receive or send returns it and the socket goes on, so it
            // wakes both directions like any event and is drained like one
            // (kept sticky, a receive that then found nothing would never
            // wait again, and spin).
            let hangup = flags & libc::EPOLLHUP as u32 != 0;
            let error = flags & libc::EPOLLERR as u32 != 0;
            if hangup || flags & libc::EPOLLRDHUP as u32 != 0 {
                s.ready |= HANGUP;
            }
            if hangup || error || flags & (libc::EPOLLIN | libc::EPOLLRDHUP) as u32 != 0 {
                s.ready |= READABLE;
                s.take_into(Direction::Read, woken);
            }
            if hangup || error || flags & libc::EPOLLOUT as u32 != 0 {
                s.ready |= WRITABLE;
                s.take_into(Direction::Write, woken);
            }
        }
        stats::add(&self.stats.poller_events, n as u64);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::mem::size_of;

    /// Every socket that has waited once holds a slot, idle connections
    /// included: its size is watched (88 bytes when each direction kept
    /// a list of its own inline).
    #[test]
    fn a_slot_stays_small() {
        assert!(size_of::<super::IoSlot>() <= 48, "{}", size_of::<super::IoSlot>());
    }
}
