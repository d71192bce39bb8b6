#!/usr/bin/env python3
"""Instructions per HTTP request of `hotloop serve http`, counted by callgrind.

    scripts/instructions_per_request.py [BIN] [--drivers epoll,uring] [--counts 500,1500]

BIN is a release `hotloop` binary (target/release/hotloop by default: build
it with `cargo build --release -p hotloop-cli`). For each driver and each
kind of request, the server runs under `valgrind --tool=callgrind` with one
worker, a client in this process (outside valgrind) sends a fixed count of
requests, and the server is stopped by pid (SIGINT: it drains and exits, and
callgrind writes its totals). Two counts are run, and the figure is the
difference of their totals over the difference of their counts, so start-up,
the banner and shutdown cancel out:

- keep-alive: all the requests on one connection, one at a time;
- serial: one request per connection, one connection at a time.

Valgrind (3.19 here) runs the io_uring system calls; what the kernel writes
into the rings is invisible to it, which callgrind, counting instructions
only, does not need. Two things need working around here:

- Valgrind's default pipe-based thread lock hangs the first blocking
  system call on this machine's kernel (even `valgrind ls` never ends), so
  it runs with `--fair-sched=yes`.
- Valgrind 3.19 keeps its one thread lock through `io_uring_enter`: while
  the io_uring worker waits in the ring, no other thread of the server
  runs (the banner, the signal thread). So the script does not wait for
  the banner (the port is its own choice), stops the server with SIGALRM
  (left at its default action: the process ends, and callgrind writes its
  totals) rather than SIGINT (which needs the signal thread), and pokes it
  (a connection opened and closed at once, which completes the worker's
  accept and so ends its wait) every 0.3 s until it is up, and again
  after the signal until it has exited. The pokes are counted and
  printed; each costs the server one accepted and closed connection,
  a few thousand instructions, against the 1,000 requests between the
  two counts. Each run prints the driver, the kind, both totals and
the per-request figure; `--rounds R` repeats each pair (callgrind's counts
move by a few instructions per request between runs, from how many
completions each loop turn happens to find).
"""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

REQUEST = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"


def read_response(s, buf):
    """Reads one response (headers and a Content-Length body) from `s`;
    returns what was read past it."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("the server closed the connection mid-response")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    m = re.search(rb"(?i)content-length:\s*(\d+)", head)
    if not m:
        raise RuntimeError(f"no content-length in {head!r}")
    length = int(m.group(1))
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("the server closed the connection mid-body")
        rest += chunk
    return rest[length:]


def keep_alive(addr, n):
    s = socket.create_connection(addr)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    for _ in range(n):
        s.sendall(REQUEST)
        buf = read_response(s, buf)
    s.close()


def serial(addr, n):
    for _ in range(n):
        s = socket.create_connection(addr)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(REQUEST)
        read_response(s, b"")
        s.close()


KINDS = {"keep-alive": keep_alive, "serial": serial}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def poke(addr):
    """Opens and closes a connection; true if the server accepted it."""
    try:
        socket.create_connection(addr, timeout=1).close()
        return True
    except OSError:
        return False


def run_once(binp, driver, kind, n, outdir):
    """The server's instruction total over `n` requests of `kind`, and the
    pokes it took."""
    out = os.path.join(outdir, f"callgrind.{driver}.{kind}.{n}.out")
    log = open(os.path.join(outdir, f"server.{driver}.{kind}.{n}.log"), "w+")
    addr = ("127.0.0.1", free_port())
    args = ["valgrind", "--tool=callgrind", "--fair-sched=yes", f"--callgrind-out-file={out}",
            binp, "serve", "http", "--addr", f"{addr[0]}:{addr[1]}", "--workers", "1",
            "--driver", driver]
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        return measure(p, log, addr, out, kind, n)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def measure(p, log, addr, out, kind, n):
    # Only the worker is needed to serve: the first connection the kernel
    # accepts wakes it, whatever the other threads are doing.
    pokes = 0
    deadline = time.monotonic() + 120
    while not poke(addr):
        if p.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            sys.exit(f"the server did not start:\n{log.read()}")
        time.sleep(0.3)
    pokes += 1
    KINDS[kind](addr, n)
    # SIGALRM, which the server leaves at its default (terminate): its own
    # stop (SIGINT) needs its signal thread, which the waiting worker
    # starves. Valgrind still ends the run and callgrind writes its totals.
    p.send_signal(signal.SIGALRM)
    deadline = time.monotonic() + 120
    while p.poll() is None:
        if time.monotonic() > deadline:
            sys.exit("the server did not stop on SIGALRM")
        time.sleep(0.3)
        if p.poll() is None:
            pokes += poke(addr)
    with open(out) as f:
        for line in f:
            if line.startswith("totals:") or line.startswith("summary:"):
                return int(line.split()[1]), pokes
    sys.exit(f"no totals in {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bin", nargs="?", default="target/release/hotloop")
    ap.add_argument("--drivers", default="epoll,uring")
    ap.add_argument("--kinds", default="keep-alive,serial")
    ap.add_argument("--counts", default="500,1500")
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    lo, hi = (int(c) for c in a.counts.split(","))
    with tempfile.TemporaryDirectory() as outdir:
        for driver in a.drivers.split(","):
            for kind in a.kinds.split(","):
                figures = []
                for _ in range(a.rounds):
                    i_lo, pokes_lo = run_once(a.bin, driver, kind, lo, outdir)
                    i_hi, pokes_hi = run_once(a.bin, driver, kind, hi, outdir)
                    per = (i_hi - i_lo) / (hi - lo)
                    figures.append(per)
                    print(f"{driver:5} {kind:10} {lo}: {i_lo:>13,} {hi}: {i_hi:>13,}  "
                          f"per request: {per:,.0f}  (pokes {pokes_lo}, {pokes_hi})", flush=True)
                if a.rounds > 1:
                    figures.sort()
                    print(f"{driver:5} {kind:10} median per request: "
                          f"{figures[len(figures) // 2]:,.0f}", flush=True)


if __name__ == "__main__":
    main()
