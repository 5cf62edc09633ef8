#!/usr/bin/env bash
# install-deps.sh — the system packages the build links against, from Debian:
# OpenSSL headers (TLS and SCRAM in librdkafka, HTTPS to ClickHouse) and
# pkg-config to find them. Does nothing when they are present.
set -euo pipefail
need=()
dpkg -s libssl-dev >/dev/null 2>&1 || need+=(libssl-dev)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "install-deps: installing ${need[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
