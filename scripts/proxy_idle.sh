#!/usr/bin/env bash
# Memory per idle proxied connection: an echo backend and `hotloop proxy`,
# N client connections through the proxy that each move one byte each way
# and then sit idle; reports the proxy's RSS growth per connection.
#
#   scripts/proxy_idle.sh [CONNECTIONS] [DRIVER]
#
# Defaults: 5,000 connections (the proxy holds two descriptors for each;
# the open-file hard limit here is 20,000 per process), auto driver.
# Loopback only; every process it starts is stopped by pid.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-5000}"
driver="${2:-auto}"
# Below the ephemeral port range, so the clients' own ports cannot collide.
backend_port=$((21000 + RANDOM % 5000))
proxy_port=$((backend_port + 1))

cargo build --release -p hotloop-cli -q
bin=target/release/hotloop

"$bin" serve echo --addr "127.0.0.1:$backend_port" --workers 1 --idle-timeout-ms 0 \
  --driver "$driver" 2>/tmp/proxy-idle-backend.log &
backend=$!
"$bin" proxy --listen "127.0.0.1:$proxy_port" --backend "127.0.0.1:$backend_port" --workers 1 \
  --idle-timeout-ms 0 --driver "$driver" 2>/tmp/proxy-idle-proxy.log &
proxy=$!
holder=""
cleanup() {
  [ -n "$holder" ] && kill "$holder" 2>/dev/null || true
  kill "$proxy" "$backend" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT
sleep 1
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$proxy/status"; }
fds() { ls "/proc/$proxy/fd" | wc -l; }
rss_before=$(rss_kib)

python3 - "$proxy_port" "$n" <<'PY' &
import resource, socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
socks = []
for i in range(n):
    s = socket.socket()
    s.connect(("127.0.0.1", port))
    socks.append(s)
# One byte each way, so each connection has moved data, then idle.
for s in socks:
    s.send(b"x")
for s in socks:
    s.recv(1)
print("idle proxied connections:", len(socks), flush=True)
time.sleep(3600)
PY
holder=$!
for _ in $(seq 600); do
  [ "$(fds)" -ge $((2 * n)) ] && break
  sleep 0.1
done
sleep 3
rss_idle=$(rss_kib)
echo "driver $(grep -o 'driver [a-z]*' /tmp/proxy-idle-proxy.log | head -1 | cut -d' ' -f2):" \
  "proxy RSS ${rss_before} KiB before, ${rss_idle} KiB with $n idle proxied connections:" \
  "$(( (rss_idle - rss_before) * 1024 / n )) bytes each; descriptors $(fds)"
