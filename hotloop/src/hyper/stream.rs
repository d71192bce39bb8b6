//! A served HTTP/2 connection's streams: how many are open, started and
//! cut short by the client, and a send deadline for each.
//!
//! hyper's HTTP/2 server takes a chunk of an answer's body only when the
//! client's flow-control window has room for it, and otherwise waits for
//! the window without polling the body again. A client that never opens
//! its window (an `INITIAL_WINDOW_SIZE` of 0, no `WINDOW_UPDATE`) leaves
//! every such stream waiting for good, holding what the service holds for
//! it (a proxy's backend connection). So each stream's task gets the
//! connection's send timeout of its own (nginx's `send_timeout` runs on a
//! stream blocked by flow control too): a stream whose answer has more to
//! give and of which hyper has taken nothing for that long is dropped,
//! which resets it (`RST_STREAM` with `CANCEL`) and drops the service's
//! body.
//!
//! hyper hands h2 the answer's last chunk with the end of the stream as
//! soon as the window has room for one byte of it, and its task ends: h2
//! then holds the rest of it, for a client that gives no more window
//! (`INITIAL_WINDOW_SIZE` of 1), with no deadline at all. So the answer's
//! body ([`Answer`]) holds its last byte back until hyper asks for more
//! after the rest: hyper waits for window for that byte as for any other
//! chunk, and the send deadline covers the end of the answer too. A
//! body's last chunk is known when the body says it has ended, or when
//! it has its end (or its trailers) at hand right after the chunk.
//!
//! The count of open streams whose request came whole (hyper calls the
//! service, then spawns the stream's task, in one poll) lets the idle
//! timeout wait while the service owes such a stream its answer (see
//! `ServeConnection::owes_answer`); a stream whose request has a body is
//! not counted, so a client that stops sending a body still meets the
//! idle timeout.
//!
//! The counts of streams started and of streams the client cut short
//! (its `RST_STREAM` before the answer was handed whole) bound what one
//! connection may make the service do (see `limits.rs`): h2 bounds only
//! the streams reset before hyper accepts them, and a client that resets
//! each stream just after (CVE-2023-44487's rapid reset, one step later)
//! has the service start a request, a proxy a backend exchange, for each.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::Service;
use hyper::{Request, Response};

use super::deadline::Stamp;
use super::rt::HotloopExecutor;
use crate::time::Sleep;

/// What the answer of the stream being polled did during this poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Moved {
    Nothing,
    /// The service's answer came, or its body gave a frame: the stream has
    /// something for the client, and hyper waits for room to send it
    /// unless it polls the body again within the same poll.
    Gave,
    /// The body had nothing (it waits for its own source): what holds the
    /// stream now is not the client.
    Waits,
    /// The answer was handed whole (its last frame, its end, or an error
    /// that ends it): as [`Moved::Gave`], and the stream's end, if it comes
    /// now, is the server's.
    Last,
}

thread_local! {
    /// Set by [`Answering`] and [`Answer`] inside a stream task's poll,
    /// read by its [`StreamTask`].
    static MOVED: Cell<Moved> = const { Cell::new(Moved::Nothing) };
    /// Set by [`Answers::call`] to whether the request came whole (no body
    /// to wait for), taken by the [`StreamExecutor::execute`] hyper makes
    /// right after it for that request's stream. `None` at any other
    /// `execute`: a task that is no stream of its own (a `CONNECT`
    /// tunnel's, spawned from inside its stream's task).
    static WHOLE: Cell<Option<bool>> = const { Cell::new(None) };
}

/// The streams of one HTTP/2 connection.
#[derive(Debug, Clone, Default)]
pub(super) struct Streams(Rc<Counts>);

#[derive(Debug, Default)]
struct Counts {
    /// Open streams whose request came whole.
    open: Cell<u32>,
    /// Streams hyper started a task for.
    started: Cell<u32>,
    /// Streams whose task ended before their answer was handed whole, and
    /// not by their send deadline: the client reset them.
    cut_short: Cell<u32>,
}

impl Streams {
    /// Whether a stream is open whose request came whole (nothing of it
    /// waits on the client): its request taken, its answer not yet handed
    /// to hyper to the end. A stream whose request has a body is not
    /// counted: its body may wait on the client, and the idle timeout
    /// bounds a client that stops sending it.
    pub(super) fn open(&self) -> bool {
        self.0.open.get() > 0
    }

    /// How many streams were started.
    pub(super) fn started(&self) -> u32 {
        self.0.started.get()
    }

    /// How many streams the client cut short (reset before their answer
    /// was handed whole).
    pub(super) fn cut_short(&self) -> u32 {
        self.0.cut_short.get()
    }
}

/// Adds one to `count`.
fn bump(count: &Cell<u32>) {
    count.set(count.get().saturating_add(1));
}

/// hyper's executor for a served HTTP/2 connection: spawns each stream's
/// task as [`HotloopExecutor`] does, wrapped in a [`StreamTask`].
#[derive(Clone)]
pub(super) struct StreamExecutor {
    streams: Streams,
    send: Option<Duration>,
}

