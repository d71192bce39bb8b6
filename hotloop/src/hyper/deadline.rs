//! What a served connection records as it goes (bytes moved, a write
//! waiting, the requests taken), the I/O that records it, and the one timer
//! that turns the record into deadlines.
//!
//! The deadlines cost no timer per request: the I/O handed to hyper
//! records, in a [`Progress`] it shares with the connection's task, when
//! bytes last moved and since when a write has waited; the task keeps one
//! [`Watch`], moved only earlier as it goes, and looks at the record when
//! it fires, filing it again for the later deadline if bytes moved
//! meanwhile (nginx keeps its timers the same way).
//!
//! A fired timer is judged by the clock itself as well as by the turn's
//! reading of it: a sleep is ready once the clock has passed its deadline,
//! which may lie ahead of the turn's reading, and a deadline the turn's
//! reading says is still ahead would be filed again and be ready again,
//! for ever, inside one poll.

use std::cell::Cell;
use std::future::Future;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use hyper::rt::ReadBufCursor;

use crate::net::TcpStream;
use crate::time::Sleep;

/// How long an idle connection that was asked to finish (HTTP/2: sent a
/// GOAWAY) may take to end before it is cut.
pub const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// How long a connection that hyper ended waits, its write side shut, for
/// the client's next bytes before it is closed anyway (a lingering close):
/// counted from the shutdown, then from each read, so a client still
/// sending is read to its end (nginx's `lingering_timeout`, shorter).
pub(super) const LINGER: Duration = Duration::from_secs(2);

/// The most reads of what the client still sends that a lingering close
/// drops (of up to [`LINGER_READ_BYTES`] each: about 4 MiB); then it
/// closes. With [`LINGER`] between reads, it bounds a client that keeps
/// sending, as nginx's `lingering_time` does.
const LINGER_READS_MAX: u8 = 254;
/// The room of one lingering read, on the stack.
const LINGER_READ_BYTES: usize = 16 * 1024;

/// A stream whose socket can be shut down while the stream is in use.
pub(super) trait Socket {
    /// The socket under the stream; an error where it has no descriptor
    /// and none can be installed (an io_uring direct socket, the process
    /// out of descriptors).
    fn socket(&self) -> std::io::Result<BorrowedFd<'_>>;

    /// A probe of the socket's receive queue (see [`TcpStream::input_probe`]).
    fn input_probe(&self) -> crate::net::InputProbe;

    /// Drops what the stream keeps between writes (io_uring's
    /// write-behind buffer) unless a write is in flight.
    fn release_idle_buffers(&self);
}

impl Socket for TcpStream {
    fn socket(&self) -> std::io::Result<BorrowedFd<'_>> {
        self.core().try_as_fd()
    }

    fn input_probe(&self) -> crate::net::InputProbe {
        TcpStream::input_probe(self)
    }

    fn release_idle_buffers(&self) {
        self.core().release_idle_buffers();
    }
}

#[cfg(feature = "tls")]
impl Socket for crate::tls::ServerTlsStream {
    fn socket(&self) -> std::io::Result<BorrowedFd<'_>> {
        self.get_ref().0.core().try_as_fd()
    }

    fn input_probe(&self) -> crate::net::InputProbe {
        self.get_ref().0.input_probe()
    }

    fn release_idle_buffers(&self) {
        self.get_ref().0.release_idle_buffers();
    }
}

/// A connection's deadlines, as each connection's task holds them: in
/// whole milliseconds, 16 bytes where four `Option<Duration>` take 64 (an
/// idle connection's task is mostly this kind of thing).
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadlines {
    idle: Millis,
    send: Millis,
    header: Millis,
    /// HTTP/1.1: how long a connection that keeps sending waits for its
    /// next request with hyper's state before that state is released.
    release: Millis,
}

impl Deadlines {
    pub(super) fn new(
        idle: Option<Duration>,
        send: Option<Duration>,
        header: Option<Duration>,
        release: Option<Duration>,
    ) -> Self {
        Deadlines {
            idle: Millis::new(idle),
            send: Millis::new(send),
            header: Millis::new(header),
            release: Millis::new(release),
        }
    }

    pub(super) fn idle(&self) -> Option<Duration> {
        self.idle.get()
    }

    pub(super) fn send(&self) -> Option<Duration> {
        self.send.get()
    }

