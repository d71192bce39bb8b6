//! The driver contract, written once: for each role of socket, the calls
//! every backend's source answers, with what each promises.
//!
//! Each role's calls are listed once, in a macro below (`stream_calls!`
//! and the others), and that one list makes two things: here, the trait a
//! backend implements (`StreamOps` for `epoll::StreamSource` and
//! `uring::StreamSource`); in the face (`source.rs`), the role's enum
//! forwarding each call to the backend in use. So a new operation is one
//! line in its role's list and one method in each backend, and the
//! compiler says which backend lacks it.
//!
//! # Implementation notes
//! - The face calls a backend through the trait on the concrete type, a
//!   static call as before (no `dyn`, no boxing): the trait adds no
//!   instruction to a request.
//! - Four kinds of call stay outside the lists, each written by hand in
//!   the face: a constructor (it matches on the driver, not on a source),
//!   a listener's accepts (an io_uring accept may hand back a direct
//!   descriptor of its ring's file table, an epoll one a plain descriptor,
//!   so each backend returns its own type and the face wraps epoll's),
//!   a call that consumes the source and may hand it back (a stream's
//!   `into_fd`, whose refusal returns the backend's source inside the
//!   face's), and a call whose result is a backend's own named type (a
//!   stream's owned `send` returns each backend's future, so a connection
//!   holds one state while it writes, not nested `async fn`s').
//! - `async` calls come after the plain ones in each list: `macro_rules`
//!   matches one shape per group.

use std::io;
use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, RawFd};
use std::task::{Context as TaskContext, Poll};

use super::udp::{RecvMeta, SendMeta, Transmit};
use crate::buf::{BufResult, IoBuf, IoBufMut};

