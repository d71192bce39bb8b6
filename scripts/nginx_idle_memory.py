#!/usr/bin/env python3
"""Memory per idle connection of nginx, measured as idle_memory.py measures
hotloop's, for RELIABILITY.md.

    scripts/nginx_idle_memory.py MODE N [PORT]

MODE `connect` (connected, nothing sent) or `request` (one keep-alive
request answered, then silence), N the idle connections (at most about
9,000). nginx runs on 127.0.0.1 as one process (`master_process off`) with
long timeouts and a 5-byte answer; 200 connections warm it up first; the
figure is its RSS growth over N connections, and over the second half
alone. It is stopped by pid; its files go to a temporary directory.
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

mode, n = sys.argv[1], int(sys.argv[2])
port = int(sys.argv[3]) if len(sys.argv) > 3 else 38111
d = tempfile.mkdtemp(prefix="hotloop-nginx-idle-")
with open(os.path.join(d, "nginx.conf"), "w") as f:
    f.write(f"""daemon off;
master_process off;
worker_processes 1;
worker_rlimit_nofile 20000;
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 19000; }}
http {{
  access_log off;
  keepalive_timeout 600s;
  keepalive_requests 100000;
  client_header_timeout 600s;
  server {{
    listen 127.0.0.1:{port};
    location / {{ return 200 "hello"; }}
  }}
}}
""")
p = subprocess.Popen(["prlimit", "--nofile=20000:20000", "nginx", "-c", f"{d}/nginx.conf", "-p", d],
                     stderr=subprocess.DEVNULL)
time.sleep(1)


def rss():
    for line in open(f"/proc/{p.pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])


def one():
    s = socket.create_connection(("127.0.0.1", port))
    if mode == "request":
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        buf = b""
        while b"hello" not in buf:
            buf += s.recv(65536)
    return s


warm = [one() for _ in range(200)]
for s in warm:
    s.close()
time.sleep(1)
before = rss()
conns = [one() for _ in range(n // 2)]
time.sleep(2)
half = rss()
conns += [one() for _ in range(n - n // 2)]
time.sleep(2)
after = rss()
print(f"nginx {mode}: {n} idle, RSS {before} -> {after} KiB, {(after-before)*1024/n:.0f} B per connection"
      f" ({(after-half)*1024/(n - n // 2):.0f} B each for the second {n - n // 2})")
p.kill()
p.wait()
