#!/usr/bin/env bash
# install-prometheus.sh — promtool (and prometheus) from Debian's `prometheus`
# package, pinned to what apt offers (2.42 on bookworm), to check and test
# deploy/prometheus/. Does nothing when promtool is present; prints its
# version either way. Never leaves a service running: a policy-rc.d that
# refuses every start is in place during the install, Recommends (the node
# exporter) are not installed, and any prometheus or node exporter process
# the install still started is stopped.
set -euo pipefail
version() { echo "install-prometheus: $(promtool --version 2>&1 | head -1)" >&2; }
if command -v promtool >/dev/null 2>&1; then version; exit 0; fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
POLICY=/usr/sbin/policy-rc.d
BACKUP=""
restore() {
  if [ -n "$BACKUP" ]; then $SUDO mv -f "$BACKUP" "$POLICY"; else $SUDO rm -f "$POLICY"; fi
}
if [ -e "$POLICY" ]; then
  BACKUP="$POLICY.install-prometheus.$$"
  $SUDO mv "$POLICY" "$BACKUP"
fi
trap restore EXIT
printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
$SUDO chmod 755 "$POLICY"
procs() { pgrep '^prometheus' || true; pgrep '^node_exporter' || true; }
before=$(procs)
echo "install-prometheus: installing prometheus (promtool)" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
  -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold prometheus >/dev/null
for pid in $(procs); do
  grep -qx "$pid" <<<"$before" || { echo "install-prometheus: stopping pid $pid" >&2; $SUDO kill "$pid"; }
done
version