    pub(super) fn header(&self) -> Option<Duration> {
        self.header.get()
    }

    pub(super) fn release(&self) -> Option<Duration> {
        self.release.get()
    }
}

/// An optional duration in whole milliseconds, rounded up; `u32::MAX`
/// is none (a limit beyond 49 days is none too).
#[derive(Debug, Clone, Copy)]
struct Millis(u32);

impl Millis {
    fn new(d: Option<Duration>) -> Self {
        match d {
            None => Millis(u32::MAX),
            Some(d) => {
                let ms = d.as_nanos().div_ceil(1_000_000);
                Millis(u32::try_from(ms).unwrap_or(u32::MAX))
            }
        }
    }

    fn get(self) -> Option<Duration> {
        (self.0 != u32::MAX).then(|| Duration::from_millis(u64::from(self.0)))
    }
}

/// An instant of the worker's loop clock in 8 bytes (an `Instant` takes
/// 16): nanoseconds since the worker's clock started, read with no
/// arithmetic (every idle connection keeps three, and every read and
/// write records one). Comparable only on one worker, which is where a
/// connection lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Stamp(u64);

impl Stamp {
    /// No instant (a write that is not waiting; no deadline).
    pub(super) const NONE: Stamp = Stamp(u64::MAX);

    /// The loop's reading of this turn ([`crate::time::now`]).
    #[inline]
    pub(super) fn now() -> Stamp {
        Stamp(crate::runtime::current::try_clock_ns().unwrap_or(0))
    }

    /// `d` later.
    #[inline]
    pub(super) fn after(self, d: Duration) -> Stamp {
        Stamp(self.0.saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)))
    }

    /// How long from `self` until `later` (zero if `later` is not later).
    pub(super) fn until(self, later: Stamp) -> Duration {
        Duration::from_nanos(later.0.saturating_sub(self.0))
    }

    /// `t` as a stamp (hyper's deadlines come as `Instant`s).
    pub(super) fn from_instant(t: Instant) -> Stamp {
        Stamp(crate::runtime::current::try_clock_ns_at(t).unwrap_or(0))
    }

    /// As an `Instant`, for the timer wheel.
    pub(super) fn instant(self) -> Instant {
        crate::runtime::current::try_clock_instant_at(self.0).unwrap_or_else(Instant::now)
    }
}

/// [`Progress::ends`]: the connection speaks HTTP/2.
const HTTP2: u8 = 1;
/// [`Progress::ends`]: hyper was asked to end the connection gracefully (GOAWAY).
const GOING_AWAY: u8 = 2;
/// [`Progress::ends`]: a read returned the client's end of stream, or the kernel said it came.
const ENDED: u8 = 4;
/// [`Progress::ends`]: a request was handed an `OnUpgrade`, so hyper's end
/// may be an upgrade.
const UPGRADE: u8 = 8;
/// [`Progress::ends`]: the server stops and hyper has not been told yet
/// (an answer is in flight, its head said keep-alive).
const STOP_PENDING: u8 = 16;
/// [`Progress::ends`]: the service owes an answer and nothing waits on the
/// client (see `ServeConnection::owes_answer`): the idle timeout waits.
const OWED: u8 = 32;

/// What a connection's I/O and its service record (see the module notes),
/// in the loop's clock.
pub(super) struct Progress {
    /// When a byte last moved either way; on HTTP/2, a byte of a stream's
    /// frame (PINGs and the like keep no connection from being idle).
    moved: Cell<Stamp>,
    /// Since when a write (or a flush) has been waiting, while one is.
    write_waiting: Cell<Stamp>,
    /// The last flush (or shutdown) had to wait.
    flush_waited: Cell<bool>,
    /// The last read found nothing and waits for the client.
    read_waiting: Cell<bool>,
    /// The last request came with a body: hyper may still be reading it.
    bodied: Cell<bool>,
    /// A request was taken and no byte of its answer has been written
    /// yet: an answer chosen now can still say `Connection: close`.
    unanswered: Cell<bool>,
    /// When the next request head must have arrived (HTTP/1.1's
    /// header-read timeout; [`Stamp::NONE`] for none): from the
    /// connection's start, then as hyper sets it when it begins to wait
    /// for each head (see `HeadTimer`).
    head_by: Cell<Stamp>,
    /// hyper waits on [`Progress::head_by`] (its header-read sleep lives).
    head_armed: Cell<bool>,
    /// A deadline passed: the socket is shut down before it is closed.
    pub(super) cut: Cell<bool>,
    /// 0 until the write side is shut at hyper's end; then one more than
    /// the reads the lingering close has dropped (see [`TimedIo`]).
    linger: Cell<u8>,
    /// [`HTTP2`], [`GOING_AWAY`], [`ENDED`] (see
    /// [`Progress::mute_after_end`]), [`UPGRADE`], [`STOP_PENDING`] and
    /// [`OWED`]: one byte, so the record stays 32.
    ends: Cell<u8>,
}

