//! Committed offset + ClickHouse watermark + the log's bounds → where a new
//! owner starts reading.
//!
//! In: what the group committed for the partition ([`Committed`]: a
//! position, nothing, or unknown because it could not be read), the highest
//! offset stored in ClickHouse (if any), the partition's [`LogBounds`] and
//! the [`ResetPolicy`]. Out: a [`ResumePlan`], a concrete start position
//! inside the log and the offsets to check before they are inserted.
//!
//! What ClickHouse holds decides. sluice commits a position only after every
//! record before it is durable, so a commit is a lower bound of what
//! ClickHouse holds. The watermark is an upper bound: an insert that was cut
//! short (several parts, a crash mid-insert, batches completing out of
//! order) can leave gaps below it. Records between the two are therefore
//! read again and checked against ClickHouse before insert ("reconciled");
//! records after the watermark are new. Nothing is skipped on the strength
//! of the watermark alone.
//!
//! Without a commit (it expired, the group id is new, or it could not be
//! read) the lower bound is the log's beginning: the plan reads from there
//! and reconciles everything up to the watermark, unless ClickHouse holds
//! every offset of that range ([`ResumePlan::with_zone_count`]). The reset
//! policy applies only where ClickHouse holds nothing for the partition and
//! the group is known to have committed nothing; an unknown commit never
//! jumps to the log's end.
//!
//! Guarantees, tested as properties below: the start lies within the log;
//! it never passes an offset at or below the watermark that ClickHouse does
//! not hold (unless a commit vouches for it); every offset from the start on
//! that ClickHouse may hold is checked before it is inserted.

use crate::offset::{NextOffset, Offset};

/// What the group's committed offsets say about a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Committed {
    /// The group has no position for the partition.
    Nothing,
    /// The group's committed position.
    At(NextOffset),
    /// The committed offsets could not be read.
    Unknown,
}

/// Where to start when neither the group nor ClickHouse knows anything:
/// Kafka's `auto.offset.reset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResetPolicy {
    /// The log's first record.
    Earliest,
    /// The log's end: only records produced from now on.
    Latest,
}

impl ResetPolicy {
    /// Kafka's name for it (`auto.offset.reset`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Earliest => "earliest",
            Self::Latest => "latest",
        }
    }

    /// `earliest` or `latest`.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Earliest, Self::Latest]
            .into_iter()
            .find(|p| p.as_str() == s)
    }
}

/// A partition's log: the position of its first record and the position
/// after its last one (Kafka's low and high watermarks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LogBounds {
    pub low: NextOffset,
    pub high: NextOffset,
}

/// Where to start, and up to which offset records must be reconciled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResumePlan {
    /// The first record to read; within the log's bounds.
    pub start: NextOffset,
    /// Records at or below this offset may already be in ClickHouse.
    pub check_through: Option<Offset>,
    /// The last offset of the zone that may be counted: the watermark, or
    /// the log's last record if that is lower.
    zone_last: Option<Offset>,
}

impl ResumePlan {
    /// The offsets from the start that may already be stored and exist in
    /// the log, `(first, last)`: if ClickHouse holds all of them, nothing
    /// there needs reading again.
    pub fn zone(&self) -> Option<(Offset, Offset)> {
        self.zone_last
            .filter(|last| !self.start.covers(*last))
            .map(|last| (Offset(self.start.0), last))
    }

    /// Tightens the plan with the number of distinct offsets ClickHouse holds
    /// in [`Self::zone`]. If every integer offset of the zone is present,
    /// nothing in it can be missing, so reading starts after it. Otherwise
    /// (a gap in the data, or in the log itself) the plan stays as it is and
    /// the zone is reconciled record by record.
    pub fn with_zone_count(self, distinct: u64) -> ResumePlan {
        match self.zone() {
            Some((first, last)) if distinct == (last.0 - first.0 + 1) as u64 => ResumePlan {
                start: last.next(),
                // Only a watermark past the log's end leaves anything to check.
                check_through: self.check_through.filter(|w| *w > last),
                zone_last: None,
            },
            _ => self,
        }
    }
}

/// The plan for a partition: what the group `committed`, the highest offset
/// ClickHouse holds (`watermark`), the partition's `log` and the `reset`
/// policy.
pub fn resume_plan(
    committed: Committed,
    watermark: Option<Offset>,
    log: LogBounds,
    reset: ResetPolicy,
) -> ResumePlan {
    let wanted = match (committed, watermark) {
        (Committed::At(c), _) => c,
        // Nothing anywhere: the operator's policy.
        (Committed::Nothing, None) => match reset {
            ResetPolicy::Earliest => log.low,
            ResetPolicy::Latest => log.high,
        },
        // ClickHouse holds rows but no commit vouches for any of them, or
        // the commit is unknown: from the beginning, and reconcile.
        (Committed::Nothing, Some(_)) | (Committed::Unknown, _) => log.low,
    };
    // A position outside the log makes the client fall back on its reset
    // policy; clamp instead. Below the low watermark the records are gone.
    let start = wanted.max(log.low).min(log.high.max(log.low));
    let check_through = watermark.filter(|w| !start.covers(*w));
    let zone_last = match (check_through, log.high.last()) {
        (Some(w), Some(end)) => Some(w.min(end)),
        _ => None,
    };
    ResumePlan {
        start,
        check_through,
        zone_last,
    }
}

