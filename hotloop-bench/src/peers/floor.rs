//! The floor server: the least work the kernel demands to answer echo or
//! HTTP over TCP, with no runtime at all.
//!
//! Each worker thread owns a SO_REUSEPORT listener, one epoll instance and a
//! slab of connections, and makes straight libc calls: accept4, read, send,
//! close. Its figures are the floor every other server in the bench is
//! compared against.
//!
//! # Implementation notes
//! - The listener is level-triggered; each wakeup accepts at most
//!   `--max-accepts` connections ([`ACCEPTS_PER_WAKEUP_DEFAULT`]), so
//!   established connections are served between accept batches; with
//!   `unlimited` it accepts until EAGAIN, the loop DragonFly's commit
//!   describes.
//! - A new connection is read at once, before it is registered with epoll
//!   (as s2n-quic-dc does): a client that sent its request with the
//!   handshake is answered, and with `Connection: close` closed, without a
//!   single epoll_ctl. Only a read that returns EAGAIN registers it.
//! - Connections are edge-triggered for input. EPOLLOUT is added only while
//!   a reply is stuck in a full send buffer, and reading stops until it
//!   drains, so a client that does not read cannot grow server memory.
//! - HTTP replies are built once per worker with [`proto::response_ok`];
//!   pipelined requests are answered in order.
//! - On EMFILE, ENFILE, ENOBUFS or ENOMEM from accept4 the listener is taken
//!   out of epoll for [`ACCEPT_PAUSE_MS`] instead of being retried in a
//!   loop; level-triggered, it would otherwise wake the worker forever.
//! - SIGINT and SIGTERM are blocked in every thread and taken by the main
//!   thread with sigwait(3); it raises a stop flag and wakes each worker
//!   through its eventfd. Workers return, dropping every descriptor.
//! - With `--busy-poll` a worker never sleeps: every epoll_wait(2) has a
//!   zero timeout, in a loop, as a hand-written busy-polling server does
//!   (haproxy's `busy-polling`, hotloop's `--busy-poll always`). Each poll
//!   still takes at most [`EVENTS_PER_WAIT_MAX`] events, and the stop
//!   still comes through the eventfd; nothing else changes. It costs a
//!   whole core per worker, idle or not: it is the floor that busy-polling
//!   settings are measured against, not a way to run.
//!
//! Invariant: every descriptor is an [`OwnedFd`] held by exactly one owner
//! (a worker's listener, epoll or eventfd, or a slab entry), so every path
//! that drops a connection closes it, and closing it removes it from epoll.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use crate::proto::{self, Request};
use clap::{Args, ValueEnum};
use slab::Slab;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The listen(2) backlog of each worker's listener.
pub const LISTEN_BACKLOG: i32 = 4096;

/// The most connections accepted per listener wakeup unless `--max-accepts` says otherwise.
pub const ACCEPTS_PER_WAKEUP_DEFAULT: usize = 64;

/// `--max-accepts`: a bound per wakeup, or `None` for unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxAccepts(pub Option<usize>);

/// Parses `--max-accepts`: a positive number or `unlimited`.
pub fn parse_max_accepts(s: &str) -> Result<MaxAccepts, String> {
    match s {
        "unlimited" => Ok(MaxAccepts(None)),
        n => match n.parse::<usize>() {
            Ok(v) if v > 0 => Ok(MaxAccepts(Some(v))),
            _ => Err(format!("`{n}` is not a positive number or `unlimited`")),
        },
    }
}

/// The most events taken from one epoll_wait(2).
pub const EVENTS_PER_WAIT_MAX: usize = 256;

/// Bytes read from a connection at a time.
pub const READ_BUF_BYTES: usize = 64 * 1024;

/// How long accepting pauses after the descriptor or memory limit is hit.
pub const ACCEPT_PAUSE_MS: u64 = 10;

/// The most worker threads.
pub const WORKERS_MAX: usize = 1024;

/// The largest HTTP body, in bytes.
pub const BODY_SIZE_MAX_BYTES: usize = 64 * 1024 * 1024;

