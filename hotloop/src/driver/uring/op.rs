//! In-flight operations: the slab that tracks them, the future that waits
//! for one, and the socket operations built on it.
//!
//! # Implementation notes
//! Every submitted entry carries `generation << 32 | index` of its slab slot
//! as `user_data`, so a completion for a slot that was freed and reused is
//! recognised and dropped. A slot goes through:
//!
//! ```text
//! Waiting(waker) --completion--> Completed(cqe) --future polled--> freed
//!       |
//!   future dropped: the owned storage moves into the slot, AsyncCancel queued
//!       v
//! Cancelled(storage) --last completion--> freed (storage dropped here)
//! ```
//!
//! Architecture invariant: the memory an entry points to (buffer, iovec
//! array, `msghdr`, socket address) is owned by the [`Op`] future while it
//! waits, and by the slab once the future is gone, until the last
//! completion arrives. It is never freed while the kernel may still use it.
//! If the driver cannot be reached when a waiting future is dropped, the
//! storage is leaked instead of freed.
//!
//! The storage of a cancelled operation is dropped inside the driver's
//! poll, so a buffer type's destructor must not start I/O of its own.
//!
//! A completion-based read cannot be taken back: if a read's future is
//! dropped after the kernel has already copied data into its buffer (the
//! completion raced the drop, or the cancel came too late), those bytes are
//! dropped with the buffer. A caller that times out reads and then keeps
//! using the connection must accept that; on epoll nothing is lost.

use std::any::Any;
use std::future::Future;
use std::io;
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll, Waker};

use io_uring::{opcode, squeue, types};

use super::{with_uring, Uring};
use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::driver::{Driver, Source};
use crate::runtime::context;
use crate::sys;

/// What the kernel reported for one completion.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cqe {
    pub(super) res: i32,
}

impl Cqe {
    /// The result as `io::Result`: a negative value is `-errno`.
    pub(super) fn result(&self) -> io::Result<u32> {
        if self.res < 0 {
            Err(io::Error::from_raw_os_error(-self.res))
        } else {
            Ok(self.res as u32)
        }
    }
}

/// A slab slot's index and generation, carried in `user_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct OpKey {
    index: u32,
    generation: u32,
}

impl OpKey {
    /// The `user_data` of the entries submitted for this slot.
    pub(super) fn user_data(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.index)
    }

    /// The slot a completion's `user_data` names.
    pub(super) fn from_user_data(user_data: u64) -> OpKey {
        OpKey { index: user_data as u32, generation: (user_data >> 32) as u32 }
    }
}

/// Where one operation is in its life.
pub(super) enum Lifecycle {
    /// The slot is free.
    Vacant,
    /// Submitted; the future waits (its waker, once polled).
    Waiting(Option<Waker>),
    /// The completion arrived and the future has not taken it yet.
    Completed(Cqe),
    /// The future was dropped first: the slot keeps the operation's memory
    /// until the last completion arrives.
    Cancelled(#[allow(dead_code)] Box<dyn Any>),
    /// An accept whose completions go to the queue of listener `fd`.
    Accept(RawFd),
    /// An accept whose listener was closed: descriptors it still delivers
    /// are closed at once.
    Orphan,
}

struct Slot {
    generation: u32,
    state: Lifecycle,
}

/// The operations in flight, keyed by [`OpKey`].
#[derive(Default)]
pub(super) struct Ops {
    slots: Vec<Slot>,
    free: Vec<u32>,
}

impl Ops {
    /// Takes a slot for a new operation.
    pub(super) fn insert(&mut self, state: Lifecycle) -> OpKey {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { generation: 0, state: Lifecycle::Vacant });
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.state = state;
        OpKey { index, generation: slot.generation }
    }

    /// The state of `key`'s slot, if the slot still belongs to it.
    pub(super) fn get_mut(&mut self, key: OpKey) -> Option<&mut Lifecycle> {
        match self.slots.get_mut(key.index as usize) {
            Some(slot)
                if slot.generation == key.generation
                    && !matches!(slot.state, Lifecycle::Vacant) =>
            {
                Some(&mut slot.state)
            }
            _ => None,
        }
    }

    /// Frees `key`'s slot and returns what it held.
    pub(super) fn remove(&mut self, key: OpKey) -> Lifecycle {
        if self.get_mut(key).is_none() {
            return Lifecycle::Vacant;
        }
        let slot = &mut self.slots[key.index as usize];
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(key.index);
        std::mem::replace(&mut slot.state, Lifecycle::Vacant)
    }

