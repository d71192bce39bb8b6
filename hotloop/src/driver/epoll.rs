//! The epoll driver: edge-triggered, with lazy registration.
//!
//! # Implementation notes
//! - A socket is added to the interest list (`EPOLL_CTL_ADD`) only the first
//!   time an operation on it returns `WouldBlock`, for both directions at
//!   once and edge-triggered, and stays there until it is closed: no
//!   `EPOLL_CTL_MOD`/`DEL` per operation, and no syscall at all for a
//!   socket that never had to wait (with `TCP_DEFER_ACCEPT`, most short
//!   connections). Closing the descriptor removes it from the interest list.
//! - An unregistered socket's operations always try the syscall first. Once
//!   registered, a socket's slot keeps one readiness bit per direction: set
//!   by an event, cleared by `WouldBlock` or by a read or write that moved
//!   fewer bytes than asked (the kernel's queue is drained; the next bytes
//!   raise a new edge). An operation whose bit is clear parks without a
//!   syscall, which saves the `EAGAIN` read after every request on a
//!   keep-alive connection. Because `EPOLL_CTL_ADD` reports a socket that is
//!   already ready, and edges that arrive after a drain are queued in the
//!   kernel, no wake-up is lost.
//! - `epoll_data` carries `generation << 32 | slot`, as haproxy does: an
//!   event for a socket that was closed and whose slot was reused carries
//!   the old generation and is dropped.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use super::{Direction, Source};
use crate::runtime::{Config, WorkerShared};
use crate::stats::{self, WorkerStats};
use crate::sys;

/// The token of the worker's eventfd.
const WAKE_TOKEN: u64 = u64::MAX;

/// Interest for every registered socket: both directions, edge-triggered.
const INTEREST: u32 = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;

/// What the driver keeps per registered socket.
#[derive(Default)]
struct IoSlot {
    generation: u32,
    /// Readiness bits, [`READABLE`] and [`WRITABLE`].
    ready: u8,
    reader: Option<Waker>,
    writer: Option<Waker>,
}

/// The socket may have bytes to read (or connections to accept).
const READABLE: u8 = 1;
/// The socket may have room to write.
const WRITABLE: u8 = 2;
/// The peer closed or the connection failed: a short read may still leave
/// an end of file or an error to report, and no new edge will say so, so
/// readiness is never cleared again.
const HANGUP: u8 = 4;

fn bit(dir: Direction) -> u8 {
    match dir {
        Direction::Read => READABLE,
        Direction::Write => WRITABLE,
    }
}

/// One worker's epoll instance.
pub(crate) struct Epoll {
    epfd: OwnedFd,
    events: Vec<MaybeUninit<libc::epoll_event>>,
    slots: Vec<IoSlot>,
    free: Vec<u32>,
    eventfd: RawFd,
    stats: Arc<WorkerStats>,
}

impl Epoll {
    /// Creates the epoll instance and registers the worker's eventfd.
    /// Returns the driver and a sentence on kernel busy polling.
    pub(crate) fn new(config: &Config, worker: &Arc<WorkerShared>) -> io::Result<(Epoll, String)> {
        let epfd = sys::epoll_create()?;
        let eventfd = worker.eventfd.as_raw_fd();
        sys::epoll_add(
            epfd.as_raw_fd(),
            eventfd,
            (libc::EPOLLIN | libc::EPOLLET) as u32,
            WAKE_TOKEN,
        )?;
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
        let epoll = Epoll {
            epfd,
            events: vec![MaybeUninit::uninit(); config.events_per_poll_max],
            slots: Vec::new(),
            free: Vec::new(),
            eventfd,
            stats: worker.stats.clone(),
        };
        Ok((epoll, kernel_busy_poll))
    }

    /// Adds `fd` to the interest list; returns its token.
    pub(crate) fn register(&mut self, fd: RawFd) -> io::Result<u64> {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(IoSlot::default());
                (self.slots.len() - 1) as u32
            }
        };
        self.slots[slot as usize].ready = READABLE | WRITABLE;
        let token = (u64::from(self.slots[slot as usize].generation) << 32) | u64::from(slot);
        if let Err(e) = sys::epoll_add(self.epfd.as_raw_fd(), fd, INTEREST, token) {
            self.free_slot(slot);
            return Err(e);
        }
        stats::add(&self.stats.registrations, 1);
        Ok(token)
    }

    /// Parks `waker` until `src` is ready in direction `dir`, registering
    /// the socket first if this is its first wait.
    pub(crate) fn park(&mut self, src: &Source, dir: Direction, waker: &Waker) -> io::Result<()> {
        let token = match src.token.get() {
            Some(t) => t,
            None => {
                let t = self.register(src.fd())?;
                src.token.set(Some(t));
                t
            }
        };
        let slot = &mut self.slots[(token as u32) as usize];
        if slot.ready & HANGUP == 0 {
            slot.ready &= !bit(dir);
        }
        let parked = match dir {
            Direction::Read => &mut slot.reader,
            Direction::Write => &mut slot.writer,
        };
        match parked {
            Some(w) if w.will_wake(waker) => {}
            _ => *parked = Some(waker.clone()),
        }
        Ok(())
    }

    /// True unless the last operation in `dir` drained the socket and no
    /// event has come since.
    pub(crate) fn is_ready(&self, token: u64, dir: Direction) -> bool {
        self.slots[(token as u32) as usize].ready & bit(dir) != 0
    }

    /// Records that an operation in `dir` drained the socket.
    pub(crate) fn clear_ready(&mut self, token: u64, dir: Direction) {
        let slot = &mut self.slots[(token as u32) as usize];
        if slot.ready & HANGUP == 0 {
            slot.ready &= !bit(dir);
        }
    }

    /// Forgets a socket that is about to be closed.
    pub(crate) fn release(&mut self, token: Option<u64>) {
        match token {
            Some(t) => self.free_slot(t as u32),
            None => stats::add(&self.stats.registrations_avoided, 1),
        }
    }

    fn free_slot(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        s.generation = s.generation.wrapping_add(1);
        s.reader = None;
        s.writer = None;
        self.free.push(slot);
    }

    /// Waits for events for at most `timeout` and wakes the parked tasks.
    pub(crate) fn poll(&mut self, timeout: Option<Duration>) -> io::Result<usize> {
        let timeout_ms = match timeout {
            None => -1,
            // epoll_wait counts whole milliseconds; round up so a timer is never woken early.
            Some(d) => d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32,
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
                sys::eventfd_drain(self.eventfd);
                continue;
            }
            let slot = token as u32;
            let generation = (token >> 32) as u32;
            let Some(s) = self.slots.get_mut(slot as usize).filter(|s| s.generation == generation)
            else {
                stats::add(&self.stats.stale_events, 1);
                continue;
            };
            let hangup = flags & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0;
            if hangup || flags & libc::EPOLLRDHUP as u32 != 0 {
                s.ready |= HANGUP;
            }
            if hangup || flags & (libc::EPOLLIN | libc::EPOLLRDHUP) as u32 != 0 {
                s.ready |= READABLE;
                if let Some(w) = s.reader.take() {
                    w.wake();
                }
            }
            if hangup || flags & libc::EPOLLOUT as u32 != 0 {
                s.ready |= WRITABLE;
                if let Some(w) = s.writer.take() {
                    w.wake();
                }
            }
        }
        stats::add(&self.stats.poller_events, n as u64);
        Ok(n)
    }
}
