//! Key-level dedup for one partition: was this business key already
//! written within the window?
//!
//! In: each record's key (a 128-bit hash of its key fields), timestamp and
//! offset. Out: [`Seen::New`] (write it, and remember the key and offset) or
//! [`Seen::Duplicate`] naming the offset of the copy remembered, and from it
//! the [`Verdict`] ([`KeyWindow::decide`]): drop the record only once that
//! copy is durable; while it is still in flight, write the record on
//! condition ([`conditional_excluded`] leaves it out of an attempt once the
//! copy is covered). A copy ClickHouse rejected is
//! [forgotten](KeyWindow::forget). A window rebuilt after a hand-off starts
//! from the keys the table holds ([`KeyWindow::rebuilt`]). Time is the
//! stream's own — the highest record timestamp seen — not the wall clock, so
//! replaying the same records gives the same answers. A key is remembered
//! for `window` of stream time after the copy that was written.
//!
//! The guarantee, checked by `sluice-model` (which calls these functions):
//! a record is dropped for its key only when a copy of that key is durable
//! in the table by the time the committed offset passes the record.
//!
//! Memory: one map entry and one queue entry per remembered key, 48 bytes
//! plus the slack of growing tables (about 60–90 bytes per key measured by
//! `examples/bench_dedup.rs`); `max_keys` caps it by
//! forgetting the oldest keys first, which shortens the window and is
//! counted in [`KeyWindow::evicted_early`].

use crate::offset::{NextOffset, Offset};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::time::Duration;
use xxhash_rust::xxh3::Xxh3;

/// A business key, hashed. 128 bits: two different keys of a billion never
/// collide in practice, so a record is never dropped for someone else's key.
pub type KeyHash = u128;

/// Hashes a key's parts (each field's canonical text, see
/// `RowEncoder::inspect`) with a separator no text part contains.
pub fn key_hash<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> KeyHash {
    let mut h = Xxh3::new();
    for (i, p) in parts.into_iter().enumerate() {
        if i > 0 {
            h.update(&[0x1f]);
        }
        h.update(p);
    }
    h.digest128()
}

/// What the window says about a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    New,
    /// A copy of the key was written within the window, at offset `of`
    /// (below every offset of the partition for a key rebuilt from the table).
    Duplicate {
        of: Offset,
    },
}

/// The offset recorded for keys rebuilt from the table: durable long ago.
pub const SEEDED: Offset = Offset(i64::MIN);

/// A key as stored: two words (8-byte aligned, unlike `u128`), hashed by
/// folding them, since they already are a hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stored(u64, u64);

impl From<KeyHash> for Stored {
    fn from(k: KeyHash) -> Self {
        Stored(k as u64, (k >> 64) as u64)
    }
}

impl Hash for Stored {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.0 ^ self.1.rotate_left(32));
    }
}

/// Passes an already-mixed 64-bit value through.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The keys one partition wrote within the window.
#[derive(Debug, Clone)]
pub struct KeyWindow {
    window_ms: i64,
    max_keys: usize,
    /// Key → timestamp and offset of the copy written.
    latest: HashMap<Stored, (i64, Offset), BuildHasherDefault<PassThrough>>,
    /// Keys in the order they were written, for expiry.
    order: VecDeque<(i64, Stored)>,
    stream_ms: i64,
    evicted_early: u64,
    /// A rebuilt window replaying the records up to this offset: nothing
    /// expires until a record past it (see [`KeyWindow::rebuilt`]).
    hold: Option<Offset>,
}

impl KeyWindow {
    pub fn new(window: Duration, max_keys: usize) -> Self {
        Self {
            window_ms: i64::try_from(window.as_millis()).unwrap_or(i64::MAX),
            max_keys: max_keys.max(1),
            latest: HashMap::default(),
            order: VecDeque::new(),
            stream_ms: i64::MIN,
            evicted_early: 0,
            hold: None,
        }
    }

