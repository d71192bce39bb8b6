#!/usr/bin/env python3
"""Instructions per HTTP request of `hotloop serve http`, counted by callgrind.

    scripts/instructions_per_request.py [BIN] [--drivers epoll,uring] [--counts 500,1500]

BIN is a release `hotloop` binary (target/release/hotloop by default: build
it with `cargo build --release -p hotloop-cli -p hotloop-bench`). For each
driver and each kind of request, the server runs under
`valgrind --tool=callgrind` with one worker on a port the script picks, a
client in this process (outside valgrind) sends a fixed count of requests,
and the server is stopped by pid with SIGALRM, which it leaves at the
default action (the process ends and callgrind writes its totals). Two
counts are run, and the figure is the difference of their totals over the
difference of their counts, so start-up and shutdown cancel out:

- keep-alive: all the requests on one connection, one at a time;
- serial: one request per connection, one connection at a time.

Each run prints the driver, the kind, both totals, the per-request figure
and the pokes (connections opened and closed at once, to see that the
server is up, and after the signal until it has exited: each costs one
accepted and closed connection, against the 1,000 requests between the
counts); `--rounds R` repeats each pair and prints the median. Without a
pause, keep-alive figures repeat within about 3% and serial ones move by
20% and more (how a loop turn meets each connection's accept, request
and close varies from run to run). With `--pause-ms 20` (50 on a busy
machine) the client waits after each answer, so every request meets a
loop asleep in its wait, and both repeat within about 0.3%.

Valgrind (3.19 here) needs `--fair-sched=yes` on this machine: its default
pipe-based thread lock hangs the first blocking system call (even
`valgrind ls` never ends). Valgrind 3.19 does not treat `io_uring_enter` as
a call that may block, so it keeps its thread lock through it: the worker,
which waits in its ring before the main thread has bound the listener,
stops every other thread of the server for good (the server never starts
listening). For the io_uring driver, pass `--valgrind` a valgrind built
with its `io_uring_enter` wrapper marked as blocking: one line,
`*flags |= SfMayBlock;` at the end of `PRE(sys_io_uring_enter)` in
`coregrind/m_syswrap/syswrap-linux.c` (`apt-get source valgrind`, then
`./configure --prefix=DIR && make && make install`). Callgrind counts the
instructions run in user space, so the ring's completions, which the
kernel writes, cost nothing it counts, as on epoll.

Where callgrind cannot run the server (the io_uring driver under a stock
valgrind 3.19, above), and there is no hardware instruction counter (perf's `instructions:u` is not
supported in this virtual machine), `--cpu-ab BIN,BIN` compares binaries by
server CPU time instead: perf's task-clock over the last of `--counts`
requests (hotloop-bench's load, one connection, after 2,000 to warm up),
server on CPU 0 and load on CPU 1, the binaries interleaved round after
round; it prints each one's median and its ratio to the first's. CPU time
moves with the machine's other load, so it needs many rounds and resolves
a few per cent, not one.
"""
import argparse
import os
import re
import signal
import socket
import statistics
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


# Seconds the client waits after each answer (`--pause-ms`), so that the
# server has finished with one request (and, serial, with its connection's
# close) and sleeps in its wait before the next arrives: each request then
# meets the loop the same way, and the count repeats from run to run.
PAUSE = 0.0


def keep_alive(addr, n):
    s = socket.create_connection(addr)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    for _ in range(n):
        s.sendall(REQUEST)
        buf = read_response(s, buf)
        time.sleep(PAUSE)
    s.close()


def serial(addr, n):
    for _ in range(n):
        s = socket.create_connection(addr)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(REQUEST)
        read_response(s, b"")
        s.close()
        time.sleep(PAUSE)


KINDS = {"keep-alive": keep_alive, "serial": serial}

# The server's environment: this one's, with `--env`'s settings.
SERVER_ENV = dict(os.environ)


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