impl Progress {
    pub(super) fn new(header: Option<Duration>) -> Self {
        let now = Stamp::now();
        Progress {
            moved: Cell::new(now),
            write_waiting: Cell::new(Stamp::NONE),
            flush_waited: Cell::new(false),
            read_waiting: Cell::new(false),
            bodied: Cell::new(false),
            unanswered: Cell::new(false),
            head_by: Cell::new(header.map_or(Stamp::NONE, |t| now.after(t))),
            head_armed: Cell::new(false),
            cut: Cell::new(false),
            linger: Cell::new(0),
            ends: Cell::new(0),
        }
    }

    /// Whether a request was handed an `OnUpgrade` (hyper's end may then
    /// be an upgrade).
    pub(super) fn upgrade(&self) -> bool {
        self.ends.get() & UPGRADE != 0
    }

    /// Whether an upgrade was offered and the request's answer has begun
    /// without the service asking for it to run (a request without a body:
    /// one with a body may have been sent `100 Continue`, which is no
    /// answer).
    pub(super) fn upgrade_unused(&self) -> bool {
        self.upgrade() && !self.unanswered.get() && !self.bodied.get()
    }

    /// Sets or clears [`Progress::upgrade`].
    pub(super) fn set_upgrade(&self, on: bool) {
        let ends = self.ends.get();
        self.ends.set(if on { ends | UPGRADE } else { ends & !UPGRADE });
    }

    /// Sets or clears [`STOP_PENDING`].
    pub(super) fn set_stop_pending(&self, on: bool) {
        let ends = self.ends.get();
        self.ends.set(if on { ends | STOP_PENDING } else { ends & !STOP_PENDING });
    }

    /// With a stop pending, hyper's read for the next request's head is
    /// held back once its answer is out: the connection's loop then finds
    /// it between requests and rebuilds it without keep-alive, so that
    /// request is answered with `Connection: close`. (Let through, hyper
    /// could read and answer it keep-alive within the same poll.) Only
    /// when nothing else is owed: no request body, no write or flush
    /// waiting, so the loop's release is sure to follow and nothing spins.
    fn holds_next_head(&self) -> bool {
        self.ends.get() & STOP_PENDING != 0
            && !self.bodied.get()
            && self.write_waiting.get() == Stamp::NONE
            && !self.flush_waited.get()
    }

    /// Sets or clears [`OWED`].
    pub(super) fn set_owed(&self, on: bool) {
        let ends = self.ends.get();
        self.ends.set(if on { ends | OWED } else { ends & !OWED });
    }

    /// Whether the service owes an answer and nothing waits on the client.
    fn owed(&self) -> bool {
        self.ends.get() & OWED != 0
    }

    /// HTTP/1.1: true while a request is being served: no read waits for
    /// the client, no write or flush waits, and the close does not linger.
    /// hyper reads the next head as soon as an answer has ended (and a
    /// request's body only while the service asks for it), so a read that
    /// does not wait means a request is taken and its answer not done.
    pub(super) fn serving(&self) -> bool {
        !self.read_waiting.get()
            && self.write_waiting.get() == Stamp::NONE
            && !self.flush_waited.get()
            && self.linger.get() == 0
    }

    /// The connection turned out to speak HTTP/2.
    pub(super) fn set_http2(&self) {
        self.ends.set(self.ends.get() | HTTP2);
    }

    /// hyper was asked to end the connection gracefully.
    pub(super) fn set_going_away(&self) {
        self.ends.set(self.ends.get() | GOING_AWAY);
    }

