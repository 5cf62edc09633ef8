//! Partitions changing hands, on the consumer thread: assignment,
//! activation, revocation, a partition taken by another owner, and the
//! hand-off at a stop.
//!
//! Assign (exactly-once, or a key dedup route): the partitions are taken
//! at once (so the group sees them owned) but paused; nothing else happens
//! in the rebalance callback. A [`Preparation`] task, off the consumer
//! thread, claims and fences them and works out where each starts
//! ([`super::super::prepare`]); its plans come back as
//! [`Event::Prepared`], and [`Sink::activate`] seeks and resumes each
//! partition under a lease.
//!
//! Taken: the lease found another owner in the register for an active
//! partition ([`Sink::on_taken`]). Its work is abandoned at once; while the
//! group still assigns it here it is prepared again, after a whole fence,
//! or as soon as the owner that took it hands it off cleanly.
//!
//! Revoke (exactly-once): stop batching the partitions and let go of them at
//! once; their in-flight inserts finish off the consumer thread, under the
//! lease (what they make durable is committed as they land, by
//! [`Sink::commit`]), and then their frontier is committed and they are
//! marked clean in the register ([`Sink::settle_leaving`]). A new owner that is fencing
//! meanwhile stops when it sees the mark. At-least-once waits for the
//! inserts and commits before letting go: the next owner starts there. If the
//! assignment was lost instead, abandon their work at once: the group has
//! already moved on.
//!
//! Stop ([`Sink::stopped`]): flush, drain, commit, and mark the partitions
//! clean, so the next owner need not fence.
//!
//! What becomes of each partition is the protocol's [`Machine`]'s decision
//! (one generation at a time, which revoked partition leaves or is let go,
//! when a leaving one hands off, how long a taken one waits); the sink
//! carries out its [`Act`]s ([`Sink::carry_out`]) on its lease table, its
//! abandon tokens and its queue of actions.
//!
//! [`Machine`]: sluice_protocol::machine::Machine
//! [`Event::Prepared`]: crate::sink::event::Event::Prepared

use super::{Act, Key, Side, Sink};
use crate::owners::Owner;
use crate::sink::action::{Action, AfterSeek};
use crate::sink::event::Prepared;
use crate::sink::prepare::Preparation;
use sluice_protocol::machine::Revoke;
use sluice_protocol::partition::Phase;
use sluice_protocol::Offset;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

impl Sink {
    pub(super) fn name(&self, k: Key) -> String {
        format!("{}[{}]", self.routes[k.0].topic, k.1)
    }

    /// The group assigned `keys` to this process (and the consumer took
    /// them).
    pub(crate) fn on_assign(&mut self, keys: &[Key]) {
        self.assigned = true;
        if keys.is_empty() {
            return;
        }
        tracing::info!(partitions = ?keys.iter().map(|k| self.name(*k)).collect::<Vec<_>>(), "assigned");
        let exactly_once = self.cfg.sink.delivery.is_exactly_once();
        let dedup = keys.iter().any(|k| self.routes[k.0].dedup.is_some());
        if !exactly_once && !dedup {
            for &(ri, p) in keys {
                let core = self.new_core(ri, p, Phase::Active);
                self.parts.hold((ri, p), core, Side::new(Phase::Active));
            }
            self.carry_out();
            // librdkafka keeps a partition paused across an unassign and an
            // assign (a schema wait or backpressure when it was revoked);
            // backpressure pauses it again if it must.
            self.out.push_back(Action::Resume(keys.to_vec()));
            return;
        }
        self.out.push_back(Action::Pause(keys.to_vec()));
        self.prepare(keys, Duration::ZERO, false);
    }

    /// Starts preparing `keys` (paused before) off the consumer thread,
    /// after `wait`; if `watch`, the wait ends once the register
    /// shows them handed off cleanly.
    fn prepare(&mut self, keys: &[Key], wait: Duration, watch: bool) {
        let mut parts: BTreeMap<usize, Vec<(Key, u64)>> = BTreeMap::new();
        let mut given_up = HashMap::new();
        for &(ri, p) in keys {
            // One generation of a partition at a time: an older one of this
            // process (active, or revoked and finishing) is abandoned
            // before this one claims, so the claim's fence covers its
            // inserts too.
            let core = self.new_core(ri, p, Phase::Preparing);
            let generation = core.generation();
            let side = Side::new(Phase::Preparing);
            parts.entry(ri).or_default().push(((ri, p), generation));
            given_up.insert(((ri, p), generation), side.abandon.clone());
            self.parts.hold((ri, p), core, side);
            self.carry_out();
        }
        let prep = Preparation {
            ch: self.ctx.ch.clone(),
            kafka: self.cfg.kafka.clone(),
            routes: self.routes.clone(),
            tx: self.tx.clone(),
            stopping: self.stopping.clone(),
            exactly_once: self.cfg.sink.delivery.is_exactly_once(),
            fence_wait: self.cfg.sink.fence_wait,
            reset: self.cfg.kafka.auto_offset_reset,
            owners: self.owners.clone(),
            me: self.me,
            wait,
            watch,
            given_up,
            parts,
        };
        self.out.push_back(Action::Prepare(Box::new(prep)));
    }