/// The log and what sluice knows of a partition disagree: the offsets of
/// the rows in ClickHouse or of the group's commit do not exist in this
/// log. The topic was deleted and created again, its log was truncated
/// (an unclean leader election), or the cluster was migrated. Reading on
/// would take the table's rows for records of this log and skip them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mismatch {
    /// The group's commit is [`MISMATCH_MARK`]: an earlier start found a
    /// mismatch and marked the partition, so that a log that has grown
    /// past the old offsets since does not pass unnoticed.
    Marked,
    /// ClickHouse holds `watermark`, at or past the log's end.
    RowsPastLogEnd { watermark: Offset, high: NextOffset },
    /// The group committed `committed`, past the log's end.
    CommitPastLogEnd {
        committed: NextOffset,
        high: NextOffset,
    },
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Marked => write!(
                f,
                "an earlier start found that this partition's offsets went back and marked it \
                 (the group's commit is {MISMATCH_MARK}); it stays marked until the group's \
                 offsets are reset"
            ),
            Self::RowsPastLogEnd { watermark, high } => write!(
                f,
                "ClickHouse holds rows up to offset {watermark} but the log ends before {high} \
                 (its high watermark)"
            ),
            Self::CommitPastLogEnd { committed, high } => write!(
                f,
                "the group committed {committed} but the log ends before {high} (its high watermark)"
            ),
        }
    }
}

/// The position sluice commits for a partition whose log it found not to
/// be the one its rows came from: past any log's end, so every later start
/// stops there too until the operator resets the group's offsets.
pub const MISMATCH_MARK: NextOffset = NextOffset(i64::MAX);

