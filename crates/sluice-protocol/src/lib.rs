//! The exactly-once rules of sluice, free of I/O.
//!
//! Records flow in as `(partition, offset, encoded row)`; out come batches,
//! insert tokens, resume plans and the decisions of each attempt, lease and
//! claim. Nothing here talks to Kafka, ClickHouse, the clock or the network,
//! and nothing here knows a record format (that is `sluice-formats`), so
//! every rule the exactly-once contract rests on is tested with unit and
//! property tests, and the model checker (`sluice-model`) drives the same
//! code:
//!
//! - [`offset`]: the two offset conventions as two types.
//! - [`batch`]: rows of a route's partitions → a batch cut by rows, bytes or
//!   age; each row named by its partition and offset ([`Row`]).
//! - [`cut`]: what a route's partitions have built → whether the route's
//!   one batch of them is due.
//! - [`token`]: a batch's rows → deterministic dedup token and query ids.
//! - [`acks`]: out-of-order batch completions → the in-order durable frontier.
//! - [`partition`]: one partition as the sink holds it: records taken,
//!   batches cut, slices ended → what it builds, sends and commits.
//! - [`machine`]: the partitions one process holds: assigned, revoked,
//!   taken, slices ended, commits → what to abandon, hand off and commit
//!   (the sink and the model drive it).
//! - [`attempt`]: each attempt's answer → whether the next one fences an
//!   earlier one and asks ClickHouse which rows it holds first, and which
//!   rows it sends.
//! - [`delivery`]: one batch's way to the table, as a machine: fence and
//!   ask, insert a share, take the answer (the writer and the model drive it).
//! - [`deadline`]: readings of the server's clock → an attempt's deadline on
//!   it, and when an attempt whose outcome is unknown can no longer commit.
//! - [`resume`]: committed offset + ClickHouse watermark + the log's bounds →
//!   where to read from and which offsets must be checked before they are
//!   inserted. What ClickHouse holds decides; the reset policy applies only
//!   where it holds nothing.
//!   ([`batch::Batch::without`] drops the rows ClickHouse already holds.)
//! - [`lease`]: reads of the register of owners → whether, and until when,
//!   a process may write a partition.
//! - [`claim`]: reads and writes of the register of owners → when a new
//!   owner may write a partition (the claim, its fence, its yield).
//! - [`timing`]: `fence_wait` and `insert_timeout` → the lease's term.
//! - [`dedup`]: business keys written within a window → drop the repeats
//!   whose first copy is durable, write on condition those whose copy is in
//!   flight.
//! - [`window`]: ClickHouse's block dedup window in seconds, and its size.

pub mod acks;
pub mod attempt;
pub mod batch;
pub mod claim;
pub mod cut;
pub mod deadline;
pub mod dedup;
pub mod delivery;
pub mod lease;
pub mod machine;
pub mod offset;
pub mod partition;
pub mod resume;
pub mod timing;
pub mod token;
pub mod window;

pub use acks::AckTracker;
pub use batch::{Batch, BatchBuilder, BatchLimits, PartitionId, Row};
pub use offset::{NextOffset, Offset};
pub use resume::{resume_plan, Committed, LogBounds, ResetPolicy, ResumePlan};
