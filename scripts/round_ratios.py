#!/usr/bin/env python3
"""Per-round ratios of two rows of a `hotloop-bench bench` results.json.

    scripts/round_ratios.py RESULTS SCENARIO GROUP METRIC ROW_A ROW_B

Rows are named as the tables show them (`hotloop epoll busy-poll always`,
`floor busy-poll`). Prints each row's median, the ratio of the medians, and
A/B for every round: in a group measured side by side, round i of A ran
next to round i of B, so a slow spell of a shared machine falls on both and
the per-round ratio drifts less than either figure.
"""
import json
import statistics
import sys


def row(results, scenario, group, label):
    for s in results["scenarios"]:
        if s["name"] != scenario:
            continue
        for r in s["rows"]:
            name = r["server"] + (" " + r["config"] if r["config"] else "")
            if r["group"] == group and name == label:
                return r
    sys.exit(f"no row {label!r} in {scenario} / {group!r}")


def main():
    if len(sys.argv) != 7:
        sys.exit(__doc__)
    path, scenario, group, metric, a, b = sys.argv[1:]
    with open(path) as f:
        results = json.load(f)
    ra, rb = (row(results, scenario, group, x)["metrics"].get(metric) for x in (a, b))
    if ra is None or rb is None:
        sys.exit(f"{metric} not measured for both rows")
    rounds = [x / y for x, y in zip(ra["values"], rb["values"]) if y]
    print(f"{scenario} / {group} / {metric}")
    print(f"  {a}: median {ra['median']:.4g}  rounds {[round(v, 4) for v in ra['values']]}")
    print(f"  {b}: median {rb['median']:.4g}  rounds {[round(v, 4) for v in rb['values']]}")
    print(f"  ratio of medians {ra['median'] / rb['median']:.3f}")
    print(
        f"  per round {[round(v, 3) for v in rounds]}  "
        f"median {statistics.median(rounds):.3f}  min {min(rounds):.3f}  max {max(rounds):.3f}"
    )


if __name__ == "__main__":
    main()
