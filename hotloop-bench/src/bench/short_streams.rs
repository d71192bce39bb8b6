//! `short-streams`: short request/response connections at a fixed rate;
//! the figures are server CPU per connection and epoll registrations per
//! connection, for eager against lazy registration, with and without
//! `TCP_DEFER_ACCEPT`.

use std::time::Duration;

use super::report::{Better, Column};
use super::{Ctx, LoadSpec, ScenarioResult, ServerSpec, Workload, METRIC_CPU_PER_1K};

/// Connections per second offered.
const RATE_FULL: u64 = 5_000;
/// Connections per second offered with `--quick`.
const RATE_QUICK: u64 = 2_000;
/// Each measured run.
const DURATION_FULL: Duration = Duration::from_secs(5);
/// Each measured run with `--quick`.
const DURATION_QUICK: Duration = Duration::from_millis(500);
/// Clients sharing the rate.
const CLIENTS: u64 = 8;
/// Response body bytes.
const BODY_BYTES: usize = 256;

/// The table's columns; the first is the headline.
pub fn columns() -> Vec<Column> {
    let col = |key, header, decimals, better| Column { key, header, decimals, better };
    vec![
        col(METRIC_CPU_PER_1K, "CPU s/1k conn", 4, Better::Lower),
        col("registrations_per_conn", "registrations/conn", 2, Better::Lower),
        col("stats_registrations_avoided", "registrations avoided", 0, Better::Higher),
        col("rate_per_s", "conn/s", 0, Better::Higher),
        col("p99_us", "p99 µs", 0, Better::Lower),
    ]
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> ScenarioResult {
    let (rate, duration) =
        if ctx.quick { (RATE_QUICK, DURATION_QUICK) } else { (RATE_FULL, DURATION_FULL) };
    let mut result = ScenarioResult::new(
        "short-streams",
        &format!("short HTTP connections at {rate}/s: server CPU and epoll registrations per connection"),
        "s2n-quic-dc TCP_DEFER_ACCEPT + lazy epoll registration: 8.8% less CPU overall, acceptor 23% -> 18% of the workload",
        columns(),
    );
    result.setup.push(format!(
        "{BODY_BYTES}-byte bodies; CPU from /proc/PID/stat (utime+stime) around each run"
    ));
    let work = Workload { proto: "http".into(), body_size: BODY_BYTES, work_us: 0 };
    let load = LoadSpec {
        mode: "churn",
        connections: CLIENTS,
        requests: None,
        duration,
        size: BODY_BYTES,
        rate: Some(rate),
        sources: 8,
        warmup: Duration::ZERO,
        spin: false,
    };
    let mut specs = Vec::new();
    for register in ["eager", "lazy"] {
        for defer in ["off", "1"] {
            let config = format!("register {register}, defer-accept {defer}");
            specs.push(ServerSpec::hotloop(
                &config,
                &["--driver", "epoll", "--register", register, "--defer-accept", defer],
            ));
        }
    }
    specs.extend(ctx.peer_specs("http", &mut result.setup));
    for spec in &specs {
        let row = ctx.measure("", spec, &work, &load);
        result.rows.push(row);
    }
    result
}
