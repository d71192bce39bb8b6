#!/usr/bin/env bash
# `hotloop serve static` (epoll, io_uring) against nginx serving the same
# files, one worker each, keep-alive, nginx with `sendfile on`, and h2o
# (when found on PATH) with one thread and no access log. Each round
# runs every server once per file size, in turn; the figures are medians
# over the rounds. Servers pinned to CPU 0, wrk to CPU 1.
#
#   scripts/bench_static.sh [ROUNDS] [SECONDS]     # defaults: 5 rounds, 5 s each
#
# Prints, per file size and server: the median req/s and its range over
# the rounds, the median server CPU time (utime + stime from
# /proc/PID/stat, kernel worker threads of the process included) per
# request and per GiB served, and the medians of the per-round ratios to
# nginx (nginx-cache is nginx with open_file_cache). nginx runs as the
# current user from a temporary prefix (`master_process off`, so its one
# process is the one measured) and is stopped by pid, as every server is.
set -euo pipefail
ROUNDS=${1:-5}
SECS=${2:-5}
CONNS=${CONNS:-32}
cd "$(dirname "$0")/.."
cargo build --release -p hotloop-cli >&2
BIN=${BIN:-target/release/hotloop}
command -v nginx >/dev/null || { echo "nginx is needed" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk is needed" >&2; exit 1; }
T=$(mktemp -d /tmp/hotloop-bench-static.XXXXXX)
SERVER=
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
mkdir -p "$T/root" "$T/nginx"
head -c 1024 /dev/urandom >"$T/root/1k.bin"
head -c $((64 * 1024)) /dev/urandom >"$T/root/64k.bin"
head -c $((8 * 1024 * 1024)) /dev/urandom >"$T/root/8m.bin"
SIZES=(1k 64k 8m)
declare -A BYTES=([1k]=1024 [64k]=65536 [8m]=8388608)
# nginx-cache is nginx with open_file_cache (1 s validity), which is what
# `hotloop serve static` does with its open files.
# hotloop-uring-splice sends files with SPLICE operations instead of
# sendfile (HOTLOOP_URING_SEND_FILE=splice).
PEERS=(nginx nginx-cache hotloop-epoll hotloop-uring hotloop-uring-splice)
# ONLY_PEERS="nginx h2o hotloop-uring" picks some (nginx, the reference, first).
[ -n "${ONLY_PEERS:-}" ] && read -r -a PEERS <<<"$ONLY_PEERS"
if command -v h2o >/dev/null && [ -z "${ONLY_PEERS:-}" ]; then PEERS+=(h2o); fi
mkdir -p "$T/h2o"
PORT=18600

nginx_conf() { # port [cache]
    local cache=""
    [ -n "${2:-}" ] && cache="open_file_cache max=1024 inactive=20s; open_file_cache_valid 1s;"
    cat <<CONF
worker_processes 1;
master_process off;
daemon off;
pid $T/nginx/nginx.pid;
error_log $T/nginx/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    sendfile on;
    keepalive_requests 100000000;
    keepalive_timeout 60s;
    client_body_temp_path $T/nginx/body;
    proxy_temp_path $T/nginx/proxy;
    fastcgi_temp_path $T/nginx/fastcgi;
    uwsgi_temp_path $T/nginx/uwsgi;
    scgi_temp_path $T/nginx/scgi;
    default_type application/octet-stream;
    $cache
    server {
        listen 127.0.0.1:$1 reuseport;
        root $T/root;
    }
}
CONF
}

# h2o's settings for speed (hotloop-bench's `h2o_config` is the same for
# its fixed body): one thread, no access log (none configured), no
# compressed variants looked for; as root it stays root (`user`).
h2o_conf() { # port
    [ "$(id -u)" = 0 ] && echo "user: root"
    cat <<CONF
num-threads: 1
max-connections: 19900
pid-file: $T/h2o/h2o.pid
error-log: $T/h2o/error.log
file.send-compressed: OFF
listen:
  host: 127.0.0.1
  port: $1
hosts:
  default:
    paths:
      /:
        file.dir: $T/root
CONF
}

