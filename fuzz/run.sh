#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (default 60 s each) and prints
# what each found. Needs cargo-fuzz (`cargo install cargo-fuzz`); uses a
# nightly toolchain when one is installed, else stable with RUSTC_BOOTSTRAP.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
toolchain=()
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  toolchain=(+nightly)
else
  export RUSTC_BOOTSTRAP=1
fi
for target in $(cargo "${toolchain[@]}" fuzz list); do
  mkdir -p "corpus/$target"
  echo "== $target: ${seconds}s"
  if cargo "${toolchain[@]}" fuzz run "$target" "corpus/$target" -- -max_total_time="$seconds" -rss_limit_mb=2048 2>"/tmp/fuzz-$target.log"; then
    echo "   no crash; $(grep -Eo '#[0-9]+' "/tmp/fuzz-$target.log" | tail -1 | tr -d '#') runs, corpus $(ls "corpus/$target" | wc -l) inputs"
  else
    echo "   CRASH: see /tmp/fuzz-$target.log and fuzz/artifacts/$target/"
    exit 1
  fi
done
