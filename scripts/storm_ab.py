#!/usr/bin/env python3
"""The storm scenario's two loads against servers alternated round by round.

    scripts/storm_ab.py ROUNDS NAME=CMD NAME=CMD [...]

Each round starts every server in turn (the order reversed every other
round), runs the storm scenario's loads against it as
`hotloop-bench bench --scenario storm` does (64 established keep-alive
connections at 4,000 requests per second, open loop, and half a second
later a storm of 19,000 one-request clients; 1 KiB bodies), reads its stats
endpoint, and stops it. The servers are not pinned and neither are the
loads, as in the bench with two workers on two CPUs (PIN=1 puts the loads
on CPU 1, for servers started with `--workers 1 --pin` on CPU 0).
Prints each run's established p99 and p50, the server's share of the p99
(the latency less the generator's own lag), the generator's lag, the
requests whose segments the kernel retransmitted and the storm's rate, then
each server's median p99 over the rounds; alternating the servers puts each
pair of runs a few seconds apart, which a shared machine's drift between
separate bench runs does not allow.

CMD is a server command line with PORT and STATS where its address and its
stats address go; `env VAR=VALUE` in front sets a switch, e.g.
    scripts/storm_ab.py 5 \\
      "epoll=target/release/hotloop serve http --addr 127.0.0.1:PORT --stats-addr 127.0.0.1:STATS --workers 2 --driver epoll --body-size 1024 --work-us 30" \\
      "off=env HOTLOOP_URING_SUBMIT_AFTER_US=off target/release/hotloop serve http --addr 127.0.0.1:PORT --stats-addr 127.0.0.1:STATS --workers 2 --driver uring --body-size 1024 --work-us 30"

DURATION (default 10) sets the established load's measured seconds, RATE
(default 4000) its requests per second and CLIENTS (default 19000) the
storm's clients (the scenario before used 2,000 and 3,000, with 60 us of
work). With STATS=1 each run also prints the server's counters. Loopback
only; every server is stopped by pid before the next starts.
"""

import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import servers

LOAD = "target/release/hotloop-bench"
COUNTERS = [
    "accepted", "accept_bound_hits", "handoffs_out", "poller_waits", "tasks_polled",
    "uring_enters", "early_submits", "submissions", "completions", "direct_sends",
]


def free_port():
    """A port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load(port, args):
    """Starts one `hotloop-bench load` against `port`."""
    cmd = [LOAD, "load", "--addr", f"127.0.0.1:{port}", "--proto", "http", "--size", "1024", "--json"]
    if os.environ.get("PIN"):
        cmd += ["--pin", "1"]
    return subprocess.Popen(cmd + args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def one_run(cmd, duration):
    """Runs the two loads against a fresh server; returns both reports and its stats."""
    port, stats_port = free_port(), free_port()
    argv = shlex.split(cmd.replace("STATS", str(stats_port)).replace("PORT", str(port)))
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        servers.wait_for(port, proc)
        rate = os.environ.get("RATE", "4000")
        clients = os.environ.get("CLIENTS", "19000")
        established = load(port, ["--mode", "keepalive", "--connections", "64", "--duration",
                                  str(duration), "--warmup", "1", "--sources", "1", "--rate", rate])
        time.sleep(0.5)
        storm = load(port, ["--mode", "churn", "--connections", clients, "--duration",
                            str(duration + 1), "--warmup", "0", "--sources", "4"])
        est_out, _ = established.communicate(timeout=duration + 60)
        storm_out, _ = storm.communicate(timeout=duration + 60)
        stats = {}
        if os.environ.get("STATS"):
            with urllib.request.urlopen(f"http://127.0.0.1:{stats_port}/stats", timeout=5) as r:
                stats = json.loads(r.read())
        return json.loads(est_out), json.loads(storm_out), stats
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main():
    rounds = int(sys.argv[1])
    specs = [a.split("=", 1) for a in sys.argv[2:]]
    duration = int(os.environ.get("DURATION", "10"))
    p99s = {name: [] for name, _ in specs}
    for r in range(rounds):
        order = specs if r % 2 == 0 else list(reversed(specs))
        for name, cmd in order:
            est, storm, stats = one_run(cmd, duration)
            p99 = est["latency_us"]["p99"] / 1000
            p99s[name].append(p99)
            server = (est.get("server_latency_us") or {}).get("p99", float("nan")) / 1000
            lag = (est.get("generator_lag_us") or {}).get("p99", float("nan")) / 1000
            print(f"round {r} {name}: established p99 {p99:.2f} ms (server {server:.2f}, generator lag "
                  f"{lag:.2f}), p50 {est['latency_us']['p50'] / 1000:.2f} ms, {est['rate_per_s']:.0f} req/s, "
                  f"{est.get('retransmitted', 0)} retransmitted; storm {storm['rate_per_s']:.0f} conn/s, "
                  f"{storm['max_in_flight']} in flight", flush=True)
            if stats:
                print("   ", " ".join(f"{k}={stats.get(k, 0)}" for k in COUNTERS), flush=True)
    for name, values in p99s.items():
        print(f"{name}: established p99 median {statistics.median(values):.2f} ms over "
              f"{len(values)} rounds ({' '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
