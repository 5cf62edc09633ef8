//! sluice: exactly-once Kafka → ClickHouse ingestion.
//!
//! - [`check`]: `sluice check-config`, a verdict for each end.
//! - [`config`]: the TOML file, environment and flags → a validated config.
//! - [`sql`]: table names and SQL quoting.
//! - [`report`]: what a command ends in (the exit status) and its tables.
//! - [`ch`]: the ClickHouse service (inserts, watermarks, reconciliation
//!   reads), and the connection the commands outside the sink build.
//! - `owners`: the register of partition owners, kept by the broker.
//! - [`sink`]: `sluice run`, the consumer thread, batches and insert tasks.
//! - [`ops`]: `sluice window`, `audit`, `repair` and `schema`, the operator tools.
//! - [`send`]: `sluice send` and `resend`, producing without losing a record.
//! - [`status`]: `sluice status`, how far behind ClickHouse is.
//! - `registry`: the schema registry client, schema ids → decoders.
//! - `retry`: the one retry policy, for every loop that waits and tries again.
//! - `telemetry`, `http`: Prometheus series, `/metrics`, `/health`, `/ready`.
//!
//! Floors, bottom up; a module imports only from floors below its own,
//! never from its own floor or above (`grep -rn 'crate::' src` shows it):
//!
//! 0. `sql`, `report`: no I/O, nothing else of the crate.
//! 1. `config`.
//! 2. `ch`, `registry`, `owners`: one service each (ClickHouse, the schema
//!    registry, the broker's register of owners).
//! 3. `retry`, `telemetry`.
//! 4. `http` (it serves `telemetry`).
//! 5. the commands: `sink`, `ops`, `send`, `status`, `check`.
//!
//! The exactly-once rules themselves live in the I/O-free `sluice-protocol`
//! crate; turning a record value into a row lives in `sluice-formats`.

pub mod ch;
pub mod check;
pub mod config;
mod http;
pub mod ops;
mod owners;
mod registry;
pub mod report;
mod retry;
pub mod send;
pub mod sink;
pub mod sql;
pub mod status;
mod telemetry;
