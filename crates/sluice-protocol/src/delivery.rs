//! One batch → durable: the order of its attempts, as a machine.
//!
//! In: the batch (on a key-dedup route, with its conditional rows and the
//! copies in earlier batches that turned out not stored), then what each
//! step's I/O found: the rows a reconciliation found stored
//! ([`Delivery::reconciled`]), an attempt sent and its answer
//! ([`Delivery::sent`], [`Delivery::answered`]), rows ClickHouse rejected
//! ([`Delivery::reject`]), a server that takes fewer rows per insert
//! ([`Delivery::split`]). Out: the next step ([`Delivery::next`]): fence an
//! attempt that may still commit and ask which rows the table holds, insert
//! a share of the rows left, wait for an answer, or nothing more (durable).
//!
//! The sink's writer does each step's I/O and the model
//! (`sluice-model`) drives the same machine, so the order in which a batch
//! is fenced, reconciled and sent is the checked one. What the machine does
//! not decide is the caller's, and the same in both: an attempt starts only
//! under a live lease, with its deadline from [`crate::deadline`].
//!
//! In exactly-once mode a batch is never re-sent blind: after an unknown
//! outcome, a rejection or a refusal, the next attempt asks first
//! ([`Attempts`]). A row ClickHouse rejected is never sent again (it went
//! to the DLQ). A conditional row is left out once its copy is covered
//! ([`conditional_excluded`]). A server that refuses the rows of one insert
//! (too many table partitions, too large a body) gets shares of half as
//! many rows, each an insert of its own; a stored share is not sent again.

use crate::attempt::{rows_left, Answer, Attempts, Unsettled};
use crate::batch::{Batch, Row};
use crate::dedup::conditional_excluded;

/// One batch's way to the table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Delivery {
    batch: Batch,
    attempts: Attempts,
    /// Key dedup: `(row, copy)`, ascending: rows written on the condition
    /// that the copy of their key at `copy` is not stored.
    conditional: Vec<(Row, Row)>,
    /// Copies in earlier batches that conditional rows wait on and that
    /// turned out not stored.
    uncovered: Vec<Row>,
    /// Rows ClickHouse rejected (ascending): sent to the DLQ, never again.
    rejected: Vec<Row>,
    /// Rows earlier shares stored (ascending).
    stored: Vec<Row>,
    inserted: usize,
    /// Rows per insert, once the server took fewer than the rows left.
    per_insert: Option<usize>,
    /// The rows of the last attempt sent.
    last_share: usize,
    state: State,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum State {
    /// The next step is worked out from what is known.
    Ready,
    /// Reconciled: these rows are missing, and the next attempt sends them.
    Reconciled(Batch),
    /// An attempt is out; its answer is next.
    InFlight {
        share: Batch,
        whole: bool,
        query_id: String,
        deadline_ms: Option<i64>,
    },
    /// Every row is stored, rejected or left out.
    Durable,
}

/// What the caller does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Fence `fence` (an earlier attempt that may still commit) if any,
    /// then ask which rows of `rows` the table holds:
    /// [`Delivery::reconciled`].
    Reconcile {
        fence: Option<Unsettled>,
        rows: Batch,
    },
    /// Send `rows` as attempt `number` ([`Delivery::sent`]).
    Insert { rows: Batch, number: u32 },
    /// An attempt is out: [`Delivery::answered`].
    Waiting,
    /// Nothing left to send.
    Durable(Durable),
}

/// A batch whose rows are all stored, rejected or left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durable {
    /// Rows this delivery's attempts stored.
    pub inserted: usize,
    /// Rows ClickHouse rejected (ascending).
    pub rejected: Vec<Row>,
    /// Conditional rows left out, their copy being covered.
    pub excluded: usize,
}

/// What became of one partition's rows, taken out of a batch that goes on
/// ([`Delivery::settle_partition`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// Its rows ClickHouse rejected (ascending).
    pub rejected: Vec<Row>,
    /// Its conditional rows left out, their copy being covered.
    pub excluded: usize,
}

