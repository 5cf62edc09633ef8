#!/usr/bin/env bash
# bench-resume.sh — times the resume lookup on a 100 M-row table (BENCH_ROWS).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo run --release --quiet --example bench_resume -- "${BENCH_ROWS:-100000000}"
