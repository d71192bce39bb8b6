#!/usr/bin/env python3
"""Where connections opened at once to two idle workers land, by placement.

    scripts/balance_ties.py [TRIALS] [CONNECTIONS]      # defaults: 10 trials, 8 connections

Starts `hotloop serve echo --workers 2` three times (--balance kernel,
load and count). Each trial, against each server in turn, opens
CONNECTIONS keep-alive connections at once (every connect issued before
any is answered), sends one byte on each and reads it back, so every
connection is held by its handler; then it reads each worker's open
connections from the stats endpoint (`load_connections`), closes them all
and waits until the server holds none. The workers are idle throughout:
nothing but this burst reaches them.

Prints each trial's split (worker 0 / worker 1) and, per placement, how
many trials split evenly. BIN=DIR takes `hotloop` from DIR (default
target/release).
"""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(placements, binary):
    """Starts one server per placement, unpinned, and yields
    [(placement, port, stats_port)]; stops them by pid at the end."""
    started = []
    try:
        for p in placements:
            port, stats_port = free_port(), free_port()
            argv = [binary, "serve", "echo", "--workers", "2", "--balance", p,
                    "--addr", f"127.0.0.1:{port}", "--stats-addr", f"127.0.0.1:{stats_port}"]
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            started.append((p, port, stats_port, proc))
            deadline = time.time() + 20
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the {p} server exited ({proc.returncode})")
                try:
                    worker_connections(stats_port)
                    break
                except OSError:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.05)
        yield [(p, port, stats_port) for p, port, stats_port, _ in started]
    finally:
        for *_, proc in started:
            if proc.poll() is None:
                proc.terminate()
        for *_, proc in started:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def worker_connections(stats_port):
    with urllib.request.urlopen(f"http://127.0.0.1:{stats_port}/stats", timeout=5) as r:
        body = json.load(r)
    return [int(w["load_connections"]) for w in body["workers"]]


def trial(port, stats_port, connections):
    """Opens `connections` at once; returns the per-worker split."""
    socks = []
    for _ in range(connections):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    try:
        for s in socks:
            s.setblocking(True)
            s.settimeout(5)
            s.sendall(b"x")
        for s in socks:
            if s.recv(1) != b"x":
                raise RuntimeError("a connection was not echoed")
        return worker_connections(stats_port)
    finally:
        for s in socks:
            s.close()
        deadline = time.time() + 5
        while sum(worker_connections(stats_port)) and time.time() < deadline:
            time.sleep(0.02)


def main():
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    connections = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    binary = os.path.join(os.environ.get("BIN", "target/release"), "hotloop")
    placements = ["kernel", "load", "count"]
    even = {p: 0 for p in placements}
    with running(placements, binary) as servers:
        for t in range(1, trials + 1):
            line = []
            for name, port, stats_port in servers:
                split = trial(port, stats_port, connections)
                if max(split) - min(split) <= connections % 2:
                    even[name] += 1
                line.append(f"{name} {'/'.join(map(str, split))}")
            print(f"trial {t:2d}: " + "   ".join(line), flush=True)
    for p in placements:
        print(f"{p}: even in {even[p]} of {trials} trials")


if __name__ == "__main__":
    main()
