//! The result of a load run: the JSON contract and the human table.

use super::hist::LatencySummary;
use super::{Mode, Proto};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;

/// Why a request or connection failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The connection was not established: refused, unreachable, no free
    /// port, or no answer within `--connect-timeout`.
    Connect,
    /// The server reset the connection or it broke mid-exchange.
    Reset,
    /// The reply did not finish within `--timeout`.
    Timeout,
    /// The server closed the connection before the whole reply arrived.
    ShortRead,
    /// The reply was not a valid reply, or had a status other than 200.
    BadResponse,
    /// The open-file limit stopped a new connection (EMFILE or ENFILE).
    FdLimit,
    /// Anything else.
    Other,
}

impl ErrorKind {
    /// Classifies a socket error seen while connecting or exchanging data.
    pub fn of(e: &io::Error, connecting: bool) -> ErrorKind {
        match e.raw_os_error() {
            Some(libc::EMFILE | libc::ENFILE) => ErrorKind::FdLimit,
            _ if connecting => ErrorKind::Connect,
            Some(
                libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EADDRNOTAVAIL,
            ) => ErrorKind::Connect,
            Some(libc::ECONNRESET | libc::EPIPE | libc::ECONNABORTED) => ErrorKind::Reset,
            Some(libc::ETIMEDOUT) => ErrorKind::Timeout,
            _ => ErrorKind::Other,
        }
    }

    /// The key under `errors` in the JSON report.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Connect => "connect",
            ErrorKind::Reset => "reset",
            ErrorKind::Timeout => "timeout",
            ErrorKind::ShortRead => "short_read",
            ErrorKind::BadResponse => "bad_response",
            ErrorKind::FdLimit => "fd_limit",
            ErrorKind::Other => "other",
        }
    }
}

/// Failed requests or connections, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorCounts {
    /// All failures.
    pub total: u64,
    /// See [`ErrorKind::Connect`].
    pub connect: u64,
    /// See [`ErrorKind::Reset`].
    pub reset: u64,
    /// See [`ErrorKind::Timeout`].
    pub timeout: u64,
    /// See [`ErrorKind::ShortRead`].
    pub short_read: u64,
    /// See [`ErrorKind::BadResponse`].
    pub bad_response: u64,
    /// See [`ErrorKind::FdLimit`].
    pub fd_limit: u64,
    /// See [`ErrorKind::Other`].
    pub other: u64,
}

impl ErrorCounts {
    /// Counts one failure.
    pub fn add(&mut self, kind: ErrorKind) {
        self.total += 1;
        *match kind {
            ErrorKind::Connect => &mut self.connect,
            ErrorKind::Reset => &mut self.reset,
            ErrorKind::Timeout => &mut self.timeout,
            ErrorKind::ShortRead => &mut self.short_read,
            ErrorKind::BadResponse => &mut self.bad_response,
            ErrorKind::FdLimit => &mut self.fd_limit,
            ErrorKind::Other => &mut self.other,
        } += 1;
    }
}

