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
import signal
import statistics
import subprocess
import sys

import servers

LOAD = "target/release/hotloop-bench"


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
    median, q1, q3, _, _ = servers.spread(values)
    return f"{label} median {median:.3f} (quartiles {q1:.3f}-{q3:.3f}, {len(values)} windows)"


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    windows, seconds, mode = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    if mode not in ("serial", "keepalive"):
        sys.exit(f"MODE is serial or keepalive, not {mode}")
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    with servers.running(sys.argv[4:], hold_stopped=True) as running:
        rates = {name: [] for name, _, _ in running}
        p50s = {name: [] for name, _, _ in running}
        print("window  " + "  ".join(f"{n:>22}" for n, _, _ in running) + "  (req/s, p50 µs)")
        for w in range(windows):
            got = {}
            order = running[w % len(running):] + running[:w % len(running)]
            for name, port, proc in order:
                proc.send_signal(signal.SIGCONT)
                try:
                    got[name] = window(port, seconds, mode)
                finally:
                    proc.send_signal(signal.SIGSTOP)
            for name, _, _ in running:
                rates[name].append(got[name][0])
                p50s[name].append(got[name][1])
            print(f"{w + 1:6}  " + "  ".join(
                f"{got[n][0]:14.0f} {got[n][1]:7.0f}" for n, _, _ in running), flush=True)
        first = running[0][0]
        print()
        for name, _, _ in running:
            print(f"{name}: median {statistics.median(rates[name]):.0f}/s, "
                  f"p50 median {statistics.median(p50s[name]):.0f} µs")
        pairs = [(name, first) for name, _, _ in running[1:]]
        if os.environ.get("PAIRS"):
            pairs = [tuple(p.split("/")) for p in os.environ["PAIRS"].split(",")]
        for name, ref in pairs:
            r = [a / b for a, b in zip(rates[name], rates[ref])]
            p = [a / b for a, b in zip(p50s[name], p50s[ref])]
            print(f"{name} / {ref}: " + summary("rate", r) + "; " + summary("p50", p))


if __name__ == "__main__":
    main()