/// epoll data of the listener.
const LISTENER_TOKEN: u64 = u64::MAX;

/// epoll data of the stop eventfd.
const WAKE_TOKEN: u64 = u64::MAX - 1;

/// What the floor server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum App {
    /// Write back every byte read.
    Echo,
    /// Answer every HTTP/1.1 request with `200 OK` and `--body-size` bytes.
    Http,
}

impl App {
    /// The lowercase name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            App::Echo => "echo",
            App::Http => "http",
        }
    }
}

/// Options of the floor server.
#[derive(Debug, Clone, Args)]
pub struct FloorArgs {
    /// What to serve.
    #[arg(value_enum)]
    pub app: App,
    /// Address to listen on; port 0 picks a free port, printed at start.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "HOST:PORT")]
    pub addr: SocketAddr,
    /// Worker threads, each with its own listener and epoll instance.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub workers: usize,
    /// HTTP response body size in bytes.
    #[arg(long, default_value_t = 13, value_name = "BYTES")]
    pub body_size: usize,
    /// Microseconds of CPU work per HTTP request.
    #[arg(long, default_value_t = 0, value_name = "US")]
    pub work_us: u64,
    /// Connections accepted per listener wakeup: a number or `unlimited`.
    #[arg(long, default_value = "64", value_parser = parse_max_accepts)]
    pub max_accepts: MaxAccepts,
    /// Never sleep: poll epoll with a zero timeout in a loop (a whole core
    /// per worker, idle or not).
    #[arg(long)]
    pub busy_poll: bool,
}

/// Serves until SIGINT or SIGTERM, then closes everything and returns.
///
/// Prints `floor APP listening on ADDR (N workers)` (`, busy polling`
/// added with `--busy-poll`) on standard output once
/// every listener is bound, so a caller that asked for port 0 learns the
/// port.
pub fn run(args: &FloorArgs) -> io::Result<()> {
    if args.workers == 0 || args.workers > WORKERS_MAX {
        return Err(invalid(format!("--workers {}: give 1 to {WORKERS_MAX}", args.workers)));
    }
    if args.body_size > BODY_SIZE_MAX_BYTES {
        return Err(invalid(format!(
            "--body-size {}: at most {BODY_SIZE_MAX_BYTES} bytes",
            args.body_size
        )));
    }
    crate::load::sys::raise_nofile_limit()?;

    // Bind every listener before serving, so a port in use is reported
    // at once; the first one fixes the port when port 0 was asked for.
    let first = listener(args.addr, true)?;
    let addr = first
        .local_addr()?
        .as_socket()
        .ok_or_else(|| invalid("listener has no inet address".into()))?;
    let mut listeners = vec![first];
    for _ in 1..args.workers {
        listeners.push(listener(addr, true)?);
    }

    let signals = SignalGuard::block_stop_signals()?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut wakers = Vec::new();
    let mut handles = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        let worker = Worker::new(args, l.into())?;
        wakers.push(worker.wake.try_clone()?);
        let stop = Arc::clone(&stop);
        let handle = std::thread::Builder::new().name(format!("floor-{i}")).spawn(move || {
            let result = worker.run(&stop);
            if let Err(e) = &result {
                eprintln!("hotloop floor: worker {i}: {e}");
                // Wake the main thread so the whole server stops.
                // SAFETY: kill(2) with our own pid and a valid signal number
                // has no memory-safety preconditions.
                unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
            }
            result
        })?;
        handles.push(handle);
    }
    let plural = if args.workers == 1 { "" } else { "s" };
    let busy = if args.busy_poll { ", busy polling" } else { "" };
    println!(
        "floor {} listening on {addr} ({} worker{plural}{busy})",
        args.app.as_str(),
        args.workers
    );
    io::stdout().flush()?;

    signals.wait();
    stop_workers("floor", &stop, &wakers, handles, None)
}

