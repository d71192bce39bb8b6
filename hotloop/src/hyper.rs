//! hyper 1.x on hotloop: an executor that spawns on the current worker, a
//! timer on the worker's wheel, and [`serve_hyper`], which serves a hyper
//! `Service` (HTTP/1.1, and HTTP/2 by prior knowledge) on every worker.
//!
//! Connections speak hyper's I/O traits through `hyper_util`'s `TokioIo`
//! over [`TcpStream`]'s tokio traits, on either driver.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;

use crate::net::{serve, Server, ServerOptions, TcpStream};
use crate::Handle;

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
        drop(crate::spawn(future));
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

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        match sleep.as_mut().downcast_mut_pin::<HyperSleep>() {
            Some(mut s) => s.0.reset(new_deadline),
            None => *sleep = self.sleep_until(new_deadline),
        }
    }
}

/// Serves `make_service()` on every worker of `handle`'s runtime: HTTP/1.1,
/// and HTTP/2 when the client starts with the HTTP/2 preface (prior
/// knowledge, `h2c`). Each worker calls `make_service` once per connection.
pub fn serve_hyper<M, S, B>(
    handle: &Handle,
    addr: impl std::net::ToSocketAddrs,
    options: impl Into<ServerOptions>,
    make_service: M,
) -> std::io::Result<Server>
where
    M: Fn() -> S + Send + Sync + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + 'static,
    S::Future: 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve(handle, addr, options, move |stream: TcpStream| {
        let service = make_service();
        async move {
            let mut builder = auto::Builder::new(HotloopExecutor);
            builder.http1().timer(HotloopTimer).keep_alive(true);
            builder.http2().timer(HotloopTimer);
            // Errors here are the client's (resets, bad requests): the connection just ends.
            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
        }
    })
}
