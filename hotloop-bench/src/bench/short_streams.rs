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
/// How long a connection may take, at the offered rate, before the
/// generator runs out of connections for the starts due: the client pool
/// is the rate times this (Little's law), so a server that keeps up never
/// leaves a start waiting for a free connection.
const LATENCY_ROOM: Duration = Duration::from_millis(50);
/// The fewest clients sharing the rate.
const CLIENTS_MIN: u64 = 64;
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
        col("not_sent", "not sent", 0, Better::Lower),
        col("errors", "errors", 0, Better::Lower),
    ]
}

/// Clients for an open loop at `rate` per second: enough for every
/// connection to take [`LATENCY_ROOM`], and at least [`CLIENTS_MIN`].
pub fn clients_for(rate: u64) -> u64 {
    let room = (rate as f64 * LATENCY_ROOM.as_secs_f64()).ceil() as u64;
    room.max(CLIENTS_MIN)
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
    let clients = clients_for(rate);
    result.setup.push(format!(
        "{BODY_BYTES}-byte bodies; CPU from the server's CPU clock (every thread, nanoseconds) around each \
         run; {clients} clients share the rate, room for {} ms per connection; \"not sent\" counts starts due \
         that the generator could not send (it fell behind), which leave no latency sample",
        LATENCY_ROOM.as_millis()
    ));
    let work = Workload { proto: "http".into(), body_size: BODY_BYTES, work_us: 0 };
    let load = LoadSpec {
        mode: "churn",
        connections: clients,
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
    // The default: lazy registration, no TCP_DEFER_ACCEPT.
    result.compare_as(&["register lazy, defer-accept off"]);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_pool_holds_the_rate_times_the_latency_room() {
        // 8 clients at 5,000/s left 1.6 ms per connection: any slower server
        // made the generator's queue grow.
        assert_eq!(clients_for(RATE_FULL), 250);
        assert_eq!(clients_for(RATE_QUICK), 100);
        assert_eq!(clients_for(100), CLIENTS_MIN);
    }
}
