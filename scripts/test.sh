#!/usr/bin/env bash
# make test's Rust part: builds every test binary of the workspace once, then
# runs the model's checks beside the stack's tests (the model waits on the
# CPU, the stack's tests mostly on servers and timeouts), and the rest one
# after another. Every binary runs even when an earlier one failed; the exit
# status is 1 if any did. Arguments go to every test binary.
set -euo pipefail
cd "$(dirname "$0")/.."

# Package (its directory's name), package directory and executable of each test binary, one
# per line (cargo runs a test binary in its package's directory; so do we).
list=$(cargo test --release --workspace --lib --bins --tests --no-run \
    --message-format=json-render-diagnostics |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        dir = m["manifest_path"].rsplit("/", 1)[0]
        print(dir.rsplit("/", 1)[-1], dir, m["executable"])
')

model_log=$(mktemp)
trap 'rm -f "$model_log"' EXIT
status=0
run() { # run DIR EXE ARGS…: one test binary, as cargo test runs it.
    local dir=$1 exe=$2
    shift 2
    echo "     Running $exe"
    (cd "$dir" && "$exe" "$@")
}
models=$(grep '^sluice-model ' <<<"$list" || true)
# At a lower priority: the model takes what CPU the stack's tests leave
# (their timing-sensitive cells must not wait for it).
(
    renice -n 10 -p "$BASHPID" >/dev/null || true
    while read -r _ dir exe; do
        run "$dir" "$exe" "$@" || exit 1
    done <<<"$models"
) >"$model_log" 2>&1 &
model_pid=$!
echo "     (the model's checks run beside the others; their output follows at the end)"
while read -r package dir exe; do
    [[ $package == sluice-model ]] && continue
    run "$dir" "$exe" "$@" || status=1
done <<<"$list"
wait "$model_pid" || status=1
cat "$model_log"
exit $status
