//! One partition as the sink holds it, and the decisions on it.
//!
//! In: records read (an offset, and a row the caller encodes), cuts of the
//! batch being built, the ends of the slices of batches in flight, the
//! commits the group stored. Out: whether a record is taken, the batch cut
//! with its [`Ticket`], and the position to commit. A partition lives for
//! one generation of this process's ownership: [`Phase::Preparing`] (read
//! nothing; its start is being worked out) until [`Partition::activate`],
//! then [`Phase::Active`] until it is given up, or [`Phase::Leaving`] once
//! revoked ([`Partition::leave`]) until its batches in flight have ended
//! and it hands off ([`Partition::hand_off`]).
//!
//! The sink (`sink/state`) keeps one per partition it holds, beside what
//! only the binary has (DLQ letters, registry originals, the abandon token,
//! timestamps for the lag metric).

use crate::acks::{AckTracker, Ticket};
use crate::batch::{Batch, BatchBuilder, BatchLimits, PartitionId};
use crate::deadline::Moment;
use crate::dedup::{KeyHash, KeyWindow, Verdict, Window};
use crate::offset::{NextOffset, Offset};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Assigned and paused; the start position is being worked out.
    Preparing,
    /// Positioned; its records are being batched and inserted.
    Active,
    /// Revoked: reads nothing more; its batches in flight end under its
    /// lease, then it hands off.
    Leaving,
}

/// Whether a record read is for the batch being built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Take,
    /// Not active, or waiting: fetched before a pause took hold; it is read
    /// again after the seek.
    Ignore,
    /// At or below the position: the client delivered it a second time,
    /// and taking it again would insert it twice.
    Redelivered {
        expected: Option<NextOffset>,
    },
}

/// What a keyed record became.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keyed {
    /// A row; `keyless`: without a usable key (kept).
    Row { keyless: bool },
    /// Its key was written within the window: no row.
    Dropped,
}

/// A revoked partition whose batches in flight have all ended: what it
/// does before its next owner takes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HandOff {
    /// Commit this position first (its durable frontier moved).
    pub commit: Option<NextOffset>,
    /// Mark the register clean, so the next owner need not fence: only
    /// under a live lease (otherwise a new owner may be writing already).
    pub clean: bool,
}

/// The batch being built, cut.
#[derive(Debug)]
pub struct Cut {
    pub batch: Batch,
    /// Where the batch ends in the partition.
    pub end: NextOffset,
    pub ticket: Ticket,
    /// Some of its rows may already be stored: reconcile first.
    pub uncertain: bool,
    /// Its rows written on condition, `(row, copy)`.
    pub conditional: Vec<(Offset, Offset)>,
}

/// `W`: the route's key window, if it has one (the sink's [`KeyWindow`];
/// the model's compares by the copy standing for each key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Partition<T, W = KeyWindow> {
    phase: Phase,
    generation: u64,
    builder: BatchBuilder<T>,
    /// The batch being built holds rows that may already be stored.
    uncertain: bool,
    acks: Option<AckTracker>,
    committed: Option<NextOffset>,
    /// Records at or below it may already be stored.
    check_through: Option<Offset>,
    /// The offset after the last record taken.
    position: Option<NextOffset>,
    /// Business keys written within the route's dedup window, if it has one.
    keys: Option<W>,
    /// Rows of the batch being built written on condition, `(row, copy)`
    /// ([`Verdict::WriteUnless`]).
    conditional: Vec<(Offset, Offset)>,
    /// The copies that conditional rows, in flight or being built, wait
    /// on, with their counts.
    waiting: BTreeMap<Offset, usize>,
}

