#!/usr/bin/env python3
"""A TLS certificate swapped under load: `hotloop serve APP --tls-cert
--tls-key`, wrk making one new TLS connection per request (a full
handshake each), and the certificate and key files replaced (two
self-signed certificates in turn, each pair renamed into place) then
SIGHUP, `--reloads` times, `--interval` seconds apart.

Reports wrk's requests and errors (a failed handshake is a connect or
read error in wrk's count), the resets on the port (tcpdump) by the side
that sent them (wrk closes each connection without reading the server's
close_notify, so its kernel resets nearly every one: a client's doing,
whatever the server), the
server's `tls_reloads` and `tls_reload_failures` (its stats endpoint),
and how many probe handshakes after each reload were served the
certificate just installed (each reload is checked, so a reload that
took no effect shows).

    python3 scripts/cert_reload_load.py --app http --workers 2 --driver uring --reloads 100

Every process it starts is stopped by its pid. Needs wrk, tcpdump, openssl.
"""

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from upgrade_harness import REPO, free_port, parse_load, wait_for  # noqa: E402


def make_cert(tmp, name):
    cert, key = os.path.join(tmp, f"{name}.crt"), os.path.join(tmp, f"{name}.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                    f"/CN={name}", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    with open(cert) as f:
        der = ssl.PEM_cert_to_DER_cert(f.read())
    return cert, key, hashlib.sha256(der).hexdigest()


def served(port):
    """The fingerprint of the certificate a new handshake gets."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=2) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            return hashlib.sha256(s.getpeercert(binary_form=True)).hexdigest()


def install(src_cert, src_key, cert, key):
    """Renames a copy of each file into place: a reload reads whole files."""
    for src, dst in ((src_key, key), (src_cert, cert)):
        shutil.copyfile(src, dst + ".new")
        os.replace(dst + ".new", dst)


def stats(stats_port):
    with urllib.request.urlopen(f"http://127.0.0.1:{stats_port}/stats", timeout=2) as r:
        return json.load(r)


def lifecycle(snapshot):
    """The process's event counters, wherever the snapshot keeps them."""
    if "lifecycle" in snapshot:
        return snapshot["lifecycle"]
    return {k: v for k, v in snapshot.items() if k.startswith("tls_")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--app", choices=["http", "hyper"], default="http")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--driver", choices=["epoll", "uring"], default="epoll")
    ap.add_argument("--reloads", type=int, default=100)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--hotloop", default=os.path.join(REPO, "target/release/hotloop"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cert-reload-")
    procs = []
    try:
        pairs = [make_cert(tmp, "a"), make_cert(tmp, "b")]
        cert, key = os.path.join(tmp, "live.crt"), os.path.join(tmp, "live.key")
        install(pairs[0][0], pairs[0][1], cert, key)
        port, stats_port = free_port(), free_port()
        log = open(os.path.join(tmp, "hotloop.log"), "w+")
        server = subprocess.Popen(
            [args.hotloop, "serve", args.app, "--addr", f"127.0.0.1:{port}",
             "--workers", str(args.workers), "--driver", args.driver,
             "--tls-cert", cert, "--tls-key", key, "--stats-addr", f"127.0.0.1:{stats_port}"],
            stdout=subprocess.DEVNULL, stderr=log)
        procs.append(server)
        wait_for(lambda: _try(lambda: served(port)) == pairs[0][2], 10, "hotloop over TLS")
        before = lifecycle(stats(stats_port))
        pcap = os.path.join(tmp, "rst.pcap")
        tcpdump = subprocess.Popen(["tcpdump", "-i", "lo", "-nn", "-U", "-w", pcap,
                                    f"tcp port {port} and tcp[13] & 4 != 0"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(tcpdump)
        time.sleep(0.5)
        wrk = subprocess.Popen(["wrk", "-t", "1", "-c", str(args.connections), "-d", "3600s", "--latency",
                                "-H", "Connection: close", f"https://127.0.0.1:{port}/"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(wrk)
        time.sleep(2)
        took, probe_errors = 0, []
        for i in range(args.reloads):
            want = pairs[(i + 1) % 2]
            install(want[0], want[1], cert, key)
            server.send_signal(signal.SIGHUP)
            time.sleep(args.interval)
            try:
                took += served(port) == want[2]
            except OSError as e:
                probe_errors.append(f"{type(e).__name__}: {e}")
        time.sleep(1)
        tcpdump.send_signal(signal.SIGINT)
        tcpdump.wait(timeout=10)
        wrk.send_signal(signal.SIGINT)
        out, _ = wrk.communicate(timeout=60)
        after = lifecycle(stats(stats_port))
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        rsts = subprocess.run(["tcpdump", "-nn", "-r", pcap], capture_output=True, text=True)
        resets = [l.split() for l in rsts.stdout.splitlines() if len(l.split()) > 2]
        r = parse_load("wrk", out)
        result = {
            "app": args.app, "workers": args.workers, "driver": args.driver,
            "reloads": args.reloads, "requests (each a new TLS handshake)": r["requests"],
            "failed": r["failed"], "connect_errors": r["connect_errors"],
            "resets_by_server": sum(1 for f in resets if f[2] == f"127.0.0.1.{port}"),
            "resets_by_client": sum(1 for f in resets if f[2] != f"127.0.0.1.{port}"),
            "tls_reloads": after.get("tls_reloads", 0) - before.get("tls_reloads", 0),
            "tls_reload_failures": after.get("tls_reload_failures", 0)
            - before.get("tls_reload_failures", 0),
            "probes_served_the_new_certificate": f"{took}/{args.reloads}",
            "probe_errors": probe_errors[:3], "load_p99_ms": r["p99_ms"],
        }
        print(json.dumps(result))
        log.seek(0)
        if result["failed"] or result["connect_errors"] or probe_errors:
            print(log.read()[-2000:], file=sys.stderr)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _try(f):
    try:
        return f()
    except OSError:
        return None


if __name__ == "__main__":
    main()
