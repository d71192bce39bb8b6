#!/usr/bin/env python3
"""Hostile clients against a `hotloop serve` (or any HTTP server on
loopback), for the figures in RELIABILITY.md. Standard library only.

    scripts/hostile.py never-reading BIN APP [SERVER FLAGS...]
    scripts/hostile.py h2-idle BIN [SERVER FLAGS...]
    scripts/hostile.py half-close BIN [SERVER FLAGS...]
    scripts/hostile.py stats-silent BIN [SERVER FLAGS...]
    scripts/hostile.py static-files BIN [SERVER FLAGS...]
    scripts/hostile.py static-fifo BIN [SERVER FLAGS...]
    scripts/hostile.py ... --addr HOST:PORT   (an already running server: BIN is ignored)

BIN is a `hotloop` binary (e.g. target/debug/hotloop). The server is
started on 127.0.0.1 with an open-file limit of 256 (`prlimit`), one
worker, and the flags given; it is stopped by pid at the end. Options
(before BIN): --tls (generate a certificate with `openssl` and serve over
TLS), --clients N, --wait SECONDS, --app APP (half-close: the app, hyper
by default), --closing (half-close: the request says `Connection: close`).

never-reading  N clients (260) each send 200 pipelined GETs and never read;
               WAIT seconds (20) later, 20 new clients each try one
               request (2 s each): how many are served. Give the http and
               hyper apps --body-size 65536, so that the answers outgrow
               the socket buffers at once.
h2-idle        N clients (50) open an HTTP/2 connection (prior knowledge, or
               ALPN h2 with --tls), send the preface and SETTINGS, and go
               silent: how many the server closed (and how many saw a
               GOAWAY first) WAIT seconds (5) later.
half-close     N clients (50) at once each send a GET and then end their
               side (shutdown(SHUT_WR); with --tls a close_notify first):
               how many read a whole 200 answer.
static-files   `serve static` over a root of N files (400) and an
               index.html: one request for each file, one after another,
               then 20 new clients ask for /index.html (2 s each): how
               many of each were answered 200, and the server's
               descriptors after WAIT seconds (3) of quiet.
static-fifo    `serve static` over a root with a FIFO: N clients (600) at
               once ask for it (3 s each), then 10 clients ask for a
               regular file: how each was answered, and the server's
               threads.
stats-silent   N silent connections (70) to the stats endpoint
               (--stats-addr is added), then 75 scrapes one after another
               (2 s each): how many are answered.
"""

import argparse
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
GET = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"
HALF_CLOSE_REQUEST = GET
GET_CLOSE = b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"


def certificate(directory):
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True)
    return cert, key


class Server:
    """`BIN serve APP` under `prlimit --nofile=256:256`; its addresses."""

    def __init__(self, binary, app, flags, tls_files, stats):
        args = ["prlimit", "--nofile=256:256", binary, "serve", app, "--addr", "127.0.0.1:0",
                "--workers", "1"] + flags
        if tls_files:
            args += ["--tls-cert", tls_files[0], "--tls-key", tls_files[1]]
        if stats:
            args += ["--stats-addr", "127.0.0.1:0"]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        self.addr = self.stats = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (self.addr is None or (stats and self.stats is None)):
            line = self.proc.stderr.readline()
            if not line:
                break
            m = re.search(r"stats on http://([\d.]+:\d+)", line)
            if m:
                self.stats = parse(m.group(1))
                continue
            m = re.search(r" on ([\d.]+:\d+)", line)
            if m:
                self.addr = parse(m.group(1))
        if self.addr is None:
            self.stop()
            sys.exit("the server did not start")
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def parse(text):
    host, port = text.rsplit(":", 1)
    return host, int(port)


def connect(addr, tls, alpn=None, rcvbuf=None, timeout=2.0):
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(timeout)
    s.connect(addr)
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        if alpn:
            ctx.set_alpn_protocols(alpn)
        s = ctx.wrap_socket(s, server_hostname="localhost")
    return s


def answered(addr, tls):
    """One request on a fresh connection: whether a 200 came back."""
    try:
        s = connect(addr, tls)
        s.sendall(GET_CLOSE)
        ok = s.recv(15).startswith(b"HTTP/1.1 200")
        s.close()
        return ok
    except OSError:
        return False


