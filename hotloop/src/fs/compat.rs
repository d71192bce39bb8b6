//! `File` as tokio's `AsyncRead`, `AsyncWrite` and `AsyncSeek`.
//!
//! # Implementation notes
//! As in `tokio::fs::File`, one operation at a time runs on the file's
//! own buffer: a read asks for at most [`CHUNK_MAX`] bytes into it and
//! copies out what the caller's `ReadBuf` takes (the rest waits for the
//! next read); a write copies the caller's bytes into it, starts writing
//! them and reports them written at once, and the next operation, flush
//! or shutdown waits for that write and reports its error. The buffer
//! belongs to the operation while it runs, so the kernel never writes
//! into memory the caller may free. `pos` is the offset of the next
//! operation; bytes read ahead and not yet taken sit before it.

use std::future::Future;
use std::io::{self, SeekFrom};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

use super::error::with_path;
use super::{ops, File};

/// The most bytes one read or write through the traits moves.
const CHUNK_MAX: usize = 64 * 1024;

/// What the operation in flight ended with.
enum Done {
    Read(io::Result<usize>, Vec<u8>),
    Write(io::Result<()>, Vec<u8>),
    Seek(io::Result<u64>),
}

/// The traits' state: the buffer, or the operation that has it.
#[derive(Default)]
pub(crate) struct State {
    buf: Vec<u8>,
    /// Bytes of `buf` before this were taken by the caller.
    start: usize,
    busy: Option<Pin<Box<dyn Future<Output = Done>>>>,
    /// The result of a seek that needed no operation.
    seek: Option<io::Result<u64>>,
}

impl State {
    fn unread(&self) -> usize {
        self.buf.len() - self.start
    }
}

impl File {
    /// Waits for the operation in flight, if any; returns an error it
    /// reported (a read's is handled by the read itself).
    fn poll_busy(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Done>>> {
        let Some(busy) = self.io.busy.as_mut() else { return Poll::Ready(Ok(None)) };
        let done = ready!(busy.as_mut().poll(cx));
        self.io.busy = None;
        match done {
            Done::Write(res, buf) => {
                self.io.buf = buf;
                self.io.buf.clear();
                self.io.start = 0;
                Poll::Ready(res.map(|()| None).map_err(|e| with_path("write", &self.path, e)))
            }
            other => Poll::Ready(Ok(Some(other))),
        }
    }

    /// Forgets bytes read ahead: the next operation starts at the caller's position.
    fn drop_read_ahead(&mut self) {
        self.pos -= self.io.unread() as u64;
        self.io.buf.clear();
        self.io.start = 0;
    }
}

impl AsyncRead for File {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        dst: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match ready!(this.poll_busy(cx))? {
                Some(Done::Read(res, buf)) => {
                    this.io.buf = buf;
                    this.io.start = 0;
                    match res {
                        // The end of the file.
                        Ok(0) => return Poll::Ready(Ok(())),
                        Ok(n) => this.pos += n as u64,
                        Err(e) => return Poll::Ready(Err(with_path("read", &this.path, e))),
                    }
                }
                Some(Done::Seek(res)) => this.io.seek = Some(res),
                Some(Done::Write(..)) | None => {}
            }
            if this.io.unread() > 0 {
                let n = this.io.unread().min(dst.remaining());
                dst.put_slice(&this.io.buf[this.io.start..this.io.start + n]);
                this.io.start += n;
                return Poll::Ready(Ok(()));
            }
            if dst.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let mut buf = std::mem::take(&mut this.io.buf);
            buf.clear();
            buf.reserve(dst.remaining().min(CHUNK_MAX));
            this.io.start = 0;
            let (file, pos) = (this.file.clone(), this.pos);
            this.io.busy = Some(Box::pin(async move {
                let (res, buf) = ops::read_at(&file, buf, pos).await;
                Done::Read(res, buf)
            }));
        }
    }
}

impl AsyncWrite for File {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        src: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(Done::Seek(res)) = ready!(this.poll_busy(cx))? {
            this.io.seek = Some(res);
        }
        this.drop_read_ahead();
        let mut buf = std::mem::take(&mut this.io.buf);
        let n = src.len().min(CHUNK_MAX);
        buf.extend_from_slice(&src[..n]);
        let (file, pos) = (this.file.clone(), this.pos);
        this.pos += n as u64;
        this.io.busy = Some(Box::pin(async move {
            let mut done = 0;
            while done < buf.len() {
                let (res, slice) =
                    ops::write_at(&file, crate::buf::IoBuf::slice(buf, done..), pos + done as u64)
                        .await;
                buf = slice.into_inner();
                match res {
                    Ok(0) => return Done::Write(Err(io::ErrorKind::WriteZero.into()), buf),
                    Ok(n) => done += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Done::Write(Err(e), buf),
                }
            }
            Done::Write(Ok(()), buf)
        }));
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match ready!(this.poll_busy(cx))? {
            Some(Done::Read(res, buf)) => {
                this.io.buf = buf;
                this.io.start = 0;
                if let Ok(n) = res {
                    this.pos += n as u64;
                }
            }
            Some(Done::Seek(res)) => this.io.seek = Some(res),
            Some(Done::Write(..)) | None => {}
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}

impl AsyncSeek for File {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        let this = self.get_mut();
        if this.io.busy.is_some() {
            return Err(io::Error::other(
                "another operation is pending on this file: call `poll_complete` (or flush) first",
            ));
        }
        this.drop_read_ahead();
        let invalid = || io::Error::new(io::ErrorKind::InvalidInput, "seek to a negative offset");
        let target = match position {
            SeekFrom::Start(n) => Ok(n),
            SeekFrom::Current(d) => this.pos.checked_add_signed(d).ok_or_else(invalid),
            SeekFrom::End(d) => {
                let (file, path) = (this.file.clone(), this.path.clone());
                this.io.busy = Some(Box::pin(async move {
                    let res = match ops::metadata_file(&file).await {
                        Ok(m) => m.len().checked_add_signed(d).ok_or_else(invalid),
                        Err(e) => Err(with_path("stat", &path, e)),
                    };
                    Done::Seek(res)
                }));
                return Ok(());
            }
        };
        if let Ok(n) = target {
            this.pos = n;
        }
        this.io.seek = Some(target);
        Ok(())
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        let this = self.get_mut();
        loop {
            match ready!(this.poll_busy(cx))? {
                Some(Done::Seek(res)) => {
                    if let Ok(n) = res {
                        this.pos = n;
                    }
                    return Poll::Ready(res);
                }
                Some(Done::Read(res, buf)) => {
                    this.io.buf = buf;
                    this.io.start = 0;
                    if let Ok(n) = res {
                        this.pos += n as u64;
                    }
                }
                Some(Done::Write(..)) => {}
                None => {
                    return Poll::Ready(match this.io.seek.take() {
                        Some(res) => res,
                        None => Ok(this.pos - this.io.unread() as u64),
                    })
                }
            }
        }
    }
}
