//! `churn`: the seed's table shape (1K, 8K and 16K bodies, one request per
//! connection, many connections in flight), at an open-loop connection
//! rate the server sustains: hotloop accepting without a bound per wakeup
//! against at most 32, and the peers. Latency is reported from the
//! request's send (what the seed's tool measured) and from the start of
//! connect(2).
//!
//! A saturated server here only moves a fixed total wait (Little's law)
//! between the kernel's accept queue and its run queue; the `storm`
//! scenario is the one where an accept bound can matter.

use std::time::Duration;

use super::report::{Better, Column};
use super::{
    Ctx, LoadSpec, ScenarioResult, ServerSpec, Workload, METRIC_CPU_PER_1K, METRIC_CPU_UTIL,
};

/// The most connections in flight, full run. The original test kept
/// 30,000 open; here a process may hold 20,000 files (a hard limit), and
/// an open-loop rate the server sustains never needs that many.
const CONNECTIONS_FULL: u64 = 4_000;
/// The most connections in flight with `--quick`.
const CONNECTIONS_QUICK: u64 = 500;
/// New connections per second, full run: about a fifth of what one
/// worker serves with [`WORK_US`] of work per request when it has its core
/// to itself, and under half of what it served on the shared development
/// machine, where other processes took most of its core; so nothing queues
/// for long and no SYN is dropped.
const RATE_FULL: u64 = 2_000;
/// New connections per second with `--quick`.
const RATE_QUICK: u64 = 2_000;
/// CPU microseconds per request, as in the storm scenario.
const WORK_US: u64 = 60;
/// Body sizes, as in the original test.
const BODIES: [(&str, usize); 3] = [("1K", 1024), ("8K", 8192), ("16K", 16_384)];
/// Each run.
const DURATION_FULL: Duration = Duration::from_secs(5);
/// Each run with `--quick`.
const DURATION_QUICK: Duration = Duration::from_secs(1);

/// The table's columns; the first is the headline.
pub fn columns() -> Vec<Column> {
    let col = |key, header, decimals, better| Column { key, header, decimals, better };
    vec![
        col("rate_per_s", "tps", 0, Better::Higher),
        col("req_mean_ms", "lat-avg ms", 2, Better::Lower),
        col("req_stdev_ms", "lat-stdev ms", 2, Better::Lower),
        col("req_p99_ms", "lat-99% ms", 2, Better::Lower),
        col("p99_ms", "from connect p99 ms", 2, Better::Lower),
        col(METRIC_CPU_UTIL, "server CPU %/worker", 0, Better::Lower),
        col(METRIC_CPU_PER_1K, "CPU s/1k req", 4, Better::Lower),
        col("not_sent", "not sent", 0, Better::Lower),
        col("errors", "errors", 0, Better::Lower),
    ]
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> ScenarioResult {
    let connections = if ctx.quick { CONNECTIONS_QUICK } else { CONNECTIONS_FULL };
    let rate = if ctx.quick { RATE_QUICK } else { RATE_FULL };
    let mut result = ScenarioResult::new(
        "churn",
        &format!("{rate} new connections/s (at most {connections} in flight), 1 request each, {WORK_US} µs of work per request"),
        "DragonFly at most 32 accepts per kevent, 30,000 connections: 1K p99 69.02 -> 35.59 ms, \
         210,280 -> 217,599 tps; 8K 80.61 -> 48.69 ms; 16K 135.47 -> 92.07 ms",
        columns(),
    );
    result.setup.push(format!(
        "open loop at {rate} connections/s, below what the server serves, so the table compares servers that keep up; \
         lat-* run from the request's send (the seed's tool), \"from connect\" from the start of connect(2) and the \
         intended start; errors are the load generator's (connect, reset, timeout), none expected at this rate"
    ));
    result.setup.push(format!(
        "the server does {WORK_US} µs of work per request; at 30,000 concurrent connections (the seed) a process here \
         runs out of its 20,000 open files, and a saturated server only trades the kernel's queue for its own \
         (see storm)"
    ));
    result.setup.push(
        "per body size, every server is started and warmed up, then each repeat runs against all of them in turn"
            .into(),
    );
    let duration = if ctx.quick { DURATION_QUICK } else { DURATION_FULL };
    let mut peers = ctx.peer_specs("http", &mut result.setup);
    let mut specs = vec![
        ServerSpec::hotloop(
            "epoll max-accepts unlimited",
            &["--driver", "epoll", "--max-accepts", "unlimited", "--accept-pacing", "off"],
        ),
        ServerSpec::hotloop(
            "epoll max-accepts 32",
            &["--driver", "epoll", "--max-accepts", "32", "--accept-pacing", "off"],
        ),
        ServerSpec::hotloop("epoll paced", &["--driver", "epoll", "--accept-pacing", "on"]),
    ];
    specs.append(&mut peers);
    // --quick measures the 1K body only.
    let bodies = if ctx.quick { &BODIES[..1] } else { &BODIES[..] };
    for &(group, body) in bodies {
        let work = Workload { proto: "http".into(), body_size: body, work_us: WORK_US };
        let load = LoadSpec {
            mode: "churn",
            connections,
            requests: None,
            duration,
            size: body,
            rate: Some(rate),
            sources: 8,
            warmup: Duration::ZERO,
            spin: false,
        };
        // Repeats interleaved across the servers, so the ratios to the
        // floor hold round by round on a shared machine.
        let group = format!("{group} body");
        result.rows.extend(ctx.measure_side_by_side(&group, &specs, &work, &load));
    }
    // The default: paced accepts within the bound of 32. nginx, haproxy
    // and h2o skip the work per request: reference rows, not compared.
    result.compare_as(&["epoll paced"]);
    result
}
