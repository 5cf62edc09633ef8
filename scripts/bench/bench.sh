#!/usr/bin/env bash
# bench.sh — what `make bench` runs: start the stack, build sluice and raw_fetch, install the
# pinned Python deps (scripts/bench/requirements.txt) into a cached venv outside the work tree,
# run the cases (scripts/bench/run.py -> docs/bench/results.json) and render the report
# (scripts/bench/report.py -> docs/bench/README.md + SVGs).
# Knobs: BENCH_MB (MB of JSON per record size), BENCH_SIZES, BENCH_CASES, BENCH_PARTITIONS.
# The binaries are copied to a private temp dir so a rebuild by someone else cannot swap them.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
REQ=scripts/bench/requirements.txt

scripts/stack.sh up >/dev/null
set -a; eval "$(scripts/stack.sh env)"; set +a

cargo build --release --quiet --bin sluice --example raw_fetch
BIN="$(mktemp -d /tmp/sluice-bench-bin.XXXXXX)"
trap 'rm -rf "$BIN"' EXIT
cp target/release/sluice target/release/examples/raw_fetch "$BIN/"

VENV="$CACHE/venv-bench-$(sha256sum "$REQ" | cut -c1-12)"
if [ ! -f "$VENV/.complete" ]; then
  echo "== installing the bench's Python deps into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ"
  touch "$VENV/.complete"
fi

rc=0
BENCH_BIN="$BIN" "$VENV/bin/python" scripts/bench/run.py || rc=$?
if [ "$rc" -le 1 ]; then     # 0: all verified, 1: results written but something failed
  "$VENV/bin/python" scripts/bench/report.py
fi
exit "$rc"
