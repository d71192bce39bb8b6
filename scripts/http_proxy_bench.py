#!/usr/bin/env python3
"""`hotloop proxy --mode http` beside haproxy (`http-reuse always`) and nginx
(`keepalive` upstreams), side by side in one run, rounds interleaved.

Each proxy gets two workers (haproxy `nbthread 2`, nginx `worker_processes 2`)
in front of the same two backends (`hotloop serve http --workers 1
--body-size 64`, whose `accepted` counter gives the backend connections).
Per round and proxy, each proxy started fresh:

  reuse  10,000 short client connections, one request each
         (`hotloop-bench load --mode churn --connections 8 --requests 10000`):
         upstream reuse = 1 - backend connections accepted / requests
  ka     keep-alive HTTP/1.1, 256 connections, SECONDS seconds
         (`hotloop-bench load --mode keepalive --connections 256`): rate and
         the proxy's CPU (utime + stime of all its processes) per request
  h2     `h2load -c16 -m16` HTTP/2 by prior knowledge to the HTTP/1.1
         backends, SECONDS seconds: rate and CPU per request
  kill   the proxy, started again in front of two fresh backends, 64
         keep-alive connections for 4 s, one backend killed (SIGKILL)
         after 1.5 s: requests failed (errors and non-200 answers) and
         requests answered

It prints one table of medians (and ranges) over the rounds, every column
from this one command, then hotloop's rates and CPU per request over each
other proxy's of the same round (median and range of those ratios: other
work on the machine moves all figures between rounds, less so between
runs seconds apart), and the share of the CPUs the bench's own processes
used in the keep-alive runs. With `--borrow both` (the default) hotloop
runs twice per round, with borrowing from other workers' pools
(`--pool-borrow-ms MS`) and without (`hotloop (no borrow)`,
`--pool-borrow-ms 0`), and the two are compared round by round too;
`--borrow on` or `--borrow off` runs only one. The configs are `scripts/http_proxy_bench/haproxy.cfg`
and `scripts/http_proxy_bench/nginx.conf`.

    cargo build --release -p hotloop-cli -p hotloop-bench
    python3 scripts/http_proxy_bench.py --rounds 5 --seconds 3

Needs haproxy, nginx and h2load (`apt-get install haproxy nginx nghttp2-client`).
Nothing is pinned: on a 2-CPU machine the proxies, the backends and the load
share both CPUs, so rates are comparable within one run only. Per round it
also prints (to stderr) the CPU the backends and the load generator spent
per keep-alive request, and the share of the machine all of them used:
near 100%, the machine is the bottleneck, and a proxy's rate follows from
what it and its peers cost per request.
"""

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
TICKS = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, limit=30.0):
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on port {port}")


def cpu_seconds(pids):
    """utime + stime of `pids` and of their children processes, in seconds."""
    all_pids = set(pids)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) in pids:
                    all_pids.add(int(entry))
            except OSError:
                pass
    total = 0
    for pid in all_pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / TICKS


def backend_accepts(stats_ports):
    total = 0
    for port in stats_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as r:
            total += json.load(r)["accepted"]
    return total


