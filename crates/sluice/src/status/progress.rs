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
pub struct Reading {
    pub topic: String,
    pub partition: i32,
    pub low_watermark: i64,
    pub high_watermark: i64,
    pub committed: Option<i64>,
    /// The highest offset the table holds (ClickHouse's watermark).
    pub stored: Option<i64>,
    /// Kafka timestamps (Unix ms) of the newest record done (`done - 1`)
    /// and of the newest record (`high - 1`), where they could be read.
    pub done_timestamp: Option<i64>,
    pub newest_timestamp: Option<i64>,
    /// The group member that holds the partition (`client_id@host`).
    pub owner: Option<String>,
}

impl Reading {
    /// The next offset the sink has not finished with: past the highest
    /// stored row or at the committed offset, whichever is further (records
    /// that went to the DLQ or were dropped as duplicates are never stored,
    /// but the commit passes them); the low watermark when neither exists.
    pub fn done(&self) -> i64 {
        let stored = self.stored.map(|o| o + 1);
        match (stored, self.committed) {
            (None, None) => self.low_watermark,
            (s, c) => s.max(c).unwrap_or(self.low_watermark),
        }
    }

    /// Records written to the partition and not yet done.
    pub fn lag_records(&self) -> i64 {
        (self.high_watermark - self.done()).max(0)
    }

    /// How far behind, in Kafka time: the newest record's timestamp against
    /// the newest done record's. Zero without lag; unknown when either
    /// record could not be read (deleted by retention, a control record).
    pub fn lag_time(&self) -> Option<Duration> {
        if self.lag_records() == 0 {
            return Some(Duration::ZERO);
        }
        let (done, newest) = (self.done_timestamp?, self.newest_timestamp?);
        Some(Duration::from_millis((newest - done).max(0) as u64))
    }
}

/// Which partition: `(topic, partition)`.
pub type PartKey = (String, i32);

/// How long each partition has had lag without moving, across readings.
#[derive(Debug, Default)]
pub struct Movement {
    /// `done` at the last reading, and since when (Unix ms) it has had lag
    /// without moving (`None`: no lag).
    seen: HashMap<PartKey, (i64, Option<i64>)>,
}

impl Movement {
    /// Takes a reading made at `now_ms`; returns how long the partition has
    /// had lag without moving (zero when it has no lag or just moved).
    pub fn observe(&mut self, r: &Reading, now_ms: i64) -> Duration {
        let done = r.done();
        let lagging = r.lag_records() > 0;
        let key = (r.topic.clone(), r.partition);
        let since = match self.seen.get(&key) {
            _ if !lagging => None,
            Some(&(before, Some(since))) if before == done => Some(since),
            _ => Some(now_ms),
        };
        self.seen.insert(key, (done, since));
        since.map_or(Duration::ZERO, |s| {
            Duration::from_millis((now_ms - s).max(0) as u64)
        })
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
    fn done_is_the_furthest_of_the_table_and_the_commit() {
        assert_eq!(reading(10, None, None).done(), 0);
        assert_eq!(reading(10, Some(4), None).done(), 4);
        assert_eq!(reading(10, None, Some(6)).done(), 7);
        // The last records went to the DLQ: the commit passes them.
        assert_eq!(reading(10, Some(10), Some(6)).done(), 10);
        // The commit trails the table by up to a commit interval.
        assert_eq!(reading(10, Some(5), Some(8)).done(), 9);
        let mut gone = reading(10, None, None);
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