/// What a load run measured. Serialized, it is the JSON object that
/// `hotloop-bench load --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    /// The mode run.
    pub mode: Mode,
    /// The protocol spoken.
    pub proto: Proto,
    /// Connections in flight asked for (clients, for burst).
    pub connections: u64,
    /// Requests (connections, in serial, burst and churn) that finished
    /// with a good reply.
    pub completed: u64,
    /// Failures by kind.
    pub errors: ErrorCounts,
    /// Seconds measured: to the last finish when `--requests` (or burst's
    /// client count) ended the run, else the duration.
    pub elapsed_s: f64,
    /// `completed / elapsed_s`: connections per second in serial, burst and
    /// churn, requests per second in keepalive.
    pub rate_per_s: f64,
    /// Latency summary in microseconds over completed requests: from the
    /// unit's start (connect, in serial, burst and churn; the intended send
    /// under `--rate`). Under `--rate` it also holds each start due but not
    /// sent by the end ([`LoadReport::not_sent`]) at its age then, a lower
    /// bound of its latency.
    pub latency_us: LatencySummary,
    /// In serial, burst and churn: latency from the request's first byte
    /// out to the reply's last byte, without the connect (what a tool that
    /// times requests on connections it already has reports).
    #[serde(default)]
    pub request_latency_us: Option<LatencySummary>,
    /// Latency distribution as (upper bound in us, count) pairs.
    pub histogram_us: Vec<(u64, u64)>,
    /// Under `--rate`: per completed unit, the generator's own lag, in
    /// microseconds: from when the unit could go out (its intended start,
    /// or when a connection came free for it) to when the generator sent
    /// it, plus from the reply's arrival at the socket (the kernel's receive
    /// timestamp) to the generator's read. A generator that falls behind
    /// shows here.
    #[serde(default)]
    pub generator_lag_us: Option<LatencySummary>,
    /// Under `--rate`: per completed unit none of whose segments the kernel
    /// retransmitted, its latency less the generator's lag: what the server
    /// (and the kernel between them) took.
    #[serde(default)]
    pub server_latency_us: Option<LatencySummary>,
    /// Under `--rate`: completed units during which their socket
    /// retransmitted a segment (`TCP_INFO`), left out of
    /// `server_latency_us`. Over loopback a retransmission means the kernel
    /// dropped a segment on its way.
    #[serde(default)]
    pub retransmitted: Option<u64>,
    /// The `--rate` asked for, or null for a closed loop.
    pub target_rate_per_s: Option<f64>,
    /// Under `--rate`: the starts the schedule intended in the measured
    /// time.
    #[serde(default)]
    pub offered: Option<u64>,
    /// Under `--rate`: of [`LoadReport::offered`], the starts that were due
    /// but not yet sent when the run ended, because the generator fell
    /// behind its schedule (every connection busy, or its CPU taken). They
    /// have no reply and no error; each is in the latencies at its age when
    /// the run ended, a lower bound: a run with many of them had a queue,
    /// and its latencies are at least those shown.
    #[serde(default)]
    pub not_sent: Option<u64>,
    /// Units started in the measured time whose reply had neither come nor
    /// failed when the duration ended (no latency sample, no error).
    #[serde(default)]
    pub unfinished: u64,
    /// The most connections open at once.
    pub max_in_flight: u64,
    /// Source addresses connections were spread over.
    pub sources: u64,
    /// The soft open-file limit during the run.
    pub fd_limit: u64,
    /// CPU seconds (user and system) the load generator used.
    #[serde(default)]
    pub cpu_s: f64,
    /// Why the run stopped: "requests" or "duration".
    pub stopped_by: String,
    /// The first failure's description, if any failed.
    pub first_error: Option<String>,
}

