# sluice — quick start: `make demo` runs the main job on the local stack,
# `make test` runs every test against it. Both install and start the stack
# (Apache Kafka 4.1.2 + the ClickHouse 26.9 engine + a schema registry) on 127.0.0.1 if needed.

STACK := scripts/stack.sh
ENV := set -a; eval "$$($(STACK) env)"; set +a

.PHONY: build stack stack-down demo check test lint model bench-formats bench-parts bench-resume bench-dedup bench-deadline bench-server bench-pipeline clean-stack bench

build:
	@scripts/install-deps.sh
	cargo build --release --bin sluice

stack:
	@$(STACK) up

stack-down:
	@$(STACK) down

demo:
	@scripts/demo.sh

# The fast tier: no stack, no broker. Style, lints, and every test that
# needs neither Kafka nor ClickHouse (unit and property tests, the config's
# documented defaults, the model's CI scenarios).
check:
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings
	cargo test --release --workspace --exclude sluice-cli
	cargo test --release -p sluice-cli --bins

# Everything: the fast tier's tests, then the stack's (the lab matrix
# included).
test:
	@scripts/install-deps.sh
	@scripts/test-deploy.sh
	@$(STACK) up >/dev/null
	@$(ENV); "$$SLUICE_CHDB_PYTHON" stack/test_chdb_server.py
	@$(ENV); "$$SLUICE_CLIENTS_PYTHON" -W ignore::ResourceWarning stack/test_schema_registry.py
	@$(ENV); scripts/test.sh --test-threads=4

# The checked model, deeper than `make test` checks it: each entry is
# SECS RECORDS REBALANCES CRASHES LOST_COMMITS RESETS FORGETS
# [BAD [SERVERS [REJECTED [KEYS]]]] (BAD: a bit mask of the offsets that go
# to the DLQ; SERVERS: 2 puts a second server 1 s behind the first;
# REJECTED: a bit mask of the offsets whose rows ClickHouse rejects; KEYS:
# key dedup, one key digit per record). docs/protocol.md has the sizes and
# times.
MODEL_BOUNDS := "10 1 1 0 0 0 0" "9 1 1 1 0 0 0" "8 2 1 0 0 1 0" "8 1 2 0 0 0 0" "8 1 1 0 0 0 1" \
	"7 2 1 1 0 0 0 1" "8 1 1 0 0 0 0 0 2" \
	"6 3 1 0 0 0 0 0 1 1 777" "5 3 1 0 0 0 0 0 1 2 787" "6 2 1 1 0 0 0 0 1 1 77" \
	"6 2 1 0 0 1 0 0 1 1 77"

# Liveness (FAIR=STALLS,RECOVERY_SECS): every record lands within the
# recovery time of the last fault, under fair scheduling.
MODEL_FAIR := "40 2 1 1 0 1 0" "40 2 2 0 0 0 0" "40 2 1 0 0 0 1" "40 2 1 1 0 0 0 1"

model:
	cargo build --release -p sluice-model --example check
	@for b in $(MODEL_BOUNDS); do target/release/examples/check $$b || exit 1; done
	@for b in $(MODEL_FAIR); do FAIR=1,20 target/release/examples/check $$b || exit 1; done
	START=shared FAIR=2,40 target/release/examples/check 60 2 0 0 0 0 0
	PARTITIONS=2 target/release/examples/check 8 1 0 0 0 2 0
	PARTITIONS=2 PROCESSES=1 target/release/examples/check 7 1 1 1 0 0 0
	PARTITIONS=2 MAX_STATES=100000000 target/release/examples/check 8 1 1 0 0 0 0
	PARTITIONS=2 PROCESSES=1 STRUCK=any REFUSALS=1 target/release/examples/check 7 1 1 0 0 0 0
	PARTITIONS=2 MOVES=1 target/release/examples/check 5 1 1 1 0 0 0
	PARTITIONS=2 MOVES=1 MAX_STATES=100000000 target/release/examples/check 6 1 1 1 0 0 0
	PARTITIONS=2 PROCESSES=1 STRUCK=any target/release/examples/check 4 1 1 0 0 0 1

lint:
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings

bench-dedup:
	scripts/bench-dedup.sh

bench-deadline:
	@scripts/install-deps.sh
	scripts/bench-deadline.sh

bench:
	@scripts/bench/bench.sh

bench-formats:
	@$(STACK) up >/dev/null
	@cargo run --release --quiet -p sluice-formats --example decode_cost
	@cargo build --release --quiet --bin sluice
	@$(ENV); BENCH_BIN=target/release "$$SLUICE_CLIENTS_PYTHON" scripts/bench/formats.py

# INSERTs per second and rows per INSERT as the partition count grows at a
# steady input rate (BENCH_PARTITIONS, BENCH_RATE, BENCH_SECS, BENCH_WARMUP).
bench-parts:
	@$(STACK) up >/dev/null
	@cargo build --release --quiet --bin sluice
	@$(ENV); BENCH_BIN=target/release "$$SLUICE_CLIENTS_PYTHON" scripts/bench/parts.py

# The stack's ClickHouse server: its CPU for the sink's exactly-once insert shape beside a plain
# insert of the same rows, and chDB in-process as the floor (BENCH_ROWS, BENCH_ROUNDS,
# BENCH_SERVER=stack, BENCH_PROFILE=1; docs/bench-server.md).
bench-server:
	@$(STACK) up >/dev/null
	@$(ENV); "$$SLUICE_CHDB_PYTHON" scripts/bench/server.py

# The whole pipeline's CPU per record: the sink's and the ClickHouse server's during the same ingest,
# sluice with insert_format json and binary beside the Python baseline at 200 B and 1 KB, and Avro and
# Protobuf at 200 B (BENCH_MB, BENCH_RUNS, BENCH_SERVER=stack, BENCH_BIN; docs/bench-pipeline.md).
bench-pipeline:
	@$(STACK) up >/dev/null
	@if [ -z "$$BENCH_BIN" ]; then cargo build --release --quiet --bin sluice; fi
	@$(ENV); BENCH_BIN="$${BENCH_BIN:-target/release}" "$$SLUICE_CLIENTS_PYTHON" scripts/bench/pipeline.py

bench-resume:
	@$(STACK) up >/dev/null
	@$(ENV); scripts/bench-resume.sh

clean-stack: stack-down
	rm -rf .stack
