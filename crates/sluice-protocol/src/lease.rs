//! Fencing by time: may this process write a partition right now?
//!
//! Kafka cannot fence a write into ClickHouse, and a member cut off from the
//! group coordinator (or frozen, or stuck in a rebalance) may never hear
//! that its partitions moved. So a writer holds a lease per partition and
//! stops on its own clock.
//!
//! In: the moments reads of the register of owners were sent, and what they
//! found ([`on_register`]); revocations and suspicions. Out: whether, and
//! until when, each generation of a partition may start an insert or send a
//! commit ([`Leases::until`]).
//!
//! - A lease runs [`Leases::term`] from the send time of the read that last
//!   showed this process in the register: a read sent earlier than another
//!   never shortens it.
//! - A revoked partition's lease is no longer renewed ([`Leases::leave`]): it
//!   runs out while its inserts finish.
//! - A suspect lease ([`Leases::suspect`]) ends at once, and only a read sent
//!   after the suspicion renews it: the local clock may not be trusted.

use crate::deadline::Moment;
use std::collections::BTreeMap;
use std::time::Duration;

/// Who the register says writes a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Owner {
    /// The last owner drained its inserts and left: no fence needed.
    Clean,
    /// This process id claimed it and may have inserts in flight.
    Process(u64),
    /// Never claimed, or forgotten by the broker (offset retention).
    Nobody,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Held<T> {
    generation: u64,
    until: T,
    /// Renewals sent before this do not count.
    suspect_since: Option<T>,
    /// Revoked, its inserts finishing: never renewed, it just runs out.
    leaving: bool,
}

/// The leases of one process's partitions `K`, on the local clock `T`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Leases<K, T> {
    held: BTreeMap<K, Held<T>>,
    term: Duration,
    /// The last [`Self::suspect_all`]: a lease confirmed by a read sent
    /// before it starts suspect.
    all_suspect_since: Option<T>,
}

impl<K: Ord + Copy, T: Moment> Leases<K, T> {
    pub fn new(term: Duration) -> Self {
        Self {
            held: BTreeMap::new(),
            term,
            all_suspect_since: None,
        }
    }

    pub fn term(&self) -> Duration {
        self.term
    }

    /// `key` (this `generation` of it) is ours since a read of the register
    /// sent at `sent`.
    pub fn hold(&mut self, key: K, generation: u64, sent: T) {
        let suspect_since = self.all_suspect_since.filter(|&s| sent < s);
        let until = sent.after(self.term);
        let held = Held {
            generation,
            until: suspect_since.map_or(until, |s| until.min(s)),
            suspect_since,
            leaving: false,
        };
        self.held.insert(key, held);
    }

    /// `key` is ours no more (revoked, lost, taken).
    pub fn release(&mut self, key: K) {
        self.held.remove(&key);
    }

    /// This generation of `key` was revoked and is finishing its inserts:
    /// its lease is no longer renewed (whatever the register says) and runs
    /// out.
    pub fn leave(&mut self, key: K, generation: u64) {
        if let Some(h) = self.get_mut(key, generation) {
            h.leaving = true;
        }
    }

    /// Ends the lease of this generation of `key`; false if it had none.
    pub fn give_up(&mut self, key: K, generation: u64) -> bool {
        let ours = self.get_mut(key, generation).is_some();
        if ours {
            self.held.remove(&key);
        }
        ours
    }

    /// A read sent at `sent` found this process in the register for `key`.
    pub fn renew(&mut self, key: K, generation: u64, sent: T) {
        let term = self.term;
        if let Some(h) = self.get_mut(key, generation) {
            if !h.leaving && h.suspect_since.is_none_or(|s| sent >= s) {
                h.until = h.until.max(sent.after(term));
                h.suspect_since = None;
            }
        }
    }

    /// When the lease of this generation of `key` ends, if it is live at
    /// `now`.
    pub fn until(&self, key: K, generation: u64, now: T) -> Option<T> {
        self.held
            .get(&key)
            .filter(|h| h.generation == generation && now < h.until)
            .map(|h| h.until)
    }

    /// Whether this generation of `key` may write at `now`.
    pub fn live(&self, key: K, generation: u64, now: T) -> bool {
        self.until(key, generation, now).is_some()
    }

    /// Ends the lease of this generation of `key` at `now`, until a renewal
    /// read sent from `now` on confirms it.
    pub fn suspect(&mut self, key: K, generation: u64, now: T) {
        if let Some(h) = self.get_mut(key, generation) {
            h.until = h.until.min(now);
            h.suspect_since = Some(now);
        }
    }

    /// [`Self::suspect`] for every lease held: the server's clock ran ahead
    /// of ours, which is what a host suspended under a running process
    /// looks like from inside it (its monotonic clock stood still while the
    /// leases' real time ran out).
    pub fn suspect_all(&mut self, now: T) {
        self.all_suspect_since = Some(now);
        for h in self.held.values_mut() {
            h.until = h.until.min(now);
            h.suspect_since = Some(now);
        }
    }

    /// A lease that ended by `now` ends at `now`, and a suspicion raised by
    /// then is raised at `now`: when they happened no longer changes what
    /// any later call answers, so a model's states that differ only in it
    /// compare equal.
    pub fn normalize(&mut self, now: T) {
        for h in self.held.values_mut() {
            if h.until <= now {
                h.until = now;
            }
            if h.suspect_since.is_some_and(|s| s <= now) {
                h.suspect_since = Some(now);
            }
        }
    }

