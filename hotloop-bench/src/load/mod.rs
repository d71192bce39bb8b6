//! `hotloop-bench load`: a single-threaded, non-blocking load generator.
//!
//! It drives TCP connections on loopback from one thread with a plain
//! readiness loop (mio over epoll) and no async runtime, so it favours none
//! of the servers it measures.
//!
//! # Modes
//! - `serial`: one connection at a time: connect, one request, read the
//!   whole reply, close. Measures connections per second.
//! - `burst`: `--connections` clients start at once; each connects, sends one
//!   request (`--size` bytes for echo), reads the reply and closes. The
//!   report's `elapsed_s` is the wall time until the last one finished.
//! - `churn`: `--connections` connections in flight, one request each, every
//!   one replaced as soon as it closes.
//! - `keepalive`: `--connections` persistent connections, each sending a
//!   request as soon as the previous reply arrived.
//!
//! # Implementation notes
//! A *unit* is what one latency sample measures: a whole connection in
//! `serial`, `burst` and `churn` (from the start of connect(2) to the last
//! byte of the reply), one request in `keepalive` (from its send to its
//! reply's last byte). With `--rate` the units start on a fixed schedule and
//! each latency is measured from the unit's *intended* start, so a stalled
//! server is charged for the time requests waited to go out (no coordinated
//! omission).
//!
//! Every run stops at `--duration` (after `--warmup`) or once `--requests`
//! units have finished, whichever comes first; each connection has a
//! connect deadline and a reply deadline, so nothing waits forever.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod engine;
pub mod hist;
pub mod report;
pub use hotloop_proto::response;
pub mod sys;

pub use report::LoadReport;

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// Concurrent connections above which `--sources` is raised automatically:
/// one source address has about 28,000 ephemeral ports toward one server.
pub const CONNECTIONS_PER_SOURCE_MAX: usize = 20_000;

/// The most source addresses, 127.0.0.1 to 127.0.0.254.
pub const SOURCES_MAX: usize = 254;

/// The most concurrent connections accepted on the command line.
pub const CONNECTIONS_MAX: usize = 1_000_000;

/// The longest `--duration` or `--warmup`, in seconds (one day).
pub const DURATION_MAX_SECS: f64 = 86_400.0;

/// The largest echo payload, in bytes.
pub const SIZE_MAX_BYTES: usize = 64 * 1024 * 1024;

/// What the load generator speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// Send `--size` bytes and expect the same bytes back.
    Echo,
    /// Send `GET --path` and expect `200 OK` with a Content-Length body.
    Http,
}

/// How connections and requests are laid out over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One connection at a time, one request each.
    Serial,
    /// `--connections` clients at once, one request each, then stop.
    Burst,
    /// `--connections` short connections in flight, each replaced on close.
    Churn,
    /// `--connections` persistent connections in a request/reply loop.
    Keepalive,
}

impl Proto {
    /// The lowercase name used on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Echo => "echo",
            Proto::Http => "http",
        }
    }
}

impl Mode {
    /// The lowercase name used on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Serial => "serial",
            Mode::Burst => "burst",
            Mode::Churn => "churn",
            Mode::Keepalive => "keepalive",
        }
    }
}

