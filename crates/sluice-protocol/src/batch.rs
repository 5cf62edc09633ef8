//! Rows of a route's partitions → batches cut by rows, bytes or age.
//!
//! In: encoded rows, one per record, in offset order per partition. Out: a
//! [`Batch`] that owns its bytes and an index of `(row, end)` per row (a
//! [`Row`] names its partition and offset), so that every retry sends
//! identical bytes and reconciliation can drop the rows ClickHouse already
//! has without re-encoding anything. A [`BatchBuilder`] collects one
//! partition; [`Batch::concat`] joins several partitions' batches into one
//! insert. Per partition, a batch covers a contiguous run of the records
//! read from it, and says where that run ends ([`Batch::ends`]).

use crate::deadline::Moment;
use crate::offset::{NextOffset, Offset};
use bytes::Bytes;
use std::time::{Duration, Instant};

/// A topic partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionId {
    pub topic: String,
    pub partition: i32,
}

impl std::fmt::Display for PartitionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.topic, self.partition)
    }
}

/// One row of a batch: the partition and offset of its record. Rows order
/// by partition, then offset, as they lie in a batch's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Row {
    pub partition: i32,
    pub offset: Offset,
}

impl Row {
    pub fn new(partition: i32, offset: i64) -> Self {
        Row {
            partition,
            offset: Offset(offset),
        }
    }
}

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}]@{}", self.partition, self.offset)
    }
}

/// When a batch is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BatchLimits {
    pub max_rows: usize,
    pub max_bytes: usize,
    pub max_age: Duration,
    /// Also cut where the next offset is a multiple of `max_rows`, so that a
    /// replay of the same records forms the same batches (the token-only
    /// baseline; bytes and age limits still apply, as in the sinks it models).
    pub aligned: bool,
}

/// Encoded rows of one topic's partitions with the partition and offset of
/// each row.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Batch {
    topic: String,
    /// Shared, immutable bytes: every attempt sends these very bytes.
    body: Bytes,
    /// Per row (ascending): its partition and offset, and the end of its
    /// bytes in `body`.
    rows: Vec<(Row, usize)>,
    /// Per partition the batch accounts for (ascending): the position after
    /// the last record of it this batch accounts for.
    ends: Vec<(i32, NextOffset)>,
}

impl Batch {
    /// One batch of the partitions of `parts` (one topic, each a batch of
    /// one partition, each partition once): their rows, partition by
    /// partition, in one body.
    ///
    /// # Panics
    /// If the batches are of different topics, one spans several
    /// partitions, or two share a partition: a caller's mistake that would
    /// send rows twice or out of order.
    pub fn concat(parts: Vec<Batch>) -> Batch {
        let mut parts = parts;
        parts.sort_by_key(|b| b.ends.first().map(|e| e.0));
        if parts.len() == 1 {
            return parts.pop().expect("one batch");
        }
        let topic = parts.first().map(|b| b.topic.clone()).unwrap_or_default();
        let size = parts.iter().map(|b| b.body.len()).sum();
        let mut body = Vec::with_capacity(size);
        let mut rows = Vec::with_capacity(parts.iter().map(|b| b.rows.len()).sum());
        let mut ends: Vec<(i32, NextOffset)> = Vec::new();
        for b in parts {
            assert_eq!(b.topic, topic, "one topic per batch");
            let base = body.len();
            body.extend_from_slice(&b.body);
            rows.extend(b.rows.iter().map(|&(r, end)| (r, base + end)));
            assert_eq!(b.ends.len(), 1, "a batch of one partition");
            let e = b.ends[0];
            assert!(
                ends.last().is_none_or(|l| l.0 != e.0),
                "partition {} in two batches",
                e.0
            );
            ends.push(e);
        }
        Batch {
            topic,
            body: body.into(),
            rows,
            ends,
        }
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    pub fn body(&self) -> &Bytes {
        &self.body
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.body.len()
    }

    /// The rows, ascending.
    pub fn rows(&self) -> impl ExactSizeIterator<Item = Row> + '_ {
        self.rows.iter().map(|r| r.0)
    }

