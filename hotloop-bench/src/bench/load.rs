//! Driving `hotloop-bench load`: the arguments of one run, and the figures taken
//! from its report.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::report::LoadReport;
use super::{LOAD_SLACK_S, METRIC_RATE};

/// One load generator run: `hotloop-bench load` arguments.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// serial, burst, churn or keepalive.
    pub mode: &'static str,
    /// Concurrent connections (clients).
    pub connections: u64,
    /// Stop after this many requests, if set.
    pub requests: Option<u64>,
    /// Stop after this long (`--duration`, in seconds to the millisecond).
    pub duration: Duration,
    /// Bytes per echo message or HTTP body.
    pub size: usize,
    /// Requests or connections per second, if paced.
    pub rate: Option<u64>,
    /// Source addresses to spread connections over.
    pub sources: u32,
    /// Run this long before measuring (`--warmup`), not counted.
    pub warmup: Duration,
    /// Open loop: the generator busy-waits for each start (`--spin`); only
    /// passed when the generator is pinned to a CPU of its own.
    pub spin: bool,
}

impl LoadSpec {
    /// The command-line arguments after `load`.
    pub fn args(&self, addr: SocketAddr, proto: &str, pin: Option<usize>) -> Vec<String> {
        self.args_for(&addr.to_string(), proto, pin)
    }

    /// The command that runs this load, as a report prints it: the same
    /// arguments [`LoadSpec::args`] passes, with the server's port (a free
    /// one, picked per run) shown as `PORT`.
    pub fn command_line(&self, proto: &str, pin: Option<usize>) -> String {
        format!("hotloop-bench load {}", self.args_for("127.0.0.1:PORT", proto, pin).join(" "))
    }

    fn args_for(&self, addr: &str, proto: &str, pin: Option<usize>) -> Vec<String> {
        let mut a = vec![
            "--addr".to_string(),
            addr.to_string(),
            "--proto".into(),
            proto.into(),
            "--mode".into(),
            self.mode.into(),
            "--connections".into(),
            self.connections.to_string(),
            "--duration".into(),
            secs_arg(self.duration),
            "--size".into(),
            self.size.to_string(),
            "--warmup".into(),
            secs_arg(self.warmup),
            "--sources".into(),
            self.sources.to_string(),
            "--json".into(),
        ];
        if let Some(n) = self.requests {
            a.extend(["--requests".to_string(), n.to_string()]);
        }
        if let Some(r) = self.rate {
            a.extend(["--rate".to_string(), r.to_string()]);
        }
        if let Some(cpu) = pin {
            a.extend(["--pin".to_string(), cpu.to_string()]);
            if self.spin && self.rate.is_some() {
                a.push("--spin".to_string());
            }
        }
        a
    }

    /// A shorter run of the same shape, to warm the server up: at most
    /// `requests` requests (a quarter of a count-bound run) and `longest`.
    pub fn warmup_run(&self, requests: u64, longest: Duration) -> LoadSpec {
        let mut w = self.clone();
        w.duration = longest;
        w.warmup = Duration::ZERO;
        let n = self.requests.map_or(requests, |n| (n / 4).min(requests)).max(1);
        w.requests = Some(n);
        w.connections = w.connections.min(n);
        w
    }

    /// How long the run may take before it is killed.
    pub fn timeout(&self) -> Duration {
        self.warmup + self.duration + Duration::from_secs(LOAD_SLACK_S)
    }
}

