//! The event loop that drives every connection of a load run.
//!
//! # Implementation notes
//! One thread owns a mio `Poll` (edge-triggered epoll) and a slab of
//! connections. Each connection is registered once for both readiness
//! directions and never re-registered; closing its socket removes it from
//! epoll, so a connection costs socket, connect, epoll_ctl, send, recv and
//! close, and nothing more.
//!
//! A token carries the slab slot in its low 32 bits and a generation in the
//! high 32, so an event for a connection that closed earlier in the same
//! batch (and whose slot was reused) is recognised and dropped.
//!
//! Deadlines are checked by a scan of all connections every few
//! milliseconds rather than by a timer structure: a scan of 30,000
//! connections costs well under a millisecond, and timeouts are seconds.
//!
//! Under `--rate` every socket has the kernel's receive timestamps on, so
//! each reply's last segment says when it reached the socket. A unit's
//! latency then splits in two: the generator's own lag (from the moment
//! the unit could go out, its intended start or, later, the moment a
//! connection was free for it, to the moment the loop sent it; plus, from
//! the reply's arrival, to the moment the loop read it) and the rest, the
//! server's. A generator that falls behind its schedule, or shares its CPU
//! with a busy process, shows in the first and not in the second. A unit
//! during which its socket retransmitted a segment (`TCP_INFO`: over
//! loopback, the kernel dropped it, as a CPU's full backlog of received
//! packets does) is counted apart and left out of the server's share: it
//! waited out a retransmission timer of 200 ms or more.
//!
//! Invariant: a unit (see the module docs of `load`) that was started with
//! `measured` set is finished exactly once, as a completion or as one
//! error, unless the run's time bound abandons it; `measured_in_flight`
//! counts those not yet finished.

use super::hist::Latencies;
use super::report::{ErrorCounts, ErrorKind, LoadReport};
use super::response::{EchoReader, HttpReader, Progress};
use super::{sys, Plan, Proto};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// The most readiness events taken from one poll.
const EVENTS_PER_POLL_MAX: usize = 1024;

/// Bytes read from a socket at a time.
const READ_BUF_BYTES: usize = 64 * 1024;

/// The longest gap between two deadline scans.
const DEADLINE_SCAN_INTERVAL_MAX: Duration = Duration::from_millis(20);

/// The longest one loop turn spends opening connections outside burst mode,
/// so that replies waiting on open connections are not starved by a long
/// ramp. connect(2) slows down as the ephemeral ports of a source address
/// fill up, so this is a time, not a count.
const DISPATCH_SLICE_MAX: Duration = Duration::from_millis(5);

/// Where a connection is in its exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// connect(2) was issued and has not been seen to complete.
    Connecting,
    /// Part of the request is written.
    Sending,
    /// The request is written; the reply is being read.
    Receiving,
    /// A keep-alive connection waiting for its next request.
    Idle,
}

/// The start of one latency sample.
#[derive(Debug, Clone, Copy)]
struct Unit {
    /// The instant latency is measured from (the intended start under
    /// `--rate`).
    origin: Instant,
    /// Whether the unit started after warm-up and so counts.
    measured: bool,
    /// When the first byte of its request went out.
    sent_at: Option<Instant>,
    /// The earliest the generator could have acted on it: its origin, or
    /// later, when it had to wait for a keep-alive connection to come free.
    ready_at: Instant,
    /// When the generator acted on it: opened its connection, or sent its
    /// request on a keep-alive connection.
    dispatched_at: Instant,
}

enum Reader {
    Http(HttpReader),
    Echo(EchoReader),
}

impl Reader {
    fn feed(&mut self, payload: &[u8], data: &[u8]) -> Progress {
        match self {
            Reader::Http(r) => r.feed(data),
            Reader::Echo(r) => r.feed(payload, data),
        }
    }

    fn eof(&mut self) -> Option<Progress> {
        match self {
            Reader::Http(r) => r.eof(),
            Reader::Echo(_) => None,
        }
    }

    fn reset(&mut self) {
        match self {
            Reader::Http(r) => r.reset(),
            Reader::Echo(r) => r.reset(),
        }
    }
}

