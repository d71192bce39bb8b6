#!/usr/bin/env python3
"""Memory per idle client connection of `hotloop proxy --mode http` and of
haproxy (`http-reuse always`, one thread), and whether hostile clients pin
anything: N client connections each send one keep-alive request, read the
answer and sit idle; the proxy's RSS growth over the second half of them
is divided by their count (the first half pays for what only the first
connections touch). Then, with them still open, a client that uploads one
byte every 100 ms and one that asks for 64 MiB and never reads are held for
3 s while a fresh client's request is timed, and the proxy's RSS is read.

    cargo build --release -p hotloop-cli
    python3 scripts/http_proxy_idle.py --connections 10000 --driver epoll

Loopback only; every process it starts is stopped by pid.
"""

import argparse
import os
import resource
import signal
import socket
import subprocess
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    return 0


def hold(port, n):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        socks.append(s)
    for s in socks:
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(4096)
    return socks


def request_ms(port):
    t = time.time()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    while s.recv(65536):
        pass
    return 1000 * (time.time() - t)


def measure(name, argv, port, n, big_port):
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        first = hold(port, n // 2)
        before = rss_kib(proc.pid)
        second = hold(port, n - n // 2)
        time.sleep(1)
        after = rss_kib(proc.pid)
        per = (after - before) * 1024 / max(n - n // 2, 1)
        # Hostile clients beside the idle ones.
        stop = threading.Event()

        def slow_upload():
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n")
            while not stop.is_set():
                try:
                    s.send(b"x")
                except OSError:
                    return
                time.sleep(0.1)

        never = socket.create_connection(("127.0.0.1", port))
        never.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        never.sendall(b"GET /big HTTP/1.1\r\nHost: big\r\n\r\n")
        t = threading.Thread(target=slow_upload)
        t.start()
        time.sleep(3)
        fresh = request_ms(port)
        hostile = rss_kib(proc.pid)
        stop.set()
        t.join()
        never.close()
        print(f"{name}: RSS {before} KiB with {n // 2} idle, {after} KiB with {n}: "
              f"{per:.0f} bytes per idle client connection; with a slow upload and a 64 MiB "
              f"download nobody reads: RSS {hostile} KiB, a fresh request took {fresh:.1f} ms")
        for s in first + second:
            s.close()
    finally:
        proc.send_signal(signal.SIGUSR1 if name == "haproxy" else signal.SIGQUIT)
        proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hotloop", default="target/release/hotloop")
    ap.add_argument("--connections", type=int, default=10000)
    ap.add_argument("--driver", default="auto")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    backend, big = free_port(), free_port()
    procs = [
        subprocess.Popen([args.hotloop, "serve", "http", "--addr", f"127.0.0.1:{backend}", "--workers", "1",
                          "--body-size", "64"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen([args.hotloop, "serve", "http", "--addr", f"127.0.0.1:{big}", "--workers", "1",
                          "--body-size", str(64 << 20)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]
    work = tempfile.mkdtemp(prefix="hotloop-http-proxy-idle-")
    try:
        wait_port(backend)
        wait_port(big)
        config = os.path.join(work, "proxy.toml")
        with open(config, "w") as f:
            f.write(f'[groups.small]\nbackends = ["127.0.0.1:{backend}"]\n'
                    f'[groups.big]\nbackends = ["127.0.0.1:{big}"]\n'
                    '[[routes]]\nhost = "big"\ngroup = "big"\n[[routes]]\ngroup = "small"\n')
        port = free_port()
        measure("hotloop", [args.hotloop, "proxy", "--mode", "http", "--listen", f"127.0.0.1:{port}",
                            "--config", config, "--workers", "1", "--driver", args.driver,
                            "--idle-timeout-ms", "0"], port, args.connections, big)
        port = free_port()
        cfg = os.path.join(work, "haproxy.cfg")
        with open(cfg, "w") as f:
            f.write(f"""global
    nbthread 1
    maxconn 9000
defaults
    mode http
    http-reuse always
    timeout connect 1s
    timeout client 600s
    timeout server 600s
    timeout http-keep-alive 600s
frontend fe
    bind 127.0.0.1:{port}
    use_backend big if {{ hdr(host) -i big }}
    default_backend small
backend small
    server s 127.0.0.1:{backend}
backend big
    server b 127.0.0.1:{big}
""")
        measure("haproxy", ["haproxy", "-db", "-f", cfg], port, args.connections, big)
    finally:
        for p in procs:
            p.send_signal(signal.SIGQUIT)
            p.wait()


if __name__ == "__main__":
    main()
