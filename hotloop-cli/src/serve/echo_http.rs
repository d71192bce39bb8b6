//! `serve echo` and `serve http`: the hand-written handlers, generic over
//! [`Conn`] (plain TCP or TLS), and the settings every connection of one
//! such server shares.

use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use hotloop::net::{serve, Server, ServerOptions};
use hotloop::tls::{serve_tls, TlsAcceptor, ALPN_HTTP11};
use hotloop::Handle;
use hotloop_proto::{self as proto, Body, Method, ParseOptions, Request};

use super::TcpApp;
use crate::conn::{
    answer_and_linger, discard_body, Awaiting, Conn, ConnTimer, Discarded, Ending, Pending,
};
use crate::drain;
use crate::serve_args::{millis_or_never, shorter, App, ServeArgs};

/// `serve echo` or `serve http`.
pub(super) struct EchoHttp(Arc<Settings>);

impl EchoHttp {
    pub(super) fn new(args: &ServeArgs) -> EchoHttp {
        EchoHttp(Arc::new(Settings::new(args)))
    }
}

impl TcpApp for EchoHttp {
    fn alpn(&self) -> &'static [&'static [u8]] {
        if self.0.echo {
            &[]
        } else {
            &[ALPN_HTTP11]
        }
    }

    fn serve(
        self,
        rt: &Handle,
        addr: &str,
        options: ServerOptions,
        tls: Option<TlsAcceptor>,
    ) -> io::Result<Server> {
        let settings = self.0;
        // Two instances of the handlers: the plain one on `TcpStream` as it was.
        match tls {
            None => {
                serve(rt, addr, options, move |stream| handle_connection(stream, settings.clone()))
            }
            Some(tls) => serve_tls(rt, addr, options, tls, move |stream| {
                handle_connection(stream, settings.clone())
            }),
        }
    }
}

/// What every connection handler of one server shares. `serve hyper` and
/// `serve static` take their timeouts from it too.
pub(super) struct Settings {
    /// Echo rather than HTTP.
    echo: bool,
    work_us: u64,
    work_ns_per_byte: u64,
    pub(super) idle_timeout: Option<Duration>,
    /// `None`: no header timeout (`--header-timeout-ms 0`).
    pub(super) header_timeout: Option<Duration>,
    /// How long a write may wait without progress: the send timeout, or
    /// the idle timeout when that is shorter, since a connection on which
    /// nothing moves is idle whether it waits to read or to write.
    pub(super) write_limit: Option<Duration>,
    parse: ParseOptions,
    keep_alive_reply: Arc<[u8]>,
    close_reply: Arc<[u8]>,
    keep_alive_head_reply: Arc<[u8]>,
    close_head_reply: Arc<[u8]>,
}

impl Settings {
    /// The settings of a server from its flags.
    pub(super) fn new(args: &ServeArgs) -> Settings {
        Settings {
            echo: args.app == App::Echo,
            work_us: args.work_us,
            work_ns_per_byte: args.work_ns_per_byte,
            idle_timeout: millis_or_never(args.idle_timeout_ms),
            header_timeout: millis_or_never(args.header_timeout_ms),
            write_limit: shorter(
                millis_or_never(args.send_timeout_ms),
                millis_or_never(args.idle_timeout_ms),
            ),
            parse: ParseOptions { max_headers: args.max_headers, allow_head: true, bodies: true },
            keep_alive_reply: proto::response_ok(args.body_size, false).into(),
            close_reply: proto::response_ok(args.body_size, true).into(),
            keep_alive_head_reply: proto::response_ok_head(args.body_size, false).into(),
            close_head_reply: proto::response_ok_head(args.body_size, true).into(),
        }
    }
}

/// One connection, start to end. A block rather than an `async fn`: an
/// `async fn` moves its arguments into its body's locals, so the stream
/// and settings would be stored twice in every connection's future.
#[allow(clippy::manual_async_fn)]
pub(super) fn handle_connection<S: Conn>(
    mut stream: S,
    settings: Arc<Settings>,
) -> impl Future<Output = ()> {
    async move {
        let ending = if settings.echo {
            echo(&mut stream, &settings).await
        } else {
            http(&mut stream, &settings).await
        };
        stream.finish(ending, settings.write_limit).await;
    }
}