/// Options of `hotloop-bench load`.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Server address; loopback only (127.0.0.0/8 or ::1).
    #[arg(long, value_parser = parse_loopback_addr, value_name = "HOST:PORT")]
    pub addr: SocketAddr,
    /// Protocol to speak.
    #[arg(long, value_enum, default_value_t = Proto::Http)]
    pub proto: Proto,
    /// How connections and requests are laid out over time.
    #[arg(long, value_enum, default_value_t = Mode::Keepalive)]
    pub mode: Mode,
    /// Connections in flight (for burst: the number of clients). Serial
    /// always uses 1.
    #[arg(long, short = 'c', default_value_t = 1, value_name = "C")]
    pub connections: usize,
    /// Stop after this many requests (connections in serial, burst and
    /// churn) have finished. Without it only the time bound applies.
    #[arg(long, short = 'n', value_name = "N")]
    pub requests: Option<u64>,
    /// Stop after this many seconds of measurement.
    #[arg(long, short = 'd', default_value_t = 10.0, value_name = "SECS")]
    pub duration: f64,
    /// Echo payload in bytes.
    #[arg(long, default_value_t = 128, value_name = "BYTES")]
    pub size: usize,
    /// HTTP request path.
    #[arg(long, default_value = "/", value_name = "PATH")]
    pub path: String,
    /// Open loop: start this many requests (or connections) per second on a
    /// fixed schedule, measuring latency from each one's intended start.
    #[arg(long, value_name = "PER_SEC")]
    pub rate: Option<f64>,
    /// Open loop: busy-wait for each start instead of sleeping until it.
    /// A sleeping generator adds its own wake-up (tens of microseconds on a
    /// virtual machine) to every latency it reports; spinning keeps the
    /// schedule to the microsecond at the cost of a whole CPU, so give the
    /// generator one of its own (`--pin`).
    #[arg(long, requires = "rate")]
    pub spin: bool,
    /// Seconds to run before measuring; not counted in any figure.
    #[arg(long, default_value_t = 0.0, value_name = "SECS")]
    pub warmup: f64,
    /// Pin the load generator to this CPU.
    #[arg(long, value_name = "CPU")]
    pub pin: Option<usize>,
    /// Spread connections over source addresses 127.0.0.1 .. 127.0.0.N.
    /// Raised automatically to one per 20,000 connections.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub sources: usize,
    /// Milliseconds a connection may take to establish.
    #[arg(long, default_value_t = 3000, value_name = "MS")]
    pub connect_timeout: u64,
    /// Milliseconds a reply may take, from its request's send.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    pub timeout: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Print no warnings, only the report.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

impl LoadArgs {
    /// The command-line defaults for a run against `addr`, for callers that
    /// run load in-process.
    #[allow(dead_code)] // Part of the in-process interface; tests use it.
    pub fn new(addr: SocketAddr) -> Self {
        LoadArgs {
            addr,
            proto: Proto::Http,
            mode: Mode::Keepalive,
            connections: 1,
            requests: None,
            duration: 10.0,
            size: 128,
            path: "/".to_string(),
            rate: None,
            spin: false,
            warmup: 0.0,
            pin: None,
            sources: 1,
            connect_timeout: 3000,
            timeout: 5000,
            json: false,
            quiet: false,
        }
    }
}

/// Parses `HOST:PORT` and refuses anything that is not loopback.
///
/// A name such as `localhost:8080` is resolved and must resolve only to
/// loopback addresses.
pub fn parse_loopback_addr(s: &str) -> Result<SocketAddr, String> {
    let addrs: Vec<SocketAddr> = match s.parse::<SocketAddr>() {
        Ok(a) => vec![a],
        Err(_) => {
            s.to_socket_addrs().map_err(|e| format!("`{s}` is not HOST:PORT ({e})"))?.collect()
        }
    };
    let first = *addrs.first().ok_or_else(|| format!("`{s}` resolves to no address"))?;
    if let Some(bad) = addrs.iter().find(|a| !a.ip().is_loopback()) {
        return Err(format!(
            "{} is not a loopback address: hotloop-bench load only targets 127.0.0.0/8 or ::1",
            bad.ip()
        ));
    }
    if first.port() == 0 {
        return Err(format!("`{s}`: port 0 is not a server port"));
    }
    Ok(first)
}

