#!/usr/bin/env bash
# TLS and axum on hotloop (epoll, io_uring) against the same servers on
# tokio, one worker each, side by side: each round runs every server once
# per measurement, in turn, and the figures are medians over the rounds.
# Server pinned to CPU 0, load generator to CPU 1.
#
#   scripts/bench_same_service.sh [ROUNDS] [SECONDS]     # defaults: 5 rounds, 5 s each
#
# Prints, per measurement and server: the median req/s and its range over
# the rounds, the median server CPU time per 1,000 requests (from
# /proc/PID/stat), and the medians of the per-round ratios to tokio.
#
# ONLY=tls or ONLY=axum runs one half.
# Needs wrk; h2load (nghttp2-client) for the HTTP/2 row, skipped without.
set -euo pipefail
ROUNDS=${1:-5}
SECS=${2:-5}
cd "$(dirname "$0")/.."
cargo build --release -p hotloop --features tls,hyper,tower --example same_service >&2
BIN=${BIN:-target/release/examples/same_service}
cargo build --release -p hotloop-bench >&2
LOAD=target/release/hotloop-bench
OUT=$(mktemp -d /tmp/hotloop-bench-tls.XXXXXX)
"$BIN" cert "$OUT"
PORT=18443
PEERS=("hotloop-epoll" "hotloop-uring" "tokio")
# BASE_BIN=path/to/an/older/same_service adds that build as base-epoll and
# base-uring, to compare two builds of hotloop in the same rounds.
[ -n "${BASE_BIN:-}" ] && PEERS+=("base-epoll" "base-uring")

start() { # kind peer: starts the server on a fresh port (no TIME_WAIT left from the last one)
    local kind=$1 peer=$2 args
    PORT=$((PORT + 1))
    local bin=$BIN
    case "$peer" in
        hotloop-*) args=("$kind" hotloop "${peer#hotloop-}" "127.0.0.1:$PORT") ;;
        base-*) args=("$kind" hotloop "${peer#base-}" "127.0.0.1:$PORT"); bin=$BASE_BIN ;;
        tokio) args=("$kind" tokio "127.0.0.1:$PORT") ;;
    esac
    case "$kind" in
        tls|axum-tls) args+=("$OUT/cert.pem" "$OUT/key.pem") ;;
        hyper) args+=(1024) ;;
    esac
    taskset -c 0 "$bin" "${args[@]}" >/dev/null 2>&1 &
    SERVER=$!
    for _ in $(seq 100); do
        (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && return 0
        sleep 0.05
    done
    echo "server $peer did not start" >&2; return 1
}
stop() { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; }

# The server's CPU time so far, in clock ticks (utime + stime).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$SERVER/stat"; }
TICK=$(getconf CLK_TCK)
# Runs a load command, prints "req/s server-CPU-ms-per-1k-requests".
measure() { # kind(wrk|h2load) args...
    local kind=$1 out c0 c1 rps total
    shift
    c0=$(cpu_ticks)
    if [ "$kind" = load ]; then
        # hotloop-bench's load generator: one thread, like wrk, but it
        # keeps up with faster servers than wrk does on one core.
        out=$(timeout $((SECS + 20)) taskset -c 1 "$LOAD" load --proto http "$@" 2>&1)
        rps=$(awk '/throughput/ {print $2}' <<<"$out")
        total=$(awk '/completed/ {print $2}' <<<"$out")
    elif [ "$kind" = wrk ]; then
        out=$(timeout $((SECS + 20)) taskset -c 1 wrk -t1 "$@")
        if grep -qE "Socket errors|Non-2xx" <<<"$out"; then echo "wrk errors: $out" >&2; fi
        rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
        total=$(awk '/requests in/ {print $1}' <<<"$out")
    else
        # -D alone has been seen to hang on a stuck connection: bound it.
        out=$(timeout $((SECS + 20)) taskset -c 1 h2load -t1 -D "$SECS" "$@" 2>/dev/null)
        rps=$(awk '/^finished in/ {print $4}' <<<"$out")
        total=$(awk '/^requests:/ {print $8}' <<<"$out")
    fi
    c1=$(cpu_ticks)
    if [ -z "$rps" ] || [ -z "$total" ]; then echo "no result from $kind" >&2; rps=0 total=0; fi
    echo "$rps $(awk -v c=$((c1 - c0)) -v t="$total" -v hz="$TICK" 'BEGIN {printf "%.3f", (t > 0 ? c / hz * 1e6 / t : 0)}')"
}