impl Delivery {
    /// A batch some of whose rows may already be stored (`uncertain`: read
    /// again after a restart) reconciles before its first attempt.
    pub fn new(batch: Batch, exactly_once: bool, uncertain: bool) -> Self {
        Self {
            batch,
            attempts: Attempts::new(exactly_once, uncertain),
            conditional: Vec::new(),
            uncovered: Vec::new(),
            rejected: Vec::new(),
            stored: Vec::new(),
            inserted: 0,
            per_insert: None,
            last_share: 0,
            state: State::Ready,
        }
    }

    /// Key dedup: the batch's conditional rows (`(row, copy)`, ascending),
    /// and the copies in earlier batches that turned out not stored (an
    /// earlier copy not named is covered).
    pub fn with_conditional(mut self, conditional: Vec<(Row, Row)>, uncovered: Vec<Row>) -> Self {
        self.conditional = conditional;
        self.uncovered = uncovered;
        self
    }

    /// Starts with shares of at most `rows` rows (what fitted the server
    /// last time, doubled).
    pub fn with_per_insert(mut self, rows: Option<usize>) -> Self {
        self.per_insert = rows.filter(|&n| n > 0);
        self
    }

    pub fn batch(&self) -> &Batch {
        &self.batch
    }

    /// Key dedup: the conditional rows, `(row, copy)`.
    pub fn conditional(&self) -> &[(Row, Row)] {
        &self.conditional
    }

    /// Rows ClickHouse rejected so far (ascending).
    pub fn rejected(&self) -> &[Row] {
        &self.rejected
    }

    /// Rows per insert, once the server took fewer than the rows left.
    pub fn per_insert(&self) -> Option<usize> {
        self.per_insert
    }

    /// The attempt out, if any: its query id and deadline.
    pub fn in_flight(&self) -> Option<(&str, Option<i64>)> {
        match &self.state {
            State::InFlight {
                query_id,
                deadline_ms,
                ..
            } => Some((query_id, *deadline_ms)),
            _ => None,
        }
    }

    /// The conditional rows the next attempt leaves out.
    fn excluded(&self) -> Vec<Row> {
        if self.conditional.is_empty() {
            return Vec::new();
        }
        let spans = self.batch.spans();
        let in_batch = |c: Row| spans.iter().any(|s| s.0 == c.partition && c.offset >= s.1);
        conditional_excluded(&self.conditional, in_batch, &self.rejected, |c| {
            !self.uncovered.contains(&c)
        })
    }

    /// The rows not yet rejected, left out or stored by an earlier share.
    fn rows_left(&self) -> Batch {
        let left = rows_left(&self.batch, &self.rejected, &self.excluded());
        if self.stored.is_empty() {
            left
        } else {
            left.without(&self.stored)
        }
    }

    /// The next attempt's rows, out of `rest`, and whether they are all of it.
    fn share(&self, rest: &Batch) -> (Batch, bool) {
        match self.per_insert {
            Some(n) if n < rest.len() => (rest.head(n), false),
            _ => (rest.clone(), true),
        }
    }

    /// The rows the next attempt sends, and whether they are all that is
    /// left; `None` when a reconciliation comes first or nothing is left.
    fn to_send(&self) -> Option<(Batch, bool)> {
        let rest = match &self.state {
            State::Reconciled(rest) => rest.clone(),
            State::Ready if !self.attempts.reconcile() => self.rows_left(),
            _ => return None,
        };
        (!rest.is_empty()).then(|| self.share(&rest))
    }

    pub fn next(&self) -> Next {
        match &self.state {
            State::InFlight { .. } => Next::Waiting,
            State::Durable => self.durable(),
            // Nothing left to send (every row stored, rejected or left
            // out): no attempt out can hold a row still to judge, and
            // nothing is asked.
            State::Ready if self.attempts.reconcile() && !self.rows_left().is_empty() => {
                Next::Reconcile {
                    fence: self.attempts.fence().cloned(),
                    rows: self.rows_left(),
                }
            }
            State::Ready | State::Reconciled(_) => match self.to_send() {
                Some((rows, _)) => Next::Insert {
                    rows,
                    number: self.attempts.next(),
                },
                None => self.durable(),
            },
        }
    }

    fn durable(&self) -> Next {
        Next::Durable(Durable {
            inserted: self.inserted,
            rejected: self.rejected.clone(),
            excluded: self.excluded().len(),
        })
    }