def read_to_close(s):
    got = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                return got
            got += b
    except (OSError, ssl.SSLError):
        return got


def never_reading(args, server):
    held = []

    def client():
        try:
            s = connect(server.addr, args.tls, rcvbuf=4096)
            s.settimeout(0.3)
            s.sendall(GET * 200)
        except (OSError, ssl.SSLError):
            s = None
        held.append(s)

    run_all(client, args.clients or 260)
    time.sleep(args.wait or 20)
    ok = sum(answered(server.addr, args.tls) for _ in range(20))
    print(f"{ok}/20 new clients served {args.wait or 20:g} s after "
          f"{args.clients or 260} never-reading clients")


def h2_idle(args, server):
    results = []

    def client():
        try:
            s = connect(server.addr, args.tls, alpn=["h2"], timeout=(args.wait or 5))
            s.sendall(H2_PREFACE + H2_SETTINGS)
        except (OSError, ssl.SSLError):
            results.append(None)
            return
        start = time.monotonic()
        got = read_to_close(s)
        closed = time.monotonic() - start < (args.wait or 5) - 0.1
        results.append((closed, goaway(got)))

    run_all(client, args.clients or 50)
    closed = sum(1 for r in results if r and r[0])
    goaways = sum(1 for r in results if r and r[1])
    print(f"{closed}/{len(results)} idle HTTP/2 connections closed within {args.wait or 5:g} s "
          f"({goaways} with a GOAWAY)")


def goaway(data):
    """Whether the server's HTTP/2 frames include a GOAWAY (type 7)."""
    i = 0
    while i + 9 <= len(data):
        length = int.from_bytes(data[i:i + 3], "big")
        if data[i + 3] == 7:
            return True
        i += 9 + length
    return False


def half_close(args, server):
    results = []

    def client():
        try:
            if args.tls:
                got = tls_half_close(server.addr)
            else:
                s = connect(server.addr, False, timeout=5)
                s.sendall(HALF_CLOSE_REQUEST)
                s.shutdown(socket.SHUT_WR)
                got = read_to_close(s)
            results.append(got.startswith(b"HTTP/1.1 200") and complete(got))
        except (OSError, ssl.SSLError):
            results.append(False)

    run_all(client, args.clients or 50)
    print(f"{sum(results)}/{len(results)} half-closing clients got their answer")


def tls_half_close(addr):
    """A TLS request, then (in a write of its own) close_notify and the
    TCP write side, then the answer: over memory buffers, since `SSLSocket.unwrap` would wait
    for (and throw away everything before) the server's close_notify."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    s = socket.create_connection(addr, timeout=5)

    def pump():
        out = outgoing.read()
        if out:
            s.sendall(out)
        data = s.recv(65536)
        if data:
            incoming.write(data)
        else:
            incoming.write_eof()
        return data

    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            if not pump():
                return b""
    tls.write(HALF_CLOSE_REQUEST)
    # The request goes out as it is written; the end of the client's side
    # follows when it is done sending, as in a client that sends, flushes
    # and closes.
    s.sendall(outgoing.read())
    try:
        tls.unwrap()
    except ssl.SSLWantReadError:
        pass  # close_notify is out; the server's comes after its answer
    s.sendall(outgoing.read())
    s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        try:
            chunk = tls.read(65536)
            if not chunk:
                return got
            got += chunk
        except ssl.SSLWantReadError:
            if not pump():
                return got
        except (ssl.SSLError, OSError):
            return got


def complete(reply):
    head, _, body = reply.partition(b"\r\n\r\n")
    m = re.search(rb"(?i)content-length: *(\d+)", head)
    return m is not None and len(body) >= int(m.group(1))


def stats_silent(args, server):
    silent = []
    for _ in range(args.clients or 70):
        try:
            silent.append(connect(server.stats, False))
        except OSError:
            pass
    ok = 0
    for _ in range(75):
        try:
            s = connect(server.stats, False, timeout=2)
            s.sendall(b"GET /stats HTTP/1.1\r\nHost: t\r\n\r\n")
            ok += read_to_close(s).startswith(b"HTTP/1.1 200")
        except OSError:
            pass
    print(f"{ok}/75 scrapes answered with {len(silent)} silent connections open")


def static_root(directory, files):
    """A root of `files` small files and an index.html; its path."""
    root = os.path.join(directory, "root")
    os.mkdir(root)
    for i in range(files):
        with open(os.path.join(root, f"f{i}.txt"), "w") as f:
            f.write(f"file {i}\n")
    with open(os.path.join(root, "index.html"), "w") as f:
        f.write("home\n")
    os.mkfifo(os.path.join(root, "fifo"))
    return root


def status(addr, path, timeout=2.0):
    """One `Connection: close` GET: its status code, or the error's name."""
    try:
        s = connect(addr, False, timeout=timeout)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
        head = s.recv(12)
        s.close()
        return head[9:12].decode() if len(head) == 12 else "closed"
    except OSError as e:
        return type(e).__name__


