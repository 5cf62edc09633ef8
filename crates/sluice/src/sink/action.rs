//! What the sink's state asks of the world, as data.
//!
//! The state ([`super::state::Sink`]) decides; it never calls the Kafka
//! consumer, ClickHouse or the registry, and starts no task (inserts,
//! preparations, clean marks, schema fetches, column reads). Each decision
//! that needs the world queues an [`Action`]; the consumer thread
//! ([`super::edge`]) carries the queue out, in order, right after the call
//! that filled it, and reports back what the state must learn (a seek that
//! failed, a commit that was stored; a task's answer comes back as an
//! [`super::event::Event`]).

use super::event::Prepared;
use super::prepare::Preparation;
use super::writer::Job;
use crate::owners::Key;
use sluice_protocol::{NextOffset, Offset};
use std::time::{Duration, Instant};

pub(super) enum Action {
    /// Stop fetching these partitions.
    Pause(Vec<Key>),
    /// Fetch these partitions again.
    Resume(Vec<Key>),
    /// Read `key` from `offset` next; the outcome goes back to the state
    /// with `then` ([`super::state::Sink::on_seek`]).
    Seek {
        key: Key,
        offset: Offset,
        then: AfterSeek,
    },
    /// Store these positions (of these generations) as the group's commit;
    /// `sync` waits for the broker. A stored commit goes back to the state
    /// ([`super::state::Sink::on_committed`]); a failed one is logged (the
    /// commit is advisory, progress lives in ClickHouse).
    Commit {
        offsets: Vec<(Key, u64, NextOffset)>,
        sync: bool,
    },
    /// Commit the mismatch mark to these partitions, trying a few times,
    /// then stop the sink naming `named`
    /// ([`super::state::Sink::mismatch_marked`]).
    MarkMismatch { keys: Vec<Key>, named: Vec<String> },
    /// Run a batch's insert as a task.
    Insert(Box<Job>),
    /// Claim, fence and plan partitions, as a task.
    Prepare(Box<Preparation>),
    /// Hand a prepared partition back after `after` (its seek failed).
    RetryPrepared {
        after: Duration,
        prepared: Box<Prepared>,
    },
    /// Mark `keys` clean in the register: their inserts drained under
    /// leases that have just ended, the first at `until`. `wait`: block
    /// until the write is answered (at a stop).
    MarkClean {
        keys: Vec<Key>,
        until: Option<Instant>,
        wait: bool,
    },
    /// Fetch the decoder of schema `id` of registry route `route`, as a
    /// task; the answer comes back as an [`super::event::Event::Schema`].
    FetchSchema { route: usize, id: u32 },
    /// Read the columns of route `route`'s table again, as a task; the
    /// answer comes back as an [`super::event::Event::Columns`].
    RereadColumns { route: usize },
}

/// What a seek was for.
pub(super) enum AfterSeek {
    /// Activating a prepared partition.
    Activate(Box<Prepared>),
    /// Reading again the record that waited for its schema or its
    /// table's columns.
    Unstall,
}
