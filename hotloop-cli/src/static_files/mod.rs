//! `hotloop serve static --root DIR`: files under a directory over
//! HTTP/1.1, plain or TLS.
//!
//! `GET` and `HEAD`, with `Content-Length`, `Content-Type` by extension,
//! `Last-Modified` and an `ETag` as nginx makes them; `If-None-Match`
//! (weak comparison, `*`, lists) or else `If-Modified-Since` naming the
//! file's time exactly (nginx's default `if_modified_since exact`) gets
//! 304; one `Range` (unit in any case) gets 206 with `Content-Range`, 416
//! when no byte of it exists; several ranges get the whole file, as RFC
//! 9110 allows, or 416 when none of them exists (as nginx); `If-Range`
//! with a validator other than the file's `ETag` or `Last-Modified` gets
//! the whole file too. A directory is served by its `index.html`, or is
//! 403 (nginx without `autoindex`). A body sent with a `GET` or `HEAD` is
//! read and dropped before the answer (`conn::discard_body`; at most 1 MiB,
//! 413 beyond, as nginx's default `client_max_body_size`). Other methods
//! get 405 with `Allow: GET, HEAD`; an HTTP/1.1 request without exactly
//! one `Host` gets 400 (RFC 9112 section 3.2).
//!
//! The connection handling is `serve http`'s: the same [`Conn`] (plain
//! TCP or TLS), the same per-connection timer for the header, idle and
//! send timeouts, keep-alive, the same graceful stop and error replies.
//!
//! # Implementation notes
//! - Open files are kept per worker for one second at most (`cache.rs`, as
//!   nginx's `open_file_cache`): a file served again within that second
//!   costs no open, only an `fstat` of the descriptor held, which tells a
//!   file deleted, replaced or changed (it is then opened again). All
//!   workers' caches together hold at most a quarter of the open-file
//!   limit, and give their idle descriptors back when an accept or an
//!   open runs out (`EMFILE`, `ENFILE`).
//! - A request target is percent-decoded and split into segments; a `..`
//!   segment (literal or encoded) is 403 and an encoded `/` or NUL is 400,
//!   before any file is touched. The path is then opened beneath the root
//!   with [`Dir::open_file`] (`openat2` with `RESOLVE_BENEATH`), so a
//!   symbolic link that points out of the root is refused by the kernel as
//!   the path resolves (403), with no window between a check and the open.
//!   A link is judged by where it leads, not how it is written: one with
//!   an absolute target, or stepping above the root and back, that lands
//!   inside the root (by any name of it: the root may be given relative or
//!   through a link) is followed, as nginx's default `disable_symlinks off`
//!   follows every link; unlike nginx's default, one landing outside is
//!   403 (nginx refuses such links only with `disable_symlinks on` or
//!   `if_not_owner`, which look at every link or at owners instead).
//! - The open is non-blocking (`O_NONBLOCK`, and `O_NOCTTY`): opening a
//!   FIFO for reading waits for a writer otherwise, on a blocking-pool
//!   thread (epoll) or an io_uring worker (when the path is not in the
//!   dentry cache), and a few hundred such requests took every thread of
//!   the pool. The descriptor is then `fstat`ed, and anything but a
//!   regular file or a directory (a FIFO, a device) is 404, as nginx
//!   answers it, before any read; so is a socket, which cannot be opened
//!   (`ENXIO`). A regular file gets its blocking
//!   mode back (`O_NONBLOCK` would make an io_uring read of a file whose
//!   file system cannot read without waiting fail with `EAGAIN`).
//! - On plain TCP the body goes with [`TcpStream::send_file`]
//!   (`sendfile`), in steps of `SEND_FILE_STEP_BYTES` (`conn/send.rs`),
//!   each bounded by the send timeout; where
//!   file reads are ring operations (io_uring), a body of at most
//!   [`INLINE_BODY_MAX_BYTES`] is read into the head's buffer and sent
//!   with it in one write instead. Over TLS the file is read and
//!   written through the TLS stream (`tls.rs`).
//! - A directory's redirect names the normalised path (one leading `/`,
//!   each segment percent-encoded again, `target::url_path`), never the
//!   target as sent: `GET //evil.example` gave `Location: //evil.example/`,
//!   which a browser reads as another host.
//! - `Last-Modified` is never later than `Date` (RFC 9110 section
//!   8.8.2.1): a file dated ahead of the clock gets the answer's date, which
//!   validates no `If-Range`; `If-Modified-Since` compares with the file's
//!   own time, which no client was told, so such a file is not 304 by a
//!   date. A file dated in the year 10000 or later made the date's
//!   formatting panic.
//! - A request is parsed in the buffer its read filled, and what the
//!   answer needs of it is copied out (`Asked`: its path, and the rare
//!   conditional and range fields), so that buffer goes back to the pool
//!   before the answer waits on anything: a connection sending a large
//!   file to a client that reads slowly held its 16 KiB read buffer for
//!   the whole send. Bytes behind the request (a pipelining client's), and
//!   a head split across reads, are kept in a buffer of the connection's
//!   (`conn::Pending`), freed once its last byte is taken. An idle
//!   keep-alive connection holds no request buffer: the one it had grown
//!   (a `Vec` drained and never shrunk, up to 32 KiB after an 8 KiB head)
//!   stayed with it for its whole idle life.
//! - A file that shrinks while it is sent ends the send at its new end;
//!   fewer bytes than `Content-Length` promised were sent, so the
//!   connection is closed (the client sees a short body, never another
//!   file's bytes, and nothing waits for bytes that will not come).
//!
//! [`TcpStream::send_file`]: hotloop::net::TcpStream::send_file

