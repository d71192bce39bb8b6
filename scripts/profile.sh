#!/usr/bin/env bash
# Where the cycles go, per request and per connection: system calls
# (strace -c -f) and instructions (valgrind --tool=callgrind) of one server
# over a fixed count of requests, against the same count on the other servers.
#
#   scripts/profile.sh [syscalls|instructions|both] [OUT_DIR]
#
# Servers: hotloop (epoll, io_uring), the raw-syscall floor, the raw
# io_uring floor (floor-uring), tokio; one worker each, pinned to CPU 0;
# SERVERS may add the busy-polling ones (hotloop-epoll-always,
# hotloop-uring-always, floor-busy, floor-uring-busy), whose spin calls
# (epoll_wait, io_uring_enter) count with time, not with requests;
# the load generator on CPU 1. Instructions are counted over keep-alive at
# 256 connections, serial connections, and an open loop slow enough that
# each wakeup serves about one request (the loop's per-turn cost). Counts,
# not times, so the figures do not drift with a busy machine. Needs the
# release binaries (cargo build
# --release -p hotloop-cli -p hotloop-bench), strace and valgrind (apt-get
# install strace valgrind).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-both}
out=${2:-profile-out}
mkdir -p "$out"
bin=target/release
KEEPALIVE_REQUESTS=${KEEPALIVE_REQUESTS:-100000}
SERIAL_CONNECTIONS=${SERIAL_CONNECTIONS:-5000}
CALLGRIND_REQUESTS=${CALLGRIND_REQUESTS:-20000}
# Requests per second of the open-loop instruction count (one per wakeup).
OPENLOOP_RATE=${OPENLOOP_RATE:-2000}
SERVERS=${SERVERS:-floor floor-uring tokio hotloop-epoll hotloop-uring}
# The hotloop binary to profile (another build can be compared side by side).
HOTLOOP_BIN=${HOTLOOP_BIN:-$bin/hotloop}

# start_server NAME WRAPPER... -- prints the pid; the server prints its port.
start() {
  local name=$1
  shift
  local port_file="$out/$name.port"
  rm -f "$port_file"
  taskset -c 0 "$@" > "$port_file" 2> "$out/$name.server.log" &
  echo $!
}

server_cmd() {
  case $1 in
    hotloop-epoll) echo "$HOTLOOP_BIN serve http --addr 127.0.0.1:0 --workers 1 --driver epoll" ;;
    hotloop-uring) echo "$HOTLOOP_BIN serve http --addr 127.0.0.1:0 --workers 1 --driver uring" ;;
    floor) echo "$bin/hotloop-bench peer floor http --addr 127.0.0.1:0 --workers 1" ;;
    floor-uring) echo "$bin/hotloop-bench peer floor-uring http --addr 127.0.0.1:0 --workers 1" ;;
    tokio) echo "$bin/hotloop-bench peer tokio http --addr 127.0.0.1:0 --workers 1" ;;
    # Busy polling: hotloop's `always` and the floors that never sleep.
    hotloop-epoll-always) echo "$HOTLOOP_BIN serve http --addr 127.0.0.1:0 --workers 1 --driver epoll --busy-poll always" ;;
    hotloop-uring-always) echo "$HOTLOOP_BIN serve http --addr 127.0.0.1:0 --workers 1 --driver uring --busy-poll always" ;;
    floor-busy) echo "$bin/hotloop-bench peer floor http --addr 127.0.0.1:0 --workers 1 --busy-poll" ;;
    floor-uring-busy) echo "$bin/hotloop-bench peer floor-uring http --addr 127.0.0.1:0 --workers 1 --busy-poll" ;;
  esac
}

wait_port() {
  local file=$1
  for _ in $(seq 1 1200); do
    local p
    p=$(cat "$file" "${file%.port}.server.log" 2>/dev/null | grep -oE '127\.0\.0\.1:[1-9][0-9]*' | head -1 || true)
    if [ -n "$p" ]; then echo "$p"; return 0; fi
    sleep 0.05
  done
  echo "server did not print its address" >&2
  return 1
}

# run NAME TOOL MODE COUNT: one server under TOOL, one load run of COUNT.
run() {
  local name=$1 tool=$2 mode=$3 count=$4
  local tag="$name.$tool.$mode"
  local wrap=()
  case $tool in
    strace) wrap=(strace -c -f -o "$out/$tag.strace") ;;
    callgrind) wrap=(valgrind --tool=callgrind --callgrind-out-file="$out/$tag.callgrind") ;;
  esac
  # shellcheck disable=SC2046
  local pid
  pid=$(start "$tag" "${wrap[@]}" $(server_cmd "$name"))
  local addr
  addr=$(wait_port "$out/$tag.port")
  local conns=256
  [ "$mode" = keepalive1 ] && conns=1
  local load_mode=keepalive
  [ "$mode" = serial ] && load_mode=serial
  # openloop: 256 connections at a rate low enough that each wakeup
  # serves about one request, so the loop's per-turn cost shows.
  local rate=()
  [ "$mode" = openloop ] && rate=(--rate "$OPENLOOP_RATE")
  taskset -c 1 "$bin/hotloop-bench" load --addr "$addr" --proto http --mode "$load_mode" \
    --connections "$conns" --requests "$count" --duration 120 "${rate[@]}" > "$out/$tag.load" 2>&1 || true
  # Stop the server itself (under strace, the tracer's child), so the
  # tracer writes its summary when the server exits.
  if [ "$tool" = strace ]; then
    pkill -INT -P "$pid" 2>/dev/null || true
  else
    kill -INT "$pid" 2>/dev/null || true
  fi
  for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  echo "$tag done"
}

if [ "$what" = syscalls ] || [ "$what" = both ]; then
  for name in $SERVERS; do
    run "$name" strace keepalive "$KEEPALIVE_REQUESTS"
    run "$name" strace keepalive1 "$((KEEPALIVE_REQUESTS / 10))"
    run "$name" strace serial "$SERIAL_CONNECTIONS"
  done
fi
if [ "$what" = instructions ] || [ "$what" = both ]; then
  for name in $SERVERS; do
    run "$name" callgrind keepalive "$CALLGRIND_REQUESTS"
    run "$name" callgrind serial "$((CALLGRIND_REQUESTS / 10))"
    run "$name" callgrind openloop "$((CALLGRIND_REQUESTS * 2 / 5))"
  done
fi
echo "results in $out/ (*.strace: syscall summaries; *.callgrind: callgrind_annotate them)"
