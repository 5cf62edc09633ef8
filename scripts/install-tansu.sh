#!/usr/bin/env bash
# install-tansu.sh — idempotently build the pinned Kafka broker (tansu 0.6.0, sqlite storage)
# from crates.io into ${SLUICE_CACHE:-$HOME/.cache/sluice}/tansu-0.6.0 (takes ~11 min on 2 cores).
# Skips the build when the binary already exists. Prints the binary path on stdout.
set -euo pipefail
TANSU_VERSION=0.6.0
CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
ROOT="$CACHE/tansu-$TANSU_VERSION"
BIN="$ROOT/bin/tansu"
mkdir -p "$CACHE"
if [ ! -x "$BIN" ]; then
  # One build at a time: a second caller waits here, then finds the binary.
  exec 9>"$CACHE/tansu-install.lock"
  flock 9
  if [ ! -x "$BIN" ]; then
    echo "install-tansu: building tansu $TANSU_VERSION (log: $CACHE/tansu-build.log)" >&2
    cargo install tansu --version "$TANSU_VERSION" --locked --no-default-features --features libsql \
      --root "$ROOT" >"$CACHE/tansu-build.log" 2>&1 || { tail -30 "$CACHE/tansu-build.log" >&2; exit 1; }
  fi
fi
echo "$BIN"