declare -A R C
record() { # measurement peer load...
    local m=$1 peer=$2 res
    shift 2
    res=$(measure "$@")
    R[$m,$peer]+="${res% *} "
    C[$m,$peer]+="${res#* } "
}
want() { [ -z "${ONLY:-}" ] || [[ ",$ONLY," == *",$1,"* ]]; }
for round in $(seq "$ROUNDS"); do
    for peer in "${PEERS[@]}"; do
        if want hyper; then
            start hyper "$peer"
            taskset -c 1 wrk -t1 -c64 -d1s "http://127.0.0.1:$PORT/" >/dev/null # warm-up
            record hyper_h1 "$peer" wrk -c64 -d"${SECS}s" "http://127.0.0.1:$PORT/"
            record hyper_h1_load "$peer" load --addr "127.0.0.1:$PORT" -c 64 -d "$SECS"
            if command -v h2load >/dev/null; then
                record hyper_h2 "$peer" h2load -c16 -m16 "http://127.0.0.1:$PORT/"
            fi
            stop
        fi
        if want tls; then
            start tls "$peer"
            taskset -c 1 wrk -t1 -c32 -d1s "https://127.0.0.1:$PORT/" >/dev/null # warm-up
            record tls_keepalive "$peer" wrk -c32 -d"${SECS}s" "https://127.0.0.1:$PORT/"
            record tls_handshake "$peer" wrk -c16 -d"${SECS}s" -H 'Connection: close' "https://127.0.0.1:$PORT/"
            if command -v h2load >/dev/null; then
                record tls_h2 "$peer" h2load -c32 -m10 "https://127.0.0.1:$PORT/"
            fi
            stop
        fi
        if want axum; then
            start axum "$peer"
            taskset -c 1 wrk -t1 -c32 -d1s "http://127.0.0.1:$PORT/users/7" >/dev/null
            record axum "$peer" wrk -c32 -d"${SECS}s" "http://127.0.0.1:$PORT/users/7"
            stop
        fi
        if want axum-tls; then
            start axum-tls "$peer"
            taskset -c 1 wrk -t1 -c32 -d1s "https://127.0.0.1:$PORT/users/7" >/dev/null
            record axum_tls "$peer" wrk -c32 -d"${SECS}s" "https://127.0.0.1:$PORT/users/7"
            stop
        fi
    done
    echo "round $round done" >&2
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
spread() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {printf "%.0f-%.0f", a[1], a[NR]}'; }
# The per-round ratio of two peers' figures, as a list.
ratios() { paste -d' ' <(tr ' ' '\n' <<<"$1" | grep -v '^$') <(tr ' ' '\n' <<<"$2" | grep -v '^$') | awk '{printf "%.3f ", $1 / $2}'; }
printf "%-14s %-14s %10s %16s %14s %16s %16s\n" measurement server "req/s" "req/s range" "CPU ms/1k req" "req/s vs tokio" "CPU vs tokio"
for m in hyper_h1 hyper_h1_load hyper_h2 tls_handshake tls_keepalive tls_h2 axum axum_tls; do
    for peer in "${PEERS[@]}"; do
        v=${R[$m,$peer]:-}
        [ -z "$v" ] && continue
        c=${C[$m,$peer]}
        printf "%-14s %-14s %10.0f %16s %14.1f %16s %16s\n" "$m" "$peer" "$(median <<<"$v")" "$(spread <<<"$v")" \
            "$(median <<<"$c")" "x$(ratios "$v" "${R[$m,tokio]}" | median)" "x$(ratios "$c" "${C[$m,tokio]}" | median)"
    done
done
echo "raw req/s and CPU ms/1k req per round:" >&2
for k in "${!R[@]}"; do echo "$k: ${R[$k]} | ${C[$k]}" >&2; done