impl<T: Moment, W: Window> Partition<T, W> {
    pub fn new(id: PartitionId, limits: BatchLimits, generation: u64, phase: Phase) -> Self {
        Self {
            phase,
            generation,
            builder: BatchBuilder::new(id, limits),
            uncertain: false,
            acks: None,
            committed: None,
            check_through: None,
            position: None,
            keys: None,
            conditional: Vec::new(),
            waiting: BTreeMap::new(),
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The batch being built.
    pub fn builder(&self) -> &BatchBuilder<T> {
        &self.builder
    }

    /// Reads from `start` on; records at or below `check_through` may be
    /// stored; `keys`: the route's key window, rebuilt for this owner.
    pub fn activate(&mut self, start: NextOffset, check_through: Option<Offset>, keys: Option<W>) {
        self.phase = Phase::Active;
        self.check_through = check_through;
        if keys.is_some() {
            self.keys = keys;
        }
        self.position = Some(start);
        self.acks = Some(AckTracker::new(start));
    }

    /// Whether the record at `offset` is for the batch being built;
    /// `waiting`: the partition waits (for a schema) to read it again.
    pub fn admit(&self, offset: Offset, waiting: bool) -> Admit {
        if self.phase != Phase::Active || waiting {
            return Admit::Ignore;
        }
        if self.position.is_some_and(|p| p.covers(offset)) {
            return Admit::Redelivered {
                expected: self.position,
            };
        }
        Admit::Take
    }

    /// The record at `offset` was admitted: the position moves past it.
    pub fn read(&mut self, offset: Offset) {
        self.position = Some(offset.next());
        self.acks
            .get_or_insert_with(|| AckTracker::new(NextOffset(offset.0)));
        if self.may_be_stored(offset) {
            self.uncertain = true;
        }
    }

    /// The offset after the last record taken (from the start once
    /// active).
    pub fn position(&self) -> Option<NextOffset> {
        self.position
    }

    /// Whether the record at `offset` may already be stored (an earlier
    /// owner's insert): only ClickHouse judges it.
    pub fn may_be_stored(&self, offset: Offset) -> bool {
        self.check_through.is_some_and(|c| offset <= c)
    }

    /// Whether the route of this partition decides rows by business key.
    pub fn keyed(&self) -> bool {
        self.keys.is_some()
    }

    /// The key window, on a route with key dedup.
    pub fn keys(&self) -> Option<&W> {
        self.keys.as_ref()
    }

    /// Appends the row `encode` writes for the record at `offset`.
    pub fn push<E>(
        &mut self,
        offset: Offset,
        now: T,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.builder.push(offset, now, encode)
    }

    /// On a keyed route: `encode` writes the row and returns its key (none:
    /// keyless, kept); the key window decides whether it is written, left
    /// out, or written on condition that the copy in flight is not stored.
    pub fn push_keyed<E>(
        &mut self,
        offset: Offset,
        ts_ms: Option<i64>,
        now: T,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<Option<KeyHash>, E>,
    ) -> Result<Keyed, E> {
        // Below the frontier every row is settled: stored, or rejected and
        // forgotten by the window.
        let settled = self
            .acks
            .as_ref()
            .map_or(NextOffset(offset.0), AckTracker::frontier);
        let (window, conditional, waiting) =
            (&mut self.keys, &mut self.conditional, &mut self.waiting);
        let mut keyless = false;
        let written = self.builder.push_or_skip(offset, now, |buf| {
            let Some(key) = encode(buf)? else {
                keyless = true;
                return Ok(true);
            };
            let Some(window) = window.as_mut() else {
                return Ok(true);
            };
            Ok(match window.decide(key, ts_ms, offset, settled) {
                Verdict::Write => true,
                Verdict::Drop => false,
                Verdict::WriteUnless { copy } => {
                    conditional.push((offset, copy));
                    *waiting.entry(copy).or_default() += 1;
                    true
                }
            })
        })?;
        Ok(match written {
            true => Keyed::Row { keyless },
            false => Keyed::Dropped,
        })
    }

    /// Accounts for the record at `offset` that yields no row (it goes to
    /// the DLQ).
    pub fn skip(&mut self, offset: Offset, now: T) {
        self.builder.skip(offset, now);
    }

    /// Cuts the batch being built, registered with the partition's acks.
    /// `None` if nothing is built (or nothing was ever read).
    pub fn cut(&mut self) -> Option<Cut> {
        let acks = self.acks.as_mut()?;
        let batch = self.builder.take()?;
        let end = batch
            .end_of(self.builder.partition().partition)
            .expect("a partition's batch accounts for it");
        Some(Cut {
            ticket: acks.register(end),
            end,
            batch,
            uncertain: std::mem::take(&mut self.uncertain),
            conditional: std::mem::take(&mut self.conditional),
        })
    }

    /// Drops the batch being built (the partition is given up: its next
    /// owner reads those records again).
    pub fn clear_building(&mut self) {
        self.builder.clear();
        self.uncertain = false;
    }

    /// The partition is revoked: it reads nothing more and drops what it
    /// built (its next owner reads those records again); its batches in
    /// flight go on, and once they have ended it hands off
    /// ([`Partition::hand_off`]). One that was not active yet has nothing
    /// to hand off and stays as it is (the caller lets it go).
    pub fn leave(&mut self) {
        self.clear_building();
        if self.phase == Phase::Active {
            self.phase = Phase::Leaving;
        }
    }

    /// Whether a leaving partition hands off now: once none of its
    /// batches is in flight, it commits its frontier and marks the
    /// register clean, both only while `live` (its lease: a new owner may
    /// be writing otherwise). `None` while it must wait, or if it is not
    /// leaving.
    pub fn hand_off(&self, live: bool) -> Option<HandOff> {
        if self.phase != Phase::Leaving || self.in_flight() > 0 {
            return None;
        }
        Some(HandOff {
            commit: self.to_commit(live),
            clean: live,
        })
    }

    /// The slice of a batch holding this partition's rows up to `ticket`
    /// ended; `copies`: the copies its conditional rows waited on;
    /// `durable`: its rows are stored (or in the DLQ), and `rejected`: the
    /// keys of those ClickHouse rejected, which no longer stand for their
    /// key. Returns, when durable, the offset below which no conditional
    /// row waits for a fate any more.
    pub fn settle(
        &mut self,
        ticket: Ticket,
        copies: &[Offset],
        durable: bool,
        rejected: impl IntoIterator<Item = (KeyHash, Offset)>,
    ) -> Option<NextOffset> {
        for copy in copies {
            if let Some(n) = self.waiting.get_mut(copy) {
                *n -= 1;
                if *n == 0 {
                    self.waiting.remove(copy);
                }
            }
        }
        if !durable {
            return None;
        }
        if let Some(window) = self.keys.as_mut() {
            for (key, offset) in rejected {
                window.forget(key, offset);
            }
        }
        let acks = self.acks.as_mut()?;
        acks.ack(ticket);
        let lowest = self.waiting.keys().next().map(|o| NextOffset(o.0));
        Some(lowest.map_or(acks.frontier(), |w| w.min(acks.frontier())))
    }

    /// Every record before it is durable (once a record was read).
    pub fn frontier(&self) -> Option<NextOffset> {
        self.acks.as_ref().map(AckTracker::frontier)
    }

    /// Batches cut and not yet ended.
    pub fn in_flight(&self) -> usize {
        self.acks.as_ref().map_or(0, AckTracker::in_flight)
    }

    /// The position to commit, if it moved and the partition may still
    /// write ([`AckTracker::to_commit`]).
    pub fn to_commit(&self, may_write: bool) -> Option<NextOffset> {
        self.acks
            .as_ref()
            .and_then(|a| a.to_commit(self.committed, may_write))
    }

    /// The group stored `at` as this partition's commit.
    pub fn committed(&mut self, at: NextOffset) {
        self.committed = Some(at);
    }

    /// Forgets the commit stored, so that [`Partition::to_commit`] offers
    /// the frontier again even if it has not moved: the group's commit
    /// may have been overwritten since (a revoked owner's late commit) or
    /// lost (a coordinator's failover).
    pub fn recommit(&mut self) {
        self.committed = None;
    }

    /// The commit the group last stored from this partition.
    pub fn last_committed(&self) -> Option<NextOffset> {
        self.committed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::deadline::Millis as Ms;

    fn part(phase: Phase) -> Partition<Ms> {
        let id = PartitionId {
            topic: "t".into(),
            partition: 0,
        };
        let limits = BatchLimits {
            max_rows: 1000,
            max_bytes: 1 << 20,
            max_age: Duration::from_secs(60),
            aligned: false,
        };
        Partition::new(id, limits, 1, phase)
    }

    fn row(p: &mut Partition<Ms>, offset: i64) {
        assert_eq!(p.admit(Offset(offset), false), Admit::Take);
        p.read(Offset(offset));
        p.push(Offset(offset), Ms(0), |b| {
            b.push(b'x');
            Ok::<(), ()>(())
        })
        .expect("pushed");
    }

    #[test]
    fn a_preparing_partition_takes_nothing_and_an_active_one_nothing_twice() {
        let mut p = part(Phase::Preparing);
        assert_eq!(p.admit(Offset(5), false), Admit::Ignore);
        p.activate(NextOffset(5), None, None);
        assert_eq!(
            p.admit(Offset(4), false),
            Admit::Redelivered {
                expected: Some(NextOffset(5))
            }
        );
        assert_eq!(p.admit(Offset(5), true), Admit::Ignore);
        row(&mut p, 5);
        assert_eq!(
            p.admit(Offset(5), false),
            Admit::Redelivered {
                expected: Some(NextOffset(6))
            }
        );
        assert_eq!(p.admit(Offset(9), false), Admit::Take);
    }

    #[test]
    fn a_cut_is_committed_once_its_slice_is_durable_and_in_order() {
        let mut p = part(Phase::Preparing);
        p.activate(NextOffset(0), Some(Offset(0)), None);
        assert_eq!(p.to_commit(true), Some(NextOffset(0)), "the start, once");
        p.committed(NextOffset(0));
        assert_eq!(p.to_commit(true), None);
        row(&mut p, 0);
        let first = p.cut().expect("a batch");
        assert!(first.uncertain, "offset 0 may be stored");
        row(&mut p, 1);
        let second = p.cut().expect("a batch");
        assert!(!second.uncertain);
        assert_eq!((first.end, second.end), (NextOffset(1), NextOffset(2)));
        assert_eq!(p.in_flight(), 2);
        assert_eq!(p.settle(second.ticket, &[], true, []), Some(NextOffset(0)));
        assert_eq!(p.to_commit(true), None, "the first batch is not durable");
        assert_eq!(p.settle(first.ticket, &[], false, []), None);
        assert_eq!(p.to_commit(true), None, "a slice given up moves nothing");
        assert_eq!(p.settle(first.ticket, &[], true, []), Some(NextOffset(2)));
        assert_eq!(p.to_commit(false), None, "not without a live lease");
        assert_eq!(p.to_commit(true), Some(NextOffset(2)));
        assert_eq!(p.in_flight(), 0);
    }

    #[test]
    fn a_repeated_key_in_flight_is_written_on_condition_and_waits_for_its_copy() {
        let mut p = part(Phase::Preparing);
        p.activate(
            NextOffset(1),
            None,
            Some(KeyWindow::new(Duration::from_secs(60), 100)),
        );
        let key: KeyHash = 7;
        let keyed = |p: &mut Partition<Ms>, o: i64, k: Option<KeyHash>| {
            p.read(Offset(o));
            p.push_keyed(Offset(o), Some(1_000), Ms(0), |b| {
                b.push(b'x');
                Ok::<_, ()>(k)
            })
            .expect("pushed")
        };
        assert_eq!(keyed(&mut p, 1, Some(key)), Keyed::Row { keyless: false });
        let first = p.cut().expect("a batch");
        assert_eq!(keyed(&mut p, 2, Some(key)), Keyed::Row { keyless: false });
        assert_eq!(keyed(&mut p, 3, None), Keyed::Row { keyless: true });
        let second = p.cut().expect("a batch");
        assert_eq!(second.conditional, [(Offset(2), Offset(1))]);
        // The first copy is stored: fates of conditional rows below 1 go.
        assert_eq!(p.settle(first.ticket, &[], true, []), Some(NextOffset(1)));
        assert_eq!(
            p.settle(second.ticket, &[Offset(1)], true, []),
            Some(NextOffset(4))
        );
        // Stored now, within the window: a third copy is left out.
        assert_eq!(keyed(&mut p, 4, Some(key)), Keyed::Dropped);
        let third = p.cut().expect("the skipped offset is accounted for");
        assert!(third.batch.is_empty());
        // A rejected copy no longer stands for its key.
        assert_eq!(
            p.settle(third.ticket, &[], true, [(key, Offset(2))]),
            Some(NextOffset(5))
        );
        assert_eq!(keyed(&mut p, 5, Some(key)), Keyed::Row { keyless: false });
    }

    #[test]
    fn a_revoked_partition_hands_off_once_its_batches_have_ended() {
        let mut p = part(Phase::Preparing);
        p.leave();
        assert_eq!(p.phase(), Phase::Preparing, "nothing to hand off");
        assert_eq!(p.hand_off(true), None);
        p.activate(NextOffset(0), None, None);
        row(&mut p, 0);
        let first = p.cut().expect("a batch");
        row(&mut p, 1);
        assert_eq!(p.hand_off(true), None, "not leaving");
        p.leave();
        assert_eq!(p.phase(), Phase::Leaving);
        assert!(p.cut().is_none(), "what was built is the next owner's");
        assert_eq!(p.admit(Offset(2), false), Admit::Ignore);
        assert_eq!(p.hand_off(true), None, "a batch is in flight");
        p.settle(first.ticket, &[], true, []);
        let expected = HandOff {
            commit: Some(NextOffset(1)),
            clean: true,
        };
        assert_eq!(p.hand_off(true), Some(expected));
        let expired = HandOff {
            commit: None,
            clean: false,
        };
        assert_eq!(p.hand_off(false), Some(expired), "a lease run out");
    }

    #[test]
    fn a_cleared_partition_sends_nothing_of_what_it_built() {
        let mut p = part(Phase::Preparing);
        p.activate(NextOffset(0), Some(Offset(0)), None);
        row(&mut p, 0);
        p.clear_building();
        assert!(p.cut().is_none());
        row(&mut p, 1);
        assert!(
            !p.cut().expect("a batch").uncertain,
            "offset 0 went with what was built"
        );
    }
}
