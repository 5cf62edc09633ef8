//! When a route's batch is cut: one batch takes what every partition of
//! the route has built, once their rows, bytes or DLQ writes together
//! reach a limit, or the oldest of them has waited `max_age`.
//!
//! In: what each record taken added to its partition's batch
//! ([`RouteCut::grow`]), what left without a cut of the route (a partition
//! cleared, or cut alone: [`RouteCut::shrink`]). Out: [`RouteCut::is_due`].
//! [`RouteCut::cut`] starts over once the route's batch is taken. Counting
//! as records come keeps the check constant-time whatever the number of
//! partitions.

use crate::batch::BatchLimits;
use crate::deadline::Moment;

/// What batches being built hold.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Load {
    pub rows: usize,
    pub bytes: usize,
    /// Records bound for the DLQ.
    pub letters: usize,
}

impl Load {
    /// What `self` holds beyond `earlier` (none where it holds less).
    pub fn beyond(self, earlier: Load) -> Load {
        Load {
            rows: self.rows.saturating_sub(earlier.rows),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            letters: self.letters.saturating_sub(earlier.letters),
        }
    }
}

/// A route's batches being built, counted as one; `T` is the local clock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteCut<T> {
    held: Load,
    /// When a record was first taken since the last cut.
    since: Option<T>,
}

impl<T> Default for RouteCut<T> {
    fn default() -> Self {
        Self {
            held: Load::default(),
            since: None,
        }
    }
}

impl<T: Moment> RouteCut<T> {
    /// A record was taken into one of the route's partitions' batches,
    /// adding `by` (nothing, for a record that yields no row): the route's
    /// batch has something to send from `now` on.
    pub fn grow(&mut self, by: Load, now: T) {
        self.held.rows += by.rows;
        self.held.bytes += by.bytes;
        self.held.letters += by.letters;
        self.since.get_or_insert(now);
    }

    /// `by` left without a cut of the route: a partition's batch was
    /// cleared (revoked) or cut on its own. The age clock keeps running:
    /// at worst the next cut comes early, never late.
    pub fn shrink(&mut self, by: Load) {
        self.held = self.held.beyond(by);
    }

    /// What the route's partitions hold, as counted.
    pub fn held(&self) -> Load {
        self.held
    }

    /// Whether anything was taken since the last cut.
    pub fn pending(&self) -> bool {
        self.since.is_some()
    }

    /// Whether the route's batch is due: its rows, bytes or DLQ writes
    /// reached their limit, or its oldest record has waited `max_age`.
    pub fn is_due(&self, limits: &BatchLimits, max_letters: usize, now: T) -> bool {
        self.held.rows >= limits.max_rows
            || self.held.bytes >= limits.max_bytes
            || self.held.letters >= max_letters
            || self.since.is_some_and(|t| now.since(t) >= limits.max_age)
    }

    /// The route's batch was cut: every partition's batch left.
    pub fn cut(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{BatchBuilder, PartitionId};
    use crate::deadline::Millis;
    use crate::Offset;
    use proptest::prelude::*;
    use std::time::Duration;

    fn limits() -> BatchLimits {
        BatchLimits {
            max_rows: 10,
            max_bytes: 100,
            max_age: Duration::from_millis(1000),
            aligned: false,
        }
    }

    fn load(rows: usize, bytes: usize, letters: usize) -> Load {
        Load {
            rows,
            bytes,
            letters,
        }
    }

    #[test]
    fn due_on_each_limit_and_on_age() {
        let l = limits();
        let mut c = RouteCut::default();
        assert!(!c.pending() && !c.is_due(&l, 5, Millis(99_999)));
        c.grow(load(9, 99, 4), Millis(0));
        assert!(!c.is_due(&l, 5, Millis(999)));
        assert!(c.is_due(&l, 5, Millis(1000)), "age");
        for (by, what) in [
            (load(1, 0, 0), "rows"),
            (load(0, 1, 0), "bytes"),
            (load(0, 0, 1), "letters"),
        ] {
            let mut d = c.clone();
            d.grow(by, Millis(500));
            assert!(d.is_due(&l, 5, Millis(500)), "{what}");
        }
        // A record that yields no row still starts the clock.
        let mut e = RouteCut::default();
        e.grow(Load::default(), Millis(7));
        assert!(e.pending() && e.is_due(&l, 5, Millis(1007)));
        e.cut();
        assert!(!e.pending() && !e.is_due(&l, 5, Millis(99_999)));
    }

    #[test]
    fn shrinking_never_goes_below_nothing() {
        let mut c = RouteCut::<Millis>::default();
        c.grow(load(2, 20, 1), Millis(0));
        c.shrink(load(5, 10, 3));
        assert_eq!(c.held(), load(0, 10, 0));
    }

    proptest! {
        /// Counted as the sink counts (what each take added; a cleared
        /// partition shrinks it; a cut starts over), the route's load is
        /// the sum of its partitions' builders, and it is due exactly when
        /// that sum, or the oldest builder's age, says so.
        #[test]
        fn the_count_is_the_sum_of_the_partitions_batches(
            ops in proptest::collection::vec((0u8..10, 0i32..4, 0usize..30), 1..80),
        ) {
            let l = limits();
            let mut builders: Vec<BatchBuilder<Millis>> = (0..4)
                .map(|p| BatchBuilder::new(PartitionId { topic: "t".into(), partition: p }, l))
                .collect();
            let mut c = RouteCut::default();
            for (t, (op, p, size)) in ops.into_iter().enumerate() {
                let (now, offset) = (Millis(t as u64 * 100), t as i64);
                let b = &mut builders[p as usize];
                let before = load(b.rows(), b.bytes(), 0);
                match op {
                    // Clear the partition (revoked).
                    0 => {
                        b.clear();
                        c.shrink(before);
                    }
                    // Cut the route.
                    1 => {
                        for b in builders.iter_mut() {
                            b.take();
                        }
                        c.cut();
                    }
                    // A record that yields no row.
                    2 => {
                        b.skip(Offset(offset), now);
                        c.grow(Load::default(), now);
                    }
                    _ => {
                        b.push(Offset(offset), now, |buf| {
                            buf.extend(std::iter::repeat_n(b'x', size));
                            Ok::<_, ()>(())
                        }).unwrap();
                        c.grow(load(b.rows(), b.bytes(), 0).beyond(before), now);
                    }
                }
                let rows: usize = builders.iter().map(|b| b.rows()).sum();
                let bytes: usize = builders.iter().map(|b| b.bytes()).sum();
                prop_assert_eq!(c.held(), load(rows, bytes, 0));
                let full = rows >= l.max_rows || bytes >= l.max_bytes;
                let old = builders.iter().any(|b| !b.is_empty() && b.is_due(now));
                // A cleared partition may leave the clock running: early,
                // never late.
                let due = c.is_due(&l, usize::MAX, now);
                prop_assert!(due || !(full || old));
                if builders.iter().all(|b| b.is_empty()) && !c.pending() {
                    prop_assert!(!due);
                }
            }
        }
    }
}