def run_once(binp, driver, kind, n, outdir, valgrind="valgrind"):
    """The server's instruction total over `n` requests of `kind`, and the
    pokes it took."""
    out = os.path.join(outdir, f"callgrind.{driver}.{kind}.{n}.out")
    log = open(os.path.join(outdir, f"server.{driver}.{kind}.{n}.log"), "w+")
    addr = ("127.0.0.1", free_port())
    args = [valgrind, "--tool=callgrind", "--fair-sched=yes", f"--callgrind-out-file={out}",
            binp, "serve", "http", "--addr", f"{addr[0]}:{addr[1]}", "--workers", "1",
            "--driver", driver]
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=SERVER_ENV)
    try:
        return measure(p, log, addr, out, kind, n, driver)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def measure(p, log, addr, out, kind, n, driver):
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
    # SIGALRM, which the server leaves at its default (terminate): no drain
    # to wait for, and valgrind still ends the run and writes the totals.
    p.send_signal(signal.SIGALRM)
    deadline = time.monotonic() + 120
    while p.poll() is None:
        if time.monotonic() > deadline:
            sys.exit("the server did not stop on SIGALRM")
        time.sleep(0.3)
        if p.poll() is None:
            pokes += poke(addr)
    log.seek(0)
    banner = log.read()
    want = {"uring": "driver uring", "epoll": "driver epoll"}.get(driver)
    if want and want not in banner:
        sys.exit(f"the server did not run the {driver} driver:\n{banner}")
    with open(out) as f:
        for line in f:
            if line.startswith("totals:") or line.startswith("summary:"):
                return int(line.split()[1]), pokes
    sys.exit(f"no totals in {out}")


def cpu_run(binp, load, driver, kind, n):
    """Microseconds of server CPU (perf's task-clock: user and system) per
    request over `n` requests of `kind`, server on CPU 0, load on CPU 1."""
    addr = ("127.0.0.1", free_port())
    p = subprocess.Popen(["taskset", "-c", "0", binp, "serve", "http", "--addr",
                          f"{addr[0]}:{addr[1]}", "--workers", "1", "--driver", driver],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if poke(addr):
                break
            time.sleep(0.05)
        mode = {"keep-alive": "keepalive", "serial": "serial"}[kind]
        base = ["taskset", "-c", "1", load, "load", "--addr", f"{addr[0]}:{addr[1]}",
                "--mode", mode, "--connections", "1"]
        subprocess.run(base + ["-n", "2000", "-d", "20"], check=True, capture_output=True)
        perf = subprocess.Popen(["perf", "stat", "-x,", "-e", "task-clock", "-p", str(p.pid)],
                                stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)
        subprocess.run(base + ["-n", str(n), "-d", "120"], check=True, capture_output=True)
        perf.send_signal(signal.SIGINT)
        _, err = perf.communicate(timeout=30)
        ms = next(float(l.split(",")[0]) for l in err.splitlines() if "task-clock" in l)
        return ms * 1000 / n
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def cpu_ab(a):
    """Server CPU per request of each binary, interleaved round by round."""
    bins = a.cpu_ab.split(",")
    n = int(a.counts.split(",")[-1])
    for driver in a.drivers.split(","):
        for kind in a.kinds.split(","):
            per = {b: [] for b in bins}
            for _ in range(a.rounds):
                for b in bins:
                    per[b].append(cpu_run(b, a.load, driver, kind, n))
            first = statistics.median(per[bins[0]])
            for b in bins:
                m = statistics.median(per[b])
                print(f"{driver:5} {kind:10} {b}: median {m:.2f} us/request "
                      f"({', '.join(f'{x:.2f}' for x in per[b])}); {m / first:.3f}x the first",
                      flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bin", nargs="?", default="target/release/hotloop")
    ap.add_argument("--drivers", default="epoll,uring")
    ap.add_argument("--kinds", default="keep-alive,serial")
    ap.add_argument("--counts", default="500,1500")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cpu-ab", metavar="BIN,BIN", help="instead of callgrind: server CPU "
                    "(perf task-clock) per request of these binaries, interleaved by round")
    ap.add_argument("--load", default="target/release/hotloop-bench")
    ap.add_argument("--valgrind", default="valgrind",
                    help="the valgrind to run (io_uring needs one that lets io_uring_enter block: see above)")
    ap.add_argument("--pause-ms", type=float, default=0.0,
                    help="the client's pause after each answer (see PAUSE); 0: none")
    ap.add_argument("--keep", metavar="DIR", help="keep callgrind's outputs and the server logs in DIR")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="set in the server's environment (a driver switch), repeatable")
    a = ap.parse_args()
    SERVER_ENV.update(kv.split("=", 1) for kv in a.env)
    global PAUSE
    PAUSE = a.pause_ms / 1000
    if a.cpu_ab:
        cpu_ab(a)
        return
    lo, hi = (int(c) for c in a.counts.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        outdir = a.keep or tmp
        os.makedirs(outdir, exist_ok=True)
        for driver in a.drivers.split(","):
            for kind in a.kinds.split(","):
                figures = []
                for _ in range(a.rounds):
                    i_lo, pokes_lo = run_once(a.bin, driver, kind, lo, outdir, a.valgrind)
                    i_hi, pokes_hi = run_once(a.bin, driver, kind, hi, outdir, a.valgrind)
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
