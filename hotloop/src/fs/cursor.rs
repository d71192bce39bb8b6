//! A [`File`]'s cursor state: the bytes read ahead of the caller, the
//! operation in flight, and the results it left for the next call. The
//! tokio traits (`compat.rs`) fill and drain it; every other method waits
//! for it first ([`File::settle`]), so nothing started through the traits
//! is overtaken or lost by a call made after it.
//!
//! # Implementation notes
//! - The cursor (`File::pos`) is the caller's position: bytes read ahead
//!   and not yet taken are the file's bytes just after it, so a seek, a
//!   write or [`File::read_to_end`] after a small read starts where the
//!   caller stopped, not where the read-ahead did.
//! - A write through the traits is reported written once its bytes are
//!   copied, as in `tokio::fs::File`, and is carried out by a task of its
//!   own on the worker ([`write_behind`]): it goes on whether or not the
//!   `File` is still there. Its error comes back at the next write, flush,
//!   shutdown, `sync_all` or `sync_data`.
//! - The operation in flight may be waited for by several futures at once
//!   (methods taking `&self`, from several tasks): each that finds it
//!   pending leaves its waker, and the operation is polled with a waker
//!   that wakes them all ([`Waiters`]). The operation keeps only the waker
//!   it was polled with last; were that a task's own, a task that polled
//!   last and then stopped waiting (its future dropped) would take the
//!   wake-up with it, and the others would wait for good.

// Without `tokio-io` nothing starts an operation through the traits: the
// state stays idle, and what only they use is never called.
#![cfg_attr(not(feature = "tokio-io"), allow(dead_code))]

use std::future::Future;
use std::io;
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use super::error::with_path;
use super::ops::{self, SharedFile};
use super::File;

/// What the operation in flight ended with.
pub(super) enum Done {
    /// A read ahead at the cursor, into the state's buffer.
    Read(io::Result<usize>, Vec<u8>),
    /// A write; in append mode, where it left the file's end.
    Write(io::Result<Option<u64>>),
    /// A seek to an offset from the end: the new cursor.
    Seek(io::Result<u64>),
}

/// The cursor's state (see the module notes).
#[derive(Default)]
pub(crate) struct State {
    /// `buf[start..]`: bytes read ahead, the file's bytes at the cursor.
    pub(super) buf: Vec<u8>,
    pub(super) start: usize,
    /// The operation in flight.
    pub(super) busy: Option<Pin<Box<dyn Future<Output = Done>>>>,
    /// Tasks waiting for it, and the waker it is polled with, which wakes
    /// them all; made at the first wait.
    waiters: Option<(Arc<Waiters>, Waker)>,
    /// A read found the end of the file: the next read through the traits says so.
    pub(super) eof: bool,
    /// A read ahead failed: the next read through the traits says so.
    pub(super) read_err: Option<io::Error>,
    /// A write reported as written failed: the next write, flush,
    /// shutdown, `sync_all` or `sync_data` says so.
    pub(super) write_err: Option<io::Error>,
    /// What the trait's `poll_complete` gives for the last seek.
    pub(super) seek: Option<io::Result<u64>>,
}

impl State {
    /// Bytes read ahead and not yet taken.
    pub(super) fn unread(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Forgets what was read ahead (a write or a seek makes it stale); the
    /// cursor stays where the caller is.
    pub(super) fn forget_read_ahead(&mut self) {
        self.buf.clear();
        self.start = 0;
        self.eof = false;
        self.read_err = None;
    }
}

impl File {
    /// Waits for the operation in flight through the traits, if any, and
    /// files its result for the calls after it.
    pub(super) async fn settle(&self) {
        if self.cursor.borrow().busy.is_some() {
            std::future::poll_fn(|cx| self.poll_settle(cx)).await;
        }
    }

