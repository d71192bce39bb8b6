//! The service and I/O wrappers a served connection hands hyper: a
//! service that records each request it takes, and an I/O that gives back
//! bytes read before hyper's state was built.

use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use hyper::body::{Body, Incoming};
use hyper::rt::ReadBufCursor;
use hyper::service::Service;
use hyper::{Request, Response};

use super::deadline::Progress;
use super::upgrade::OnUpgrade;

/// A service that records in the connection's [`Progress`] each request
/// it takes, and whether a body follows its head. It hands the service's
/// own future to hyper: wrapping that future would move it once more per
/// request.
pub(super) struct Tracked<S> {
    service: S,
    progress: Rc<Progress>,
}

impl<S> Tracked<S> {
    pub(super) fn new(service: S, progress: Rc<Progress>) -> Self {
        Tracked { service, progress }
    }
}

impl<S> Tracked<S> {
    /// Hands the request the [`OnUpgrade`] of this connection (keyed by
    /// its record's address, unique while it lives).
    #[cold]
    fn offer_upgrade(&self, req: &mut Request<Incoming>) {
        self.progress.set_upgrade(true);
        let key = Rc::as_ptr(&self.progress) as usize;
        req.extensions_mut().insert(OnUpgrade::new(key));
    }
}

// The service is never pinned (hyper calls it through `&self`), so moving
// the wrapper moves nothing that was pinned.
impl<S> Unpin for Tracked<S> {}

impl<S, B> Service<Request<Incoming>> for Tracked<S>
where
    S: Service<Request<Incoming>, Response = Response<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    #[inline]
    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        self.progress.took(!req.body().is_end_stream());
        if req.version() == hyper::Version::HTTP_11
            && req.headers().contains_key(hyper::header::UPGRADE)
        {
            self.offer_upgrade(&mut req);
        }
        self.service.call(req)
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
    #[inline]
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.prefix.is_empty() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        self.give_prefix(buf);
        Poll::Ready(Ok(()))
    }
}

impl<T> Rewind<T> {
    /// Hands hyper what it has room for of the prefix (once per rebuild,
    /// so kept out of the read path).
    #[cold]
    fn give_prefix(&mut self, mut buf: ReadBufCursor<'_>) {
        let n = self.prefix.len().min(buf.remaining());
        buf.put_slice(&self.prefix[..n]);
        self.prefix.advance(n);
        if self.prefix.is_empty() {
            // Gives the allocation back now rather than with the connection.
            self.prefix = Bytes::new();
        }
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for Rewind<T> {
    #[inline]
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    #[inline]
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    #[inline]
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    #[inline]
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