impl StreamExecutor {
    pub(super) fn new(streams: Streams, send: Option<Duration>) -> Self {
        StreamExecutor { streams, send }
    }
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + 'static,
{
    fn execute(&self, future: F) {
        let Some(counted) = WHOLE.take() else {
            // Not a stream: no deadline, and not counted.
            hyper::rt::Executor::execute(&HotloopExecutor, future);
            return;
        };
        if counted {
            bump(&self.streams.0.open);
        }
        bump(&self.streams.0.started);
        let task = StreamTask {
            future: Some(future),
            streams: self.streams.clone(),
            counted,
            ended: false,
            send: self.send,
            owes_since: Stamp::NONE,
            timer: None,
            timer_at: Stamp::NONE,
        };
        hyper::rt::Executor::execute(&HotloopExecutor, task);
    }
}

pin_project_lite::pin_project! {
    /// One stream's task: hyper's future, dropped once its answer has
    /// owed the client something for the send timeout with none of it
    /// taken.
    struct StreamTask<F> {
        #[pin]
        future: Option<F>,
        streams: Streams,
        // Whether the stream is counted open (its request came whole).
        counted: bool,
        // Whether the answer was handed whole (see [`Moved::Last`]).
        ended: bool,
        send: Option<Duration>,
        // Since when the answer has had something for the client that
        // hyper has not taken ([`Stamp::NONE`]: it has not).
        owes_since: Stamp,
        // Filed at the deadline, or earlier: when it fires, the deadline
        // is looked at again (a frame taken since moves it later).
        timer: Option<Sleep>,
        timer_at: Stamp,
    }

    impl<F> PinnedDrop for StreamTask<F> {
        fn drop(this: Pin<&mut Self>) {
            if this.counted {
                let open = &this.streams.0.open;
                open.set(open.get().saturating_sub(1));
            }
        }
    }
}

impl<F: Future<Output = ()>> Future for StreamTask<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        let Some(future) = this.future.as_mut().as_pin_mut() else {
            return Poll::Ready(());
        };
        let before = MOVED.replace(Moved::Nothing);
        let poll = future.poll(cx);
        let moved = MOVED.replace(before);
        match moved {
            Moved::Gave => *this.owes_since = Stamp::now(),
            Moved::Last => {
                *this.owes_since = Stamp::now();
                *this.ended = true;
            }
            Moved::Waits => *this.owes_since = Stamp::NONE,
            Moved::Nothing => {}
        }
        if poll.is_ready() {
            if !*this.ended {
                bump(&this.streams.0.cut_short);
            }
            return Poll::Ready(());
        }
        let Some(send) = *this.send else { return Poll::Pending };
        if *this.owes_since == Stamp::NONE {
            // A timer still filed only wakes the task once for nothing.
            return Poll::Pending;
        }
        let due = this.owes_since.after(send);
        loop {
            let timer = this.timer.get_or_insert_with(|| crate::time::sleep(Duration::MAX));
            if due < *this.timer_at {
                *this.timer_at = due;
                Pin::new(&mut *timer).reset(due.instant());
            }
            if Pin::new(&mut *timer).poll(cx).is_pending() {
                return Poll::Pending;
            }
            *this.timer_at = Stamp::NONE;
            // The clock itself as well as the turn's reading (see
            // `deadline.rs`): a sleep may be ready before the turn's
            // reading reaches its deadline.
            let now = Stamp::now().max(Stamp::from_instant(crate::time::clock_now()));
            if now >= due {
                // Dropping hyper's future resets the stream and drops the
                // service's body.
                this.future.set(None);
                return Poll::Ready(());
            }
        }
    }
}

/// The service of an HTTP/2 connection: its answers' bodies report to
/// their stream's task (see the module notes).
pub(super) struct Answers<T>(pub(super) T);

impl<T, B> Service<Request<Incoming>> for Answers<T>
where
    T: Service<Request<Incoming>, Response = Response<B>>,
    B: Body,
{
    type Response = Response<Answer<B>>;
    type Error = T::Error;
    type Future = Answering<T::Future>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        WHOLE.set(Some(req.body().is_end_stream()));
        Answering { future: self.0.call(req) }
    }
}

pin_project_lite::pin_project! {
    /// The service's future for one stream.
    pub(super) struct Answering<F> {
        #[pin]
        future: F,
    }
}

impl<F, B, E> Future for Answering<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
{
    type Output = Result<Response<Answer<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let answer = std::task::ready!(self.project().future.poll(cx));
        // An answer without a body (or an error, which resets the stream)
        // is whole once hyper has it.
        let whole = match &answer {
            Ok(r) => r.body().is_end_stream(),
            Err(_) => true,
        };
        MOVED.set(if whole { Moved::Last } else { Moved::Gave });
        Poll::Ready(answer.map(|r| r.map(Answer::new)))
    }
}