    /// True once an HTTP/2 connection's client has ended its side: what is
    /// written from then on is dropped instead of sent. Once the connection
    /// goes away (a drain), the kernel is asked too before each write
    /// (`fd`): the client's end may have come with bytes hyper has not read
    /// yet (the PING's answer, the client's own `GOAWAY`).
    ///
    /// Why: h2 takes the client's end as the end of the connection (its
    /// open streams fail), so nothing written afterwards is read, and a
    /// client that closed its socket answers it with a reset. That is what
    /// a drain's GOAWAY met: hyper's graceful shutdown sends `GOAWAY` with
    /// the highest stream id and a PING, and the final `GOAWAY` once the
    /// PING comes back; a client with no stream open answers the PING,
    /// sends its own `GOAWAY` and closes at once, and the final `GOAWAY`
    /// then drew one reset per connection on every upgrade. HTTP/1.1 is
    /// left alone: a client that ends its side after a request still
    /// reads the answer (`half_close`).
    fn mute_after_end(&self, fd: impl FnOnce() -> std::io::Result<std::os::fd::RawFd>) -> bool {
        let ends = self.ends.get();
        if ends & HTTP2 == 0 {
            return false;
        }
        if ends & ENDED == 0
            && ends & GOING_AWAY != 0
            && fd().and_then(crate::sys::peer_ended).unwrap_or(false)
        {
            self.ends.set(ends | ENDED);
        }
        self.ends.get() & ENDED != 0
    }

    /// Since when the connection waits, its write side shut, for the
    /// client's end (a lingering close), if it does.
    pub(super) fn lingering_since(&self) -> Option<Stamp> {
        (self.linger.get() > 0).then(|| self.moved.get())
    }

    /// Records the outcome of a read. A write that waits still waits: a
    /// client that sends and does not read is still bounded by the send
    /// timeout. On HTTP/2 bytes read are not progress by themselves: only
    /// a stream's frames are ([`Progress::stream_moved`]).
    #[inline]
    pub(super) fn read(&self, poll: &Poll<std::io::Result<()>>, got: bool) {
        self.read_waiting.set(poll.is_pending());
        if got {
            if self.ends.get() & HTTP2 == 0 {
                self.moved.set(Stamp::now());
            }
        } else if matches!(poll, Poll::Ready(Ok(()))) {
            self.ends.set(self.ends.get() | ENDED);
        }
    }

    /// HTTP/2: a frame of a stream's request or answer passed (see
    /// `frames.rs`): the connection is not idle.
    #[inline]
    pub(super) fn stream_moved(&self) {
        self.moved.set(Stamp::now());
    }

    /// The service took a request; `bodied` if a body follows its head.
    #[inline]
    pub(super) fn took(&self, bodied: bool) {
        self.bodied.set(bodied);
        self.unanswered.set(true);
    }

    /// True from a request's taking until the first byte of its answer is
    /// written (see [`Progress::unanswered`]'s field).
    pub(super) fn unanswered(&self) -> bool {
        self.unanswered.get()
    }

    /// True while the connection waits for the client and writes nothing:
    /// its last read waits, and no write or flush does.
    pub(super) fn waiting_for_client(&self) -> bool {
        self.read_waiting.get()
            && self.write_waiting.get() == Stamp::NONE
            && !self.flush_waited.get()
    }

    /// When the next request head must have arrived, if ever.
    pub(super) fn head_by(&self) -> Option<Stamp> {
        let by = self.head_by.get();
        (by != Stamp::NONE).then_some(by)
    }

    /// When a byte last moved either way (see [`Progress::moved`]'s field).
    pub(super) fn last_moved(&self) -> Stamp {
        self.moved.get()
    }

    /// Bytes are on their way (seen in the socket at `at`, not yet read):
    /// the connection is not quiet.
    pub(super) fn stir_at(&self, at: Stamp) {
        self.moved.set(at);
    }

    /// Since when a write (or a flush) has been waiting, while one is.
    fn write_waiting(&self) -> Option<Stamp> {
        let since = self.write_waiting.get();
        (since != Stamp::NONE).then_some(since)
    }

    /// Bytes moved (the start of a lingering close, a read it dropped).
    #[inline]
    fn moved(&self) {
        self.moved.set(Stamp::now());
        self.write_waiting.set(Stamp::NONE);
    }