    /// How many operations the kernel still holds (taken slots whose last
    /// completion has not arrived).
    pub(super) fn held_by_kernel(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| !matches!(s.state, Lifecycle::Vacant | Lifecycle::Completed(_)))
            .count()
    }

    /// The keys of every taken slot.
    pub(super) fn keys(&self) -> Vec<OpKey> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !matches!(s.state, Lifecycle::Vacant))
            .map(|(i, s)| OpKey { index: i as u32, generation: s.generation })
            .collect()
    }

    /// Takes the completion of `key` if it arrived, else parks `waker`.
    fn poll_op(&mut self, key: OpKey, waker: &Waker) -> Poll<Cqe> {
        let state = self
            .get_mut(key)
            .expect("an io_uring operation lost its slot while its future was waiting");
        match state {
            Lifecycle::Completed(cqe) => {
                let cqe = *cqe;
                self.remove(key);
                Poll::Ready(cqe)
            }
            Lifecycle::Waiting(parked) => {
                match parked {
                    Some(w) if w.will_wake(waker) => {}
                    _ => *parked = Some(waker.clone()),
                }
                Poll::Pending
            }
            Lifecycle::Vacant
            | Lifecycle::Cancelled(_)
            | Lifecycle::Accept(_)
            | Lifecycle::Orphan => {
                unreachable!(
                    "an io_uring operation's future found its slot in a state only the driver sets"
                )
            }
        }
    }
}

impl Uring {
    /// Forgets the future of `key`, keeping `storage` alive until the
    /// kernel is done with it, and asks the kernel to cancel the operation.
    fn cancel_op(&mut self, key: OpKey, storage: Box<dyn Any>) {
        match self.ops.get_mut(key) {
            Some(state @ Lifecycle::Waiting(_)) => {
                *state = Lifecycle::Cancelled(storage);
                crate::stats::add(&self.ring.stats.cancellations, 1);
                // If even a flushed queue has no room, the operation ends on
                // its own (data, close or error) and frees its slot then.
                let _ = self.ring.push_cancel(key);
            }
            Some(Lifecycle::Completed(_)) => {
                self.ops.remove(key);
                drop(storage);
            }
            None
            | Some(
                Lifecycle::Vacant
                | Lifecycle::Cancelled(_)
                | Lifecycle::Accept(_)
                | Lifecycle::Orphan,
            ) => {
                // The slot does not say the kernel is done: leak rather than
                // risk freeing memory it may still write.
                std::mem::forget(storage);
            }
        }
    }
}

/// A submitted operation; resolves to its completion and its storage.
///
/// Dropping it before completion cancels the operation and hands `T` to the
/// driver, which frees it when the kernel is done.
pub(super) struct Op<T: 'static> {
    key: OpKey,
    data: Option<T>,
}

// `data` is never pinned: the kernel sees only the heap memory it points to.
impl<T> Unpin for Op<T> {}

impl<T: 'static> Op<T> {
    /// Queues `entry` on the ring (it is submitted at the driver's next poll).
    ///
    /// # Safety
    /// Every pointer in `entry` must point into memory that `data` owns and
    /// that stays at the same address when `data` moves (a heap block), or
    /// into memory that outlives the operation, and it must be valid for the
    /// kind of access the operation makes.
    pub(super) unsafe fn submit(entry: squeue::Entry, data: T) -> Result<Op<T>, (io::Error, T)> {
        with_uring(|ur| {
            let key = ur.ops.insert(Lifecycle::Waiting(None));
            match ur.ring.push(&entry.user_data(key.user_data())) {
                Ok(()) => Ok(Op { key, data: Some(data) }),
                Err(e) => {
                    ur.ops.remove(key);
                    Err((e, data))
                }
            }
        })
    }
}

impl<T: 'static> Future for Op<T> {
    type Output = (Cqe, T);

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<(Cqe, T)> {
        let this = self.get_mut();
        let key = this.key;
        let cqe = std::task::ready!(with_uring(|ur| ur.ops.poll_op(key, cx.waker())));
        let data = this.data.take().expect("io_uring operation polled after it completed");
        Poll::Ready((cqe, data))
    }
}

impl<T: 'static> Drop for Op<T> {
    fn drop(&mut self) {
        let Some(data) = self.data.take() else {
            return;
        };
        let mut data = ManuallyDrop::new(Some(data));
        let key = self.key;
        context::try_with(|cx| {
            if let Ok(mut driver) = cx.driver.try_borrow_mut() {
                if let Driver::Uring(ur) = &mut *driver {
                    if let Some(d) = data.take() {
                        ur.cancel_op(key, Box::new(d));
                    }
                }
            }
        });
        // Whatever is left could not be handed to the driver: it stays
        // leaked (ManuallyDrop), because the kernel may still write into it.
    }
}