/// Whether `log` can be the log the table's rows (up to `watermark`, when
/// they decide where to start) and the group's commit came from. Offsets
/// only grow: a row or a commit at or past the high watermark names a
/// record this log never had. A lower watermark cannot be told apart from
/// a recreated topic that has grown past the old offsets.
pub fn check_log(
    committed: Committed,
    watermark: Option<Offset>,
    log: LogBounds,
) -> Result<(), Mismatch> {
    if let Some(w) = watermark.filter(|w| !log.high.covers(*w)) {
        return Err(Mismatch::RowsPastLogEnd {
            watermark: w,
            high: log.high,
        });
    }
    match committed {
        Committed::At(MISMATCH_MARK) => Err(Mismatch::Marked),
        Committed::At(c) if c > log.high => Err(Mismatch::CommitPastLogEnd {
            committed: c,
            high: log.high,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn log(low: i64, high: i64) -> LogBounds {
        LogBounds {
            low: NextOffset(low),
            high: NextOffset(high),
        }
    }

    fn at(n: i64) -> Committed {
        Committed::At(NextOffset(n))
    }

    /// `(start, check_through)` of a plan.
    fn sc(p: ResumePlan) -> (i64, Option<i64>) {
        (p.start.0, p.check_through.map(|o| o.0))
    }

    #[test]
    fn with_a_commit_everything_up_to_the_watermark_is_checked() {
        let l = log(0, 100);
        let p = |c, w: Option<i64>| sc(resume_plan(c, w.map(Offset), l, ResetPolicy::Latest));
        assert_eq!(p(at(10), None), (10, None));
        assert_eq!(p(at(10), Some(25)), (10, Some(25)));
        assert_eq!(p(at(10), Some(10)), (10, Some(10)));
        // The commit is past the watermark: nothing to check.
        assert_eq!(p(at(10), Some(9)), (10, None));
    }

    #[test]
    fn nothing_anywhere_follows_the_reset_policy() {
        let l = log(40, 100);
        let p = |c, r| sc(resume_plan(c, None, l, r));
        assert_eq!(p(Committed::Nothing, ResetPolicy::Earliest), (40, None));
        assert_eq!(p(Committed::Nothing, ResetPolicy::Latest), (100, None));
        // Not knowing what was committed is not knowing that nothing was.
        assert_eq!(p(Committed::Unknown, ResetPolicy::Latest), (40, None));
        assert_eq!(p(Committed::Unknown, ResetPolicy::Earliest), (40, None));
    }

    /// Issue 11, item 5: the commits are gone, ClickHouse holds 0..=499 of
    /// a 1,000-record log, the policy says `latest`.
    #[test]
    fn a_lost_commit_with_rows_in_clickhouse_reads_from_the_beginning() {
        for c in [Committed::Nothing, Committed::Unknown] {
            let plan = resume_plan(c, Some(Offset(499)), log(0, 1000), ResetPolicy::Latest);
            assert_eq!(sc(plan), (0, Some(499)));
            assert_eq!(plan.zone(), Some((Offset(0), Offset(499))));
            // All 500 present: start after them, nothing to check.
            assert_eq!(sc(plan.with_zone_count(500)), (500, None));
            // A gap: read from the beginning and reconcile.
            assert_eq!(plan.with_zone_count(499), plan);
        }
        // Retention removed the first 100 records: the zone starts at the log.
        let plan = resume_plan(
            Committed::Nothing,
            Some(Offset(499)),
            log(100, 1000),
            ResetPolicy::Latest,
        );
        assert_eq!(plan.zone(), Some((Offset(100), Offset(499))));
        assert_eq!(sc(plan.with_zone_count(400)), (500, None));
        // Everything ClickHouse holds is gone from the log.
        let plan = resume_plan(
            Committed::Nothing,
            Some(Offset(499)),
            log(600, 1000),
            ResetPolicy::Latest,
        );
        assert_eq!((sc(plan), plan.zone()), ((600, None), None));
    }

    #[test]
    fn a_complete_zone_is_skipped_and_a_gap_is_not() {
        let plan = resume_plan(at(10), Some(Offset(25)), log(0, 100), ResetPolicy::Earliest);
        assert_eq!(plan.zone(), Some((Offset(10), Offset(25))));
        assert_eq!(sc(plan.with_zone_count(16)), (26, None));
        assert_eq!(plan.with_zone_count(15), plan);
        // Nothing to check: nothing to count.
        let none = resume_plan(at(30), Some(Offset(25)), log(0, 100), ResetPolicy::Earliest);
        assert_eq!(none.zone(), None);
        assert_eq!(none.with_zone_count(0), none);
    }

    #[test]
    fn the_start_stays_inside_the_log() {
        // A commit below the low watermark: those records are gone.
        let p = resume_plan(at(5), Some(Offset(30)), log(20, 100), ResetPolicy::Latest);
        assert_eq!(
            (sc(p), p.zone()),
            ((20, Some(30)), Some((Offset(20), Offset(30))))
        );
        // A commit past the log's end (the log was truncated).
        let p = resume_plan(at(150), None, log(20, 100), ResetPolicy::Earliest);
        assert_eq!(sc(p), (100, None));
        // ClickHouse holds offsets the log does not have (yet): the zone
        // ends with the log, the check goes on to the watermark.
        let p = resume_plan(
            at(90),
            Some(Offset(120)),
            log(0, 100),
            ResetPolicy::Earliest,
        );
        assert_eq!(p.zone(), Some((Offset(90), Offset(99))));
        assert_eq!(sc(p.with_zone_count(10)), (100, Some(120)));
        // An empty log.
        let p = resume_plan(
            Committed::Nothing,
            Some(Offset(9)),
            log(10, 10),
            ResetPolicy::Latest,
        );
        assert_eq!((sc(p), p.zone()), ((10, None), None));
    }

    #[test]
    fn rows_or_a_commit_past_the_log_end_are_a_mismatch() {
        // The recreated topic: rows 0..=99, a new log of 50.
        assert_eq!(
            check_log(Committed::Nothing, Some(Offset(99)), log(0, 50)),
            Err(Mismatch::RowsPastLogEnd {
                watermark: Offset(99),
                high: NextOffset(50)
            })
        );
        // The last row at the last offset is the normal case; one past it not.
        assert_eq!(check_log(at(100), Some(Offset(99)), log(0, 100)), Ok(()));
        assert!(check_log(at(100), Some(Offset(100)), log(0, 100)).is_err());
        // A commit at the end is normal; past it (a truncated log) not.
        assert_eq!(check_log(at(100), None, log(0, 100)), Ok(()));
        assert_eq!(
            check_log(at(150), None, log(0, 100)),
            Err(Mismatch::CommitPastLogEnd {
                committed: NextOffset(150),
                high: NextOffset(100)
            })
        );
        // Marked by an earlier start, whatever the log holds now.
        assert_eq!(
            check_log(Committed::At(MISMATCH_MARK), None, log(0, 1_000_000)),
            Err(Mismatch::Marked)
        );
        // An empty new log and rows of the old one.
        assert!(check_log(Committed::Unknown, Some(Offset(0)), log(0, 0)).is_err());
        // Retention past the commit is not a mismatch: the records are gone.
        assert_eq!(check_log(at(5), Some(Offset(30)), log(20, 100)), Ok(()));
        let m = check_log(Committed::Nothing, Some(Offset(99)), log(0, 50)).unwrap_err();
        assert_eq!(
            m.to_string(),
            "ClickHouse holds rows up to offset 99 but the log ends before 50 (its high watermark)"
        );
    }

    /// A partition as the planner meets it.
    #[derive(Debug, Clone)]
    struct World {
        low: i64,
        high: i64,
        /// Offsets ClickHouse holds (some may be below `low`, retention
        /// having removed their records since).
        held: BTreeSet<i64>,
        committed: Committed,
        reset: ResetPolicy,
    }

    impl World {
        fn watermark(&self) -> Option<Offset> {
            self.held.last().copied().map(Offset)
        }

        /// The plan as the sink makes it: planned, then tightened with the
        /// count ClickHouse gives for the zone.
        fn plan(&self) -> ResumePlan {
            let plan = resume_plan(
                self.committed,
                self.watermark(),
                log(self.low, self.high),
                self.reset,
            );
            match plan.zone() {
                Some((f, l)) => plan.with_zone_count(self.held.range(f.0..=l.0).count() as u64),
                None => plan,
            }
        }

        /// Records in the log that ClickHouse does not hold.
        fn missing(&self) -> impl Iterator<Item = i64> + '_ {
            (self.low..self.high).filter(|o| !self.held.contains(o))
        }
    }

    fn world() -> impl Strategy<Value = World> {
        (
            0i64..30,
            0i64..40,
            prop::collection::btree_set(0i64..80, 0..60),
            0u8..3,
            0i64..80,
            any::<bool>(),
        )
            .prop_map(|(low, len, held, kind, c, latest)| {
                let high = low + len;
                // A commit keeps its contract: every record before it is
                // held (or was sent to the DLQ, which this model leaves out).
                let first_missing = (low..).find(|o| !held.contains(o)).unwrap_or(low);
                let committed = match kind {
                    0 => Committed::Nothing,
                    1 => Committed::Unknown,
                    _ => at(c.min(first_missing).min(high)),
                };
                World {
                    low,
                    high,
                    held,
                    committed,
                    reset: if latest {
                        ResetPolicy::Latest
                    } else {
                        ResetPolicy::Earliest
                    },
                }
            })
    }

    proptest! {
        #[test]
        fn the_log_check_refuses_exactly_the_worlds_past_the_log_end(w in world()) {
            let past = w.watermark().is_some_and(|o| o.0 >= w.high)
                || matches!(w.committed, Committed::At(c) if c.0 > w.high);
            prop_assert_eq!(
                check_log(w.committed, w.watermark(), log(w.low, w.high)).is_err(),
                past
            );
        }

        #[test]
        fn the_start_is_inside_the_log(w in world()) {
            let p = w.plan();
            prop_assert!(w.low <= p.start.0 && p.start.0 <= w.high, "{p:?}");
        }

        #[test]
        fn the_start_never_passes_a_missing_offset_at_or_below_the_watermark(w in world()) {
            let p = w.plan();
            let wm = w.watermark().map_or(-1, |o| o.0);
            for o in w.missing().filter(|o| *o <= wm) {
                prop_assert!(p.start.0 <= o, "skips {o}: {p:?}");
            }
        }

        #[test]
        fn an_unknown_commit_never_skips_a_record_clickhouse_lacks(w in world()) {
            prop_assume!(w.committed == Committed::Unknown);
            let p = w.plan();
            if let Some(o) = w.missing().next() {
                prop_assert!(p.start.0 <= o, "skips {o}: {p:?}");
            }
        }

        #[test]
        fn every_stored_offset_read_again_is_checked(w in world()) {
            let p = w.plan();
            for o in w.held.range(p.start.0..) {
                prop_assert!(p.check_through.is_some_and(|c| *o <= c.0), "{o} unchecked: {p:?}");
            }
        }

        #[test]
        fn with_nothing_in_clickhouse_the_reset_policy_applies(mut w in world()) {
            w.held.clear();
            w.committed = Committed::Nothing;
            let p = w.plan();
            let want = match w.reset {
                ResetPolicy::Earliest => w.low,
                ResetPolicy::Latest => w.high,
            };
            prop_assert_eq!((p.start.0, p.check_through), (want, None));
        }

        #[test]
        fn a_commit_is_never_gone_behind(w in world()) {
            let p = w.plan();
            if let Committed::At(c) = w.committed {
                prop_assert!(p.start >= c.max(NextOffset(w.low)).min(NextOffset(w.high)), "{p:?}");
            }
        }
    }
}
