#!/usr/bin/env python3
"""Upgrades under load, side by side: hotloop (`--upgrade-socket`),
haproxy (`-x` + `-sf`) and nginx (`SIGUSR2`, then `SIGQUIT` to the old
master).

Each run starts one server on loopback, puts load on it (wrk for HTTP/1.1
keep-alive, wrk with `Connection: close` for one new connection per
request, `hotloop-bench h2-load` for HTTP/2), lets it run steady for a while, then upgrades
the server `--upgrades` times in a row and reports:

- requests done and failed as the load tool counts them (wrk: socket
  errors and non-2xx answers; h2-load: requests reset or cut, and
  non-2xx answers; a request the server refused unprocessed after its
  GOAWAY is sent again on a new connection and is no failure);
- TCP resets on the server's port, counted by tcpdump (`tcp[13] & 4`),
  so other traffic on the host does not count;
- a probe's view of latency: two probe clients (one keep-alive
  connection, and one new connection per request), 100 requests a second
  each, time every request. An upgrade's window runs from its start to
  100 ms after the old process exited; the steady windows are the times
  between upgrades (and the steady phase before the first), so both are
  measured interleaved, under the same load on the host. The table shows
  the probe's p99 and maximum in the steady windows beside the same in
  the upgrade windows.

`--server hotloop-null` is the control for what an upgrade costs the
host rather than the served process: each "upgrade" starts a second
hotloop process of the same kind on a port of its own, waits until it
serves, and stops it, with the served process untouched; its windows are
measured as an upgrade's are. `--matrix-servers hotloop,hotloop-null`
runs each hotloop cell's control right after it.

    python3 scripts/upgrade_harness.py --server hotloop --app hyper --load h2 \\
        --workers 2 --driver uring --upgrades 100
    python3 scripts/upgrade_harness.py --matrix --upgrades 100 --out upgrade.md

`--matrix` runs serve http (wrk, wrk-close), serve hyper (wrk, h2,
wrk-close), haproxy and nginx (the same three), with 1 and 2 workers,
hotloop on both drivers, and writes a Markdown table and a JSON file.
Every process it starts is stopped by its pid; nothing else is touched.
Needs wrk, tcpdump, the release build of hotloop-bench (and haproxy,
nginx for their rows). Connection errors are wrk's connect errors, and
h2-load's refused connects.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

BODY = b"x" * 64
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, limit, what):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.005)
    raise RuntimeError(f"timed out waiting for {what}")


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (an exited child not yet reaped) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def answers(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            got = b""
            while chunk := s.recv(4096):
                got += chunk
            return got.startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def kill_pidfile(path):
    """After a failure: ends the daemon whose pid `path` holds, if alive."""
    try:
        with open(path) as f:
            pid = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return
    if alive(pid):
        # SIGTERM: haproxy and nginx both stop at once, workers included.
        os.kill(pid, signal.SIGTERM)


# ---------------------------------------------------------------- servers


class Hotloop:
    """`hotloop serve APP --upgrade-socket`: an upgrade is a new process."""

    name = "hotloop"

    def __init__(self, binary, app, workers, driver, port, h2_port, tmp, extra=()):
        self.args = [binary, "serve", app, "--addr", f"127.0.0.1:{port}",
                     "--workers", str(workers), "--driver", driver,
                     "--upgrade-socket", os.path.join(tmp, "upgrade.sock"),
                     "--drain-timeout-ms", "10000", *extra]
        self.tmp, self.n, self.proc = tmp, 0, None
        self.port, self.h2_port = port, port
        self.started = []
        # From each old process's last line: connections it cut at the
        # drain deadline, and connections it accepted and closed before a
        # handler had them (the runtime's `accepted_unserved`).
        self.cut, self.unserved = 0, 0

    def count_farewell(self, log):
        """Adds what an exited process's last line reports to the run's totals."""
        log.seek(0)
        text = log.read()
        m = re.search(r"\((\d+) connections cut at the drain deadline\)", text)
        self.cut += int(m.group(1)) if m else 0
        m = re.search(r"(\d+) of them closed before a handler had them", text)
        self.unserved += int(m.group(1)) if m else 0

    def _start(self, args=None):
        self.n += 1
        # Appending: the process writes through the same open file, and
        # without O_APPEND a line it wrote while this side had seeked back to
        # read could land over the file's start.
        log = open(os.path.join(self.tmp, f"hotloop-{self.n}.log"), "a+")
        proc = subprocess.Popen(args or self.args, stderr=log, stdout=subprocess.DEVNULL)
        self.started.append(proc)
        return proc, log

    def kill(self):
        """After a failure: ends every process this run started."""
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def log_tail(self):
        """The last lines of the current and previous processes' logs."""
        tails = []
        for n in (self.n - 1, self.n):
            try:
                with open(os.path.join(self.tmp, f"hotloop-{n}.log")) as f:
                    tails.append(f"[{n}] " + " | ".join(f.read().splitlines()[-4:]))
            except OSError:
                pass
        return tails

    def start(self):
        self.proc, self.log = self._start()
        wait_for(lambda: answers(self.port), 10, "hotloop to serve")

    def upgrade(self):
        old, old_log = self.proc, self.log
        new, log = self._start()

        def took():
            log.seek(0)
            return "took the" in log.read()

        try:
            wait_for(took, 10, "the successor to take the sockets")
        except RuntimeError as e:
            state = "running" if new.poll() is None else f"exited with {new.returncode}"
            raise RuntimeError(f"{e} (the successor is {state}): {self.log_tail()}") from None
        old.wait(timeout=30)
        if old.returncode != 0:
            raise RuntimeError(f"the old hotloop exited with {old.returncode}: "
                               f"{self.log_tail()}")
        self.count_farewell(old_log)
        old_log.close()
        self.proc, self.log = new, log

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        self.count_farewell(self.log)