    /// A write (or a flush) moved bytes: no write waits. On HTTP/2 that is
    /// not progress by itself (a PING's answer, a SETTINGS acknowledgement):
    /// only a stream's frames are ([`Progress::stream_moved`]).
    #[inline]
    fn wrote_some(&self) {
        if self.ends.get() & HTTP2 == 0 {
            self.moved.set(Stamp::now());
        }
        self.write_waiting.set(Stamp::NONE);
    }

    #[inline]
    fn waiting(&self) {
        if self.write_waiting.get() == Stamp::NONE {
            self.write_waiting.set(Stamp::now());
        }
    }

    /// Records the outcome of a write.
    #[inline]
    fn wrote(&self, poll: &Poll<std::io::Result<usize>>) {
        match poll {
            Poll::Pending => self.waiting(),
            Poll::Ready(Ok(n)) if *n > 0 => {
                self.unanswered.set(false);
                self.wrote_some();
            }
            Poll::Ready(_) => {}
        }
    }

    /// Records the outcome of a flush or a shutdown: progress only if it
    /// had to wait (one that has nothing to wait for, as on epoll, or
    /// nothing buffered, must not pass for progress).
    #[inline]
    fn flushed(&self, poll: &Poll<std::io::Result<()>>) {
        match poll {
            Poll::Pending => {
                self.flush_waited.set(true);
                self.waiting();
            }
            Poll::Ready(result) => {
                if self.flush_waited.replace(false) && result.is_ok() {
                    self.wrote_some();
                }
            }
        }
    }

    /// True when an HTTP/1.1 connection sits between requests: its last
    /// read waits for the client, the last request had no body, and
    /// everything written has gone to the kernel. Taking hyper's state
    /// apart here loses nothing but buffers: what hyper read and has not
    /// parsed comes back with its parts.
    ///
    /// Why a waiting read means no request is open: hyper's HTTP/1.1
    /// server reads a head only with no request in flight, and once a
    /// head without a body is read, it reads nothing more until that
    /// request's answer has ended (with `half_close` set, as here, it does
    /// not read to look for the client's end while it answers). So after
    /// such a request, the next read is the next head's. A request with a
    /// body may be followed by reads of that body, so the state is kept
    /// until a request without one has been answered.
    #[inline]
    pub(super) fn between_requests(&self) -> bool {
        self.read_waiting.get()
            && !self.bodied.get()
            && self.write_waiting.get() == Stamp::NONE
            && !self.flush_waited.get()
    }
}

/// The I/O hyper gets from `serve_hyper`: the stream, recording its
/// progress.
pub(super) struct TimedIo<T: Socket> {
    pub(super) io: T,
    pub(super) progress: Rc<Progress>,
}

impl<T: Socket> Drop for TimedIo<T> {
    fn drop(&mut self) {
        if self.progress.cut.get() {
            // Ends a write in flight now (on io_uring a dropped stream's
            // write would otherwise linger), and the client reads a reset
            // or an end rather than waiting.
            if let Ok(fd) = self.io.socket() {
                let _ = socket2::SockRef::from(&fd).shutdown(Shutdown::Both);
            }
        }
    }
}

impl<T: tokio::io::AsyncRead + Socket + Unpin> TimedIo<T> {
    /// Reads what the client sent into the end of `into` through a buffer
    /// on the stack, so nothing is allocated while the client is silent.
    /// `Ok(0)`: the client's side ended.
    pub(super) fn poll_read_to(
        &mut self,
        cx: &mut Context<'_>,
        into: &mut Vec<u8>,
    ) -> Poll<std::io::Result<usize>> {
        let mut room = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        let mut rb = tokio::io::ReadBuf::uninit(&mut room);
        let poll = Pin::new(&mut self.io).poll_read(cx, &mut rb);
        self.progress.read(&poll, !rb.filled().is_empty());
        std::task::ready!(poll)?;
        into.extend_from_slice(rb.filled());
        Poll::Ready(Ok(rb.filled().len()))
    }
}