    /// Decides a record at `offset` with `key` and timestamp `ts_ms`
    /// (negative or `None`: no timestamp, the stream time is used) and
    /// remembers a new key.
    pub fn check(&mut self, key: KeyHash, ts_ms: Option<i64>, offset: Offset) -> Seen {
        use std::collections::hash_map::Entry;
        if self.hold.is_some_and(|through| offset > through) {
            self.end_hold();
        }
        let ts = self.advance(ts_ms);
        let cutoff = self.cutoff();
        let key = Stored::from(key);
        // One probe of the table: most keys are new, and a big table's
        // probe is a cache miss.
        match self.latest.entry(key) {
            Entry::Occupied(e) if e.get().0 >= cutoff => return Seen::Duplicate { of: e.get().1 },
            Entry::Occupied(mut e) => {
                let t = e.get().0.max(ts);
                *e.get_mut() = (t, offset);
            }
            Entry::Vacant(v) => {
                v.insert((ts, offset));
            }
        }
        self.order.push_back((ts, key));
        self.enforce_cap();
        Seen::New
    }

    /// A window rebuilt when a partition changes hands: `keys` are already
    /// in the table (read back from its rows), remembered as durable
    /// ([`SEEDED`]) from `at_ms`, the stream time reached before the hand-off.
    ///
    /// The records up to `through` (the table's highest offset) may be read
    /// again, at a higher stream time than they were first judged at: a key
    /// that dropped one of them then may have expired by now. So nothing
    /// expires until a record past `through` comes; then the keys loaded
    /// count from the stream time reached, and expire from there. A key is
    /// remembered longer than its own time says, never shorter: the only
    /// cost is a drop whose key is in the table.
    pub fn rebuilt(
        window: Duration,
        max_keys: usize,
        keys: impl IntoIterator<Item = KeyHash>,
        at_ms: i64,
        through: Offset,
    ) -> Self {
        let mut w = Self::new(window, max_keys);
        for k in keys {
            w.seed(k, at_ms);
        }
        w.advance_to(at_ms);
        w.hold = Some(through);
        w
    }

    /// The replay of a rebuilt window is over: its loaded keys count from
    /// the stream time reached.
    fn end_hold(&mut self) {
        self.hold = None;
        let now = self.stream_ms;
        for (key, e) in self.latest.iter_mut() {
            if e.1 == SEEDED && e.0 < now {
                e.0 = now;
                self.order.push_back((now, *key));
            }
        }
        self.expire();
    }

    /// Decides a keyed record ([`check`](Self::check), then [`verdict`]):
    /// every row of the partition below `settled` is settled (stored, or
    /// rejected and forgotten here). A record written on condition
    /// ([`Verdict::WriteUnless`]) becomes the copy that stands for its key.
    pub fn decide(
        &mut self,
        key: KeyHash,
        ts_ms: Option<i64>,
        offset: Offset,
        settled: NextOffset,
    ) -> Verdict {
        let v = verdict(self.check(key, ts_ms, offset), settled);
        if let Verdict::WriteUnless { .. } = v {
            self.replace_copy(key, ts_ms, offset);
        }
        v
    }

    /// The offset of the copy that stands for `key` within the window
    /// ([`SEEDED`] for a key rebuilt from the table), without moving the
    /// stream time.
    pub fn copy_of(&self, key: KeyHash) -> Option<Offset> {
        let e = self.latest.get(&Stored::from(key))?;
        (e.0 >= self.cutoff()).then_some(e.1)
    }

    /// Remembers a key already in the table (rebuilding after a restart).
    pub fn seed(&mut self, key: KeyHash, ts_ms: i64) {
        let ts = self.advance(Some(ts_ms));
        self.remember(Stored::from(key), ts);
    }

    /// The copy at `offset`, with timestamp `ts_ms`, now stands for `key`
    /// (it was written on the condition that the copy before it is not
    /// stored); the key is remembered from its time on.
    pub fn replace_copy(&mut self, key: KeyHash, ts_ms: Option<i64>, offset: Offset) {
        let ts = self.advance(ts_ms);
        let key = Stored::from(key);
        if let Some(e) = self.latest.get_mut(&key) {
            e.1 = offset;
            if ts > e.0 {
                e.0 = ts;
                self.order.push_back((ts, key));
                self.enforce_cap();
            }
        }
    }

    /// The copy of `key` at `offset` was not stored (ClickHouse rejected it):
    /// unless a later copy stands for the key, the next record with it is new.
    pub fn forget(&mut self, key: KeyHash, offset: Offset) {
        let key = Stored::from(key);
        if self.latest.get(&key).is_some_and(|e| e.1 == offset) {
            self.latest.remove(&key);
        }
    }

