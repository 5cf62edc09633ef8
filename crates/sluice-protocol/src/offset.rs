//! Kafka's two offset conventions, kept apart by type.
//!
//! An [`Offset`] names one record. A [`NextOffset`] is a position: the offset
//! of the next record to read, which is what Kafka commits and seeks take.
//! librdkafka's `store_offset` adds one while `store_offsets` does not; with
//! two types the `+ 1` happens in exactly one place, [`Offset::next`].

use std::fmt;

/// The offset of one record in a topic partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Offset(pub i64);

/// A read position: the offset of the next record, as committed to Kafka.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NextOffset(pub i64);

impl Offset {
    /// The position just after this record.
    pub fn next(self) -> NextOffset {
        NextOffset(self.0 + 1)
    }
}

impl NextOffset {
    /// The last record before this position, if there is one.
    pub fn last(self) -> Option<Offset> {
        (self.0 > 0).then(|| Offset(self.0 - 1))
    }

    /// Whether the record at `offset` lies before this position.
    pub fn covers(self, offset: Offset) -> bool {
        offset.0 < self.0
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for NextOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_and_last_are_inverse() {
        assert_eq!(Offset(41).next(), NextOffset(42));
        assert_eq!(NextOffset(42).last(), Some(Offset(41)));
        assert_eq!(NextOffset(0).last(), None);
        assert!(NextOffset(42).covers(Offset(41)));
        assert!(!NextOffset(42).covers(Offset(42)));
    }
}
