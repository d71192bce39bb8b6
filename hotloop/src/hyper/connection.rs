//! One served connection: hyper's HTTP/1.1 or HTTP/2 state over the
//! connection's I/O, built when the client's bytes arrive and, for
//! HTTP/1.1, released again when the connection sits between requests.
//!
//! hyper 1.x keeps two 8 KiB buffers for every HTTP/1.1 connection (it
//! reserves its read buffer before each read, and its write buffer lives
//! as long as the connection), and has no call that gives them back. A
//! connection that waits for its next request holds them for nothing, so
//! when it sits between requests the connection takes hyper's state apart
//! (`into_parts`: the I/O, the service and the bytes read but not parsed)
//! and waits for the client with a buffer on the stack; the next bytes
//! build a new state and are handed to it first. nginx does the same with
//! its request buffers between keep-alive requests.
//!
//! The first release comes as soon as the connection is between requests,
//! so a burst of clients that each send one request and fall silent never
//! holds hyper's buffers all at once. A client whose next bytes come
//! within [`HyperOptions::idle_release`](super::HyperOptions) of its last
//! ones keeps sending: from then on its state is released only after that
//! long with nothing moving, and it pays for no rebuild while it sends.
//! That wait costs no timer per request: it is the connection's deadline
//! timer, which moves only when it fires.
//!
//! While a connection holds no hyper state its deadlines are kept here:
//! the idle timeout as always, and the header-read timeout, counted from
//! the end of the last answer (from the connection's start before the
//! first), as hyper would have. A state built again gets only what is
//! left of that timeout.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Incoming};
use hyper::server::conn::{http1, http2};
use hyper::service::{HttpService, Service};
use hyper::{Request, Response};

use super::deadline::{
    Deadlines, Expiry, HeadTimer, Polling, Progress, Socket, Stamp, TimedIo, Watch, LINGER,
};
use super::frames::H2Io;
use super::limits::{Limits, Overrun};
use super::rt::HotloopTimer;
use super::stream::{Answers, StreamExecutor, Streams};
use super::tracked::{Rewind, Tracked};
use super::upgrade::Upgraded;
use crate::net::{Quiet, QuietCheck, StopSignal, Stopping};

/// The HTTP/2 connection preface: a client that starts with it speaks
/// HTTP/2 by prior knowledge.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Which protocol a connection speaks, once its first bytes tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

type Io<I> = Rewind<TimedIo<I>>;

/// hyper's HTTP/2 connection as served here.
type Http2<I, T> = http2::Connection<Rewind<H2Io<I>>, Answers<T>, StreamExecutor>;

/// Where a connection is.
enum Phase<I: Socket, T: HttpService<Incoming>>
where
    Answers<T>: HttpService<Incoming>,
{
    /// No hyper state: waiting for the client's next bytes.
    Parked(Parked<I, T>),
    Http1(Pin<Box<http1::Connection<Io<I>, T>>>),
    /// With its open streams.
    Http2(Pin<Box<Http2<I, T>>>, Streams),
    /// Ended without hyper state: shutting the write side down (a TLS
    /// stream sends its close_notify).
    Closing(TimedIo<I>),
    /// Upgraded (`101`): the service's protocol runs on the connection.
    Tunnel(super::upgrade::Tunnel),
    /// Between two phases, or over.
    Done,
}

/// A connection without hyper state.
struct Parked<I: Socket, T> {
    io: TimedIo<I>,
    service: T,
    /// Bytes read and not yet handed to hyper.
    prefix: Vec<u8>,
    /// `None` until the first bytes tell.
    protocol: Option<Protocol>,
}

