//! Rows of one topic partition → batches cut by rows, bytes or age.
//!
//! In: encoded rows, one per record, in offset order. Out: a [`Batch`] that
//! owns its bytes and an index of `(offset, end)` per row, so that every retry
//! sends identical bytes and reconciliation can drop the rows ClickHouse
//! already has without re-encoding anything. A batch always covers a
//! contiguous run of the records read from its partition.

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

/// Encoded rows of one partition with the offset of each row.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Batch {
    pub partition: PartitionId,
    /// Shared, immutable bytes: every attempt sends these very bytes.
    body: Bytes,
    /// Per row: its offset and the end of its bytes in `body`.
    rows: Vec<(Offset, usize)>,
    /// The position after the last record this batch accounts for.
    end: NextOffset,
}

impl Batch {
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

    /// Offsets of the rows, ascending.
    pub fn offsets(&self) -> impl ExactSizeIterator<Item = Offset> + '_ {
        self.rows.iter().map(|r| r.0)
    }

    pub fn first(&self) -> Option<Offset> {
        self.rows.first().map(|r| r.0)
    }

    pub fn last(&self) -> Option<Offset> {
        self.rows.last().map(|r| r.0)
    }

    /// Row `i` (from 0): its offset and its bytes.
    pub fn row(&self, i: usize) -> Option<(Offset, &[u8])> {
        let (offset, end) = *self.rows.get(i)?;
        let start = if i == 0 { 0 } else { self.rows[i - 1].1 };
        Some((offset, &self.body[start..end]))
    }

    /// The read position just after this batch.
    pub fn end(&self) -> NextOffset {
        self.end
    }

    /// The first `n` rows (all of them if there are fewer): one insert's
    /// share of a batch the server wants split. Its body is a slice of this
    /// one's; it ends where the first row left out begins.
    pub fn head(&self, n: usize) -> Batch {
        let n = n.min(self.rows.len());
        let (body_end, end) = match (n.checked_sub(1), self.rows.get(n)) {
            (_, None) => (self.body.len(), self.end),
            (None, Some(next)) => (0, NextOffset(next.0 .0)),
            (Some(last), Some(next)) => (self.rows[last].1, NextOffset(next.0 .0)),
        };
        Batch {
            partition: self.partition.clone(),
            body: self.body.slice(..body_end),
            rows: self.rows[..n].to_vec(),
            end,
        }
    }

    /// A batch of only the rows whose offsets are not in `present`
    /// (ascending). The end position stays the same: the rows left out are
    /// already in ClickHouse, so the batch still accounts for all of them.
    pub fn without(&self, present: &[Offset]) -> Batch {
        let mut body = Vec::with_capacity(self.body.len());
        let mut rows = Vec::with_capacity(self.rows.len());
        let mut p = present.iter().peekable();
        let mut start = 0usize;
        for &(offset, end) in &self.rows {
            while p.next_if(|o| **o < offset).is_some() {}
            let keep = p.peek().is_none_or(|o| **o != offset);
            if keep {
                body.extend_from_slice(&self.body[start..end]);
                rows.push((offset, body.len()));
            }
            start = end;
        }
        Batch {
            partition: self.partition.clone(),
            body: body.into(),
            rows,
            end: self.end,
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
    rows: Vec<(Offset, usize)>,
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

    /// Appends one row: `encode` writes its bytes at the end of the buffer.
    /// If `encode` fails, nothing is appended and the error is returned.
    pub fn push<E>(
        &mut self,
        offset: Offset,
        now: T,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        encode(&mut self.body)?;
        self.rows.push((offset, self.body.len()));
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
                self.rows.push((offset, self.body.len()));
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
            partition: self.partition.clone(),
            body: std::mem::replace(&mut self.body, Vec::with_capacity(cap)).into(),
            rows: std::mem::take(&mut self.rows),
            end,
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
    let limits = BatchLimits {
        max_rows: 1000,
        max_bytes: 1 << 20,
        max_age: std::time::Duration::from_secs(1),
        aligned: false,
    };
    let id = PartitionId {
        topic: "t".into(),
        partition: 0,
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
        assert_eq!(batch.row(0), Some((Offset(4), b"r4\n".as_slice())));
        assert_eq!(batch.row(2), Some((Offset(9), b"r9\n".as_slice())));
        assert_eq!(batch.row(3), None);
        let head = batch.head(2);
        assert_eq!(&head.body()[..], b"r4\nr5\n");
        assert_eq!((head.len(), head.end()), (2, NextOffset(9)));
        assert_eq!(batch.head(0).end(), NextOffset(4));
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
        assert_eq!(b.take().unwrap().end(), NextOffset(8));
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
        assert_eq!(batch.end(), NextOffset(1));
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
        assert_eq!(batch.end(), NextOffset(6));
    }

    #[test]
    fn skip_moves_end_without_rows() {
        let t0 = Instant::now();
        let mut b = builder(limits(10, 1000));
        push(&mut b, 5, t0);
        b.skip(Offset(6), t0);
        let batch = b.take().unwrap();
        assert_eq!(batch.len(), 1);
        assert_eq!(batch.end(), NextOffset(7));
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
            let present: Vec<Offset> = present.into_iter().map(Offset).collect();
            let rest = batch.without(&present);
            let expect: Vec<i64> = offsets.iter().copied()
                .filter(|o| !present.contains(&Offset(*o))).collect();
            let got: Vec<i64> = rest.offsets().map(|o| o.0).collect();
            prop_assert_eq!(&got, &expect);
            let body: String = expect.iter().map(|o| format!("row{o}\n")).collect();
            prop_assert_eq!(&rest.body()[..], body.as_bytes());
            prop_assert_eq!(rest.end(), batch.end());
        }
    }
}
