//! Integration tests against the real local stack (Apache Kafka + the ClickHouse engine).
//!
//! One test binary, as in clickhouse-rs: every test makes its own topic,
//! table and processes, so they can run side by side. The stack comes from
//! `KAFKA_BROKERS`, `CLICKHOUSE_URL` and `SCHEMA_REGISTRY_URL` (`make test`
//! starts it); a test fails, never skips, when it is missing.

mod harness;

// libtest starts tests in the order of their names, and the fault matrix
// (`sluice lab --quick`) is the longest by far: its name sorts first so
// that the rest run beside it rather than after it.
mod all_faults;
mod binary;
mod broker;
mod check;
mod coordinator;
mod dedup;
mod delivery;
mod deploy;
mod dlq;
mod errors;
mod extra;
mod faults;
mod handoff;
mod insert_format;
mod metrics;
mod ops;
mod reads;
mod registry;
mod reject;
mod resume;
mod send;
mod status;
mod status_edges;