/// The I/O of an upgraded connection (`upgrade.rs`): tokio's traits, the
/// progress still recorded, so the idle and send timeouts still apply; a
/// shutdown only shuts the write side (a tunnel's other direction goes
/// on), with no lingering close.
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Socket + Unpin> TimedIo<T> {
    pub(super) fn poll_tunnel_read(
        &mut self,
        cx: &mut Context<'_>,
        rb: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = rb.filled().len();
        let poll = Pin::new(&mut self.io).poll_read(cx, rb);
        self.progress.read(&poll, rb.filled().len() > before);
        poll
    }

    pub(super) fn poll_tunnel_write(
        &mut self,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.progress.wrote(&poll);
        poll
    }

    pub(super) fn poll_tunnel_flush(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.progress.flushed(&poll);
        poll
    }

    pub(super) fn poll_tunnel_shutdown(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_shutdown(cx);
        self.progress.flushed(&poll);
        poll
    }
}

impl<T: tokio::io::AsyncRead + Socket + Unpin> hyper::rt::Read for TimedIo<T> {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.progress.holds_next_head() {
            this.progress.read(&Poll::Pending, false);
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        crate::buf::poll_read_hyper(buf, |rb| {
            let poll = Pin::new(&mut this.io).poll_read(cx, rb);
            this.progress.read(&poll, !rb.filled().is_empty());
            poll
        })
    }
}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Socket + Unpin> hyper::rt::Write
    for TimedIo<T>
{
    #[inline]
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.progress.mute_after_end(|| self.io.socket().map(|fd| fd.as_raw_fd())) {
            return Poll::Ready(Ok(buf.len()));
        }
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.progress.wrote(&poll);
        poll
    }

    #[inline]
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if self.progress.mute_after_end(|| self.io.socket().map(|fd| fd.as_raw_fd())) {
            return Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()));
        }
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.progress.wrote(&poll);
        poll
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    #[inline]
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // On io_uring the stream writes behind: a flush waits for the kernel.
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.progress.flushed(&poll);
        poll
    }

    /// hyper's end of the connection: the write side is shut (a TLS
    /// stream sends its close_notify first), then the close lingers (see
    /// [`TimedIo::poll_linger`]).
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.progress.linger.get() == 0 {
            let poll = Pin::new(&mut this.io).poll_shutdown(cx);
            this.progress.flushed(&poll);
            std::task::ready!(poll)?;
            // The linger's clock starts now (only its own reads move the stamp after this).
            this.progress.moved();
            this.progress.linger.set(1);
        }
        this.poll_linger(cx)
    }
}

impl<T: tokio::io::AsyncRead + Socket + Unpin> TimedIo<T> {
    /// Reads and drops what the client still sends until its end (a FIN,
    /// or a TLS close_notify), at most [`LINGER_READS_MAX`] reads; the
    /// connection's timer closes it once the client has sent nothing for
    /// [`LINGER`] (each read moves the connection's stamp).
    ///
    /// Why: hyper ends a connection after a request that asks it to
    /// (`Connection: close`, HTTP/1.0) without reading on. A client may
    /// have sent more: over TLS a client that ends its side sends a
    /// close_notify record after its request. Closing a socket with
    /// unread bytes makes the kernel send a reset, and a reset makes the
    /// client's kernel drop the answer it has not read yet (RFC 9112
    /// section 9.6; nginx's `lingering_close`): 9 to 22 of 50 such TLS
    /// clients got their answer.
    fn poll_linger(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let mut room = [std::mem::MaybeUninit::<u8>::uninit(); LINGER_READ_BYTES];
        while self.progress.linger.get() <= LINGER_READS_MAX {
            let mut rb = tokio::io::ReadBuf::uninit(&mut room);
            match std::task::ready!(Pin::new(&mut self.io).poll_read(cx, &mut rb)) {
                Ok(()) if !rb.filled().is_empty() => {
                    self.progress.moved();
                    self.progress.linger.set(self.progress.linger.get() + 1);
                }
                // The client's end, or an error (a reset; over TLS, a
                // FIN without close_notify): nothing more to wait for.
                _ => return Poll::Ready(Ok(())),
            }
        }
        Poll::Ready(Ok(()))
    }
}

thread_local! {
    /// The record of the connection whose task this worker is polling.
    static POLLING: Cell<Option<Rc<Progress>>> = const { Cell::new(None) };
}

/// While alive, `progress` is the record of the connection being polled
/// (for [`HeadTimer`]); restores the one before when dropped.
pub(super) struct Polling(Option<Rc<Progress>>);

impl Polling {
    pub(super) fn new(progress: &Rc<Progress>) -> Self {
        Polling(POLLING.replace(Some(progress.clone())))
    }
}