/// Serves one connection until the client is done, until a deadline
/// passes, or until the server stops, then lets hyper end it gracefully
/// (or cuts it: see the module notes of `hyper`).
///
/// A function that builds a named future rather than an `async fn`: an
/// `async fn` keeps its arguments beside what it moves them into
/// (rust-lang/rust#62958), so every connection's task held its stream
/// twice, and once more inside hyper's connection (for a TLS stream,
/// 1.2 KB each time). [`ServeConnection`] holds each piece once.
pub(super) fn serve_connection<I, S, B>(
    io: I,
    service: S,
    stop: StopSignal,
    deadlines: Deadlines,
    limits: Arc<Limits>,
) -> ServeConnection<I, S>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Socket + Unpin + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let progress = Rc::new(Progress::new(deadlines.header()));
    let probe = io.input_probe();
    let parked = Parked {
        io: TimedIo { io, progress: progress.clone() },
        service: Tracked::new(service, progress.clone()),
        prefix: Vec::new(),
        protocol: None,
    };
    ServeConnection {
        phase: Phase::Parked(parked),
        stopping: stop.stopping(),
        probe,
        quiet: QuietCheck::new(),
        progress,
        watch: Watch::new(),
        deadlines,
        limits,
        told: false,
        hyper_told: false,
        released: false,
        chatty: false,
    }
}

/// One connection's future (see [`serve_connection`]).
pub(super) struct ServeConnection<I, S>
where
    I: Socket,
    Tracked<S>: HttpService<Incoming>,
    Answers<Tracked<S>>: HttpService<Incoming>,
{
    phase: Phase<I, Tracked<S>>,
    stopping: Stopping,
    progress: Rc<Progress>,
    watch: Watch,
    deadlines: Deadlines,
    limits: Arc<Limits>,
    /// A probe of the socket, for a peek at what waits in it while hyper
    /// holds the stream.
    probe: crate::net::InputProbe,
    /// During a stop, what the looks into the socket found so far.
    quiet: QuietCheck,
    // The connection was told to finish (the server stops, or the idle deadline passed).
    told: bool,
    /// hyper's graceful shutdown was asked for.
    hyper_told: bool,
    /// hyper's state was released and not built again since.
    released: bool,
    /// After a release, the client's next bytes came within the release
    /// time of its last ones: from then on its state is released only
    /// after that time between requests.
    chatty: bool,
}

impl<I, S> Drop for ServeConnection<I, S>
where
    I: Socket,
    Tracked<S>: HttpService<Incoming>,
    Answers<Tracked<S>>: HttpService<Incoming>,
{
    fn drop(&mut self) {
        if self.progress.upgrade() {
            // An upgrade offered and never run: its entry goes.
            drop(super::upgrade::take(Rc::as_ptr(&self.progress) as usize));
        }
    }
}

