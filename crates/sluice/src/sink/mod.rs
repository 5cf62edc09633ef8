//! `sluice run`: the sink daemon.
//!
//! Data flow: the Kafka consumer thread (`driver`) → the sink's state
//! (`state`: per-partition batch builders; it decides, and queues what
//! the world is to do as `action`s, which `edge` carries out with the
//! consumer and the runtime) → insert tasks (`writer`) →
//! `event`s back to the consumer thread → the in-order durable frontier →
//! offset commits. Partitions change owners without overlap (the state's
//! hand-off, with `prepare` off the consumer thread), through the
//! register of `owners` kept by the broker; `lease`
//! decides whether this process may still write a partition, on its own
//! clock; `dedup` rebuilds a
//! partition's key dedup window when it changes hands; `schemas` decodes
//! the records of Avro and Protobuf routes with the registry's schemas;
//! `columns` knows the tables' columns where a route refuses records
//! with fields its table lacks; `dlq` sends records that cannot become
//! rows to the dead-letter topic.

mod action;
mod body;
mod columns;
mod dedup;
mod dlq;
mod driver;
mod edge;
mod event;
mod fates;
mod lease;
mod prepare;
mod schemas;
mod state;
mod writer;

pub use driver::{run, Ended, Until};

/// The consumer's context: the sink's state, reachable from rebalance
/// callbacks. Only the consumer thread locks it.
struct SinkContext {
    sink: std::sync::Mutex<state::Sink>,
}
