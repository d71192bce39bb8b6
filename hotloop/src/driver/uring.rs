//! The io_uring driver.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use super::{AcceptMode, Source};
use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::runtime::{Config, WorkerShared};

/// One worker's io_uring instance.
pub(crate) struct Uring {}

fn unsupported() -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, "the io_uring driver is not available in this build")
}

impl Uring {
    pub(crate) fn new(
        _config: &Config,
        _worker: &Arc<WorkerShared>,
    ) -> io::Result<(Uring, String)> {
        Err(unsupported())
    }
    pub(crate) fn poll(&mut self, _timeout: Option<Duration>) -> io::Result<usize> {
        Err(unsupported())
    }
    pub(crate) fn release(&mut self, _fd: RawFd) {}
    pub(crate) fn poll_accept(
        &mut self,
        _fd: RawFd,
        _cx: &mut TaskContext<'_>,
        _mode: AcceptMode,
    ) -> Poll<io::Result<OwnedFd>> {
        Poll::Ready(Err(unsupported()))
    }
}

pub(crate) async fn recv<B: IoBufMut>(_src: &Source, buf: B) -> BufResult<usize, B> {
    (Err(unsupported()), buf)
}
pub(crate) async fn send<B: IoBuf>(_src: &Source, buf: B) -> BufResult<usize, B> {
    (Err(unsupported()), buf)
}
pub(crate) async fn send_vectored<B: IoBuf>(
    _src: &Source,
    bufs: Vec<B>,
) -> BufResult<usize, Vec<B>> {
    (Err(unsupported()), bufs)
}
pub(crate) async fn connect(_src: &Source, _addr: SocketAddr) -> io::Result<()> {
    Err(unsupported())
}
pub(crate) async fn shutdown(_src: &Source, _how: std::net::Shutdown) -> io::Result<()> {
    Err(unsupported())
}

pub(crate) fn poll_read_slice(
    _src: &Source,
    _cx: &mut TaskContext<'_>,
    _buf: &mut [u8],
) -> Poll<io::Result<usize>> {
    Poll::Ready(Err(unsupported()))
}
pub(crate) fn poll_write_slice(
    _src: &Source,
    _cx: &mut TaskContext<'_>,
    _buf: &[u8],
) -> Poll<io::Result<usize>> {
    Poll::Ready(Err(unsupported()))
}