    /// The rows of `partition`, ascending.
    pub fn rows_of(&self, partition: i32) -> impl Iterator<Item = Row> + '_ {
        self.rows().filter(move |r| r.partition == partition)
    }

    pub fn first(&self) -> Option<Row> {
        self.rows.first().map(|r| r.0)
    }

    pub fn last(&self) -> Option<Row> {
        self.rows.last().map(|r| r.0)
    }

    /// Row `i` (from 0): which record it is and its bytes.
    pub fn row(&self, i: usize) -> Option<(Row, &[u8])> {
        let (row, end) = *self.rows.get(i)?;
        let start = if i == 0 { 0 } else { self.rows[i - 1].1 };
        Some((row, &self.body[start..end]))
    }

    /// Per partition the batch accounts for (ascending): the read position
    /// just after it.
    pub fn ends(&self) -> &[(i32, NextOffset)] {
        &self.ends
    }

    /// The partitions the batch accounts for, ascending.
    pub fn partitions(&self) -> impl ExactSizeIterator<Item = i32> + '_ {
        self.ends.iter().map(|e| e.0)
    }

    /// The read position just after this batch in `partition`, if it
    /// accounts for any of its records.
    pub fn end_of(&self, partition: i32) -> Option<NextOffset> {
        let i = self.ends.binary_search_by_key(&partition, |e| e.0).ok()?;
        Some(self.ends[i].1)
    }

    /// Per partition with rows, the first and last of them: the ranges a
    /// reconciliation reads.
    pub fn spans(&self) -> Vec<(i32, Offset, Offset)> {
        let mut out: Vec<(i32, Offset, Offset)> = Vec::new();
        for r in self.rows() {
            match out.last_mut() {
                Some(s) if s.0 == r.partition => s.2 = r.offset,
                _ => out.push((r.partition, r.offset, r.offset)),
            }
        }
        out
    }

    /// The first `n` rows (all of them if there are fewer): one insert's
    /// share of a batch the server wants split. Its body is a slice of this
    /// one's. It accounts for the partitions it holds rows of, each up to
    /// where the first row it leaves out begins.
    pub fn head(&self, n: usize) -> Batch {
        let n = n.min(self.rows.len());
        if n == self.rows.len() {
            return self.clone();
        }
        let body_end = n.checked_sub(1).map_or(0, |last| self.rows[last].1);
        let rows = self.rows[..n].to_vec();
        let next = self.rows[n].0;
        let ends = self
            .ends
            .iter()
            .filter(|e| {
                rows.iter().any(|r| r.0.partition == e.0) || (n == 0 && e.0 == next.partition)
            })
            .map(|&(p, end)| match p == next.partition {
                true => (p, NextOffset(next.offset.0)),
                false => (p, end),
            })
            .collect();
        Batch {
            topic: self.topic.clone(),
            body: self.body.slice(..body_end),
            rows,
            ends,
        }
    }

    /// A batch of only the rows not in `present` (ascending). The ends stay
    /// the same: the rows left out are already in ClickHouse (or settled
    /// otherwise), so the batch still accounts for all of them.
    pub fn without(&self, present: &[Row]) -> Batch {
        self.keep(|row, p| p.peek().is_none_or(|o| **o != row), present)
    }

    /// The batch without `partition`: its rows and its end (the partition
    /// is no longer this process's to write).
    pub fn without_partition(&self, partition: i32) -> Batch {
        let mut b = self.keep(|row, _| row.partition != partition, &[]);
        b.ends.retain(|e| e.0 != partition);
        b
    }

    /// The rows `keep` keeps, given a cursor into `sorted` (ascending) that
    /// has moved past every row below the one asked about.
    fn keep(
        &self,
        keep: impl Fn(Row, &mut std::iter::Peekable<std::slice::Iter<'_, Row>>) -> bool,
        sorted: &[Row],
    ) -> Batch {
        let mut body = Vec::with_capacity(self.body.len());
        let mut rows = Vec::with_capacity(self.rows.len());
        let mut p = sorted.iter().peekable();
        let mut start = 0usize;
        for &(row, end) in &self.rows {
            while p.next_if(|o| **o < row).is_some() {}
            if keep(row, &mut p) {
                body.extend_from_slice(&self.body[start..end]);
                rows.push((row, body.len()));
            }
            start = end;
        }
        Batch {
            topic: self.topic.clone(),
            body: body.into(),
            rows,
            ends: self.ends.clone(),
        }
    }
}

/// Accumulates the rows of one partition until a limit is reached; `T` is
/// the local clock ([`Instant`] in the sink).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BatchBuilder<T = Instant> {
    partition: PartitionId,
    limits: BatchLimits,
    body: Vec<u8>,
    rows: Vec<(Row, usize)>,
    end: Option<NextOffset>,
    opened: Option<T>,
}

