#!/usr/bin/env python3
"""Server CPU per serial connection, servers interleaved connection by connection.

    scripts/serial_cpu_interleaved.py BLOCKS PER_BLOCK NAME=CMD NAME=CMD [...]

Starts every server on CPU 0 at once and sends serial HTTP connections
(connect, one `Connection: close` request, read the whole reply, close)
from CPU 1 to each in turn: A, B, B, A, A, B, ... Every block gives each server
PER_BLOCK connections and reads each server's CPU time (the sum of its
threads' `sum_exec_runtime` from /proc/PID/task/*/schedstat, in ns)
before and after. The servers meet the machine's load, frequency and
neighbours in the same microseconds, so the per-block ratio against the
first server is nearly free of the drift that makes separate runs
disagree; the script prints every block, then each server's median CPU
per connection and the median and spread of the per-block ratios: each
server against the first, or, with PAIRS="a/b,c/d", the named ones.

CMD is a server command line with PORT where its address goes, e.g.
    scripts/serial_cpu_interleaved.py 20 2000 \\
      "floor=target/release/hotloop-bench peer floor http --addr 127.0.0.1:PORT --workers 1" \\
      "hotloop=target/release/hotloop serve http --addr 127.0.0.1:PORT --workers 1 --driver epoll"

Each server sleeps between its connections, as a server under light serial
load does, and starts each one from caches the other servers have used.
Loopback only; the servers are stopped by pid at the end.

With PROFILE=1 (and perf, apt-get install linux-perf), every server is
sampled on the CPU clock during the blocks (`perf record -e cpu-clock`,
which needs no hardware counters) and the script adds each server's split
between kernel and user space, as samples and as ns per connection, and
its TOP (default 15) user-space symbols by samples.
"""

import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import servers

REQUEST = b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
WARMUP = 500


def cpu_ns(pid):
    """CPU time of every thread of `pid`, in ns."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that just ended
    return total


def one_connection(port):
    """One serial connection: request, whole reply, close."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(REQUEST)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                raise RuntimeError(f"port {port}: closed before the head ended")
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError(f"port {port}: closed before the body ended")
            body += chunk
    finally:
        s.close()


def start_profiles(servers, tmp):
    """One `perf record` per server, sampling its every thread on the CPU clock."""
    profiles = []
    for name, _, proc in servers:
        out = os.path.join(tmp, f"{name}.data")
        rec = subprocess.Popen(
            ["perf", "record", "-q", "-e", "cpu-clock", "-F", "10000", "-p", str(proc.pid), "-o", out],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        profiles.append((name, rec, out))
    time.sleep(0.5)  # perf attaches
    return profiles


def report_profiles(profiles, cpu_per_conn, top):
    """Stops the recorders and prints each server's kernel/user split and top symbols."""
    for _, rec, _ in profiles:
        rec.send_signal(signal.SIGINT)
    for _, rec, _ in profiles:
        rec.wait(timeout=60)
    for name, _, out in profiles:
        lines = subprocess.run(
            ["perf", "report", "-i", out, "--no-children", "--sort", "dso,sym", "--stdio",
             "-F", "sample,dso,sym"],
            capture_output=True, text=True, check=True).stdout.splitlines()
        rows = []
        for line in lines:
            parts = line.split(None, 3)
            if len(parts) == 4 and parts[0].isdigit():
                rows.append((int(parts[0]), parts[1], parts[3].strip()))
        total = sum(r[0] for r in rows) or 1
        kernel = sum(r[0] for r in rows if r[1].startswith("[kernel"))
        ns = cpu_per_conn[name]
        print(f"{name}: {total} samples; kernel {kernel / total:.1%} ({ns * kernel / total:.0f} ns"
              f" per connection), user {1 - kernel / total:.1%} ({ns * (total - kernel) / total:.0f} ns)")
        user = sorted((r for r in rows if not r[1].startswith("[kernel")), key=lambda r: -r[0])
        for samples, dso, sym in user[:top]:
            print(f"  {samples / total:6.2%}  {dso[:16]:16}  {sym[:100]}")


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    blocks, per_block = int(sys.argv[1]), int(sys.argv[2])
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    with servers.running(sys.argv[3:]) as running:
        os.sched_setaffinity(0, {1})
        for _ in range(WARMUP):
            for _, port, _ in running:
                one_connection(port)
        profile = os.environ.get("PROFILE") == "1" and shutil.which("perf")
        tmp = tempfile.mkdtemp()
        profiles = start_profiles(running, tmp) if profile else []
        per_conn = {name: [] for name, _, _ in running}
        names = [name for name, _, _ in running]
        pairs = [(name, names[0]) for name in names[1:]]
        if os.environ.get("PAIRS"):
            pairs = [tuple(p.split("/")) for p in os.environ["PAIRS"].split(",")]
            unknown = {n for pair in pairs for n in pair} - set(names)
            if unknown or any(len(pair) != 2 for pair in pairs):
                sys.exit(f"PAIRS names servers that are not running: {sorted(unknown)}")
        ratios = {pair: [] for pair in pairs}
        print("block  " + "  ".join(f"{n:>12}" for n, _, _ in running) + "  (ns CPU per connection)")
        for b in range(blocks):
            start = [cpu_ns(p.pid) for _, _, p in running]
            for i in range(per_block):
                # Each server follows each other one equally often.
                for _, port, _ in running if i % 2 == 0 else reversed(running):
                    one_connection(port)
            used = [(cpu_ns(p.pid) - s) / per_block for s, (_, _, p) in zip(start, running)]
            for (name, _, _), u in zip(running, used):
                per_conn[name].append(u)
            by_name = dict(zip(names, used))
            for name, ref in pairs:
                ratios[(name, ref)].append(by_name[name] / by_name[ref])
            print(f"{b + 1:5}  " + "  ".join(f"{u:12.0f}" for u in used), flush=True)
        print()
        for name, _, _ in running:
            print(f"{name}: median {statistics.median(per_conn[name]):.0f} ns CPU per connection")
        for (name, ref), r in ratios.items():
            median, q1, q3, low, high = servers.spread(r)
            print(
                f"{name} / {ref}: median of per-block ratios {median:.3f}"
                f" (quartiles {q1:.3f}-{q3:.3f}, range {low:.3f}-{high:.3f}, {len(r)} blocks)"
            )
        if profiles:
            print()
            medians = {name: statistics.median(v) for name, v in per_conn.items()}
            report_profiles(profiles, medians, int(os.environ.get("TOP", "15")))
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