/// A validated run: everything [`engine`] needs, with defaults resolved.
#[derive(Debug, Clone)]
struct Plan {
    mode: Mode,
    proto: Proto,
    addr: SocketAddr,
    concurrency: usize,
    requests: Option<u64>,
    duration: Duration,
    warmup: Duration,
    rate: Option<f64>,
    /// Busy-wait for open-loop starts (`--spin`).
    spin: bool,
    /// Addresses to bind before connect; empty when the kernel picks.
    sources: Vec<SocketAddr>,
    connect_timeout: Duration,
    timeout: Duration,
    /// The bytes of one request.
    request: Vec<u8>,
    /// Whether each connection carries one request (all but keepalive).
    one_per_connection: bool,
    quiet: bool,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn secs(name: &str, v: f64, allow_zero: bool) -> io::Result<Duration> {
    let ok = v.is_finite() && v <= DURATION_MAX_SECS && (v > 0.0 || (allow_zero && v == 0.0));
    if !ok {
        let lo = if allow_zero { "0" } else { "more than 0" };
        return Err(invalid(format!(
            "--{name} {v}: give {lo} and at most {DURATION_MAX_SECS} seconds"
        )));
    }
    Ok(Duration::from_secs_f64(v))
}

impl Plan {
    fn new(args: &LoadArgs) -> io::Result<Plan> {
        if !args.addr.ip().is_loopback() {
            return Err(invalid(format!(
                "{} is not a loopback address: hotloop-bench load only targets 127.0.0.0/8 or ::1",
                args.addr.ip()
            )));
        }
        if args.connections == 0 || args.connections > CONNECTIONS_MAX {
            return Err(invalid(format!(
                "--connections {}: give 1 to {CONNECTIONS_MAX}",
                args.connections
            )));
        }
        if args.requests == Some(0) {
            return Err(invalid("--requests 0: give at least 1, or leave it out".into()));
        }
        let duration = secs("duration", args.duration, false)?;
        let warmup = secs("warmup", args.warmup, true)?;
        if let Some(r) = args.rate {
            if !(r.is_finite() && r > 0.0 && r <= 1e9) {
                return Err(invalid(format!("--rate {r}: give a rate above 0 per second")));
            }
        }
        if args.mode == Mode::Burst && (args.rate.is_some() || !warmup.is_zero()) {
            return Err(invalid(
                "burst starts every client at once: --rate and --warmup do not apply".into(),
            ));
        }
        if args.connect_timeout == 0 || args.timeout == 0 {
            return Err(invalid("--connect-timeout and --timeout must be at least 1 ms".into()));
        }
        let request = match args.proto {
            Proto::Echo => {
                if args.size == 0 || args.size > SIZE_MAX_BYTES {
                    return Err(invalid(format!(
                        "--size {}: give 1 to {SIZE_MAX_BYTES} bytes",
                        args.size
                    )));
                }
                echo_payload(args.size)
            }
            Proto::Http => http_request(&args.path, args.addr, args.mode != Mode::Keepalive)?,
        };
        let concurrency = if args.mode == Mode::Serial { 1 } else { args.connections };
        let requests = match args.mode {
            Mode::Burst => Some(concurrency as u64),
            _ => args.requests,
        };
        let sources = source_addrs(args.addr, args.sources, concurrency)?;
        Ok(Plan {
            mode: args.mode,
            proto: args.proto,
            addr: args.addr,
            concurrency,
            requests,
            duration,
            warmup,
            rate: args.rate,
            spin: args.spin && args.rate.is_some(),
            sources,
            connect_timeout: Duration::from_millis(args.connect_timeout),
            timeout: Duration::from_millis(args.timeout),
            request,
            one_per_connection: args.mode != Mode::Keepalive,
            quiet: args.quiet || args.json,
        })
    }
}

/// The addresses to bind before connecting: none for one source, else
/// 127.0.0.1 .. 127.0.0.N, with N raised to cover `concurrency`.
fn source_addrs(
    server: SocketAddr,
    asked: usize,
    concurrency: usize,
) -> io::Result<Vec<SocketAddr>> {
    if asked == 0 || asked > SOURCES_MAX {
        return Err(invalid(format!("--sources {asked}: give 1 to {SOURCES_MAX}")));
    }
    let needed = if concurrency > CONNECTIONS_PER_SOURCE_MAX {
        concurrency.div_ceil(CONNECTIONS_PER_SOURCE_MAX)
    } else {
        1
    };
    let n = asked.max(needed);
    if n == 1 {
        return Ok(Vec::new());
    }
    if !server.is_ipv4() {
        return Err(invalid(format!(
            "{n} source addresses are 127.0.0.x, which cannot reach {server}: use an IPv4 server address"
        )));
    }
    if n > SOURCES_MAX {
        return Err(invalid(format!(
            "{concurrency} connections need {n} source addresses; at most {SOURCES_MAX} exist"
        )));
    }
    Ok((1..=n as u8).map(|i| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, i)), 0)).collect())
}