class NullUpgrade(Hotloop):
    """The control for an upgrade's cost to the host: each "upgrade" starts a
    second `hotloop serve` of the same kind on a port of its own (no
    upgrade socket), waits until it says it serves, then stops it with
    SIGTERM and waits for its exit. The served process is never touched, so
    what its windows show beyond the steady ones is what a process starting
    and exiting beside it costs on this host, with no hand-over at all."""

    def __init__(self, binary, app, workers, driver, port, h2_port, tmp):
        super().__init__(binary, app, workers, driver, port, h2_port, tmp)
        at = self.args.index("--upgrade-socket")
        del self.args[at:at + 2]
        self.other_port = free_port()

    def upgrade(self):
        other, log = self._start([a.replace(f":{self.port}", f":{self.other_port}")
                                  for a in self.args])

        def serving():
            log.seek(0)
            return " on " in log.read()

        try:
            wait_for(serving, 10, "the second process to serve")
        finally:
            other.send_signal(signal.SIGTERM)
            other.wait(timeout=30)
            log.close()
        if other.returncode != 0:
            raise RuntimeError(f"the second process exited with {other.returncode}")


class Haproxy:
    """haproxy answering itself; an upgrade is `haproxy -x SOCK -sf OLD`."""

    name = "haproxy"

    def __init__(self, workers, port, h2_port, tmp):
        self.tmp, self.port, self.h2_port = tmp, port, h2_port
        self.pidfile = os.path.join(tmp, "haproxy.pid")
        self.sock = os.path.join(tmp, "admin.sock")
        self.cfg = os.path.join(tmp, "haproxy.cfg")
        body = BODY.decode()
        with open(self.cfg, "w") as f:
            f.write(f"""global
    nbthread {workers}
    maxconn 8000
    stats socket {self.sock} mode 600 level admin expose-fd listeners
defaults
    mode http
    timeout client 30s
    timeout server 30s
    timeout connect 5s
frontend h1
    bind 127.0.0.1:{port}
    http-request return status 200 content-type text/plain string "{body}"
frontend h2
    bind 127.0.0.1:{h2_port} proto h2
    http-request return status 200 content-type text/plain string "{body}"
""")

    def pid(self):
        with open(self.pidfile) as f:
            return int(f.read().split()[0])

    def start(self):
        subprocess.run(["haproxy", "-D", "-f", self.cfg, "-p", self.pidfile], check=True)
        wait_for(lambda: answers(self.port), 10, "haproxy to serve")

    def upgrade(self):
        old = self.pid()
        subprocess.run(["haproxy", "-D", "-f", self.cfg, "-p", self.pidfile,
                        "-x", self.sock, "-sf", str(old)], check=True)
        wait_for(lambda: self.pid() != old, 10, "the new haproxy")
        wait_for(lambda: not alive(old), 30, "the old haproxy to exit")

    def stop(self):
        pid = self.pid()
        os.kill(pid, signal.SIGUSR1)
        wait_for(lambda: not alive(pid), 30, "haproxy to exit")

    def kill(self):
        kill_pidfile(self.pidfile)


