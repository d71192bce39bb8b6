#!/usr/bin/env bash
# TLS and axum on hotloop (epoll, io_uring) against the same servers on
# tokio, one worker each, side by side: each round runs every server once
# per measurement, in turn, and the figures are medians over the rounds.
# Server pinned to CPU 0, load generator to CPU 1.
#
#   scripts/bench_tls_axum.sh [ROUNDS] [SECONDS]     # defaults: 5 rounds, 5 s each
#
# Needs wrk; h2load (nghttp2-client) for the HTTP/2 row, skipped without.
set -euo pipefail
ROUNDS=${1:-5}
SECS=${2:-5}
cd "$(dirname "$0")/.."
cargo build --release -p hotloop --features tls,hyper,tower --example tls_axum_peers >&2
BIN=target/release/examples/tls_axum_peers
OUT=$(mktemp -d /tmp/hotloop-bench-tls.XXXXXX)
"$BIN" cert "$OUT"
PORT=18443
PEERS=("hotloop-epoll" "hotloop-uring" "tokio")

start() { # kind peer: starts the server on a fresh port (no TIME_WAIT left from the last one)
    local kind=$1 peer=$2 args
    PORT=$((PORT + 1))
    case "$peer" in
        hotloop-*) args=("$kind" hotloop "${peer#hotloop-}" "127.0.0.1:$PORT") ;;
        tokio) args=("$kind" tokio "127.0.0.1:$PORT") ;;
    esac
    [ "$kind" = tls ] && args+=("$OUT/cert.pem" "$OUT/key.pem")
    taskset -c 0 "$BIN" "${args[@]}" >/dev/null 2>&1 &
    SERVER=$!
    for _ in $(seq 100); do
        (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && return 0
        sleep 0.05
    done
    echo "server $peer did not start" >&2; return 1
}
stop() { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; }

# wrk: requests/s, and fail loudly on errors.
wrk_rps() {
    local out
    out=$(taskset -c 1 wrk -t1 "$@")
    if grep -qE "Socket errors|Non-2xx" <<<"$out"; then echo "wrk errors: $out" >&2; fi
    awk '/Requests\/sec/ {print $2}' <<<"$out"
}
h2_rps() {
    taskset -c 1 h2load -t1 -c32 -m10 -D "$SECS" "$1" 2>/dev/null | awk '/^finished in/ {print $4}'
}

declare -A R
for round in $(seq "$ROUNDS"); do
    for peer in "${PEERS[@]}"; do
        start tls "$peer"
        taskset -c 1 wrk -t1 -c32 -d1s "https://127.0.0.1:$PORT/" >/dev/null # warm-up
        R[tls_keepalive,$peer]+="$(wrk_rps -c32 -d"${SECS}s" "https://127.0.0.1:$PORT/") "
        R[tls_handshake,$peer]+="$(wrk_rps -c16 -d"${SECS}s" -H 'Connection: close' "https://127.0.0.1:$PORT/") "
        if command -v h2load >/dev/null; then
            R[tls_h2,$peer]+="$(h2_rps "https://127.0.0.1:$PORT/") "
        fi
        stop
        start axum "$peer"
        taskset -c 1 wrk -t1 -c32 -d1s "http://127.0.0.1:$PORT/users/7" >/dev/null
        R[axum,$peer]+="$(wrk_rps -c32 -d"${SECS}s" "http://127.0.0.1:$PORT/users/7") "
        stop
    done
    echo "round $round done" >&2
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
spread() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {printf "%.0f-%.0f", a[1], a[NR]}'; }
printf "%-34s %-14s %12s %20s\n" measurement server "median/s" "range (all rounds)"
for m in tls_handshake tls_keepalive tls_h2 axum; do
    for peer in "${PEERS[@]}"; do
        v=${R[$m,$peer]:-}
        [ -z "$v" ] && continue
        printf "%-34s %-14s %12s %20s\n" "$m" "$peer" "$(median <<<"$v")" "$(spread <<<"$v")"
    done
done
echo "raw: " >&2
for k in "${!R[@]}"; do echo "$k: ${R[$k]}" >&2; done
