//! hyper's runtime traits on hotloop: the executor, the timer and its
//! sleep, and [`HyperIo`], hyper's I/O traits over the tokio ones.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::rt::ReadBufCursor;

#[cfg(doc)]
use crate::net::TcpStream;

/// hyper's executor: spawns onto the current hotloop worker. Futures need
/// not be `Send`.
#[derive(Debug, Clone, Copy, Default)]
pub struct HotloopExecutor;

impl<F> hyper::rt::Executor<F> for HotloopExecutor
where
    F: Future + 'static,
    F::Output: 'static,
{
    fn execute(&self, future: F) {
        // Nobody joins what hyper spawns (an HTTP/2 stream, a connection's
        // background work): a detached task allocates no join slot, which
        // a `spawn` whose handle is dropped at once would.
        crate::runtime::spawn_detached_with(move || crate::runtime::OnDone::new(future, drop));
    }
}

/// hyper's timer: sleeps on the current worker's timer wheel.
#[derive(Debug, Clone, Copy, Default)]
pub struct HotloopTimer;

/// A hotloop [`Sleep`](crate::time::Sleep) as hyper's `Sleep`.
pub struct HyperSleep(crate::time::Sleep);

impl Future for HyperSleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl hyper::rt::Sleep for HyperSleep {}

impl hyper::rt::Timer for HotloopTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(HyperSleep(crate::time::sleep(duration)))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(HyperSleep(crate::time::sleep_until(deadline)))
    }

    /// The worker loop's reading of this turn ([`crate::time::now`]), not
    /// a clock reading: hyper asks for it on every request to start its
    /// header-read timeout, and a turn's precision is ample for a timeout
    /// of seconds.
    fn now(&self) -> Instant {
        crate::time::now()
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        match sleep.as_mut().downcast_mut_pin::<HyperSleep>() {
            Some(mut s) => s.0.reset(new_deadline),
            None => *sleep = self.sleep_until(new_deadline),
        }
    }
}

/// A stream with tokio's I/O traits ([`TcpStream`], or a TLS stream over
/// it) as hyper's `Read` and `Write`.
#[derive(Debug)]
pub struct HyperIo<T>(pub T);

impl<T> HyperIo<T> {
    /// Wraps `stream`.
    pub fn new(stream: T) -> Self {
        HyperIo(stream)
    }
}

impl<T: tokio::io::AsyncRead + Unpin> hyper::rt::Read for HyperIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        crate::buf::poll_read_hyper(buf, |rb| Pin::new(&mut self.0).poll_read(cx, rb))
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> hyper::rt::Write for HyperIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // On io_uring the stream writes behind: a flush waits for the kernel.
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
