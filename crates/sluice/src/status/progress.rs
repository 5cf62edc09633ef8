//! What one reading of a partition means, and whether it is stuck: no I/O.
//!
//! In: a [`Reading`] of each partition (the broker's watermarks, the
//! group's committed offset, the highest offset ClickHouse holds, the Kafka
//! timestamps at both ends) taken at a time. Out: how far the sink is
//! ([`Reading::done`]), its lag in records and in time, and, across
//! readings, how long a partition with lag has not moved ([`Movement`]).

use std::collections::HashMap;
use std::time::Duration;

/// One partition as read at one time. Offsets are Kafka's: `high` is the
/// next offset the broker will write, `committed` the next the group reads.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Reading {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) low_watermark: i64,
    pub(crate) high_watermark: i64,
    pub(crate) committed: Option<i64>,
    /// The highest offset the table holds (ClickHouse's watermark).
    pub(crate) stored: Option<i64>,
    /// Kafka timestamps (Unix ms) of the newest record done (`done - 1`)
    /// and of the newest record (`high - 1`), where they could be read.
    pub(crate) done_timestamp: Option<i64>,
    pub(crate) newest_timestamp: Option<i64>,
    /// The group member that holds the partition (`client_id@host`).
    pub(crate) owner: Option<String>,
}

impl Reading {
    /// The next offset the sink has not finished with: the group's
    /// committed offset (the sink commits only past records that are in
    /// ClickHouse or the DLQ, with no gap below), at least the low
    /// watermark (records deleted by retention are nobody's lag). The
    /// table's highest offset is not taken: rows can stand above a gap
    /// (batches landing out of order, a topic recreated under its name).
    /// A partition marked as one whose offsets went back
    /// ([`sluice_protocol::resume::MISMATCH_MARK`]) has done nothing.
    pub(crate) fn done(&self) -> i64 {
        self.committed
            .filter(|c| *c != sluice_protocol::resume::MISMATCH_MARK.0)
            .unwrap_or(self.low_watermark)
            .max(self.low_watermark)
    }

    /// Records written to the partition and not yet done.
    pub(crate) fn lag_records(&self) -> i64 {
        (self.high_watermark - self.done()).max(0)
    }

    /// How far behind, in Kafka time: the newest record's timestamp against
    /// the newest done record's. Zero without lag; unknown when either
    /// record could not be read (deleted by retention, a control record).
    pub(crate) fn lag_time(&self) -> Option<Duration> {
        if self.lag_records() == 0 {
            return Some(Duration::ZERO);
        }
        let (done, newest) = (self.done_timestamp?, self.newest_timestamp?);
        Some(Duration::from_millis((newest - done).max(0) as u64))
    }
}

/// Which partition: `(topic, partition)`.
pub(crate) type PartKey = (String, i32);

/// How long each partition has had lag without moving, across readings.
#[derive(Debug, Default)]
pub(crate) struct Movement {
    seen: HashMap<PartKey, Seen>,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    done: i64,
    /// While it has lag: since when (Unix ms) it has not moved, and where
    /// it was when the lag appeared (or at the first reading).
    lagging: Option<(i64, i64)>,
}

impl Movement {
    /// Takes a reading made at `now_ms`; returns how long the partition has
    /// had lag without moving (zero when it has no lag or just moved).
    pub(crate) fn observe(&mut self, r: &Reading, now_ms: i64) -> Duration {
        let done = r.done();
        let key = (r.topic.clone(), r.partition);
        let before = self
            .seen
            .get(&key)
            .and_then(|s| s.lagging.map(|l| (s.done, l)));
        let lagging = match before {
            _ if r.lag_records() == 0 => None,
            Some((was, (since, from))) if was == done => Some((since, from)),
            Some((_, (_, from))) => Some((now_ms, from)),
            None => Some((now_ms, done)),
        };
        self.seen.insert(key, Seen { done, lagging });
        lagging.map_or(Duration::ZERO, |(since, _)| {
            Duration::from_millis((now_ms - since).max(0) as u64)
        })
    }