/// A block rather than an `async fn`, as [`http()`] is; it shares the
/// connection's future with it, so it is kept as small. It ends only when
/// the client or a deadline does.
#[allow(clippy::manual_async_fn)]
fn echo<'a, S: Conn>(stream: &'a mut S, s: &'a Settings) -> impl Future<Output = Ending> + 'a {
    async move {
        let mut timer = ConnTimer::new();
        loop {
            // The read's deadline and result live in this block only, so
            // they are not kept beside the write.
            let Some(buf) = ({
                // Set after the last write finished: the idle clock counts
                // time with no progress either way.
                let deadline = s.idle_timeout.map(|t| hotloop::time::now() + t);
                let read = pin!(stream.read_some());
                timer.read(read, deadline, false).await
            }) else {
                return Ending::Cut;
            };
            proto::spin_work(s.work_us + buf.len() as u64 * s.work_ns_per_byte / 1000);
            if stream.send(buf, s.write_limit, &mut timer).await.is_err() {
                return Ending::Cut;
            }
        }
    }
}

/// A block rather than an `async fn`, so the two references are stored
/// once in every connection's future, not also as the body's locals.
#[allow(clippy::manual_async_fn)]
fn http<'a, S: Conn>(stream: &'a mut S, s: &'a Settings) -> impl Future<Output = Ending> + 'a {
    async move {
        // `buf` takes each read; bytes of a request split across reads gather
        // in `pending`, which stays empty (and unallocated) in the common case.
        let mut buf = S::Buf::default();
        let mut pending = Pending::default();
        // Bytes of `buf` already answered. A `u32` (a read is one pooled
        // buffer, far below 4 GiB): it leaves room beside it for the state's
        // tag, which makes every connection's future one allocator size
        // class (16 bytes) smaller.
        let mut consumed: u32 = 0;
        let mut timer = ConnTimer::new();
        // The first request's head must arrive within the header timeout.
        let mut awaiting = Awaiting::head(s.header_timeout);
        loop {
            let unparsed: &[u8] =
                if pending.is_empty() { &buf[consumed as usize..] } else { pending.bytes() };
            // The request answered below, if one is complete: what the
            // parse gave is not kept beside the answer's write.
            let complete = {
                // Nothing left to parse (the usual case after an answer): read.
                let parsed = if unparsed.is_empty() {
                    (Request::Partial, Method::Get)
                } else {
                    proto::parse_request_with(unparsed, s.parse)
                };
                match parsed {
                    (Request::Complete { len, close, body }, method) => {
                        if pending.is_empty() {
                            consumed += len as u32;
                        } else {
                            pending.consume(len);
                        }
                        if body != Body::None {
                            // A body is rare: its request is answered apart,
                            // boxed, so its state is not part of every
                            // connection's future.
                            let answer = answer_after_body(
                                stream,
                                &mut timer,
                                (body, method, close),
                                &mut buf,
                                consumed,
                                &mut pending,
                                s,
                            );
                            if let Some(ending) = Box::pin(answer).await {
                                return ending;
                            }
                            consumed = 0;
                            awaiting = Awaiting::NextRequest;
                            continue;
                        }
                        Some((method, close))
                    }
                    (Request::Partial, _) => {
                        if pending.is_empty() && (consumed as usize) < buf.len() {
                            pending.extend_from_slice(&buf[consumed as usize..]);
                        }
                        None
                    }
                    (Request::Malformed, _) => return reject_boxed(stream, 400, s).await,
                    (Request::TooLarge, _) => return reject_boxed(stream, 431, s).await,
                    (Request::Unsupported(status), _) => {
                        return reject_boxed(stream, status, s).await
                    }
                }
            };
            if let Some((method, close)) = complete {
                let (reply, close) = reply_for(s, method, close);
                // The last answer is awaited apart, so `close` is not
                // kept beside the write in every connection's future.
                // Bytes the client sent after this request are left
                // unparsed: the close lingers for them.
                if close {
                    let unread = !pending.is_empty() || (consumed as usize) < buf.len();
                    return match stream.send(reply, s.write_limit, &mut timer).await {
                        Ok(()) => Ending::Answered { unread },
                        Err(_) => Ending::Cut,
                    };
                }
                if stream.send(reply, s.write_limit, &mut timer).await.is_err() {
                    return Ending::Cut;
                }
                // Between requests the idle timeout applies, until a byte of the next one arrives.
                awaiting = Awaiting::NextRequest;
                continue;
            }
            if !pending.is_empty() && awaiting.is_idle() {
                awaiting = Awaiting::head(s.header_timeout);
            }
            // Back to the pool before waiting.
            drop(std::mem::take(&mut buf));
            // Whether a head was left unfinished at a deadline (its own or
            // the idle one): it is answered; a close or an error is not.
            // Decided in a block of its own, so what the read needed is not
            // kept in the connection's future beside the answer.
            let late = {
                // The idle timeout runs from now whatever is awaited, a request
                // head included: a head also has to be whole by its own deadline.
                let deadline = awaiting.deadline(s.idle_timeout);
                // An idle keep-alive connection (answered, no next request begun)
                // closes at once when the server stops, as nginx's do. A new
                // connection waiting for its first request is not idle (its request
                // may be on the way: nginx waits for it too), and its header timeout
                // bounds it; one partway through a request gets its answer, with
                // `Connection: close`.
                let idle = awaiting.is_idle();
                let socket = stream.input_probe();
                let read = pin!(stream.read_some());
                match timer.read(read, deadline, idle).peeking(socket).await {
                    Some(b) => {
                        buf = b;
                        consumed = 0;
                        if !pending.is_empty() {
                            pending.extend_from_slice(&buf);
                            consumed = buf.len() as u32;
                        }
                        continue;
                    }
                    // The clock itself: the read's deadline fires by it,
                    // and the turn's reading may still lie behind.
                    None => {
                        !pending.is_empty()
                            && deadline.is_some_and(|d| std::time::Instant::now() >= d)
                    }
                }
            };
            if late {
                return reject_boxed(stream, 408, s).await;
            }
            return Ending::Cut;
        }
    }
}