mod cache;
mod conditional;
mod mime;
mod range;
mod request;
mod target;

use std::io;
use std::path::Path;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use hotloop::fs::{Dir, File, OpenOptions};
use hotloop_proto::Body;

use crate::conn::{
    answer_and_linger, discard_body, reject, Awaiting, Conn, ConnTimer, Discarded, Ending, Pending,
};
use crate::drain;
use cache::{Kind, Stat};
use range::Ranged;
use request::{Asked, Parsed};

/// A body this small is read into the response head's buffer and sent
/// with it in one write: cheaper than a second write.
pub const INLINE_BODY_MAX_BYTES: u64 = 16 * 1024;

/// What every connection of a static server shares.
pub struct Site {
    pub root: Dir,
    pub idle_timeout: Option<Duration>,
    /// `None`: no header timeout.
    pub header_timeout: Option<Duration>,
    /// The send timeout, or the idle timeout when that is shorter.
    pub write_limit: Option<Duration>,
    pub max_headers: usize,
}

/// Starts serving `site` on `addr`: plain TCP, or TLS with `tls`.
pub fn start(
    runtime: &hotloop::Handle,
    addr: &str,
    options: hotloop::net::ServerOptions,
    tls: Option<hotloop::tls::TlsAcceptor>,
    site: Site,
) -> io::Result<hotloop::net::Server> {
    let site = Arc::new(site);
    // The limit in force (`serve` raised it to the hard limit already).
    let nofile = hotloop::raise_nofile_limit()?;
    let open_files = cache::budget(nofile, runtime.workers());
    match tls {
        None => hotloop::net::serve(runtime, addr, options, move |stream| {
            handle(stream, site.clone(), open_files)
        }),
        Some(tls) => hotloop::tls::serve_tls(runtime, addr, options, tls, move |stream| {
            handle(stream, site.clone(), open_files)
        }),
    }
}

/// Serves one connection until it closes; `open_files` is how many open
/// files the worker's cache may keep (`cache::budget`).
pub async fn handle<S: Conn>(mut stream: S, site: Arc<Site>, open_files: usize) {
    let ending = serve(&mut stream, &site, open_files).await;
    stream.finish(ending, site.write_limit).await;
}

/// Whether the connection goes on after a response.
enum After {
    KeepAlive,
    /// The answer was whole and the server closes (`Connection: close`,
    /// HTTP/1.0, a stop).
    Close,
    /// A write failed, or the answer could not be whole: close at once.
    Cut,
    /// An error reply that closed lingeringly already.
    Lingered,
}