pin_project_lite::pin_project! {
    /// An answer's body on an HTTP/2 stream: the body's frames, its last
    /// byte held back until hyper asks for more after the rest (see the
    /// module notes).
    pub(super) struct Answer<B>
    where
        B: Body,
    {
        #[pin]
        body: B,
        // The answer's last byte, held back.
        last: Option<B::Data>,
        // A frame the body gave when asked whether the data before it was
        // its last: handed over next.
        next: Option<Result<Frame<B::Data>, B::Error>>,
        // The body ended (it said so, or gave its end).
        ended: bool,
    }
}

impl<B: Body> Answer<B> {
    fn new(body: B) -> Self {
        Answer { body, last: None, next: None, ended: false }
    }
}

impl<B: Body> Body for Answer<B> {
    type Data = Piece<B::Data>;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, B::Error>>> {
        let mut this = self.project();
        if let Some(last) = this.last.take() {
            let whole = this.next.is_none();
            MOVED.set(if whole { Moved::Last } else { Moved::Gave });
            return Poll::Ready(Some(Ok(Frame::data(Piece::Whole(last)))));
        }
        let polled = match this.next.take() {
            Some(next) => Poll::Ready(Some(next)),
            None if *this.ended => Poll::Ready(None),
            None => this.body.as_mut().poll_frame(cx),
        };
        let frame = match polled {
            Poll::Pending => {
                MOVED.set(Moved::Waits);
                return Poll::Pending;
            }
            Poll::Ready(None) => {
                *this.ended = true;
                MOVED.set(Moved::Last);
                return Poll::Ready(None);
            }
            Poll::Ready(Some(Err(e))) => {
                MOVED.set(Moved::Last);
                return Poll::Ready(Some(Err(e)));
            }
            Poll::Ready(Some(Ok(frame))) => frame,
        };
        let mut data = match frame.into_data() {
            Ok(data) => data,
            Err(trailers) => {
                // Trailers end the stream.
                MOVED.set(Moved::Last);
                return Poll::Ready(Some(Ok(trailers.map_data(Piece::Whole))));
            }
        };
        // Whether this is the answer's last data: the body says it ended,
        // or has its end (or its trailers) at hand now.
        let last = if *this.ended || this.body.is_end_stream() {
            *this.ended = true;
            true
        } else {
            match this.body.as_mut().poll_frame(cx) {
                Poll::Pending => false,
                Poll::Ready(None) => {
                    *this.ended = true;
                    true
                }
                Poll::Ready(Some(next)) => {
                    let trailers = next.as_ref().is_ok_and(Frame::is_trailers);
                    *this.next = Some(next);
                    trailers
                }
            }
        };
        if last && data.remaining() > 1 {
            // `Bytes` (what bodies mostly give) splits without a copy.
            let front = data.copy_to_bytes(data.remaining() - 1);
            *this.last = Some(data);
            MOVED.set(Moved::Gave);
            return Poll::Ready(Some(Ok(Frame::data(Piece::Front(front)))));
        }
        let whole = last && this.next.is_none();
        MOVED.set(if whole { Moved::Last } else { Moved::Gave });
        Poll::Ready(Some(Ok(Frame::data(Piece::Whole(data)))))
    }

    fn is_end_stream(&self) -> bool {
        self.last.is_none() && self.next.is_none() && (self.ended || self.body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let held = self.last.as_ref().map_or(0, Buf::remaining)
            + match &self.next {
                Some(Ok(frame)) => frame.data_ref().map_or(0, Buf::remaining),
                _ => 0,
            };
        let body = if self.ended { SizeHint::with_exact(0) } else { self.body.size_hint() };
        let held = held as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(body.lower().saturating_add(held));
        if let Some(upper) = body.upper() {
            hint.set_upper(upper.saturating_add(held));
        }
        hint
    }
}

/// A chunk of an answer's body as hyper is handed it: as the body gave
/// it, or the front of the last one, whose last byte is held back.
pub(super) enum Piece<D> {
    Whole(D),
    Front(Bytes),
}

impl<D: Buf> Buf for Piece<D> {
    #[inline]
    fn remaining(&self) -> usize {
        match self {
            Piece::Whole(d) => d.remaining(),
            Piece::Front(b) => b.remaining(),
        }
    }

    #[inline]
    fn chunk(&self) -> &[u8] {
        match self {
            Piece::Whole(d) => d.chunk(),
            Piece::Front(b) => b.chunk(),
        }
    }

    #[inline]
    fn advance(&mut self, n: usize) {
        match self {
            Piece::Whole(d) => d.advance(n),
            Piece::Front(b) => b.advance(n),
        }
    }

    #[inline]
    fn chunks_vectored<'a>(&'a self, dst: &mut [std::io::IoSlice<'a>]) -> usize {
        match self {
            Piece::Whole(d) => d.chunks_vectored(dst),
            Piece::Front(b) => b.chunks_vectored(dst),
        }
    }

    #[inline]
    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        match self {
            Piece::Whole(d) => d.copy_to_bytes(len),
            Piece::Front(b) => b.copy_to_bytes(len),
        }
    }
}
