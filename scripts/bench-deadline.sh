#!/usr/bin/env bash
# bench-deadline.sh — what the late-insert protection (every exactly-once
# INSERT carries a deadline on the server's clock: INSERT … SELECT FROM
# input() with a throwIf, plus the lease and the register of owners) costs,
# against exactly-once before it (commit 00e2b69), side by side. Runs
# `make bench`'s exactly-once case for both, in pairs (BENCH_PAIRS, default
# 3; BENCH_MB of JSON per record size, default 200), each on a fresh private
# stack, and writes docs/bench-deadline.md: the medians of each figure and
# of the ratios pair by pair.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BEFORE="${BENCH_BEFORE:-00e2b69}"
PAIRS="${BENCH_PAIRS:-3}"
OUT="$(mktemp -d /tmp/sluice-bench-deadline.XXXXXX)"
for i in $(seq 1 "$PAIRS"); do
  echo "== pair $i of $PAIRS: before ($BEFORE)"
  BENCH_REV="$BEFORE" BENCH_CASES=sluice_eo BENCH_MB="${BENCH_MB:-200}" BENCH_OUT="$OUT/before-$i" \
    scripts/bench/bench.sh >"$OUT/before-$i.log" 2>&1
  echo "== pair $i of $PAIRS: now (work tree)"
  BENCH_CASES=sluice_eo BENCH_MB="${BENCH_MB:-200}" BENCH_OUT="$OUT/now-$i" \
    scripts/bench/bench.sh >"$OUT/now-$i.log" 2>&1
done
python3 - "$OUT" "$PAIRS" "$BEFORE" "$(git rev-parse --short HEAD)" <<'PY' | tee docs/bench-deadline.md
import json, statistics, sys
out, pairs, before, now = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def cells(path):
    """(size, figures) of the exactly-once case in one results.json."""
    d = json.load(open(f"{path}/results.json"))
    found = []
    def walk(x, size=None):
        if isinstance(x, dict):
            size = x.get("size", size)
            if "first_to_last_mb_per_s" in x and "cpu_seconds" in x:
                found.append((size, {
                    "MB/s, process start to last row": x["mb_per_s"],
                    "MB/s, first row to last": x["first_to_last_mb_per_s"],
                    "sluice CPU µs a record": x["us_per_record"],
                    "ClickHouse (stack) CPU s": x["stack_cpu"].get("chdb"),
                    "broker CPU s": x["stack_cpu"].get("kafka"),
                }))
            for v in x.values():
                walk(v, size)
        elif isinstance(x, list):
            for v in x:
                walk(v, size)
    walk(d)
    return found

runs = {"before": [], "now": []}
for i in range(1, pairs + 1):
    for side in runs:
        runs[side].append(dict(cells(f"{out}/{side}-{i}")))
print(f"# The cost of the late-insert protection\n")
print(f"`make bench`'s exactly-once case, {pairs} pairs on fresh private stacks, before ({before})")
print(f"and now ({now}); medians, and the median of the ratios now / before pair by pair.")
print("The ClickHouse here is the stack's chDB server, which runs `INSERT … SELECT FROM input()`")
print("by handing the body to `format()`: its CPU is the emulation's, not a ClickHouse server's.\n")
for size in sorted({s for r in runs["before"] for s in r}):
    print(f"## {size} records\n")
    print("| figure | before | now | now / before |")
    print("| --- | ---: | ---: | ---: |")
    for fig in runs["before"][0][size]:
        b = [r[size][fig] for r in runs["before"]]
        n = [r[size][fig] for r in runs["now"]]
        ratio = statistics.median(y / x for x, y in zip(b, n) if x)
        print(f"| {fig} | {statistics.median(b):.2f} | {statistics.median(n):.2f} | {ratio:.2f} |")
    print()
PY
