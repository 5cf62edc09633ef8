//! sluice: exactly-once Kafka → ClickHouse ingestion.
//!
//! - [`check`]: `sluice check-config`, a verdict for each end.
//! - [`config`]: the TOML file, environment and flags → a validated config.
//! - [`ch`]: the ClickHouse service (inserts, watermarks, reconciliation reads).
//! - [`sink`]: `sluice run`, the consumer thread, batches and insert tasks.
//! - [`ops`]: `sluice window`, `audit`, `repair` and `schema`, the operator tools.
//! - [`send`]: `sluice send` and `resend`, producing without losing a record.
//! - [`registry`]: the schema registry client, schema ids → decoders.
//! - [`retry`]: the one retry policy, for every loop that waits and tries again.
//! - [`telemetry`], [`http`]: Prometheus series, `/metrics`, `/health`, `/ready`.
//!
//! The exactly-once rules themselves live in the I/O-free `sluice-protocol`
//! crate; turning a record value into a row lives in `sluice-formats`.

pub mod ch;
pub mod check;
pub mod config;
pub mod http;
pub mod ops;
pub mod registry;
pub mod retry;
pub mod send;
pub mod sink;
pub mod status;
pub mod telemetry;
