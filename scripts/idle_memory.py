#!/usr/bin/env python3
"""Memory per idle connection of a `hotloop serve` app, for RELIABILITY.md.

    scripts/idle_memory.py BIN DRIVER MODE N [APP]

BIN is a `hotloop` binary, DRIVER epoll or uring, MODE `connect` (connected,
nothing sent), `request` (one keep-alive request answered, then silence), or
`tls-connect`/`tls-request` (the same over TLS, with a generated
certificate), N the idle connections (at most about 9,000: the client holds
them in this process), APP `http` by default. The server runs on 127.0.0.1
with one worker and long timeouts; 200 connections warm it up first; the
figure is the RSS growth over N connections, and over the second half of
them alone, which leaves out what only the first connections pay (the
io_uring provided-buffer ring's pages, touched as arrivals rotate through
it, up to 1 MiB per worker). The server is stopped by pid.
"""
import os
import re
import ssl
import socket
import subprocess
import sys
import tempfile
import time

binp, driver, mode, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
app = sys.argv[5] if len(sys.argv) > 5 else "http"
args = [binp, "serve", app, "--addr", "127.0.0.1:0", "--workers", "1", "--driver", driver,
        "--idle-timeout-ms", "600000", "--header-timeout-ms", "600000"]
tls = mode.startswith("tls")
if tls:
    d = os.path.join(tempfile.gettempdir(), "hotloop-idle-memory-cert"); os.makedirs(d, exist_ok=True)
    if not os.path.exists(d + "/c.pem"):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", d + "/k.pem", "-out", d + "/c.pem", "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True)
    args += ["--tls-cert", d + "/c.pem", "--tls-key", d + "/k.pem"]
p = subprocess.Popen(["prlimit", "--nofile=20000:20000"] + args, stderr=subprocess.PIPE, text=True)
addr = None
while addr is None:
    l = p.stderr.readline()
    if not l: print("server died"); sys.exit(1)
    m = re.search(r" on (127\.0\.0\.1:\d+)", l)
    if m: addr = m.group(1)
host, port = addr.split(":"); port = int(port)
def rss(): 
    for l in open(f"/proc/{p.pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1])
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
# warm up: a few connections so pools and first allocations exist
def one(keep):
    s = socket.create_connection((host, port))
    if tls: s = ctx.wrap_socket(s, server_hostname="localhost")
    if mode.endswith("request"):
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        buf = b""
        while b"\r\n\r\n" not in buf: buf += s.recv(65536)
    return s
warm = [one(True) for _ in range(200)]
for s in warm: s.close()
time.sleep(1)
before = rss()
conns = [one(True) for _ in range(n // 2)]
time.sleep(2)
half = rss()
conns += [one(True) for _ in range(n - n // 2)]
time.sleep(2)
after = rss()
# The second half's growth leaves out what the first connections touch
# once for all (the io_uring provided-buffer ring's pages, pools).
print(f"{app} {driver} {mode}: {n} idle, RSS {before} -> {after} KiB, {(after-before)*1024/n:.0f} B per connection"
      f" ({(after-half)*1024/(n - n // 2):.0f} B each for the second {n - n // 2})")
p.kill(); p.wait()
