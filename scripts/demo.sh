#!/usr/bin/env bash
# demo.sh — the main job on the local stack, end to end:
# start the stack, create a table and a fresh topic, produce sample orders,
# run `sluice run --until-caught-up` (it exits once every record there at
# start has landed), then show `sluice status` and what landed (rows,
# duplicates, per-partition watermarks).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
COUNT="${DEMO_RECORDS:-200000}"

set -a; eval "$(scripts/stack.sh env)"; set +a   # fixed paths and ports; `up` starts what they name
scripts/stack.sh up >/dev/null
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

TOPIC="demo_orders_$(date +%s)"   # a fresh topic each run
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
echo "== running sluice until it has caught up (config $CFG); it first waits out any previous owner's inserts (fence_wait, 15 s here)"
target/release/sluice run --config "$CFG" --until-caught-up 2>"$REPO/.stack/demo-sluice.log" \
  || { echo "sluice failed; log:"; tail -20 "$REPO/.stack/demo-sluice.log"; exit 1; }
echo "== sluice status: per partition, the broker's high watermark, the group's commit, ClickHouse's offset, the lag"
target/release/sluice status --config "$CFG"
echo "== landed in demo.orders (log: .stack/demo-sluice.log)"
ch "SELECT count() AS rows, uniqExact(_partition, _offset) AS distinct_offsets,
       count() - uniqExact(_partition, _offset) AS duplicates, uniqExact(order_id) AS orders
    FROM demo.orders WHERE _topic = '$TOPIC' FORMAT PrettyCompactMonoBlock"
ch "SELECT _partition, max(_offset) AS watermark, count() AS rows
    FROM demo.orders WHERE _topic = '$TOPIC' GROUP BY _partition ORDER BY _partition
    FORMAT PrettyCompactMonoBlock"