/// Receives into `buf` (from its start up to its capacity).
pub(crate) async fn recv<B: IoBufMut>(src: &Source, mut buf: B) -> BufResult<usize, B> {
    loop {
        let len = buf.bytes_total().min(u32::MAX as usize) as u32;
        let entry = opcode::Recv::new(types::Fd(src.fd()), buf.stable_mut_ptr(), len).build();
        // SAFETY: the entry points at `buf`'s `len` writable bytes, which IoBufMut keeps at a fixed
        // address while `buf` moves; the op owns `buf` until its last completion.
        let op = match unsafe { Op::submit(entry, buf) } {
            Ok(op) => op,
            Err((e, b)) => return (Err(e), b),
        };
        let (cqe, b) = op.await;
        buf = b;
        match cqe.result() {
            Ok(n) => {
                // SAFETY: the kernel wrote `n` bytes at the start of the buffer.
                unsafe { buf.set_init(n as usize) };
                return (Ok(n as usize), buf);
            }
            Err(e) if is_retry(&e) => {
                if let Err(e) = poll_ready(src.fd(), libc::POLLIN).await {
                    return (Err(e), buf);
                }
            }
            Err(e) => return (Err(e), buf),
        }
    }
}

/// Sends the initialised bytes of `buf`; may send fewer.
pub(crate) async fn send<B: IoBuf>(src: &Source, mut buf: B) -> BufResult<usize, B> {
    loop {
        let len = buf.bytes_init().min(u32::MAX as usize) as u32;
        let entry = opcode::Send::new(types::Fd(src.fd()), buf.stable_ptr(), len)
            .flags(libc::MSG_NOSIGNAL)
            .build();
        // SAFETY: the entry points at `buf`'s `len` initialised bytes, which IoBuf keeps at a fixed
        // address while `buf` moves; the op owns `buf` until its last completion.
        let op = match unsafe { Op::submit(entry, buf) } {
            Ok(op) => op,
            Err((e, b)) => return (Err(e), b),
        };
        let (cqe, b) = op.await;
        buf = b;
        match cqe.result() {
            Ok(n) => return (Ok(n as usize), buf),
            Err(e) if is_retry(&e) => {
                if let Err(e) = poll_ready(src.fd(), libc::POLLOUT).await {
                    return (Err(e), buf);
                }
            }
            Err(e) => return (Err(e), buf),
        }
    }
}

/// What a `sendmsg` keeps alive: the buffers, their iovecs and the header.
struct MsgStorage<B> {
    bufs: Vec<B>,
    _iov: Vec<libc::iovec>,
    msg: Box<libc::msghdr>,
}

impl<B: IoBuf> MsgStorage<B> {
    fn new(bufs: Vec<B>) -> Self {
        let iov = crate::buf::iovecs(&bufs);
        // SAFETY: msghdr is plain old data; all-zero is a valid, empty header.
        let mut msg: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = iov.len();
        MsgStorage { bufs, _iov: iov, msg }
    }
}

/// Sends the buffers in order in one `sendmsg`; may send fewer bytes than all.
pub(crate) async fn send_vectored<B: IoBuf>(
    src: &Source,
    bufs: Vec<B>,
) -> BufResult<usize, Vec<B>> {
    let mut storage = MsgStorage::new(bufs);
    loop {
        let msg: *const libc::msghdr = &*storage.msg;
        let entry =
            opcode::SendMsg::new(types::Fd(src.fd()), msg).flags(libc::MSG_NOSIGNAL as u32).build();
        // SAFETY: the entry points at the boxed msghdr, which points at the iovec array (a Vec's
        // heap block), which points at the buffers' stable bytes; `storage` owns all three and
        // the op owns `storage` until its last completion.
        let op = match unsafe { Op::submit(entry, storage) } {
            Ok(op) => op,
            Err((e, s)) => return (Err(e), s.bufs),
        };
        let (cqe, s) = op.await;
        storage = s;
        match cqe.result() {
            Ok(n) => return (Ok(n as usize), storage.bufs),
            Err(e) if is_retry(&e) => {
                if let Err(e) = poll_ready(src.fd(), libc::POLLOUT).await {
                    return (Err(e), storage.bufs);
                }
            }
            Err(e) => return (Err(e), storage.bufs),
        }
    }
}

