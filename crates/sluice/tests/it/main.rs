//! Integration tests against the real local stack (tansu + ClickHouse engine).
//!
//! One test binary, as in clickhouse-rs: every test makes its own topic,
//! table and processes, so they can run side by side. The stack comes from
//! `KAFKA_BROKERS` and `CLICKHOUSE_URL` (`make test` starts it); a test
//! fails, never skips, when it is missing.

mod harness;

mod check;
mod coordinator;
mod dedup;
mod delivery;
mod dlq;
mod errors;
mod faults;
mod handoff;
mod lab;
mod metrics;
mod ops;
mod reads;
mod reject;
mod resume;
mod send;
