#!/usr/bin/env bash
# stack.sh up|down|env|status — the local test stack: Kafka (Apache Kafka 4.1.2, one KRaft node,
# scripts/kafka-node.sh) + ClickHouse (chDB 26.9 behind stack/chdb_server.py) + a schema registry
# (stack/schema_registry.py), all on 127.0.0.1.
#
#   up      install them (scripts/install-*.sh, the official Confluent clients too), start what is
#           not running, wait until ready (Kafka: a Metadata request answers; ClickHouse: /ping;
#           the registry: GET /), then print what `env` prints
#   down    SIGTERM each, SIGKILL after 10 s, remove pid files
#   env     print KAFKA_BROKERS, CLICKHOUSE_URL, SCHEMA_REGISTRY_URL, SLUICE_STACK_KAFKA_NODE,
#           SLUICE_CHDB_PYTHON, SLUICE_CHDB_SERVER, SLUICE_REGISTRY_SERVER, SLUICE_CLIENTS_PYTHON
#           (export them: `set -a; eval "$(scripts/stack.sh env)"; set +a`)
#   status  say what runs
#
# State: ${SLUICE_STACK_DIR:-<repo>/.stack}/{kafka/, chdb/, registry.db, kafka.{pid,log},
# chdb.{pid,log}, registry.{pid,log}}.
# Ports: SLUICE_STACK_KAFKA_PORT (19092; its controller listens one above), SLUICE_STACK_CH_PORT
# (18123), SLUICE_STACK_SR_PORT (18081). Kafka's heap: 1 GiB (SLUICE_STACK_KAFKA_HEAP).
# Cache: SLUICE_CACHE (~/.cache/sluice).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
STACK="${SLUICE_STACK_DIR:-$REPO/.stack}"
KPORT="${SLUICE_STACK_KAFKA_PORT:-19092}"
CPORT="${SLUICE_STACK_CH_PORT:-18123}"
SPORT="${SLUICE_STACK_SR_PORT:-18081}"
KAFKA_NODE="$REPO/scripts/kafka-node.sh"
CHDB_PY="$CACHE/venv-chdb-26.9.0/bin/python"
CHDB_SERVER="$REPO/stack/chdb_server.py"
REGISTRY_SERVER="$REPO/stack/schema_registry.py"
CLIENTS_PY="$CACHE/venv-clients-2.16.1/bin/python"

lines() { # every variable the tests, the lab and the tools read
  echo "KAFKA_BROKERS=127.0.0.1:$KPORT"
  echo "CLICKHOUSE_URL=http://127.0.0.1:$CPORT"
  echo "SCHEMA_REGISTRY_URL=http://127.0.0.1:$SPORT"
  echo "SLUICE_STACK_KAFKA_NODE=$KAFKA_NODE"
  echo "SLUICE_CHDB_PYTHON=$CHDB_PY"
  echo "SLUICE_CHDB_SERVER=$CHDB_SERVER"
  echo "SLUICE_REGISTRY_SERVER=$REGISTRY_SERVER"
  echo "SLUICE_CLIENTS_PYTHON=$CLIENTS_PY"
}

alive() { # alive NAME -> pid file names a live process
  local f="$STACK/$1.pid"
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

kafka_ready() { # a Kafka Metadata v0 request gets an answer naming at least one broker
  "$CHDB_PY" - "$KPORT" <<'PY'
import socket, struct, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
    body = struct.pack(">hhih", 3, 0, 7, 5) + b"ready" + struct.pack(">i", 0)  # Metadata v0, all topics
    s.sendall(struct.pack(">i", len(body)) + body)
    size, corr, brokers = struct.unpack(">iii", s.recv(12, socket.MSG_WAITALL))
    sys.exit(0 if corr == 7 and brokers >= 1 else 1)
except Exception:
    sys.exit(1)
PY
}

ch_ready() {
  "$CHDB_PY" -c "import sys,urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:$CPORT/ping', timeout=2).read() != b'Ok.\n')" 2>/dev/null
}

registry_ready() {
  "$CHDB_PY" -c "import sys,urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:$SPORT/', timeout=2).read() != b'{}')" 2>/dev/null
}

wait_ready() { # wait_ready NAME CHECK
  for _ in $(seq 1 300); do
    if "$2"; then return 0; fi
    alive "$1" || { echo "stack: $1 died; see $STACK/$1.log" >&2; tail -20 "$STACK/$1.log" >&2; exit 1; }
    sleep 0.2
  done
  echo "stack: $1 not ready after 60 s; see $STACK/$1.log" >&2
  exit 1
}

up() {
  "$REPO/scripts/install-chdb.sh" >/dev/null
  "$REPO/scripts/install-kafka.sh" >/dev/null
  "$REPO/scripts/install-clients.sh" >/dev/null
  mkdir -p "$STACK/kafka" "$STACK/chdb"
  if ! alive kafka; then
    SLUICE_STACK_KAFKA_HEAP="${SLUICE_STACK_KAFKA_HEAP:-1g}" setsid "$KAFKA_NODE" "$STACK/kafka" "$KPORT" "$((KPORT + 1))" \
      </dev/null >>"$STACK/kafka.log" 2>&1 &
    echo $! >"$STACK/kafka.pid"
  fi
  if ! alive chdb; then
    setsid "$CHDB_PY" "$CHDB_SERVER" --path "$STACK/chdb" --port "$CPORT" </dev/null >>"$STACK/chdb.log" 2>&1 &
    echo $! >"$STACK/chdb.pid"
  fi
  if ! alive registry; then
    setsid "$CHDB_PY" "$REGISTRY_SERVER" --db "$STACK/registry.db" --port "$SPORT" </dev/null >>"$STACK/registry.log" 2>&1 &
    echo $! >"$STACK/registry.pid"
  fi
  wait_ready kafka kafka_ready
  wait_ready chdb ch_ready
  wait_ready registry registry_ready
  lines
}

stop() { # stop NAME: SIGTERM, then SIGKILL after 10 s
  local f="$STACK/$1.pid" pid
  [ -f "$f" ] || return 0
  pid="$(cat "$f")"
  if kill -TERM "$pid" 2>/dev/null; then
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null && echo "stack: $1 ($pid) killed after SIGTERM timeout" >&2
  fi
  rm -f "$f"
}

case "${1:-}" in
  up) up ;;
  down) stop kafka & stop chdb & stop registry & wait ;;
  env) lines ;;
  status)
    for n in kafka chdb registry; do
      if alive "$n"; then echo "$n: running (pid $(cat "$STACK/$n.pid"))"; else echo "$n: stopped"; fi
    done
    ;;
  *) echo "usage: $0 up|down|env|status" >&2; exit 2 ;;
esac