class Nginx:
    """nginx answering itself; an upgrade is SIGUSR2 (a new master on the
    inherited sockets), then SIGQUIT to the old master."""

    name = "nginx"

    def __init__(self, workers, port, h2_port, tmp):
        self.tmp, self.port, self.h2_port = tmp, port, h2_port
        self.pidfile = os.path.join(tmp, "nginx.pid")
        self.cfg = os.path.join(tmp, "nginx.conf")
        body = BODY.decode()
        with open(self.cfg, "w") as f:
            f.write(f"""daemon on;
master_process on;
worker_processes {workers};
pid {self.pidfile};
error_log {tmp}/error.log warn;
events {{ worker_connections 20000; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path {tmp};
    proxy_temp_path {tmp};
    fastcgi_temp_path {tmp};
    uwsgi_temp_path {tmp};
    scgi_temp_path {tmp};
    server {{
        listen 127.0.0.1:{port};
        location / {{ return 200 "{body}"; }}
    }}
    server {{
        listen 127.0.0.1:{h2_port} http2;
        location / {{ return 200 "{body}"; }}
    }}
}}
""")

    def pid(self):
        try:
            with open(self.pidfile) as f:
                return int(f.read().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None

    def start(self):
        # An absolute path: SIGUSR2 makes nginx exec its argv[0] again.
        subprocess.run([shutil.which("nginx"), "-p", self.tmp, "-c", self.cfg], check=True)
        wait_for(lambda: answers(self.port), 10, "nginx to serve")

    def upgrade(self):
        old = self.pid()
        os.kill(old, signal.SIGUSR2)
        wait_for(lambda: self.pid() not in (None, old), 10, "the new nginx master")
        os.kill(old, signal.SIGQUIT)
        wait_for(lambda: not alive(old), 30, "the old nginx master to exit")
        # Its workers end with it (they finish their connections first).
        wait_for(lambda: not os.path.exists(self.pidfile + ".oldbin"), 30, "nginx.pid.oldbin")

    def stop(self):
        pid = self.pid()
        os.kill(pid, signal.SIGQUIT)
        wait_for(lambda: not alive(pid), 30, "nginx to exit")

    def kill(self):
        kill_pidfile(self.pidfile + ".oldbin")
        kill_pidfile(self.pidfile)


# ---------------------------------------------------------------- probes


def read_response(sock):
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} bytes of the head")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lower = head.lower()
    m = re.search(rb"content-length:\s*(\d+)", lower)
    length = int(m.group(1)) if m else 0
    while len(rest) < length:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed in the body")
        rest += chunk
    if not head.startswith(b"HTTP/1.1 200"):
        raise ConnectionError(head[:40].decode(errors="replace"))
    return b"connection: close" in lower


