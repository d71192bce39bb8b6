//! The descriptor and file types an operation holds: the kernel may still
//! use a socket or file after its owner dropped it, so every operation
//! keeps its own reference until its last completion.
//!
//! # Implementation notes
//! - A socket is named either by a plain descriptor or by a slot in the
//!   ring's registered file table (a direct descriptor, accepted with
//!   `IORING_FILE_INDEX_ALLOC`). A slot is given back (an `IORING_OP_CLOSE`
//!   naming it, queued by [`DirectTable::take_closed`]'s caller) only when
//!   the last holder lets go, exactly as a plain descriptor is closed, so a
//!   queued or in-flight entry never reaches a slot the kernel has handed
//!   to a new connection.
//! - A direct socket may also get a plain descriptor, installed on demand
//!   (`IORING_OP_FIXED_FD_INSTALL`) for system calls; it then has both, and
//!   both close with it.

use std::cell::{Cell, OnceCell, RefCell};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;

use io_uring::{squeue, types};

/// A socket shared by its source and the operations the kernel holds on
/// it; closed (its slot given back) when the last holder drops it.
pub(crate) type SharedFd = Rc<SockFd>;

/// A file shared by its handle and the operations the kernel holds on it.
pub(crate) type SharedFile = Arc<File>;

/// A socket as ring entries and system calls name it.
pub(crate) struct SockFd {
    /// The plain descriptor: always for a plain socket; for a direct one,
    /// once one was installed for a system call.
    plain: OnceCell<OwnedFd>,
    /// The slot in the ring's file table, for a direct socket.
    direct: Option<(u32, Rc<DirectTable>)>,
}

impl SockFd {
    /// A socket named by its plain descriptor.
    pub(crate) fn plain(fd: OwnedFd) -> SockFd {
        SockFd { plain: OnceCell::from(fd), direct: None }
    }

    /// A socket in `slot` of `table`, which the kernel just filled.
    pub(super) fn direct(slot: u32, table: &Rc<DirectTable>) -> SockFd {
        SockFd { plain: OnceCell::new(), direct: Some((slot, table.clone())) }
    }

    /// The plain descriptor, if the socket has one.
    pub(crate) fn raw_fd(&self) -> Option<RawFd> {
        self.plain.get().map(|fd| fd.as_raw_fd())
    }

    /// The plain descriptor itself, if the socket has one.
    pub(crate) fn owned(&self) -> Option<&OwnedFd> {
        self.plain.get()
    }

    /// The slot in the ring's file table, for a direct socket.
    pub(crate) fn slot(&self) -> Option<u32> {
        self.direct.as_ref().map(|(slot, _)| *slot)
    }

    /// The plain descriptor, taken out of a socket nothing else holds (a
    /// direct one's slot is given back as it drops).
    pub(crate) fn into_plain(mut self) -> Option<OwnedFd> {
        self.plain.take()
    }

    /// Keeps `fd`, a plain descriptor installed for this direct socket.
    pub(super) fn set_plain(&self, fd: OwnedFd) -> RawFd {
        self.plain.get_or_init(|| fd).as_raw_fd()
    }

    /// The entry `build` makes, naming this socket: its slot (with
    /// `IOSQE_FIXED_FILE`) for a direct socket, else its descriptor.
    #[inline]
    pub(crate) fn entry(&self, build: impl FnOnce(types::Fd) -> squeue::Entry) -> squeue::Entry {
        match &self.direct {
            Some((slot, _)) => build(types::Fd(*slot as RawFd)).flags(squeue::Flags::FIXED_FILE),
            None => build(types::Fd(self.raw_fd().expect("a plain socket has its descriptor"))),
        }
    }

    /// A number that names this socket while it lives, for marks kept
    /// beside it (a plain descriptor's number, or the slot's, tagged).
    pub(crate) fn mark(&self) -> i64 {
        match &self.direct {
            Some((slot, _)) => -1 - i64::from(*slot),
            None => i64::from(self.raw_fd().unwrap_or(-1)),
        }
    }
}

impl Drop for SockFd {
    fn drop(&mut self) {
        // The plain descriptor (if any) closes with the field; the slot is
        // queued for its `IORING_OP_CLOSE`, which no entry on it can follow.
        if let Some((slot, table)) = &self.direct {
            table.give_back(*slot);
        }
    }
}

/// One ring's registered file table of direct sockets: how many slots it
/// has and holds, and the slots whose last holder let go, waiting for the
/// `IORING_OP_CLOSE` that frees them.
pub(crate) struct DirectTable {
    /// Slots registered (`register_files_sparse`).
    slots: u32,
    /// Slots filled and not yet given back.
    in_use: Cell<u32>,
    /// Slots given back, waiting for their close entry.
    closed: RefCell<Vec<u32>>,
}

impl DirectTable {
    /// A table of `slots` empty slots.
    pub(super) fn new(slots: u32) -> DirectTable {
        DirectTable { slots, in_use: Cell::new(0), closed: RefCell::new(Vec::new()) }
    }

    /// Slots not filled (nor waiting for their close).
    pub(super) fn free(&self) -> u32 {
        self.slots.saturating_sub(self.in_use.get())
    }

    /// Counts `slot`, just filled by the kernel, as held.
    pub(super) fn filled(self: &Rc<Self>, slot: u32) -> SockFd {
        self.in_use.set(self.in_use.get() + 1);
        SockFd::direct(slot, self)
    }

    /// Queues `slot` for its close.
    fn give_back(&self, slot: u32) {
        self.closed.borrow_mut().push(slot);
    }

    /// Whether some slot waits for its close entry.
    pub(super) fn has_closed(&self) -> bool {
        !self.closed.borrow().is_empty()
    }

    /// The slots waiting for their close entry; counted free once closed
    /// (the caller queues the closes ahead of every later entry).
    pub(super) fn take_closed(&self, out: &mut Vec<u32>) {
        let mut closed = self.closed.borrow_mut();
        self.in_use.set(self.in_use.get().saturating_sub(closed.len() as u32));
        out.append(&mut closed);
    }
}