impl<I, S, B> Future for ServeConnection<I, S>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Socket + Unpin + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Output = ();

    // Errors here are the client's (resets, bad requests): the connection just ends.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let _polling = Polling::new(&this.progress);
        if !this.told && Pin::new(&mut this.stopping).poll(cx).is_ready() {
            this.told = true;
            if this.progress.lingering_since().is_some() {
                // hyper has ended the connection: nothing to tell it. The
                // close goes on lingering, bounded by its own limits and
                // the drain's deadline: closing now, with the client's
                // bytes unread or still coming, would reset the
                // connection and lose the answer's unsent end.
                this.hyper_told = true;
            }
            // Poll once before telling hyper: a connection accepted while
            // the server stops may have its request waiting in the kernel,
            // and hyper drops a connection whose first bytes it has not
            // read yet instead of serving it.
            if this.drive(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        let mut peeked = false;
        loop {
            this.progress.set_stop_pending(this.told && !this.hyper_told);
            if this.drive(cx).is_ready() {
                return Poll::Ready(());
            }
            match this.stream_overrun() {
                Some(Overrun::Cut) => {
                    this.progress.cut.set(true);
                    this.phase = Phase::Done;
                    return Poll::Ready(());
                }
                Some(Overrun::GoAway) if !this.hyper_told => {
                    this.finish();
                    continue;
                }
                _ => {}
            }
            if this.progress.upgrade_unused() {
                this.forget_upgrade();
            }
            if this.told && this.finish_on_stop() {
                continue;
            }
            let phase = this.phase_deadline();
            if let Some((at, Expiry::Release)) = phase {
                if at <= Stamp::now() {
                    this.release();
                    continue;
                }
            }
            this.progress.set_owed(this.owes_answer());
            match this.watch.poll(cx, &this.progress, &this.deadlines, phase) {
                None => return Poll::Pending,
                Some(Expiry::Release) => this.release(),
                // hyper sees its header-read deadline passed when polled.
                Some(Expiry::Head) => {}
                Some(Expiry::Idle) => {
                    // Closed only on a read that finds nothing pending, in
                    // the kernel too: the next request may be in the socket
                    // before the driver has delivered it (see
                    // `net::input_pending`), or, during a stop, on its way
                    // out of it (see `net::QuietCheck`). Then it is not idle.
                    // Once per poll: the bytes reach hyper only after a
                    // return to the loop, and the quiet time starts again
                    // from the clock itself (the turn's reading may already
                    // lie a whole idle timeout behind it, and a deadline
                    // filed from it would be due at once, again and again).
                    if !peeked && this.waits_for_client() {
                        peeked = true;
                        let now = Stamp::from_instant(crate::time::clock_now());
                        let quiet_since = this.progress.last_moved();
                        let found = if this.told {
                            let quiet_for = quiet_since.until(now);
                            this.quiet.look(&this.probe, quiet_for)
                        } else if this.probe.pending().unwrap_or(false) {
                            Quiet::Arriving
                        } else {
                            Quiet::Idle
                        };
                        match found {
                            Quiet::Arriving => {
                                this.progress.stir_at(now);
                                this.watch.resume();
                                continue;
                            }
                            // The last answer is still on its way to the
                            // client, which is still reading it: quiet
                            // from when it all got there.
                            Quiet::Delivering(ago) => {
                                let clock = crate::time::clock_now();
                                let at = clock.checked_sub(ago).unwrap_or(clock);
                                this.progress.stir_at(Stamp::from_instant(at).max(quiet_since));
                                this.watch.resume();
                                continue;
                            }
                            // The phase's deadline is now the next look.
                            Quiet::Confirm => {
                                this.watch.resume();
                                continue;
                            }
                            Quiet::Idle => {}
                        }
                    }
                    // An idle HTTP/1.1 connection ends at once; for the
                    // others the watch files the grace's deadline.
                    this.told = true;
                    this.finish();
                }
                Some(Expiry::Cut) => {
                    this.progress.cut.set(true);
                    this.phase = Phase::Done;
                    return Poll::Ready(());
                }
            }
        }
    }
}

