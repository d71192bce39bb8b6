#!/usr/bin/env bash
# How much of a cold connection's cost is code layout: builds the `hotloop`
# binary twice, identical but for the order of its functions, and counts the
# 4 KiB code pages one serial HTTP connection touches in each.
#
#   scripts/link_order_ab.sh N OUT_DIR
#
# 1. OUT_DIR/hotloop.linker: linked with an empty `--symbol-ordering-file`
#    (the linker's own placement; the flag is there so that both builds
#    carry the same symbol names).
# 2. callgrind over N serial connections to `serve http` (epoll) lists the
#    functions of the binary they run, by instructions.
# 3. OUT_DIR/hotloop.ordered: relinked with those functions first, in that
#    order (lld's `--symbol-ordering-file`, the linker Rust uses on
#    x86_64 Linux).
# 4. callgrind again: code pages and lines touched, per object, both builds.
#
# Then compare their CPU per connection side by side, e.g.
#   scripts/serial_cpu_interleaved.py 12 1000 \
#     "floor=target/release/hotloop-bench peer floor http --addr 127.0.0.1:PORT --workers 1" \
#     "linker=OUT_DIR/hotloop.linker serve http --addr 127.0.0.1:PORT --workers 1 --driver epoll" \
#     "ordered=OUT_DIR/hotloop.ordered serve http --addr 127.0.0.1:PORT --workers 1 --driver epoll"
# The order fits this build and this workload only (the names carry
# hashes of the build's configuration): an experiment, not a build step.
# Needs valgrind, and lld as the linker (Rust's default on x86_64 Linux); leaves target/release/hotloop as
# the ordered build (cargo build --release -p hotloop-cli restores it).
set -euo pipefail
cd "$(dirname "$0")/.."
n=$1
dir=$(realpath -m "$2")
mkdir -p "$dir"
order=$dir/order.txt
: > "$order"

relink() {
  touch hotloop-cli/src/main.rs
  cargo rustc -q --release -p hotloop-cli --bin hotloop -- \
    -C link-arg=-Wl,--symbol-ordering-file="$order" -C link-arg=-Wl,--no-warn-symbol-ordering
}

# Callgrind over N serial connections to BIN's `serve http` (epoll), its
# dump kept in DUMP.
profile() {
  DUMP=$2 scripts/cold_lines.sh "$n" "$1 serve http --addr 127.0.0.1:PORT --workers 1 --driver epoll"
}

# Prints DUMP's code pages and lines per object and, with ORDER, writes the
# binary's functions it ran to ORDER, most instructions first.
pages() {
  python3 - "$1" "$2" "${3:-}" << 'PY'
import bisect, collections, subprocess, sys
dump, binary, order = sys.argv[1], sys.argv[2], sys.argv[3]
name = binary.rsplit("/", 1)[-1]
pages, lines = collections.defaultdict(set), collections.defaultdict(set)
cost, ob, in_call = collections.Counter(), "?", False
syms = []
for line in subprocess.run(["nm", "-n", "--defined-only", binary], capture_output=True,
                           text=True, check=True).stdout.splitlines():
    p = line.split()
    if len(p) == 3 and p[1] in "tTwW":
        syms.append((int(p[0], 16), p[2]))
starts = [a for a, _ in syms]
for line in open(dump):
    if line.startswith("ob="):
        ob = line[3:].strip().rsplit("/", 1)[-1]
    elif line.startswith("calls="):
        in_call = True
    elif line.startswith("0x"):
        if in_call:
            in_call = False  # the call's inclusive cost
            continue
        parts = line.split()
        addr, instr = int(parts[0], 16), int(parts[2]) if len(parts) > 2 else 0
        pages[ob].add(addr >> 12)
        lines[ob].add(addr >> 6)
        if ob == name:
            i = bisect.bisect_right(starts, addr) - 1
            if i >= 0:
                cost[syms[i][1]] += instr
for o in sorted(pages, key=lambda o: -len(pages[o])):
    print(f"  {o:24} {len(pages[o]):4} code pages {len(lines[o]):5} code lines")
if order:
    with open(order, "w") as f:
        for sym, _ in cost.most_common():
            f.write(sym + "\n")
PY
}

relink
cp target/release/hotloop "$dir/hotloop.linker"
profile "$dir/hotloop.linker" "$dir/linker.cg"
echo "the linker's placement:"
pages "$dir/linker.cg" "$dir/hotloop.linker" "$order"
relink
cp target/release/hotloop "$dir/hotloop.ordered"
profile "$dir/hotloop.ordered" "$dir/ordered.cg"
echo "the $(wc -l < "$order") functions a connection runs, first and in order:"
pages "$dir/ordered.cg" "$dir/hotloop.ordered"
