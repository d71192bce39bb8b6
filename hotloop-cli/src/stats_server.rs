//! The live counters over HTTP, the way haproxy's `show info` reports its
//! poller: `GET /stats` (JSON) and `GET /metrics` (Prometheus text, with
//! `# HELP` and `# TYPE` for every family).
//!
//! The endpoint is served by the runtime itself: an accept loop and a
//! once-a-second rate sampler run as tasks on worker 0, and each scrape is a
//! task of its own, so a slow client holds only its own connection (until
//! [`HEADER_TIMEOUT`], then [`WRITE_TIMEOUT`]) and never delays another
//! scrape.
//!
//! # Implementation notes
//!
//! - Reading the counters is a relaxed load of each worker's atomics
//!   ([`hotloop::Handle::stats`]); it never waits for another worker.
//! - At most [`CONNECTIONS_MAX`] connections are held at once. A new one
//!   beyond that closes the oldest connection still waiting for its
//!   request head (a silent client), so silent connections cannot keep
//!   scrapes out; if every held connection is being answered, the new one
//!   is closed. A flood of clients costs worker 0 a bounded amount of
//!   memory and descriptors.
//! - Only `GET` and `HEAD` are answered (`HEAD` without the body); other
//!   methods get 405, bytes that are not an HTTP/1.x request 400, a head
//!   not whole within [`HEADER_TIMEOUT`] 408 (a connection that sent
//!   nothing is just closed), a head over [`REQUEST_HEAD_MAX_BYTES`] 431.
//! - The endpoint's listener does not count in the runtime's `accepted`
//!   (nor its wakeups): those counters are the served application's. The
//!   `stats_scrapes` field says how many connections the endpoint took.
//! - Dropping the [`StatsServer`] sets a flag and makes one connection to
//!   the endpoint so that the accept loop wakes, sees it and ends.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use hotloop::net::{ListenerOptions, TcpListener, TcpStream};
use hotloop::time::{interval, timeout_at};
use hotloop::{Handle, JoinHandle};
use hotloop_proto::{Method, ParseOptions, Request};

/// How long a scrape may take to send its whole request head (counted
/// from its connection); then 408, or a close if it sent nothing.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// How long writing the answer may take once the head is read.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// After an answer, the longest the endpoint reads and drops what a client
/// still sends, and the most it reads, before closing (see [`linger`]).
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES_MAX: usize = 64 * 1024;
/// The most connections the endpoint holds at once (see the module notes).
pub const CONNECTIONS_MAX: usize = 16;
/// The most bytes of a scrape's request head; a longer one gets 431.
pub const REQUEST_HEAD_MAX_BYTES: usize = 2048;
/// How long starting the endpoint may take before it is reported as failed.
const START_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether a field only grows (a Prometheus counter) or goes up and down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows; exported as `hotloop_NAME_total`.
    Counter,
    /// Goes up and down; exported as `hotloop_NAME`.
    Gauge,
}

/// A field a command adds to the runtime's counters.
#[derive(Debug, Clone, Copy)]
pub struct Extra {
    /// The JSON key; the Prometheus name is `hotloop_` + this (+ `_total` for a counter).
    pub name: &'static str,
    /// The `# HELP` text.
    pub help: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
    /// The value now.
    pub value: u64,
}

/// The fields a command adds to the snapshot, read at each scrape.
pub type ExtraFields = Arc<dyn Fn() -> Vec<Extra> + Send + Sync>;

/// Reads a count: the connections a command accepted, when the runtime's
/// `accepted` does not see them (see [`StatsServer::start`]).
pub type Count = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Connection rate sampled once a second.
#[derive(Debug, Default, Clone, Copy)]
struct Rates {
    last_accepted: u64,
    per_second: u64,
    peak_per_second: u64,
}

/// A running stats endpoint; stops when dropped.
pub struct StatsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl StatsServer {
    /// Starts serving `handle`'s counters on `addr`, on worker 0 of its
    /// runtime. The connection rate counts `accepted`'s connections if
    /// given (a QUIC server's, which no listener accepts), else the
    /// runtime's `accepted`.
    pub fn start(
        addr: &str,
        handle: Handle,
        extra: ExtraFields,
        accepted: Option<Count>,
    ) -> std::io::Result<StatsServer> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let addr = addr.to_string();
        let (task_stop, task_handle) = (stop.clone(), handle.clone());
        let accepted: Count = accepted.unwrap_or_else(|| {
            let handle = handle.clone();
            Arc::new(move || handle.stats().total.accepted)
        });
        // The join handle is not kept: the tasks end when `stop` is set or the runtime stops.
        drop(handle.spawn_on(0, move || serve(addr, task_handle, extra, accepted, task_stop, tx)));
        match rx.recv_timeout(START_TIMEOUT) {
            Ok(Ok(local)) => Ok(StatsServer { addr: local, stop }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the stats endpoint did not start on worker 0 within 5 s",
            )),
        }
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StatsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so it sees the flag; it may already be gone.
        let _ = std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