struct Conn {
    sock: Socket,
    gen: u32,
    phase: Phase,
    unit: Option<Unit>,
    deadline: Option<Instant>,
    /// Bytes of the request written so far.
    sent: usize,
    reader: Reader,
    /// When the newest bytes read reached the socket (receive timestamps).
    arrived: Option<Instant>,
    /// The socket's retransmitted segments when its unit started.
    retrans_before: u32,
}

/// Open-loop start times: `start + k / rate`, computed from `k` so that no
/// rounding error accumulates.
struct Schedule {
    start: Instant,
    rate: f64,
    k: u64,
}

impl Schedule {
    fn next(&self) -> Instant {
        self.start + Duration::from_secs_f64(self.k as f64 / self.rate)
    }

    /// How many starts fall before `t`: those with `start + k / rate < t`.
    fn starts_before(&self, t: Instant) -> u64 {
        (t.saturating_duration_since(self.start).as_secs_f64() * self.rate).ceil() as u64
    }

    /// Of the starts intended in `[from, to)`: how many there were, and how
    /// many had not been sent by `to` (the generator fell behind: no
    /// connection was free for them, or it did not get the CPU). Such a
    /// start has no reply and no error, so it is counted here.
    fn shortfall(&self, from: Instant, to: Instant) -> (u64, u64) {
        let first = self.starts_before(from);
        let end = self.starts_before(to).max(first);
        (end - first, end.saturating_sub(self.k.max(first)))
    }

    /// Records into `lat` each start intended in `[from, to)` and not sent
    /// by `to`, at its age then: a lower bound of the latency it would have
    /// had, so a run that fell behind shows it in its percentiles instead of
    /// dropping its oldest starts. Past [`UNSENT_SAMPLES_MAX`] starts, every
    /// n-th one stands for n.
    fn record_unsent(&self, from: Instant, to: Instant, lat: &mut Latencies) {
        let first = self.k.max(self.starts_before(from));
        let end = self.starts_before(to);
        let unsent = end.saturating_sub(first);
        let stride = unsent.div_ceil(UNSENT_SAMPLES_MAX).max(1);
        let mut k = first;
        while k < end {
            let n = stride.min(end - k);
            let origin = self.start + Duration::from_secs_f64(k as f64 / self.rate);
            lat.record_n(to.saturating_duration_since(origin), n);
            k += n;
        }
    }
}

/// The most samples [`Schedule::record_unsent`] records one by one.
const UNSENT_SAMPLES_MAX: u64 = 100_000;

fn token(slot: usize, gen: u32) -> Token {
    Token(slot | (gen as usize) << 32)
}

/// The open-loop alarm's token: no connection's (slots stay far below
/// 2^32 - 1).
const ALARM: Token = Token(usize::MAX);

fn untoken(t: Token) -> (usize, u32) {
    (t.0 & 0xffff_ffff, (t.0 >> 32) as u32)
}

struct Engine<'p> {
    plan: &'p Plan,
    poll: Poll,
    conns: Slab<Conn>,
    next_gen: u32,
    next_source: usize,
    /// Keep-alive connections waiting for a request, as (slot, generation);
    /// entries whose connection has since closed are skipped when popped.
    idle: Vec<(usize, u32)>,
    buf: Vec<u8>,
    lat: Latencies,
    /// Latency from the request's first byte out (for connection modes,
    /// where `lat` runs from connect).
    request_lat: Latencies,
    errors: ErrorCounts,
    completed: u64,
    first_error: Option<String>,
    /// Measured units still allowed to start; `None` when only time bounds
    /// the run.
    budget: Option<u64>,
    measured_in_flight: u64,
    measure_start: Instant,
    end: Instant,
    last_finish: Instant,
    schedule: Option<Schedule>,
    /// Wakes the loop at the schedule's next start to the nanosecond (open
    /// loop only).
    alarm: Option<sys::Alarm>,
    /// The most connections to hold open: the concurrency asked for, lowered
    /// when the open-file limit is hit.
    conn_cap: usize,
    max_in_flight: usize,
    /// Receive timestamps are on (open loop): the generator's lag is measured.
    timestamps: bool,
    /// The same moment on both clocks, to place receive timestamps
    /// (`CLOCK_REALTIME`) on the monotonic clock.
    clock_base: ClockBase,
    /// Since when at least one keep-alive connection has been free.
    idle_since: Option<Instant>,
    /// Per completed unit: the generator's own lag (see the module notes).
    generator_lag: Latencies,
    /// Per completed unit none of whose segments was retransmitted: its
    /// latency less the generator's lag.
    server_lat: Latencies,
    /// Completed units during which their socket retransmitted a segment.
    retransmitted: u64,
}

