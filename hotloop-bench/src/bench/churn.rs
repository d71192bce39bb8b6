//! `churn`: thousands of concurrent connections, one request each, with the
//! server made the bottleneck by `--work-us`; hotloop accepting without a
//! bound per wakeup against at most 32, and the peers, at 1K, 8K and 16K
//! bodies.

use super::report::{Better, Column};
use super::{
    Ctx, LoadSpec, ScenarioResult, ServerSpec, Workload, METRIC_CPU_PER_1K, METRIC_CPU_UTIL,
};

/// Concurrent connections in the full run. The original test used 30,000;
/// here a process may hold 20,000 files (a hard limit), and the load
/// generator holds one per connection, so the run stays just under it.
const CONNECTIONS_FULL: u64 = 19_900;
/// Concurrent connections with `--quick`.
const CONNECTIONS_QUICK: u64 = 1_000;
/// Connections opened per concurrent slot in a run (one request each).
const ROUNDS: u64 = 3;
/// CPU microseconds per request, so the server, not the load, saturates.
const WORK_US: u64 = 60;
/// Body sizes, as in the original test.
const BODIES: [(&str, usize); 3] = [("1K", 1024), ("8K", 8192), ("16K", 16_384)];
/// Upper bound on one run, seconds.
const DURATION_MAX_FULL_S: u64 = 60;
/// Upper bound on one run with `--quick`, seconds.
const DURATION_MAX_QUICK_S: u64 = 2;

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> ScenarioResult {
    let connections = if ctx.quick { CONNECTIONS_QUICK } else { CONNECTIONS_FULL };
    let requests = connections * ROUNDS;
    let mut result = ScenarioResult::new(
        "churn",
        &format!("{connections} concurrent connections, 1 request each, {WORK_US} µs of work per request"),
        "DragonFly at most 32 accepts per kevent, 30,000 connections: 1K p99 69.02 -> 35.59 ms, \
         210,280 -> 217,599 tps; 8K 80.61 -> 48.69 ms; 16K 135.47 -> 92.07 ms",
        vec![
            Column { key: "rate_per_s", header: "tps", decimals: 0, better: Better::Higher },
            Column { key: "mean_ms", header: "lat-avg ms", decimals: 2, better: Better::Lower },
            Column { key: "stdev_ms", header: "lat-stdev ms", decimals: 2, better: Better::Lower },
            Column { key: "p99_ms", header: "lat-99% ms", decimals: 2, better: Better::Lower },
            Column { key: METRIC_CPU_UTIL, header: "server CPU %/worker", decimals: 0, better: Better::Lower },
            Column { key: METRIC_CPU_PER_1K, header: "CPU s/1k req", decimals: 4, better: Better::Lower },
            Column { key: "errors", header: "errors", decimals: 0, better: Better::Lower },
        ],
    );
    result.setup.push(format!(
        "{connections} concurrent connections, {requests} in all,, not the original 30,000: 20,000 open files per process is a hard limit here"
    ));
    result.setup.push(format!(
        "the server does {WORK_US} µs of work per request; \"server CPU %/worker\" near 100 shows it is the bottleneck"
    ));
    let duration = if ctx.quick { DURATION_MAX_QUICK_S } else { DURATION_MAX_FULL_S };
    let mut peers = ctx.peer_specs("http", &mut result.setup);
    let mut specs = vec![
        ServerSpec::hotloop(
            "epoll max-accepts unlimited",
            &["--driver", "epoll", "--max-accepts", "unlimited"],
        ),
        ServerSpec::hotloop("epoll max-accepts 32", &["--driver", "epoll", "--max-accepts", "32"]),
    ];
    specs.append(&mut peers);
    for (group, body) in BODIES {
        let work = Workload { proto: "http".into(), body_size: body, work_us: WORK_US };
        let load = LoadSpec {
            mode: "churn",
            connections,
            requests: Some(requests),
            duration_secs: duration,
            size: body,
            rate: None,
            sources: 8,
        };
        for spec in &specs {
            let row = ctx.measure(&format!("{group} body"), spec, &work, &load);
            result.rows.push(row);
        }
    }
    result
}
