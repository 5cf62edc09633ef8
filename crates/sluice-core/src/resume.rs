//! Committed offset + ClickHouse watermark → where a new owner starts reading.
//!
//! In: the partition's committed position in Kafka (if any) and the highest
//! offset stored in ClickHouse (if any). Out: a [`ResumePlan`].
//!
//! sluice commits a position only after every record before it is durable,
//! so the commit is a lower bound of what ClickHouse holds. The watermark is
//! an upper bound: an insert that was cut short (several parts, a crash
//! mid-insert, batches completing out of order) can leave gaps below it.
//! Records between the two are therefore read again and checked against
//! ClickHouse before insert ("reconciled"); records after the watermark are
//! new. Nothing is skipped on the strength of the watermark alone.

use crate::offset::{NextOffset, Offset};

/// Where to start reading a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// At this position.
    At(NextOffset),
    /// At the consumer's reset policy (nothing was ever committed).
    Reset,
}

/// Where to start, and up to which offset records must be reconciled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumePlan {
    pub start: StartAt,
    /// Records at or below this offset may already be in ClickHouse.
    pub check_through: Option<Offset>,
}

impl ResumePlan {
    /// The offsets that may already be stored, `(first, last)`, when they
    /// can be counted: the plan starts at a known position.
    pub fn zone(&self) -> Option<(Offset, Offset)> {
        match (self.start, self.check_through) {
            (StartAt::At(c), Some(w)) if !c.covers(w) => Some((Offset(c.0), w)),
            _ => None,
        }
    }

    /// Tightens the plan with the number of distinct offsets ClickHouse holds
    /// in [`Self::zone`]. If every integer offset of the zone is present,
    /// nothing in it can be missing, so reading starts after it. Otherwise
    /// (a gap in the data, or in the log itself) the plan stays as it is and
    /// the zone is reconciled record by record.
    pub fn with_zone_count(self, distinct: u64) -> ResumePlan {
        match self.zone() {
            Some((first, last)) if distinct == (last.0 - first.0 + 1) as u64 => ResumePlan {
                start: StartAt::At(last.next()),
                check_through: None,
            },
            _ => self,
        }
    }
}

/// The plan for a partition with `committed` position and `watermark`.
pub fn resume_plan(committed: Option<NextOffset>, watermark: Option<Offset>) -> ResumePlan {
    let start = committed.map_or(StartAt::Reset, StartAt::At);
    let check_through = match (committed, watermark) {
        (_, None) => None,
        (Some(c), Some(w)) if !c.covers(w) => Some(w),
        (Some(_), Some(_)) => None,
        (None, Some(w)) => Some(w),
    };
    ResumePlan {
        start,
        check_through,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans() {
        let p = |c: Option<i64>, w: Option<i64>| resume_plan(c.map(NextOffset), w.map(Offset));
        assert_eq!(
            p(None, None),
            ResumePlan {
                start: StartAt::Reset,
                check_through: None
            }
        );
        assert_eq!(
            p(Some(10), None),
            ResumePlan {
                start: StartAt::At(NextOffset(10)),
                check_through: None
            }
        );
        // Everything up to the watermark is read again and checked.
        assert_eq!(
            p(Some(10), Some(25)),
            ResumePlan {
                start: StartAt::At(NextOffset(10)),
                check_through: Some(Offset(25))
            }
        );
        assert_eq!(
            p(Some(10), Some(10)),
            ResumePlan {
                start: StartAt::At(NextOffset(10)),
                check_through: Some(Offset(10))
            }
        );
        // The commit is past the watermark: nothing to check.
        assert_eq!(
            p(Some(10), Some(9)),
            ResumePlan {
                start: StartAt::At(NextOffset(10)),
                check_through: None
            }
        );
        assert_eq!(
            p(None, Some(9)),
            ResumePlan {
                start: StartAt::Reset,
                check_through: Some(Offset(9))
            }
        );
    }

    #[test]
    fn a_complete_zone_is_skipped_and_a_gap_is_not() {
        let plan = resume_plan(Some(NextOffset(10)), Some(Offset(25)));
        assert_eq!(plan.zone(), Some((Offset(10), Offset(25))));
        assert_eq!(
            plan.with_zone_count(16),
            ResumePlan {
                start: StartAt::At(NextOffset(26)),
                check_through: None
            }
        );
        assert_eq!(plan.with_zone_count(15), plan);
        // No known start: nothing to count.
        let reset = resume_plan(None, Some(Offset(9)));
        assert_eq!(reset.zone(), None);
        assert_eq!(reset.with_zone_count(10), reset);
    }
}
