#!/usr/bin/env bash
# Server CPU per connection, servers alternated round by round:
# `perf stat -e task-clock,context-switches` on the server over exactly N
# HTTP connections (after 2,000 to warm up), server on CPU 0, load on
# CPU 1. Prints each round, then each server's median and the medians of
# the per-round ratios against the first server. Where perf can read the
# kernel's system-call tracepoints, each round also gives the system calls
# per connection, which do not drift with the machine's load.
#
#   scripts/serial_cpu_ab.sh ROUNDS N NAME=CMD [NAME=CMD ...]
#
# Serial connections by default; for short connections in flight at once,
# open loop, set MODE=churn (and CONNS, RATE, SIZE: the load's
# --connections, --rate and --size; defaults 4000, 2000, 1024), e.g.
#   MODE=churn scripts/serial_cpu_ab.sh 5 10000 "floor=..." "hotloop=..."
#
# CMD is a server command line with PORT where its address goes, e.g.
#   scripts/serial_cpu_ab.sh 5 20000 \
#     "floor=target/release/hotloop-bench peer floor http --addr 127.0.0.1:PORT --workers 1" \
#     "hotloop=target/release/hotloop serve http --addr 127.0.0.1:PORT --workers 1 --driver epoll"
#
# Needs perf (apt-get install linux-perf) and the release binaries
# (cargo build --release -p hotloop-cli -p hotloop-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/server_wait.sh
rounds=$1
n=$2
shift 2
load=target/release/hotloop-bench
mode=${MODE:-serial}
case $mode in
  serial) load_args=(--mode serial) ;;
  churn) load_args=(--mode churn --connections "${CONNS:-4000}" --rate "${RATE:-2000}"
    --size "${SIZE:-1024}" --sources 4 --warmup 0) ;;
  *) echo "MODE is serial or churn, not $mode" >&2; exit 2 ;;
esac
events=task-clock,context-switches
calls=(accept4 read recvfrom sendto write close epoll_wait epoll_ctl io_uring_enter)
if perf stat -e syscalls:sys_enter_close -- true > /dev/null 2>&1; then
  for c in "${calls[@]}"; do events+=",syscalls:sys_enter_$c"; done
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Below the ephemeral range (32768 up), where the load's own connections come from.
port=$((20000 + RANDOM % 10000))

names=()
for spec in "$@"; do names+=("${spec%%=*}"); done

for r in $(seq 1 "$rounds"); do
  for spec in "$@"; do
    name=${spec%%=*}
    cmd=${spec#*=}
    port=$((port + 1))
    # shellcheck disable=SC2086
    taskset -c 0 ${cmd//PORT/$port} > "$out/server.log" 2>&1 &
    pid=$!
    wait_for_server "$pid" "$port" "$out/server.log" 100
    taskset -c 1 "$load" load --addr 127.0.0.1:$port "${load_args[@]}" -n 2000 -d 20 > /dev/null 2>&1
    perf stat -x, -e "$events" -p "$pid" -o "$out/stat" &
    perf_pid=$!
    sleep 0.2
    taskset -c 1 "$load" load --addr 127.0.0.1:$port "${load_args[@]}" -n "$n" -d 120 > "$out/load" 2>&1
    kill -INT "$perf_pid"
    wait "$perf_pid" || true
    kill -TERM "$pid"
    wait "$pid" || true
    ms=$(awk -F, '$3 ~ /task-clock/ {print $1}' "$out/stat")
    cs=$(awk -F, '$3 ~ /context-switches/ {print $1}' "$out/stat")
    p50=$(grep -oE 'p50 [0-9]+' "$out/load" | head -1 | awk '{print $2}')
    # System calls per connection, those that were counted and made.
    per_conn=$(awk -F, -v n="$n" '$3 ~ /sys_enter_/ && $1 + 0 > 0 {
      sub(/.*sys_enter_/, "", $3); printf " %s=%.3f", $3, $1 / n }' "$out/stat")
    echo "round $r $name task_ms=$ms context_switches=$cs p50_us=$p50$per_conn" | tee -a "$out/rounds"
  done
done

python3 - "$out/rounds" "$n" "${names[@]}" << 'PY'
import statistics, sys
path, n, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rounds = {}
calls = {}
for line in open(path):
    f = line.split()
    r, name = int(f[1]), f[2]
    ms = float(f[3].split('=')[1])
    rounds.setdefault(name, {})[r] = ms
    cs = float(f[4].split('=')[1])
    calls.setdefault(name, {}).setdefault("context switches", []).append(cs / n)
    for kv in f[6:]:
        k, v = kv.split('=')
        calls[name].setdefault(k, []).append(float(v))
base = names[0]
for name in names:
    per = [rounds[name][r] * 1000 / n for r in sorted(rounds[name])]
    line = f"{name}: median {statistics.median(per):.2f} µs CPU per connection"
    line += "; per connection, medians: " + ", ".join(
        f"{k} {statistics.median(v):.3f}" for k, v in calls[name].items())
    if name != base:
        ratios = [rounds[name][r] / rounds[base][r] for r in sorted(rounds[name]) if r in rounds[base]]
        line += (f"; over {base} per round: median {statistics.median(ratios):.3f}"
                 f" (range {min(ratios):.3f}-{max(ratios):.3f})")
    print(line)
PY
