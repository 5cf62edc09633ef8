#!/usr/bin/env bash
# install-chdb.sh — idempotently create a Python venv holding the pinned ClickHouse
# engine (chdb-core, in-process ClickHouse 26.9) used by stack/chdb_server.py.
#   venv: ${SLUICE_CACHE:-$HOME/.cache/sluice}/venv-chdb-26.9.0
# Prints the venv's python path on stdout (everything else goes to stderr).
set -euo pipefail
CHDB_VERSION=26.9.0
CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
VENV="$CACHE/venv-chdb-$CHDB_VERSION"
PY="$VENV/bin/python"

if [ -x "$PY" ] && "$PY" -c "import importlib.metadata as m,sys; sys.exit(m.version('chdb-core')!='$CHDB_VERSION')" 2>/dev/null; then
  echo "$PY"; exit 0
fi
mkdir -p "$CACHE"
PYTHON="${PYTHON:-$(command -v python3)}"
echo "install-chdb: creating $VENV with $PYTHON" >&2
"$PYTHON" -m venv "$VENV" >&2
"$VENV/bin/pip" install --quiet "chdb-core==$CHDB_VERSION" >&2
"$PY" -c "import chdb; assert chdb.__version__=='$CHDB_VERSION', chdb.__version__" >&2
echo "$PY"
