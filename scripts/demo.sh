#!/usr/bin/env bash
# demo.sh — the main job on the local stack, end to end:
# start the stack, create a table and a fresh topic, produce sample orders,
# run `sluice run` until every record has landed, stop it with SIGTERM and
# show what landed (rows, duplicates, per-partition watermarks).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
COUNT="${DEMO_RECORDS:-200000}"

scripts/stack.sh up >/dev/null
set -a; eval "$(scripts/stack.sh env)"; set +a
"$REPO/scripts/install-deps.sh"
cargo build --release --quiet --bin sluice --example produce

ch() { curl -sS --fail-with-body "$CLICKHOUSE_URL/" --data-binary "$1"; }
ch "CREATE DATABASE IF NOT EXISTS demo"
ch "CREATE TABLE IF NOT EXISTS demo.orders (
  order_id UInt64, user_id UInt32, amount Decimal(12, 2), status LowCardinality(String),
  created_at DateTime64(3),
  _topic LowCardinality(String), _partition UInt32, _offset UInt64,
  INDEX offset_minmax _offset TYPE minmax GRANULARITY 1,
  PROJECTION watermark (SELECT _topic, _partition, max(_offset) GROUP BY _topic, _partition)
) ENGINE = ReplacingMergeTree(_offset) ORDER BY order_id
SETTINGS deduplicate_merge_projection_mode = 'rebuild'"

TOPIC="demo_orders_$(date +%s)"   # fresh name: tansu cannot delete one topic alone
echo "== producing $COUNT orders to $TOPIC"
target/release/examples/produce "$TOPIC" "$COUNT" 8

CFG="$REPO/.stack/demo.toml"
cat >"$CFG" <<TOML
[kafka]
group_id = "demo-$TOPIC"

[clickhouse]
insert_timeout = "5s"   # bounds every insert; a new owner waits twice this + 5 s before writing

[sink]
delivery = "exactly-once"

[[route]]
topic = "$TOPIC"
table = "demo.orders"
TOML
echo "== running sluice (config $CFG); it first waits out any previous owner's inserts (fence_wait, 15 s here)"
target/release/sluice run --config "$CFG" 2>"$REPO/.stack/demo-sluice.log" &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  n="$(ch "SELECT count() FROM demo.orders WHERE _topic = '$TOPIC'")"
  [ "$n" -ge "$COUNT" ] && break
  kill -0 $PID 2>/dev/null || { echo "sluice exited early; log:"; tail -20 "$REPO/.stack/demo-sluice.log"; exit 1; }
  sleep 0.5
done
kill -TERM $PID; wait $PID || true; trap - EXIT
echo "== landed in demo.orders (log: .stack/demo-sluice.log)"
ch "SELECT count() AS rows, uniqExact(_partition, _offset) AS distinct_offsets,
       count() - uniqExact(_partition, _offset) AS duplicates, uniqExact(order_id) AS orders
    FROM demo.orders WHERE _topic = '$TOPIC' FORMAT PrettyCompactMonoBlock"
ch "SELECT _partition, max(_offset) AS watermark, count() AS rows
    FROM demo.orders WHERE _topic = '$TOPIC' GROUP BY _partition ORDER BY _partition
    FORMAT PrettyCompactMonoBlock"
