//! The live counters over HTTP, the way haproxy's `show info` reports its
//! poller: `GET /stats` (JSON) and `GET /metrics` (Prometheus text).
//!
//! It runs on a plain thread with blocking sockets so that reading the
//! counters never disturbs the workers it reports on.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hotloop::Handle;

/// Extra fields a command adds to the snapshot (name, value).
pub type ExtraFields = Arc<dyn Fn() -> Vec<(&'static str, u64)> + Send + Sync>;

/// Connection rate sampled once a second.
#[derive(Debug, Default, Clone, Copy)]
struct Rates {
    last_accepted: u64,
    per_second: u64,
    peak_per_second: u64,
}

/// A running stats endpoint; stops when dropped.
pub struct StatsServer {
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl StatsServer {
    /// Starts serving `handle`'s counters on `addr`.
    pub fn start(addr: &str, handle: Handle, extra: ExtraFields) -> std::io::Result<StatsServer> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let local = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let rates = Arc::new(Mutex::new(Rates::default()));

        let sampler = {
            let (stop, rates, handle) = (stop.clone(), rates.clone(), handle.clone());
            std::thread::spawn(move || {
                let mut next = Instant::now() + Duration::from_secs(1);
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                    if Instant::now() < next {
                        continue;
                    }
                    next += Duration::from_secs(1);
                    let accepted = handle.stats().total.accepted;
                    let mut r = rates.lock().unwrap_or_else(|e| e.into_inner());
                    r.per_second = accepted - r.last_accepted;
                    r.peak_per_second = r.peak_per_second.max(r.per_second);
                    r.last_accepted = accepted;
                }
            })
        };
        let server = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let r = *rates.lock().unwrap_or_else(|e| e.into_inner());
                            let _ = answer(conn, &handle, r, &*extra);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })
        };
        Ok(StatsServer { addr: local, stop, threads: vec![sampler, server] })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.addr
    }
}

impl Drop for StatsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn answer(
    mut conn: TcpStream,
    handle: &Handle,
    rates: Rates,
    extra: &(dyn Fn() -> Vec<(&'static str, u64)> + Send + Sync),
) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut buf = [0u8; 2048];
    let mut len = 0;
    while len < buf.len() && !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf[len..])?;
        if n == 0 {
            break;
        }
        len += n;
    }
    let path = hotloop_proto::request_path(&buf[..len]);
    let snap = handle.stats();
    let mut fields = extra();
    fields.push(("connection_rate_per_s", rates.per_second));
    fields.push(("connection_rate_peak_per_s", rates.peak_per_second));
    let (status, ctype, body) = match path {
        "/stats" | "/" => {
            let mut json = snap.to_json();
            json.pop(); // the closing brace
            for (k, v) in &fields {
                json.push_str(&format!(",\"{k}\":{v}"));
            }
            json.push('}');
            ("200 OK", "application/json", json)
        }
        "/metrics" => {
            let mut text = snap.to_prometheus();
            for (k, v) in &fields {
                text.push_str(&format!("# TYPE hotloop_{k} gauge\nhotloop_{k} {v}\n"));
            }
            ("200 OK", "text/plain; version=0.0.4", text)
        }
        _ => ("404 Not Found", "text/plain", "try /stats or /metrics\n".to_string()),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(reply.as_bytes())
}