    /// Another owner (`by`) is in the register for a partition this process
    /// was writing: give it up at once and, since the group still assigns
    /// it here, prepare it again. It waits a fence first, doubled each time
    /// it is taken again soon after it went active (up to 4 fences): two
    /// owners that a broken coordinator both believes in would otherwise
    /// take it from each other every fence, each writing a moment.
    ///
    /// The wait ends early when the owner that took it hands it off
    /// cleanly (the coordinator settled on this process): that owner's
    /// fence outlasted this process's inserts, and it drained its own. Not
    /// when the register said `clean` to begin with: nobody fenced this
    /// process's own inserts, which may still be running.
    ///
    /// Only the generation active here is given up
    /// ([`sluice_protocol::machine::Machine::taken`]):
    /// a revoked partition is not claimed back (its lease runs out:
    /// [`Sink::expire_leaving`]), nor one still preparing or of an older
    /// generation.
    pub(super) fn on_taken(&mut self, key: Key, generation: u64, by: Owner) {
        let fence_wait = self.cfg.sink.fence_wait;
        let Some(wait) = self
            .parts
            .taken(&key, generation, Instant::now(), fence_wait)
        else {
            return;
        };
        self.carry_out();
        // Another owner writes it now: its lag is that owner's to report.
        crate::telemetry::partition_left(&self.routes[key.0].topic, key.1);
        self.out.push_back(Action::Pause(vec![key]));
        self.prepare(&[key], wait, matches!(by, Owner::Process(_)));
    }

    /// Sends `p` back to the consumer thread after its next wait
    /// ([`crate::retry`]: from 0.5 s, doubling, up to 5 s).
    pub(super) fn retry_prepared(&mut self, mut prepared: Box<Prepared>) {
        let after = prepared.delays.next_delay();
        prepared.attempts += 1;
        self.out
            .push_back(Action::RetryPrepared { after, prepared });
    }

    /// The group took `keys` from this process (`lost`: it did so without
    /// waiting for this process, which no longer owns them). Returns the
    /// partitions whose inserts must end before the consumer lets go of
    /// them (at least once: the next owner starts at this one's commit);
    /// then [`Sink::let_go`].
    pub(crate) fn on_revoke(&mut self, keys: &[Key], lost: bool) -> Vec<Key> {
        let keys: Vec<Key> = keys
            .iter()
            .copied()
            .filter(|k| self.parts.get(k).is_some())
            .collect();
        if !keys.is_empty() {
            tracing::info!(lost, partitions = ?keys.iter().map(|k| self.name(*k)).collect::<Vec<_>>(), "revoked");
        }
        for k in &keys {
            crate::telemetry::partition_left(&self.routes[k.0].topic, k.1);
            if let Some(p) = self.parts.get_mut(k) {
                // The route's count of what is built may stay high where a
                // partition goes otherwise: that only cuts its batch sooner.
                self.building[k.0].shrink(super::load(p));
                p.core.clear_building();
                // Their records are read again by the next owner.
                let side = &mut p.extra;
                side.building_since = None;
                side.letters.clear();
                side.letter_bytes = 0;
                side.originals.clear();
                side.stalled = None;
                side.reread_for = None;
            }
        }
        let how = if lost {
            // The group has moved on: their work is abandoned at once.
            Revoke::Lost
        } else if self.cfg.sink.delivery.is_exactly_once() {
            // The inserts finish off the consumer thread; the lease still
            // bounds them, and the next owner fences until they are marked
            // clean.
            Revoke::Leave
        } else {
            // The next owner starts where this one committed: the
            // inserts end first.
            Revoke::Drain
        };
        let out = self.parts.revoke(&keys, how);
        self.carry_out();
        match how {
            Revoke::Lost => Vec::new(),
            Revoke::Leave => {
                for k in out {
                    self.settle_leaving(k);
                }
                Vec::new()
            }
            Revoke::Drain => out,
        }
    }

    /// At least once: revoked `keys` whose inserts ended (or ran out of
    /// time) commit their frontier and are let go.
    pub(crate) fn let_go(&mut self, keys: &[Key]) {
        self.commit(Some(keys), true);
        for k in keys {
            self.parts.let_go(k);
        }
        self.carry_out();
    }

    /// A revoked partition whose inserts have all ended commits its
    /// frontier and, under its lease still, is marked clean: the next owner
    /// need not fence (or stops fencing). Off the consumer thread.
    pub(super) fn settle_leaving(&mut self, key: Key) {
        let Some(part) = self.parts.get(&key) else {
            return;
        };
        let live = self.ctx.lease.live(key, part.core.generation());
        if self.parts.hand_off(&key, live) {
            self.carry_out();
        }
    }

