//! One batch's attempts: which need a fence and a reconciliation first.
//!
//! In: what each attempt's answer meant ([`Answer`]). Out: before the next
//! attempt, whether ClickHouse may already hold some of the batch's rows
//! ([`Attempts::reconcile`]), and which earlier attempt must be fenced
//! before it is asked ([`Attempts::fence`]): one whose outcome is unknown
//! may still commit, so asking before it is fenced proves nothing.
//!
//! Which rows an attempt holds: the batch without the rows ClickHouse
//! rejected and the conditional rows of key dedup left out
//! ([`rows_left`]).
//!
//! In exactly-once mode a batch is never re-sent blind: after an unknown
//! outcome, or a rejection that may have stored part of it, the next
//! attempt fences the last unsettled attempt, asks which rows are present
//! and sends only the rest. In the other modes every attempt sends the same
//! bytes and nothing is tracked.

use crate::batch::{Batch, Row};

/// What one attempt's answer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// Stored: the batch is durable.
    Stored,
    /// Nothing was sent (the connection was refused).
    NotSent,
    /// A row was rejected (it goes to the DLQ); the rest may be stored.
    Rejected,
    /// Refused before it started, for overload (a code in
    /// [`REFUSED_AT_START`]): nothing of it runs. Not fenced (a fence costs
    /// `insert_timeout` here, under overload); an earlier attempt may have
    /// stored rows, so the next one asks first.
    Refused,
    /// Refused as past its deadline. This request did not run, but another
    /// copy of it may (a proxy that retried it): fenced like an unknown
    /// outcome, which costs little, the deadline being past.
    TooLate,
    /// Anything else (a timeout, a reset, a 5xx, a retriable code nobody
    /// listed): it may still commit.
    Unknown,
}

/// Retriable answers a query gives before it starts work, for overload.
pub const REFUSED_AT_START: &[u32] = &[
    202, // TOO_MANY_SIMULTANEOUS_QUERIES
    203, // NO_FREE_CONNECTION
    // TOO_MANY_PARTS. Also "too many partitions for single INSERT block",
    // which a later block of a long insert can raise after earlier blocks
    // were stored: safe here too, a refusal makes the next attempt ask.
    252,
];

/// An attempt whose outcome is unknown: its query id and its deadline on
/// the server's clock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Unsettled {
    pub query_id: String,
    pub deadline_ms: i64,
}

/// The attempts of one batch so far.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attempts {
    exactly_once: bool,
    sent: u32,
    uncertain: bool,
    previous: Option<Unsettled>,
}

impl Attempts {
    /// A batch some of whose rows may already be stored (`uncertain`: read
    /// again after a restart) reconciles before its first attempt.
    pub fn new(exactly_once: bool, uncertain: bool) -> Self {
        Self {
            exactly_once,
            sent: 0,
            uncertain: exactly_once && uncertain,
            previous: None,
        }
    }

    /// The number of the next attempt, counted from 0.
    pub fn next(&self) -> u32 {
        self.sent
    }

    /// Whether the next attempt first asks which rows are present.
    pub fn reconcile(&self) -> bool {
        self.uncertain
    }

    /// The attempt to fence before asking, if any.
    pub fn fence(&self) -> Option<&Unsettled> {
        self.previous.as_ref().filter(|_| self.uncertain)
    }

    /// The attempt to fence was fenced and the rows present were asked:
    /// it can no longer commit, and what it stored is known.
    pub fn reconciled(&mut self) {
        self.previous = None;
    }

    /// Attempt [`Self::next`] was sent with this query id and deadline
    /// (none outside exactly-once), and answered. Anything but a store or
    /// a refused connection makes the batch uncertain; an unknown outcome,
    /// or a refusal as late, leaves the attempt to fence.
    pub fn answered(&mut self, query_id: String, deadline_ms: Option<i64>, answer: Answer) {
        self.sent += 1;
        if !self.exactly_once {
            return;
        }
        match answer {
            Answer::Stored | Answer::NotSent => {}
            Answer::Rejected | Answer::Refused => self.uncertain = true,
            Answer::TooLate | Answer::Unknown => {
                self.uncertain = true;
                self.previous = deadline_ms.map(|deadline_ms| Unsettled {
                    query_id,
                    deadline_ms,
                });
            }
        }
    }
}

/// The rows of `batch` its next attempt holds: all but those ClickHouse
/// `rejected` (they went to the DLQ) and the conditional rows `excluded`
/// (a copy of their key is covered: [`crate::dedup::conditional_excluded`]);
/// both ascending. Its end stays the batch's: it still accounts for every
/// record.
pub fn rows_left(batch: &Batch, rejected: &[Row], excluded: &[Row]) -> Batch {
    if rejected.is_empty() && excluded.is_empty() {
        return batch.clone();
    }
    let mut out: Vec<Row> = rejected.iter().chain(excluded).copied().collect();
    out.sort_unstable();
    batch.without(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_leaves_out_rejected_and_excluded_rows() {
        let batch = crate::batch::numbered(10..15);
        let o = |o| Row::new(0, o);
        let left = rows_left(&batch, &[o(11), o(14)], &[o(12)]);
        assert_eq!(left.rows().collect::<Vec<_>>(), [o(10), o(13)]);
        assert_eq!(left.body().as_ref(), b"10\n13\n");
        assert_eq!(left.ends(), batch.ends());
        let all = rows_left(&batch, &[], &[]);
        assert_eq!(all.rows().count(), 5);
    }

    #[test]
    fn an_unknown_outcome_is_fenced_then_reconciled() {
        let mut a = Attempts::new(true, false);
        assert!(!a.reconcile());
        a.answered("q0".into(), None, Answer::NotSent);
        assert!(!a.reconcile(), "nothing was sent");
        a.answered("q1".into(), Some(10), Answer::Unknown);
        assert!(a.reconcile());
        assert_eq!(a.fence().map(|u| u.query_id.as_str()), Some("q1"));
        assert_eq!(a.next(), 2);
        a.reconciled();
        assert_eq!(a.fence(), None);
        assert!(a.reconcile(), "every later attempt asks first");
        a.answered("q2".into(), Some(20), Answer::TooLate);
        assert_eq!(
            a.fence().map(|u| u.deadline_ms),
            Some(20),
            "refused as late: a copy may still run"
        );
        a.reconciled();
        for (q, answer) in [("q3", Answer::Rejected), ("q4", Answer::Refused)] {
            a.answered(q.into(), Some(30), answer);
            assert_eq!(a.fence(), None, "{answer:?}: the query ended, or never ran");
            assert!(a.reconcile());
        }
    }

    #[test]
    fn a_batch_read_again_reconciles_first() {
        let a = Attempts::new(true, true);
        assert!(a.reconcile());
        assert_eq!(a.fence(), None);
    }

    #[test]
    fn outside_exactly_once_nothing_is_tracked() {
        let mut a = Attempts::new(false, true);
        a.answered("q0".into(), None, Answer::Unknown);
        assert!(!a.reconcile());
        assert_eq!(a.fence(), None);
        assert_eq!(a.next(), 1);
    }
}