/// The echo payload: a repeating, recognisable byte pattern.
fn echo_payload(size: usize) -> Vec<u8> {
    (0..size).map(|i| b'a' + (i % 26) as u8).collect()
}

/// A `GET` request for `path`; with `close` it asks the server to close
/// the connection after replying.
fn http_request(path: &str, addr: SocketAddr, close: bool) -> io::Result<Vec<u8>> {
    if !path.starts_with('/') || path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(invalid(format!(
            "--path {path:?}: give a path starting with / and without spaces or control characters"
        )));
    }
    let connection = if close { "Connection: close\r\n" } else { "" };
    Ok(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{connection}\r\n").into_bytes())
}

/// Runs one load test and returns its report.
///
/// Raises the soft open-file limit to the hard limit, pins the calling
/// thread if `--pin` was given, and drives every connection from the
/// calling thread until a bound is reached.
pub fn run(args: &LoadArgs) -> io::Result<LoadReport> {
    let plan = Plan::new(args)?;
    let fd_limit = sys::raise_nofile_limit()?;
    if let Some(cpu) = args.pin {
        sys::pin_to_cpu(cpu)?;
    }
    // Each connection holds one descriptor; the poller, the standard
    // streams and the test harness hold a few more.
    const FDS_RESERVED: u64 = 32;
    if !plan.quiet && plan.concurrency as u64 + FDS_RESERVED > fd_limit {
        eprintln!(
            "hotloop-bench load: warning: {} connections need about {} descriptors but the open-file limit is {fd_limit}; \
             connections past the limit are reported as fd_limit errors",
            plan.concurrency,
            plan.concurrency as u64 + FDS_RESERVED
        );
    }
    let mut report = engine::run(&plan)?;
    report.fd_limit = fd_limit;
    report.cpu_s = sys::cpu_seconds_self();
    Ok(report)
}