impl LoadReport {
    /// A short human-readable table.
    pub fn table(&self, addr: SocketAddr) -> String {
        let unit = match self.mode {
            Mode::Keepalive => "req/s",
            _ => "conn/s",
        };
        let e = &self.errors;
        let l = &self.latency_us;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "hotloop-bench load: {} {} against {addr}, {} connection{}",
            self.mode.as_str(),
            self.proto.as_str(),
            self.connections,
            if self.connections == 1 { "" } else { "s" }
        );
        let _ = writeln!(
            s,
            "  elapsed      {:>12.3} s (stopped by {})",
            self.elapsed_s, self.stopped_by
        );
        let _ = writeln!(s, "  completed    {:>12}", self.completed);
        let _ = writeln!(s, "  throughput   {:>12.1} {unit}", self.rate_per_s);
        if let Some(r) = self.target_rate_per_s {
            let _ = writeln!(s, "  target rate  {r:>12.1} {unit}");
        }
        if let (Some(offered), Some(not_sent)) = (self.offered, self.not_sent) {
            let _ = writeln!(
                s,
                "  not sent     {not_sent:>12}  of {offered} starts due (behind the schedule: no latency sample)"
            );
        }
        if self.unfinished > 0 {
            let _ =
                writeln!(s, "  unfinished   {:>12}  (no reply when time ran out)", self.unfinished);
        }
        let _ = writeln!(
            s,
            "  errors       {:>12}  connect {}  reset {}  timeout {}  short_read {}  bad_response {}  fd_limit {}  other {}",
            e.total, e.connect, e.reset, e.timeout, e.short_read, e.bad_response, e.fd_limit, e.other
        );
        let _ = writeln!(
            s,
            "  latency us   mean {:.1}  stdev {:.1}  p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
            l.mean, l.stdev, l.p50, l.p90, l.p99, l.p999, l.max
        );
        if let (Some(g), Some(v)) = (&self.generator_lag_us, &self.server_latency_us) {
            let _ = writeln!(
                s,
                "  server us    p50 {}  p99 {}  p99.9 {}  max {}  (latency less the generator's lag)",
                v.p50, v.p99, v.p999, v.max
            );
            let _ = writeln!(
                s,
                "  own lag us   p50 {}  p99 {}  p99.9 {}  max {}  (late sends and late reads)",
                g.p50, g.p99, g.p999, g.max
            );
            let _ = writeln!(
                s,
                "  retransmitted {:>11}  (units whose socket resent a segment; not in \"server\")",
                self.retransmitted.unwrap_or(0)
            );
        }
        let _ = writeln!(
            s,
            "  connections  max in flight {}, {} source address{}",
            self.max_in_flight,
            self.sources,
            if self.sources == 1 { "" } else { "es" }
        );
        if let Some(first) = &self.first_error {
            let _ = writeln!(s, "  first error  {first}");
        }
        if e.fd_limit > 0 {
            let _ = writeln!(
                s,
                "  note: the open-file limit ({}) capped the connections; ask for fewer --connections",
                self.fd_limit
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::hist::Latencies;
    use std::time::Duration;

    fn sample() -> LoadReport {
        let mut lat = Latencies::new();
        for us in [10u64, 20, 30, 40, 1000] {
            lat.record(Duration::from_micros(us));
        }
        let mut errors = ErrorCounts::default();
        errors.add(ErrorKind::Connect);
        errors.add(ErrorKind::BadResponse);
        LoadReport {
            mode: Mode::Serial,
            proto: Proto::Http,
            connections: 1,
            completed: 5,
            errors,
            elapsed_s: 0.5,
            rate_per_s: 10.0,
            latency_us: lat.summary(),
            request_latency_us: Some(lat.summary()),
            histogram_us: lat.buckets(),
            generator_lag_us: Some(lat.summary()),
            server_latency_us: Some(lat.summary()),
            retransmitted: Some(1),
            target_rate_per_s: None,
            offered: Some(6),
            not_sent: Some(1),
            unfinished: 0,
            max_in_flight: 1,
            sources: 1,
            fd_limit: 20_000,
            cpu_s: 0.25,
            stopped_by: "requests".into(),
            first_error: Some("connect: refused".into()),
        }
    }

    #[test]
    fn json_has_the_contract_keys() {
        let v: serde_json::Value = serde_json::to_value(sample()).unwrap();
        assert_eq!(v["mode"], "serial");
        assert_eq!(v["proto"], "http");
        assert_eq!(v["connections"], 1);
        assert_eq!(v["completed"], 5);
        for k in ["total", "connect", "reset", "timeout", "bad_response", "other"] {
            assert!(v["errors"][k].is_u64(), "errors.{k}");
        }
        assert_eq!(v["errors"]["total"], 2);
        assert_eq!(v["errors"]["connect"], 1);
        assert_eq!(v["errors"]["bad_response"], 1);
        assert!(v["elapsed_s"].is_f64());
        assert!(v["rate_per_s"].is_f64());
        for k in ["mean", "stdev", "p50", "p90", "p99", "p999", "max"] {
            assert!(v["latency_us"][k].is_f64(), "latency_us.{k}");
        }
        let h = v["histogram_us"].as_array().unwrap();
        assert!(!h.is_empty());
        let total: u64 = h.iter().map(|p| p[1].as_u64().unwrap()).sum();
        assert_eq!(total, 5);
        assert!(h.iter().all(|p| p.as_array().unwrap().len() == 2 && p[0].is_u64()));
    }

    #[test]
    fn json_round_trips() {
        let r = sample();
        let back: LoadReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn error_kinds_classify_errno() {
        let e = |n| io::Error::from_raw_os_error(n);
        assert_eq!(ErrorKind::of(&e(libc::ECONNREFUSED), false), ErrorKind::Connect);
        assert_eq!(ErrorKind::of(&e(libc::ECONNRESET), true), ErrorKind::Connect);
        assert_eq!(ErrorKind::of(&e(libc::ECONNRESET), false), ErrorKind::Reset);
        assert_eq!(ErrorKind::of(&e(libc::EPIPE), false), ErrorKind::Reset);
        assert_eq!(ErrorKind::of(&e(libc::EMFILE), true), ErrorKind::FdLimit);
        assert_eq!(ErrorKind::of(&e(libc::EINVAL), false), ErrorKind::Other);
    }

    #[test]
    fn table_mentions_the_figures() {
        let t = sample().table("127.0.0.1:80".parse().unwrap());
        assert!(t.contains("serial http"));
        assert!(t.contains("conn/s"));
        assert!(t.contains("connect 1"));
        assert!(t.contains("first error  connect: refused"));
        assert!(t.contains("own lag us") && t.contains("server us"), "{t}");
        assert!(t.contains("not sent") && t.contains("of 6 starts due"), "{t}");
    }
}
