//! `hotloop-bench h2-load`: HTTP/2 load (prior knowledge, over TCP) that
//! opens a new connection when a server sends `GOAWAY`, as a browser or
//! hyper's client does, for measuring servers while they drain.
//!
//! `h2load` does not: once a server's `GOAWAY` arrives, its client refuses
//! to start the next request (nghttp2 allows no new stream then), counts
//! that request as failed although it was never sent, and stays idle for
//! the rest of the run. Under repeated upgrades that measured nothing after
//! the first one, and counted one failure per connection that no server
//! caused.
//!
//! Each of `--connections` connections sends one request at a time. A
//! request is:
//! - *done* when its answer arrived whole, and *failed* if that answer is
//!   not 2xx;
//! - *refused* when the server said it did not process it: `GOAWAY` whose
//!   last stream is below the request's, or `REFUSED_STREAM`. RFC 9113
//!   (section 8.7) makes such a request safe to send again, and it is, on
//!   a new connection; it counts once, as refused, and is not a failure;
//! - *failed* in every other case: reset, or its connection ended before
//!   the answer did.
//!
//! A connection the server will take no new stream on (its `GOAWAY`
//! came) is left to end when the server closes it; the next request goes
//! on a new one. A refused connect counts as a connect error, and the
//! connect is tried again 10 ms later.
//!
//! The run ends at `--duration` or on SIGINT or SIGTERM, then prints one
//! JSON line (see [`H2Report`]); requests in flight then are not counted.

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::net::TcpStream;

/// How long a refused connect waits before it is tried again.
const RECONNECT_PAUSE: Duration = Duration::from_millis(10);

/// `hotloop-bench h2-load` options.
#[derive(Args, Debug, Clone)]
pub struct H2LoadArgs {
    /// The server's address.
    #[arg(long)]
    pub addr: SocketAddr,
    /// Connections open at once, one request in flight on each.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Seconds to run (SIGINT or SIGTERM end the run earlier).
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// The path every request asks for.
    #[arg(long, default_value = "/")]
    pub path: String,
}

/// What a run did (printed as one JSON line).
#[derive(Debug, Default, Clone, Serialize)]
pub struct H2Report {
    /// Requests answered whole.
    pub requests: u64,
    /// Requests that failed (see the module docs); answers that are not 2xx included.
    pub failed: u64,
    /// Requests the server refused before processing them, sent again on a new connection.
    pub refused: u64,
    /// Connects refused or failed.
    pub connect_errors: u64,
    /// Connections opened (the first ones, and one after each `GOAWAY`).
    pub connections: u64,
    /// Median latency of the requests answered, in milliseconds.
    pub p50_ms: f64,
    /// Their 99th percentile, in milliseconds.
    pub p99_ms: f64,
    /// The slowest of them, in milliseconds.
    pub max_ms: f64,
    /// The first failures' errors, for a look.
    pub failure_examples: Vec<String>,
}

struct Tally {
    report: H2Report,
    latency: Histogram<u64>,
}

impl Tally {
    fn fail(&mut self, why: String) {
        self.report.failed += 1;
        if self.report.failure_examples.len() < 5 {
            self.report.failure_examples.push(why);
        }
    }
}

/// Runs the load and prints the report.
pub fn run_and_print(args: &H2LoadArgs) -> io::Result<()> {
    let report = run(args)?;
    println!("{}", serde_json::to_string(&report).map_err(io::Error::other)?);
    Ok(())
}

/// Runs the load until `--duration` or a stop signal.
pub fn run(args: &H2LoadArgs) -> io::Result<H2Report> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let local = tokio::task::LocalSet::new();
    let tally = Rc::new(RefCell::new(Tally {
        report: H2Report::default(),
        latency: Histogram::new(3).map_err(io::Error::other)?,
    }));
    let uri: http::Uri = format!("http://{}{}", args.addr, args.path)
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{e}")))?;
    local.block_on(&rt, async {
        for _ in 0..args.connections {
            tokio::task::spawn_local(client(args.addr, uri.clone(), tally.clone()));
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs_f64(args.duration)) => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        io::Result::Ok(())
    })?;
    let tally = tally.borrow();
    let mut report = tally.report.clone();
    let ms = |v: u64| v as f64 / 1000.0;
    report.p50_ms = ms(tally.latency.value_at_quantile(0.5));
    report.p99_ms = ms(tally.latency.value_at_quantile(0.99));
    report.max_ms = ms(tally.latency.max());
    Ok(report)
}

/// One connection slot: a connection at a time, a request at a time on it.
async fn client(addr: SocketAddr, uri: http::Uri, tally: Rc<RefCell<Tally>>) {
    loop {
        let tcp = match TcpStream::connect(addr).await {
            Ok(tcp) => tcp,
            Err(_) => {
                tally.borrow_mut().report.connect_errors += 1;
                tokio::time::sleep(RECONNECT_PAUSE).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (mut send, conn) = match h2::client::handshake(tcp).await {
            Ok(pair) => pair,
            Err(e) => {
                tally.borrow_mut().fail(format!("handshake: {e}"));
                continue;
            }
        };
        tally.borrow_mut().report.connections += 1;
        // Driven until the server closes it, after its GOAWAY.
        tokio::task::spawn_local(async move {
            let _ = conn.await;
        });
        loop {
            // An error here: the connection takes no new stream (GOAWAY,
            // or it ended). Nothing was sent; the next request goes on a
            // new connection.
            send = match send.ready().await {
                Ok(send) => send,
                Err(_) => break,
            };
            let request = http::Request::get(uri.clone()).body(()).expect("a valid request");
            let started = Instant::now();
            let response = match send.send_request(request, true) {
                Ok((response, _)) => response,
                Err(_) => break,
            };
            match answer(response).await {
                Ok(status) if status.is_success() => {
                    let mut t = tally.borrow_mut();
                    t.report.requests += 1;
                    let us = started.elapsed().as_micros() as u64;
                    let _ = t.latency.record(us.max(1));
                }
                Ok(status) => tally.borrow_mut().fail(format!("status {status}")),
                Err(e) if refused(&e) => {
                    tally.borrow_mut().report.refused += 1;
                    break;
                }
                Err(e) => {
                    tally.borrow_mut().fail(e.to_string());
                    break;
                }
            }
        }
    }
}

/// Waits for the whole answer; its status.
async fn answer(response: h2::client::ResponseFuture) -> Result<http::StatusCode, h2::Error> {
    let response = response.await?;
    let status = response.status();
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    Ok(status)
}

/// True if the server did not process the request (RFC 9113, 8.7): a
/// `GOAWAY` it came after, or `REFUSED_STREAM`.
fn refused(e: &h2::Error) -> bool {
    (e.is_go_away() && e.is_remote() && e.reason() == Some(h2::Reason::NO_ERROR))
        || e.reason() == Some(h2::Reason::REFUSED_STREAM)
}