/// Tells the workers to stop (`stop`, then a write to each one's eventfd),
/// joins them, and returns the first error: `first_err`, if the start
/// already failed, else the first a worker ended with. Shared by both floors.
pub(super) fn stop_workers(
    name: &str,
    stop: &AtomicBool,
    wakers: &[OwnedFd],
    handles: Vec<std::thread::JoinHandle<io::Result<()>>>,
    mut first_err: Option<io::Error>,
) -> io::Result<()> {
    stop.store(true, Ordering::Release);
    for w in wakers {
        wake(w);
    }
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(io::Error::other(format!("a {name} worker panicked")));
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

pub(super) fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// A listening socket with the floors' options (`SO_REUSEADDR`,
/// `SO_REUSEPORT`, the floors' backlog); non-blocking for epoll, blocking
/// for io_uring, which polls it and never blocks the thread.
pub(super) fn listener(addr: SocketAddr, nonblocking: bool) -> io::Result<Socket> {
    let ty = if nonblocking { Type::STREAM.nonblocking() } else { Type::STREAM };
    let sock = Socket::new(Domain::for_address(addr), ty, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    sock.bind(&SockAddr::from(addr))
        .map_err(|e| io::Error::new(e.kind(), format!("bind {addr}: {e}")))?;
    sock.listen(LISTEN_BACKLOG)?;
    Ok(sock)
}

/// Turns a negative return into the thread's errno.
fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn cvt_size(rc: libc::ssize_t) -> io::Result<usize> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

fn wake(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: `one` is 8 readable bytes, the size eventfd(2) requires; the
    // fd is an open eventfd owned by `fd`. A full counter (EAGAIN) already
    // means the worker will wake, so the result is not needed.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// SIGINT and SIGTERM blocked in this thread (and so in threads it starts
/// later), to be taken with sigwait(3); the old mask is restored on drop.
struct SignalGuard {
    set: libc::sigset_t,
    old: libc::sigset_t,
}

impl SignalGuard {
    fn block_stop_signals() -> io::Result<SignalGuard> {
        // SAFETY: sigset_t is plain data; sigemptyset below initialises it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above; pthread_sigmask fills it.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t and the signal numbers are valid.
        unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
        }
        // SAFETY: both pointers are to valid sigset_t values that live across
        // the call.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(SignalGuard { set, old })
    }

    /// Blocks until SIGINT or SIGTERM arrives.
    fn wait(&self) {
        let mut sig: libc::c_int = 0;
        // SAFETY: `self.set` is an initialised sigset_t and `sig` a writable
        // int; sigwait(3) returns an error number only for an invalid set.
        while unsafe { libc::sigwait(&self.set, &mut sig) } != 0 {}
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        // SAFETY: `self.old` is the mask pthread_sigmask returned earlier.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// One accepted connection.
struct Conn {
    fd: OwnedFd,
    gen: u32,
    /// Whether the fd is in the worker's epoll set.
    registered: bool,
    /// Whether EPOLLOUT is in its interest set.
    want_write: bool,
    /// The start of an HTTP request head not yet complete.
    inbuf: Vec<u8>,
    /// Reply bytes not yet written, from `out_off` on.
    out: Vec<u8>,
    out_off: usize,
    /// Close once `out` is written.
    close_after_write: bool,
}

/// What a connection's handler decided.
enum Next {
    /// Keep the connection; wait for its next event.
    Wait,
    /// Close it now.
    Close,
}

struct Worker {
    epoll: OwnedFd,
    listener: OwnedFd,
    wake: OwnedFd,
    app: App,
    work_us: u64,
    /// Connections accepted per listener wakeup (`None`: until EAGAIN).
    max_accepts: Option<usize>,
    /// Poll with a zero timeout instead of sleeping.
    busy_poll: bool,
    resp_keepalive: Vec<u8>,
    resp_close: Vec<u8>,
    conns: Slab<Conn>,
    next_gen: u32,
    buf: Vec<u8>,
    accept_paused_until: Option<Instant>,
    accept_pauses: u64,
}

impl Worker {
    fn new(args: &FloorArgs, listener: OwnedFd) -> io::Result<Worker> {
        // SAFETY: epoll_create1(2) has no pointer arguments.
        let epfd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: epoll_create1(2) succeeded, so `epfd` is a new descriptor
        // that nothing else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(epfd) };
        // SAFETY: eventfd(2) has no pointer arguments.
        let efd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: eventfd(2) succeeded, so `efd` is a new descriptor that
        // nothing else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(efd) };
        let w = Worker {
            epoll,
            listener,
            wake,
            app: args.app,
            work_us: args.work_us,
            max_accepts: args.max_accepts.0,
            busy_poll: args.busy_poll,
            resp_keepalive: proto::response_ok(args.body_size, false),
            resp_close: proto::response_ok(args.body_size, true),
            conns: Slab::new(),
            next_gen: 0,
            buf: vec![0; READ_BUF_BYTES],
            accept_paused_until: None,
            accept_pauses: 0,
        };
        w.ctl(libc::EPOLL_CTL_ADD, w.listener.as_raw_fd(), libc::EPOLLIN as u32, LISTENER_TOKEN)?;
        w.ctl(libc::EPOLL_CTL_ADD, w.wake.as_raw_fd(), libc::EPOLLIN as u32, WAKE_TOKEN)?;
        Ok(w)
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, data: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: data };
        // SAFETY: `self.epoll` and `fd` are open descriptors; `ev` is a valid
        // epoll_event that lives across the call (the kernel copies it).
        cvt(unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) })?;
        Ok(())
    }

    fn run(mut self, stop: &AtomicBool) -> io::Result<()> {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS_PER_WAIT_MAX];
        loop {
            let timeout_ms = match self.accept_paused_until {
                // Busy polling: look and come straight back, paused or not.
                _ if self.busy_poll => 0,
                None => -1,
                Some(t) => {
                    let left = t.saturating_duration_since(Instant::now());
                    // Round up, or the wait returns early and spins.
                    left.as_micros().div_ceil(1000) as libc::c_int
                }
            };
            // SAFETY: `events` holds EVENTS_PER_WAIT_MAX initialised entries
            // the kernel may overwrite; the epoll fd is open.
            let rc = unsafe {
                libc::epoll_wait(
                    self.epoll.as_raw_fd(),
                    events.as_mut_ptr(),
                    EVENTS_PER_WAIT_MAX as libc::c_int,
                    timeout_ms,
                )
            };
            let n = match cvt(rc) {
                Ok(n) => n as usize,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            for ev in &events[..n] {
                let (data, bits) = (ev.u64, ev.events);
                match data {
                    WAKE_TOKEN => {
                        if stop.load(Ordering::Acquire) {
                            return Ok(());
                        }
                    }
                    LISTENER_TOKEN => self.accept_batch()?,
                    _ => self.on_conn_event(data, bits),
                }
            }
            if let Some(t) = self.accept_paused_until {
                if Instant::now() >= t {
                    self.accept_paused_until = None;
                    self.ctl(
                        libc::EPOLL_CTL_ADD,
                        self.listener.as_raw_fd(),
                        libc::EPOLLIN as u32,
                        LISTENER_TOKEN,
                    )?;
                }
            }
        }
    }

    fn accept_batch(&mut self) -> io::Result<()> {
        if self.accept_paused_until.is_some() {
            return Ok(());
        }
        let max = self.max_accepts.unwrap_or(usize::MAX);
        for _ in 0..max {
            // SAFETY: the listener is an open socket; null address pointers
            // ask accept4(2) not to report the peer.
            let rc = unsafe {
                libc::accept4(
                    self.listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            match cvt(rc) {
                Ok(fd) => {
                    // SAFETY: accept4(2) succeeded, so `fd` is a new
                    // descriptor that nothing else owns.
                    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                    self.on_accept(fd);
                }
                Err(e) => {
                    return match e.raw_os_error() {
                        Some(libc::EAGAIN) => Ok(()),
                        // The connection died in the queue; try the next.
                        Some(libc::ECONNABORTED | libc::EINTR | libc::EPROTO) => continue,
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                            self.pause_accepting(&e)
                        }
                        _ => Err(io::Error::new(e.kind(), format!("accept4: {e}"))),
                    };
                }
            }
        }
        Ok(())
    }

    /// Takes the listener out of epoll for a while: it stays readable while
    /// connections wait, so retrying at once would spin.
    fn pause_accepting(&mut self, e: &io::Error) -> io::Result<()> {
        if self.accept_pauses == 0 {
            eprintln!(
                "hotloop floor: accept4: {e}; pausing accepts for {ACCEPT_PAUSE_MS} ms each time (open connections: {})",
                self.conns.len()
            );
        }
        self.accept_pauses += 1;
        self.ctl(libc::EPOLL_CTL_DEL, self.listener.as_raw_fd(), 0, 0)?;
        self.accept_paused_until = Some(Instant::now() + Duration::from_millis(ACCEPT_PAUSE_MS));
        Ok(())
    }

    fn on_accept(&mut self, fd: OwnedFd) {
        let gen = self.next_gen;
        self.next_gen = self.next_gen.wrapping_add(1);
        let slot = self.conns.insert(Conn {
            fd,
            gen,
            registered: false,
            want_write: false,
            inbuf: Vec::new(),
            out: Vec::new(),
            out_off: 0,
            close_after_write: false,
        });
        // Not yet registered: if the peer's FIN is already queued, the
        // EPOLL_CTL_ADD in `arm` reports it.
        self.serve(slot, false);
    }

    fn on_conn_event(&mut self, data: u64, bits: u32) {
        let (slot, gen) = ((data & 0xffff_ffff) as usize, (data >> 32) as u32);
        let closing = bits & (libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0;
        match self.conns.get(slot) {
            Some(c) if c.gen == gen => self.serve(slot, closing),
            // A connection closed earlier in this batch; its slot may hold
            // a newer one.
            _ => {}
        }
    }

    /// Makes all the progress the socket allows, then closes the connection
    /// or makes sure epoll will report its next readiness. `closing` says
    /// the event carried a hang-up, so reading must go on to end of file.
    fn serve(&mut self, slot: usize, closing: bool) {
        let next = self.progress(slot, closing).unwrap_or(Next::Close);
        match next {
            Next::Close => {
                self.conns.remove(slot);
            }
            Next::Wait => {
                if let Err(e) = self.arm(slot) {
                    eprintln!("hotloop floor: epoll_ctl: {e}; closing the connection");
                    self.conns.remove(slot);
                }
            }
        }
    }

    /// Registers the connection, or changes its interest to match whether a
    /// reply is waiting to be written.
    fn arm(&mut self, slot: usize) -> io::Result<()> {
        let c = &self.conns[slot];
        let want_write = c.out_off < c.out.len();
        if c.registered && c.want_write == want_write {
            return Ok(());
        }
        let mut events = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLET) as u32;
        if want_write {
            events |= libc::EPOLLOUT as u32;
        }
        let op = if c.registered { libc::EPOLL_CTL_MOD } else { libc::EPOLL_CTL_ADD };
        let data = (c.gen as u64) << 32 | slot as u64;
        self.ctl(op, c.fd.as_raw_fd(), events, data)?;
        let c = &mut self.conns[slot];
        c.registered = true;
        c.want_write = want_write;
        Ok(())
    }

    /// Writes pending output, reads and answers, until the socket would
    /// block. An error means the connection is finished.
    fn progress(&mut self, slot: usize, closing: bool) -> io::Result<Next> {
        loop {
            if !self.flush(slot)? {
                // The send buffer is full: stop reading until it drains.
                return Ok(Next::Wait);
            }
            if self.conns[slot].close_after_write {
                return Ok(Next::Close);
            }
            let fd = self.conns[slot].fd.as_raw_fd();
            // SAFETY: `buf` is READ_BUF_BYTES writable bytes; `fd` is open
            // and owned by the connection in `slot`.
            let rc = unsafe { libc::read(fd, self.buf.as_mut_ptr().cast(), self.buf.len()) };
            let n = match cvt_size(rc) {
                // The peer closed or half-closed: everything it sent has
                // been answered, so close.
                Ok(0) => return Ok(Next::Close),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Next::Wait),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            match self.app {
                App::Echo => self.queue_echo(slot, n),
                App::Http => self.queue_http(slot, n),
            }
            // Under edge triggering a short read means the socket is
            // drained and anything arriving later raises a new edge. A
            // hang-up already reported with this edge raises no other, so
            // then read on to end of file.
            let drained = self.conns[slot].out_off == self.conns[slot].out.len();
            if n < self.buf.len() && drained && !closing {
                if self.conns[slot].close_after_write {
                    return Ok(Next::Close);
                }
                return Ok(Next::Wait);
            }
        }
    }

    /// Writes `bytes` now and keeps whatever the socket did not take.
    fn send_or_queue(conn: &mut Conn, bytes: &[u8]) -> io::Result<()> {
        let mut done = 0;
        if conn.out_off == conn.out.len() {
            conn.out.clear();
            conn.out_off = 0;
            while done < bytes.len() {
                match send(conn.fd.as_raw_fd(), &bytes[done..]) {
                    Ok(n) => done += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        conn.out.extend_from_slice(&bytes[done..]);
        Ok(())
    }

    /// Writes queued output; returns whether all of it went out.
    fn flush(&mut self, slot: usize) -> io::Result<bool> {
        let c = &mut self.conns[slot];
        while c.out_off < c.out.len() {
            match send(c.fd.as_raw_fd(), &c.out[c.out_off..]) {
                Ok(n) => c.out_off += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        c.out.clear();
        c.out_off = 0;
        Ok(true)
    }

    fn queue_echo(&mut self, slot: usize, n: usize) {
        let c = &mut self.conns[slot];
        if Self::send_or_queue(c, &self.buf[..n]).is_err() {
            // The peer is gone; closing after the (empty) queue drains.
            c.out.clear();
            c.out_off = 0;
            c.close_after_write = true;
        }
    }

    /// Answers every complete request among the bytes read so far.
    fn queue_http(&mut self, slot: usize, n: usize) {
        let c = &mut self.conns[slot];
        let fresh = &self.buf[..n];
        let buffered = !c.inbuf.is_empty();
        if buffered {
            c.inbuf.extend_from_slice(fresh);
        }
        let mut data: &[u8] = if buffered { &c.inbuf } else { fresh };
        let mut consumed = 0;
        let mut replies: Vec<&[u8]> = Vec::new();
        let mut close = false;
        loop {
            match proto::parse_request(data) {
                Request::Complete { len, close: asked_close, .. } => {
                    proto::spin_work(self.work_us);
                    replies.push(if asked_close { &self.resp_close } else { &self.resp_keepalive });
                    data = &data[len..];
                    consumed += len;
                    if asked_close {
                        close = true;
                        break;
                    }
                    if data.is_empty() {
                        break;
                    }
                }
                Request::Partial => break,
                Request::Malformed => {
                    replies.push(proto::response_error(400));
                    close = true;
                    break;
                }
                Request::TooLarge => {
                    replies.push(proto::response_error(431));
                    close = true;
                    break;
                }
                Request::Unsupported(status) => {
                    replies.push(proto::response_error(status));
                    close = true;
                    break;
                }
            }
        }
        // Keep an incomplete request head for the next read.
        let rest_start = consumed;
        let mut result = Ok(());
        if close {
            c.inbuf.clear();
        } else if buffered {
            c.inbuf.drain(..rest_start);
        } else {
            c.inbuf.extend_from_slice(&fresh[rest_start..]);
        }
        for r in replies {
            if result.is_ok() {
                result = Self::send_or_queue(c, r);
            }
        }
        if result.is_err() {
            c.out.clear();
            c.out_off = 0;
            close = true;
        }
        c.close_after_write |= close;
    }
}

/// send(2) with MSG_NOSIGNAL, so a reset peer yields EPIPE, not SIGPIPE.
fn send(fd: RawFd, bytes: &[u8]) -> io::Result<usize> {
    // SAFETY: `bytes` is readable for its length; `fd` is an open socket
    // owned by the caller's connection.
    cvt_size(unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) })
}