start() { # peer: starts the server on a fresh port (no TIME_WAIT left from the last one)
    local peer=$1
    PORT=$((PORT + 1))
    case "$peer" in
        nginx|nginx-cache)
            nginx_conf "$PORT" "${peer#nginx}" >"$T/nginx/nginx.conf"
            taskset -c 0 nginx -p "$T/nginx" -c "$T/nginx/nginx.conf" -e "$T/nginx/error.log" >/dev/null 2>&1 &
            ;;
        h2o)
            h2o_conf "$PORT" >"$T/h2o/h2o.conf"
            taskset -c 0 h2o -c "$T/h2o/h2o.conf" >/dev/null 2>&1 &
            ;;
        hotloop-uring-splice)
            HOTLOOP_URING_SEND_FILE=splice taskset -c 0 "$BIN" serve static --root "$T/root" \
                --addr "127.0.0.1:$PORT" --workers 1 --driver uring >/dev/null 2>"$T/hotloop.log" &
            ;;
        hotloop-*)
            taskset -c 0 "$BIN" serve static --root "$T/root" --addr "127.0.0.1:$PORT" \
                --workers 1 --driver "${peer#hotloop-}" >/dev/null 2>"$T/hotloop.log" &
            ;;
    esac
    SERVER=$!
    for _ in $(seq 100); do
        (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && return 0
        sleep 0.05
    done
    echo "server $peer did not start" >&2; cat "$T/nginx/error.log" "$T/h2o/error.log" "$T/hotloop.log" >&2 || true; return 1
}
stop() { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; SERVER=; }

# The server's CPU time so far, in clock ticks (utime + stime).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$SERVER/stat"; }
TICK=$(getconf CLK_TCK)
# Runs wrk on `url`; prints "req/s server-CPU-us-per-request".
measure() {
    local url=$1 out c0 c1 rps total
    c0=$(cpu_ticks)
    out=$(timeout $((SECS + 20)) taskset -c 1 wrk -t1 -c"$CONNS" -d"${SECS}s" "$url")
    c1=$(cpu_ticks)
    if grep -qE "Socket errors|Non-2xx" <<<"$out"; then echo "wrk errors: $out" >&2; fi
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    total=$(awk '/requests in/ {print $1}' <<<"$out")
    if [ -z "$rps" ] || [ -z "$total" ]; then echo "no result from wrk" >&2; rps=0 total=0; fi
    echo "$rps $(awk -v c=$((c1 - c0)) -v t="$total" -v hz="$TICK" 'BEGIN {printf "%.3f", (t > 0 ? c / hz * 1e6 / t : 0)}')"
}

declare -A R C
for round in $(seq "$ROUNDS"); do
    for peer in "${PEERS[@]}"; do
        start "$peer"
        for size in "${SIZES[@]}"; do
            url="http://127.0.0.1:$PORT/$size.bin"
            # The body must be the file: a check, and the warm-up.
            curl -sf "$url" | cmp -s - "$T/root/$size.bin" || { echo "$peer served a wrong $size.bin" >&2; exit 1; }
            taskset -c 1 wrk -t1 -c"$CONNS" -d1s "$url" >/dev/null
            res=$(measure "$url")
            R[$size,$peer]+="${res% *} "
            C[$size,$peer]+="${res#* } "
        done
        stop
    done
    echo "round $round done" >&2
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
spread() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {printf "%.0f-%.0f", a[1], a[NR]}'; }
# The per-round ratio of two peers' figures, as a list.
ratios() { paste -d' ' <(tr ' ' '\n' <<<"$1" | grep -v '^$') <(tr ' ' '\n' <<<"$2" | grep -v '^$') | awk '{printf "%.3f ", $1 / $2}'; }
printf "%-5s %-14s %10s %16s %12s %12s %15s %15s\n" file server "req/s" "req/s range" "CPU us/req" "CPU ms/GiB" "req/s vs nginx" "CPU vs nginx"
for size in "${SIZES[@]}"; do
    for peer in "${PEERS[@]}"; do
        v=${R[$size,$peer]}
        c=${C[$size,$peer]}
        cm=$(median <<<"$c")
        printf "%-5s %-14s %10.0f %16s %12.2f %12.1f %15s %15s\n" "$size" "$peer" "$(median <<<"$v")" "$(spread <<<"$v")" \
            "$cm" "$(awk -v c="$cm" -v b="${BYTES[$size]}" 'BEGIN {print c / 1000 * 1073741824 / b}')" \
            "x$(ratios "$v" "${R[$size,nginx]}" | median)" "x$(ratios "$c" "${C[$size,nginx]}" | median)"
    done
done
echo "raw req/s and CPU us/req per round:" >&2
for k in "${!R[@]}"; do echo "$k: ${R[$k]} | ${C[$k]}" >&2; done
