//! The partitions one process holds, and the decisions that span them: the
//! sink and the model drive this one machine.
//!
//! In: the group's word (a partition held in a new generation, activated,
//! revoked or lost), a lease's word (taken by another owner, run out while
//! leaving), the ends of the slices of batches in flight, the commits the
//! group stored. Out: [`Act`]s for the driver (abandon a generation's
//! work, end a lease, hand a revoked partition off), the positions to
//! commit, and the wait before a taken partition is claimed back. Each
//! partition is one [`Held`]: the protocol's [`Partition`] and what the
//! driver keeps beside it (`X`: the sink's DLQ letters, registry values and
//! abandon token; the model's leases and claim).
//!
//! One generation of a partition at a time: a new one abandons the older
//! (active, or revoked and finishing), so its claim's fence covers the
//! older one's inserts. Nothing here reads a clock or a lease: the driver
//! passes the time and whether a lease is live, and carries out the acts
//! on its own lease table and tasks.

use crate::acks::Ticket;
use crate::claim::taken_again;
use crate::deadline::Moment;
use crate::dedup::{KeyHash, KeyWindow, Window};
use crate::offset::{NextOffset, Offset};
use crate::partition::{HandOff, Partition, Phase};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// A partition held in one generation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Held<T, W, X> {
    pub core: Partition<T, W>,
    /// When it went active.
    pub since: Option<T>,
    /// What the driver keeps beside the core.
    pub extra: X,
}

/// What the driver does for the machine, in the order given.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Act<K, T, W, X> {
    /// This generation of `key` is over and no longer held: its work
    /// stops (its rows in flight leave their batches) and its lease ends.
    Abandon { key: K, held: Arc<Held<T, W, X>> },
    /// Revoked: the lease of this generation is not renewed any more; it
    /// bounds the batches still in flight.
    Leave { key: K, generation: u64 },
    /// A revoked partition whose batches have all ended, no longer held:
    /// commit, then mark the register clean, as [`HandOff`] says; its
    /// lease ends.
    HandOff {
        key: K,
        generation: u64,
        hand_off: HandOff,
    },
}

/// How the group took partitions from this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revoke {
    /// Without waiting for it (lost): let go at once.
    Lost,
    /// Exactly-once: an active partition leaves (its batches in flight end
    /// under its lease, then it hands off); one still preparing is let go.
    Leave,
    /// At-least-once: the next owner starts at this one's commit, so the
    /// driver waits for the partitions' inserts, commits, then
    /// [`Machine::let_go`].
    Drain,
}

/// A slice's end as it concerns its partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceEnd {
    /// Below it no conditional row waits for a fate any more (when
    /// durable).
    pub below: Option<NextOffset>,
    /// The partition is leaving: it may hand off now
    /// ([`Machine::hand_off`]).
    pub leaving: bool,
}

/// The partitions one process holds (`K`: how it names a partition; `T`:
/// its clock; `W`: its key windows; `X`: what it keeps beside each).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Machine<K, T, W = KeyWindow, X = ()> {
    held: BTreeMap<K, Arc<Held<T, W, X>>>,
    /// How often each partition was taken from this process since the
    /// group last assigned it ([`Machine::taken`]); never zero.
    taken: BTreeMap<K, u32>,
    out: Vec<Act<K, T, W, X>>,
}

impl<K, T, W, X> Default for Machine<K, T, W, X> {
    fn default() -> Self {
        Self {
            held: BTreeMap::new(),
            taken: BTreeMap::new(),
            out: Vec::new(),
        }
    }
}

impl<K: Ord + Clone, T: Moment, W: Window + Clone, X: Clone> Machine<K, T, W, X> {
    pub fn new() -> Self {
        Self::default()
    }

    /// The acts decided since the last call, in order. The driver carries
    /// them out after each call that changes the machine, before the next.
    pub fn take_acts(&mut self) -> Vec<Act<K, T, W, X>> {
        std::mem::take(&mut self.out)
    }

    pub fn get(&self, key: &K) -> Option<&Held<T, W, X>> {
        self.held.get(key).map(Arc::as_ref)
    }