/// Runs one load test and prints its report (a table, or JSON with
/// `--json`).
pub fn run_and_print(args: &LoadArgs) -> io::Result<()> {
    let report = run(args)?;
    if args.json {
        let json = serde_json::to_string(&report).map_err(io::Error::other)?;
        println!("{json}");
    } else {
        print!("{}", report.table(args.addr));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadArgs,
    }

    fn parse(args: &[&str]) -> Result<LoadArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("load").chain(args.iter().copied())).map(|c| c.load)
    }

    #[test]
    fn loopback_addresses_are_accepted() {
        assert_eq!(parse_loopback_addr("127.0.0.1:80").unwrap(), "127.0.0.1:80".parse().unwrap());
        assert_eq!(parse_loopback_addr("127.9.8.7:80").unwrap(), "127.9.8.7:80".parse().unwrap());
        assert_eq!(parse_loopback_addr("[::1]:8080").unwrap(), "[::1]:8080".parse().unwrap());
        assert!(parse_loopback_addr("localhost:8080").unwrap().ip().is_loopback());
    }

    #[test]
    fn other_addresses_are_refused() {
        for a in ["10.0.0.1:80", "0.0.0.0:80", "[::]:80", "192.168.1.1:1", "[2001:db8::1]:80"] {
            let e = parse_loopback_addr(a).unwrap_err();
            assert!(e.contains("not a loopback address"), "{a}: {e}");
        }
        assert!(parse_loopback_addr("127.0.0.1").is_err());
        assert!(parse_loopback_addr("127.0.0.1:0").is_err());
        assert!(parse("--addr 8.8.8.8:53".split(' ').collect::<Vec<_>>().as_slice()).is_err());
        let mut args = LoadArgs::new("127.0.0.1:1".parse().unwrap());
        args.addr = "8.8.8.8:53".parse().unwrap();
        assert_eq!(run(&args).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn flags_parse_with_defaults() {
        let a = parse(&["--addr", "127.0.0.1:9000"]).unwrap();
        assert_eq!(a.mode, Mode::Keepalive);
        assert_eq!(a.proto, Proto::Http);
        assert_eq!((a.connections, a.size, a.sources), (1, 128, 1));
        assert_eq!(a.requests, None);
        assert_eq!(a.duration, 10.0);
        let a = parse(&[
            "--addr",
            "127.0.0.1:9000",
            "--mode",
            "churn",
            "--proto",
            "echo",
            "-c",
            "64",
            "-n",
            "1000",
            "--duration",
            "2.5",
            "--rate",
            "5000",
            "--size",
            "1024",
            "--json",
        ])
        .unwrap();
        assert_eq!(
            (a.mode, a.proto, a.connections, a.requests),
            (Mode::Churn, Proto::Echo, 64, Some(1000))
        );
        assert_eq!((a.duration, a.rate, a.size, a.json), (2.5, Some(5000.0), 1024, true));
        assert!(parse(&["--addr", "127.0.0.1:9000", "--mode", "sideways"]).is_err());
    }

    #[test]
    fn plan_resolves_modes() {
        let mut a = LoadArgs::new("127.0.0.1:9000".parse().unwrap());
        a.mode = Mode::Serial;
        a.connections = 50;
        let p = Plan::new(&a).unwrap();
        assert_eq!(p.concurrency, 1);
        assert!(p.request.ends_with(b"Connection: close\r\n\r\n"));
        a.mode = Mode::Burst;
        a.requests = Some(3);
        let p = Plan::new(&a).unwrap();
        assert_eq!((p.concurrency, p.requests), (50, Some(50)));
        a.rate = Some(10.0);
        assert!(Plan::new(&a).is_err());
        a.mode = Mode::Keepalive;
        let p = Plan::new(&a).unwrap();
        assert_eq!(p.request, b"GET / HTTP/1.1\r\nHost: 127.0.0.1:9000\r\n\r\n");
        a.path = "/a b".into();
        assert!(Plan::new(&a).is_err());
        a.path = "/".into();
        a.proto = Proto::Echo;
        a.size = 0;
        assert!(Plan::new(&a).is_err());
        a.size = 5;
        assert_eq!(Plan::new(&a).unwrap().request, b"abcde");
        a.duration = 0.0;
        assert!(Plan::new(&a).is_err());
        a.duration = f64::NAN;
        assert!(Plan::new(&a).is_err());
    }

    #[test]
    fn sources_are_raised_for_many_connections() {
        let v4: SocketAddr = "127.0.0.1:9000".parse().unwrap();
        assert!(source_addrs(v4, 1, 100).unwrap().is_empty());
        assert_eq!(source_addrs(v4, 1, 30_000).unwrap().len(), 2);
        let s = source_addrs(v4, 3, 10).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[2], "127.0.0.3:0".parse().unwrap());
        assert!(source_addrs("[::1]:9000".parse().unwrap(), 2, 10).is_err());
        assert!(source_addrs(v4, 255, 10).is_err());
    }

    #[test]
    fn runs_in_process_against_a_plain_echo_server() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            for _ in 0..3 {
                let (mut s, _) = listener.accept().unwrap();
                let mut buf = [0u8; 64];
                let mut got = 0;
                while got < 16 {
                    got += s.read(&mut buf[got..]).unwrap();
                }
                s.write_all(&buf[..got]).unwrap();
            }
        });
        let mut args = LoadArgs::new(addr);
        args.mode = Mode::Serial;
        args.proto = Proto::Echo;
        args.size = 16;
        args.requests = Some(3);
        args.quiet = true;
        let report = run(&args).unwrap();
        server.join().unwrap();
        assert_eq!((report.completed, report.errors.total), (3, 0));
        assert_eq!(report.stopped_by, "requests");
        assert!(report.latency_us.max > 0.0);
    }
}