    /// The attempt to fence was fenced and the table holds `present` of
    /// the rows [`Next::Reconcile`] named (ascending): the next attempt
    /// sends the rest.
    pub fn reconciled(&mut self, present: &[Row]) {
        if self.state != State::Ready || !self.attempts.reconcile() {
            return;
        }
        let rest = self.rows_left().without(present);
        self.attempts.reconciled();
        self.state = State::Reconciled(rest);
    }

    /// The attempt [`Next::Insert`] named went out with this query id and
    /// deadline on the server's clock (none outside exactly-once). Sent
    /// when no insert was due (a caller's mistake), it is still an attempt
    /// whose answer counts: one that does not say stored is fenced and
    /// reconciled like any other, and nothing counts as stored by it. A
    /// batch durable, or with an attempt out, takes no other.
    pub fn sent(&mut self, query_id: String, deadline_ms: Option<i64>) {
        if matches!(self.state, State::Durable | State::InFlight { .. }) {
            return;
        }
        let (share, whole) = match self.to_send() {
            Some(due) => due,
            None => (self.rows_left().head(0), false),
        };
        self.last_share = share.len();
        self.state = State::InFlight {
            share,
            whole,
            query_id,
            deadline_ms,
        };
    }

    /// The attempt out was answered (or given up on: [`Answer::Unknown`]).
    pub fn answered(&mut self, answer: Answer) {
        let State::InFlight {
            share,
            whole,
            query_id,
            deadline_ms,
        } = std::mem::replace(&mut self.state, State::Ready)
        else {
            return;
        };
        self.attempts.answered(query_id, deadline_ms, answer);
        if answer != Answer::Stored {
            return;
        }
        self.inserted += share.len();
        if whole {
            self.state = State::Durable;
        } else {
            self.stored.extend(share.rows());
            self.stored.sort_unstable();
        }
    }

    /// ClickHouse rejected `rows` of the last attempt (after
    /// [`Self::answered`] with [`Answer::Rejected`]): they go to the DLQ
    /// and are never sent again. Rows of a partition dropped
    /// ([`Self::drop_partition`]) are not taken: the caller sends to the
    /// DLQ only rows [`Self::holds`] says are still this batch's.
    pub fn reject(&mut self, rows: impl IntoIterator<Item = Row>) {
        // A row of a partition dropped meanwhile is its next owner's.
        let rows: Vec<Row> = rows.into_iter().filter(|&r| self.holds(r)).collect();
        for o in rows {
            if let Err(at) = self.rejected.binary_search(&o) {
                self.rejected.insert(at, o);
            }
        }
        // What a reconciliation left to send may hold them.
        if let State::Reconciled(_) = self.state {
            self.state = State::Ready;
        }
    }

    /// Whether `row`'s partition is still this batch's (not dropped).
    pub fn holds(&self, row: Row) -> bool {
        self.batch.end_of(row.partition).is_some()
    }

    /// `partition` is no longer this process's to write (revoked with its
    /// lease run out, or taken): its rows leave the batch and are never
    /// sent again by it; the partition's next owner judges them. An
    /// attempt out that holds some of them is answered as any other (one
    /// whose outcome is unknown is fenced before the rest is sent), and
    /// what it stored is the next owner's to find.
    pub fn drop_partition(&mut self, partition: i32) {
        self.batch = self.batch.without_partition(partition);
        let other = |r: &Row| r.partition != partition;
        self.conditional.retain(|c| other(&c.0));
        for rows in [&mut self.uncovered, &mut self.rejected, &mut self.stored] {
            rows.retain(other);
        }
        if let State::Reconciled(rest) = &self.state {
            self.state = State::Reconciled(rest.without_partition(partition));
        }
    }

    /// Whether `partition`'s rows are settled while the rest of the batch
    /// may still be on its way: none is left to send, and no attempt out,
    /// or answered unknown and not yet fenced, can hold one (its rows would
    /// still be left to send). False for a partition the batch does not
    /// hold.
    pub fn settled(&self, partition: i32) -> bool {
        if self.batch.end_of(partition).is_none() {
            return false;
        }
        let none_in = |b: &Batch| b.rows_of(partition).next().is_none();
        match &self.state {
            State::Durable => true,
            State::Reconciled(rest) => none_in(rest),
            State::Ready | State::InFlight { .. } => none_in(&self.rows_left()),
        }
    }

