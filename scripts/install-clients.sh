#!/usr/bin/env bash
# install-clients.sh — idempotently create a Python venv holding the official
# Confluent clients (confluent-kafka with its Avro, Protobuf and schema
# registry extras), pinned: the tests check that records those clients
# produce through a schema registry land through sluice unchanged.
#   venv: ${SLUICE_CACHE:-$HOME/.cache/sluice}/venv-clients-$CK_VERSION
# Prints the venv's python path on stdout (everything else goes to stderr).
set -euo pipefail
CK_VERSION=2.16.1
CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
VENV="$CACHE/venv-clients-$CK_VERSION"
PY="$VENV/bin/python"

if [ -x "$PY" ] && "$PY" -c "import confluent_kafka.schema_registry.avro, confluent_kafka.schema_registry.protobuf" 2>/dev/null; then
  echo "$PY"; exit 0
fi
mkdir -p "$CACHE"
PYTHON="${PYTHON:-$(command -v python3)}"
echo "install-clients: creating $VENV with $PYTHON" >&2
"$PYTHON" -m venv "$VENV" >&2
# Every transitive dependency pinned too (stack/clients-constraints.txt).
"$VENV/bin/pip" install --quiet -c "$(dirname "$0")/../stack/clients-constraints.txt" \
  "confluent-kafka[avro,protobuf,schemaregistry]==$CK_VERSION" >&2
"$PY" -c "import confluent_kafka.schema_registry.avro, confluent_kafka.schema_registry.protobuf" >&2
echo "$PY"