impl<T: Moment> BatchBuilder<T> {
    pub fn new(partition: PartitionId, limits: BatchLimits) -> Self {
        Self {
            partition,
            limits,
            body: Vec::new(),
            rows: Vec::new(),
            end: None,
            opened: None,
        }
    }

    pub fn partition(&self) -> &PartitionId {
        &self.partition
    }

    fn row(&self, offset: Offset) -> Row {
        Row {
            partition: self.partition.partition,
            offset,
        }
    }

    /// Appends one row: `encode` writes its bytes at the end of the buffer.
    /// If `encode` fails, nothing is appended and the error is returned.
    pub fn push<E>(
        &mut self,
        offset: Offset,
        now: T,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        encode(&mut self.body)?;
        self.rows.push((self.row(offset), self.body.len()));
        self.end = Some(offset.next());
        self.opened.get_or_insert(now);
        Ok(())
    }

    /// Like [`push`](Self::push), but `encode` may decide after writing that
    /// the record yields no row (returns `Ok(false)`): its bytes are taken
    /// back and it is accounted for as [`skip`](Self::skip)ped.
    pub fn push_or_skip<E>(
        &mut self,
        offset: Offset,
        now: T,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<bool, E>,
    ) -> Result<bool, E> {
        let start = self.body.len();
        match encode(&mut self.body) {
            Ok(true) => {
                self.rows.push((self.row(offset), self.body.len()));
                self.end = Some(offset.next());
                self.opened.get_or_insert(now);
                Ok(true)
            }
            Ok(false) => {
                self.body.truncate(start);
                self.skip(offset, now);
                Ok(false)
            }
            Err(e) => {
                self.body.truncate(start);
                Err(e)
            }
        }
    }

    /// Accounts for a record that yields no row (it is already handled
    /// elsewhere), so the batch's end position moves past it.
    pub fn skip(&mut self, offset: Offset, now: T) {
        self.end = Some(offset.next());
        self.opened.get_or_insert(now);
    }

    pub fn is_empty(&self) -> bool {
        self.end.is_none()
    }

    pub fn rows(&self) -> usize {
        self.rows.len()
    }

    pub fn bytes(&self) -> usize {
        self.body.len()
    }

    /// Whether the batch is full or old enough to be sent.
    pub fn is_due(&self, now: T) -> bool {
        let boundary = self.limits.aligned
            && self
                .end
                .is_some_and(|e| e.0 % self.limits.max_rows as i64 == 0);
        boundary
            || self.rows.len() >= self.limits.max_rows
            || self.body.len() >= self.limits.max_bytes
            || self
                .opened
                .is_some_and(|t| now.since(t) >= self.limits.max_age)
    }

    /// Takes the accumulated rows as a batch, leaving the builder empty.
    pub fn take(&mut self) -> Option<Batch> {
        let end = self.end.take()?;
        self.opened = None;
        let cap = self.body.capacity().min(self.limits.max_bytes + 64 * 1024);
        Some(Batch {
            topic: self.partition.topic.clone(),
            body: std::mem::replace(&mut self.body, Vec::with_capacity(cap)).into(),
            rows: std::mem::take(&mut self.rows),
            ends: vec![(self.partition.partition, end)],
        })
    }

    /// Drops everything accumulated (the partition was given up).
    pub fn clear(&mut self) {
        self.body.clear();
        self.rows.clear();
        self.end = None;
        self.opened = None;
    }
}

/// Test batches: partition `t`[0], one row `"{offset}\n"` per offset.
#[cfg(test)]
pub(crate) fn numbered(offsets: std::ops::Range<i64>) -> Batch {
    numbered_in(0, offsets)
}