/// Connects a fresh socket to `addr`.
pub(crate) async fn connect(src: &Source, addr: SocketAddr) -> io::Result<()> {
    let (storage, len) = sys::std_to_sockaddr(&addr);
    let storage = Box::new(storage);
    let ptr: *const libc::sockaddr = (&*storage as *const libc::sockaddr_storage).cast();
    let entry = opcode::Connect::new(types::Fd(src.fd()), ptr, len).build();
    // SAFETY: the entry points at the boxed address (`len` bytes), owned by the op until its last completion.
    let op = unsafe { Op::submit(entry, storage) }.map_err(|(e, _)| e)?;
    let (cqe, _storage) = op.await;
    match cqe.result() {
        Ok(_) => Ok(()),
        // A non-blocking socket can report the handshake as under way; wait
        // for it to become writable and ask SO_ERROR how it ended.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EINPROGRESS | libc::EALREADY | libc::EAGAIN)
            ) =>
        {
            poll_ready(src.fd(), libc::POLLOUT).await?;
            match sys::getsockopt_int(src.fd(), libc::SOL_SOCKET, libc::SO_ERROR)? {
                0 => Ok(()),
                errno => Err(io::Error::from_raw_os_error(errno)),
            }
        }
        Err(e) => Err(e),
    }
}

/// Shuts down one or both directions of a connection.
pub(crate) async fn shutdown(src: &Source, how: std::net::Shutdown) -> io::Result<()> {
    let how = match how {
        std::net::Shutdown::Read => libc::SHUT_RD,
        std::net::Shutdown::Write => libc::SHUT_WR,
        std::net::Shutdown::Both => libc::SHUT_RDWR,
    };
    let entry = opcode::Shutdown::new(types::Fd(src.fd()), how).build();
    // SAFETY: a shutdown entry points at no memory.
    let op = unsafe { Op::submit(entry, ()) }.map_err(|(e, _)| e)?;
    let (cqe, ()) = op.await;
    cqe.result().map(drop)
}

/// Waits until `fd` reports one of `events` (a one-shot `IORING_OP_POLL_ADD`).
pub(crate) async fn poll_ready(fd: RawFd, events: i16) -> io::Result<()> {
    let entry = opcode::PollAdd::new(types::Fd(fd), events as u32).build();
    // SAFETY: a poll entry points at no memory.
    let op = unsafe { Op::submit(entry, ()) }.map_err(|(e, _)| e)?;
    let (cqe, ()) = op.await;
    cqe.result().map(drop)
}

/// True for results that mean "not now": the operation ran without
/// waiting (a non-blocking socket handled by a kernel worker) and should
/// wait for readiness and run again.
pub(super) fn is_retry(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_round_trips() {
        let key = OpKey { index: 7, generation: 0xdead_beef };
        assert_eq!(OpKey::from_user_data(key.user_data()), key);
        // The two reserved values can never name a slot.
        assert_ne!(key.user_data(), u64::MAX);
        assert_ne!(key.user_data(), u64::MAX - 1);
    }

    #[test]
    fn a_reused_slot_rejects_the_old_key() {
        let mut ops = Ops::default();
        let old = ops.insert(Lifecycle::Waiting(None));
        assert!(matches!(ops.remove(old), Lifecycle::Waiting(None)));
        let new = ops.insert(Lifecycle::Waiting(None));
        assert_eq!(new.index, old.index, "the slot is reused");
        assert!(ops.get_mut(old).is_none(), "a completion for the old key is stale");
        assert!(ops.get_mut(new).is_some());
        assert!(matches!(ops.remove(old), Lifecycle::Vacant), "removing a stale key is a no-op");
        assert!(ops.get_mut(new).is_some());
    }

    #[test]
    fn cancelled_storage_lives_until_removed() {
        use std::rc::Rc;
        let buf = Rc::new(());
        let mut ops = Ops::default();
        let key = ops.insert(Lifecycle::Cancelled(Box::new(buf.clone())));
        assert_eq!(ops.held_by_kernel(), 1);
        assert_eq!(Rc::strong_count(&buf), 2);
        drop(ops.remove(key));
        assert_eq!(Rc::strong_count(&buf), 1, "freed with the last completion");
        assert_eq!(ops.held_by_kernel(), 0);
    }

    #[test]
    fn completed_slots_are_not_held_by_the_kernel() {
        let mut ops = Ops::default();
        let a = ops.insert(Lifecycle::Waiting(None));
        let _b = ops.insert(Lifecycle::Accept(3));
        *ops.get_mut(a).unwrap() = Lifecycle::Completed(Cqe { res: 5 });
        assert_eq!(ops.held_by_kernel(), 1);
        assert_eq!(ops.keys().len(), 2);
    }
}