    /// Moves the stream time forward to `ms` (rebuilding: the newest
    /// timestamp read before the restart).
    pub fn advance_to(&mut self, ms: i64) {
        self.advance(Some(ms));
    }

    pub fn len(&self) -> usize {
        self.latest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.latest.is_empty()
    }

    /// Keys forgotten before their time because of `max_keys`.
    pub fn evicted_early(&self) -> u64 {
        self.evicted_early
    }

    fn advance(&mut self, ts_ms: Option<i64>) -> i64 {
        let ts = match ts_ms {
            Some(t) if t >= 0 => t,
            _ => self.stream_ms.max(0),
        };
        self.stream_ms = self.stream_ms.max(ts);
        self.expire();
        ts
    }

    /// The time before which a key is forgotten; none while a rebuilt
    /// window replays.
    fn cutoff(&self) -> i64 {
        if self.hold.is_some() {
            return i64::MIN;
        }
        self.stream_ms.saturating_sub(self.window_ms)
    }

    fn remember(&mut self, key: Stored, ts: i64) {
        let t = self.latest.entry(key).or_insert((ts, SEEDED));
        *t = (t.0.max(ts), SEEDED);
        self.order.push_back((ts, key));
        self.enforce_cap();
    }

    fn enforce_cap(&mut self) {
        while self.latest.len() > self.max_keys {
            if !self.pop_front() {
                break;
            }
            self.evicted_early += 1;
        }
    }

    fn expire(&mut self) {
        let cutoff = self.cutoff();
        while self.order.front().is_some_and(|(t, _)| *t < cutoff) {
            self.pop_front();
        }
    }

    /// Forgets the oldest queue entry; true if that removed a key.
    fn pop_front(&mut self) -> bool {
        let Some((t, key)) = self.order.pop_front() else {
            return false;
        };
        if self.latest.get(&key).is_some_and(|e| e.0 == t) {
            self.latest.remove(&key);
            return true;
        }
        false
    }
}

/// What a partition asks of its key window ([`crate::partition::Partition`]):
/// decide each keyed record, forget a copy ClickHouse rejected. The sink's
/// is [`KeyWindow`]; the model's wraps one to compare windows by the copy
/// standing for each key, and its unsafe rules replace one decision.
pub trait Window {
    /// [`KeyWindow::decide`].
    fn decide(
        &mut self,
        key: KeyHash,
        ts_ms: Option<i64>,
        offset: Offset,
        settled: NextOffset,
    ) -> Verdict;

    /// [`KeyWindow::forget`].
    fn forget(&mut self, key: KeyHash, offset: Offset);
}

impl Window for KeyWindow {
    fn decide(
        &mut self,
        key: KeyHash,
        ts_ms: Option<i64>,
        offset: Offset,
        settled: NextOffset,
    ) -> Verdict {
        KeyWindow::decide(self, key, ts_ms, offset, settled)
    }

    fn forget(&mut self, key: KeyHash, offset: Offset) {
        KeyWindow::forget(self, key, offset)
    }
}

/// What to do with a keyed record, given what the window saw and the
/// position below which every row of the partition is settled (stored, or
/// known rejected and forgotten).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Write,
    /// A copy is durable: drop the record.
    Drop,
    /// The copy at `copy` is still in flight: write the record on the
    /// condition that the copy is not stored ([`conditional_excluded`]).
    WriteUnless {
        copy: Offset,
    },
}

/// What to do with a record the window `seen`, given `settled`.
pub fn verdict(seen: Seen, settled: NextOffset) -> Verdict {
    match seen {
        Seen::New => Verdict::Write,
        Seen::Duplicate { of } if settled.covers(of) || of == SEEDED => Verdict::Drop,
        Seen::Duplicate { of } => Verdict::WriteUnless { copy: of },
    }
}