/// One instant read on the monotonic clock and on the real-time clock.
#[derive(Clone, Copy)]
struct ClockBase {
    instant: Instant,
    since_epoch: Duration,
}

impl ClockBase {
    fn now() -> ClockBase {
        let instant = Instant::now();
        let since_epoch =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        ClockBase { instant, since_epoch }
    }

    /// The monotonic instant of a real-time receive timestamp.
    fn instant_of(self, since_epoch: Duration) -> Instant {
        match since_epoch.checked_sub(self.since_epoch) {
            Some(after) => self.instant + after,
            None => {
                self.instant.checked_sub(self.since_epoch - since_epoch).unwrap_or(self.instant)
            }
        }
    }
}

/// Runs `plan` to one of its bounds.
pub(super) fn run(plan: &Plan) -> io::Result<LoadReport> {
    let poll = Poll::new()?;
    let alarm = match plan.rate {
        Some(_) if !plan.spin => {
            let alarm = sys::Alarm::new()?;
            poll.registry().register(
                &mut SourceFd(&alarm.as_raw_fd()),
                ALARM,
                Interest::READABLE,
            )?;
            Some(alarm)
        }
        _ => None,
    };
    let start = Instant::now();
    let measure_start = start + plan.warmup;
    let mut engine = Engine {
        plan,
        poll,
        conns: Slab::with_capacity(plan.concurrency.min(65_536)),
        next_gen: 0,
        next_source: 0,
        idle: Vec::new(),
        buf: vec![0; READ_BUF_BYTES],
        lat: Latencies::new(),
        request_lat: Latencies::new(),
        errors: ErrorCounts::default(),
        completed: 0,
        first_error: None,
        budget: plan.requests,
        measured_in_flight: 0,
        measure_start,
        end: measure_start + plan.duration,
        last_finish: measure_start,
        schedule: plan.rate.map(|rate| Schedule { start, rate, k: 0 }),
        alarm,
        conn_cap: plan.concurrency,
        max_in_flight: 0,
        timestamps: plan.rate.is_some(),
        clock_base: ClockBase::now(),
        idle_since: None,
        generator_lag: Latencies::new(),
        server_lat: Latencies::new(),
        retransmitted: 0,
    };
    engine.run()
}

