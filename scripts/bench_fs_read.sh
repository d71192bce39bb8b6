#!/usr/bin/env bash
# Small-file reads (open + read 4 KiB + close) on hotloop's io_uring driver,
# hotloop's epoll driver (the blocking pool) and tokio::fs, one runtime
# thread each, rows interleaved; see scripts/fs_read/src/main.rs.
#
#   scripts/bench_fs_read.sh [SECONDS] [ROUNDS] [TASKS]   # defaults: 3 s, 5 rounds, 64 tasks
#
# The whole process is pinned to CPU 0, its blocking-pool threads and the
# kernel's io_uring workers with it: reads per second are per core.
set -euo pipefail
cd "$(dirname "$0")/fs_read"
CARGO_TARGET_DIR=../../target/fs-read-bench cargo build --release --offline >&2
taskset -c 0 ../../target/fs-read-bench/release/fs-read-bench "$@"