class Proxy:
    """A proxy started fresh, on fresh ports, at each `start`: `make(port,
    h2port)` gives its command line (a port left in TIME_WAIT or taken
    meanwhile by another process never stalls a round)."""

    def __init__(self, name, make, cwd=None):
        self.name, self.make, self.cwd = name, make, cwd
        self.proc = None

    def start(self):
        self.port = free_port()
        self.h2port = self.port if self.name.startswith("hotloop") else free_port()
        self.log = tempfile.TemporaryFile()
        argv = self.make(self.port, self.h2port)
        self.proc = subprocess.Popen(argv, cwd=self.cwd, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_port(self.port)
            wait_port(self.h2port)
        except SystemExit:
            self.log.seek(0)
            said = self.log.read().decode(errors="replace")[-2000:]
            raise SystemExit(f"{self.name} did not start (exit status {self.proc.poll()}): {said}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT if self.name != "haproxy" else signal.SIGUSR1)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def load(bench, port, mode, connections, seconds, requests=None):
    argv = [bench, "load", "--addr", f"127.0.0.1:{port}", "--proto", "http", "--mode", mode,
            "--connections", str(connections), "--duration", str(seconds), "--size", "64",
            "--warmup", "0", "--json", "--quiet"]
    if requests:
        argv += ["--requests", str(requests)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    report = json.loads(out[out.index("{"):])
    return report


def h2load(port, seconds):
    run = subprocess.run(["h2load", "-c16", "-m16", "-D", str(int(seconds)), f"http://127.0.0.1:{port}/"],
                         capture_output=True, text=True)
    out = run.stdout + run.stderr
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", out)
    rate = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out)
    if not done or not rate:
        raise SystemExit(f"h2load said:\n{out}")
    return int(done.group(2)), float(rate.group(1))


def fill_for(work, ports):
    """A `fill` for backends `ports`."""
    def fill(template, port, h2port):
        with open(os.path.join(HERE, "http_proxy_bench", template)) as f:
            text = f.read()
        subs = {"{port}": port, "{h2port}": h2port, "{b1}": ports[0], "{b2}": ports[1], "{dir}": work}
        for k, v in subs.items():
            text = text.replace(k, str(v))
        path = os.path.join(work, template)
        with open(path, "w") as f:
            f.write(text)
        return path
    return fill


def kill_one(args, name, work):
    """`name` in front of two fresh backends, one killed under load: (failed, answered)."""
    ports = [free_port(), free_port()]
    backends = [subprocess.Popen([args.hotloop, "serve", "http", "--addr", f"127.0.0.1:{p}", "--workers", "1",
                                  "--body-size", "64"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for p in ports]
    proxy = None
    try:
        for p in ports:
            wait_port(p)
        proxy = make_proxy(args, name, work, fill_for(work, ports), ports)
        proxy.start()
        killer = threading.Timer(1.5, lambda: backends[1].kill())
        killer.start()
        rep = load(args.bench, proxy.port, "keepalive", 64, 4)
        killer.join()
        return rep["errors"]["total"], rep["completed"]
    finally:
        if proxy:
            proxy.stop()
        for b in backends:
            if b.poll() is None:
                b.send_signal(signal.SIGQUIT)
            b.wait()


NO_BORROW = "hotloop (no borrow)"


def make_proxy(args, name, work, fill, ports):
    """`name` in front of the backends on `ports`."""
    if name in ("hotloop", NO_BORROW):
        borrow_ms = "0" if name == NO_BORROW else str(args.pool_borrow_ms)
        return Proxy(name, lambda port, _: [
            args.hotloop, "proxy", "--mode", "http", "--listen", f"127.0.0.1:{port}", "--backend",
            f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}", "--workers", "2", "--driver", args.driver,
            "--pool-borrow-ms", borrow_ms])
    if name == "haproxy":
        return Proxy(name, lambda port, h2port: ["haproxy", "-db", "-f", fill("haproxy.cfg", port, h2port)])
    return Proxy(name, lambda port, h2port: [
        "nginx", "-p", work, "-e", os.path.join(work, "error.log"), "-c", fill("nginx.conf", port, h2port)])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hotloop", default="target/release/hotloop")
    ap.add_argument("--bench", default="target/release/hotloop-bench")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--driver", default="auto")
    ap.add_argument("--borrow", choices=("both", "on", "off"), default="both",
                    help="hotloop with borrowing from other workers' pools, without, or both side by side")
    ap.add_argument("--pool-borrow-ms", type=int, default=1,
                    help="hotloop's --pool-borrow-ms when borrowing is on")
    args = ap.parse_args()
    for tool in ("haproxy", "nginx", "h2load"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed")
    work = tempfile.mkdtemp(prefix="hotloop-http-proxy-bench-")
    backends, stats_ports, procs = [], [], []
    for _ in range(2):
        port, sport = free_port(), free_port()
        procs.append(subprocess.Popen(
            [args.hotloop, "serve", "http", "--addr", f"127.0.0.1:{port}", "--workers", "1",
             "--body-size", "64", "--stats-addr", f"127.0.0.1:{sport}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        backends.append(port)
        stats_ports.append(sport)
    for port in backends + stats_ports:
        wait_port(port)
    b1, b2 = backends

    def fill(template, port, h2port):
        with open(os.path.join(HERE, "http_proxy_bench", template)) as f:
            text = f.read()
        for k, v in {"{port}": port, "{h2port}": h2port, "{b1}": b1, "{b2}": b2, "{dir}": work}.items():
            text = text.replace(k, str(v))
        path = os.path.join(work, template)
        with open(path, "w") as f:
            f.write(text)
        return path

    for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        os.makedirs(os.path.join(work, d), exist_ok=True)
    ours = {"both": ["hotloop", NO_BORROW], "on": ["hotloop"], "off": [NO_BORROW]}[args.borrow]
    proxies = [make_proxy(args, name, work, fill, [b1, b2]) for name in ours + ["haproxy", "nginx"]]

    keys = ("reuse", "accepts", "ka_rate", "ka_cpu", "h2_rate", "h2_cpu", "killed_failed", "killed_answered",
            "busy")
    results = {p.name: {k: [] for k in keys} for p in proxies}
    try:
        for rnd in range(args.rounds):
            for p in proxies:
                p.start()
                r = results[p.name]
                before = backend_accepts(stats_ports)
                rep = load(args.bench, p.port, "churn", 8, 60, requests=10000)
                accepts = backend_accepts(stats_ports) - before
                r["accepts"].append(accepts)
                r["reuse"].append(100.0 * (1 - accepts / max(rep["completed"], 1)))
                cpu = cpu_seconds({p.proc.pid})
                peers = cpu_seconds({proc.pid for proc in procs})
                child = resource.getrusage(resource.RUSAGE_CHILDREN)
                started = time.time()
                rep = load(args.bench, p.port, "keepalive", 256, args.seconds)
                wall = time.time() - started
                used = cpu_seconds({p.proc.pid}) - cpu
                peers = cpu_seconds({proc.pid for proc in procs}) - peers
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                gen = after.ru_utime + after.ru_stime - child.ru_utime - child.ru_stime
                done = max(rep["completed"], 1)
                r["ka_rate"].append(rep["rate_per_s"])
                r["ka_cpu"].append(1e6 * used / done)
                r["busy"].append(100 * (used + peers + gen) / (wall * os.cpu_count()))
                print(f"round {rnd + 1} {p.name} keep-alive: backends {1e6 * peers / done:.1f} us/req, "
                      f"load generator {1e6 * gen / done:.1f} us/req, machine busy "
                      f"{r['busy'][-1]:.0f}%", file=sys.stderr)
                cpu = cpu_seconds({p.proc.pid})
                done, rate = h2load(p.h2port, args.seconds)
                used = cpu_seconds({p.proc.pid}) - cpu
                r["h2_rate"].append(rate)
                r["h2_cpu"].append(1e6 * used / max(done, 1))
                p.stop()
                failed, answered = kill_one(args, p.name, work)
                r["killed_failed"].append(failed)
                r["killed_answered"].append(answered)
                print(f"round {rnd + 1} {p.name}: reuse {r['reuse'][-1]:.2f}% ({accepts} accepts), "
                      f"ka {r['ka_rate'][-1]:.0f}/s {r['ka_cpu'][-1]:.1f} us, h2 {rate:.0f}/s {r['h2_cpu'][-1]:.1f} us, "
                      f"killed {failed} failed / {answered}", file=sys.stderr)
    finally:
        for p in proxies:
            p.stop()
        for proc in procs:
            proc.send_signal(signal.SIGQUIT)
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)

    def cell(values, fmt):
        med = statistics.median(values)
        return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"

    print("| proxy | upstream reuse, 10,000 one-request client connections, 8 at a time (backend accepts) "
          "| keep-alive c=256: req/s | CPU µs/req | h2load c16 m16 to HTTP/1.1 backends: req/s | CPU µs/req "
          "| a backend killed after 1.5 s of 4 s, c=64: failed / answered |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {cell(r['reuse'], '{:.2f}')}% ({statistics.median(r['accepts']):.0f}) | {cell(r['ka_rate'], '{:,.0f}')} | "
              f"{cell(r['ka_cpu'], '{:.1f}')} | {cell(r['h2_rate'], '{:,.0f}')} | {cell(r['h2_cpu'], '{:.1f}')} | "
              f"{cell(r['killed_failed'], '{:.0f}')} / {statistics.median(r['killed_answered']):,.0f} |")
    # Other work on the machine moves every proxy's figures between rounds
    # (and the share of the CPUs the bench's own processes got, "busy",
    # says how much): hotloop's figures over each other proxy's of the
    # same round, whose runs are seconds apart, drift less than the medians.
    first = ours[0]
    h = results[first]
    print()
    print("machine share of the bench's processes in keep-alive, median per proxy: " + ", ".join(
        f"{name} {statistics.median(r['busy']):.0f}%" for name, r in results.items()))
    for name, r in results.items():
        if name == first:
            continue
        ratios = {k: [a / b for a, b in zip(h[k], r[k]) if b] for k in ("ka_rate", "ka_cpu", "h2_rate", "h2_cpu")}
        print(f"{first} / {name}, same round, median (range): " + "; ".join(
            f"{label} {cell(ratios[k], '{:.2f}')}x" for k, label in (
                ("ka_rate", "keep-alive rate"), ("ka_cpu", "keep-alive CPU/req"),
                ("h2_rate", "h2 rate"), ("h2_cpu", "h2 CPU/req"))))


if __name__ == "__main__":
    main()
