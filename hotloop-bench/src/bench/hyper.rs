//! `hyper`: the same hyper service on hotloop (both drivers) and on tokio
//! (a current-thread runtime per worker): keep-alive requests per second,
//! and server CPU per 1,000 requests at a fixed rate both can sustain.

use super::report::{Better, Column};
use super::{Ctx, LoadSpec, ScenarioResult, ServerSpec, Workload, METRIC_CPU_PER_1K};

/// Seconds per measured run.
const DURATION_FULL_S: u64 = 5;
/// Seconds per measured run with `--quick`.
const DURATION_QUICK_S: u64 = 1;
/// Keep-alive connections.
const CONNECTIONS: u64 = 64;
/// The fixed rate of the CPU comparison, requests per second.
const FIXED_RATE: u64 = 10_000;
/// Response body bytes (1 KiB: a small API answer, not an empty one).
const BODY_BYTES: usize = 1024;

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> ScenarioResult {
    let duration = if ctx.quick { DURATION_QUICK_S } else { DURATION_FULL_S };
    let mut result = ScenarioResult::new(
        "hyper",
        "one hyper service (HTTP/1.1 keep-alive) on hotloop and on tokio",
        "no seed: hotloop must run hyper unchanged and beat tokio underneath it (at least as fast, 5% less CPU per request)",
        vec![
            Column { key: "rate_per_s", header: "req/s", decimals: 0, better: Better::Higher },
            Column { key: "p50_us", header: "p50 µs", decimals: 1, better: Better::Lower },
            Column { key: "p99_us", header: "p99 µs", decimals: 1, better: Better::Lower },
            Column { key: METRIC_CPU_PER_1K, header: "CPU s/1k req", decimals: 4, better: Better::Lower },
        ],
    );
    result.setup.push(format!(
        "{BODY_BYTES}-byte bodies, closed loop and open loop at {FIXED_RATE}/s; \
         servers: `hotloop serve hyper`, `hotloop-bench peer tokio hyper`; each repeat runs against every \
         server in turn"
    ));
    let work = Workload { proto: "hyper".into(), body_size: BODY_BYTES, work_us: 0 };
    let specs = vec![
        ServerSpec::hotloop("epoll", &["--driver", "epoll"]),
        ServerSpec::hotloop("uring", &["--driver", "uring"]),
        ServerSpec::peer("tokio"),
    ];
    for (group, rate) in [("as fast as it goes", None), ("fixed rate", Some(FIXED_RATE))] {
        let load = LoadSpec {
            mode: "keepalive",
            connections: CONNECTIONS,
            requests: None,
            duration_secs: duration,
            size: BODY_BYTES,
            rate,
            sources: 1,
            warmup_secs: 0,
            spin: false,
        };
        // Repeats interleaved across the servers (none busy-polls).
        result.rows.extend(ctx.measure_side_by_side(group, &specs, &work, &load));
    }
    result
}
