//! `serial`: one connection at a time over loopback (connect, one HTTP
//! request, close), terminated by the server and forwarded through
//! `hotloop proxy`; hotloop with busy polling off, always and adaptive.
//! Forwarded, each proxy is compared with one doing the same work: TCP
//! forwarding (`hotloop proxy`, haproxy `mode tcp`) and HTTP forwarding
//! (`hotloop proxy --mode http`, haproxy `mode http`).
//!
//! Locally, hotloop is measured side by side with the floors, both the one
//! that sleeps in the kernel and the one that busy-polls (the reference for
//! `always` and `adaptive`), their repeats interleaved; after each run the
//! server is left without load for a few seconds and its CPU time read, so
//! what busy polling costs when idle has a figure.

use super::report::{Better, Column};
use super::{
    find_on_path, Ctx, LoadSpec, PeerName, ScenarioResult, ServerKind, ServerSpec, Workload,
    METRIC_CPU_PER_1K, METRIC_IDLE_CPU,
};
use std::time::Duration;

/// Each measured run.
const DURATION_FULL: Duration = Duration::from_secs(5);
/// Each measured run with `--quick`.
const DURATION_QUICK: Duration = Duration::from_millis(500);
/// Response body bytes: small, like the redirects in haproxy's test.
const BODY_BYTES: usize = 64;
/// The busy polling settings compared.
const BUSY_POLL: [&str; 3] = ["off", "always", "adaptive"];
/// The time without load after each local run over which idle CPU is read.
const IDLE_WINDOW_FULL: Duration = Duration::from_secs(3);
/// The idle window with `--quick`.
const IDLE_WINDOW_QUICK: Duration = Duration::from_millis(500);

/// The table's columns; the first is the headline.
pub fn columns() -> Vec<Column> {
    let col = |key, header, decimals, better| Column { key, header, decimals, better };
    vec![
        col("rate_per_s", "conn/s", 0, Better::Higher),
        col("mean_us", "mean µs", 1, Better::Lower),
        col("p50_us", "p50 µs", 1, Better::Lower),
        col("p99_us", "p99 µs", 1, Better::Lower),
        col("server_cpu_pct", "server CPU %", 0, Better::Lower),
        col(METRIC_CPU_PER_1K, "CPU s/1k conn", 4, Better::Lower),
        col("stats_poller_spins", "poller spins", 0, Better::Lower),
        col(METRIC_IDLE_CPU, "idle CPU %", 1, Better::Lower),
        col("errors", "errors", 0, Better::Lower),
    ]
}

/// Runs the scenario.
pub fn run(ctx: &mut Ctx) -> ScenarioResult {
    let duration = if ctx.quick { DURATION_QUICK } else { DURATION_FULL };
    let mut result = ScenarioResult::new(
        "serial",
        "one connection at a time: connect, one HTTP request, close",
        "haproxy busy-polling: 4,640 -> 8,540 conn/s forwarded, 12,500 -> 21,250 conn/s terminated locally",
        columns(),
    );
    result.setup.push(format!(
        "{BODY_BYTES}-byte bodies; forwarded: a proxy on the server CPUs -> `hotloop serve http --busy-poll off`: \
         TCP forwarding, `hotloop proxy` (its default `--mode tcp`) beside haproxy `mode tcp`; HTTP forwarding, \
         `hotloop proxy --mode http` beside haproxy `mode http` (haproxy when on PATH)"
    ));
    if ctx.server_cpus.len() < 2 {
        result.setup.push(
            "forwarded: with one server CPU the backend runs on the load generator's CPU, so the proxy has a core of its own"
                .into(),
        );
    }
    let work = Workload { proto: "http".into(), body_size: BODY_BYTES, work_us: 0 };
    let load = LoadSpec {
        mode: "serial",
        connections: 1,
        requests: None,
        duration,
        size: BODY_BYTES,
        rate: None,
        sources: 4,
        warmup: Duration::ZERO,
        spin: false,
    };
    let mut local: Vec<ServerSpec> = BUSY_POLL
        .iter()
        .map(|b| {
            ServerSpec::hotloop(
                &format!("epoll busy-poll {b}"),
                &["--driver", "epoll", "--busy-poll", b],
            )
        })
        .collect();
    local.extend(ctx.peer_specs("http", &mut result.setup));
    // Each floor beside its busy-polling twin.
    let mut busy_floors = ctx.floor_busy_specs().into_iter();
    if ctx.peers.contains(&PeerName::Floor) {
        local.extend(busy_floors.next());
    }
    local.extend(ctx.floor_uring_spec());
    local.extend(busy_floors);
    let idle = if ctx.quick { IDLE_WINDOW_QUICK } else { IDLE_WINDOW_FULL };
    result.setup.push(format!(
        "local: every server is started and warmed up, then each repeat runs against all of them in turn; a \
         busy-polling server is held stopped (SIGSTOP) while another runs; idle CPU % is the server's CPU time \
         (its CPU clock) over the {} s right after each run, with no load",
        super::load::secs_arg(idle)
    ));
    let rows = ctx.measure_side_by_side_then_idle("local", &local, &work, &load, idle);
    result.rows.extend(rows);
    for (group, http) in [(GROUP_TCP, false), (GROUP_HTTP, true)] {
        for spec in &forwarded_specs(ctx, http) {
            let row = ctx.measure(group, spec, &work, &load);
            result.rows.push(row);
        }
    }
    // The defaults, by name: busy polling off, locally and forwarded.
    result.compare_as(&[
        "epoll busy-poll off",
        "proxy busy-poll off",
        "proxy --mode http busy-poll off",
    ]);
    result
}

/// The group of `hotloop proxy` (TCP) beside haproxy `mode tcp`.
pub const GROUP_TCP: &str = "TCP forwarding";
/// The group of `hotloop proxy --mode http` beside haproxy `mode http`.
pub const GROUP_HTTP: &str = "HTTP forwarding";

/// hotloop's proxy with each busy polling setting, then haproxy without
/// and with `busy-polling`, all forwarding the same way: TCP connections
/// byte for byte, or (`http`) HTTP requests.
pub fn forwarded_specs(ctx: &Ctx, http: bool) -> Vec<ServerSpec> {
    let mut specs = Vec::new();
    let mode = if http { " --mode http" } else { "" };
    for b in BUSY_POLL {
        specs.push(ServerSpec {
            server: "hotloop".into(),
            config: format!("proxy{mode} busy-poll {b}"),
            kind: ServerKind::Proxy { busy_poll: b.to_string(), http },
        });
    }
    if ctx.peers.contains(&PeerName::Haproxy) {
        if let Some(program) = find_on_path("haproxy") {
            let mode = if http { "mode http" } else { "mode tcp" };
            for busy_polling in [false, true] {
                let busy = if busy_polling { "busy-polling" } else { "no busy-polling" };
                specs.push(ServerSpec {
                    server: "haproxy".into(),
                    config: format!("{mode}, {busy}"),
                    kind: ServerKind::HaproxyForward {
                        program: program.clone(),
                        busy_polling,
                        http,
                    },
                });
            }
        }
    }
    specs
}