    /// The poll form of [`File::settle`].
    pub(super) fn poll_settle(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut guard = self.cursor.borrow_mut();
        let st = &mut *guard;
        let Some(busy) = st.busy.as_mut() else { return Poll::Ready(()) };
        let (waiters, all) = st.waiters.get_or_insert_with(|| {
            let waiters = Arc::new(Waiters::default());
            (waiters.clone(), Waker::from(waiters))
        });
        // Left before the poll: a completion that wakes from another
        // thread while this one polls still finds this task on the list.
        waiters.add(cx.waker());
        let Poll::Ready(done) = busy.as_mut().poll(&mut Context::from_waker(all)) else {
            return Poll::Pending;
        };
        st.busy = None;
        match done {
            Done::Read(res, buf) => {
                st.buf = buf;
                st.start = 0;
                match res {
                    Ok(0) => st.eof = true,
                    Ok(_) => {}
                    Err(e) => st.read_err = Some(with_path("read", &self.path, e)),
                }
            }
            Done::Write(Ok(end)) => {
                if let Some(end) = end {
                    self.pos.set(end);
                }
            }
            Done::Write(Err(e)) => st.write_err = Some(with_path("write", &self.path, e)),
            Done::Seek(res) => {
                if let Ok(n) = res {
                    self.pos.set(n);
                }
                st.seek = Some(res);
            }
        }
        // Every other task still on the list finds the result filed (woken
        // with the state let go).
        let waiters = st.waiters.as_ref().map(|(waiters, _)| waiters.clone());
        drop(guard);
        if let Some(waiters) = waiters {
            waiters.wake_all_but(cx.waker());
        }
        Poll::Ready(())
    }

    /// Takes the error of a failed write reported as written, if any.
    pub(super) fn take_write_err(&self) -> Option<io::Error> {
        self.cursor.borrow_mut().write_err.take()
    }
}

/// The tasks waiting for the operation in flight: woken all at once by
/// the waker the operation is polled with.
#[derive(Default)]
struct Waiters(Mutex<Vec<Waker>>);

impl Waiters {
    /// Adds `waker` unless it is on the list already.
    fn add(&self, waker: &Waker) {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !list.iter().any(|w| w.will_wake(waker)) {
            list.push(waker.clone());
        }
    }

    /// Wakes every task on the list but the one `waker` wakes, and empties it.
    fn wake_all_but(&self, waker: &Waker) {
        let list = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        for w in list.into_iter().filter(|w| !w.will_wake(waker)) {
            w.wake();
        }
    }
}

impl Wake for Waiters {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let list = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        for w in list {
            w.wake();
        }
    }
}

/// Carries out a write through the traits: the task that writes `bytes` at
/// `offset`, short writes and all. In append mode the kernel puts the bytes
/// at the end whatever the offset, and the result is where the end is now,
/// for the cursor.
pub(super) fn write_behind(
    file: SharedFile,
    bytes: Arc<[u8]>,
    offset: u64,
    append: bool,
) -> impl Future<Output = Done> {
    // Made before the future, which owns it from the start: dropped before
    // its first poll, the future still writes the bytes.
    write_rest(Unwritten { file, bytes, offset, done: 0 }, append)
}

async fn write_rest(mut rest: Unwritten, append: bool) -> Done {
    let res = loop {
        if rest.done == rest.bytes.len() {
            break Ok(());
        }
        let slice = crate::buf::IoBuf::slice(rest.bytes.clone(), rest.done..);
        let (res, _) = ops::write_at(&rest.file, slice, rest.offset + rest.done as u64).await;
        match res {
            Ok(0) => break Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => rest.done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    // Failed or done: either way there is nothing left to carry out.
    rest.done = rest.bytes.len();
    match res {
        Ok(()) if append => {
            Done::Write(ops::metadata_file(&rest.file).await.map(|m| Some(m.len())))
        }
        res => Done::Write(res.map(|()| None)),
    }
}

/// The part of a write through the traits not yet carried out. Its task
/// is dropped unfinished only when the runtime stops (or the worker's loop
/// fails); the rest is then written at once on this thread, as tokio runs
/// a file write even when its runtime shuts down, since the caller was told
/// it was written. Bytes the kernel may also still be writing from the
/// cancelled operation are the same bytes at the same offset.
struct Unwritten {
    file: SharedFile,
    bytes: Arc<[u8]>,
    offset: u64,
    done: usize,
}

impl Drop for Unwritten {
    fn drop(&mut self) {
        if self.done < self.bytes.len() {
            // `pwrite` only: on a file that cannot seek a plain write could
            // wait for a reader for ever. Nobody is left to hear of an error.
            let at = self.offset + self.done as u64;
            let _ = self.file.write_all_at(&self.bytes[self.done..], at);
        }
    }
}
