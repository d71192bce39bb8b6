//! `hyper`: the same hyper service on hotloop (both drivers) and on tokio
//! (a current-thread runtime per worker): keep-alive requests per second,
//! and server CPU per 1,000 requests at a fixed rate both can sustain.

use std::time::Duration;

use super::report::{Better, Column};
use super::{Ctx, LoadSpec, ScenarioResult, ServerSpec, Workload, METRIC_CPU_PER_1K};

/// Each measured run.
const DURATION_FULL: Duration = Duration::from_secs(5);
/// Each measured run with `--quick`.
const DURATION_QUICK: Duration = Duration::from_millis(500);
/// Keep-alive connections.
const CONNECTIONS: u64 = 64;
/// The fixed rate of the CPU comparison, requests per second.
const FIXED_RATE: u64 = 10_000;
/// Response body bytes (1 KiB: a small API answer, not an empty one).
const BODY_BYTES: usize = 1024;

/// The table's columns; the first is the headline.
pub fn columns() -> Vec<Column> {
    let col = |key, header, decimals, better| Column { key, header, decimals, better };
    vec![
        col("rate_per_s", "req/s", 0, Better::Higher),
        col("p50_us", "p50 µs", 1, Better::Lower),
        col("p99_us", "p99 µs", 1, Better::Lower),
        col(METRIC_CPU_PER_1K, "CPU s/1k req", 4, Better::Lower),
        col("not_sent", "not sent", 0, Better::Lower),
        col("errors", "errors", 0, Better::Lower),
    ]
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> ScenarioResult {
    let duration = if ctx.quick { DURATION_QUICK } else { DURATION_FULL };
    let mut result = ScenarioResult::new(
        "hyper",
        "one hyper service (HTTP/1.1 keep-alive) on hotloop and on tokio",
        "no seed: hotloop must run hyper unchanged and beat tokio underneath it (at least as fast, 5% less CPU per request)",
        columns(),
    );
    result.setup.push(format!(
        "{BODY_BYTES}-byte bodies, closed loop and open loop at {FIXED_RATE}/s; \
         servers: `hotloop serve hyper`, `hotloop-bench peer tokio hyper`; each repeat runs against every \
         server in turn"
    ));
    let work = Workload { proto: "hyper".into(), body_size: BODY_BYTES, work_us: 0 };
    let mut specs = vec![ServerSpec::hotloop("epoll", &["--driver", "epoll"])];
    specs.extend(ctx.hotloop_uring("uring", &["--driver", "uring"]));
    specs.push(ServerSpec::peer("tokio"));
    for (group, rate) in [("as fast as it goes", None), ("fixed rate", Some(FIXED_RATE))] {
        let load = LoadSpec {
            mode: "keepalive",
            connections: CONNECTIONS,
            requests: None,
            duration,
            size: BODY_BYTES,
            rate,
            sources: 1,
            warmup: Duration::ZERO,
            spin: false,
        };
        // Repeats interleaved across the servers (none busy-polls).
        result.rows.extend(ctx.measure_side_by_side(group, &specs, &work, &load));
    }
    result.compare_as(&["epoll", "uring"]);
    result
}
