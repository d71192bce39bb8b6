//! `accept-burst`: many clients connect at once, each writes 128 bytes,
//! reads the echo and closes; the figure is the total time. hotloop's
//! io_uring multishot accept against single-shot accept, and the peers.

use std::time::Duration;

use super::report::{Better, Column};
use super::{Ctx, LoadSpec, ScenarioResult, ServerSpec, Workload, METRIC_CPU_PER_1K};

/// Clients in the full run, as in the io_uring multishot accept test.
const CLIENTS_FULL: u64 = 10_000;
/// Clients with `--quick`.
const CLIENTS_QUICK: u64 = 2_000;
/// Echo message bytes.
const MESSAGE_BYTES: usize = 128;
/// Upper bound on one burst.
const BURST_DURATION_MAX: Duration = Duration::from_secs(60);
/// Upper bound on one burst with `--quick`.
const BURST_DURATION_MAX_QUICK: Duration = Duration::from_secs(10);

/// The table's columns; the first is the headline.
pub fn columns() -> Vec<Column> {
    vec![
        Column { key: "elapsed_ms", header: "total ms", decimals: 1, better: Better::Lower },
        Column { key: "rate_per_s", header: "conn/s", decimals: 0, better: Better::Higher },
        Column { key: "p99_us", header: "p99 µs", decimals: 0, better: Better::Lower },
        Column { key: "errors", header: "errors", decimals: 0, better: Better::Lower },
        Column {
            key: METRIC_CPU_PER_1K,
            header: "CPU s/1k conn",
            decimals: 4,
            better: Better::Lower,
        },
        Column {
            key: "accepted_per_wakeup",
            header: "accepts/wakeup",
            decimals: 1,
            better: Better::Higher,
        },
    ]
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> ScenarioResult {
    let clients = if ctx.quick { CLIENTS_QUICK } else { CLIENTS_FULL };
    let mut result = ScenarioResult::new(
        "accept-burst",
        &format!("{clients} clients at once, {MESSAGE_BYTES}-byte echo, connect/write/read/close"),
        "io_uring multishot accept: 1,927,634 -> 1,894,750 clock() cycles, 1.65% less time than single-shot (10,000 clients)",
        columns(),
    );
    result.setup.push(format!(
        "{clients} clients, {MESSAGE_BYTES}-byte messages; each hotloop row names its driver and accept mode; \
         accept pacing off, so the rows compare the accept calls themselves (a paced listener takes one \
         `accept4` per connection on io_uring too); \"{DEFAULT_CONFIG}\" is hotloop's default (multishot, \
         pacing on), the configuration compared with the peers"
    ));
    let work = Workload { proto: "echo".into(), body_size: 0, work_us: 0 };
    let load = LoadSpec {
        mode: "burst",
        connections: clients,
        requests: Some(clients),
        duration: if ctx.quick { BURST_DURATION_MAX_QUICK } else { BURST_DURATION_MAX },
        size: MESSAGE_BYTES,
        rate: None,
        sources: 4,
        warmup: Duration::ZERO,
        spin: false,
    };
    let unpaced =
        |driver, accept| vec!["--driver", driver, "--accept", accept, "--accept-pacing", "off"];
    let mut specs = vec![
        ServerSpec::hotloop(DEFAULT_CONFIG, &["--driver", "uring"]),
        ServerSpec::hotloop("uring multishot", &unpaced("uring", "multishot")),
        ServerSpec::hotloop("uring single", &unpaced("uring", "single")),
        ServerSpec::hotloop("epoll", &unpaced("epoll", "multishot")),
    ];
    specs.extend(ctx.peer_specs("echo", &mut result.setup));
    for spec in &specs {
        let row = ctx.measure("", spec, &work, &load);
        result.rows.push(row);
    }
    result.compare_as(&[DEFAULT_CONFIG]);
    result
}

/// The row of hotloop's defaults on io_uring (multishot accept, pacing on).
pub const DEFAULT_CONFIG: &str = "uring paced (default)";
