#!/usr/bin/env bash
# test-deploy.sh — checks the operations files in deploy/: the Prometheus
# rules (promtool check and unit tests), the systemd unit (systemd-analyze
# verify with no warning, and its security exposure) and the SLUICE_…
# variables the unit and the env example set (each must name a setting).
# Installs promtool first (scripts/install-prometheus.sh). Ends with a
# `test result:` line like cargo's; exits 1 if a check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
RULES=deploy/prometheus/sluice-alerts.yml
TESTS=deploy/prometheus/sluice-alerts.test.yml
UNIT=deploy/systemd/sluice.service
ENVEX=deploy/systemd/sluice.env.example
BIN=/usr/local/bin/sluice
# Highest exposure allowed, in tenths of `systemd-analyze security`'s score
# (the unit scores 1.1; an unhardened service about 9.6).
MAX_EXPOSURE=20
passed=0
failed=0
result() {
  if [ "$failed" -eq 0 ]; then
    echo "test result: ok. $passed passed; 0 failed;"
  else
    echo "test result: FAILED. $passed passed; $failed failed;"
  fi
}
# check NAME FILE COMMAND…: passes when COMMAND exits 0 and, with
# QUIET=1, prints nothing.
check() {
  local name=$1 file=$2 out rc
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ] && { [ "${QUIET:-0}" = 0 ] || [ -z "$out" ]; }; then
    echo "test deploy::$name ... ok"
    passed=$((passed + 1))
  else
    [ "$rc" -eq 0 ] && rc="warnings" || rc="exit $rc"
    echo "test deploy::$name ... FAILED ($file: $rc)"
    [ -n "$out" ] && sed 's/^/    /' <<<"$out"
    failed=$((failed + 1))
  fi
}

if ! scripts/install-prometheus.sh; then
  echo "test-deploy: cannot install promtool (scripts/install-prometheus.sh)" >&2
  failed=1
  result
  exit 1
fi

check rules_valid "$RULES" promtool check rules "$RULES"
check rules_unit_tests "$TESTS" promtool test rules "$TESTS"

# systemd-analyze checks that ExecStart's binary exists: verify a copy whose
# ExecStart points at a stub, the rest of the unit unchanged. It reports
# unknown keys as warnings but exits 0, hence QUIET=1.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '#!/bin/sh\nexit 0\n' >"$tmp/sluice"
chmod 755 "$tmp/sluice"
sed "s|^ExecStart=$BIN |ExecStart=$tmp/sluice |" "$UNIT" >"$tmp/sluice.service"
verify_unit() {
  grep -q "^ExecStart=$BIN run --config /etc/sluice/sluice.toml\$" "$UNIT" ||
    { echo "ExecStart is not '$BIN run --config /etc/sluice/sluice.toml'"; return 1; }
  grep -q "^ExecStart=$tmp/sluice " "$tmp/sluice.service" || { echo "ExecStart not rewritten"; return 1; }
  systemd-analyze verify "$tmp/sluice.service" 2>&1 | sed "s|$tmp/sluice.service|$UNIT|"
  return "${PIPESTATUS[0]}"
}
# The score, and what counts against it.
unit_security() {
  local out rc
  out=$(systemd-analyze security --offline=true --threshold="$MAX_EXPOSURE" "$tmp/sluice.service" 2>&1)
  rc=$?
  [ "$rc" -eq 0 ] || grep -E '^✗|Overall' <<<"$out"
  return "$rc"
}
if command -v systemd-analyze >/dev/null 2>&1; then
  QUIET=1 check unit_verify "$UNIT" verify_unit
  check unit_security "$UNIT" unit_security
else
  for name in unit_verify unit_security; do
    echo "test deploy::$name ... FAILED ($UNIT: systemd-analyze not found; apt-get install systemd)"
    failed=$((failed + 1))
  done
fi

# Every SLUICE_… variable the unit or the example sets names a setting
# (crates/sluice/src/config/env.rs) or a flag's variable (crates/sluice-cli/src/main.rs).
env_names() {
  local known name bad=0
  known=$( {
    grep -o '^ *("[a-z_.]*", \(Str\|Int\|Bool\))' crates/sluice/src/config/env.rs |
      sed 's/^ *("\([a-z_.]*\)".*/\1/' | tr 'a-z.' 'A-Z_' | sed 's/^/SLUICE_/'
    grep -o 'env = "SLUICE_[A-Z0-9_]*"' crates/sluice-cli/src/main.rs | sed 's/env = "\(.*\)"/\1/'
  })
  [ "$(wc -l <<<"$known")" -gt 40 ] || { echo "cannot read the settings from crates/sluice/src/config/env.rs"; return 1; }
  for name in $(grep -ohE '^#?(Environment=)?SLUICE_[A-Z0-9_]+=' "$UNIT" "$ENVEX" | sed -E 's/^#?(Environment=)?//; s/=$//' | sort -u); do
    grep -qx "$name" <<<"$known" || { echo "$name names no setting"; bad=1; }
  done
  return $bad
}
check env_names "$UNIT, $ENVEX" env_names

result
[ "$failed" -eq 0 ]