impl<I, S, B> ServeConnection<I, S>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Socket + Unpin + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// Runs the connection as far as it goes now; ready once it has ended.
    fn drive(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match &mut self.phase {
                Phase::Http1(conn) => {
                    let _ = std::task::ready!(conn.as_mut().poll(cx));
                    if !self.progress.upgrade() || !self.upgrade() {
                        return Poll::Ready(());
                    }
                }
                Phase::Http2(conn, _) => return conn.as_mut().poll(cx).map(drop),
                Phase::Tunnel(tunnel) => return tunnel.as_mut().poll(cx),
                Phase::Closing(io) => {
                    let _ = std::task::ready!(Pin::new(&mut io.io).poll_shutdown(cx));
                    self.phase = Phase::Done;
                    return Poll::Ready(());
                }
                Phase::Done => return Poll::Ready(()),
                Phase::Parked(parked) => {
                    let quiet_since = self.progress.last_moved();
                    let got = match parked.io.poll_read_to(cx, &mut parked.prefix) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(_)) => {
                            self.phase = Phase::Done;
                            return Poll::Ready(());
                        }
                        Poll::Ready(Ok(n)) => n,
                    };
                    if got == 0 && parked.prefix.is_empty() {
                        // The client ended its side between requests.
                        self.close_parked();
                        continue;
                    }
                    if parked.protocol.is_none() {
                        parked.protocol = detect(&parked.prefix, got == 0);
                    }
                    if parked.protocol.is_some() {
                        if std::mem::take(&mut self.released) {
                            // Back within the release time of its last bytes:
                            // a client that keeps sending.
                            let soon = self.deadlines.release();
                            self.chatty |=
                                soon.is_some_and(|t| Stamp::now() < quiet_since.after(t));
                        }
                        self.build();
                    }
                }
            }
        }
    }

    /// hyper's HTTP/1.1 connection ended: if the service answered an
    /// upgrade and registered its protocol, the connection's I/O goes to
    /// that protocol's future (true); otherwise the connection is over.
    #[cold]
    fn upgrade(&mut self) -> bool {
        let key = Rc::as_ptr(&self.progress) as usize;
        self.progress.set_upgrade(false);
        let Some(start) = super::upgrade::take(key) else { return false };
        let Phase::Http1(conn) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return false;
        };
        let parts = Pin::into_inner(conn).into_parts();
        self.phase = Phase::Tunnel(start(Upgraded::new(parts.io, parts.read_buf)));
        true
    }

    /// HTTP/2: whether the connection's streams are past a limit of
    /// [`Limits`].
    fn stream_overrun(&self) -> Option<Overrun> {
        match &self.phase {
            Phase::Http2(_, streams) => self.limits.overrun(streams),
            _ => None,
        }
    }

    /// A request offered an upgrade was answered without one: its entry in
    /// the worker's table goes now rather than with the connection, so the
    /// table holds only the upgrades being answered (`curl` offers `h2c`
    /// with every request over `http://`, and a connection may live long).
    #[cold]
    fn forget_upgrade(&mut self) {
        if super::upgrade::forget_unrun(Rc::as_ptr(&self.progress) as usize) {
            self.progress.set_upgrade(false);
        }
    }

    /// Builds hyper's state for a parked connection, handing it the bytes
    /// read so far.
    fn build(&mut self) {
        let Phase::Parked(parked) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return;
        };
        self.phase = match parked.protocol {
            Some(Protocol::Http2) => {
                self.progress.set_http2();
                let io = H2Io::new(parked.io, &parked.prefix);
                let io = Rewind { io, prefix: Bytes::from(parked.prefix) };
                let streams = Streams::default();
                let mut builder =
                    self.limits.http2(StreamExecutor::new(streams.clone(), self.deadlines.send()));
                builder.timer(HotloopTimer);
                let mut conn = Box::pin(builder.serve_connection(io, Answers(parked.service)));
                if self.told {
                    conn.as_mut().graceful_shutdown();
                    self.progress.set_going_away();
                    self.hyper_told = true;
                }
                Phase::Http2(conn, streams)
            }
            _ => {
                // What is left of the header-read timeout, counted from the
                // end of the last answer.
                let header = self.deadlines.header().map(|t| match self.progress.head_by() {
                    Some(by) => Stamp::now().until(by).max(Duration::from_millis(1)),
                    None => t,
                });
                // `half_close` lets a client that ends its side after a
                // request get its answer, and keeps hyper from reading while
                // it answers, which `Progress::between_requests` relies on.
                let io = Rewind { io: parked.io, prefix: Bytes::from(parked.prefix) };
                let mut builder = http1::Builder::new();
                self.limits.http1(&mut builder);
                // A stopping server's answer is the connection's last.
                self.hyper_told = self.told;
                builder
                    .timer(HeadTimer)
                    .keep_alive(!self.told)
                    .half_close(true)
                    .header_read_timeout(header);
                Phase::Http1(Box::pin(builder.serve_connection(io, parked.service)))
            }
        };
    }

    /// Takes an HTTP/1.1 connection's hyper state apart between requests.
    fn release(&mut self) {
        if !matches!(self.phase, Phase::Http1(_)) || !self.progress.between_requests() {
            return;
        }
        let Phase::Http1(conn) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return;
        };
        let parts = Pin::into_inner(conn).into_parts();
        let Rewind { io, prefix } = parts.io;
        io.io.release_idle_buffers();
        // A pipelined request's first bytes, read and not yet parsed.
        let mut pending = Vec::new();
        if !parts.read_buf.is_empty() || !prefix.is_empty() {
            pending.extend_from_slice(&parts.read_buf);
            pending.extend_from_slice(&prefix);
        }
        self.released = true;
        self.phase = Phase::Parked(Parked {
            io,
            service: parts.service,
            prefix: pending,
            protocol: Some(Protocol::Http1),
        });
    }

    /// Tells the connection to finish: hyper ends gracefully; a parked
    /// connection closes.
    fn finish(&mut self) {
        match &mut self.phase {
            Phase::Http1(conn) => {
                conn.as_mut().graceful_shutdown();
                self.hyper_told = true;
            }
            Phase::Http2(conn, _) => {
                conn.as_mut().graceful_shutdown();
                self.progress.set_going_away();
                self.hyper_told = true;
            }
            Phase::Parked(_) => self.close_parked(),
            // A tunnel has no graceful end of its own: it is cut.
            Phase::Tunnel(_) => {
                self.progress.cut.set(true);
                self.phase = Phase::Done;
            }
            Phase::Closing(_) | Phase::Done => {}
        }
    }

    /// The server stops: moves the connection one step towards its end;
    /// true if that changed what the connection should be driven as.
    ///
    /// HTTP/2 gets hyper's graceful shutdown (GOAWAY; its streams finish).
    /// HTTP/1.1 ends on an answer that says `Connection: close`, never by
    /// a close that a client sending its next request would meet: hyper's
    /// graceful shutdown is asked for only while a request is taken and
    /// not yet answered (its answer then says so). A connection between
    /// requests is parked instead, and closes once it has been quiet for
    /// the server's [`StopSignal::idle_close_after`] on a read that found
    /// nothing, counted from its client's acknowledgement of the last
    /// answer's end if that came later (its next request, if that comes
    /// first, is answered with `Connection: close`; with no quiet time it
    /// is not closed for the stop). One whose answer is being written
    /// waits for it to end: its head already said keep-alive, and hyper
    /// would close as soon as it is flushed, while the client may already
    /// be sending its next request.
    fn finish_on_stop(&mut self) -> bool {
        if self.hyper_told {
            return false;
        }
        match &self.phase {
            Phase::Http1(_) if self.progress.between_requests() => {
                self.release();
                true
            }
            Phase::Http1(_) if self.progress.unanswered() => {
                self.finish();
                true
            }
            Phase::Http2(..) => {
                self.finish();
                true
            }
            _ => false,
        }
    }

    /// True while the connection has no request open and waits for its
    /// client's next bytes: parked, or HTTP/1.1 between requests.
    fn waits_for_client(&self) -> bool {
        match &self.phase {
            Phase::Parked(_) => true,
            Phase::Http1(_) => self.progress.between_requests(),
            _ => false,
        }
    }

    /// True while the service owes a request its answer and waits on
    /// nothing from the client: HTTP/1.1 with a request taken and no read
    /// or write waiting, HTTP/2 with a stream open. The idle timeout does
    /// not run then (nginx's client timeouts do not run while it waits on
    /// its upstream either); the header-read and send timeouts still bound
    /// a client that stalls, and HTTP/2 streams have a send deadline of
    /// their own (`stream.rs`).
    fn owes_answer(&self) -> bool {
        match &self.phase {
            Phase::Http1(_) => self.progress.serving(),
            Phase::Http2(_, streams) => streams.open(),
            _ => false,
        }
    }

    fn close_parked(&mut self) {
        if let Phase::Parked(parked) = std::mem::replace(&mut self.phase, Phase::Done) {
            self.phase = Phase::Closing(parked.io);
        }
    }

    /// The deadline the phase adds to the idle and send timeouts: the end
    /// of a lingering close, the release of an HTTP/1.1 connection sitting
    /// between requests, or, for a parked one, the header-read timeout.
    fn phase_deadline(&self) -> Option<(Stamp, Expiry)> {
        if let Some(since) = self.progress.lingering_since() {
            // hyper ended the connection: its close lingers this long.
            return Some((since.after(LINGER), Expiry::Cut));
        }
        if self.told {
            // A stopping server's connection that waits for its client, with
            // hyper not yet told (parked, or after a request with a body),
            // is finished once quiet; never, with a quiet time at or above
            // the drain's timeout (its deadline cuts it).
            let quiet_for = self.stopping.idle_close_after()?;
            let quiet_end = self.progress.last_moved().after(quiet_for);
            // Or later, after a look that asked for a wait (`net::QuietCheck`).
            let next = Stamp::from_instant(self.quiet.next_look(quiet_end.instant()));
            let quiet = (next.max(quiet_end), Expiry::Idle);
            return match &self.phase {
                Phase::Parked(_) => Some(quiet),
                Phase::Http1(_) if !self.hyper_told && self.progress.waiting_for_client() => {
                    Some(quiet)
                }
                _ => None,
            };
        }
        match &self.phase {
            Phase::Http1(_) if self.progress.between_requests() => {
                let after = self.deadlines.release()?;
                let after = if self.chatty { after } else { Duration::ZERO };
                Some((self.progress.last_moved().after(after), Expiry::Release))
            }
            Phase::Parked(_) => Some((self.progress.head_by()?, Expiry::Idle)),
            _ => None,
        }
    }
}

