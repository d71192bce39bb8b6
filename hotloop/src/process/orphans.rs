//! Children nobody waits for any more, where no task of a running worker
//! can: a process-wide list, reaped by one thread that exists only while
//! the list holds a child.
//!
//! A dropped [`Child`](super::Child) whose process still runs is reaped by
//! a task on its worker while the runtime runs. The process comes here
//! instead when its `Child` is dropped outside any worker, or on the
//! context of `block_on` (whose tasks run only while `block_on` does), and
//! when that task is dropped with its runtime: so it never stays a zombie
//! for the rest of the parent's life. (tokio keeps such an orphan queue
//! too, swept at each `SIGCHLD` its runtimes see; hotloop installs no
//! `SIGCHLD` handler, and a sweep at a spawn or a runtime's drop would miss
//! a child that exits afterwards, even a killed one still dying.)
//!
//! # Implementation notes
//! - Each orphan's pidfd (readable once the process exits) is in one epoll
//!   instance; the thread `hotloop-reaper` waits in `epoll_wait`, reaps
//!   whatever exited (`waitpid(WNOHANG)`, through
//!   `std::process::Child::try_wait`), closes its pidfd (which leaves the
//!   epoll set), and ends once the list is empty; the next orphan starts a
//!   new one. The pid stays reserved until it is reaped, so the pidfd
//!   opened here names the child.
//! - Without a pidfd (the descriptor limit reached) the orphan gets a
//!   thread of its own that waits for it.

use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::sys;

/// The children waiting to be reaped, each with its pidfd.
struct Orphans {
    children: Vec<(std::process::Child, OwnedFd)>,
    /// The epoll instance holding every orphan's pidfd; made with the
    /// first orphan and kept for the process, so the descriptor the
    /// thread waits on outside the lock stays open.
    epoll: Option<OwnedFd>,
    /// True while the reaper thread runs.
    reaping: bool,
}

static ORPHANS: Mutex<Orphans> =
    Mutex::new(Orphans { children: Vec::new(), epoll: None, reaping: false });

fn orphans() -> MutexGuard<'static, Orphans> {
    ORPHANS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reaps `child` once it exits, from whatever thread drops it.
pub(super) fn adopt(mut child: std::process::Child) {
    if !matches!(child.try_wait(), Ok(None)) {
        return; // reaped now, or it cannot be
    }
    let mut list = orphans();
    let pidfd = match list.watch(&child) {
        Ok(pidfd) => pidfd,
        Err(e) => {
            drop(list);
            wait_on_a_thread(child, e);
            return;
        }
    };
    list.children.push((child, pidfd));
    if !list.reaping {
        match std::thread::Builder::new().name("hotloop-reaper".into()).spawn(reap) {
            Ok(_) => list.reaping = true,
            // It stays listed: the next orphan tries again.
            Err(e) => crate::log::warn(format_args!(
                "cannot start the thread that reaps dropped child processes: {e}"
            )),
        }
    }
}

impl Orphans {
    /// A pidfd for `child`, in the epoll set.
    fn watch(&mut self, child: &std::process::Child) -> std::io::Result<OwnedFd> {
        let epoll = match &self.epoll {
            Some(epoll) => epoll.as_raw_fd(),
            None => self.epoll.insert(sys::epoll_create()?).as_raw_fd(),
        };
        let pidfd = sys::pidfd_open(child.id())?;
        sys::epoll_add(epoll, pidfd.as_raw_fd(), libc::EPOLLIN as u32, 0)?;
        Ok(pidfd)
    }

    /// Reaps the children that exited; returns the epoll instance to wait
    /// on, or `None` (the thread then ends) once no child is left.
    fn reap_exited(&mut self) -> Option<RawFd> {
        self.children.retain_mut(|(child, _)| matches!(child.try_wait(), Ok(None)));
        if self.children.is_empty() {
            self.reaping = false;
            return None;
        }
        self.epoll.as_ref().map(AsRawFd::as_raw_fd)
    }
}

/// The reaper thread: waits for an orphan to exit, reaps, until none is left.
fn reap() {
    let mut events = [MaybeUninit::<libc::epoll_event>::uninit(); 16];
    while let Some(epoll) = orphans().reap_exited() {
        // Level-triggered: a pidfd stays readable until its child is reaped
        // and the pidfd closed, and one added meanwhile wakes the wait.
        if let Err(e) = sys::epoll_wait(epoll, &mut events, -1) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                // Unexpected, and never a spin.
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Without a pidfd: a thread that blocks in `waitpid` for `child` alone.
fn wait_on_a_thread(mut child: std::process::Child, why: std::io::Error) {
    let spawned = std::thread::Builder::new().name("hotloop-reaper".into()).spawn(move || {
        let _ = child.wait();
    });
    if let Err(e) = spawned {
        crate::log::warn(format_args!(
            "a dropped child process cannot be reaped ({why}; no thread: {e}); \
             it stays a zombie once it exits"
        ));
    }
}