/// A duration as the load generator's `--duration` and `--warmup` take it:
/// seconds, with as many decimals as the milliseconds need ("2", "0.5",
/// "0.25").
pub fn secs_arg(d: Duration) -> String {
    let ms = d.as_millis();
    let text = format!("{}.{:03}", ms / 1000, ms % 1000);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The figures of one load report, keyed for [`Row::metrics`](super::report::Row::metrics).
pub fn figures_of(r: &LoadReport) -> BTreeMap<String, f64> {
    let l = &r.latency_us;
    let mut f = BTreeMap::new();
    for (key, value) in [
        (METRIC_RATE, r.rate_per_s),
        ("elapsed_ms", r.elapsed_s * 1000.0),
        ("completed", r.completed as f64),
        ("errors", r.errors_total() as f64),
        ("mean_us", l.mean),
        ("stdev_us", l.stdev),
        ("p50_us", l.p50),
        ("p90_us", l.p90),
        ("p99_us", l.p99),
        ("p999_us", l.p999),
        ("max_us", l.max),
        ("mean_ms", l.mean / 1000.0),
        ("stdev_ms", l.stdev / 1000.0),
        ("p99_ms", l.p99 / 1000.0),
        ("p999_ms", l.p999 / 1000.0),
        ("max_ms", l.max / 1000.0),
        ("load_cpu_s", r.cpu_s),
    ] {
        f.insert(key.to_string(), value);
    }
    f.insert(super::report::METRIC_ERROR_PCT.to_string(), r.error_pct());
    f.insert("unfinished".to_string(), r.unfinished as f64);
    if let (Some(offered), Some(not_sent)) = (r.offered, r.not_sent) {
        f.insert("offered".to_string(), offered as f64);
        f.insert("not_sent".to_string(), not_sent as f64);
        let behind = if r.behind_schedule() { 1.0 } else { 0.0 };
        f.insert(super::report::METRIC_BEHIND.to_string(), behind);
    }
    if let Some(q) = &r.request_latency_us {
        for (key, value) in [
            ("req_mean_ms", q.mean / 1000.0),
            ("req_stdev_ms", q.stdev / 1000.0),
            ("req_p50_ms", q.p50 / 1000.0),
            ("req_p99_ms", q.p99 / 1000.0),
        ] {
            f.insert(key.to_string(), value);
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_args_follow_the_contract() {
        let spec = LoadSpec {
            mode: "burst",
            connections: 10_000,
            requests: Some(10_000),
            duration: Duration::from_secs(30),
            size: 128,
            rate: None,
            sources: 4,
            warmup: Duration::ZERO,
            spin: false,
        };
        let a = spec.args("127.0.0.1:9000".parse().unwrap(), "echo", Some(1)).join(" ");
        assert!(a.contains("--mode burst") && a.contains("--connections 10000"), "{a}");
        assert!(
            a.contains("--requests 10000") && a.contains("--pin 1") && a.ends_with("--pin 1"),
            "{a}"
        );
        assert!(a.contains("--json") && !a.contains("--rate"), "{a}");
        let shown = spec.command_line("echo", Some(1));
        assert_eq!(
            shown,
            format!("hotloop-bench load {}", a.replace("127.0.0.1:9000", "127.0.0.1:PORT"))
        );
        let w = spec.warmup_run(5_000, Duration::from_secs(1));
        assert_eq!(
            (w.duration, w.requests, w.connections),
            (Duration::from_secs(1), Some(2_500), 2_500)
        );
        let keepalive = LoadSpec { mode: "keepalive", requests: None, connections: 256, ..spec };
        let w = keepalive.warmup_run(300, Duration::from_millis(300));
        assert_eq!((w.requests, w.connections), (Some(300), 256));
    }

    #[test]
    fn durations_reach_the_generator_to_the_millisecond() {
        assert_eq!(secs_arg(Duration::from_secs(2)), "2");
        assert_eq!(secs_arg(Duration::from_millis(500)), "0.5");
        assert_eq!(secs_arg(Duration::from_millis(1250)), "1.25");
        assert_eq!(secs_arg(Duration::from_millis(10)), "0.01");
        assert_eq!(secs_arg(Duration::ZERO), "0");
    }

    #[test]
    fn figures_include_cpu_ready_keys() {
        let mut r = LoadReport { completed: 2000, rate_per_s: 100.0, ..Default::default() };
        r.latency_us.p99 = 35_590.0;
        let f = figures_of(&r);
        assert_eq!(f["p99_ms"], 35.59);
        assert_eq!(f[METRIC_RATE], 100.0);
    }
}