async fn serve<S: Conn>(stream: &mut S, site: &Site, open_files: usize) -> Ending {
    // Each read is parsed where it landed (`buf`); bytes kept between
    // reads (a head split across them, or what came behind a request
    // whose read buffer went back to the pool) are parsed from `pending`,
    // which is freed once its last byte is taken.
    let mut buf = S::Buf::default();
    let mut pending = Pending::default();
    let mut timer = ConnTimer::new();
    let mut awaiting = Awaiting::head(site.header_timeout);
    loop {
        let unparsed: &[u8] = if pending.is_empty() { &buf } else { pending.bytes() };
        if !unparsed.is_empty() {
            match request::parse(unparsed, site.max_headers) {
                Parsed::Complete(head) => {
                    let len = head.len;
                    let taken = Asked::take(&head);
                    // The head is copied out: the read buffer goes back to
                    // the pool before the answer waits on anything (an
                    // open, a client slow to take a large file), and what
                    // came behind the request is kept in `pending`.
                    if pending.is_empty() {
                        pending.extend_from_slice(&buf[len..]);
                    } else {
                        pending.consume(len);
                    }
                    drop(std::mem::take(&mut buf));
                    let after = match taken {
                        Ok(asked) => {
                            let answer =
                                answer(stream, site, open_files, asked, &mut pending, &mut timer);
                            Box::pin(answer).await
                        }
                        Err(reply) => {
                            Box::pin(answer_and_linger(stream, reply, site.write_limit)).await;
                            After::Lingered
                        }
                    };
                    match after {
                        After::KeepAlive => {
                            awaiting = Awaiting::NextRequest;
                            continue;
                        }
                        // What the client sent after this request is
                        // unread: the close lingers for it.
                        After::Close => return Ending::Answered { unread: !pending.is_empty() },
                        After::Cut => return Ending::Cut,
                        After::Lingered => return Ending::Lingered,
                    }
                }
                Parsed::Partial => {
                    if pending.is_empty() {
                        pending.extend_from_slice(&buf);
                    }
                }
                Parsed::Error(status) => {
                    reject(stream, status, site.write_limit).await;
                    return Ending::Lingered;
                }
            }
        }
        if !pending.is_empty() && awaiting.is_idle() {
            awaiting = Awaiting::head(site.header_timeout);
        }
        // Back to the pool before waiting: an idle connection holds no
        // read buffer, and (`pending` empty) no request buffer either.
        drop(std::mem::take(&mut buf));
        let deadline = awaiting.deadline(site.idle_timeout);
        // Between requests a stop closes the connection at once.
        let idle = awaiting.is_idle() && pending.is_empty();
        let got = {
            // Before an idle wait ends for a stop, the socket itself is
            // asked: on io_uring a next request already there may not have
            // reached the read yet.
            let socket = stream.input_probe();
            let read = pin!(stream.read_some());
            timer.read(read, deadline, idle).peeking(socket).await
        };
        match got {
            Some(b) if pending.is_empty() => buf = b,
            Some(b) => pending.extend_from_slice(&b),
            None => {
                // The clock itself: the deadline fires by it (the turn's reading may lag).
                if !pending.is_empty() && deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                    reject(stream, 408, site.write_limit).await;
                    return Ending::Lingered;
                }
                return Ending::Cut;
            }
        }
    }
}

/// Answers one request: its body, if any, read and dropped first
/// ([`discard_body`]), bytes after it left in `pending`.
async fn answer<S: Conn>(
    stream: &mut S,
    site: &Site,
    open_files: usize,
    (asked, body): (Asked, Body),
    pending: &mut Pending,
    timer: &mut ConnTimer,
) -> After {
    if body != Body::None {
        match discard_body(stream, timer, body, pending, site.idle_timeout).await {
            Discarded::Done => {}
            Discarded::Refuse(status) => {
                reject(stream, status, site.write_limit).await;
                return After::Lingered;
            }
            Discarded::Cut => return After::Cut,
        }
    }
    respond(stream, site, open_files, asked, timer).await
}

/// Why a path under the root is not served.
enum NotServed {
    /// Answer with this status.
    Status(u16),
    /// A directory without `index.html`: 403, as nginx answers it without
    /// `autoindex`; its name without the slash is redirected first, as any
    /// directory's is.
    NoIndex,
}

