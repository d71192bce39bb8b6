//! The live counters over HTTP, the way haproxy's `show info` reports its
//! poller: `GET /stats` (JSON) and `GET /metrics` (Prometheus text, with
//! `# HELP` and `# TYPE` for every family).
//!
//! The endpoint is served by the runtime itself: an accept loop and a
//! once-a-second rate sampler run as tasks on worker 0, and each scrape is a
//! task of its own, so a slow client holds only its own connection (until
//! [`REQUEST_TIMEOUT`]) and never delays another scrape.
//!
//! # Implementation notes
//!
//! - Reading the counters is a relaxed load of each worker's atomics
//!   ([`hotloop::Handle::stats`]); it never waits for another worker.
//! - At most [`SCRAPES_IN_FLIGHT_MAX`] scrapes are answered at once; a
//!   connection beyond that is closed at once, so a flood of scrapers costs
//!   worker 0 a bounded amount of memory.
//! - The endpoint's listener is a hotloop listener, so its connections
//!   count in the runtime's `accepted` (and wakeups) like any other; the
//!   `stats_scrapes` field says how many of them were scrapes.
//! - Dropping the [`StatsServer`] sets a flag and makes one connection to
//!   the endpoint so that the accept loop wakes, sees it and ends.

use std::cell::Cell;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use hotloop::net::{TcpListener, TcpStream};
use hotloop::time::{interval, timeout_at};
use hotloop::Handle;

/// How long a scrape may take to send its request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// The most scrapes answered at once.
pub const SCRAPES_IN_FLIGHT_MAX: usize = 64;
/// The most bytes of a scrape's request head that are read.
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
    /// With `addr`, starts serving `handle`'s counters plus an
    /// `active_connections` gauge read from `active` (described by `help`),
    /// and says where on stderr as `name: stats on URL`; without, nothing.
    pub fn start_with_active(
        name: &str,
        addr: Option<&str>,
        handle: Handle,
        help: &'static str,
        active: impl Fn() -> usize + Send + Sync + 'static,
    ) -> std::io::Result<Option<StatsServer>> {
        let Some(addr) = addr else { return Ok(None) };
        let extra: ExtraFields = Arc::new(move || {
            vec![Extra {
                name: "active_connections",
                help,
                kind: Kind::Gauge,
                value: active() as u64,
            }]
        });
        let server = StatsServer::start(addr, handle, extra)?;
        eprintln!("{name}: stats on http://{}/stats", server.local_addr());
        Ok(Some(server))
    }

    /// Starts serving `handle`'s counters on `addr`, on worker 0 of its runtime.
    pub fn start(addr: &str, handle: Handle, extra: ExtraFields) -> std::io::Result<StatsServer> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let addr = addr.to_string();
        let (task_stop, task_handle) = (stop.clone(), handle.clone());
        // The join handle is not kept: the tasks end when `stop` is set or the runtime stops.
        drop(handle.spawn_on(0, move || serve(addr, task_handle, extra, task_stop, tx)));
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

/// The endpoint's accept loop, on worker 0.
async fn serve(
    addr: String,
    handle: Handle,
    extra: ExtraFields,
    stop: Arc<AtomicBool>,
    started: mpsc::Sender<std::io::Result<SocketAddr>>,
) {
    let listener = match TcpListener::bind(addr.as_str()).and_then(|l| Ok((l.local_addr()?, l))) {
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
    let sampler = hotloop::spawn(sample_rates(handle.clone(), rates.clone(), stop.clone()));
    let in_flight = Rc::new(Cell::new(0usize));
    let scrapes = Rc::new(Cell::new(0u64));
    while !stop.load(Ordering::Relaxed) {
        let Ok(conn) = listener.accept_stream().await else { continue };
        scrapes.set(scrapes.get() + 1);
        if stop.load(Ordering::Relaxed) || in_flight.get() >= SCRAPES_IN_FLIGHT_MAX {
            continue; // dropping `conn` closes it
        }
        in_flight.set(in_flight.get() + 1);
        let (handle, extra, rates, in_flight, scrapes) =
            (handle.clone(), extra.clone(), rates.clone(), in_flight.clone(), scrapes.get());
        drop(hotloop::spawn(async move {
            answer(conn, &handle, rates.get(), scrapes, &*extra).await;
            in_flight.set(in_flight.get() - 1);
        }));
    }
    sampler.abort();
}

/// Samples the accepted count once a second.
async fn sample_rates(handle: Handle, rates: Rc<Cell<Rates>>, stop: Arc<AtomicBool>) {
    let mut tick = interval(Duration::from_secs(1));
    tick.tick().await; // the first tick is immediate
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let accepted = handle.stats().total.accepted;
        let mut r = rates.get();
        r.per_second = accepted - r.last_accepted;
        r.peak_per_second = r.peak_per_second.max(r.per_second);
        r.last_accepted = accepted;
        rates.set(r);
    }
}

/// Reads one request head (within [`REQUEST_TIMEOUT`]) and answers it.
async fn answer(
    conn: TcpStream,
    handle: &Handle,
    rates: Rates,
    scrapes: u64,
    extra: &(dyn Fn() -> Vec<Extra> + Send + Sync),
) {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let mut head: Vec<u8> = Vec::new();
    while head.len() < REQUEST_HEAD_MAX_BYTES && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match timeout_at(deadline, conn.read_pooled()).await {
            Ok(Ok(buf)) if !buf.is_empty() => head.extend_from_slice(&buf),
            _ => break,
        }
    }
    let path = hotloop_proto::request_path(&head);
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
        help: "Connections to this stats endpoint, this one included (they count in accepted too).",
        kind: Kind::Counter,
        value: scrapes,
    });
    let (status, ctype, body) = match path {
        "/stats" | "/" => ("200 OK", "application/json", json(handle, &fields)),
        "/metrics" => ("200 OK", "text/plain; version=0.0.4", prometheus(handle, &fields)),
        _ => ("404 Not Found", "text/plain", "try /stats or /metrics\n".to_string()),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = timeout_at(deadline + REQUEST_TIMEOUT, conn.write_all(reply.into_bytes())).await;
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
    for f in fields {
        let (name, kind) = match f.kind {
            Kind::Counter => (format!("hotloop_{}_total", f.name), "counter"),
            Kind::Gauge => (format!("hotloop_{}", f.name), "gauge"),
        };
        let _ =
            write!(text, "# HELP {name} {}\n# TYPE {name} {kind}\n{name} {}\n", f.help, f.value);
    }
    text
}