    /// Of `live` (the partitions still in the batch), those that settle
    /// ahead of the rest: [`settled`](Self::settled) while another is
    /// still on its way. None when fewer than two are live, or when every
    /// one is settled (the batch is durable: they end together).
    pub fn ahead(&self, live: &[i32]) -> Vec<i32> {
        let done: Vec<i32> = live.iter().copied().filter(|&p| self.settled(p)).collect();
        if live.len() < 2 || done.len() == live.len() {
            return Vec::new();
        }
        done
    }

    /// Takes a [`settled`](Self::settled) partition out of the batch, with
    /// what became of its rows; `None` (and nothing changes) if it is not
    /// settled. Its rows are stored, rejected or left out: the caller may
    /// acknowledge them while the rest goes on, and no later attempt names
    /// the partition.
    pub fn settle_partition(&mut self, partition: i32) -> Option<Settled> {
        if !self.settled(partition) {
            return None;
        }
        let of = |r: &Row| r.partition == partition;
        let settled = Settled {
            rejected: self.rejected.iter().copied().filter(of).collect(),
            excluded: self.excluded().iter().filter(|r| of(r)).count(),
        };
        self.drop_partition(partition);
        Some(settled)
    }

    /// The server takes fewer rows per insert than the last attempt held:
    /// the next shares hold half as many. False if it held one row.
    pub fn split(&mut self) -> bool {
        if self.last_share <= 1 {
            return false;
        }
        self.per_insert = Some(self.last_share / 2);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{numbered as batch, numbered_in};

    fn offsets(b: &Batch) -> Vec<i64> {
        b.rows().map(|r| r.offset.0).collect()
    }

    fn insert(d: &Delivery) -> (Vec<i64>, u32) {
        match d.next() {
            Next::Insert { rows, number } => (offsets(&rows), number),
            other => panic!("expected an insert, got {other:?}"),
        }
    }

    #[test]
    fn a_partition_whose_share_is_stored_settles_while_the_rest_goes_on() {
        let two = Batch::concat(vec![numbered_in(0, 0..2), numbered_in(1, 0..3)]);
        let mut d = Delivery::new(two, true, false).with_per_insert(Some(2));
        assert!(!d.settled(0) && !d.settled(1) && !d.settled(7));
        d.sent("q0".into(), Some(10));
        assert!(!d.settled(0), "its rows are out");
        d.answered(Answer::Stored);
        assert!(d.settled(0) && !d.settled(1));
        assert_eq!(d.ahead(&[0, 1]), [0]);
        assert!(d.ahead(&[0]).is_empty(), "alone: it ends with the batch");
        assert_eq!(d.settle_partition(1), None, "not settled: nothing changes");
        assert_eq!(
            d.settle_partition(0),
            Some(Settled {
                rejected: vec![],
                excluded: 0
            })
        );
        assert_eq!(d.settle_partition(0), None, "taken out once");
        let Next::Insert { rows, .. } = d.next() else {
            panic!("the rest goes on")
        };
        assert_eq!(rows.partitions().collect::<Vec<_>>(), [1]);
        assert_eq!(offsets(&rows), [0, 1]);
    }

    #[test]
    fn a_partition_in_an_unknown_attempt_settles_only_once_it_is_fenced_and_read() {
        let two = Batch::concat(vec![numbered_in(0, 0..2), numbered_in(1, 0..2)]);
        let mut d = Delivery::new(two, true, false);
        d.sent("q0".into(), Some(10));
        d.answered(Answer::Unknown);
        assert!(
            !d.settled(0) && !d.settled(1),
            "the attempt may still commit"
        );
        assert!(matches!(d.next(), Next::Reconcile { fence: Some(_), .. }));
        d.reconciled(&[Row::new(0, 0), Row::new(0, 1), Row::new(1, 0)]);
        assert!(d.settled(0) && !d.settled(1));
        assert!(d.settle_partition(0).is_some());
        assert_eq!(insert(&d).0, [1]);
    }

    #[test]
    fn a_settled_partition_takes_its_rejected_rows_along() {
        let two = Batch::concat(vec![numbered_in(0, 0..2), numbered_in(1, 0..2)]);
        let mut d = Delivery::new(two, true, false).with_per_insert(Some(2));
        d.sent("q0".into(), Some(10));
        d.answered(Answer::Rejected);
        d.reject([Row::new(0, 1)]);
        assert!(!d.settled(0), "row 0 may be stored: ask first");
        d.reconciled(&[]);
        d.sent("q1".into(), Some(20));
        d.answered(Answer::Stored);
        let done = d.settle_partition(0).expect("settled");
        assert_eq!(done.rejected, [Row::new(0, 1)]);
        assert!(d.rejected().is_empty(), "the batch keeps the rest's only");
    }

    #[test]
    fn a_stored_attempt_makes_the_batch_durable() {
        let mut d = Delivery::new(batch(0..3), true, false);
        assert_eq!(insert(&d), (vec![0, 1, 2], 0));
        d.sent("q0".into(), Some(10));
        assert_eq!(d.next(), Next::Waiting);
        assert_eq!(d.in_flight(), Some(("q0", Some(10))));
        d.answered(Answer::Stored);
        let Next::Durable(done) = d.next() else {
            panic!("durable")
        };
        assert_eq!(done.inserted, 3);
    }

    #[test]
    fn an_unknown_outcome_is_fenced_and_only_the_missing_rows_are_sent() {
        let mut d = Delivery::new(batch(0..4), true, false);
        d.sent("q0".into(), Some(10));
        d.answered(Answer::Unknown);
        match d.next() {
            Next::Reconcile { fence, rows } => {
                assert_eq!(fence.map(|u| u.query_id), Some("q0".into()));
                assert_eq!(offsets(&rows), [0, 1, 2, 3]);
            }
            other => panic!("{other:?}"),
        }
        d.reconciled(&[Row::new(0, 0), Row::new(0, 2)]);
        assert_eq!(insert(&d), (vec![1, 3], 1));
        d.sent("q1".into(), Some(20));
        d.answered(Answer::Stored);
        assert!(matches!(
            d.next(),
            Next::Durable(Durable { inserted: 2, .. })
        ));
    }

    #[test]
    fn a_batch_read_again_asks_first_and_may_be_durable_without_an_insert() {
        let mut d = Delivery::new(batch(5..8), true, true);
        assert!(matches!(d.next(), Next::Reconcile { fence: None, .. }));
        d.reconciled(&[Row::new(0, 5), Row::new(0, 6), Row::new(0, 7)]);
        assert!(matches!(
            d.next(),
            Next::Durable(Durable { inserted: 0, .. })
        ));
    }

    #[test]
    fn a_rejected_row_is_never_sent_again_and_the_rest_is_reconciled() {
        let mut d = Delivery::new(batch(0..4), true, false);
        d.sent("q0".into(), Some(10));
        d.answered(Answer::Rejected);
        d.reject([Row::new(0, 2)]);
        match d.next() {
            Next::Reconcile { fence, rows } => {
                assert_eq!(fence, None, "a rejection ended the query");
                assert_eq!(offsets(&rows), [0, 1, 3]);
            }
            other => panic!("{other:?}"),
        }
        d.reconciled(&[Row::new(0, 0), Row::new(0, 1)]);
        assert_eq!(insert(&d).0, [3]);
        d.sent("q1".into(), Some(20));
        d.answered(Answer::Stored);
        let Next::Durable(done) = d.next() else {
            panic!("durable")
        };
        assert_eq!(done.rejected, [Row::new(0, 2)]);
    }

    #[test]
    fn a_refused_share_is_halved_and_stored_shares_are_not_sent_again() {
        let mut d = Delivery::new(batch(0..5), true, false);
        d.sent("q0".into(), Some(10));
        d.answered(Answer::Refused);
        assert!(d.split());
        assert_eq!(d.per_insert(), Some(2));
        // A refusal may follow stored blocks: ask first.
        assert!(matches!(d.next(), Next::Reconcile { fence: None, .. }));
        d.reconciled(&[]);
        assert_eq!(insert(&d).0, [0, 1]);
        d.sent("q1".into(), Some(20));
        d.answered(Answer::Stored);
        // Every later attempt asks first: the earlier refusal may have
        // stored rows.
        d.reconciled(&[]);
        assert_eq!(insert(&d).0, [2, 3]);
        d.sent("q2".into(), Some(30));
        d.answered(Answer::Stored);
        d.reconciled(&[]);
        assert_eq!(insert(&d).0, [4]);
        d.sent("q3".into(), Some(40));
        d.answered(Answer::Stored);
        assert!(matches!(
            d.next(),
            Next::Durable(Durable { inserted: 5, .. })
        ));
        assert!(!Delivery::new(batch(0..1), true, false).split());
    }

    #[test]
    fn conditional_rows_are_left_out_once_their_copy_is_covered() {
        // Row 3 duplicates the key of row 1 (this batch), row 4 that of
        // row 0 of an earlier batch, which turned out not stored.
        let d = Delivery::new(batch(1..5), true, false).with_conditional(
            vec![
                (Row::new(0, 3), Row::new(0, 1)),
                (Row::new(0, 4), Row::new(0, 0)),
            ],
            vec![Row::new(0, 0)],
        );
        assert_eq!(insert(&d).0, [1, 2, 4]);
        let mut d = d;
        d.sent("q0".into(), Some(1));
        d.answered(Answer::Rejected);
        d.reject([Row::new(0, 1)]);
        d.reconciled(&[]);
        assert_eq!(
            insert(&d).0,
            [2, 3, 4],
            "row 1's copy was rejected: row 3 stands for the key"
        );
    }

    #[test]
    fn an_attempt_sent_when_none_was_due_is_still_fenced() {
        let mut d = Delivery::new(batch(0..3), true, true);
        d.sent("q0".into(), Some(10));
        d.answered(Answer::Unknown);
        match d.next() {
            Next::Reconcile { fence, .. } => {
                assert_eq!(fence.map(|u| u.query_id), Some("q0".into()))
            }
            other => panic!("{other:?}"),
        }
        d.sent("q1".into(), Some(20));
        d.answered(Answer::Stored);
        assert!(
            matches!(d.next(), Next::Reconcile { .. }),
            "nothing counts as stored by it"
        );
        d.reconciled(&[]);
        d.sent("q2".into(), Some(30));
        d.sent("q3".into(), Some(40));
        assert_eq!(
            d.in_flight(),
            Some(("q2", Some(30))),
            "one attempt out at a time"
        );
        d.answered(Answer::Stored);
        d.sent("q4".into(), Some(50));
        assert!(
            matches!(d.next(), Next::Durable(_)),
            "a durable batch sends nothing"
        );
    }

    #[test]
    fn a_row_rejected_after_a_reconciliation_is_left_out_of_its_rest() {
        let mut d = Delivery::new(batch(0..3), true, true);
        d.reconciled(&[]);
        d.reject([Row::new(0, 1)]);
        assert!(matches!(d.next(), Next::Reconcile { .. }));
        d.reconciled(&[]);
        assert_eq!(insert(&d).0, [0, 2]);
    }

    #[test]
    fn outside_exactly_once_every_attempt_sends_the_same_rows() {
        let mut d = Delivery::new(batch(0..3), false, true);
        for n in 0..3 {
            assert_eq!(insert(&d), (vec![0, 1, 2], n));
            d.sent(format!("q{n}"), None);
            d.answered(Answer::Unknown);
        }
    }

    #[test]
    fn a_batch_of_two_partitions_reconciles_and_sends_by_partition_and_offset() {
        let b = Batch::concat(vec![numbered_in(0, 0..3), numbered_in(1, 0..3)]);
        let mut d = Delivery::new(b, true, false);
        d.sent("q0".into(), Some(10));
        d.answered(Answer::Unknown);
        let Next::Reconcile { rows, .. } = d.next() else {
            panic!("reconcile first")
        };
        assert_eq!(rows.len(), 6);
        // Offset 1 is stored in partition 0 only.
        d.reconciled(&[Row::new(0, 1), Row::new(1, 2)]);
        let Next::Insert { rows, .. } = d.next() else {
            panic!("an insert")
        };
        let sent: Vec<Row> = rows.rows().collect();
        let r = Row::new;
        assert_eq!(sent, [r(0, 0), r(0, 2), r(1, 0), r(1, 1)]);
    }

    #[test]
    fn a_partition_dropped_while_its_rows_are_in_flight_is_never_sent_again() {
        let b = Batch::concat(vec![numbered_in(0, 0..2), numbered_in(1, 0..2)]);
        let mut d = Delivery::new(b, true, false);
        d.sent("q0".into(), Some(10));
        // Partition 1 is taken while the attempt is out.
        d.drop_partition(1);
        d.answered(Answer::Unknown);
        let Next::Reconcile { fence, rows } = d.next() else {
            panic!("fence and reconcile")
        };
        assert_eq!(fence.map(|u| u.query_id), Some("q0".into()));
        assert_eq!(rows.partitions().collect::<Vec<_>>(), [0]);
        d.reconciled(&[]);
        let Next::Insert { rows, .. } = d.next() else {
            panic!("an insert")
        };
        assert_eq!(offsets(&rows), [0, 1]);
        assert!(rows.rows().all(|r| r.partition == 0));
        d.sent("q1".into(), Some(20));
        d.answered(Answer::Stored);
        assert!(matches!(d.next(), Next::Durable(_)));
    }

    #[test]
    fn a_partition_dropped_after_a_reconciliation_leaves_its_rest() {
        let b = Batch::concat(vec![numbered_in(0, 0..2), numbered_in(1, 0..2)]);
        let mut d = Delivery::new(b, true, true);
        d.reconciled(&[Row::new(0, 0)]);
        d.drop_partition(0);
        let Next::Insert { rows, .. } = d.next() else {
            panic!("an insert")
        };
        assert!(rows.rows().all(|r| r.partition == 1));
        assert_eq!(rows.len(), 2);
    }

    #[test]
    fn a_rejection_of_a_dropped_partitions_row_is_not_taken() {
        let b = Batch::concat(vec![numbered_in(0, 0..2), numbered_in(1, 0..2)]);
        let mut d = Delivery::new(b, true, false);
        d.sent("q0".into(), Some(10));
        d.drop_partition(1);
        d.answered(Answer::Rejected);
        assert!(!d.holds(Row::new(1, 0)));
        d.reject([Row::new(1, 0), Row::new(0, 1)]);
        assert_eq!(d.rejected(), [Row::new(0, 1)]);
    }
}

/// Partitions settled while the rest of their batch goes on, against a
/// table that records what each attempt really stored: an attempt whose
/// outcome is unknown commits whole or not at all by its fence, a rejected
/// or refused one may have stored the blocks before the row it names.
#[cfg(test)]
mod settling {
    use super::*;
    use crate::batch::numbered_in;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Draws decisions from proptest's bytes (0 once they run out).
    struct Choices(std::vec::IntoIter<u8>);