/// Answers one request whose body is read already.
async fn respond<S: Conn>(
    stream: &mut S,
    site: &Site,
    open_files: usize,
    asked: Asked,
    timer: &mut ConnTimer,
) -> After {
    let close = asked.close || drain::stopping();
    let get = asked.get;
    let error = |status: u16| request::simple(status, "", close, get);
    // A directory's redirect names the normalised path, not the target's
    // own: `//host` would be read as another host.
    let redirect = |rel: &Path| {
        let location = format!("Location: {}/{}\r\n", target::url_path(rel), asked.query);
        request::simple(301, &location, close, get)
    };
    let (rel, found) = match asked.rel {
        Ok(rel) => {
            let found = match cache::get(&rel) {
                Some(entry) => Ok(entry),
                None => open(&site.root, &rel).await.map(|(file, stat, name)| {
                    cache::put(&rel, cache::Entry::new(file, stat, name), open_files)
                }),
            };
            (Some(rel), found)
        }
        Err(status) => (None, Err(NotServed::Status(status))),
    };
    let entry = match found {
        Ok(entry) => entry,
        Err(NotServed::NoIndex) => {
            let reply = match &rel {
                Some(rel) if !asked.slash => redirect(rel),
                _ => error(403),
            };
            return finish(stream.send(reply, site.write_limit, timer).await, close);
        }
        Err(NotServed::Status(status)) => {
            return finish(stream.send(error(status), site.write_limit, timer).await, close)
        }
    };
    // A directory is served by its index only at its name with a slash
    // (nginx redirects the bare name, so the page's relative links resolve
    // under it); a file asked for as a directory is not there.
    if let Some((rel, name)) = rel.as_deref().and_then(|rel| Some((rel, rel.file_name()?))) {
        let directory = name.to_string_lossy() != entry.name.as_str();
        match (directory, asked.slash) {
            (true, false) => {
                return finish(stream.send(redirect(rel), site.write_limit, timer).await, close);
            }
            (false, true) => {
                return finish(stream.send(error(404), site.write_limit, timer).await, close)
            }
            _ => {}
        }
    }
    let (file, stat, name) = (&entry.file, &entry.stat, &entry.name);
    let modified = stat.modified();
    // A file dated ahead of the clock gets the answer's date, which
    // validates no `If-Range` (and `If-Modified-Since` compares with the
    // file's own time).
    let (last_modified, own_date) = request::last_modified(modified);
    let etag = conditional::etag(modified, stat.len);
    let validators = format!("Last-Modified: {last_modified}\r\nETag: {etag}\r\n");
    let headers = |extra: &str| {
        format!(
            "Content-Type: {}\r\n{validators}Accept-Ranges: bytes\r\n{extra}",
            mime::content_type(name)
        )
    };
    if conditional::not_modified(
        asked.if_none_match.as_deref(),
        asked.if_modified_since.as_deref(),
        modified,
        &etag,
    ) {
        let reply = request::head(304, &validators, 0, close, 0);
        // A 304 has no body, whatever Content-Length says: drop the header.
        let reply = strip_content_length(reply);
        return finish(stream.send(reply, site.write_limit, timer).await, close);
    }
    let len = stat.len;
    let if_range_matches = asked.if_range.as_deref().is_none_or(|v| {
        conditional::if_range_matches(v, &etag, own_date.then_some(last_modified.as_str()))
    });
    let range = asked.range.as_deref();
    let ranged = if if_range_matches { range::parse(range, len) } else { Ranged::Full };
    let (status, start, body_len, extra) = match ranged {
        Ranged::Full => (200, 0, len, headers("")),
        Ranged::Part { start, end } => (
            206,
            start,
            end - start + 1,
            headers(&format!("Content-Range: bytes {start}-{end}/{len}\r\n")),
        ),
        Ranged::Unsatisfiable => {
            let extra = format!("Content-Range: bytes */{len}\r\n");
            let reply = request::simple(416, &extra, close, get);
            return finish(stream.send(reply, site.write_limit, timer).await, close);
        }
    };
    if !get || body_len == 0 {
        let reply = request::head(status, &extra, body_len, close, 0);
        return finish(stream.send(reply, site.write_limit, timer).await, close);
    }
    // Where a read is a ring operation, a small body goes with the head in
    // one write; on the blocking pool a read would cost more than a second
    // write, so `send_file` it is.
    if body_len <= INLINE_BODY_MAX_BYTES && hotloop::fs::reads_on_ring() {
        let mut reply = request::head(status, &extra, body_len, close, body_len as usize);
        let Ok(()) = read_into(file, &mut reply, start, body_len).await else {
            // The file shrank under us before a byte was sent: say nothing
            // we cannot back and close.
            return After::Cut;
        };
        return finish(stream.send(reply, site.write_limit, timer).await, close);
    }
    let reply = request::head(status, &extra, body_len, close, 0);
    if stream.send(reply, site.write_limit, timer).await.is_err() {
        return After::Cut;
    }
    let sent = stream.send_file(file, start, body_len, site.write_limit, timer).await;
    finish(sent, close)
}

/// The connection's fate after the last write of a response.
fn finish(sent: io::Result<()>, close: bool) -> After {
    match (sent, close) {
        (Err(_), _) => After::Cut,
        (Ok(()), true) => After::Close,
        (Ok(()), false) => After::KeepAlive,
    }
}

