//! The service and I/O wrappers a served connection hands hyper: a
//! service that counts the requests whose answers have not ended, and an
//! I/O that gives back bytes read before hyper's state was built.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::rt::ReadBufCursor;
use hyper::service::Service;
use hyper::{Request, Response};

use super::deadline::Progress;

/// A service that records in the connection's [`Progress`] how many
/// requests are open and whether the last one came with a body.
pub(super) struct Tracked<S> {
    service: S,
    progress: Rc<Progress>,
}

impl<S> Tracked<S> {
    pub(super) fn new(service: S, progress: Rc<Progress>) -> Self {
        Tracked { service, progress }
    }
}

// The service is never pinned (hyper calls it through `&self`), so moving
// the wrapper moves nothing that was pinned.
impl<S> Unpin for Tracked<S> {}

impl<S, B> Service<Request<Incoming>> for Tracked<S>
where
    S: Service<Request<Incoming>, Response = Response<B>>,
{
    type Response = Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    #[inline]
    fn call(&self, req: Request<Incoming>) -> Self::Future {
        self.progress.bodied.set(!req.body().is_end_stream());
        let open = Open::new(&self.progress);
        TrackedFuture { future: self.service.call(req), open: Some(open) }
    }
}

/// One open request: counted from the service's call until its answer's
/// body is dropped (hyper drops it once written, or with the connection).
struct Open(Rc<Progress>);

impl Open {
    fn new(progress: &Rc<Progress>) -> Self {
        progress.open.set(progress.open.get() + 1);
        Open(progress.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.set(self.0.open.get() - 1);
        self.0.set_answered();
    }
}

pin_project_lite::pin_project! {
    /// The future of [`Tracked::call`].
    pub(super) struct TrackedFuture<F> {
        #[pin]
        future: F,
        open: Option<Open>,
    }
}

impl<F, B, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<TrackedBody<B>>, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.future.poll(cx))?;
        let open = this.open.take();
        Poll::Ready(Ok(response.map(|body| TrackedBody { body, _open: open })))
    }
}

pin_project_lite::pin_project! {
    /// An answer's body, holding its request open until it is dropped.
    pub(super) struct TrackedBody<B> {
        #[pin]
        body: B,
        _open: Option<Open>,
    }
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// An I/O that yields `prefix` before reading from `io`: the bytes read
/// while a connection held no hyper state, or those hyper had read and
/// not parsed when its state was released.
pub(super) struct Rewind<T> {
    pub(super) io: T,
    pub(super) prefix: Bytes,
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for Rewind<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.prefix.is_empty() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let n = self.prefix.len().min(buf.remaining());
        buf.put_slice(&self.prefix[..n]);
        self.prefix.advance(n);
        if self.prefix.is_empty() {
            // Gives the allocation back now rather than with the connection.
            self.prefix = Bytes::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for Rewind<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