/// A connection the endpoint holds: its task, and whether it is still
/// waiting for its request head (and so may be closed to make room).
struct Held {
    id: u64,
    task: JoinHandle<()>,
    reading: Rc<Cell<bool>>,
}

/// The endpoint's accept loop, on worker 0.
async fn serve(
    addr: String,
    handle: Handle,
    extra: ExtraFields,
    accepted: Count,
    stop: Arc<AtomicBool>,
    started: mpsc::Sender<std::io::Result<SocketAddr>>,
) {
    // Scrapes are not the served application's connections.
    let options = ListenerOptions { count_in_stats: false, ..Default::default() };
    let bound = TcpListener::bind_with(addr.as_str(), options);
    let listener = match bound.and_then(|l| Ok((l.local_addr()?, l))) {
        Ok((local, listener)) => {
            let _ = started.send(Ok(local));
            listener
        }
        Err(e) => {
            let _ = started.send(Err(e));
            return;
        }
    };
    let rates = Rc::new(Cell::new(Rates::default()));
    let sampler = hotloop::spawn(sample_rates(accepted, rates.clone(), stop.clone()));
    let held: Rc<RefCell<VecDeque<Held>>> = Rc::default();
    let mut scrapes = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Ok(conn) = listener.accept_stream().await else { continue };
        scrapes += 1;
        if stop.load(Ordering::Relaxed) || !make_room(&held) {
            continue; // dropping `conn` closes it
        }
        let reading = Rc::new(Cell::new(true));
        let task = {
            let (handle, extra, rates) = (handle.clone(), extra.clone(), rates.clone());
            let (held, reading) = (held.clone(), reading.clone());
            hotloop::spawn(async move {
                answer(conn, &handle, rates.get(), scrapes, &*extra, &reading).await;
                held.borrow_mut().retain(|h| h.id != scrapes);
            })
        };
        // The task has not run yet: it is queued behind this loop.
        held.borrow_mut().push_back(Held { id: scrapes, task, reading });
    }
    sampler.abort();
    for h in held.take() {
        h.task.abort();
    }
}

/// Makes room for one more connection: true if there is some, or if the
/// oldest connection still waiting for its head was closed for it.
fn make_room(held: &RefCell<VecDeque<Held>>) -> bool {
    let oldest_reading = {
        let mut held = held.borrow_mut();
        if held.len() < CONNECTIONS_MAX {
            return true;
        }
        match held.iter().position(|h| h.reading.get()) {
            Some(i) => held.remove(i),
            None => return false,
        }
    };
    // Outside the borrow: dropping the task's future closes its connection.
    if let Some(h) = oldest_reading {
        h.task.abort();
    }
    true
}

/// Samples the accepted count once a second.
async fn sample_rates(accepted: Count, rates: Rc<Cell<Rates>>, stop: Arc<AtomicBool>) {
    let mut tick = interval(Duration::from_secs(1));
    tick.tick().await; // the first tick is immediate
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let accepted = accepted();
        let mut r = rates.get();
        r.per_second = accepted - r.last_accepted;
        r.peak_per_second = r.peak_per_second.max(r.per_second);
        r.last_accepted = accepted;
        rates.set(r);
    }
}

/// What a request head asks for: a method the endpoint answers, or the
/// error status to answer with. `None` when there is nothing to answer
/// (the client closed or stayed silent before sending a byte).
async fn read_head(conn: &TcpStream, head: &mut Vec<u8>) -> Option<Result<Method, u16>> {
    let deadline = Instant::now() + HEADER_TIMEOUT;
    let options = ParseOptions { allow_head: true, ..Default::default() };
    loop {
        if !head.is_empty() {
            match hotloop_proto::parse_request_with(head, options) {
                (Request::Complete { .. }, method) => return Some(Ok(method)),
                (Request::Partial, _) if head.len() < REQUEST_HEAD_MAX_BYTES => {}
                (Request::Partial | Request::TooLarge, _) => return Some(Err(431)),
                (Request::Malformed, _) => return Some(Err(400)),
                (Request::Unsupported(status), _) => return Some(Err(status)),
            }
        }
        match timeout_at(deadline, conn.read_pooled()).await {
            Ok(Ok(buf)) if !buf.is_empty() => head.extend_from_slice(&buf),
            // Closed or failed: a head cut short is answered, in case the
            // client only shut down its writing side.
            Ok(_) => return (!head.is_empty()).then_some(Err(400)),
            Err(_) => return (!head.is_empty()).then_some(Err(408)),
        }
    }
}

/// An error answer that closes the connection.
fn error_reply(status: u16) -> String {
    let (status, reason, allow) = match status {
        405 => (405, "Method Not Allowed", "Allow: GET, HEAD\r\n"),
        408 => (408, "Request Timeout", ""),
        413 => (413, "Content Too Large", ""),
        431 => (431, "Request Header Fields Too Large", ""),
        501 => (501, "Not Implemented", ""),
        505 => (505, "HTTP Version Not Supported", ""),
        _ => (400, "Bad Request", ""),
    };
    format!("HTTP/1.1 {status} {reason}\r\n{allow}Content-Length: 0\r\nConnection: close\r\n\r\n")
}