/// Which conditional rows of a batch to leave out of its next attempt.
///
/// `conditional` lists, ascending, each row written while the copy of its
/// key it duplicates was not yet durable: `(row, copy)` (rows are
/// [`Offset`]s of one partition, or [`crate::batch::Row`]s of several). A
/// row is left out when its copy is *covered*: stored, or itself left out
/// for a covered copy (so a key lands once). A copy in this batch
/// (`in_batch`) is covered unless ClickHouse `rejected` it (ascending); a
/// copy in an earlier batch is covered as `earlier` says.
pub fn conditional_excluded<R: Ord + Copy>(
    conditional: &[(R, R)],
    in_batch: impl Fn(R) -> bool,
    rejected: &[R],
    earlier: impl Fn(R) -> bool,
) -> Vec<R> {
    conditional
        .iter()
        .filter(|&&(_, copy)| {
            if in_batch(copy) {
                rejected.binary_search(&copy).is_err()
            } else {
                earlier(copy)
            }
        })
        .map(|&(row, _)| row)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIN: i64 = 60_000;

    #[test]
    fn drops_a_key_written_within_the_window() {
        let mut w = KeyWindow::new(Duration::from_secs(3600), 1_000_000);
        let k = key_hash([b"1001".as_slice()]);
        assert_eq!(w.check(k, Some(0), Offset(0)), Seen::New);
        assert_eq!(
            w.check(k, Some(30 * MIN), Offset(0)),
            Seen::Duplicate { of: Offset(0) }
        );
        assert_eq!(
            w.check(k, Some(60 * MIN), Offset(0)),
            Seen::Duplicate { of: Offset(0) }
        );
        // Past the window the key is forgotten and written again.
        assert_eq!(w.check(k, Some(61 * MIN), Offset(0)), Seen::New);
        assert_eq!(
            w.check(k, Some(62 * MIN), Offset(0)),
            Seen::Duplicate { of: Offset(0) }
        );
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn stream_time_not_record_order_expires_keys() {
        let mut w = KeyWindow::new(Duration::from_secs(60), 1_000_000);
        let (a, b) = (key_hash([b"a".as_slice()]), key_hash([b"b".as_slice()]));
        assert_eq!(w.check(a, Some(10 * MIN), Offset(0)), Seen::New);
        // A late record: older than the stream time, still within the window.
        assert_eq!(w.check(b, Some(10 * MIN - 30_000), Offset(0)), Seen::New);
        assert_eq!(
            w.check(b, None, Offset(0)),
            Seen::Duplicate { of: Offset(0) }
        );
        // The stream moves on two minutes: both are gone.
        assert_eq!(
            w.check(key_hash([b"c".as_slice()]), Some(12 * MIN), Offset(0)),
            Seen::New
        );
        assert_eq!(w.len(), 1);
        assert_eq!(w.check(a, None, Offset(0)), Seen::New);
    }

    #[test]
    fn the_cap_forgets_the_oldest_first() {
        let mut w = KeyWindow::new(Duration::from_secs(3600), 3);
        for i in 0..5u64 {
            w.check(i as u128, Some(i as i64), Offset(0));
        }
        assert_eq!(w.len(), 3);
        assert_eq!(w.evicted_early(), 2);
        assert_eq!(w.check(0, Some(6), Offset(0)), Seen::New, "evicted early");
        assert_eq!(
            w.check(4, Some(6), Offset(0)),
            Seen::Duplicate { of: Offset(0) }
        );
    }

    #[test]
    fn a_rejected_copy_is_forgotten_unless_a_later_copy_stands() {
        let mut w = KeyWindow::new(Duration::from_secs(3600), 100);
        assert_eq!(w.check(7, Some(0), Offset(10)), Seen::New);
        assert_eq!(
            w.check(7, Some(1), Offset(11)),
            Seen::Duplicate { of: Offset(10) }
        );
        w.replace_copy(7, Some(1), Offset(11));
        // 10 was rejected, but 11 stands for the key now.
        w.forget(7, Offset(10));
        assert_eq!(
            w.check(7, Some(2), Offset(12)),
            Seen::Duplicate { of: Offset(11) }
        );
        w.forget(7, Offset(11));
        assert_eq!(w.check(7, Some(3), Offset(13)), Seen::New);
    }

    #[test]
    fn the_copy_that_stands_for_a_key_is_remembered_from_its_own_time() {
        let mut w = KeyWindow::new(Duration::from_secs(3600), 100);
        assert_eq!(w.check(7, Some(0), Offset(1)), Seen::New);
        // 50 minutes later, a copy written while the first is in flight...
        assert_eq!(
            w.check(7, Some(50 * MIN), Offset(2)),
            Seen::Duplicate { of: Offset(1) }
        );
        w.replace_copy(7, Some(50 * MIN), Offset(2));
        // ...the first is rejected, the second stored.
        w.forget(7, Offset(1));
        // 70 minutes after the first, 20 after the copy stored: a duplicate.
        assert_eq!(
            w.check(7, Some(70 * MIN), Offset(3)),
            Seen::Duplicate { of: Offset(2) }
        );
        // And forgotten a window after the copy's own time.
        assert_eq!(w.check(7, Some(111 * MIN), Offset(4)), Seen::New);
    }

    #[test]
    fn conditional_rows() {
        let o = Offset;
        let cond = [(o(12), o(5)), (o(13), o(11)), (o(14), o(13))];
        // 5 (earlier batch) is covered, 11 was rejected here, 13 was not.
        let out = conditional_excluded(&cond, |c| c >= o(10), &[o(11)], |c| c == o(5));
        assert_eq!(out, vec![o(12), o(14)]);
        let v = |seen, settled| verdict(seen, NextOffset(settled));
        assert_eq!(v(Seen::New, 0), Verdict::Write);
        assert_eq!(v(Seen::Duplicate { of: o(4) }, 5), Verdict::Drop);
        assert_eq!(v(Seen::Duplicate { of: SEEDED }, 0), Verdict::Drop);
        assert_eq!(
            v(Seen::Duplicate { of: o(5) }, 5),
            Verdict::WriteUnless { copy: o(5) }
        );
    }

    #[test]
    fn a_copy_in_flight_is_written_on_condition_and_stands_for_its_key() {
        let mut w = KeyWindow::new(Duration::from_secs(3600), 100);
        let d = |w: &mut KeyWindow, o, settled| w.decide(7, None, Offset(o), NextOffset(settled));
        assert_eq!(d(&mut w, 10, 10), Verdict::Write);
        assert_eq!(w.copy_of(7), Some(Offset(10)));
        // 10 is still in flight: 11 is written unless 10 is stored, and
        // now stands for the key.
        assert_eq!(d(&mut w, 11, 10), Verdict::WriteUnless { copy: Offset(10) });
        assert_eq!(w.copy_of(7), Some(Offset(11)));
        assert_eq!(d(&mut w, 12, 11), Verdict::WriteUnless { copy: Offset(11) });
        // Once 12 is settled, a later record is dropped.
        assert_eq!(d(&mut w, 13, 13), Verdict::Drop);
        assert_eq!(w.copy_of(7), Some(Offset(12)));
        assert_eq!(w.copy_of(8), None);
    }

    #[test]
    fn a_rebuilt_window_drops_the_keys_the_table_holds() {
        let mut w = KeyWindow::rebuilt(Duration::from_secs(60), 100, [7, 8], 10 * MIN, Offset(1));
        assert_eq!(w.copy_of(7), Some(SEEDED));
        // Durable whatever the frontier: they are in the table.
        assert_eq!(w.decide(8, None, Offset(0), NextOffset(0)), Verdict::Drop);
        assert_eq!(w.decide(9, None, Offset(1), NextOffset(0)), Verdict::Write);
        // The seeds count from the hand-off's stream time: remembered for a
        // window after it, then gone.
        assert_eq!(
            w.decide(7, Some(10 * MIN + 30_000), Offset(2), NextOffset(0)),
            Verdict::Drop
        );
        assert_eq!(
            w.decide(7, Some(12 * MIN), Offset(3), NextOffset(0)),
            Verdict::Write
        );
        let fresh = KeyWindow::rebuilt(Duration::from_secs(60), 100, [], 0, Offset(0));
        assert!(fresh.is_empty());
    }

    /// The table holds A@0 min (offset 0) and B@100 min (offset 2); A@50 min
    /// (offset 1) was dropped for A, and the commit stayed at 1. Replayed
    /// after a restart at the stream time 100 min, it is dropped again,
    /// though A's own time is over a window before that.
    #[test]
    fn a_replayed_record_is_judged_by_the_keys_it_was_dropped_for() {
        let (a, b) = (7, 8);
        let mut w =
            KeyWindow::rebuilt(Duration::from_secs(3600), 100, [a, b], 100 * MIN, Offset(2));
        assert_eq!(
            w.decide(a, Some(50 * MIN), Offset(1), NextOffset(1)),
            Verdict::Drop
        );
        assert_eq!(
            w.decide(b, Some(100 * MIN), Offset(2), NextOffset(2)),
            Verdict::Drop
        );
        // Past the table's rows, the keys loaded count from the stream time
        // reached (100 min) and expire a window later.
        assert_eq!(
            w.decide(a, Some(150 * MIN), Offset(3), NextOffset(3)),
            Verdict::Drop
        );
        assert_eq!(
            w.decide(a, Some(161 * MIN), Offset(4), NextOffset(4)),
            Verdict::Write
        );
    }

    /// Timestamps out of order: A@100 min (offset 0, stored), A@110 min
    /// (offset 1, dropped), B@5 min (offset 2, stored), the commit at 1. The
    /// restart loads A and B at 5 min; replaying A@110 min must not expire
    /// them before it is judged.
    #[test]
    fn the_keys_loaded_outlive_the_replay() {
        let (a, b) = (7, 8);
        let mut w = KeyWindow::rebuilt(Duration::from_secs(3600), 100, [a, b], 5 * MIN, Offset(2));
        assert_eq!(
            w.decide(a, Some(110 * MIN), Offset(1), NextOffset(1)),
            Verdict::Drop
        );
        assert_eq!(
            w.decide(b, Some(5 * MIN), Offset(2), NextOffset(2)),
            Verdict::Drop
        );
        assert_eq!(
            w.decide(a, Some(111 * MIN), Offset(3), NextOffset(3)),
            Verdict::Drop
        );
    }

    #[test]
    fn hashes_separate_the_parts() {
        assert_ne!(
            key_hash([b"ab".as_slice(), b"c".as_slice()]),
            key_hash([b"a".as_slice(), b"bc".as_slice()])
        );
        assert_eq!(key_hash([b"x".as_slice()]), key_hash([b"x".as_slice()]));
    }

    proptest! {
        /// Against a model that remembers every written copy: a record is a
        /// duplicate iff a copy of its key was written at or after the
        /// stream time minus the window.
        #[test]
        fn agrees_with_the_model(
            records in prop::collection::vec((0u8..12, prop::option::of(0i64..400)), 1..300),
            window in 1u64..120,
        ) {
            let mut w = KeyWindow::new(Duration::from_millis(window), usize::MAX);
            let mut written: Vec<(u8, i64)> = Vec::new();
            let mut stream = i64::MIN;
            for (key, ts) in records {
                let t = ts.unwrap_or(stream.max(0));
                stream = stream.max(t);
                let cutoff = stream - window as i64;
                let dup = written.iter().any(|&(k, wt)| k == key && wt >= cutoff);
                let got = w.check(key as u128, ts, Offset(0));
                prop_assert_eq!(got != Seen::New, dup, "key {} ts {:?}", key, ts);
                if !dup {
                    written.push((key, t));
                }
            }
        }

        /// Copies of one key, some of which ClickHouse rejects, read in
        /// batches that finish in order: exactly the first copy that is not
        /// rejected lands, whatever the batch boundaries; none if all are.
        #[test]
        fn one_copy_of_a_key_lands(
            bad in prop::collection::vec(any::<bool>(), 1..12),
            cuts in prop::collection::vec(1usize..4, 1..12),
        ) {
            let mut w = KeyWindow::new(Duration::from_secs(3600), 100);
            let mut landed: Vec<Offset> = Vec::new();
            let mut uncovered: Vec<Offset> = Vec::new();
            let mut settled = NextOffset(0);
            let (mut i, mut c) = (0usize, 0usize);
            while i < bad.len() {
                let end = (i + cuts[c % cuts.len()]).min(bad.len());
                c += 1;
                // The consumer thread decides each record as it is read.
                let mut rows = Vec::new();
                let mut cond = Vec::new();
                for j in i..end {
                    let o = Offset(j as i64);
                    match w.decide(1, Some(0), o, settled) {
                        Verdict::Write => rows.push(o),
                        Verdict::Drop => {}
                        Verdict::WriteUnless { copy } => {
                            rows.push(o);
                            cond.push((o, copy));
                        }
                    }
                }
                // The writer: attempts until nothing more is rejected.
                let mut rejected: Vec<Offset> = Vec::new();
                let first = Offset(i as i64);
                loop {
                    let out = conditional_excluded(&cond, |c| c >= first, &rejected, |x| !uncovered.contains(&x));
                    let sent: Vec<Offset> = rows.iter().copied()
                        .filter(|r| !out.contains(r) && !rejected.contains(r)).collect();
                    match sent.iter().find(|r| bad[r.0 as usize]) {
                        Some(r) => { rejected.push(*r); rejected.sort(); }
                        None => { landed.extend(sent); break; }
                    }
                }
                // The completion, back on the consumer thread.
                for r in &rejected {
                    w.forget(1, *r);
                    uncovered.push(*r);
                }
                settled = NextOffset(end as i64);
                i = end;
            }
            let want: Vec<Offset> = bad.iter().position(|b| !b).map(|p| Offset(p as i64)).into_iter().collect();
            prop_assert_eq!(landed, want);
        }

        /// A restart rebuilt as `sink/dedup.rs` does (the keys the table
        /// holds from the first offset within a window of the commit's or
        /// the last row's time, whichever is earlier, through the last row)
        /// and replaying from the commit stores no key twice within the
        /// window: for stored copies i < j of a key, the stream time at j is
        /// over a window past i. Timestamps in order (ties allowed).
        #[test]
        fn a_restart_replaying_from_the_commit_stores_no_key_twice(
            records in prop::collection::vec((0u8..6, 0i64..30), 1..120),
            crash in 0usize..120,
            commit in 0usize..121,
        ) {
            let window = 60i64;
            let mut t = 0;
            let records: Vec<(u128, i64)> = records.iter().map(|&(k, d)| { t += d; (k as u128, t) }).collect();
            let n = records.len();
            let crash = crash % n;
            let mut first = KeyWindow::new(Duration::from_millis(window as u64), usize::MAX);
            let mut stored = vec![false; n];
            for (i, &(k, ts)) in records.iter().enumerate().take(crash + 1) {
                stored[i] = first.check(k, Some(ts), Offset(i as i64)) == Seen::New;
            }
            let w = (0..=crash).rev().find(|&i| stored[i]).unwrap();
            let c = commit % (w + 2);
            let since = if c <= w { records[c].1.min(records[w].1) } else { records[w].1 } - window;
            let from = (0..=w).find(|&i| records[i].1 >= since).unwrap_or(w);
            let seeds = (from..=w).filter(|&i| stored[i]).map(|i| records[i].0);
            let mut second = KeyWindow::rebuilt(Duration::from_millis(window as u64), usize::MAX, seeds, records[w].1, Offset(w as i64));
            for (i, &(k, ts)) in records.iter().enumerate().skip(c) {
                let seen = second.check(k, Some(ts), Offset(i as i64));
                if i > w || !stored[i] {
                    stored[i] = seen == Seen::New;
                }
            }
            for j in 0..n {
                for i in 0..j {
                    if stored[i] && stored[j] && records[i].0 == records[j].0 {
                        let stream = records[..=j].iter().map(|r| r.1).max().unwrap();
                        prop_assert!(stream - window > records[i].1, "{i} and {j}: {records:?} crash {crash} commit {c}");
                    }
                }
            }
        }

        /// The same records give the same answers, whatever came before a
        /// restart, once the window is rebuilt from what was written.
        #[test]
        fn replay_after_rebuild_gives_the_same_answers(
            records in prop::collection::vec((0u8..8, 0i64..200), 1..200),
            cut in 0usize..200,
        ) {
            let window = Duration::from_millis(50);
            let mut first = KeyWindow::new(window, usize::MAX);
            let answers: Vec<Seen> = records.iter().map(|&(k, t)| first.check(k as u128, Some(t), Offset(0))).collect();
            let cut = cut.min(records.len());
            // Restart at `cut`: seed every key written before it, and the
            // stream time reached.
            let mut second = KeyWindow::new(window, usize::MAX);
            for (i, &(k, t)) in records[..cut].iter().enumerate() {
                if answers[i] == Seen::New {
                    second.seed(k as u128, t);
                }
            }
            if let Some(max) = records[..cut].iter().map(|r| r.1).max() {
                second.advance_to(max);
            }
            for (i, &(k, t)) in records.iter().enumerate().skip(cut) {
                prop_assert_eq!(second.check(k as u128, Some(t), Offset(0)) == Seen::New, answers[i] == Seen::New);
            }
        }
    }
}