/// Makes a role's trait from its list of calls.
macro_rules! define_trait {
    (
        $(#[$trait_meta:meta])*
        $trait:ident for $role:ident {
            $(
                $(#[$meta:meta])*
                fn $name:ident $(<$($g:ident: $bound:path),*>)?
                    (&self $(, $arg:ident: $ty:ty)* $(,)?) $(-> $ret:ty)?;
            )*
            async {
                $(
                    $(#[$ameta:meta])*
                    fn $aname:ident $(<$($ag:ident: $abound:path),*>)?
                        (&self $(, $aarg:ident: $aty:ty)* $(,)?) $(-> $aret:ty)?;
                )*
            }
        }
    ) => {
        $(#[$trait_meta])*
        pub(crate) trait $trait {
            $(
                $(#[$meta])*
                fn $name $(<$($g: $bound),*>)? (&self $(, $arg: $ty)*) $(-> $ret)?;
            )*
            $(
                $(#[$ameta])*
                async fn $aname $(<$($ag: $abound),*>)? (&self $(, $aarg: $aty)*) $(-> $aret)?;
            )*
        }
    };
}

/// Makes a role's face: each call matched once over the backends and
/// forwarded to the one in use (invoked in `source.rs`).
macro_rules! define_face {
    (
        $(#[$trait_meta:meta])*
        $trait:ident for $role:ident {
            $(
                $(#[$meta:meta])*
                fn $name:ident $(<$($g:ident: $bound:path),*>)?
                    (&self $(, $arg:ident: $ty:ty)* $(,)?) $(-> $ret:ty)?;
            )*
            async {
                $(
                    $(#[$ameta:meta])*
                    fn $aname:ident $(<$($ag:ident: $abound:path),*>)?
                        (&self $(, $aarg:ident: $aty:ty)* $(,)?) $(-> $aret:ty)?;
                )*
            }
        }
    ) => {
        impl $role {
            $(
                $(#[$meta])*
                pub(crate) fn $name $(<$($g: $bound),*>)? (&self $(, $arg: $ty)*) $(-> $ret)? {
                    match self {
                        $role::Epoll(s) => $trait::$name(s $(, $arg)*),
                        $role::Uring(s) => $trait::$name(s $(, $arg)*),
                    }
                }
            )*
            $(
                $(#[$ameta])*
                pub(crate) async fn $aname $(<$($ag: $abound),*>)? (&self $(, $aarg: $aty)*) $(-> $aret)? {
                    match self {
                        $role::Epoll(s) => $trait::$aname(s $(, $aarg)*).await,
                        $role::Uring(s) => $trait::$aname(s $(, $aarg)*).await,
                    }
                }
            )*
        }
    };
}

/// The calls of a listening socket.
macro_rules! listener_calls {
    ($make:ident) => {
        $make! {
            /// What a backend's listening socket does.
            ListenerOps for ListenerSource {
                /// The raw descriptor (for syscalls that never wait).
                fn fd(&self) -> RawFd;
                /// The descriptor, borrowed for as long as the source lives.
                fn as_fd(&self) -> BorrowedFd<'_>;
                /// Ready once the driver holds no accept in the kernel for this
                /// listener (io_uring, after `set_accept_room(0)`; at once on epoll),
                /// so a socket another process also accepts on loses no connection to
                /// an accept nobody will take.
                fn poll_accept_settled(&self, cx: &mut TaskContext<'_>) -> Poll<()>;
                /// Sets how many connections the owner will take from now on
                /// (`usize::MAX`: all). The driver never accepts more than that ahead
                /// of the owner; the kernel's backlog holds the rest.
                fn set_accept_room(&self, room: usize);
                async {}
            }
        }
    };
}

/// The calls of a connected (or connecting) byte stream.
macro_rules! stream_calls {
    ($make:ident) => {
        $make! {
            /// What a backend's byte-stream socket does (besides its owned
            /// `send`, whose future is each backend's own type).
            StreamOps for StreamSource {
                /// The raw descriptor (for syscalls that never wait). A direct
                /// io_uring socket gets a plain descriptor installed on first use.
                fn fd(&self) -> RawFd;
                /// The descriptor, borrowed for as long as the source lives (for
                /// socket options through safe wrappers such as `socket2::SockRef`).
                fn as_fd(&self) -> BorrowedFd<'_>;
                /// The descriptor, borrowed, or why there is none: a direct io_uring
                /// socket whose plain descriptor cannot be installed (`EMFILE`).
                /// What the socket options use, so they fail rather than panic.
                fn try_as_fd(&self) -> io::Result<BorrowedFd<'_>>;
                /// The plain descriptor and the ring's file-table slot the socket
                /// has now, installing neither (for `Debug`): epoll's is always a
                /// plain descriptor, a direct io_uring socket's a slot and, once
                /// something asked for one, a descriptor too.
                fn ids_now(&self) -> (Option<RawFd>, Option<u32>);
                /// Ready once the socket may have bytes to read (or an end or error to
                /// report); then `try_recv` says whether it has. Holds no buffer
                /// while it waits.
                fn poll_readable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>>;
                /// Ready once a borrowed-slice write may take bytes without waiting
                /// (it may still find the socket full): on epoll once the socket is
                /// writable, on io_uring once the write-behind send in flight is done.
                fn poll_writable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>>;
                /// Drops what the stream keeps between writes (io_uring: the
                /// write-behind buffer) unless a write is in flight.
                #[cfg(feature = "hyper")]
                fn release_idle_buffers(&self);
                /// False when the last read drained the socket and nothing new has
                /// been signalled since: waiting first saves a syscall that would fail.
                fn may_read_now(&self) -> bool;
                /// Receives at most `buf.len()` bytes without waiting.
                /// `ErrorKind::WouldBlock` when there are none.
                fn try_recv(&self, buf: &mut [MaybeUninit<u8>]) -> io::Result<usize>;
                /// Reads into a borrowed slice that may be uninitialised (a tokio
                /// `ReadBuf`'s or hyper's spare room, which need not be zeroed first);
                /// `Ok(n)` means the first `n` bytes of `buf` were written, and no
                /// byte of `buf` is de-initialised.
                fn poll_read_uninit(&self, cx: &mut TaskContext<'_>, buf: &mut [MaybeUninit<u8>])
                    -> Poll<io::Result<usize>>;
                /// Writes several borrowed slices with one call, for the poll-based I/O traits.
                fn poll_write_slices(&self, cx: &mut TaskContext<'_>, bufs: &[io::IoSlice<'_>])
                    -> Poll<io::Result<usize>>;
                /// The borrowed-slice write without waiting: `ErrorKind::WouldBlock`
                /// where the poll form would wait. It takes no task's wake-up: a
                /// task waiting to write (`poll_writable`, a flush) is still woken.
                fn try_write_slices(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize>;
                /// Waits until every byte a borrowed-slice write accepted is in the
                /// kernel (io_uring writes behind; on epoll there is nothing to wait for).
                fn poll_flush(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>>;
                async {
                    /// Receives into `buf` (from its start up to its capacity).
                    fn recv<B: IoBufMut>(&self, buf: B) -> BufResult<usize, B>;
                    /// Sends the buffers in order in one call; may send fewer bytes than all.
                    fn send_vectored<B: IoBuf>(&self, bufs: Vec<B>) -> BufResult<usize, Vec<B>>;
                    /// Connects a fresh non-blocking socket to `addr`.
                    fn connect(&self, addr: SocketAddr) -> io::Result<()>;
                    /// Sends up to `len` bytes of `file` from `offset` without copying them
                    /// through user space, stopping early at the file's end: `sendfile` on
                    /// both drivers (io_uring waits for room with a `POLL_ADD`; with
                    /// `HOTLOOP_URING_SEND_FILE=splice`, `SPLICE` through a pipe). Returns
                    /// the bytes sent, and the error that stopped it before `len`, if one did.
                    fn send_file(&self, file: &std::sync::Arc<std::fs::File>, offset: u64, len: u64)
                        -> (u64, io::Result<()>);
                    /// Shuts down one or both directions of a connection.
                    fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()>;
                }
            }
        }
    };
}

/// The calls of a datagram socket.
macro_rules! datagram_calls {
    ($make:ident) => {
        $make! {
            /// What a backend's datagram socket does.
            DatagramOps for DatagramSource {
                /// The raw descriptor (for syscalls that never wait).
                fn fd(&self) -> RawFd;
                /// The descriptor, borrowed for as long as the source lives.
                fn as_fd(&self) -> BorrowedFd<'_>;
                /// Receives up to [`super::udp::BATCH_DATAGRAMS_MAX`] datagrams into
                /// borrowed buffers, one per buffer, or parks the task until one comes.
                fn poll_recv_batch(
                    &self,
                    cx: &mut TaskContext<'_>,
                    bufs: &mut [IoSliceMut<'_>],
                    meta: &mut [RecvMeta],
                ) -> Poll<io::Result<usize>>;
                /// Sends up to [`super::udp::BATCH_DATAGRAMS_MAX`] transmits from
                /// borrowed buffers, or parks the task until the socket has room.
                /// Returns how many the kernel took.
                fn poll_send_batch(&self, cx: &mut TaskContext<'_>, transmits: &[Transmit<'_>])
                    -> Poll<io::Result<usize>>;
                /// Sends one transmit now, or fails with `WouldBlock`; then
                /// `writable` waits for room.
                fn try_send_one(&self, transmit: &Transmit<'_>) -> io::Result<usize>;
                /// True once the socket's receives take from an io_uring multishot
                /// `RECVMSG` (never on epoll).
                fn receives_from_ring(&self) -> bool;
                /// Stops taking datagrams from the socket for good (another process
                /// reads it now): receives after it pend for ever, and on io_uring the
                /// armed multishot `RECVMSG` is cancelled and the datagrams it queued
                /// are dropped. Sends go on.
                fn stop_receiving(&self);
                async {
                    /// Receives one datagram into `buf` (from its start up to its capacity),
                    /// with what the kernel said about it.
                    fn recv_msg<B: IoBufMut>(&self, buf: B) -> BufResult<RecvMeta, B>;
                    /// Sends the initialised bytes of `buf` as one datagram, or as a train
                    /// of `meta.segment_size` datagrams (GSO).
                    fn send_msg<B: IoBuf>(&self, buf: B, meta: SendMeta) -> BufResult<usize, B>;
                    /// Waits until the socket may have room to send.
                    fn writable(&self) -> io::Result<()>;
                }
            }
        }
    };
}

/// The calls of a descriptor the driver only watches.
macro_rules! readiness_calls {
    ($make:ident) => {
        $make! {
            /// What a backend does for a descriptor whose I/O is made elsewhere.
            ReadinessOps for ReadinessSource {
                /// The descriptor, borrowed for as long as the source lives.
                fn as_fd(&self) -> BorrowedFd<'_>;
                /// Ready when the descriptor next polls readable: for a pidfd,
                /// readable once its process has exited. It never answers from
                /// remembered readiness, since its caller has just looked and found
                /// nothing: epoll waits for the next event (registration reports a
                /// descriptor readable already), io_uring keeps a one-shot `POLL_ADD`
                /// across polls.
                fn poll_next_readable(&self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>>;
                async {
                    /// Ready when the descriptor next polls writable; as
                    /// `poll_next_readable`, never from remembered readiness.
                    fn next_writable(&self) -> io::Result<()>;
                }
            }
        }
    };
}

pub(crate) use {datagram_calls, define_face, listener_calls, readiness_calls, stream_calls};

listener_calls!(define_trait);
stream_calls!(define_trait);
datagram_calls!(define_trait);
readiness_calls!(define_trait);
