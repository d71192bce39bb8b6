#!/usr/bin/env bash
# Soak: hold many idle connections on one hotloop server, churn short
# connections beside them, then report memory per idle connection,
# descriptors before and after, client errors and the server's counters.
#
#   scripts/soak.sh [IDLE_CONNECTIONS] [CHURN_SECONDS] [DRIVER]
#
# Defaults: 19,400 idle (the open-file hard limit here is 20,000 per
# process; the churn needs a few hundred more), 30 s of churn, auto driver.
# Loopback only; every process it starts is stopped by pid.
set -euo pipefail
cd "$(dirname "$0")/.."
idle="${1:-19400}"
churn_secs="${2:-30}"
driver="${3:-auto}"
port=$((20000 + RANDOM % 20000))
stats_port=$((port + 1))

cargo build --release -p hotloop-cli -p hotloop-bench -q
bin=target/release/hotloop
bench_bin=target/release/hotloop-bench

"$bin" serve echo --addr "127.0.0.1:$port" --workers 1 --driver "$driver" \
  --stats-addr "127.0.0.1:$stats_port" --idle-timeout-ms 0 2>/tmp/soak-server.log &
server=$!
holder=""
cleanup() {
  [ -n "$holder" ] && kill "$holder" 2>/dev/null || true
  kill "$server" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 100); do
  curl -s "http://127.0.0.1:$stats_port/stats" >/dev/null 2>&1 && break
  sleep 0.05
done

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$server/status"; }
fds() { ls "/proc/$server/fd" | wc -l; }

fds_before=$(fds)
rss_before=$(rss_kib)

# The idle clients: a Python process that connects and then does nothing.
python3 - "$port" "$idle" <<'PY' &
import resource, socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
socks = []
for i in range(n):
    s = socket.socket()
    s.connect(("127.0.0.%d" % (1 + i // 20000), port))
    socks.append(s)
print("idle clients connected:", len(socks), flush=True)
time.sleep(3600)
PY
holder=$!
for _ in $(seq 600); do
  active=$(curl -s "http://127.0.0.1:$stats_port/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["active_connections"])')
  [ "$active" -ge "$idle" ] && break
  sleep 0.1
done
sleep 1
rss_idle=$(rss_kib)
fds_idle=$(fds)

echo "churning for ${churn_secs}s beside $active idle connections"
"$bench_bin" load --addr "127.0.0.1:$port" --proto echo --mode churn --connections 200 \
  --duration "$churn_secs" --json > /tmp/soak-load.json
rss_churn=$(rss_kib)

kill "$holder"; wait "$holder" 2>/dev/null || true; holder=""
for _ in $(seq 100); do
  [ "$(fds)" -le "$fds_before" ] && break
  sleep 0.1
done
fds_after=$(fds)
stats=$(curl -s "http://127.0.0.1:$stats_port/stats")

python3 - "$idle" "$active" "$rss_before" "$rss_idle" "$rss_churn" "$fds_before" "$fds_idle" "$fds_after" "$stats" <<'PY'
import json, sys
idle, active, rss0, rss_idle, rss_churn, fd0, fd_idle, fd1 = map(int, sys.argv[1:9])
stats = json.loads(sys.argv[9])
load = json.load(open("/tmp/soak-load.json"))
per_conn = (rss_idle - rss0) * 1024 / max(active, 1)
print(f"idle connections held:        {active} (asked {idle})")
print(f"server RSS:                   {rss0} KiB before, {rss_idle} KiB idle, {rss_churn} KiB after churn")
print(f"user-space memory per idle connection: {per_conn:.0f} bytes (target <= 2048)")
print(f"descriptors:                  {fd0} before, {fd_idle} with idle clients, {fd1} after (leak: {fd1 - fd0})")
e = load["errors"]
print(f"churn beside them:            {load['completed']} connections, {load['rate_per_s']:.0f}/s, p99 {load['latency_us']['p99']:.0f} us, client errors {e['total']}")
keys = ["accepted", "accept_wakeups", "max_accepted_per_wakeup", "accept_errors_resources", "accept_errors_aborted",
        "accept_errors_other", "registrations", "registrations_avoided", "poller_waits", "timers_fired", "driver"]
print("server counters:              " + ", ".join(f"{k}={stats[k]}" for k in keys))
ok = per_conn <= 2048 and fd1 <= fd0 and e["total"] == 0 and active >= idle
print("RESULT:", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