/// Opens `rel` beneath the root: the file, what `fstat` says of it and
/// the name its content type comes from; a directory's `index.html`.
/// Only regular files are served: the open does not wait (see the module
/// notes), and anything else is 404 before a byte is read.
async fn open(root: &Dir, rel: &Path) -> Result<(File, Stat, String), NotServed> {
    let (file, stat) = open_beneath(root, rel_or_dot(rel)).await.map_err(NotServed::Status)?;
    match stat.kind() {
        Kind::Regular => {
            let name = rel.file_name().map(|n| n.to_string_lossy().into_owned());
            return Ok((file, stat, name.unwrap_or_default()));
        }
        Kind::Directory => {}
        Kind::Other => return Err(NotServed::Status(404)),
    }
    drop(file);
    let (file, stat) = match open_beneath(root, &rel.join("index.html")).await {
        Ok(opened) => opened,
        Err(404) => return Err(NotServed::NoIndex),
        Err(status) => return Err(NotServed::Status(status)),
    };
    if stat.kind() != Kind::Regular {
        return Err(NotServed::Status(404));
    }
    Ok((file, stat, "index.html".to_string()))
}

/// Opens `path` beneath the root without waiting (`O_NONBLOCK`) and
/// `fstat`s it; a regular file is made blocking again. Out of descriptors
/// (`EMFILE`, `ENFILE`), the worker's cache closes its idle files and the
/// open is tried once more.
async fn open_beneath(root: &Dir, path: &Path) -> Result<(File, Stat), u16> {
    let mut read = OpenOptions::new();
    read.read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    let file = match root.open_file(path, &read).await {
        Err(e) if out_of_descriptors(&e) && cache::release_idle() > 0 => {
            root.open_file(path, &read).await
        }
        opened => opened,
    }
    .map_err(status_of)?;
    let stat = Stat::of(&file).map_err(status_of)?;
    if stat.kind() == Kind::Regular {
        let flags = rustix::fs::fcntl_getfl(&file).map_err(|e| status_of(e.into()))?;
        rustix::fs::fcntl_setfl(&file, flags.difference(rustix::fs::OFlags::NONBLOCK))
            .map_err(|e| status_of(e.into()))?;
    }
    Ok((file, stat))
}

/// The process or the system has no descriptor left.
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(os_error(e), Some(libc::EMFILE | libc::ENFILE))
}

/// The root itself is `.`.
fn rel_or_dot(rel: &Path) -> &Path {
    if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    }
}

/// The status for a failed open or stat.
fn status_of(e: io::Error) -> u16 {
    match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => 404,
        io::ErrorKind::PermissionDenied => 403,
        // A name too long names nothing servable.
        io::ErrorKind::InvalidFilename => 404,
        // A loop of symbolic links, as nginx answers it.
        _ if os_error(&e) == Some(libc::ELOOP) => 403,
        // A socket file cannot be opened (`ENXIO`): like any file that is
        // not a regular one, it is not there to be served. (nginx answers
        // it 500, an open error it has no status for.)
        _ if os_error(&e) == Some(libc::ENXIO) => 404,
        _ => 500,
    }
}

/// The system error under `hotloop::fs`'s error, which names the path.
fn os_error(e: &io::Error) -> Option<i32> {
    e.raw_os_error().or_else(|| {
        let inner = std::error::Error::source(e.get_ref()?)?;
        inner.downcast_ref::<io::Error>()?.raw_os_error()
    })
}

/// Removes the `Content-Length` line from a head.
fn strip_content_length(head: Vec<u8>) -> Vec<u8> {
    let text = String::from_utf8_lossy(&head);
    text.split_inclusive("\r\n")
        .filter(|line| !line.starts_with("Content-Length:"))
        .collect::<String>()
        .into_bytes()
}

/// Appends `len` bytes of `file` from `offset` to `out`; `Err` when the
/// file has fewer.
async fn read_into(file: &File, out: &mut Vec<u8>, offset: u64, len: u64) -> io::Result<()> {
    let mut chunk = Vec::with_capacity(len as usize);
    let mut done = 0;
    while done < len {
        chunk.clear();
        chunk.reserve((len - done) as usize);
        let (res, buf) = file.read_at(chunk, offset + done).await;
        chunk = buf;
        match res? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => {
                let n = (n as u64).min(len - done);
                out.extend_from_slice(&chunk[..n as usize]);
                done += n;
            }
        }
    }
    Ok(())
}
