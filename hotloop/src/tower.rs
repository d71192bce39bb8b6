//! tower middleware on hotloop's timers (feature `tower`).
//!
//! Most tower and tower-http layers are runtime-free and work on hotloop
//! as they are (routing, `ServiceBuilder`, `MapRequest`/`MapResponse`,
//! `AddExtension`, CORS, compression, tracing, request ids, body limits,
//! `ConcurrencyLimit`, `Buffer`-free stacks). The ones that sleep call
//! `tokio::time`, which needs a tokio runtime's timer driver that hotloop
//! workers do not run without the feature `tokio-time`: tower's `timeout::TimeoutLayer` and
//! `limit::RateLimitLayer`, tower-http's `timeout::TimeoutLayer`, and
//! anything built on `tokio::time::sleep` panic there ("there is no
//! reactor running"). Use [`TimeoutLayer`] instead of the timeout layers.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_layer::Layer;
use tower_service::Service;

/// The error of a [`Timeout`] service: boxed, as tower's is, so that it
/// works with `HandleErrorLayer` and `ServiceBuilder` stacks.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request took longer than the [`TimeoutLayer`]'s limit.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("request timed out")
    }
}

impl std::error::Error for Elapsed {}

/// Fails a request with [`Elapsed`] if the inner service has not answered
/// within a limit: tower's `TimeoutLayer`, on the worker's timer wheel.
///
/// With axum, wrap it in `HandleErrorLayer` to turn the error into a
/// response (see `hotloop/examples/axum.rs`).
#[derive(Debug, Clone, Copy)]
pub struct TimeoutLayer {
    limit: Duration,
}

impl TimeoutLayer {
    /// A layer that gives each request at most `limit`.
    pub fn new(limit: Duration) -> Self {
        TimeoutLayer { limit }
    }
}

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;
    fn layer(&self, inner: S) -> Timeout<S> {
        Timeout { inner, limit: self.limit }
    }
}

/// The service [`TimeoutLayer`] makes.
#[derive(Debug, Clone)]
pub struct Timeout<S> {
    inner: S,
    limit: Duration,
}

impl<S, R> Service<R> for Timeout<S>
where
    S: Service<R>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = TimeoutFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: R) -> Self::Future {
        TimeoutFuture { inner: self.inner.call(req), sleep: crate::time::sleep(self.limit) }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`Timeout`].
    pub struct TimeoutFuture<F> {
        #[pin]
        inner: F,
        #[pin]
        sleep: crate::time::Sleep,
    }
}

impl<F, T, E> Future for TimeoutFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.inner.poll(cx) {
            return Poll::Ready(out.map_err(Into::into));
        }
        match this.sleep.poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Box::new(Elapsed))),
            Poll::Pending => Poll::Pending,
        }
    }
}
