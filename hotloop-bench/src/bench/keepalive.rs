//! `keepalive`: persistent HTTP connections at concurrency 1 and 256, and
//! at concurrency 1 with busy polling: hotloop's `always` and `adaptive`
//! against the floors that busy-poll.

use std::time::Duration;

use super::report::{Better, Column};
use super::{Ctx, LoadSpec, ScenarioResult, ServerSpec, Workload, METRIC_CPU_PER_1K};

/// Each measured run.
const DURATION_FULL: Duration = Duration::from_secs(5);
/// Each measured run with `--quick`.
const DURATION_QUICK: Duration = Duration::from_millis(500);
/// The concurrencies compared.
const CONCURRENCY: [u64; 2] = [1, 256];
/// Response body bytes.
const BODY_BYTES: usize = 64;
/// Connections in the open-loop group.
const OPEN_LOOP_CONNECTIONS: u64 = 256;
/// hotloop's busy polling settings in the busy-polling group.
const BUSY_POLL: [&str; 2] = ["always", "adaptive"];
/// Requests per second in the open-loop group: a moderate rate, about a
/// third of what one worker serves here, so p50 shows the latency a server
/// adds when it is not busy.
const OPEN_LOOP_RATE: u64 = 50_000;

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
        "keepalive",
        "persistent HTTP/1.1 connections, one request in flight per connection",
        "no external reference: hotloop's steady-state request path against its peers",
        columns(),
    );
    result.setup.push(format!(
        "{BODY_BYTES}-byte bodies; every server is started and warmed up, then each repeat runs against all of \
         them in turn, so a slow spell of a shared machine falls on all alike"
    ));
    let work = Workload { proto: "http".into(), body_size: BODY_BYTES, work_us: 0 };
    let mut specs = vec![ServerSpec::hotloop("epoll", &["--driver", "epoll"])];
    specs.extend(ctx.hotloop_uring("uring", &["--driver", "uring"]));
    specs.extend(ctx.peer_specs("http", &mut result.setup));
    specs.extend(ctx.floor_uring_spec());
    for c in CONCURRENCY {
        let load = LoadSpec {
            mode: "keepalive",
            connections: c,
            requests: None,
            duration,
            size: BODY_BYTES,
            rate: None,
            sources: 1,
            warmup: Duration::ZERO,
            spin: false,
        };
        // Repeats interleaved across the servers (none busy-polls).
        let group = format!("concurrency {c}");
        result.rows.extend(ctx.measure_side_by_side(&group, &specs, &work, &load));
        if c == 1 {
            let busy = busy_specs(ctx);
            if busy.iter().any(|s| s.server == "floor") {
                result.setup.push(
                    "concurrency 1, busy polling: hotloop with `--busy-poll always|adaptive` against the floors \
                     with `--busy-poll`; each server busy-polls on its CPU only in its turn, held stopped \
                     (SIGSTOP) while another runs"
                        .into(),
                );
                let group = format!("concurrency {c}, busy polling");
                result.rows.extend(ctx.measure_side_by_side(&group, &busy, &work, &load));
            }
        }
    }
    let open_loop = LoadSpec {
        mode: "keepalive",
        connections: OPEN_LOOP_CONNECTIONS,
        requests: None,
        duration,
        size: BODY_BYTES,
        rate: Some(OPEN_LOOP_RATE),
        sources: 1,
        warmup: Duration::ZERO,
        spin: true,
    };
    result.setup.push(format!(
        "open loop: {OPEN_LOOP_CONNECTIONS} connections at {OPEN_LOOP_RATE} requests/s, latency from each \
         request's intended send; the generator busy-waits for each start when it has a CPU of its own \
         (`--spin`), so its own wake-up is not in the figures"
    ));
    let group = format!("open loop {OPEN_LOOP_RATE}/s, {OPEN_LOOP_CONNECTIONS} connections");
    result.rows.extend(ctx.measure_side_by_side(&group, &specs, &work, &open_loop));
    // hotloop's defaults on each driver, and `always` where the group is
    // about busy polling (compared with the floors that busy-poll).
    result.compare_as(&["epoll", "uring", "epoll busy-poll always", "uring busy-poll always"]);
    result
}

/// hotloop on each driver with each busy polling setting, then the floors
/// that busy-poll.
fn busy_specs(ctx: &Ctx) -> Vec<ServerSpec> {
    let mut specs = Vec::new();
    for driver in ["epoll", "uring"] {
        for b in BUSY_POLL {
            specs.push(ServerSpec::hotloop(
                &format!("{driver} busy-poll {b}"),
                &["--driver", driver, "--busy-poll", b],
            ));
        }
    }
    specs.extend(ctx.floor_busy_specs());
    specs
}
