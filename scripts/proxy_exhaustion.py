#!/usr/bin/env python3
"""The proxy at its open-file limit with a backend that never answers, for
RELIABILITY.md.

    scripts/proxy_exhaustion.py BIN DRIVER

Starts `hotloop proxy` (BIN) with 256 descriptors, two workers and a 3 s
connect timeout in front of a loopback listener whose accept queue is full
(connects to it hang), sends 300 clients at it, each writing a byte, and
reports how many were cut before the connect timeout (and how), the
accept log lines in 10 s, and the server's descriptors at the end. The
server is stopped by pid.
"""
import socket, subprocess, sys, time, threading, re
binp, driver = sys.argv[1], sys.argv[2]
hole = socket.socket(); hole.bind(("127.0.0.1", 0)); hole.listen(0)
haddr = hole.getsockname()
fill = []
while True:
    s = socket.socket(); s.settimeout(0.3)
    try: s.connect(haddr); fill.append(s)
    except Exception: break
p = subprocess.Popen(["prlimit", "--nofile=256:256", binp, "proxy", "--listen", "127.0.0.1:0", "--backend", "%s:%d" % haddr, "--workers", "2", "--driver", driver, "--connect-timeout-ms", "3000"], stderr=subprocess.PIPE, text=True)
lines = []
addr = None
while addr is None:
    l = p.stderr.readline(); lines.append(l)
    m = re.search(r" on (127\.0\.0\.1:\d+)", l)
    if m: addr = m.group(1)
threading.Thread(target=lambda: [lines.append(l) for l in p.stderr], daemon=True).start()
host, port = addr.split(":"); port = int(port)
res = []
def client():
    t = time.time(); s = socket.socket(); s.settimeout(20)
    try:
        s.connect((host, port)); s.send(b"x"); d = s.recv(16); kind = "eof" if d == b"" else "data"
    except ConnectionResetError: kind = "rst"
    except Exception as e: kind = type(e).__name__
    res.append((time.time() - t, kind))
ts = [threading.Thread(target=client) for _ in range(300)]
t0 = time.time()
[t.start() for t in ts]
time.sleep(10)
early = [r for r in res if r[0] < 2.7]
n_lines = len([l for l in lines if "accept" in l])
print(f"{driver}: {len(res)} ended in 10 s, {len(early)} cut before 2.7 s ({sum(1 for r in early if r[1]=='eof')} EOF, {sum(1 for r in early if r[1]=='rst')} RST); accept log lines in 10 s: {n_lines}")
[t.join() for t in ts]
fds = len(__import__('os').listdir(f"/proc/{p.pid}/fd"))
print(f"{driver}: all {len(res)} ended; server descriptors after: {fds}")
p.kill(); p.wait()