impl Drop for Polling {
    fn drop(&mut self) {
        POLLING.set(self.0.take());
    }
}

/// `f` on the record of the connection being polled, if there is one.
fn with_polling<R>(f: impl FnOnce(&Progress) -> R) -> Option<R> {
    POLLING.with(|cell| {
        let progress = cell.take();
        let r = progress.as_deref().map(f);
        cell.set(progress);
        r
    })
}

/// hyper's timer for a served HTTP/1.1 connection, whose only sleep is
/// the header-read timeout. hyper makes that sleep afresh for every
/// request (a box, and a timer filed in the wheel and taken out when the
/// head arrives); this one keeps the deadline in the connection's record
/// instead, where the connection's one timer already looks
/// ([`Watch`]), and its sleep is a zero-sized box, which allocates
/// nothing. hyper polls the sleep only from inside the connection's
/// poll, where [`Polling`] names the record.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct HeadTimer;

/// The sleep of [`HeadTimer`]: ready once the record's head deadline has
/// passed by the turn's clock, or once the connection's [`Watch`] saw it
/// pass (which disarms it).
struct HeadSleep;

impl Future for HeadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        // Pending with no record: never seen, as hyper polls it only from
        // inside the connection's poll; the idle timeout would still end
        // the connection.
        let passed = with_polling(|p| {
            !p.head_armed.get() || p.head_by().is_none_or(|by| Stamp::now() >= by)
        });
        if passed.unwrap_or(false) {
            Poll::Ready(())
        } else {
            // The connection's watch wakes the task at the deadline.
            Poll::Pending
        }
    }
}

impl Drop for HeadSleep {
    fn drop(&mut self) {
        with_polling(|p| p.head_armed.set(false));
    }
}

impl hyper::rt::Sleep for HeadSleep {}

impl hyper::rt::Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until(crate::time::now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        with_polling(|p| {
            p.head_by.set(Stamp::from_instant(deadline));
            p.head_armed.set(true);
        });
        Box::pin(HeadSleep)
    }

    /// The worker loop's reading of this turn, as [`super::HotloopTimer`]'s.
    fn now(&self) -> Instant {
        crate::time::now()
    }

    fn reset(&self, _: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        with_polling(|p| {
            p.head_by.set(Stamp::from_instant(new_deadline));
            p.head_armed.set(true);
        });
    }
}

/// Which deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    /// Nothing moved for the idle timeout, and no write is waiting (or a
    /// connection without hyper state reached its header deadline): the
    /// connection is asked to finish.
    Idle,
    /// A write stalled past its limit, or the grace after [`Expiry::Idle`]
    /// ran out: the connection is cut.
    Cut,
    /// An HTTP/1.1 connection sat between requests for the release time:
    /// hyper's state for it is released.
    Release,
    /// hyper's header-read deadline passed: hyper is polled to see it.
    Head,
}

/// A connection's one timer for its deadlines, moved only earlier as it
/// goes and brought up to date when it fires.
pub(super) struct Watch {
    timer: Sleep,
    /// The timer's deadline: compared on every poll without turning a
    /// [`Stamp`] into an `Instant`.
    timer_at: Stamp,
    /// The waker the timer is filed with in the worker's wheel, while it
    /// is: a poll that finds its own task's waker there and the deadline
    /// still ahead need not touch the wheel (the usual case).
    filed: Option<Waker>,
    /// After [`Expiry::Idle`]: when the connection is cut if it has not
    /// ended ([`Stamp::NONE`] before).
    cut_at: Stamp,
}

impl Watch {
    pub(super) fn new() -> Self {
        Watch {
            timer: crate::time::sleep(Duration::MAX),
            timer_at: Stamp::NONE,
            filed: None,
            cut_at: Stamp::NONE,
        }
    }