def probe_process(port, kind, path):
    """`--probe PORT ka|fresh PATH`: one probe until SIGTERM, then its samples
    as JSON lines in PATH (the monotonic clock is the host's, so the
    harness compares them with its upgrade windows)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    samples = []
    probe(port, kind == "ka", stop, samples)
    with open(path, "w") as f:
        for sample in samples:
            f.write(json.dumps(sample) + "\n")


def read_samples(path):
    with open(path) as f:
        return [tuple(json.loads(line)) for line in f]


def probe(port, keep_alive, stop, samples, period=0.01):
    """Sequential requests every `period` s; appends (start, latency, error)."""
    sock = None
    req = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n" if keep_alive else \
        b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    tick = time.monotonic()
    # When the kept-alive connection's last answer came: a request that
    # meets a close after the connection sat idle past the server's drain
    # quiet time (1 s) met the idle close every server has, not a lost one.
    answered_at = None
    while not stop.is_set():
        t0 = time.monotonic()
        err = None
        try:
            if sock is None:
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                answered_at = None
            sock.sendall(req)
            closes = read_response(sock)
            answered_at = time.monotonic()
            if closes or not keep_alive:
                sock.close()
                sock = None
        except OSError as e:
            err = f"{type(e).__name__}: {e}"
            if answered_at is not None:
                err += f" (on a connection idle {(t0 - answered_at) * 1000:.0f} ms)"
            if sock is not None:
                sock.close()
            sock = None
        samples.append((t0, time.monotonic() - t0, err))
        tick += period
        time.sleep(max(0.0, tick - time.monotonic()))
    if sock is not None:
        sock.close()


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p / 100))]


# ---------------------------------------------------------------- load


def load_command(args, load, port, h2_port, connections, duration):
    if load == "h2":
        # Not h2load: after a server's GOAWAY its client starts no new
        # request and opens no new connection (it counts the request it
        # could not start as failed, then idles), so every upgrade but the
        # first went unmeasured. `hotloop-bench h2-load` reconnects.
        return [args.h2_load, "h2-load", "--addr", f"127.0.0.1:{h2_port}",
                "--connections", str(connections), "--duration", str(duration)]
    cmd = ["wrk", "-t", "1", "-c", str(connections), "-d", f"{duration}s", "--latency"]
    if load == "wrk-close":
        cmd += ["-H", "Connection: close"]
    return cmd + [f"http://127.0.0.1:{port}/"]


def ms(text):
    m = re.match(r"([\d.]+)(us|ms|s)", text)
    if not m:
        return float("nan")
    v, unit = float(m.group(1)), m.group(2)
    return v / 1000 if unit == "us" else v * 1000 if unit == "s" else v


def parse_load(load, out):
    r = {"requests": 0, "failed": 0, "connect_errors": 0, "p99_ms": float("nan"),
         "max_ms": float("nan")}
    if load == "h2":
        # One JSON line; a request the server refused unprocessed (GOAWAY
        # below its stream, REFUSED_STREAM) was sent again and is not a
        # failure (RFC 9113, 8.7), but it is kept in the JSON.
        line = next((l for l in out.splitlines() if l.startswith("{")), None)
        if line:
            got = json.loads(line)
            r.update({k: got[k] for k in ("requests", "failed", "connect_errors", "p99_ms",
                                          "max_ms")})
            r["h2_refused"], r["h2_connections"] = got["refused"], got["connections"]
            r["h2_failure_examples"] = got["failure_examples"]
        return r
    m = re.search(r"(\d+) requests in", out)
    if m:
        r["requests"] = int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        c, rd, wr, to = map(int, m.groups())
        r["connect_errors"] = c
        r["failed"] += rd + wr + to
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        r["failed"] += int(m.group(1))
    m = re.search(r"\n\s+99%\s+(\S+)", out)
    if m:
        r["p99_ms"] = ms(m.group(1))
    m = re.search(r"Latency\s+\S+\s+\S+\s+(\S+)", out)
    if m:
        r["max_ms"] = ms(m.group(1))
    return r


# ---------------------------------------------------------------- one run


def run(args, server_kind, app, load, workers, driver):
    tmp = tempfile.mkdtemp(prefix="upgrade-harness-")
    port, h2_port = free_port(), free_port()
    if server_kind == "hotloop":
        server = Hotloop(args.hotloop, app, workers, driver, port, h2_port, tmp, args.hotloop_arg)
    elif server_kind == "hotloop-null":
        server = NullUpgrade(args.hotloop, app, workers, driver, port, h2_port, tmp)
    elif server_kind == "haproxy":
        server = Haproxy(workers, port, h2_port, tmp)
    else:
        server = Nginx(workers, port, h2_port, tmp)
    # Started once the server answers: the readiness checks' refused
    # connects are not the run's resets.
    server.start()
    result = None
    try:
        result = measure(args, server, server_kind, app, load, workers, driver, tmp)
        return result
    finally:
        # Whatever happened, no process of this run outlives it.
        server.kill()
        if (result is not None and result["error"]) or args.keep_logs:
            print(f"  the run's logs are kept in {tmp}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def measure(args, server, server_kind, app, load, workers, driver, tmp):
    helpers, stop = [], threading.Event()
    try:
        return measure_with(args, server, server_kind, app, load, workers, driver, tmp,
                            helpers, stop)
    finally:
        stop.set()
        for proc in helpers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def measure_with(args, server, server_kind, app, load, workers, driver, tmp, helpers, stop):
    ports = sorted({server.port, server.h2_port})
    rst_file = os.path.join(tmp, "rst.pcap")
    port_filter = " or ".join(f"tcp port {p}" for p in ports)
    tcpdump = subprocess.Popen(
        ["tcpdump", "-i", "lo", "-nn", "-U", "-w", rst_file, f"({port_filter}) and tcp[13] & 4 != 0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    helpers.append(tcpdump)
    time.sleep(0.5)
    # Each probe is a process of its own: as threads of this one they
    # waited for the interpreter's lock while it started and watched a
    # successor, which put latency into the upgrade windows that no
    # server caused.
    probe_files = {kind: os.path.join(tmp, f"probe-{kind}.jsonl") for kind in ("ka", "fresh")}
    probes = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--probe",
                                str(server.port), kind, path])
              for kind, path in probe_files.items()]
    helpers.extend(probes)
    # The load tools are stopped with SIGINT (they then report) once the
    # upgrades are done; their duration only bounds a run that hangs.
    estimate = args.upgrade_estimate or {"hotloop": 0.5, "hotloop-null": 0.5}.get(server_kind, 1.0)
    duration = int(args.steady + args.upgrades * (args.interval + estimate) + 3) * 2
    loader = subprocess.Popen(load_command(args, load, server.port, server.h2_port, args.connections,
                                           duration),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    helpers.append(loader)
    started = time.monotonic()
    time.sleep(args.steady)
    upgrades, error = [], None
    for _ in range(args.upgrades):
        if time.monotonic() - started > duration - 3:
            break
        t0 = time.monotonic()
        try:
            server.upgrade()
        except Exception as e:  # reported, and the run ends
            error = f"{type(e).__name__}: {e}"
            break
        upgrades.append((t0, time.monotonic()))
        time.sleep(args.interval)
    # Resets are counted until 1 s after the last upgrade: a load tool
    # that stops closes connections with requests in flight, and the
    # answers that meet them draw resets that no upgrade caused.
    time.sleep(1)
    tcpdump.send_signal(signal.SIGINT)
    try:
        tcpdump.wait(timeout=10)
    except subprocess.TimeoutExpired:
        # On a starved host tcpdump can take longer to stop; with -U every
        # packet it caught is already in the file.
        tcpdump.kill()
        tcpdump.wait()
    loader.send_signal(signal.SIGINT)
    out, _ = loader.communicate(timeout=duration + 60)
    stop.set()
    for p in probes:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
    ka, fresh = (read_samples(probe_files[kind]) for kind in ("ka", "fresh"))
    try:
        server.stop()
    except Exception as e:
        error = error or f"stopping: {e}"
    rsts = subprocess.run(["tcpdump", "-tt", "-nn", "-r", rst_file], capture_output=True,
                          text=True)
    lines = [line.split() for line in rsts.stdout.splitlines() if line.strip()]
    reset_times = [float(f[0]) for f in lines]
    resets = len(reset_times)
    # Which side sent each: a server resets a connection it cuts (or one
    # that sent it something after it closed); a client's kernel resets one
    # that the server wrote to after the client had closed it.
    server_ports = {f"127.0.0.1.{p}" for p in ports}
    resets_by_server = sum(1 for f in lines if len(f) > 2 and f[2] in server_ports)
    # tcpdump stamps with the wall clock; the windows are on the monotonic one.
    offset = time.time() - time.monotonic()
    resets_at_upgrades = sum(
        1 for t in reset_times if any(t0 + offset <= t <= t1 + offset + 0.1 for t0, t1 in upgrades))
    result = parse_load(load, out)
    samples = [(t, lat, err, "keep-alive") for t, lat, err in ka] + \
        [(t, lat, err, "new connection") for t, lat, err in fresh]
    # Each upgrade's window runs from its start to 100 ms after the old
    # process exited; the steady windows are the times between them (from
    # 100 ms after one upgrade's window to the next one's start, and the
    # steady phase before the first), so both are measured under the same
    # load on the host, interleaved.
    steady, during, spikes, control_max = [], [], [], 0.0
    # Each steady gap also gives one control window as long as the upgrade
    # windows (the last part of the gap): the share of control windows
    # whose maximum passes 2x the steady p99 is what the host's noise does
    # to a window of that length, beside the share of upgrade windows.
    span = percentile([t1 + 0.1 - t0 for t0, t1 in upgrades], 50) if upgrades else 0.0
    control_windows = []
    prev_end = started
    for t0, t1 in upgrades:
        window = [(lat, kind, t - t0) for t, lat, err, kind in samples
                  if t0 <= t <= t1 + 0.1 and err is None]
        control = [lat for t, lat, err, _ in samples if prev_end <= t < t0 and err is None]
        steady += control
        control_max = max([control_max] + control)
        if t0 - prev_end >= span:
            control_windows.append(
                [lat for t, lat, err, _ in samples if t0 - span <= t < t0 and err is None])
        during += [lat for lat, _, _ in window]
        spikes.append(max(window) if window else (0.0, "-", 0.0))
        prev_end = t1 + 0.2
    if not upgrades:
        steady = [lat for _, lat, err, _ in samples if err is None]
        control_max = max(steady, default=0.0)
    limit = 2 * percentile(steady, 99)
    spiky_upgrades = sum(1 for lat, _, _ in spikes if lat > limit)
    spiky_controls = sum(1 for w in control_windows if w and max(w) > limit)
    probe_failures = [err for _, _, err, _ in samples if err is not None]
    result.update({
        "server": {"hotloop": f"hotloop serve {app}",
                   "hotloop-null": f"hotloop serve {app} (control: no upgrade)"}.get(server_kind,
                                                                                      server_kind),
        "load": load, "workers": workers,
        "driver": driver if server_kind.startswith("hotloop") else "-",
        "upgrades": len(upgrades), "resets": resets, "resets_at_upgrades": resets_at_upgrades,
        "resets_by_server": resets_by_server, "resets_by_client": resets - resets_by_server,
        "probe_requests": len(samples), "probe_failures": len(probe_failures),
        "probe_failure_examples": probe_failures[:3],
        "steady_p99_ms": percentile(steady, 99) * 1000,
        "upgrade_p99_ms": percentile(during, 99) * 1000,
        "steady_max_ms": control_max * 1000,
        "worst_spike_ms": max(spikes)[0] * 1000 if spikes else float("nan"),
        "spikes": [(round(lat * 1000, 2), kind, round(at, 3)) for lat, kind, at in spikes],
        "spiky_upgrades": spiky_upgrades, "spiky_controls": spiky_controls,
        "control_windows": len(control_windows),
        "upgrade_s_median": percentile([t1 - t0 for t0, t1 in upgrades], 50),
        "error": error, "load_output_tail": out[-600:],
        # hotloop only: what its processes' last lines said.
        "drain_cut": getattr(server, "cut", None),
        "accepted_unserved": getattr(server, "unserved", None),
    })
    result["reset_lines"] = rsts.stdout.splitlines()[:6]
    # Where each reset the server sent falls: the upgrade it came in (its
    # window, wall clock) and how far into it, or "steady".
    def where(t):
        for i, (t0, t1) in enumerate(upgrades):
            if t0 + offset <= t <= t1 + offset + 0.1:
                return f"upgrade {i}, {(t - t0 - offset) * 1000:.0f} ms in (old exited at "\
                       f"{(t1 - t0) * 1000:.0f} ms)"
        return "steady"
    result["probe_failures_at"] = [(kind, err, where(t + offset)) for t, _, err, kind in samples
                                   if err is not None]
    result["server_resets"] = [(line, where(float(line.split()[0])))
                               for line, f in zip([x for x in rsts.stdout.splitlines()
                                                   if x.strip()], lines)
                               if len(f) > 2 and f[2] in server_ports]
    return result


def row(r):
    ratio = r["upgrade_p99_ms"] / r["steady_p99_ms"] if r["steady_p99_ms"] else float("nan")
    return (f"| {r['server']} | {r['load']} | {r['workers']} | {r['driver']} | {r['upgrades']} "
            f"| {r['requests']} | {r['failed']} | {r['connect_errors']} "
            f"| {r['resets_by_server']} / {r['resets_by_client']} "
            f"| {r['probe_failures']}/{r['probe_requests']} "
            f"| {r['steady_p99_ms']:.1f} / {r['upgrade_p99_ms']:.1f} ({ratio:.1f}x) "
            f"| {r['steady_max_ms']:.1f} / {r['worst_spike_ms']:.1f} "
            f"| {r['spiky_upgrades']}/{r['upgrades']} vs {r['spiky_controls']}/{r['control_windows']} "
            f"| {r['p99_ms']:.1f} | {r['max_ms']:.1f} |")


HEADER = ("| server | load | workers | driver | upgrades | requests | failed | connect errors "
          "| RSTs: by server / by client | probe failures | probe p99 ms: steady / at upgrades "
          "| probe max ms: steady / at upgrades "
          "| windows over 2x steady p99: upgrades vs steady "
          "| load p99 ms | load max ms |\n|" + "---|" * 15)


def matrix(args):
    servers = args.matrix_servers.split(",")
    runs = []
    for workers in map(int, args.matrix_workers.split(",")):
        for driver in ("epoll", "uring"):
            hotloop = [("http", "wrk"), ("http", "wrk-close"), ("hyper", "wrk"), ("hyper", "h2"),
                       ("hyper", "wrk-close")]
            for app, load in hotloop:
                if "hotloop" in servers or f"hotloop-{app}" in servers:
                    runs.append(("hotloop", app, load, workers, driver))
                # The control right after the run it controls, under the same load.
                if "hotloop-null" in servers:
                    runs.append(("hotloop-null", app, load, workers, driver))
        for anchor in ("haproxy", "nginx"):
            if anchor in servers and shutil.which(anchor):
                runs += [(anchor, "-", load, workers, "-") for load in ("wrk", "h2", "wrk-close")]
    return runs


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--probe":
        probe_process(int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", choices=["hotloop", "hotloop-null", "haproxy", "nginx"],
                    default="hotloop",
                    help="hotloop-null: the control, a second hotloop process started and "
                         "stopped on another port at each \"upgrade\", the served one untouched")
    ap.add_argument("--app", choices=["http", "hyper"], default="http")
    ap.add_argument("--load", choices=["wrk", "wrk-close", "h2"], default="wrk")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--driver", choices=["epoll", "uring"], default="epoll")
    ap.add_argument("--upgrades", type=int, default=100)
    # 0.5 s: the 0.3 s left after an upgrade's window (and 0.1 s more) are
    # the steady samples between upgrades; at 0.2 s nothing was left, and
    # the steady p99 came from the phase before the first upgrade alone.
    ap.add_argument("--interval", type=float, default=0.5,
                    help="seconds between one upgrade's end and the next one's start")
    ap.add_argument("--upgrade-estimate", type=float,
                    help="seconds an upgrade is assumed to take, to size the load tools' "
                         "duration, a bound for a run that hangs (default 0.5 for hotloop, "
                         "1 for haproxy and nginx)")
    ap.add_argument("--steady", type=float, default=5.0,
                    help="seconds of load before the first upgrade")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--hotloop", default=os.path.join(REPO, "target/release/hotloop"))
    ap.add_argument("--hotloop-arg", action="append", default=[],
                    help="one more flag for each hotloop process (repeat; e.g. "
                         "--hotloop-arg=--drain-idle-quiet-ms --hotloop-arg=10000)")
    ap.add_argument("--h2-load", default=os.path.join(REPO, "target/release/hotloop-bench"),
                    help="hotloop-bench, for its h2-load (cargo build --release -p hotloop-bench)")
    ap.add_argument("--matrix", action="store_true")
    ap.add_argument("--keep-logs", action="store_true",
                    help="keep every run's logs (servers', probes', the reset capture)")
    ap.add_argument("--matrix-servers", default="hotloop,haproxy,nginx",
                    help="the matrix's servers: hotloop (or hotloop-http, hotloop-hyper), "
                         "hotloop-null (each hotloop cell's control, see --server), "
                         "haproxy, nginx")
    ap.add_argument("--matrix-workers", default="1,2")
    ap.add_argument("--out", help="Markdown table (and .json beside it)")
    args = ap.parse_args()
    for tool in ("wrk", "tcpdump"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is required (apt-get install wrk tcpdump)")
    if not os.access(args.h2_load, os.X_OK):
        sys.exit(f"{args.h2_load} is required for HTTP/2 load "
                 "(cargo build --release -p hotloop-bench)")
    if args.matrix:
        runs = matrix(args)
    else:
        if args.server.startswith("hotloop") and args.app == "http" and args.load == "h2":
            sys.exit("serve http speaks HTTP/1.1 only; use --app hyper for h2")
        runs = [(args.server, args.app, args.load, args.workers, args.driver)]
    results = []
    print(HEADER, flush=True)
    for spec in runs:
        r = run(args, *spec)
        results.append(r)
        print(row(r), flush=True)
        if r["error"] or r["probe_failures"] or r["resets"]:
            print(f"  note: {r['error']} {r['probe_failure_examples']} {r['reset_lines']}",
                  flush=True)
        # Written after every run, so a run that fails keeps the ones before it.
        if args.out:
            with open(args.out, "w") as f:
                f.write(HEADER + "\n" + "\n".join(row(r) for r in results) + "\n")
            with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