    impl Choices {
        fn pick(&mut self, n: usize) -> usize {
            self.0.next().map_or(0, |b| b as usize % n.max(1))
        }
    }

    #[test]
    fn a_batch_with_nothing_left_after_a_rejection_is_durable_without_asking() {
        let b = Batch::concat(vec![numbered_in(0, 0..2), numbered_in(1, 0..1)]);
        let mut d = Delivery::new(b, true, false).with_per_insert(Some(2));
        d.sent("q0".into(), Some(1));
        d.answered(Answer::Stored);
        d.sent("q1".into(), Some(2));
        d.answered(Answer::Rejected);
        d.reject([Row::new(1, 0)]);
        assert!(d.settled(0) && d.settled(1));
        assert!(matches!(d.next(), Next::Durable(_)), "{:?}", d.next());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Settled as the writer settles (at the top of its loop, while
        /// another partition still has rows to send): no attempt that may
        /// still commit holds a settled partition's row, none is sent
        /// again, no row is stored twice, and each of a settled
        /// partition's rows is stored, rejected, or left out for a stored
        /// copy.
        #[test]
        fn a_settled_partition_is_never_written_again(
            sizes in proptest::collection::vec(1i64..5, 2..4),
            conditional in proptest::collection::vec((0usize..4, 1i64..4, 0i64..3), 0..3),
            uncertain in any::<bool>(),
            per_insert in proptest::option::of(1usize..4),
            choices in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let mut pick = Choices(choices.into_iter());
            let batch = Batch::concat(
                sizes.iter().enumerate().map(|(p, n)| numbered_in(p as i32, 0..*n)).collect(),
            );
            // A conditional row on an earlier copy of its partition.
            let mut cond: Vec<(Row, Row)> = conditional
                .into_iter()
                .filter(|&(p, r, c)| p < sizes.len() && r < sizes[p] && c < r)
                .map(|(p, r, c)| (Row::new(p as i32, r), Row::new(p as i32, c)))
                .collect();
            cond.sort();
            cond.dedup_by_key(|c| c.0);
            let all: Vec<Row> = batch.rows().collect();
            let mut d = Delivery::new(batch, true, uncertain)
                .with_conditional(cond.clone(), vec![])
                .with_per_insert(per_insert);
            let mut table: BTreeMap<Row, u32> = BTreeMap::new();
            let mut unfenced: Vec<Vec<Row>> = Vec::new();
            let mut settled: BTreeMap<i32, Settled> = BTreeMap::new();
            let parts: Vec<i32> = (0..sizes.len() as i32).collect();
            for _ in 0..200 {
                let live: Vec<i32> = parts.iter().copied().filter(|p| !settled.contains_key(p)).collect();
                let done: Vec<i32> = live.iter().copied().filter(|&p| d.settled(p)).collect();
                if live.len() >= 2 && !done.is_empty() && done.len() < live.len() {
                    for p in done {
                        for a in &unfenced {
                            prop_assert!(a.iter().all(|r| r.partition != p), "{p} settled under {a:?}");
                        }
                        let s = d.settle_partition(p).expect("settled");
                        settled.insert(p, s);
                    }
                }
                match d.next() {
                    Next::Durable(_) => break,
                    Next::Waiting => prop_assert!(false, "no attempt is out"),
                    Next::Reconcile { fence, rows } => {
                        prop_assert_eq!(fence.is_some(), !unfenced.is_empty());
                        // The fence: each unknown attempt committed whole, or not.
                        for a in unfenced.drain(..) {
                            if pick.pick(2) == 0 {
                                for r in a {
                                    *table.entry(r).or_default() += 1;
                                }
                            }
                        }
                        let present: Vec<Row> = rows.rows().filter(|r| table.contains_key(r)).collect();
                        d.reconciled(&present);
                    }
                    Next::Insert { rows, .. } => {
                        let share: Vec<Row> = rows.rows().collect();
                        for r in &share {
                            prop_assert!(!settled.contains_key(&r.partition), "{r:?} sent after its partition settled");
                        }
                        d.sent("q".into(), Some(1));
                        match pick.pick(6) {
                            0 | 1 => {
                                for r in &share {
                                    *table.entry(*r).or_default() += 1;
                                }
                                d.answered(Answer::Stored);
                            }
                            2 => d.answered(Answer::NotSent),
                            3 => {
                                let k = pick.pick(share.len());
                                if pick.pick(2) == 0 {
                                    for r in &share[..k] {
                                        *table.entry(*r).or_default() += 1;
                                    }
                                }
                                d.answered(Answer::Rejected);
                                d.reject([share[k]]);
                            }
                            4 => {
                                let k = pick.pick(share.len() + 1);
                                for r in &share[..k] {
                                    *table.entry(*r).or_default() += 1;
                                }
                                d.answered(Answer::Refused);
                                if pick.pick(2) == 0 {
                                    d.split();
                                }
                            }
                            _ => {
                                unfenced.push(share);
                                d.answered(if pick.pick(2) == 0 { Answer::Unknown } else { Answer::TooLate });
                            }
                        }
                    }
                }
            }
            for (r, n) in &table {
                prop_assert!(*n <= 1, "{r:?} stored {n} times");
            }
            // Covered: stored, or left out for a covered copy of its own.
            fn covered(r: Row, table: &BTreeMap<Row, u32>, cond: &[(Row, Row)]) -> bool {
                table.contains_key(&r) || cond.iter().any(|&(x, c)| x == r && covered(c, table, cond))
            }
            for (p, s) in &settled {
                for r in all.iter().filter(|r| r.partition == *p) {
                    let stored = table.contains_key(r);
                    let rejected = s.rejected.contains(r);
                    let excluded = covered(*r, &table, &cond);
                    prop_assert!(stored || rejected || excluded, "{r:?} of settled {p} lost");
                    prop_assert!(!(stored && rejected), "{r:?} stored and rejected");
                }
            }
        }
    }
}
