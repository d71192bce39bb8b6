//! `File` as tokio's `AsyncRead`, `AsyncWrite` and `AsyncSeek`.
//!
//! # Implementation notes
//! As in `tokio::fs::File`, one operation at a time runs through the
//! traits (the state it leaves is in `cursor.rs`):
//! - a read asks for at most [`CHUNK_MAX`] bytes at the cursor into the
//!   file's own buffer and hands out what the caller's `ReadBuf` takes;
//!   the rest waits there, just after the cursor, for the next read;
//! - a write copies at most [`CHUNK_MAX`] of the caller's bytes, starts a
//!   task that writes them at the cursor, and reports them written at
//!   once; the next operation through the traits waits for that task;
//! - a seek moves the cursor at once (from the end, after a `statx`), and
//!   forgets what was read ahead.
//!
//! The buffer belongs to the operation while it runs, so the kernel never
//! writes into memory the caller may free.

use std::io::{self, SeekFrom};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

use super::cursor::{write_behind, Done};
use super::error::{not_on_worker, with_path};
use super::{ops, File};

/// The most bytes one read or write through the traits moves.
const CHUNK_MAX: usize = 64 * 1024;

impl AsyncRead for File {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        dst: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            ready!(this.poll_settle(cx));
            let mut st = this.cursor.borrow_mut();
            if let Some(e) = st.read_err.take() {
                return Poll::Ready(Err(e));
            }
            if st.unread() > 0 {
                let n = st.unread().min(dst.remaining());
                dst.put_slice(&st.buf[st.start..st.start + n]);
                st.start += n;
                this.pos.set(this.pos.get() + n as u64);
                return Poll::Ready(Ok(()));
            }
            if std::mem::take(&mut st.eof) || dst.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let mut buf = std::mem::take(&mut st.buf);
            buf.clear();
            buf.reserve(dst.remaining().min(CHUNK_MAX));
            st.start = 0;
            let (file, pos) = (this.file.clone(), this.pos.get());
            st.busy = Some(Box::pin(async move {
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
        ready!(this.poll_settle(cx));
        if let Some(e) = this.take_write_err() {
            return Poll::Ready(Err(e));
        }
        let mut st = this.cursor.borrow_mut();
        st.forget_read_ahead();
        if src.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if !crate::runtime::current::on_worker() {
            return Poll::Ready(Err(not_on_worker()));
        }
        let n = src.len().min(CHUNK_MAX);
        let pos = this.pos.get();
        this.pos.set(pos + n as u64);
        let task =
            crate::spawn(write_behind(this.file.clone(), Arc::from(&src[..n]), pos, this.append));
        st.busy = Some(Box::pin(async move {
            task.await.unwrap_or_else(|e| {
                Done::Write(Err(io::Error::other(format!("the write's task ended: {e}"))))
            })
        }));
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_settle(cx));
        Poll::Ready(this.take_write_err().map_or(Ok(()), Err))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}

impl AsyncSeek for File {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        let this = self.get_mut();
        let mut st = this.cursor.borrow_mut();
        if st.busy.is_some() {
            return Err(io::Error::other(
                "another operation is pending on this file: call `poll_complete` (or flush) first",
            ));
        }
        let pos = this.pos.get();
        let invalid = || io::Error::new(io::ErrorKind::InvalidInput, "seek to a negative offset");
        let target = match position {
            SeekFrom::Start(n) => Ok(n),
            SeekFrom::Current(d) => pos.checked_add_signed(d).ok_or_else(invalid),
            SeekFrom::End(d) => {
                st.forget_read_ahead();
                let (file, path) = (this.file.clone(), this.path.clone());
                st.busy = Some(Box::pin(async move {
                    let res = match ops::metadata_file(&file).await {
                        Ok(m) => m.len().checked_add_signed(d).ok_or_else(invalid),
                        Err(e) => Err(with_path("stat", &path, e)),
                    };
                    Done::Seek(res)
                }));
                return Ok(());
            }
        };
        match target {
            // Where the caller is already (`stream_position`): what was
            // read ahead is still the file's bytes at the cursor.
            Ok(n) if n == pos => {}
            Ok(n) => {
                st.forget_read_ahead();
                this.pos.set(n);
            }
            Err(_) => {}
        }
        st.seek = Some(target);
        Ok(())
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        let this = self.get_mut();
        ready!(this.poll_settle(cx));
        let seek = this.cursor.borrow_mut().seek.take();
        Poll::Ready(seek.unwrap_or(Ok(this.pos.get())))
    }
}