/// The protocol `prefix` starts, or `None` while it could still be the
/// HTTP/2 preface. At the client's end (`ended`) it is HTTP/1.1, for hyper
/// to answer.
fn detect(prefix: &[u8], ended: bool) -> Option<Protocol> {
    if prefix.len() >= H2_PREFACE.len() {
        Some(if prefix.starts_with(H2_PREFACE) { Protocol::Http2 } else { Protocol::Http1 })
    } else if !ended && H2_PREFACE.starts_with(prefix) {
        None
    } else {
        Some(Protocol::Http1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_bytes_tell_the_protocol() {
        assert_eq!(detect(b"GET / HTTP/1.1\r\n", false), Some(Protocol::Http1));
        assert_eq!(detect(b"P", false), None);
        assert_eq!(detect(b"PRI * HTTP/2.0\r\n", false), None);
        assert_eq!(detect(b"PUT / HTTP/1.1\r\n", false), Some(Protocol::Http1));
        assert_eq!(detect(b"PRI * HTTP/2.0\r\n", true), Some(Protocol::Http1));
        assert_eq!(detect(H2_PREFACE, false), Some(Protocol::Http2));
        let mut more = H2_PREFACE.to_vec();
        more.extend_from_slice(b"\0\0\x12\x04");
        assert_eq!(detect(&more, false), Some(Protocol::Http2));
    }
}

#[cfg(all(test, feature = "tls"))]
mod size_tests {
    use std::convert::Infallible;
    use std::future::{ready, Ready};
    use std::mem::size_of;

    use super::*;
    use crate::net::TcpStream;

    struct Empty;

    impl Service<Request<Incoming>> for Empty {
        type Response = Response<String>;
        type Error = Infallible;
        type Future = Ready<Result<Response<String>, Infallible>>;
        fn call(&self, _: Request<Incoming>) -> Self::Future {
            ready(Ok(Response::new(String::new())))
        }
    }

    /// Every connection's task is as large as this future: a TLS stream
    /// (1.2 KB) is held once (an `async fn` held it three times: 4,464
    /// bytes against 2,096 over plain TCP), and hyper's state is boxed,
    /// so a connection without it holds little besides its stream. (216:
    /// the input probe, which holds an io_uring socket weakly so a direct
    /// one gets no descriptor per connection, took 8 more than a number;
    /// 224: the server's limits, shared, 8 more.)
    #[test]
    fn a_connection_holds_its_stream_once_and_hypers_state_boxed() {
        let tls = size_of::<ServeConnection<crate::tls::ServerTlsStream, Empty>>();
        let plain = size_of::<ServeConnection<TcpStream, Empty>>();
        let stream = size_of::<crate::tls::ServerTlsStream>() - size_of::<TcpStream>();
        assert!(tls <= plain + stream + 64, "over TLS {tls} B, plain {plain} B, stream {stream} B");
        assert!(plain <= 224, "plain {plain} B");
        assert!(size_of::<Progress>() <= 32, "{} B", size_of::<Progress>());
    }
}
