#!/usr/bin/env bash
# What one serial connection costs a server that starts it cold: user-space
# instructions, and the 64-byte lines of code and data it touches, counted
# by callgrind over exactly N serial HTTP connections after 500 to warm up
# (`callgrind_control -z`, then `-d`).
#
#   scripts/cold_lines.sh N CMD [TOP]
#
# CMD is a server command line with PORT where its address goes, e.g.
#   scripts/cold_lines.sh 4000 "target/release/hotloop serve http --addr 127.0.0.1:PORT --workers 1 --driver epoll"
#   scripts/cold_lines.sh 4000 "target/release/hotloop-bench peer floor http --addr 127.0.0.1:PORT --workers 1"
#
# The cache callgrind simulates is tiny (4 KiB first level, 8 KiB last),
# so nearly every line a connection touches misses it once: the last
# level's misses per connection approximate the lines touched, which is
# what a server pays when it wakes with its caches taken by other work (a
# server that sleeps between connections, on a machine it shares). TOP
# lists the functions touching the most lines. Counts, not times, so they
# do not drift with the machine's load. Use the epoll driver: valgrind
# does not follow io_uring. Needs valgrind (apt-get install valgrind) and
# the release binaries. With DUMP=FILE the dump, with each instruction's
# address (--dump-instr=yes), is also kept in FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/server_wait.sh
n=$1
cmd=$2
top=${3:-0}
load=target/release/hotloop-bench
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Below the ephemeral range (32768 up), where the load's own connections come from.
port=$((20000 + RANDOM % 10000))

instr=()
[ -n "${DUMP:-}" ] && instr=(--dump-instr=yes)
# shellcheck disable=SC2086
taskset -c 0 valgrind --tool=callgrind --compress-strings=no --compress-pos=no "${instr[@]}" \
  --cache-sim=yes --I1=4096,2,64 --D1=4096,2,64 --LL=8192,2,64 \
  --callgrind-out-file="$out/cg.out" ${cmd//PORT/$port} > "$out/server.log" 2>&1 &
pid=$!
# valgrind takes a while to start a server.
wait_for_server "$pid" "$port" "$out/server.log" 400
taskset -c 1 "$load" load --addr 127.0.0.1:$port --mode serial -n 500 -d 60 > /dev/null 2>&1
callgrind_control -z "$pid" > /dev/null
taskset -c 1 "$load" load --addr 127.0.0.1:$port --mode serial -n "$n" -d 300 > /dev/null 2>&1
callgrind_control -d "$pid" > /dev/null
sleep 0.5
if ! kill -TERM "$pid" 2> /dev/null; then
  echo "the server exited during the run:" >&2
  tail -20 "$out/server.log" >&2
  exit 1
fi
wait "$pid" || true
dump=$(ls -t "$out"/cg.out.* | head -1)
[ -n "${DUMP:-}" ] && cp "$dump" "$DUMP"

python3 - "$dump" "$n" "$top" << 'PY'
import collections, sys
path, n, top = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# Events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw; self cost per function.
cost = collections.defaultdict(lambda: [0] * 9)
fn, in_call, positions = None, False, 1
for line in open(path):
    if line.startswith("positions:"):
        positions = len(line.split()) - 1  # "line", or "instr line"
    elif line.startswith("fn="):
        fn = line[3:].strip()
    elif line.startswith("calls="):
        in_call = True
    elif line[:1].isdigit() or line[:1] in "+-*":
        if in_call:
            in_call = False  # the next line is the call's inclusive cost
            continue
        values = [int(v) for v in line.split()[positions:]]
        for i, v in enumerate(values):
            cost[fn][i] += v
total = [sum(c[i] for c in cost.values()) for i in range(9)]
print(f"per connection: {total[0] / n:.0f} instructions, {total[6] / n:.0f} code lines, "
      f"{(total[7] + total[8]) / n:.0f} data lines")
rows = sorted(cost.items(), key=lambda kv: -(kv[1][6] + kv[1][7] + kv[1][8]))
for name, c in rows[:top]:
    print(f"{c[6] / n:6.1f} code {(c[7] + c[8]) / n:6.1f} data {c[0] / n:6.0f} instr  {name[:110]}")
PY