/// The reply to a `method` request, and whether it is the connection's
/// last: when the client asked (`close`) or the server is stopping.
fn reply_for(s: &Settings, method: Method, close: bool) -> (Arc<[u8]>, bool) {
    proto::spin_work(s.work_us);
    let close = close || drain::stopping();
    let reply = match (method, close) {
        (Method::Get, false) => s.keep_alive_reply.clone(),
        (Method::Get, true) => s.close_reply.clone(),
        (Method::Head, false) => s.keep_alive_head_reply.clone(),
        (Method::Head, true) => s.close_head_reply.clone(),
    };
    (reply, close)
}

/// Answers a `GET` or `HEAD` that has a body (nginx serves such a
/// request), once the body is read and dropped: what was read after the
/// head (`buf` from `consumed`, or `pending`) goes to `pending` and `buf`
/// back to the pool, the body is skipped from there ([`discard_body`]),
/// and bytes after it stay in `pending`. `None` when the connection goes
/// on; otherwise how it ends.
async fn answer_after_body<S: Conn>(
    stream: &mut S,
    timer: &mut ConnTimer,
    (body, method, close): (Body, Method, bool),
    buf: &mut S::Buf,
    consumed: u32,
    pending: &mut Pending,
    s: &Settings,
) -> Option<Ending> {
    if pending.is_empty() {
        pending.extend_from_slice(&buf[consumed as usize..]);
    }
    drop(std::mem::take(buf));
    match discard_body(stream, timer, body, pending, s.idle_timeout).await {
        Discarded::Done => {}
        Discarded::Refuse(status) => return Some(reject_boxed(stream, status, s).await),
        Discarded::Cut => return Some(Ending::Cut),
    }
    let (reply, close) = reply_for(s, method, close);
    match stream.send(reply, s.write_limit, timer).await {
        Ok(()) if close => Some(Ending::Answered { unread: !pending.is_empty() }),
        Ok(()) => None,
        Err(_) => Some(Ending::Cut),
    }
}

/// The error reply and its lingering close ([`answer_and_linger`]) on the
/// heap: an error reply is rare, and boxing it keeps its state (a write, a
/// timer, a read) out of every connection's future, which is copied once
/// per connection when it is spawned. A 405 allows `HEAD` when it is served.
async fn reject_boxed<S: Conn>(stream: &mut S, status: u16, s: &Settings) -> Ending {
    let reply = proto::response_error_with(status, s.parse.allow_head);
    Box::pin(answer_and_linger(stream, reply, s.write_limit)).await;
    Ending::Lingered
}

#[cfg(test)]
mod tests {
    use std::mem::size_of;

    use hotloop::net::TcpStream;

    use super::*;

    /// Every connection's task holds this future, boxed once: its size is
    /// watched (616 bytes before the send, the timer and the read were
    /// made smaller; 304 after).
    #[test]
    fn a_connection_future_stays_small() {
        fn returned<A, B, F>(_: fn(A, B) -> F) -> usize {
            size_of::<F>()
        }
        let size = returned(handle_connection::<TcpStream>);
        assert!(size <= 304, "{size}");
    }
}
