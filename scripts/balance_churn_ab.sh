#!/usr/bin/env bash
# Churn on a two-worker `hotloop serve http`, placement by the kernel's
# SO_REUSEPORT hash (--balance kernel) and by load (--balance load, the
# default), alternated round by round so a slow spell of a shared machine
# falls on both. Workers pinned to CPUs 0 and 1; the load generator is not
# pinned (a two-CPU machine has none left for it).
#
#   scripts/balance_churn_ab.sh [ROUNDS] [SECONDS]     # defaults: 3 rounds, 4 s each
#
# Prints, per round and placement: connections per second, connect-to-reply
# p99, and the server's CPU time per 1,000 connections (/proc/PID/stat).
# BIN=DIR takes `hotloop` and `hotloop-bench` from DIR (default target/release).
set -euo pipefail
rounds=${1:-3}
secs=${2:-4}
bin=${BIN:-target/release}
ticks_per_s=$(getconf CLK_TCK)
for round in $(seq 1 "$rounds"); do
  for mode in kernel load; do
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$bin/hotloop" serve http --workers 2 --pin --balance "$mode" --addr "127.0.0.1:$port" \
      --body-size 1024 >/dev/null 2>&1 &
    server=$!
    sleep 0.5
    t0=$(awk '{print $14+$15}' "/proc/$server/stat")
    out=$("$bin/hotloop-bench" load --addr "127.0.0.1:$port" --proto http --mode churn \
      --connections 200 --duration "$secs" --size 1024 --json 2>/dev/null)
    t1=$(awk '{print $14+$15}' "/proc/$server/stat")
    kill "$server"
    wait "$server" 2>/dev/null || true
    python3 - "$mode" "$round" "$t0" "$t1" "$ticks_per_s" "$out" <<'PY'
import json, sys
mode, rnd, t0, t1, hz, out = sys.argv[1:7]
r = json.loads(out[out.index('{'):])
cpu_ms = (int(t1) - int(t0)) * 1000 / int(hz)
print(f"round {rnd} {mode:6s} conn/s {r['rate_per_s']:8.0f}  p99 {r['latency_us']['p99'] / 1000:7.2f} ms"
      f"  CPU ms/1k conn {cpu_ms / (r['completed'] / 1000):6.1f}  errors {r['errors'].get('total', 0)}")
PY
  done
done
