#!/usr/bin/env python3
"""Rate and p50 of servers measured in short alternating windows.

    scripts/windows_ab.py WINDOWS SECONDS MODE NAME=CMD NAME=CMD [...]

Starts every server on CPU 0 and holds all but one stopped (SIGSTOP) at
any moment, so that a busy-polling server never spins beside the one
being measured. Each window runs `hotloop-bench load --mode MODE` (serial
or keepalive, one connection, pinned to CPU 1) for SECONDS against each
server in turn, the order rotating from window to window; a window's
ratio against the first server compares measurements taken a fraction of
a second apart, which cancels most of the drift of a shared machine that
makes separate multi-second rounds disagree by 20% or more. Prints every
window, then each server's median rate and p50 and the median and
quartiles of the per-window ratios: each server against the first, or,
with PAIRS="a/b,c/d", the named ones.

CMD is a server command line with PORT where its address goes, e.g.
    scripts/windows_ab.py 40 0.3 keepalive \\
      "floor=target/release/hotloop-bench peer floor http --addr 127.0.0.1:PORT --workers 1 --busy-poll" \\
      "always=target/release/hotloop serve http --addr 127.0.0.1:PORT --workers 1 --driver epoll --busy-poll always"

Needs the release binaries (cargo build --release -p hotloop-cli -p
hotloop-bench). Loopback only; the servers are stopped by pid at the end.
"""

import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time

LOAD = "target/release/hotloop-bench"


def wait_for(port, proc, seconds=20):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server on port {port} exited ({proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"no server on port {port} after {seconds} s")


def window(port, seconds, mode):
    """One load window against `port`: (rate per second, p50 µs)."""
    out = subprocess.run(
        [LOAD, "load", "--addr", f"127.0.0.1:{port}", "--mode", mode, "-c", "1",
         "-d", str(seconds), "--warmup", "0.05", "--pin", "1", "--json"],
        check=True, capture_output=True, text=True, timeout=seconds + 30,
    ).stdout
    report = json.loads(out)
    if report["errors"]["total"]:
        raise RuntimeError(f"port {port}: {report['errors']}")
    return report["rate_per_s"], report["latency_us"]["p50"]


def summary(label, values):
    v = sorted(values)
    q = statistics.quantiles(v, n=4) if len(v) >= 4 else [v[0], statistics.median(v), v[-1]]
    return f"{label} median {statistics.median(v):.3f} (quartiles {q[0]:.3f}-{q[2]:.3f}, {len(v)} windows)"


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    windows, seconds, mode = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    if mode not in ("serial", "keepalive"):
        sys.exit(f"MODE is serial or keepalive, not {mode}")
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    specs = [a.split("=", 1) for a in sys.argv[4:]]
    # Below the ephemeral range (32768 up), where the load's own ports come from.
    base = 20000 + random.randrange(0, 9000)
    servers = []
    try:
        for i, (name, cmd) in enumerate(specs):
            port = base + i
            argv = ["taskset", "-c", "0"] + cmd.replace("PORT", str(port)).split()
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            servers.append((name, port, proc))
            wait_for(port, proc)
            proc.send_signal(signal.SIGSTOP)
        rates = {name: [] for name, _, _ in servers}
        p50s = {name: [] for name, _, _ in servers}
        print("window  " + "  ".join(f"{n:>22}" for n, _, _ in servers) + "  (req/s, p50 µs)")
        for w in range(windows):
            got = {}
            order = servers[w % len(servers):] + servers[:w % len(servers)]
            for name, port, proc in order:
                proc.send_signal(signal.SIGCONT)
                try:
                    got[name] = window(port, seconds, mode)
                finally:
                    proc.send_signal(signal.SIGSTOP)
            for name, _, _ in servers:
                rates[name].append(got[name][0])
                p50s[name].append(got[name][1])
            print(f"{w + 1:6}  " + "  ".join(
                f"{got[n][0]:14.0f} {got[n][1]:7.0f}" for n, _, _ in servers), flush=True)
        first = servers[0][0]
        print()
        for name, _, _ in servers:
            print(f"{name}: median {statistics.median(rates[name]):.0f}/s, "
                  f"p50 median {statistics.median(p50s[name]):.0f} µs")
        pairs = [(name, first) for name, _, _ in servers[1:]]
        if os.environ.get("PAIRS"):
            pairs = [tuple(p.split("/")) for p in os.environ["PAIRS"].split(",")]
        for name, ref in pairs:
            r = [a / b for a, b in zip(rates[name], rates[ref])]
            p = [a / b for a, b in zip(p50s[name], p50s[ref])]
            print(f"{name} / {ref}: " + summary("rate", r) + "; " + summary("p50", p))
    finally:
        for _, _, proc in servers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for _, _, proc in servers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    main()
