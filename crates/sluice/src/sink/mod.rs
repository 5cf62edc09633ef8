//! `sluice run`: the sink daemon.
//!
//! Data flow: the Kafka consumer thread ([`driver`]) → per-partition batch
//! builders ([`state`]) → insert tasks ([`writer`]) → completions back to the
//! consumer thread → the in-order durable frontier → offset commits.
//! [`handoff`] moves partitions between owners without overlap, through a
//! register of [`owners`] kept by the broker; [`lease`] decides whether this
//! process may still write a partition, on its own clock; [`dedup`]
//! rebuilds a partition's key dedup window when it changes hands; [`dlq`]
//! sends records that cannot become rows to the dead-letter topic.

mod dedup;
mod dlq;
mod driver;
mod fates;
mod handoff;
mod lease;
mod owners;
mod state;
mod writer;

pub use driver::run;

/// The consumer's context: the sink's state, reachable from rebalance
/// callbacks. Only the consumer thread locks it.
struct SinkContext {
    sink: std::sync::Mutex<state::Sink>,
}