/// Reads one request head (within [`HEADER_TIMEOUT`]) and answers it;
/// `reading` is cleared once the head is in.
async fn answer(
    conn: TcpStream,
    handle: &Handle,
    rates: Rates,
    scrapes: u64,
    extra: &(dyn Fn() -> Vec<Extra> + Send + Sync),
    reading: &Cell<bool>,
) {
    let mut head: Vec<u8> = Vec::new();
    let Some(request) = read_head(&conn, &mut head).await else { return };
    reading.set(false);
    let reply = match request {
        Err(status) => error_reply(status),
        Ok(method) => {
            let path = hotloop_proto::request_path(&head);
            let (status, ctype, body) = match path {
                "/stats" | "/" => {
                    ("200 OK", "application/json", json(handle, &fields(extra, rates, scrapes)))
                }
                "/metrics" => (
                    "200 OK",
                    "text/plain; version=0.0.4",
                    prometheus(handle, &fields(extra, rates, scrapes)),
                ),
                _ => ("404 Not Found", "text/plain", "try /stats or /metrics\n".to_string()),
            };
            let mut reply = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            // HEAD: the head a GET would get, with its length, and no body.
            if method == Method::Get {
                reply.push_str(&body);
            }
            reply
        }
    };
    let sent =
        timeout_at(Instant::now() + WRITE_TIMEOUT, conn.write_all_owned(reply.into_bytes())).await;
    if let Ok((Ok(_), _)) = sent {
        linger(&conn).await;
    }
}

/// After the answer: shuts down writing, then reads and drops what the
/// client still sends (a body, a pipelined request, the rest of a head too
/// long), within [`LINGER`] and [`LINGER_BYTES_MAX`]. Closing with unread
/// bytes would send a reset, which can destroy the answer before the
/// client has read it (nginx's `lingering_close`; the servers' error
/// replies do the same).
async fn linger(conn: &TcpStream) {
    if conn.shutdown_with(std::net::Shutdown::Write).await.is_err() {
        return;
    }
    let until = Instant::now() + LINGER;
    let mut drained = 0;
    while drained < LINGER_BYTES_MAX {
        match timeout_at(until, conn.read_pooled()).await {
            Ok(Ok(buf)) if !buf.is_empty() => drained += buf.len(),
            _ => return,
        }
    }
}

/// The endpoint's own fields, after the command's.
fn fields(
    extra: &(dyn Fn() -> Vec<Extra> + Send + Sync),
    rates: Rates,
    scrapes: u64,
) -> Vec<Extra> {
    let mut fields = extra();
    fields.push(Extra {
        name: "connection_rate_per_second",
        help: "Connections accepted in the last whole second.",
        kind: Kind::Gauge,
        value: rates.per_second,
    });
    fields.push(Extra {
        name: "connection_rate_peak_per_second",
        help: "The most connections accepted in one second since start.",
        kind: Kind::Gauge,
        value: rates.peak_per_second,
    });
    fields.push(Extra {
        name: "stats_scrapes",
        help: "Connections to this stats endpoint, this one included (not counted in accepted).",
        kind: Kind::Counter,
        value: scrapes,
    });
    fields
}

/// The runtime's snapshot as JSON with the extra fields at the top level.
fn json(handle: &Handle, fields: &[Extra]) -> String {
    let mut json = handle.stats().to_json();
    json.pop(); // the closing brace
    for f in fields {
        let _ = write!(json, ",\"{}\":{}", f.name, f.value);
    }
    json.push('}');
    json
}

/// The runtime's snapshot in the Prometheus text format, then the extra fields.
fn prometheus(handle: &Handle, fields: &[Extra]) -> String {
    let mut text = handle.stats().to_prometheus();
    prometheus_fields(&mut text, fields);
    text
}

/// The extra fields in the Prometheus text format, each family with its
/// `# HELP` (escaped: a help text may carry a group name from a
/// configuration file) and `# TYPE`.
fn prometheus_fields(text: &mut String, fields: &[Extra]) {
    for f in fields {
        let (name, kind) = match f.kind {
            Kind::Counter => (format!("hotloop_{}_total", f.name), "counter"),
            Kind::Gauge => (format!("hotloop_{}", f.name), "gauge"),
        };
        let help = escape_help(f.help);
        let _ = write!(text, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}\n", f.value);
    }
}

/// `# HELP` text as the exposition format wants it: backslash and newline escaped.
fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A help text with a newline or a backslash (a group name from a
    /// configuration file) stays on its line, escaped.
    #[test]
    fn help_texts_are_escaped() {
        let mut text = String::new();
        let help = "Backend 127.0.0.1:1 of group a\nb\\c.";
        let field = Extra { name: "backend_a_b_c_0_requests", help, kind: Kind::Counter, value: 3 };
        prometheus_fields(&mut text, &[field]);
        assert_eq!(
            text,
            "# HELP hotloop_backend_a_b_c_0_requests_total Backend 127.0.0.1:1 of group a\\nb\\\\c.\n\
             # TYPE hotloop_backend_a_b_c_0_requests_total counter\n\
             hotloop_backend_a_b_c_0_requests_total 3\n"
        );
    }
}
