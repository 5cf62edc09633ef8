#!/usr/bin/env bash
# bench.sh — what `make bench` runs: start a private stack (see below), build sluice, raw_fetch and raw_insert, install the
# pinned Python deps (scripts/bench/requirements.txt) into a cached venv outside the work tree,
# run the cases (scripts/bench/run.py -> docs/bench/results.json) and render the report
# (scripts/bench/report.py -> docs/bench/README.md + SVGs).
# Knobs: BENCH_MB (MB of JSON per record size), BENCH_SIZES, BENCH_CASES, BENCH_PARTITIONS,
# BENCH_KAFKA=mock (librdkafka's in-memory mock cluster instead of Apache Kafka: the hot path's measure);
# BENCH_REV=<commit> benches that commit (git archive to $CACHE/bench-src, built in $CACHE/bench-target) instead of
# the work tree.
# The binaries are copied to a private temp dir so a rebuild by someone else cannot swap them.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
REQ=scripts/bench/requirements.txt

# A private stack by default: the bench starts its own broker and ClickHouse, with fresh state,
# on other ports, and stops them at the end, so that the tests' topics and tables (and their
# background merges and log cleaning) cost nothing while it measures.
# BENCH_STACK=shared benches against the shared stack (scripts/stack.sh defaults) instead.
BIN="$(mktemp -d /tmp/sluice-bench-bin.XXXXXX)"
cleanup() {
  rm -rf "$BIN"
  if [ -n "${PRIVATE:-}" ]; then scripts/stack.sh down; rm -rf "$PRIVATE"; fi
}
trap cleanup EXIT
if [ "${BENCH_STACK:-private}" = private ]; then
  KPORT="${BENCH_KAFKA_PORT:-19192}" CPORT="${BENCH_CH_PORT:-18223}"
  for port in "$KPORT" "$CPORT"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "bench: port $port is taken; set BENCH_KAFKA_PORT / BENCH_CH_PORT" >&2; exit 1
    fi
  done
  # Never start a second broker on the shared ports: the stack must say it will use ours.
  env_out="$(SLUICE_STACK_KAFKA_PORT="$KPORT" SLUICE_STACK_CH_PORT="$CPORT" scripts/stack.sh env)"
  if ! grep -q "KAFKA_BROKERS=127.0.0.1:$KPORT" <<<"$env_out" \
     || ! grep -q "CLICKHOUSE_URL=http://127.0.0.1:$CPORT" <<<"$env_out"; then
    echo "bench: scripts/stack.sh ignores SLUICE_STACK_KAFKA_PORT/SLUICE_STACK_CH_PORT; not starting a private stack" >&2
    exit 1
  fi
  PRIVATE="$(mktemp -d /tmp/sluice-bench-stack.XXXXXX)"
  export SLUICE_STACK_DIR="$PRIVATE" SLUICE_STACK_KAFKA_PORT="$KPORT" SLUICE_STACK_CH_PORT="$CPORT"
fi
scripts/stack.sh up >/dev/null
set -a; eval "$(scripts/stack.sh env)"; set +a
export BENCH_STACK_KIND="${BENCH_STACK:-private}"
if [ -n "${BENCH_REV:-}" ]; then   # bench a commit, not the work tree: build a clean export of it
  SRC="$CACHE/bench-src"        # a fixed path, so the next build of another commit is incremental
  rm -rf "$SRC" && mkdir -p "$SRC"
  git archive "$BENCH_REV" | tar -x -C "$SRC"
  (cd "$SRC" && CARGO_TARGET_DIR="$CACHE/bench-target" cargo build --release --quiet --bin sluice --example raw_fetch --example raw_insert --example mock_broker)
  OUT="$CACHE/bench-target/release"
  export BENCH_SOURCE="commit $(git rev-parse --short "$BENCH_REV")"
else
  cargo build --release --quiet --bin sluice --example raw_fetch --example raw_insert --example mock_broker
  OUT=target/release
  dirty="$(git status --porcelain -- crates Cargo.toml Cargo.lock | wc -l)"
  export BENCH_SOURCE="work tree at $(git rev-parse --short HEAD)$([ "$dirty" = 0 ] || echo " + $dirty uncommitted file(s)")"
fi
cp "$OUT/sluice" "$OUT/examples/raw_fetch" "$OUT/examples/raw_insert" "$OUT/examples/mock_broker" "$BIN/"

# BENCH_KAFKA=mock: librdkafka's in-memory mock cluster instead of Apache Kafka, so that the broker is not
# the bottleneck (the hot path's measure; it keeps ~5 MB compressed per partition, so set
# BENCH_PARTITIONS=32 for BENCH_MB=150, 128 for 600, which is mostly steady state). It lives as long as this script: its stdin is a pipe (fd 7, BENCH_MOCK_FD, where
# run.py writes `TOPIC PARTITIONS` to create a topic) that closes when we exit.
export BENCH_KAFKA_KIND="Apache Kafka 4.1.2 (one KRaft node)"
if [ "${BENCH_KAFKA:-kafka}" = mock ]; then
  exec 7> >("$BIN/mock_broker" > "$BIN/mock.env")
  export BENCH_MOCK_FD=7 BENCH_MOCK_OUT="$BIN/mock.env"
  for _ in $(seq 100); do grep -q KAFKA_BROKERS "$BIN/mock.env" 2>/dev/null && break; sleep 0.1; done
  export "$(grep KAFKA_BROKERS "$BIN/mock.env")"
  BENCH_KAFKA_KIND="librdkafka's mock cluster (in memory)"
fi

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
  "$VENV/bin/python" scripts/bench/report.py "${BENCH_OUT:-docs/bench}"
fi
exit "$rc"
