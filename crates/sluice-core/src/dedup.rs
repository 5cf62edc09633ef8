//! Key-level dedup for one partition: was this business key already
//! written within the window?
//!
//! In: each record's key (a 128-bit hash of its key fields) and timestamp.
//! Out: [`Seen::New`] (write it, and remember the key) or
//! [`Seen::Duplicate`] (drop it). Time is the stream's own — the highest
//! record timestamp seen — not the wall clock, so replaying the same records
//! gives the same answers. A key is remembered for `window` of stream time
//! after the copy that was written.
//!
//! Memory: one map entry and one queue entry per remembered key, 48 bytes
//! plus the slack of growing tables (about 60–90 bytes per key measured by
//! `examples/bench_dedup.rs`); `max_keys` caps it by
//! forgetting the oldest keys first, which shortens the window and is
//! counted in [`KeyWindow::evicted_early`].

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
    Duplicate,
}

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
#[derive(Debug)]
pub struct KeyWindow {
    window_ms: i64,
    max_keys: usize,
    /// Key → timestamp of the copy written.
    latest: HashMap<Stored, i64, BuildHasherDefault<PassThrough>>,
    /// Keys in the order they were written, for expiry.
    order: VecDeque<(i64, Stored)>,
    stream_ms: i64,
    evicted_early: u64,
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
        }
    }

    /// Decides a record with `key` and timestamp `ts_ms` (negative or
    /// `None`: no timestamp, the stream time is used) and remembers a new key.
    pub fn check(&mut self, key: KeyHash, ts_ms: Option<i64>) -> Seen {
        use std::collections::hash_map::Entry;
        let ts = self.advance(ts_ms);
        let cutoff = self.cutoff();
        let key = Stored::from(key);
        // One probe of the table: most keys are new, and a big table's
        // probe is a cache miss.
        match self.latest.entry(key) {
            Entry::Occupied(e) if *e.get() >= cutoff => return Seen::Duplicate,
            Entry::Occupied(mut e) => *e.get_mut() = (*e.get()).max(ts),
            Entry::Vacant(v) => {
                v.insert(ts);
            }
        }
        self.order.push_back((ts, key));
        self.enforce_cap();
        Seen::New
    }

    /// Remembers a key already in the table (rebuilding after a restart).
    pub fn seed(&mut self, key: KeyHash, ts_ms: i64) {
        let ts = self.advance(Some(ts_ms));
        self.remember(Stored::from(key), ts);
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

    fn cutoff(&self) -> i64 {
        self.stream_ms.saturating_sub(self.window_ms)
    }

    fn remember(&mut self, key: Stored, ts: i64) {
        let t = self.latest.entry(key).or_insert(ts);
        *t = (*t).max(ts);
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
        if self.latest.get(&key) == Some(&t) {
            self.latest.remove(&key);
            return true;
        }
        false
    }
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
        assert_eq!(w.check(k, Some(0)), Seen::New);
        assert_eq!(w.check(k, Some(30 * MIN)), Seen::Duplicate);
        assert_eq!(w.check(k, Some(60 * MIN)), Seen::Duplicate);
        // Past the window the key is forgotten and written again.
        assert_eq!(w.check(k, Some(61 * MIN)), Seen::New);
        assert_eq!(w.check(k, Some(62 * MIN)), Seen::Duplicate);
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn stream_time_not_record_order_expires_keys() {
        let mut w = KeyWindow::new(Duration::from_secs(60), 1_000_000);
        let (a, b) = (key_hash([b"a".as_slice()]), key_hash([b"b".as_slice()]));
        assert_eq!(w.check(a, Some(10 * MIN)), Seen::New);
        // A late record: older than the stream time, still within the window.
        assert_eq!(w.check(b, Some(10 * MIN - 30_000)), Seen::New);
        assert_eq!(w.check(b, None), Seen::Duplicate);
        // The stream moves on two minutes: both are gone.
        assert_eq!(
            w.check(key_hash([b"c".as_slice()]), Some(12 * MIN)),
            Seen::New
        );
        assert_eq!(w.len(), 1);
        assert_eq!(w.check(a, None), Seen::New);
    }

    #[test]
    fn the_cap_forgets_the_oldest_first() {
        let mut w = KeyWindow::new(Duration::from_secs(3600), 3);
        for i in 0..5u64 {
            w.check(i as u128, Some(i as i64));
        }
        assert_eq!(w.len(), 3);
        assert_eq!(w.evicted_early(), 2);
        assert_eq!(w.check(0, Some(6)), Seen::New, "evicted early");
        assert_eq!(w.check(4, Some(6)), Seen::Duplicate);
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
                let got = w.check(key as u128, ts);
                prop_assert_eq!(got == Seen::Duplicate, dup, "key {} ts {:?}", key, ts);
                if !dup {
                    written.push((key, t));
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
            let answers: Vec<Seen> = records.iter().map(|&(k, t)| first.check(k as u128, Some(t))).collect();
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
                prop_assert_eq!(second.check(k as u128, Some(t)), answers[i]);
            }
        }
    }
}
