//! `sluice run`: the sink daemon.
//!
//! Data flow: the Kafka consumer ([`driver`]) → per-partition batch builders
//! → insert tasks ([`writer`]) → completions back to the driver → the
//! in-order durable frontier → offset commits. [`lease`] decides whether this
//! process may start an insert at all.

mod driver;
mod lease;
mod writer;

pub use driver::run;