    pub fn get_mut(&mut self, key: &K) -> Option<&mut Held<T, W, X>> {
        self.held.get_mut(key).map(Arc::make_mut)
    }

    /// Every partition held, by key.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &Held<T, W, X>)> {
        self.held.iter().map(|(k, h)| (k, h.as_ref()))
    }

    /// Every partition held, by key, to change.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut Held<T, W, X>)> {
        self.held.iter_mut().map(|(k, h)| (k, Arc::make_mut(h)))
    }

    /// How often `key` was taken from this process since the group last
    /// assigned it here.
    pub fn takings(&self, key: &K) -> u32 {
        self.taken.get(key).copied().unwrap_or(0)
    }

    /// Holds `core` (a new generation of `key`, preparing, or active where
    /// nothing needs preparing); an older generation is abandoned.
    pub fn hold(&mut self, key: K, core: Partition<T, W>, extra: X) {
        let held = Held {
            core,
            since: None,
            extra,
        };
        if let Some(older) = self.held.insert(key.clone(), Arc::new(held)) {
            self.out.push(Act::Abandon { key, held: older });
        }
    }

    /// Whether `key` is being prepared in `generation`.
    pub fn preparing(&self, key: &K, generation: u64) -> bool {
        self.get(key).is_some_and(|h| {
            h.core.generation() == generation && h.core.phase() == Phase::Preparing
        })
    }

    /// `key`, prepared in `generation`, reads from `start` on at `now`
    /// ([`Partition::activate`]); false (nothing changes) if that
    /// generation is not the one being prepared.
    pub fn activate(
        &mut self,
        key: &K,
        generation: u64,
        now: T,
        start: NextOffset,
        check_through: Option<Offset>,
        keys: Option<W>,
    ) -> bool {
        if !self.preparing(key, generation) {
            return false;
        }
        let Some(held) = self.get_mut(key) else {
            return false;
        };
        held.core.activate(start, check_through, keys);
        held.since = Some(now);
        true
    }

    /// The group took `keys` from this process, `how`. A new assignment
    /// counts its takings afresh. Returns the keys held in `Revoke::Leave`
    /// that now leave (each may hand off at once: [`Machine::hand_off`]),
    /// or in `Revoke::Drain` those whose inserts the driver waits for.
    pub fn revoke(&mut self, keys: &[K], how: Revoke) -> Vec<K> {
        let mut out = Vec::new();
        for key in keys {
            let Some(phase) = self.get(key).map(|h| h.core.phase()) else {
                continue;
            };
            self.taken.remove(key);
            match (how, phase) {
                (Revoke::Lost, _) | (Revoke::Leave, Phase::Preparing) => self.let_go(key),
                // Revoked again: it is leaving already.
                (Revoke::Leave, Phase::Leaving) => {}
                (Revoke::Leave, Phase::Active) => {
                    let Some(held) = self.get_mut(key) else {
                        continue;
                    };
                    held.core.leave();
                    let generation = held.core.generation();
                    self.out.push(Act::Leave {
                        key: key.clone(),
                        generation,
                    });
                    out.push(key.clone());
                }
                (Revoke::Drain, _) => out.push(key.clone()),
            }
        }
        out
    }

    /// Lets `key` go, whatever its phase: its work is abandoned.
    pub fn let_go(&mut self, key: &K) {
        if let Some(held) = self.held.remove(key) {
            self.out.push(Act::Abandon {
                key: key.clone(),
                held,
            });
        }
    }

    /// Another owner took `key` from this process's `generation` at `now`:
    /// if that generation is active here, its work is abandoned and the
    /// answer is how long to wait before claiming it back
    /// ([`taken_again`]). A revoked partition is not claimed back (its
    /// lease runs out: [`Machine::expire`]), nor an older generation.
    pub fn taken(
        &mut self,
        key: &K,
        generation: u64,
        now: T,
        fence_wait: Duration,
    ) -> Option<Duration> {
        let held = self.get(key)?;
        if held.core.generation() != generation || held.core.phase() != Phase::Active {
            return None;
        }
        let since = held.since;
        self.let_go(key);
        let taken = self.taken.entry(key.clone()).or_default();
        Some(taken_again(taken, since.map(|s| now.since(s)), fence_wait))
    }

    /// A revoked `key` whose lease is not `live` any more is let go, its
    /// batches in flight with it (the next owner may have claimed it).
    /// True if it was.
    pub fn expire(&mut self, key: &K, live: bool) -> bool {
        let leaving = self
            .get(key)
            .is_some_and(|h| h.core.phase() == Phase::Leaving);
        if !leaving || live {
            return false;
        }
        self.let_go(key);
        true
    }

    /// Whether revoked `key` hands off now, its lease `live` or not
    /// ([`Partition::hand_off`]); if so it is no longer held, and
    /// [`Act::HandOff`] says what to do.
    pub fn hand_off(&mut self, key: &K, live: bool) -> bool {
        let Some(hand_off) = self.get(key).and_then(|h| h.core.hand_off(live)) else {
            return false;
        };
        if let Some(held) = self.held.remove(key) {
            self.out.push(Act::HandOff {
                key: key.clone(),
                generation: held.core.generation(),
                hand_off,
            });
        }
        true
    }

    /// A slice of `key`'s rows cut by `generation` ended
    /// ([`Partition::settle`]); `None` if that generation is not held, or
    /// not active or leaving, any more (its slices count for nothing).
    pub fn slice_done(
        &mut self,
        key: &K,
        generation: u64,
        ticket: Ticket,
        copies: &[Offset],
        durable: bool,
        rejected: impl IntoIterator<Item = (KeyHash, Offset)>,
    ) -> Option<SliceEnd> {
        let held = self.get(key)?;
        if held.core.generation() != generation || held.core.phase() == Phase::Preparing {
            return None;
        }
        let held = self.get_mut(key)?;
        let below = held.core.settle(ticket, copies, durable, rejected);
        Some(SliceEnd {
            below,
            leaving: held.core.phase() == Phase::Leaving,
        })
    }

    /// The positions to commit, by key and generation: of every partition
    /// held (of `only`, if given) that read something and whose durable
    /// frontier moved, each only if `may_write` (its lease is live, in
    /// exactly-once mode). A revoked partition's too: what its batches
    /// made durable is committed as it goes, under its lease.
    pub fn to_commit(
        &self,
        only: Option<&[K]>,
        may_write: impl Fn(&K, u64) -> bool,
    ) -> Vec<(K, u64, NextOffset)> {
        self.held
            .iter()
            .filter(|(k, h)| {
                only.is_none_or(|o| o.contains(k)) && h.core.phase() != Phase::Preparing
            })
            .filter_map(|(k, h)| {
                let generation = h.core.generation();
                let at = h.core.to_commit(may_write(k, generation))?;
                Some((k.clone(), generation, at))
            })
            .collect()
    }

    /// Every active partition offers its frontier to the next commit again
    /// ([`Partition::recommit`]), moved or not: a position the group
    /// stored can be overwritten by an older one (a revoked owner's commit
    /// that landed late, which the broker takes from any member of the
    /// group) or lost, and nothing else would repair it until the partition
    /// reads a new record. Not a leaving one: its commits are the stale
    /// ones.
    pub fn recommit(&mut self) {
        let active: Vec<K> = self
            .iter()
            .filter(|(_, h)| h.core.phase() == Phase::Active)
            .map(|(k, _)| k.clone())
            .collect();
        for key in active {
            if let Some(h) = self.get_mut(&key) {
                h.core.recommit();
            }
        }
    }

    /// The group stored `at` as `key`'s commit, asked for by `generation`.
    pub fn committed(&mut self, key: &K, generation: u64, at: NextOffset) {
        let held = self.get(key);
        if held.is_some_and(|h| h.core.generation() == generation) {
            if let Some(h) = self.get_mut(key) {
                h.core.committed(at);
            }
        }
    }

    /// The stop, once every insert ended or ran out of time: returns the
    /// partitions that went active (`(key, generation)`), whose hand-off
    /// may be marked clean if the inserts `drained`; every partition is
    /// abandoned. The driver reads their leases (a clean mark only under a
    /// live one) before it carries out the abandons, which end them.
    pub fn stop(&mut self) -> Vec<(K, u64)> {
        let went_active = self
            .iter()
            .filter(|(_, h)| h.core.phase() != Phase::Preparing)
            .map(|(k, h)| (k.clone(), h.core.generation()))
            .collect();
        let keys: Vec<K> = self.held.keys().cloned().collect();
        for key in &keys {
            self.let_go(key);
        }
        went_active
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{BatchLimits, PartitionId};
    use crate::deadline::Millis;

    type M = Machine<i32, Millis, KeyWindow, &'static str>;

    fn core(p: i32, generation: u64, phase: Phase) -> Partition<Millis> {
        let id = PartitionId {
            topic: "t".into(),
            partition: p,
        };
        let limits = BatchLimits {
            max_rows: 10,
            max_bytes: 1 << 20,
            max_age: Duration::from_secs(1),
            aligned: false,
        };
        Partition::new(id, limits, generation, phase)
    }

    /// Holds `p` in `generation`, active from offset 0, one record read
    /// and cut.
    fn active_with_one_cut(m: &mut M, p: i32, generation: u64) -> Ticket {
        active_at(m, p, generation, Millis(0))
    }

    fn active_at(m: &mut M, p: i32, generation: u64, now: Millis) -> Ticket {
        m.hold(p, core(p, generation, Phase::Preparing), "x");
        assert!(m.activate(&p, generation, now, NextOffset(0), None, None));
        let held = m.get_mut(&p).unwrap();
        held.core.read(Offset(0));
        held.core
            .push(Offset(0), Millis(0), |b| {
                b.push(b'r');
                Ok::<_, ()>(())
            })
            .unwrap();
        held.core.cut().unwrap().ticket
    }

    #[test]
    fn a_new_generation_abandons_the_older_one() {
        let mut m = M::new();
        m.hold(1, core(1, 1, Phase::Preparing), "old");
        m.hold(1, core(1, 2, Phase::Preparing), "new");
        let acts = m.take_acts();
        assert!(matches!(&acts[..], [Act::Abandon { key: 1, held }] if held.extra == "old"));
        assert!(!m.activate(&1, 1, Millis(0), NextOffset(0), None, None));
        assert!(m.activate(&1, 2, Millis(0), NextOffset(0), None, None));
    }

    #[test]
    fn a_revoked_partition_commits_as_it_goes_and_hands_off_once_its_slices_end() {
        let mut m = M::new();
        let ticket = active_with_one_cut(&mut m, 1, 1);
        assert_eq!(m.revoke(&[1], Revoke::Leave), vec![1]);
        assert!(matches!(
            m.take_acts().into_iter().next(),
            Some(Act::Leave {
                key: 1,
                generation: 1
            })
        ));
        // In flight: no hand-off yet, nothing to commit.
        assert!(!m.hand_off(&1, true));
        assert_eq!(m.to_commit(None, |_, _| true), vec![(1, 1, NextOffset(0))]);
        let end = m.slice_done(&1, 1, ticket, &[], true, []).unwrap();
        assert!(end.leaving);
        assert_eq!(m.to_commit(None, |_, _| true), vec![(1, 1, NextOffset(1))]);
        assert!(m.to_commit(None, |_, _| false).is_empty());
        assert!(m.hand_off(&1, true));
        assert!(m.get(&1).is_none());
        let acts = m.take_acts();
        let HandOff { commit, clean } = match &acts[..] {
            [Act::HandOff { hand_off, .. }] => *hand_off,
            other => panic!("{other:?}"),
        };
        assert_eq!((commit, clean), (Some(NextOffset(1)), true));
    }

    #[test]
    fn an_active_partition_commits_its_unmoved_frontier_again_when_asked() {
        let mut m = M::new();
        let ticket = active_with_one_cut(&mut m, 1, 1);
        m.slice_done(&1, 1, ticket, &[], true, []);
        let ticket = active_with_one_cut(&mut m, 2, 1);
        m.slice_done(&2, 1, ticket, &[], true, []);
        m.revoke(&[2], Revoke::Leave);
        for (k, g, at) in m.to_commit(None, |_, _| true) {
            m.committed(&k, g, at);
        }
        assert!(m.to_commit(None, |_, _| true).is_empty(), "stored once");
        m.recommit();
        // The active one again; not the leaving one, nor without a lease.
        assert_eq!(m.to_commit(None, |_, _| true), vec![(1, 1, NextOffset(1))]);
        assert!(m.to_commit(None, |_, _| false).is_empty());
    }

    #[test]
    fn a_slice_of_an_older_generation_counts_for_nothing() {
        let mut m = M::new();
        let ticket = active_with_one_cut(&mut m, 1, 1);
        active_with_one_cut(&mut m, 1, 2);
        assert_eq!(m.slice_done(&1, 1, ticket, &[], true, []), None);
        assert_eq!(m.to_commit(None, |_, _| true), vec![(1, 2, NextOffset(0))]);
    }

    #[test]
    fn a_taken_partition_waits_longer_each_time_until_it_was_held_two_fences() {
        let fence = Duration::from_secs(10);
        let mut m = M::new();
        active_with_one_cut(&mut m, 1, 1);
        // Not the generation held, or not active: ignored.
        assert_eq!(m.taken(&1, 2, Millis(0), fence), None);
        assert_eq!(m.taken(&1, 1, Millis(1_000), fence), Some(fence));
        assert!(m.get(&1).is_none());
        assert!(matches!(
            m.take_acts().into_iter().next(),
            Some(Act::Abandon { key: 1, .. })
        ));
        active_at(&mut m, 1, 2, Millis(1_000));
        assert_eq!(m.taken(&1, 2, Millis(2_000), fence), Some(fence * 2));
        active_at(&mut m, 1, 3, Millis(2_000));
        assert_eq!(m.taken(&1, 3, Millis(3_000), fence), Some(fence * 4));
        active_at(&mut m, 1, 4, Millis(3_000));
        assert_eq!(m.taken(&1, 4, Millis(4_000), fence), Some(fence * 4));
        // Held for more than two fences: counted afresh.
        active_at(&mut m, 1, 5, Millis(4_000));
        assert_eq!(m.taken(&1, 5, Millis(30_000), fence), Some(fence));
        // A revocation counts afresh too; a leaving one is not taken.
        active_at(&mut m, 1, 6, Millis(30_000));
        assert_eq!(m.taken(&1, 6, Millis(30_001), fence), Some(fence * 2));
        active_at(&mut m, 1, 7, Millis(30_001));
        m.revoke(&[1], Revoke::Leave);
        assert_eq!(m.taken(&1, 7, Millis(30_002), fence), None);
        active_at(&mut m, 1, 8, Millis(30_002));
        assert_eq!(m.taken(&1, 8, Millis(30_003), fence), Some(fence));
    }

    #[test]
    fn a_leaving_partition_whose_lease_ran_out_is_let_go() {
        let mut m = M::new();
        active_with_one_cut(&mut m, 1, 1);
        assert!(!m.expire(&1, false), "active, not leaving");
        m.revoke(&[1], Revoke::Leave);
        assert!(!m.expire(&1, true));
        assert!(m.expire(&1, false));
        let acts = m.take_acts();
        assert!(matches!(
            &acts[..],
            [Act::Leave { .. }, Act::Abandon { key: 1, .. }]
        ));
    }

    #[test]
    fn revocations_let_go_what_was_preparing_or_lost() {
        let mut m = M::new();
        m.hold(1, core(1, 1, Phase::Preparing), "p");
        active_with_one_cut(&mut m, 2, 1);
        active_with_one_cut(&mut m, 3, 1);
        m.take_acts();
        assert_eq!(m.revoke(&[1, 2], Revoke::Leave), vec![2]);
        assert!(m.get(&1).is_none() && m.get(&2).is_some());
        assert!(m.revoke(&[3], Revoke::Lost).is_empty());
        assert!(m.get(&3).is_none());
        assert_eq!(m.revoke(&[2, 9], Revoke::Drain), vec![2]);
        assert_eq!(m.stop(), vec![(2, 1)]);
        assert!(m.iter().next().is_none());
    }
}
