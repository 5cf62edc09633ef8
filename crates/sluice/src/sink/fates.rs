//! What became of a partition's rows, for the rows written on condition.
//!
//! Key dedup drops a record only once a copy of its key is durable. While
//! that copy is still in flight, the record goes into its batch on the
//! condition that the copy is not stored ([`sluice_protocol::dedup::Verdict`]).
//! Writers publish here, per finished batch, which of its rows were *not*
//! covered (ClickHouse rejected them into the DLQ); a writer whose batch
//! holds conditional rows waits here for the batches holding their copies.
//!
//! In: [`Fates::finish`] from each writer whose batch became durable,
//! [`Fates::fail`] when one failed for good. Out: [`Fates::covered`].
//! Memory: one range per finished batch and one offset per rejected row,
//! pruned by the consumer thread below the durable frontier and below the
//! lowest copy a conditional row still waits on.

use sluice_protocol::{NextOffset, Offset};
use std::collections::BTreeSet;
use std::sync::Mutex;
use tokio::sync::Notify;

#[derive(Debug, Default)]
pub(super) struct Fates {
    state: Mutex<State>,
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// `(first, last)` row offsets of finished batches.
    finished: Vec<(Offset, Offset)>,
    /// Rows of finished batches that were not stored.
    uncovered: BTreeSet<Offset>,
    /// Every row below this is settled.
    settled: Option<NextOffset>,
    failed: bool,
}

impl Fates {
    /// A batch whose rows span `first..=last` is durable; `uncovered` of
    /// them were not stored.
    pub(crate) fn finish(&self, first: Offset, last: Offset, uncovered: &[Offset]) {
        let mut s = self.lock();
        s.finished.push((first, last));
        s.uncovered.extend(uncovered.iter().copied());
        drop(s);
        self.changed.notify_waiters();
    }

    /// A batch failed for good: the rows waiting on it will never know.
    pub(crate) fn fail(&self) {
        self.lock().failed = true;
        self.changed.notify_waiters();
    }

    /// Whether the row at `copy` is covered (stored, or left out for a
    /// covered copy of its own), once its batch has finished. `None` if that
    /// will never be known.
    pub(crate) async fn covered(&self, copy: Offset) -> Option<bool> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let s = self.lock();
                let done = s.settled.is_some_and(|x| x.covers(copy))
                    || s.finished.iter().any(|&(a, b)| a <= copy && copy <= b);
                if done {
                    return Some(!s.uncovered.contains(&copy));
                }
                if s.failed {
                    return None;
                }
            }
            changed.await;
        }
    }

    /// Forgets what is below `frontier`: nothing waits on it any more, and
    /// nothing will (a new conditional row waits on an unsettled copy).
    pub(crate) fn prune_below(&self, frontier: NextOffset) {
        let mut s = self.lock();
        s.settled = s.settled.max(Some(frontier));
        s.finished.retain(|&(_, last)| !frontier.covers(last));
        s.uncovered = s.uncovered.split_off(&Offset(frontier.0));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}
