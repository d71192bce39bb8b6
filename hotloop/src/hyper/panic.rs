//! A service whose panic becomes a `500 Internal Server Error`, not a
//! connection cut without a reply.
//!
//! hyper does not catch a panic of the service it calls: on HTTP/1.1 the
//! panic unwinds through the connection's task, which ends, and the
//! client reads an empty reply; on HTTP/2 it ends the stream's task and
//! the client sees the stream reset. A handler that panics (an `unwrap`,
//! an index out of range, a tokio API that finds no runtime) then costs
//! the client its connection and every request queued on it. This wrapper
//! polls the service's future inside `catch_unwind`: a panic before the
//! answer is an answer, `500` with an empty body, and the connection goes
//! on serving. A panic while the body is being sent is an error of that
//! body: hyper ends that response (an HTTP/1.1 connection closes, an
//! HTTP/2 stream is reset) and the other streams of the connection live.
//!
//! The panic's message is still printed by the panic hook, and logged
//! with what became of the request.

use std::any::Any;
use std::error::Error as StdError;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::Service;
use hyper::{Request, Response, StatusCode};

type BoxError = Box<dyn StdError + Send + Sync>;

/// Wraps a service so that its panics become `500` answers.
pub(super) struct CatchPanic<S> {
    service: S,
}

impl<S> CatchPanic<S> {
    pub(super) fn new(service: S) -> Self {
        CatchPanic { service }
    }
}

impl<S, B> Service<Request<Incoming>> for CatchPanic<S>
where
    S: Service<Request<Incoming>, Response = Response<B>>,
    B: Body,
    B::Error: Into<BoxError>,
{
    type Response = Response<PanicSafeBody<B>>;
    type Error = S::Error;
    type Future = CatchPanicFuture<S::Future>;

    #[inline]
    fn call(&self, req: Request<Incoming>) -> Self::Future {
        // `call` itself may panic too (a service that checks the request
        // before it builds its future).
        match catch_unwind(AssertUnwindSafe(|| self.service.call(req))) {
            Ok(future) => CatchPanicFuture::Running { future },
            Err(payload) => CatchPanicFuture::Panicked { payload: Some(payload) },
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`CatchPanic`]: the service's, or the panic of its `call`.
    #[project = Proj]
    pub(super) enum CatchPanicFuture<F> {
        Running { #[pin] future: F },
        Panicked { payload: Option<Box<dyn Any + Send>> },
    }
}

impl<F, B, E> Future for CatchPanicFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<PanicSafeBody<B>>, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let payload = match self.project() {
            Proj::Running { future } => {
                match catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
                    Ok(Poll::Ready(res)) => {
                        return Poll::Ready(res.map(|r| r.map(PanicSafeBody::body)))
                    }
                    Ok(Poll::Pending) => return Poll::Pending,
                    // The future is not polled again: hyper drops it with this one.
                    Err(payload) => payload,
                }
            }
            Proj::Panicked { payload } => payload.take().unwrap_or_else(|| Box::new("")),
        };
        Poll::Ready(Ok(internal_error(&*payload)))
    }
}

/// The answer to a request whose service panicked.
#[cold]
fn internal_error<B>(payload: &(dyn Any + Send)) -> Response<PanicSafeBody<B>> {
    crate::log::warn(format_args!(
        "a hyper service panicked ({}); answered 500 Internal Server Error{}",
        message(payload),
        tokio_hint(payload)
    ));
    let mut res = Response::new(PanicSafeBody::Empty);
    *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    res
}

/// The panic's message, when it has one.
fn message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// What to do when the panic is tokio's refusal to run without its runtime.
fn tokio_hint(payload: &(dyn Any + Send)) -> &'static str {
    if message(payload).contains("must be called from the context of a Tokio") {
        "; the service called a tokio API that needs a tokio runtime: use hotloop's own \
         (hotloop::time, hotloop::net) or enable hotloop's default feature `tokio-time`"
    } else {
        ""
    }
}

pin_project_lite::pin_project! {
    /// A service's response body, or the empty body of a `500` that
    /// answered its panic. A panic while the body is polled becomes an
    /// error of the body, which ends that response only.
    #[project = BodyProj]
    pub(super) enum PanicSafeBody<B> {
        Body { #[pin] body: B },
        Empty,
    }
}

impl<B> PanicSafeBody<B> {
    fn body(body: B) -> Self {
        PanicSafeBody::Body { body }
    }
}

/// The error a body's panic becomes.
#[derive(Debug)]
struct BodyPanicked(String);

impl std::fmt::Display for BodyPanicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the response body panicked: {}", self.0)
    }
}

impl StdError for BodyPanicked {}

impl<B> Body for PanicSafeBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project() {
            BodyProj::Body { body } => match catch_unwind(AssertUnwindSafe(|| body.poll_frame(cx)))
            {
                Ok(frame) => frame.map(|f| f.map(|r| r.map_err(Into::into))),
                Err(payload) => {
                    let msg = message(&*payload).to_string();
                    crate::log::warn(format_args!(
                        "a hyper response body panicked ({msg}); the response is cut"
                    ));
                    Poll::Ready(Some(Err(Box::new(BodyPanicked(msg)))))
                }
            },
            BodyProj::Empty => Poll::Ready(None),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            PanicSafeBody::Body { body } => body.is_end_stream(),
            PanicSafeBody::Empty => true,
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match self {
            PanicSafeBody::Body { body } => body.size_hint(),
            PanicSafeBody::Empty => SizeHint::with_exact(0),
        }
    }
}