    /// The earliest deadline now, and what passing it means. `phase` is
    /// the deadline the connection's state adds (see
    /// `ServeConnection::phase_deadline`).
    fn due(
        &self,
        progress: &Progress,
        d: &Deadlines,
        phase: Option<(Stamp, Expiry)>,
    ) -> Option<(Stamp, Expiry)> {
        let waiting = progress.write_waiting();
        let send = waiting.zip(d.send()).map(|(since, t)| (since.after(t), Expiry::Cut));
        if self.cut_at != Stamp::NONE {
            // Asked to finish: only the grace and a stalled write count now.
            let grace = (self.cut_at, Expiry::Cut);
            return Some(send.filter(|s| s.0 < grace.0).unwrap_or(grace));
        }
        // While the service owes an answer the idle timeout waits; a write
        // that waits is still cut at it.
        let idle = d.idle().filter(|_| waiting.is_some() || !progress.owed()).map(|t| {
            // A write stalled that long is cut: a GOAWAY could not go out.
            let expiry = if waiting.is_some() { Expiry::Cut } else { Expiry::Idle };
            (progress.last_moved().after(t), expiry)
        });
        let head =
            progress.head_by().filter(|_| progress.head_armed.get()).map(|by| (by, Expiry::Head));
        [send, idle, phase, head].into_iter().flatten().min_by_key(|(at, _)| *at)
    }

    /// Whether a deadline passed; registers `cx` to be woken at the next
    /// one otherwise.
    pub(super) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        progress: &Progress,
        d: &Deadlines,
        phase: Option<(Stamp, Expiry)>,
    ) -> Option<Expiry> {
        let (due, _) = self.due(progress, d, phase)?;
        if due < self.timer_at {
            self.file(due);
        }
        let filed = self.filed.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if filed && Stamp::now() < self.timer_at {
            return None;
        }
        while Pin::new(&mut self.timer).poll(cx).is_ready() {
            self.filed = None;
            // Bytes may have moved since the timer was set: look again.
            let (due, expiry) = self.due(progress, d, phase)?;
            // The clock itself as well as the turn's reading: a sleep is
            // ready once the clock has passed its deadline, which may still
            // lie ahead of the turn's reading (by up to a wheel tick). By
            // the turn's reading alone the deadline would be filed again,
            // the sleep be ready again, and this loop spin for good inside
            // one poll, taking the worker with it.
            let now = Stamp::now().max(Stamp::from_instant(crate::time::clock_now()));
            if now >= due {
                match expiry {
                    Expiry::Idle => self.cut_at = now.after(IDLE_CLOSE_GRACE),
                    // Seen once: hyper's sleep is ready from now on (it
                    // looks at `head_armed`, not only at the turn's clock,
                    // which may not have reached the deadline yet).
                    Expiry::Head => progress.head_armed.set(false),
                    Expiry::Cut | Expiry::Release => {}
                }
                return Some(expiry);
            }
            self.file(due);
        }
        // Pending: the timer is in the wheel with this task's waker.
        self.filed = Some(cx.waker().clone());
        None
    }

    /// Forgets an [`Expiry::Idle`] that turned out not to be one (the
    /// client's next bytes were waiting in the socket): no grace runs.
    pub(super) fn resume(&mut self) {
        self.cut_at = Stamp::NONE;
    }

    /// Moves the timer to `at`.
    fn file(&mut self, at: Stamp) {
        self.timer_at = at;
        Pin::new(&mut self.timer).reset(at.instant());
        // A reset may take the timer out of the wheel.
        self.filed = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deadline judged by the worker's clock, advanced ahead of the
    /// system clock: the watch sees it due as its sleep does. By the
    /// system clock it was never due, and the watch filed it again and
    /// polled its ready sleep for good inside one poll.
    #[test]
    fn a_watch_agrees_with_an_advanced_clock() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = crate::Runtime::builder().workers(1).build().unwrap();
            let expiry = rt.block_on(async {
                crate::time::advance(Duration::from_secs(3600)).await;
                let progress = Progress::new(None);
                let d = Deadlines::new(Some(Duration::from_millis(1)), None, None, None);
                let mut watch = Watch::new();
                std::future::poll_fn(|cx| {
                    assert!(watch.poll(cx, &progress, &d, None).is_none(), "due at once");
                    Poll::Ready(())
                })
                .await;
                // Past the deadline by the clock, not by the turn's reading
                // (no turn in between), and polled with another waker (a
                // poll from elsewhere): the watch asks its sleep.
                std::thread::sleep(Duration::from_millis(3));
                let mut other = Context::from_waker(std::task::Waker::noop());
                watch.poll(&mut other, &progress, &d, None)
            });
            let _ = done.send(expiry.is_some());
        });
        let due = finished.recv_timeout(Duration::from_secs(5)).expect("the watch spun");
        assert!(due, "the idle deadline had passed by the worker's clock");
    }
}
