#!/usr/bin/env bash
# bench-dedup.sh — what key dedup costs the sink's hot path (CPU per record,
# memory per key), side by side with the same records without it; writes
# docs/bench-dedup.md. Needs no stack.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo run --release --quiet -p sluice-formats --example bench_dedup -- "${BENCH_RECORDS:-2000000}" "${BENCH_KEYS:-5000000}" | tee docs/bench-dedup.md