/// Test batches: partition `t`[`partition`], one row `"{offset}\n"` per
/// offset.
#[cfg(test)]
pub(crate) fn numbered_in(partition: i32, offsets: std::ops::Range<i64>) -> Batch {
    let limits = BatchLimits {
        max_rows: 1000,
        max_bytes: 1 << 20,
        max_age: std::time::Duration::from_secs(1),
        aligned: false,
    };
    let id = PartitionId {
        topic: "t".into(),
        partition,
    };
    let mut b = BatchBuilder::new(id, limits);
    for o in offsets {
        b.push(Offset(o), crate::deadline::Millis(0), |buf| {
            buf.extend_from_slice(format!("{o}\n").as_bytes());
            Ok::<_, ()>(())
        })
        .expect("a row");
    }
    b.take().expect("a batch")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits(rows: usize, bytes: usize) -> BatchLimits {
        BatchLimits {
            max_rows: rows,
            max_bytes: bytes,
            max_age: Duration::from_secs(1),
            aligned: false,
        }
    }

    #[test]
    fn rows_by_index() {
        let mut b = builder(limits(10, 1 << 20));
        let t0 = Instant::now();
        for o in [4, 5, 9] {
            b.push(Offset(o), t0, |buf| {
                buf.extend_from_slice(format!("r{o}\n").as_bytes());
                Ok::<_, ()>(())
            })
            .unwrap();
        }
        let batch = b.take().unwrap();
        assert_eq!(batch.row(0), Some((Row::new(0, 4), b"r4\n".as_slice())));
        assert_eq!(batch.row(2), Some((Row::new(0, 9), b"r9\n".as_slice())));
        assert_eq!(batch.row(3), None);
        let head = batch.head(2);
        assert_eq!(&head.body()[..], b"r4\nr5\n");
        assert_eq!((head.len(), head.end_of(0)), (2, Some(NextOffset(9))));
        assert_eq!(batch.head(0).end_of(0), Some(NextOffset(4)));
        assert!(batch.head(0).body().is_empty());
        assert_eq!(batch.head(7), batch);
    }

    #[test]
    fn aligned_batches_end_on_multiples_of_max_rows() {
        let t0 = Instant::now();
        let mut b = builder(BatchLimits {
            aligned: true,
            ..limits(4, 1 << 20)
        });
        // Starting mid-way (a replay from offset 6) still cuts at 8, 12, ...
        push(&mut b, 6, t0);
        assert!(!b.is_due(t0));
        push(&mut b, 7, t0);
        assert!(b.is_due(t0));
        assert_eq!(b.take().unwrap().end_of(0), Some(NextOffset(8)));
        for o in 8..11 {
            push(&mut b, o, t0);
            assert!(!b.is_due(t0));
        }
        push(&mut b, 11, t0);
        assert!(b.is_due(t0));
    }

    fn builder(l: BatchLimits) -> BatchBuilder {
        BatchBuilder::new(
            PartitionId {
                topic: "t".into(),
                partition: 0,
            },
            l,
        )
    }

    fn push(b: &mut BatchBuilder, o: i64, now: Instant) {
        b.push::<()>(Offset(o), now, |buf| {
            buf.extend_from_slice(format!("row{o}\n").as_bytes());
            Ok(())
        })
        .unwrap();
    }

    #[test]
    fn cuts_by_rows_bytes_and_age() {
        let t0 = Instant::now();
        let mut b = builder(limits(2, 1000));
        push(&mut b, 0, t0);
        assert!(!b.is_due(t0));
        push(&mut b, 1, t0);
        assert!(b.is_due(t0));

        let mut b = builder(limits(100, 10));
        push(&mut b, 0, t0);
        assert!(!b.is_due(t0));
        push(&mut b, 1, t0);
        assert!(b.is_due(t0));

        let mut b = builder(limits(100, 1000));
        push(&mut b, 0, t0);
        assert!(!b.is_due(t0 + Duration::from_millis(999)));
        assert!(b.is_due(t0 + Duration::from_secs(1)));
        let batch = b.take().unwrap();
        assert_eq!(batch.end_of(0), Some(NextOffset(1)));
        assert!(b.is_empty());
        assert!(!b.is_due(t0 + Duration::from_secs(5)));
    }

    #[test]
    fn failed_encode_appends_nothing() {
        let t0 = Instant::now();
        let mut b = builder(limits(10, 1000));
        push(&mut b, 5, t0);
        assert_eq!(b.push(Offset(6), t0, |_| Err("bad")), Err("bad"));
        let batch = b.take().unwrap();
        assert_eq!(&batch.body()[..], b"row5\n");
        assert_eq!(batch.end_of(0), Some(NextOffset(6)));
    }

    #[test]
    fn skip_moves_end_without_rows() {
        let t0 = Instant::now();
        let mut b = builder(limits(10, 1000));
        push(&mut b, 5, t0);
        b.skip(Offset(6), t0);
        let batch = b.take().unwrap();
        assert_eq!(batch.len(), 1);
        assert_eq!(batch.end_of(0), Some(NextOffset(7)));
    }

    proptest! {
        #[test]
        fn without_keeps_exactly_the_missing_rows(
            offsets in proptest::collection::btree_set(0i64..500, 1..60),
            present in proptest::collection::btree_set(0i64..500, 0..60),
        ) {
            let t0 = Instant::now();
            let mut b = builder(limits(1000, 1 << 20));
            for &o in &offsets { push(&mut b, o, t0); }
            let batch = b.take().unwrap();
            let present: Vec<Row> = present.into_iter().map(|o| Row::new(0, o)).collect();
            let rest = batch.without(&present);
            let expect: Vec<i64> = offsets.iter().copied()
                .filter(|o| !present.contains(&Row::new(0, *o))).collect();
            let got: Vec<i64> = rest.rows().map(|r| r.offset.0).collect();
            prop_assert_eq!(&got, &expect);
            let body: String = expect.iter().map(|o| format!("row{o}\n")).collect();
            prop_assert_eq!(&rest.body()[..], body.as_bytes());
            prop_assert_eq!(rest.ends(), batch.ends());
        }
    }
}

