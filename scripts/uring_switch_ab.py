#!/usr/bin/env python3
"""An io_uring switch on and off beside the floors, interleaved round by round.

    scripts/uring_switch_ab.py [ROUNDS] [SECONDS]

Keep-alive HTTP/1.1 (`hotloop-bench load --mode keepalive`) against, in
turn: `hotloop serve http --driver uring` as it is, the same with the
switch off (OFF_ENV, default `HOTLOOP_URING_REGISTERED_RING=0`; empty for none;
OFF_ARGS adds command-line arguments, e.g. `--event-interval 256`; MODE
is the load's `--mode`, default `keepalive`, e.g. `serial`; ONLY keeps
the named servers, e.g. `ONLY=uring,uring-switch-off`), hotloop
on epoll, the two floors (`hotloop-bench peer floor|floor-uring`), and
h2o when it is on PATH (one thread, no access log: hotloop-bench's
`h2o_config`).
Each server runs on CPU 0 with one worker and is started for its turn;
the load runs on CPU 1 with C connections (default 256), after a 0.5 s
warm-up. The order reverses every round. Per run it reads the server's
CPU time (all threads, /proc) and, from hotloop's stats endpoint, its
`io_uring_enter` calls, direct sends and waits; it prints every run, then
the medians and each server's median ratio to the first.

Needs the release binaries (cargo build --release -p hotloop-cli -p
hotloop-bench). Loopback only; each server is stopped by pid.
"""

import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

BIN = os.environ.get("BIN", "target/release")
C = os.environ.get("C", "256")
MODE = os.environ.get("MODE", "keepalive")
OFF_ENV = os.environ.get("OFF_ENV", "HOTLOOP_URING_REGISTERED_RING=0")
# Further command-line arguments of the switched variant (e.g. `--event-interval 256`).
OFF_ARGS = os.environ.get("OFF_ARGS", "").split()
# The servers to run (comma-separated names as the table prints them; all by default).
ONLY = [n for n in os.environ.get("ONLY", "").split(",") if n]
STARTUP_MAX_S = 10.0
# `hotloop serve http`'s body.
BODY_BYTES = 64


def cpu_seconds(pid):
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def stats(port):
    if port is None:
        return {}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as r:
        return json.load(r)


def wait_listening(ports, server):
    """True once every port accepts, false if the server exits or takes too long."""
    deadline = time.monotonic() + STARTUP_MAX_S
    for port in ports:
        while True:
            if server.poll() is not None or time.monotonic() > deadline:
                return False
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
    return True


def h2o_command(port, tmp):
    """h2o serving BODY_BYTES as `/`, with hotloop-bench's settings."""
    body = os.path.join(tmp, "body")
    with open(body, "w") as f:
        f.write("x" * BODY_BYTES)
    conf = os.path.join(tmp, "h2o.conf")
    with open(conf, "w") as f:
        if os.geteuid() == 0:
            f.write("user: root\n")
        f.write(f"num-threads: 1\nmax-connections: 19900\npid-file: {tmp}/h2o.pid\n"
                f"error-log: {tmp}/error.log\nfile.send-compressed: OFF\nlisten:\n"
                f"  host: 127.0.0.1\n  port: {port}\nhosts:\n  default:\n    paths:\n"
                f"      /:\n        file.file: {body}\n")
    return ["taskset", "-c", "0", "h2o", "-c", conf]


def load(port, seconds):
    out = subprocess.run(
        ["taskset", "-c", "1", f"{BIN}/hotloop-bench", "load", "--addr", f"127.0.0.1:{port}",
         "--mode", MODE, "-c", C, "-d", str(seconds)],
        capture_output=True, text=True, timeout=float(seconds) + 30).stdout
    done = re.search(r"completed\s+(\d+)", out)
    p99 = re.search(r"p99 (\d+)", out)
    return (int(done.group(1)) if done else 0), (float(p99.group(1)) if p99 else 0.0)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    seconds = sys.argv[2] if len(sys.argv) > 2 else "3"
    off_env = dict([OFF_ENV.split("=", 1)]) if OFF_ENV else {}
    servers = {
        "uring": (["serve", "http", "--driver", "uring"], {}, True),
        "uring-switch-off": (["serve", "http", "--driver", "uring", *OFF_ARGS], off_env, True),
        "epoll": (["serve", "http", "--driver", "epoll"], {}, True),
        "floor": (["peer", "floor", "http"], {}, False),
        "floor-uring": (["peer", "floor-uring", "http"], {}, False),
    }
    if shutil.which("h2o"):
        servers["h2o"] = (None, {}, False)
    if ONLY:
        servers = {name: spec for name, spec in servers.items() if name in ONLY}
    tmp = tempfile.mkdtemp(prefix="uring-switch-ab.")
    runs = {name: [] for name in servers}
    for r in range(rounds):
        order = list(servers) if r % 2 == 0 else list(reversed(servers))
        for name in order:
            args, env, is_hotloop = servers[name]
            port = random.randrange(20000, 40000, 2)
            exe = f"{BIN}/hotloop" if is_hotloop else f"{BIN}/hotloop-bench"
            if args is None:
                cmd = h2o_command(port, tmp)
            else:
                cmd = ["taskset", "-c", "0", exe, *args, "--workers", "1", "--addr", f"127.0.0.1:{port}"]
            stats_port = port + 1 if is_hotloop else None
            if stats_port:
                cmd += ["--stats-addr", f"127.0.0.1:{stats_port}"]
            server = subprocess.Popen(cmd, env={**os.environ, **env},
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                if not wait_listening([p for p in (port, stats_port) if p], server):
                    print(r, name, "did not start; run skipped", flush=True)
                    continue
                load(port, 0.5)
                s0, c0 = stats(stats_port), cpu_seconds(server.pid)
                done, p99 = load(port, seconds)
                s1, c1 = stats(stats_port), cpu_seconds(server.pid)
            finally:
                server.terminate()
                server.wait()
            if done == 0:
                print(r, name, "no request completed; run skipped", flush=True)
                continue
            d = {k: s1.get(k, 0) - s0.get(k, 0) for k in ("uring_enters", "direct_sends", "poller_waits")}
            row = dict(rate=done / float(seconds), cpu_us=(c1 - c0) / done * 1e6,
                       enters=d["uring_enters"] / done, direct=d["direct_sends"] / done,
                       waits=d["poller_waits"] / done, p99_us=p99)
            runs[name].append(row)
            print(r, name, {k: round(v, 4) for k, v in row.items()}, flush=True)
    print(f"\nmedians over {rounds} rounds, {MODE} c={C}, {OFF_ENV} {' '.join(OFF_ARGS)} in uring-switch-off")
    first = None
    for name, rows in runs.items():
        if not rows:
            continue
        m = {k: statistics.median(x[k] for x in rows) for k in rows[0]}
        first = first or m
        print(f"{name:17} {m['rate']:8.0f} req/s ({m['rate'] / first['rate']:.3f}x)  "
              f"CPU {m['cpu_us']:6.2f} us/req ({m['cpu_us'] / first['cpu_us']:.3f}x)  "
              f"enters/req {m['enters']:.4f}  direct/req {m['direct']:.4f}  "
              f"waits/req {m['waits']:.4f}  p99 {m['p99_us']:.0f} us")


if __name__ == "__main__":
    main()