    /// Whether every partition seen is without lag, or has moved since its
    /// lag appeared (or since the first reading).
    pub(crate) fn all_moving(&self) -> bool {
        self.seen
            .values()
            .all(|s| s.lagging.is_none_or(|(_, from)| from != s.done))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reading(high: i64, committed: Option<i64>, stored: Option<i64>) -> Reading {
        Reading {
            topic: "t".into(),
            partition: 0,
            low_watermark: 0,
            high_watermark: high,
            committed,
            stored,
            done_timestamp: Some(1_000),
            newest_timestamp: Some(61_000),
            owner: None,
        }
    }

    #[test]
    fn done_is_the_commit_never_the_table() {
        assert_eq!(reading(10, None, None).done(), 0);
        assert_eq!(reading(10, Some(4), None).done(), 4);
        // Rows above a gap (offsets 0..6 missing) are not progress.
        assert_eq!(reading(10, None, Some(6)).done(), 0);
        // The last records went to the DLQ: the commit passes them.
        assert_eq!(reading(10, Some(10), Some(6)).done(), 10);
        assert_eq!(reading(10, Some(5), Some(8)).done(), 5);
        // Retention deleted what the commit had not reached.
        let mut gone = reading(10, Some(1), None);
        gone.low_watermark = 3;
        assert_eq!(gone.done(), 3);
    }

    #[test]
    fn lag_in_time_is_between_the_done_and_the_newest_record() {
        assert_eq!(
            reading(10, Some(5), None).lag_time(),
            Some(Duration::from_secs(60))
        );
        assert_eq!(reading(10, Some(10), None).lag_time(), Some(Duration::ZERO));
        let mut unknown = reading(10, Some(5), None);
        unknown.done_timestamp = None;
        assert_eq!(unknown.lag_time(), None);
        let marked = reading(10, Some(sluice_protocol::resume::MISMATCH_MARK.0), None);
        assert_eq!(marked.lag_records(), 10, "a marked partition is all lag");
    }

    #[test]
    fn a_partition_is_idle_only_while_it_has_lag_and_does_not_move() {
        let mut m = Movement::default();
        let s = Duration::from_secs;
        assert_eq!(m.observe(&reading(10, Some(5), None), 0), s(0));
        assert_eq!(m.observe(&reading(10, Some(5), None), 30_000), s(30));
        assert_eq!(m.observe(&reading(12, Some(5), None), 60_000), s(60));
        // It moved: the clock starts again.
        assert_eq!(m.observe(&reading(12, Some(6), None), 70_000), s(0));
        assert_eq!(m.observe(&reading(12, Some(6), None), 75_000), s(5));
        // Caught up: no lag, never idle, however long it stays there.
        assert_eq!(m.observe(&reading(12, Some(12), None), 80_000), s(0));
        assert_eq!(m.observe(&reading(12, Some(12), None), 999_000), s(0));
        // New records: idle counts from when the lag appeared.
        assert_eq!(m.observe(&reading(13, Some(12), None), 1_000_000), s(0));
        assert_eq!(m.observe(&reading(13, Some(12), None), 1_010_000), s(10));
        assert!(!m.all_moving(), "its new lag has not moved yet");
    }

    #[test]
    fn only_a_move_after_the_lag_appeared_counts() {
        let mut m = Movement::default();
        m.observe(&reading(10, Some(10), None), 0);
        let mut other = reading(10, Some(4), None);
        other.partition = 1;
        m.observe(&other, 0);
        assert!(!m.all_moving());
        m.observe(&other, 5_000);
        assert!(!m.all_moving(), "still at 4");
        other.committed = Some(6);
        m.observe(&other, 10_000);
        assert!(m.all_moving());
        // Lag that appears after the first reading and does not move is
        // not movement, however long it had none before.
        let mut fresh = Movement::default();
        fresh.observe(&reading(10, Some(10), None), 0);
        fresh.observe(&reading(12, Some(10), None), 1_000);
        fresh.observe(&reading(12, Some(10), None), 2_000);
        assert!(!fresh.all_moving());
        fresh.observe(&reading(12, Some(11), None), 3_000);
        assert!(fresh.all_moving());
    }

    proptest! {
        /// Idle time never exceeds the time since the first reading, and is
        /// zero whenever the partition has no lag or has just moved.
        #[test]
        fn idle_is_bounded(steps in proptest::collection::vec((0i64..3, 0i64..3, 1i64..10_000), 1..40)) {
            let mut m = Movement::default();
            let (mut high, mut committed, mut now) = (0i64, 0i64, 0i64);
            let mut last_done = None;
            for (more, advance, dt) in steps {
                high += more;
                committed = (committed + advance).min(high);
                now += dt;
                let r = reading(high, Some(committed), None);
                let idle = m.observe(&r, now);
                prop_assert!(idle <= Duration::from_millis(now as u64));
                if r.lag_records() == 0 || last_done != Some(r.done()) {
                    prop_assert_eq!(idle, Duration::ZERO);
                }
                last_done = Some(r.done());
            }
        }
    }
}
