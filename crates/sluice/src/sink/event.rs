//! What tasks report back to the consumer thread, over one channel: an
//! insert task's [`Completion`], a partition's [`Prepared`] start, a
//! partition [`Event::Taken`] by another owner (found by the lease's
//! renewal), the registry's answer for a schema id ([`Event::Schema`]),
//! and a table's columns read again ([`Event::Columns`]). The consumer
//! thread's [`super::state::Sink`] acts on each.

use super::dedup::Seeds;
use super::dlq::DlqError;
use crate::ch::ChError;
use crate::owners::{Key, Owner};
use crate::registry::Decoder;
use crate::retry::Delays;
use sluice_protocol::acks::Ticket;
use sluice_protocol::dedup::KeyHash;
use sluice_protocol::resume::{Mismatch, ResumePlan};
use sluice_protocol::{Offset, Row};
use std::time::Instant;

pub(super) enum Event {
    Completion(Completion),
    /// One partition's slice of a batch still on its way, settled ahead of
    /// the rest.
    SliceDone(SliceDone),
    Prepared(Prepared),
    /// Another owner (`by`) is in the register for this generation of the
    /// partition.
    Taken {
        key: Key,
        generation: u64,
        by: Owner,
    },
    /// These partitions' logs (of these generations) are not the ones
    /// their rows in ClickHouse or the group's commits came from: the sink
    /// marks them and stops.
    Mismatch(Vec<(Key, u64, Mismatch)>),
    /// The decoder of schema `id` of a route, or why its records cannot be
    /// read ([`super::schemas`]).
    Schema {
        route: usize,
        id: u32,
        answer: Result<Decoder, String>,
    },
    /// The columns of a route's table, read again, or why they could not
    /// be ([`super::columns`]).
    Columns {
        route: usize,
        answer: Result<Vec<String>, String>,
    },
}

/// What became of one batch.
#[derive(Debug)]
pub(super) enum Outcome {
    /// The rows of every slice not given up are stored (or in the DLQ).
    Durable {
        /// Rows inserted by this job (fewer than the batch after reconciliation).
        inserted: usize,
        /// Rows ClickHouse rejected (sent to the DLQ), with their business
        /// key on a key dedup route.
        rejected: Vec<(Row, Option<KeyHash>)>,
        /// Conditional rows left out: a copy of their key is stored.
        excluded: usize,
        /// ClickHouse refused a field the route's cached columns hold
        /// (`super::columns`): they must be read again.
        stale_columns: bool,
    },
    /// Every slice was given up.
    Abandoned,
    Failed(ChError),
    /// A DLQ write failed for good.
    DlqFailed(DlqError),
}

/// One batch's end, reported once its writer is done with every slice.
pub(super) struct Completion {
    pub(super) route_idx: usize,
    pub(super) bytes: usize,
    /// Records it wrote to the DLQ (refused by the encoder or rejected by
    /// ClickHouse), acknowledged.
    pub(super) dlq: usize,
    pub(super) outcome: Outcome,
    /// Per partition of the batch, what its rows answer to.
    pub(super) slices: Vec<Settled>,
}

/// A slice whose rows are durable while the rest of its batch is still on
/// its way (a share of a split batch stored, or found stored).
pub(super) struct SliceDone {
    pub(super) route_idx: usize,
    pub(super) slice: Settled,
    /// Its rows ClickHouse rejected (sent to the DLQ), with their business
    /// key on a key dedup route.
    pub(super) rejected: Vec<(Row, Option<KeyHash>)>,
    /// Its conditional rows left out: a copy of their key is stored.
    pub(super) excluded: usize,
    /// Its records written to the DLQ, acknowledged.
    pub(super) dlq: usize,
}

/// One partition's share of a finished batch.
pub(super) struct Settled {
    pub(super) partition: i32,
    pub(super) ticket: Ticket,
    pub(super) generation: u64,
    /// Its rows are durable: the ticket may be acknowledged. False when
    /// its partition was given up while the batch was in flight.
    pub(super) durable: bool,
    /// The copies its conditional rows depended on.
    pub(super) copies: Vec<Offset>,
}

/// A partition whose start position is known.
pub(super) struct Prepared {
    pub(super) key: Key,
    pub(super) generation: u64,
    pub(super) plan: ResumePlan,
    /// Keys for the partition's dedup window, when its route has one.
    pub(super) seeds: Option<Seeds>,
    /// The send time of the read that last showed this process in the
    /// register for it: where its lease starts.
    pub(super) confirmed: Instant,
    /// Failed attempts to activate it (seek).
    pub(super) attempts: u32,
    /// The waits before each next attempt.
    pub(super) delays: Delays,
}