impl Engine<'_> {
    fn run(&mut self) -> io::Result<LoadReport> {
        let mut events = Events::with_capacity(EVENTS_PER_POLL_MAX);
        let scan_interval = DEADLINE_SCAN_INTERVAL_MAX
            .min(self.plan.connect_timeout / 4)
            .min(self.plan.timeout / 4)
            .max(Duration::from_millis(1));
        let mut next_scan = Instant::now() + scan_interval;
        let stopped_by = loop {
            let now = Instant::now();
            if self.finished() {
                break "requests";
            }
            if now >= self.end {
                break "duration";
            }
            self.dispatch(now);
            if now >= next_scan {
                self.expire(now);
                next_scan = now + scan_interval;
            }
            let (mut timeout, on_schedule) = self.poll_timeout(now, next_scan);
            if on_schedule && self.plan.spin {
                timeout = Duration::ZERO;
            } else if on_schedule && !timeout.is_zero() {
                // epoll_wait rounds the timeout up to a millisecond; the
                // alarm wakes the poll at the start itself.
                if let Some(alarm) = &self.alarm {
                    alarm.arm(timeout)?;
                }
            }
            match self.poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            for ev in events.iter() {
                if ev.token() == ALARM {
                    if let Some(alarm) = &self.alarm {
                        let _ = alarm.clear();
                    }
                    continue;
                }
                let (slot, gen) = untoken(ev.token());
                match self.conns.get(slot) {
                    // The clock is read per event, so that a reply's latency
                    // ends when it is read, not when its batch arrived.
                    Some(c) if c.gen == gen => self.on_event(
                        slot,
                        ev.is_writable(),
                        ev.is_read_closed() || ev.is_error(),
                        Instant::now(),
                    ),
                    _ => {}
                }
            }
        };
        let end =
            if stopped_by == "requests" { self.last_finish } else { self.end.min(Instant::now()) };
        let elapsed_s = end.saturating_duration_since(self.measure_start).as_secs_f64();
        let (offered, not_sent) = match &self.schedule {
            Some(s) if stopped_by == "duration" => {
                let (offered, not_sent) = s.shortfall(self.measure_start, end);
                s.record_unsent(self.measure_start, end, &mut self.lat);
                (Some(offered), Some(not_sent))
            }
            // A count-bound run sends every start it was given.
            Some(_) => (self.plan.requests, Some(0)),
            None => (None, None),
        };
        // Started, measured, and neither answered nor failed when time ran out.
        let unfinished = if stopped_by == "duration" { self.measured_in_flight } else { 0 };
        // Close every connection before reporting.
        self.conns.clear();
        let plan = self.plan;
        Ok(LoadReport {
            mode: plan.mode,
            proto: plan.proto,
            connections: plan.concurrency as u64,
            completed: self.completed,
            errors: self.errors,
            elapsed_s,
            rate_per_s: if elapsed_s > 0.0 { self.completed as f64 / elapsed_s } else { 0.0 },
            latency_us: self.lat.summary(),
            request_latency_us: (plan.mode != super::Mode::Keepalive)
                .then(|| self.request_lat.summary()),
            histogram_us: self.lat.buckets(),
            generator_lag_us: self.timestamps.then(|| self.generator_lag.summary()),
            server_latency_us: self.timestamps.then(|| self.server_lat.summary()),
            retransmitted: self.timestamps.then_some(self.retransmitted),
            target_rate_per_s: plan.rate,
            offered,
            not_sent,
            unfinished,
            max_in_flight: self.max_in_flight as u64,
            sources: plan.sources.len().max(1) as u64,
            fd_limit: 0,
            cpu_s: 0.0,
            stopped_by: stopped_by.to_string(),
            first_error: self.first_error.take(),
        })
    }

    fn finished(&self) -> bool {
        self.budget == Some(0) && self.measured_in_flight == 0
    }

    /// How long the next poll may sleep, and whether the wake is the
    /// open-loop schedule's next start.
    fn poll_timeout(&self, now: Instant, next_scan: Instant) -> (Duration, bool) {
        if self.finished() {
            return (Duration::ZERO, false);
        }
        let mut until = self.end.min(next_scan);
        let room = if self.plan.one_per_connection {
            self.conns.len() < self.conn_cap
        } else {
            !self.idle.is_empty() || self.conns.len() < self.conn_cap
        };
        let mut on_schedule = false;
        if room && self.budget != Some(0) {
            match &self.schedule {
                Some(s) => {
                    let next = s.next();
                    if next < until {
                        until = next;
                        on_schedule = true;
                    }
                }
                // A closed loop with room left means the dispatch slice
                // ran out: come straight back.
                None => until = now,
            }
        }
        (until.saturating_duration_since(now), on_schedule)
    }

    /// Starts whatever the mode, the bounds and the schedule allow now.
    ///
    /// Each start reads the clock: a unit's origin is its own start, and a
    /// long ramp stops at the run's end (and, outside burst, after
    /// [`DISPATCH_SLICE_MAX`]) instead of overshooting it.
    fn dispatch(&mut self, turn_start: Instant) {
        let slice_end = if self.plan.mode == super::Mode::Burst {
            self.end
        } else {
            self.end.min(turn_start + DISPATCH_SLICE_MAX)
        };
        let mut now = turn_start;
        if self.plan.one_per_connection {
            while self.conns.len() < self.conn_cap && now < slice_end {
                let Some(unit) = self.next_unit(now, None) else {
                    break;
                };
                match self.open(now) {
                    Ok(slot) => {
                        self.conns[slot].unit = Some(unit);
                        self.on_writable(slot, now);
                    }
                    Err((kind, e)) => self.finish_unit(unit, Some((kind, &e)), now),
                }
                now = Instant::now();
            }
            return;
        }
        while self.conns.len() < self.conn_cap && now < slice_end && self.budget != Some(0) {
            if let Err((kind, e)) = self.open(now) {
                self.connection_failed(kind, &e, now);
            }
            now = Instant::now();
        }
        while let Some(&(slot, gen)) = self.idle.last() {
            let live =
                matches!(self.conns.get(slot), Some(c) if c.gen == gen && c.phase == Phase::Idle);
            if !live {
                self.idle.pop();
                continue;
            }
            let Some(unit) = self.next_unit(now, self.idle_since) else {
                break;
            };
            self.idle.pop();
            if self.idle.is_empty() {
                self.idle_since = None;
            }
            let c = &mut self.conns[slot];
            c.unit = Some(unit);
            c.phase = Phase::Sending;
            c.sent = 0;
            c.deadline = Some(now + self.plan.timeout);
            c.arrived = None;
            if self.timestamps {
                c.retrans_before = sys::tcp_total_retrans(&c.sock).unwrap_or(0);
            }
            c.reader.reset();
            self.on_writable(slot, now);
            now = Instant::now();
        }
    }

    /// Takes the next unit's start if the budget and the schedule allow one
    /// now. `free_since` is when the connection it will use came free, for
    /// a keep-alive unit.
    fn next_unit(&mut self, now: Instant, free_since: Option<Instant>) -> Option<Unit> {
        if self.budget == Some(0) {
            return None;
        }
        let origin = match &mut self.schedule {
            None => now,
            Some(s) => {
                let next = s.next();
                if next > now {
                    return None;
                }
                s.k += 1;
                next
            }
        };
        let measured = origin >= self.measure_start;
        if measured {
            if let Some(b) = &mut self.budget {
                *b -= 1;
            }
            self.measured_in_flight += 1;
        }
        let ready_at = free_since.map_or(origin, |f| f.max(origin)).min(now);
        Some(Unit { origin, measured, sent_at: None, ready_at, dispatched_at: now })
    }

    /// Opens a non-blocking connection and registers it; returns its slot.
    fn open(&mut self, now: Instant) -> Result<usize, (ErrorKind, io::Error)> {
        let plan = self.plan;
        let timestamps = self.timestamps;
        let sock = Socket::new(
            Domain::for_address(plan.addr),
            Type::STREAM.nonblocking(),
            Some(Protocol::TCP),
        )
        .map_err(|e| {
            let kind = ErrorKind::of(&e, true);
            if kind == ErrorKind::FdLimit {
                self.fd_limit_hit();
            }
            (kind, e)
        })?;
        let connect_err = |e: io::Error| (ErrorKind::of(&e, true), e);
        if timestamps {
            sys::enable_rx_timestamps(&sock).map_err(|e| (ErrorKind::Other, e))?;
        }
        if !plan.sources.is_empty() {
            let src = plan.sources[self.next_source % plan.sources.len()];
            self.next_source = self.next_source.wrapping_add(1);
            sys::set_bind_address_no_port(&sock).map_err(connect_err)?;
            sock.bind(&SockAddr::from(src)).map_err(connect_err)?;
        }
        match sock.connect(&SockAddr::from(plan.addr)) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(connect_err(e)),
        }
        let entry = self.conns.vacant_entry();
        let slot = entry.key();
        let gen = self.next_gen;
        self.next_gen = self.next_gen.wrapping_add(1);
        self.poll
            .registry()
            .register(
                &mut SourceFd(&sock.as_raw_fd()),
                token(slot, gen),
                Interest::READABLE | Interest::WRITABLE,
            )
            .map_err(|e| (ErrorKind::Other, e))?;
        let reader = match plan.proto {
            Proto::Http => Reader::Http(HttpReader::new()),
            Proto::Echo => Reader::Echo(EchoReader::new()),
        };
        entry.insert(Conn {
            sock,
            gen,
            phase: Phase::Connecting,
            unit: None,
            deadline: Some(now + plan.connect_timeout),
            sent: 0,
            reader,
            arrived: None,
            retrans_before: 0,
        });
        self.max_in_flight = self.max_in_flight.max(self.conns.len());
        Ok(slot)
    }

    /// Holds the connection count where it is after EMFILE or ENFILE.
    fn fd_limit_hit(&mut self) {
        let cap = self.conns.len().max(1);
        if cap < self.conn_cap {
            if !self.plan.quiet {
                eprintln!(
                    "hotloop-bench load: warning: the open-file limit stopped new connections at {}; \
                     continuing with at most {cap} (ask for fewer --connections)",
                    self.conns.len()
                );
            }
            self.conn_cap = cap;
        }
    }

    fn on_event(&mut self, slot: usize, writable: bool, closing: bool, now: Instant) {
        match self.conns[slot].phase {
            Phase::Connecting if self.conns[slot].unit.is_none() => {
                self.on_connected(slot, writable, now)
            }
            Phase::Connecting | Phase::Sending => {
                self.on_writable(slot, now);
                // Read too: a large echo comes back while it is still being
                // sent, and with both sides' buffers full neither would move
                // again; and under edge triggering an edge not acted on now
                // is not reported again.
                if matches!(self.conns.get(slot), Some(c) if c.phase != Phase::Connecting) {
                    self.on_readable(slot, closing, now);
                }
            }
            Phase::Receiving => self.on_readable(slot, closing, now),
            Phase::Idle => self.on_idle_event(slot),
        }
    }

    /// A keep-alive connection without a request reported readiness while
    /// connecting: it is established or has failed.
    fn on_connected(&mut self, slot: usize, writable: bool, now: Instant) {
        let c = &mut self.conns[slot];
        match c.sock.take_error() {
            Ok(None) if writable => {
                c.phase = Phase::Idle;
                c.deadline = None;
                let gen = c.gen;
                self.push_idle(slot, gen, now);
            }
            Ok(None) => {}
            Ok(Some(e)) | Err(e) => {
                self.conns.remove(slot);
                self.connection_failed(ErrorKind::Connect, &e, now);
            }
        }
    }

    /// Writes what is left of the request.
    fn on_writable(&mut self, slot: usize, now: Instant) {
        let req = &self.plan.request;
        loop {
            let c = &mut self.conns[slot];
            match c.sock.send_with_flags(&req[c.sent..], libc::MSG_NOSIGNAL) {
                Ok(n) => {
                    if let Some(u) = c.unit.as_mut().filter(|u| u.sent_at.is_none()) {
                        u.sent_at = Some(now);
                    }
                    if c.phase == Phase::Connecting {
                        c.deadline = Some(now + self.plan.timeout);
                    }
                    c.sent += n;
                    if c.sent == req.len() {
                        c.phase = Phase::Receiving;
                        return;
                    }
                    c.phase = Phase::Sending;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let kind = ErrorKind::of(&e, c.phase == Phase::Connecting);
                    return self.fail(slot, kind, &e, now);
                }
            }
        }
    }

    /// Reads the reply until the socket is drained or the reply is decided.
    /// `closing` says the event carried a hang-up, so reading must go on to
    /// end of file: no later edge will report it.
    fn on_readable(&mut self, slot: usize, closing: bool, now: Instant) {
        let base = self.clock_base;
        loop {
            let c = &mut self.conns[slot];
            let read = if self.timestamps {
                sys::recv_timestamped(&c.sock, &mut self.buf).map(|(n, stamp)| {
                    if let Some(stamp) = stamp {
                        c.arrived = Some(base.instant_of(stamp));
                    }
                    n
                })
            } else {
                (&c.sock).read(&mut self.buf)
            };
            let progress = match read {
                Ok(0) => match c.reader.eof() {
                    Some(p) => p,
                    None => {
                        let e = io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the server closed the connection before the whole reply",
                        );
                        return self.fail(slot, ErrorKind::ShortRead, &e, now);
                    }
                },
                Ok(n) => match c.reader.feed(&self.plan.request, &self.buf[..n]) {
                    // A short read means the socket was drained; the next
                    // bytes will raise a new edge.
                    Progress::More if n < self.buf.len() && !closing => return,
                    Progress::More => continue,
                    p => p,
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return self.fail(slot, ErrorKind::of(&e, false), &e, now),
            };
            return match progress {
                Progress::More => {}
                Progress::Done { close } => self.complete(slot, close, now),
                Progress::Status(code) => {
                    let e = io::Error::other(format!("HTTP status {code}"));
                    self.fail(slot, ErrorKind::BadResponse, &e, now)
                }
                Progress::Bad(reason) => {
                    let e = io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("bad reply: {reason:?}"),
                    );
                    self.fail(slot, ErrorKind::BadResponse, &e, now)
                }
            };
        }
    }

    /// An idle keep-alive connection became readable: the server closed it
    /// or sent bytes nobody asked for. Either way it is replaced.
    fn on_idle_event(&mut self, slot: usize) {
        match (&self.conns[slot].sock).read(&mut self.buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            _ => {
                self.conns.remove(slot);
            }
        }
    }

    fn complete(&mut self, slot: usize, close: bool, now: Instant) {
        // The reply reached the socket at its arrival, however late the
        // loop read it; never after the read, whatever the clocks say.
        let c = &self.conns[slot];
        let arrived = c.arrived.map(|a| a.min(now));
        let retransmitted =
            self.timestamps && sys::tcp_total_retrans(&c.sock).is_ok_and(|n| n > c.retrans_before);
        if let Some(unit) = self.conns[slot].unit.take() {
            self.finish_unit_at(unit, None, now, Some(Reply { arrived, retransmitted }));
        }
        if self.plan.one_per_connection || close {
            self.conns.remove(slot);
        } else {
            let c = &mut self.conns[slot];
            c.phase = Phase::Idle;
            c.deadline = None;
            let gen = c.gen;
            // From the server's side the connection was free once its reply
            // had arrived.
            self.push_idle(slot, gen, arrived.unwrap_or(now));
        }
    }

    /// Files a keep-alive connection, free since `free_at`, as idle.
    fn push_idle(&mut self, slot: usize, gen: u32, free_at: Instant) {
        self.idle_since = Some(self.idle_since.map_or(free_at, |s| s.min(free_at)));
        self.idle.push((slot, gen));
    }

    /// Closes a connection that failed, charging the failure to its unit.
    fn fail(&mut self, slot: usize, kind: ErrorKind, e: &io::Error, now: Instant) {
        let c = self.conns.remove(slot);
        match c.unit {
            Some(unit) => self.finish_unit(unit, Some((kind, e)), now),
            None => self.connection_failed(kind, e, now),
        }
    }

    /// A keep-alive connection failed before carrying a request. It counts
    /// as one failed request, so that a server refusing every connection
    /// still ends a run bounded by `--requests`.
    fn connection_failed(&mut self, kind: ErrorKind, e: &io::Error, now: Instant) {
        if now < self.measure_start || self.budget == Some(0) {
            return;
        }
        if let Some(b) = &mut self.budget {
            *b -= 1;
        }
        self.last_finish = now;
        self.record_error(kind, e);
    }

    fn finish_unit(&mut self, unit: Unit, error: Option<(ErrorKind, &io::Error)>, now: Instant) {
        self.finish_unit_at(unit, error, now, None);
    }

    /// Finishes `unit` at `now`, with what is known of its reply.
    fn finish_unit_at(
        &mut self,
        unit: Unit,
        error: Option<(ErrorKind, &io::Error)>,
        now: Instant,
        reply: Option<Reply>,
    ) {
        if !unit.measured {
            return;
        }
        self.measured_in_flight -= 1;
        self.last_finish = now;
        match error {
            None => {
                self.completed += 1;
                let latency = now.saturating_duration_since(unit.origin);
                self.lat.record(latency);
                if let Some(sent) = unit.sent_at {
                    self.request_lat.record(now.saturating_duration_since(sent));
                }
                if self.timestamps {
                    let reply = reply.unwrap_or_default();
                    let lag = generator_lag(&unit, reply.arrived, now);
                    self.generator_lag.record(lag);
                    // A dropped segment waits out the kernel's retransmission
                    // timer (200 ms at least): that is the host's, counted
                    // apart, not the server's.
                    if reply.retransmitted {
                        self.retransmitted += 1;
                    } else {
                        self.server_lat.record(latency.saturating_sub(lag));
                    }
                }
            }
            Some((kind, e)) => self.record_error(kind, e),
        }
    }

    fn record_error(&mut self, kind: ErrorKind, e: &io::Error) {
        self.errors.add(kind);
        if self.first_error.is_none() {
            self.first_error = Some(format!("{}: {e}", kind.as_str()));
        }
    }

    /// Fails every connection whose deadline has passed.
    fn expire(&mut self, now: Instant) {
        let late: Vec<(usize, Phase)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(slot, c)| (slot, c.phase))
            .collect();
        for (slot, phase) in late {
            let (kind, e) = if phase == Phase::Connecting {
                (
                    ErrorKind::Connect,
                    io::Error::new(io::ErrorKind::TimedOut, "no answer within --connect-timeout"),
                )
            } else {
                (
                    ErrorKind::Timeout,
                    io::Error::new(io::ErrorKind::TimedOut, "no whole reply within --timeout"),
                )
            };
            self.fail(slot, kind, &e, now);
        }
    }
}

