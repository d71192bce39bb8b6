"""Servers for the side-by-side measuring scripts: started on CPU 0 from
NAME=CMD specs (PORT in CMD is replaced by the server's port), waited
for, and stopped by pid at the end, whatever happens in between.

    with servers.running(sys.argv[3:]) as running:
        for name, port, proc in running:
            ...
"""

import contextlib
import random
import signal
import socket
import statistics
import subprocess
import time


def wait_for(port, proc, seconds=20):
    """Returns once `port` accepts a connection; raises if `proc` exits first."""
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


@contextlib.contextmanager
def running(specs, hold_stopped=False):
    """Starts one server per NAME=CMD spec on CPU 0 and yields
    [(name, port, proc)]; with `hold_stopped`, each is stopped (SIGSTOP)
    once it answers."""
    # Below the ephemeral range (32768 up), where the clients' own ports come from.
    base = 20000 + random.randrange(0, 9000)
    started = []
    try:
        for i, spec in enumerate(specs):
            name, cmd = spec.split("=", 1)
            port = base + i
            argv = ["taskset", "-c", "0"] + cmd.replace("PORT", str(port)).split()
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            started.append((name, port, proc))
            wait_for(port, proc)
            if hold_stopped:
                proc.send_signal(signal.SIGSTOP)
        yield started
    finally:
        for _, _, proc in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for _, _, proc in started:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def spread(values):
    """Median, first and third quartile, lowest and highest of `values`."""
    v = sorted(values)
    q = statistics.quantiles(v, n=4) if len(v) >= 4 else [v[0], statistics.median(v), v[-1]]
    return statistics.median(v), q[0], q[2], v[0], v[-1]