def tally(results):
    counts = {}
    for r in results:
        counts[r] = counts.get(r, 0) + 1
    return ", ".join(f"{n} {r}" for r, n in sorted(counts.items()))


def static_files(args, server):
    files = args.clients or 400
    first = [status(server.addr, f"/f{i}.txt") for i in range(files)]
    later = [status(server.addr, "/index.html") for _ in range(20)]
    time.sleep(args.wait or 3)
    fds = len(os.listdir(f"/proc/{server.proc.pid}/fd"))
    print(f"{files} distinct files: {tally(first)}; then 20 new clients: {tally(later)}; "
          f"{fds} descriptors open {args.wait or 3:g} s later")


def static_fifo(args, server):
    results = []
    run_all(lambda: results.append(status(server.addr, "/fifo", timeout=3)),
            args.clients or 600)
    threads = len(os.listdir(f"/proc/{server.proc.pid}/task"))
    later = [status(server.addr, "/index.html") for _ in range(10)]
    print(f"{len(results)} requests for a FIFO: {tally(results)}; {threads} server threads; "
          f"then 10 requests for a file: {tally(later)}")


def run_all(client, n):
    threads = [threading.Thread(target=client) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tls", action="store_true")
    p.add_argument("--clients", type=int)
    p.add_argument("--wait", type=float)
    p.add_argument("--addr", help="an already running server instead of BIN")
    p.add_argument("--stats", help="its stats endpoint, for stats-silent")
    p.add_argument("--app", help="half-close: the app to serve (hyper by default)")
    p.add_argument("--closing", action="store_true",
                   help="half-close: the request says `Connection: close`")
    p.add_argument("attack", choices=["never-reading", "h2-idle", "half-close", "stats-silent",
                                      "static-files", "static-fifo"])
    p.add_argument("binary")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    args = p.parse_args()
    app, flags = "http", args.rest
    if args.attack == "never-reading":
        app, flags = args.rest[0], args.rest[1:]
    elif args.attack == "h2-idle":
        app = "hyper"
    elif args.attack == "half-close":
        app = args.app or "hyper"
    elif args.attack.startswith("static-"):
        app = "static"
    if args.closing:
        global HALF_CLOSE_REQUEST
        HALF_CLOSE_REQUEST = GET_CLOSE
    attack = {"never-reading": never_reading, "h2-idle": h2_idle, "half-close": half_close,
              "stats-silent": stats_silent, "static-files": static_files,
              "static-fifo": static_fifo}[args.attack]
    if args.addr:
        server = argparse.Namespace(addr=parse(args.addr),
                                    stats=parse(args.stats) if args.stats else None)
        attack(args, server)
        return
    with tempfile.TemporaryDirectory() as d:
        tls_files = certificate(d) if args.tls else None
        if app == "static":
            flags = ["--root", static_root(d, args.clients or 400 if args.attack == "static-files"
                                           else 0)] + flags
        server = Server(args.binary, app, flags, tls_files, args.attack == "stats-silent")
        try:
            print(f"{args.attack} on `serve {app}{' over TLS' if args.tls else ''} "
                  f"{' '.join(flags)}`: ", end="", flush=True)
            attack(args, server)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
