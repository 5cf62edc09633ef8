#!/usr/bin/env bash
# install-tansu.sh — idempotently build the pinned Kafka broker (tansu 0.6.0, sqlite storage)
# from crates.io into ${SLUICE_CACHE:-$HOME/.cache/sluice}/tansu-0.6.0 (takes ~11–13 min on 2 cores).
# Skips the build when the binary already exists. Prints the binary path on stdout, nothing else.
#
# While it builds, stderr shows progress: crates compiled (cargo's `Compiling` lines in the log)
# of TANSU_CRATES, and the elapsed time. On a terminal one line is redrawn every second; otherwise
# (CI logs) a line is printed every 30 s and at each 10 % of the crates. The full cargo output
# goes to $CACHE/tansu-build.log; on failure its last 30 lines are printed.
set -euo pipefail
TANSU_VERSION=0.6.0
# Pinned, not computed: the `Compiling` lines of a successful build of this version with these
# features (x86_64 Linux, cargo 1.95). The .crate's Cargo.lock lists 824 packages, most of them
# behind features we leave off, so it is no guide. Recount after changing the version or the
# features: grep -c '^ *Compiling ' "$CACHE/tansu-build.log". Another platform may differ by a
# few; past the total the progress line shows the count alone.
TANSU_CRATES=410
CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
ROOT="$CACHE/tansu-$TANSU_VERSION"
BIN="$ROOT/bin/tansu"
LOG="$CACHE/tansu-build.log"

compiled() { local n; n="$(grep -c '^ *Compiling ' "$LOG" 2>/dev/null)" || true; echo "${n:-0}"; }

status() { # status N: "212/410 crates, 4m12s"
  local n="$1" what
  if [ "$n" -eq 0 ]; then what="fetching sources"
  elif [ "$n" -le "$TANSU_CRATES" ]; then what="$n/$TANSU_CRATES crates"
  else what="$n crates"; fi
  printf '%s, %dm%02ds' "$what" $((SECONDS / 60)) $((SECONDS % 60))
}

progress() { # runs in the background until killed or until this script is gone
  exec 9>&-   # never hold the build lock past the script
  trap 'exit 0' TERM
  local n last_n=0 last_t=0
  while kill -0 $$ 2>/dev/null; do
    sleep 1
    n="$(compiled)"
    if [ -t 2 ]; then
      printf '\rinstall-tansu: building tansu %s: %s\033[K' "$TANSU_VERSION" "$(status "$n")" >&2
    elif [ $((SECONDS - last_t)) -ge 30 ] || [ $((n * 10 / TANSU_CRATES)) -gt $((last_n * 10 / TANSU_CRATES)) ]; then
      echo "install-tansu: building tansu $TANSU_VERSION: $(status "$n")" >&2
      last_t=$SECONDS last_n=$n
    fi
  done
}

mkdir -p "$CACHE"
if [ ! -x "$BIN" ]; then
  # One build at a time: a second caller waits here, then finds the binary.
  exec 9>"$CACHE/tansu-install.lock"
  if ! flock -n 9; then
    echo "install-tansu: another install-tansu is building tansu $TANSU_VERSION (log: $LOG); waiting" >&2
    flock 9
  fi
  if [ ! -x "$BIN" ]; then
    echo "install-tansu: building tansu $TANSU_VERSION from crates.io, once: $TANSU_CRATES crates," \
      "about 11-13 min on 2 cores (this machine has $(nproc)); later runs reuse $ROOT" \
      "(log: $LOG)" >&2
    : >"$LOG"
    SECONDS=0
    progress &
    PROGRESS=$!
    trap 'kill $PROGRESS 2>/dev/null || true' EXIT
    rc=0
    # Plain lines in the log, whatever the user's cargo config says: progress() counts them.
    CARGO_TERM_COLOR=never CARGO_TERM_PROGRESS_WHEN=never \
    cargo install tansu --version "$TANSU_VERSION" --locked --no-default-features --features libsql \
      --root "$ROOT" >"$LOG" 2>&1 || rc=$?
    kill $PROGRESS 2>/dev/null || true
    wait $PROGRESS 2>/dev/null || true
    trap - EXIT
    if [ -t 2 ]; then printf '\r\033[K' >&2; fi   # clear the progress line
    if [ $rc -ne 0 ] || [ ! -x "$BIN" ]; then
      echo "install-tansu: building tansu $TANSU_VERSION failed ($(status "$(compiled)")); last 30 lines of $LOG:" >&2
      tail -30 "$LOG" >&2
      exit 1
    fi
    echo "install-tansu: built tansu $TANSU_VERSION: $(status "$(compiled)")" >&2
  fi
fi
echo "$BIN"