    /// Gives up revoked partitions whose lease ran out before their inserts
    /// ended (the next owner claimed them): those inserts are abandoned.
    pub(crate) fn expire_leaving(&mut self) {
        let leaving: Vec<(Key, u64)> = self
            .parts
            .iter()
            .filter(|(_, p)| p.core.phase() == Phase::Leaving)
            .map(|(k, p)| (*k, p.core.generation()))
            .collect();
        for (key, generation) in leaving {
            let live = self.ctx.lease.live(key, generation);
            self.parts.expire(&key, live);
        }
        self.carry_out();
    }

    /// The stop, once every insert ended or ran out of time (`drained`
    /// says which) and the frontier was committed: marks the hand-off
    /// clean if drained, and abandons what is left. Returns why the sink
    /// stopped, if it failed.
    pub(crate) fn stopped(&mut self, drained: bool) -> Option<anyhow::Error> {
        let went_active = self.parts.stop();
        if drained {
            self.hand_off_clean(&went_active);
        }
        self.carry_out();
        tracing::info!(
            records = self.stats.records,
            rows_inserted = self.stats.rows_inserted,
            dlq = self.stats.dlq,
            "stopped"
        );
        self.fatal.take()
    }

    /// Marks `list` (each partition that went active, by generation)
    /// clean in the register after their inserts drained, waiting for the
    /// write: at a stop.
    fn hand_off_clean(&mut self, list: &[(Key, u64)]) {
        let (keys, until) = self.leases_ended(list);
        self.out.push_back(Action::MarkClean {
            keys,
            until,
            wait: true,
        });
    }

    /// Carries out what the machine decided ([`Act`]), in order: a
    /// generation abandoned stops its work and ends its lease; a revoked
    /// one's lease is no longer renewed; one handed off commits, ends its
    /// lease and, if that was live, is marked clean.
    pub(super) fn carry_out(&mut self) {
        let acts = self.parts.take_acts();
        for act in acts {
            match act {
                Act::Abandon { key, held } => {
                    held.extra.abandon.cancel();
                    self.ctx.lease.give_up(key, held.core.generation());
                }
                Act::Leave { key, generation } => self.ctx.lease.leave(key, generation),
                Act::HandOff {
                    key,
                    generation,
                    hand_off,
                } => {
                    if let Some(frontier) = hand_off.commit {
                        self.out.push_back(Action::Commit {
                            offsets: vec![(key, generation, frontier)],
                            sync: false,
                        });
                    }
                    let (keys, until) = self.leases_ended(&[(key, generation)]);
                    if hand_off.clean {
                        self.out.push_back(Action::MarkClean {
                            keys,
                            until,
                            wait: false,
                        });
                    }
                }
            }
        }
    }

    /// Ends the leases of `list` (nothing more is written under them) and
    /// returns the partitions whose lease was still live, which may be
    /// marked clean, with the earliest end of those leases.
    fn leases_ended(&self, list: &[(Key, u64)]) -> (Vec<Key>, Option<Instant>) {
        let lease = &self.ctx.lease;
        let mut first = None::<Instant>;
        let mut keys = Vec::new();
        for &(k, g) in list {
            if let Some(until) = lease.until(k, g) {
                first = Some(first.map_or(until, |f| f.min(until)));
                keys.push(k);
            }
            lease.give_up(k, g);
        }
        (keys, first)
    }

    /// Positions a prepared partition (claimed and fenced, in exactly-once
    /// mode): a seek to its start, then [`Sink::activated`]. A failed seek
    /// is tried again after a backoff ([`Sink::retry_prepared`]).
    pub(super) fn activate(&mut self, p: Prepared) {
        if !self.preparing(&p) {
            return;
        }
        self.out.push_back(Action::Seek {
            key: p.key,
            offset: Offset(p.plan.start.0),
            then: AfterSeek::Activate(Box::new(p)),
        });
    }

    /// Whether `p` is the plan of the generation of its partition being
    /// prepared.
    fn preparing(&self, p: &Prepared) -> bool {
        self.parts.preparing(&p.key, p.generation)
    }

    /// A prepared partition was sought to its start: its records flow;
    /// its lease starts from the read that last showed this process in
    /// the register.
    pub(super) fn activated(&mut self, p: Box<Prepared>) {
        if !self.preparing(&p) {
            return;
        }
        let name = self.name(p.key);
        if self.cfg.sink.delivery.is_exactly_once() {
            self.ctx.lease.hold(p.key, p.generation, p.confirmed);
        }
        let keys = self.routes[p.key.0]
            .dedup
            .as_ref()
            .map(|d| crate::sink::dedup::window(d, p.seeds.as_ref()));
        let start = p.plan.start;
        let check_through = p.plan.check_through;
        let now = Instant::now();
        if !self
            .parts
            .activate(&p.key, p.generation, now, start, check_through, keys)
        {
            return;
        }
        tracing::info!(
            partition = %name,
            start = start.0,
            check_through = ?p.plan.check_through.map(|o| o.0),
            "partition active"
        );
    }
}
