//! A served HTTP/2 connection's streams: how many are open, and a send
//! deadline for each.
//!
//! hyper's HTTP/2 server takes a chunk of an answer's body only when the
//! client's flow-control window has room for it, and otherwise waits for
//! the window without polling the body again. A client that never opens
//! its window (an `INITIAL_WINDOW_SIZE` of 0, no `WINDOW_UPDATE`) leaves
//! every such stream waiting for good, holding what the service holds for
//! it (a proxy's backend connection), while no write waits and the
//! client's PINGs keep the connection from ever being idle. So each
//! stream's task gets the connection's send timeout of its own (nginx's
//! `send_timeout` runs on a stream blocked by flow control too): a stream
//! whose answer has more to give and of which hyper has taken nothing for
//! that long is dropped, which resets it (`RST_STREAM` with `CANCEL`) and
//! drops the service's body.
//!
//! The count of open streams whose request came whole (hyper calls the
//! service, then spawns the stream's task, in one poll) lets the idle
//! timeout wait while the service owes such a stream its answer (see
//! `ServeConnection::owes_answer`); a stream whose request has a body is
//! not counted, so a client that stops sending a body still meets the
//! idle timeout.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

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
    /// The body had nothing (it waits for its own source) or ended: what
    /// holds the stream now is not the client.
    Waits,
}

thread_local! {
    /// Set by [`Answering`] and [`Answer`] inside a stream task's poll,
    /// read by its [`StreamTask`].
    static MOVED: Cell<Moved> = const { Cell::new(Moved::Nothing) };
    /// Set by [`Answers::call`] for a request that came whole (no body to
    /// wait for), read by the [`StreamExecutor::execute`] hyper makes
    /// right after it for that request's stream.
    static WHOLE: Cell<bool> = const { Cell::new(false) };
}

/// The open streams of one HTTP/2 connection.
#[derive(Debug, Clone, Default)]
pub(super) struct Streams(Rc<Cell<u32>>);

impl Streams {
    /// Whether a stream is open whose request came whole (nothing of it
    /// waits on the client): its request taken, its answer not yet handed
    /// to hyper to the end. A stream whose request has a body is not
    /// counted: its body may wait on the client, and the idle timeout
    /// bounds a client that stops sending it.
    pub(super) fn open(&self) -> bool {
        self.0.get() > 0
    }
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
        let counted = WHOLE.replace(false);
        if counted {
            let open = &self.streams.0;
            open.set(open.get() + 1);
        }
        let task = StreamTask {
            future: Some(future),
            streams: self.streams.clone(),
            counted,
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
                let open = &this.streams.0;
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
        if poll.is_ready() {
            return Poll::Ready(());
        }
        match moved {
            Moved::Gave => *this.owes_since = Stamp::now(),
            Moved::Waits => *this.owes_since = Stamp::NONE,
            Moved::Nothing => {}
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
{
    type Response = Response<Answer<B>>;
    type Error = T::Error;
    type Future = Answering<T::Future>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        WHOLE.set(req.body().is_end_stream());
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
{
    type Output = Result<Response<Answer<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let answer = std::task::ready!(self.project().future.poll(cx));
        MOVED.set(Moved::Gave);
        Poll::Ready(answer.map(|r| r.map(|body| Answer { body })))
    }
}

pin_project_lite::pin_project! {
    /// An answer's body on an HTTP/2 stream.
    pub(super) struct Answer<B> {
        #[pin]
        body: B,
    }
}

impl<B: Body> Body for Answer<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let poll = self.project().body.poll_frame(cx);
        MOVED.set(if matches!(poll, Poll::Ready(Some(Ok(_)))) {
            Moved::Gave
        } else {
            Moved::Waits
        });
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