    /// Every lease held: `(key, generation, leaving)`.
    pub fn held(&self) -> impl Iterator<Item = (K, u64, bool)> + '_ {
        self.held.iter().map(|(k, h)| (*k, h.generation, h.leaving))
    }

    fn get_mut(&mut self, key: K, generation: u64) -> Option<&mut Held<T>> {
        self.held
            .get_mut(&key)
            .filter(|h| h.generation == generation)
    }
}

/// What a read of the register means for one lease held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Renewal {
    /// This process is still the owner: extend the lease from the read.
    Renew,
    /// The broker forgot the entry while the lease is live: write this
    /// process again; the next read renews it.
    Rewrite,
    /// Someone else (or a clean mark) holds it: give the partition up.
    Taken(Owner),
    /// The broker forgot the entry and the lease has ended: nothing says
    /// whether someone claimed it meanwhile. Give the partition up and
    /// claim it again, with a fence.
    Reclaim,
    /// Nothing to do (leaving, or not in the answer).
    Keep,
}

/// What `found`, the register's entry for a partition whose lease is live
/// (`live`) or not and which is `leaving` or not, means for process `me`.
pub fn on_register(found: Option<Owner>, me: u64, live: bool, leaving: bool) -> Renewal {
    match found {
        _ if leaving => Renewal::Keep,
        None => Renewal::Keep,
        Some(Owner::Process(id)) if id == me => Renewal::Renew,
        Some(Owner::Nobody) if live => Renewal::Rewrite,
        Some(Owner::Nobody) => Renewal::Reclaim,
        Some(other) => Renewal::Taken(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::deadline::Millis as Ms;

    #[test]
    fn a_clock_that_ran_ahead_ends_every_lease_until_a_later_read() {
        let mut l = Leases::new(Duration::from_secs(10));
        l.hold(1, 1, Ms(0));
        l.hold(2, 1, Ms(0));
        l.suspect_all(Ms(1_000));
        assert!(!l.live(1, 1, Ms(1_000)) && !l.live(2, 1, Ms(1_000)));
        // A read sent before the suspicion proves nothing.
        l.renew(1, 1, Ms(500));
        assert!(!l.live(1, 1, Ms(1_100)));
        l.renew(1, 1, Ms(1_200));
        assert!(l.live(1, 1, Ms(1_300)) && !l.live(2, 1, Ms(1_300)));
        // A lease taken later on a read sent before the suspicion (a claim
        // read before the host stood still) starts suspect too.
        l.hold(3, 1, Ms(900));
        assert!(!l.live(3, 1, Ms(1_300)));
        l.renew(3, 1, Ms(1_400));
        assert!(l.live(3, 1, Ms(1_500)));
        l.hold(4, 1, Ms(1_100));
        assert!(l.live(4, 1, Ms(1_500)));
    }

    #[test]
    fn a_lease_runs_from_the_send_time_of_its_last_confirmation() {
        let mut l = Leases::new(Duration::from_secs(10));
        let key = (0usize, 3i32);
        assert!(!l.live(key, 1, Ms(0)));
        l.hold(key, 1, Ms(1_000));
        assert_eq!(l.until(key, 1, Ms(5_000)), Some(Ms(11_000)));
        assert!(!l.live(key, 1, Ms(11_000)), "expired");
        l.renew(key, 2, Ms(12_000));
        assert!(
            !l.live(key, 1, Ms(12_000)),
            "another generation's read renews nothing"
        );
        l.renew(key, 1, Ms(12_000));
        assert!(l.live(key, 1, Ms(12_000)));
        assert!(!l.live(key, 2, Ms(12_000)));
        l.renew(key, 1, Ms(1_000));
        assert_eq!(
            l.until(key, 1, Ms(12_000)),
            Some(Ms(22_000)),
            "an older read never shortens it"
        );
        l.suspect(key, 1, Ms(13_000));
        assert!(!l.live(key, 1, Ms(13_000)), "a suspect lease ends at once");
        l.renew(key, 1, Ms(12_999));
        assert!(
            !l.live(key, 1, Ms(13_000)),
            "a read sent before the suspicion renews nothing"
        );
        l.renew(key, 1, Ms(13_000));
        assert!(l.live(key, 1, Ms(13_000)));
        l.leave(key, 1);
        l.renew(key, 1, Ms(20_000));
        assert_eq!(
            l.until(key, 1, Ms(20_000)),
            Some(Ms(23_000)),
            "a leaving lease is not renewed"
        );
        assert_eq!(l.held().collect::<Vec<_>>(), vec![(key, 1, true)]);
        assert!(!l.give_up(key, 2));
        assert!(l.give_up(key, 1));
        assert!(!l.live(key, 1, Ms(20_000)));
        l.hold(key, 3, Ms(0));
        l.release(key);
        l.renew(key, 3, Ms(1));
        assert!(!l.live(key, 3, Ms(1)), "a released lease is not renewed");
    }

    #[test]
    fn what_a_register_entry_means() {
        use Renewal::*;
        let me = 7;
        assert_eq!(on_register(Some(Owner::Process(7)), me, true, false), Renew);
        assert_eq!(
            on_register(Some(Owner::Process(7)), me, false, false),
            Renew
        );
        assert_eq!(on_register(Some(Owner::Nobody), me, true, false), Rewrite);
        assert_eq!(on_register(Some(Owner::Nobody), me, false, false), Reclaim);
        assert_eq!(
            on_register(Some(Owner::Process(8)), me, true, false),
            Taken(Owner::Process(8))
        );
        assert_eq!(
            on_register(Some(Owner::Clean), me, true, false),
            Taken(Owner::Clean)
        );
        assert_eq!(on_register(None, me, true, false), Keep);
        // A leaving lease just runs out, whoever the register names.
        assert_eq!(on_register(Some(Owner::Process(8)), me, true, true), Keep);
    }
}