#[cfg(test)]
mod across_partitions {
    use super::*;
    use proptest::prelude::*;

    fn offsets_of(b: &Batch, p: i32) -> Vec<i64> {
        b.rows_of(p).map(|r| r.offset.0).collect()
    }

    #[test]
    fn a_batch_of_several_partitions_keeps_each_ones_rows_and_end() {
        let b = Batch::concat(vec![numbered_in(3, 7..9), numbered_in(1, 0..2)]);
        assert_eq!(&b.body()[..], b"0\n1\n7\n8\n", "partition by partition");
        assert_eq!(b.ends(), [(1, NextOffset(2)), (3, NextOffset(9))]);
        assert_eq!(b.row(2), Some((Row::new(3, 7), b"7\n".as_slice())));
        assert_eq!(
            b.spans(),
            [(1, Offset(0), Offset(1)), (3, Offset(7), Offset(8))]
        );
        // A share that ends inside partition 3 accounts for it up to there.
        let head = b.head(3);
        assert_eq!(head.ends(), [(1, NextOffset(2)), (3, NextOffset(8))]);
        assert_eq!(&head.body()[..], b"0\n1\n7\n");
        let rest = b.without(&[Row::new(1, 1), Row::new(3, 7)]);
        assert_eq!(&rest.body()[..], b"0\n8\n");
        assert_eq!(rest.ends(), b.ends());
        let gone = b.without_partition(1);
        assert_eq!(&gone.body()[..], b"7\n8\n");
        assert_eq!(gone.ends(), [(3, NextOffset(9))]);
        assert_eq!(offsets_of(&gone, 3), [7, 8]);
    }

    #[test]
    #[should_panic(expected = "partition 1 in two batches")]
    fn a_partition_joins_a_batch_once() {
        Batch::concat(vec![numbered_in(1, 0..2), numbered_in(1, 2..4)]);
    }

    proptest! {
        #[test]
        fn without_keeps_exactly_the_missing_rows_of_every_partition(
            sizes in proptest::collection::vec(0i64..6, 1..5),
            present in proptest::collection::btree_set((0i32..5, 0i64..6), 0..20),
            cut in 0usize..30,
        ) {
            let parts: Vec<Batch> = sizes.iter().enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(p, n)| numbered_in(p as i32, 0..*n))
                .collect();
            prop_assume!(!parts.is_empty());
            let b = Batch::concat(parts);
            let present: Vec<Row> = present.into_iter().map(|(p, o)| Row::new(p, o)).collect();
            let rest = b.without(&present);
            let expect: Vec<Row> = b.rows().filter(|r| !present.contains(r)).collect();
            prop_assert_eq!(rest.rows().collect::<Vec<_>>(), expect.clone());
            let body: String = expect.iter().map(|r| format!("{}\n", r.offset)).collect();
            prop_assert_eq!(&rest.body()[..], body.as_bytes());
            // A head is a prefix, body and rows alike.
            let head = b.head(cut);
            prop_assert_eq!(head.len(), cut.min(b.len()));
            prop_assert!(b.body().starts_with(head.body()));
            for i in 0..head.len() {
                prop_assert_eq!(head.row(i), b.row(i));
            }
        }
    }
}
