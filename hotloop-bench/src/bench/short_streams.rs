//! `short-streams`: short request/response connections at a fixed rate;
//! the figures are server CPU per connection and epoll registrations per
//! connection, for eager against lazy registration, with and without
//! `TCP_DEFER_ACCEPT`.

use super::report::{Better, Column};
use super::{Ctx, LoadSpec, ScenarioResult, ServerSpec, Workload, METRIC_CPU_PER_1K};

/// Connections per second offered.
const RATE_FULL: u64 = 5_000;
/// Connections per second offered with `--quick`.
const RATE_QUICK: u64 = 2_000;
/// Seconds per measured run.
const DURATION_FULL_S: u64 = 5;
/// Seconds per measured run with `--quick`.
const DURATION_QUICK_S: u64 = 1;
/// Clients sharing the rate.
const CLIENTS: u64 = 8;
/// Response body bytes.
const BODY_BYTES: usize = 256;

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> ScenarioResult {
    let (rate, duration) =
        if ctx.quick { (RATE_QUICK, DURATION_QUICK_S) } else { (RATE_FULL, DURATION_FULL_S) };
    let mut result = ScenarioResult::new(
        "short-streams",
        &format!("short HTTP connections at {rate}/s: server CPU and epoll registrations per connection"),
        "s2n-quic-dc TCP_DEFER_ACCEPT + lazy epoll registration: 8.8% less CPU overall, acceptor 23% -> 18% of the workload",
        vec![
            Column { key: METRIC_CPU_PER_1K, header: "CPU s/1k conn", decimals: 4, better: Better::Lower },
            Column { key: "registrations_per_conn", header: "registrations/conn", decimals: 2, better: Better::Lower },
            Column { key: "stats_registrations_avoided", header: "registrations avoided", decimals: 0, better: Better::Higher },
            Column { key: "rate_per_s", header: "conn/s", decimals: 0, better: Better::Higher },
            Column { key: "p99_us", header: "p99 µs", decimals: 0, better: Better::Lower },
        ],
    );
    result.setup.push(format!(
        "{BODY_BYTES}-byte bodies; CPU from /proc/PID/stat (utime+stime) around each run"
    ));
    let work = Workload { proto: "http".into(), body_size: BODY_BYTES, work_us: 0 };
    let load = LoadSpec {
        mode: "churn",
        connections: CLIENTS,
        requests: None,
        duration_secs: duration,
        size: BODY_BYTES,
        rate: Some(rate),
        sources: 8,
        warmup_secs: 0,
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