/// What the generator knows of a reply once it is whole.
#[derive(Debug, Clone, Copy, Default)]
struct Reply {
    /// When its last bytes reached the socket (receive timestamps).
    arrived: Option<Instant>,
    /// Whether the socket retransmitted a segment while the unit ran.
    retransmitted: bool,
}

/// The generator's own share of a unit finished at `done`: from when it
/// could go out to when the loop acted on it, and from its reply's arrival
/// (when known) to the read that completed it.
fn generator_lag(unit: &Unit, arrived: Option<Instant>, done: Instant) -> Duration {
    let send = unit.dispatched_at.saturating_duration_since(unit.ready_at);
    let read = arrived.map_or(Duration::ZERO, |a| done.saturating_duration_since(a));
    send + read
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generators_lag_is_its_late_send_and_its_late_read() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let unit = Unit {
            origin: t0,
            measured: true,
            sent_at: Some(t0 + ms(3)),
            // A connection came free 1 ms after the intended start, and the
            // loop sent 2 ms after that.
            ready_at: t0 + ms(1),
            dispatched_at: t0 + ms(3),
        };
        // The reply arrived at 10 ms and was read at 14 ms.
        assert_eq!(generator_lag(&unit, Some(t0 + ms(10)), t0 + ms(14)), ms(6));
        assert_eq!(generator_lag(&unit, None, t0 + ms(14)), ms(2));
    }

    #[test]
    fn receive_timestamps_land_on_the_monotonic_clock() {
        let base = ClockBase::now();
        let later = base.instant_of(base.since_epoch + Duration::from_millis(5));
        assert_eq!(later - base.instant, Duration::from_millis(5));
        let earlier = base.instant_of(base.since_epoch - Duration::from_millis(5));
        assert_eq!(base.instant - earlier, Duration::from_millis(5));
    }

    #[test]
    fn tokens_round_trip() {
        for (slot, gen) in [(0, 0), (1, 7), (0xffff_ffff, u32::MAX), (12345, 1 << 31)] {
            assert_eq!(untoken(token(slot, gen)), (slot, gen));
        }
    }

    #[test]
    fn starts_the_generator_did_not_send_are_counted() {
        let start = Instant::now();
        let s = |k| Schedule { start, rate: 1_000.0, k };
        let ms = Duration::from_millis;
        // Measured from 100 ms to 600 ms: starts 100 to 599, 500 of them.
        // A generator that kept up had taken all 600 (warm-up included).
        assert_eq!(s(600).shortfall(start + ms(100), start + ms(600)), (500, 0));
        // One that sent only 350 left 250 due starts unsent.
        assert_eq!(s(350).shortfall(start + ms(100), start + ms(600)), (500, 250));
        // One that never got past the warm-up sent none of the measured.
        assert_eq!(s(40).shortfall(start + ms(100), start + ms(600)), (500, 500));
        // A start exactly at the end is not yet due.
        assert_eq!(s(0).shortfall(start, start + ms(1)), (1, 1));
    }

    #[test]
    fn starts_not_sent_are_in_the_latencies_at_their_age() {
        let start = Instant::now();
        let ms = Duration::from_millis;
        // 250 starts, due at 350 to 599 ms, unsent at 600 ms: ages 1 to 250 ms.
        let s = Schedule { start, rate: 1_000.0, k: 350 };
        let mut lat = Latencies::new();
        s.record_unsent(start + ms(100), start + ms(600), &mut lat);
        assert_eq!(lat.count(), 250);
        let summary = lat.summary();
        assert!((249_000.0..=251_000.0).contains(&summary.max), "{summary:?}");
        assert!((124_000.0..=127_000.0).contains(&summary.p50), "{summary:?}");
        // Far more than are recorded one by one: each stands for a few.
        let s = Schedule { start, rate: 1_000_000.0, k: 0 };
        let mut lat = Latencies::new();
        s.record_unsent(start, start + ms(250), &mut lat);
        assert_eq!(lat.count(), 250_000);
    }

    #[test]
    fn schedule_does_not_drift() {
        let start = Instant::now();
        let s = Schedule { start, rate: 3.0, k: 3_000_000 };
        assert_eq!(s.next() - start, Duration::from_secs(1_000_000));
    }
}
