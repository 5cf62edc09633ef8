//! The model for stateright: the actions, the properties, a readable trace.
//!
//! In: [`Rules`], [`Bounds`], [`Settings`]. Out: a [`stateright::Model`]
//! whose checker explores every interleaving of the processes' steps
//! ([`crate::sink::take`]) with what the world does on its own: time
//! passing, an INSERT arriving (refused after its deadline), committing (or
//! rejected at a row, having stored none or the rows before it) or running
//! out of time, a rebalance, a crash, a lost commit, a clean mark landing.

use crate::sink::{self, Step};
use crate::world::{Claim, Partition, Parts, Rewrite, Wait, World};
use crate::{Bounds, Rules, Settings, Start, Struck};
use sluice_protocol::attempt::Answer;
use sluice_protocol::deadline::{Millis, Moment};
use sluice_protocol::lease::Owner;
use sluice_protocol::partition::Phase as Held;
use sluice_protocol::resume::Committed;
use sluice_protocol::Row;
use stateright::{Model, Path, Property};
use std::time::Duration;

/// The protocol under `rules`, within `bounds`.
#[derive(Debug, Clone)]
pub struct Sluice {
    pub rules: Rules,
    pub bounds: Bounds,
    pub settings: Settings,
}

impl Sluice {
    pub fn new(rules: Rules, bounds: Bounds) -> Self {
        assert!(
            bounds.keys.is_empty() || bounds.keys.len() == bounds.records as usize,
            "one key per record, or none"
        );
        if let Some(f) = bounds.fair {
            assert!(
                f.recovery < bounds.horizon,
                "a recovery time within the horizon, or liveness is never checked"
            );
        }
        Sluice {
            rules,
            bounds,
            settings: Settings::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// A second passes.
    Tick,
    /// The coordinator assigns partition `q` to process `p`: `(p, q)`.
    Rebalance(usize, usize),
    /// The broker forgets a partition's committed offset.
    LoseCommit(usize),
    /// The process crashes and restarts with a new id.
    Crash(usize),
    /// Insert `i` reaches server `s` (refused after its deadline on that
    /// server's clock).
    Arrive(usize, u8),
    /// Insert `i` ends: it commits its rows, or, holding a row ClickHouse
    /// rejects, it stores none and names the first such row.
    Store(usize),
    /// Insert `i`, holding a row ClickHouse rejects after its first row,
    /// stores the rows before it (a partial insert), then names it.
    StoreBefore(usize),
    /// Insert `i`, running, stores its first `k` rows and is refused for
    /// holding too many table partitions (code 252).
    Refuse(usize, usize),
    /// The clean mark in flight for a partition lands in the register.
    LandMark(usize),
    /// The rewrite in flight lands in the register.
    LandRewrite,
    /// The broker forgets a partition's register entry.
    Forget(usize),
    /// Letter `i` lands in the DLQ, and its sender hears of it.
    LandLetter(usize),
    /// Process `p` takes a step.
    Proc(usize, Step),
}

/// The steps a process takes over all its partitions: a read of the
/// register, a commit, and its batch's.
const PROCESS_STEPS: [Step; 6] = [
    Step::Renew,
    Step::Commit,
    Step::Fence(0),
    Step::Reconcile,
    Step::Send,
    Step::GiveUp,
];

impl Model for Sluice {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        let mut w = World::new(&self.bounds);
        for q in 0..self.bounds.partitions {
            match self.bounds.start {
                Start::Owned => {
                    w.parts[q].register = Owner::Process(w.procs[0].id);
                    w.procs[0].heard[q] = 1;
                    // Assigned, claimed and positioned before the search.
                    let start = sluice_protocol::claim::Start::Now;
                    let id = w.procs[0].id;
                    let claim = Claim::new(id, 1, Committed::Nothing, &self.settings, start);
                    sink::claiming(self, &mut w.procs[0], q, claim);
                    sink::activate(self, &mut w, 0, q, 1, Committed::Nothing, Millis(0));
                }
                Start::CleanToBoth | Start::SharedByBoth => {
                    w.parts[q].register = Owner::Clean;
                    w.parts[q].group.shared = self.bounds.start == Start::SharedByBoth;
                    for p in &mut w.procs {
                        p.heard[q] = 1;
                        let start = sluice_protocol::claim::Start::Now;
                        let claim = Claim::new(p.id, 1, Committed::Nothing, &self.settings, start);
                        sink::claiming(self, p, q, claim);
                    }
                }
            }
        }
        vec![w]
    }

    fn actions(&self, w: &World, actions: &mut Vec<Action>) {
        if let Some(hear) = self.ample(w) {
            actions.push(hear);
            return;
        }
        // Only actions that may be enabled: the others would be refused by
        // `step` (which clones the world first); leaving them out changes
        // no state and no path, only the time spent.
        let left = &w.left;
        if w.now < Millis(self.bounds.horizon.as_millis() as u64) {
            actions.push(Action::Tick);
        }
        let parts = self.bounds.partitions;
        for (p, proc) in w.procs.iter().enumerate() {
            if left.crashes > 0 {
                actions.push(Action::Crash(p));
            }
            if left.rebalances > 0 {
                for q in self.struck() {
                    let to_member = w.parts[q].group.member == Some(p);
                    if !(self.bounds.moves && to_member) {
                        actions.push(Action::Rebalance(p, q));
                    }
                }
            }
            let mut any_active = false;
            let mut cuttable = 0u8;
            for q in 0..parts {
                let step = |s: Step| Action::Proc(p, s);
                let Some(part) = proc.parts.get(&q) else {
                    actions.push(step(Step::Hear(q)));
                    continue;
                };
                match part.core.phase() {
                    Held::Preparing => {
                        actions.extend([step(Step::Revoke(q)), step(Step::Claim(q))])
                    }
                    phase => {
                        any_active = true;
                        match phase == Held::Leaving {
                            false => {
                                cuttable |= 1 << q;
                                actions.push(step(Step::Revoke(q)));
                            }
                            true => actions.extend([step(Step::Settle(q)), step(Step::Expire(q))]),
                        }
                        match part.extra.rewrite {
                            Rewrite::Decided => actions.push(step(Step::Rewrite(q))),
                            Rewrite::Stored => actions.push(step(Step::RewriteAcked(q))),
                            Rewrite::No | Rewrite::Sent => {}
                        }
                    }
                }
            }
            match &proc.job {
                Some(job) => {
                    actions.extend(PROCESS_STEPS[..2].iter().map(|&s| Action::Proc(p, s)));
                    let fence = (0..self.bounds.servers).map(|s| Action::Proc(p, Step::Fence(s)));
                    match job.wait {
                        Wait::Ready => {
                            actions.extend(fence);
                            actions.push(Action::Proc(p, Step::Reconcile));
                            actions.push(Action::Proc(p, Step::Send));
                        }
                        Wait::Fencing(_) => actions.extend(fence),
                        Wait::Fenced => actions.push(Action::Proc(p, Step::Reconcile)),
                        Wait::InFlight { .. } => actions.push(Action::Proc(p, Step::GiveUp)),
                        Wait::Letters => {}
                    }
                }
                None if any_active => {
                    actions.extend(PROCESS_STEPS[..2].iter().map(|&s| Action::Proc(p, s)));
                    for rows in 1..=self.bounds.max_rows {
                        let sets = (1..(1u8 << parts)).filter(|set| set & !cuttable == 0);
                        actions
                            .extend(sets.map(|parts| Action::Proc(p, Step::Cut { rows, parts })));
                    }
                }
                None => {}
            }
        }
        for q in 0..parts {
            if w.parts[q].mark_in_flight {
                actions.push(Action::LandMark(q));
            }
        }
        if left.lost_commits > 0 {
            actions.extend(self.struck().map(Action::LoseCommit));
        }
        if left.forgets > 0 {
            actions.extend(self.struck().map(Action::Forget));
        }
        if w.rewrite_in_flight.is_some() {
            actions.push(Action::LandRewrite);
        }
        for (i, ins) in w.inserts.iter().enumerate() {
            if ins.running_since.is_none() {
                actions.extend((0..self.bounds.servers).map(|s| Action::Arrive(i, s)));
                continue;
            }
            actions.push(Action::Store(i));
            if self.bounds.rejected != 0 {
                actions.push(Action::StoreBefore(i));
            }
            if w.left.refusals > 0 {
                let rows = w.inserts[i].rows.len();
                actions.extend((0..rows.saturating_sub(1)).map(|k| Action::Refuse(i, k)));
            }
        }
        actions.extend((0..w.letters.len()).map(Action::LandLetter));
    }

    fn next_state(&self, w: &World, action: Action) -> Option<World> {
        let mut next = self.step(w, action)?;
        if let Some(f) = self.bounds.fair {
            if next.left != w.left {
                // Faults stop in time for the recovery to be checked.
                let horizon = Millis(self.bounds.horizon.as_millis() as u64);
                if next.now.after(f.recovery) > horizon {
                    return None;
                }
                next.last_fault = next.now;
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no offset is stored twice", |_, w: &World| {
                w.parts.iter().all(|q| q.table.iter().all(|&n| n <= 1))
            }),
            // A record that shares its key with another may be dropped as a
            // duplicate: the next property says when that is right.
            Property::always(
                "the commit passes only offsets in the table or the DLQ",
                |m: &Sluice, w: &World| {
                    w.parts.iter().all(|q| {
                        (0..committed(q))
                            .all(|o| q.table[o] > 0 || q.dlq[o] > 0 || shares_key(&m.bounds, o))
                    })
                },
            ),
            Property::always(
                "a key-dedup drop the commit passes has its key in the table",
                |m: &Sluice, w: &World| {
                    w.parts.iter().all(|q| {
                        (0..committed(q)).all(|o| {
                            let dropped = q.table[o] == 0 && q.dlq[o] == 0;
                            !(dropped && shares_key(&m.bounds, o)) || key_stored(&m.bounds, q, o)
                        })
                    })
                },
            ),
            Property::always("no key is stored twice", |m: &Sluice, w: &World| {
                let keys = m.bounds.keys;
                w.parts.iter().all(|q| {
                    (0..keys.len()).all(|o| {
                        let copies = (0..keys.len()).filter(|&i| keys[i] == keys[o]);
                        copies.map(|i| u32::from(q.table[i])).sum::<u32>() <= 1
                    })
                })
            }),
            Property::sometimes(
                "every record is stored, in the DLQ or a duplicate of a stored key, and committed",
                done,
            ),
            // Liveness, checked as a bounded response: see `Fair`.
            Property::sometimes(
                "the recovery time after the last fault is reached",
                |m: &Sluice, w: &World| match m.bounds.fair {
                    Some(f) => w.now >= w.last_fault.after(f.recovery),
                    None => true,
                },
            ),
            Property::always(
                "once faults stop, every record lands and is committed within the recovery time",
                |m: &Sluice, w: &World| match m.bounds.fair {
                    Some(f) => w.now < w.last_fault.after(f.recovery) || done(m, w),
                    None => true,
                },
            ),
        ]
    }
}

impl Sluice {
    /// The partitions a fault that strikes one partition may strike.
    fn struck(&self) -> std::ops::Range<usize> {
        let parts = self.bounds.partitions;
        match self.bounds.struck {
            Struck::Last => parts - 1..parts,
            Struck::Any => 0..parts,
        }
    }

    /// Partial-order reduction: a step that is independent of every other
    /// action the search could take before it, and invisible to the
    /// properties, may be taken first and alone (an ample set of one
    /// action), since every interleaving that takes it later reaches the
    /// same states, in the same order for everything the properties read.
    ///
    /// The one such step: a process hearing of a new assignment
    /// (`Step::Hear`). It reads the partition's group (generation,
    /// member, shared) and writes only the process's own `heard` and its
    /// phase for that partition, from `Idle` to a claim about to read the
    /// group's commits (which the claim reads again, so the commit at
    /// hearing time is forgotten: `World::normalize`). While that phase is
    /// `Idle`, no other step of the process touches it (each needs it
    /// claiming or active), and no step of anyone reads whether it is
    /// `Idle` or claiming. The only actions that write what it reads or
    /// writes are a rebalance of that partition and a crash of that
    /// process, so it is ample only when neither can happen any more (no
    /// rebalance left, or the partition is not one rebalanced; no crash
    /// left). It does not read the clock, and time passing touches neither
    /// the group nor an idle phase. It changes no table, DLQ or commit
    /// (invisible). It cannot lie on a cycle (it raises `heard`, which no
    /// action lowers), so no action is postponed for ever. Not with
    /// liveness: there time may pass only when no process can move, so
    /// time depends on every step.
    fn ample(&self, w: &World) -> Option<Action> {
        if self.bounds.fair.is_some() || w.left.crashes > 0 {
            return None;
        }
        for (p, proc) in w.procs.iter().enumerate() {
            for (q, part) in w.parts.iter().enumerate() {
                if w.left.rebalances > 0 && self.struck().any(|s| s == q) {
                    continue;
                }
                // `Step::Hear`'s guard.
                let g = &part.group;
                let fresh = g.assigned(p) && proc.heard[q] < g.generation;
                if fresh && proc.parts.get(&q).is_none() {
                    return Some(Action::Proc(p, Step::Hear(q)));
                }
            }
        }
        None
    }

    /// Whether a process or a message can move in `w`: some action that is
    /// not a fault changes the world.
    fn can_move(&self, w: &World) -> bool {
        let mut actions = Vec::new();
        self.actions(w, &mut actions);
        actions.into_iter().any(|a| {
            let fault = matches!(
                a,
                Action::Tick
                    | Action::Rebalance(..)
                    | Action::Crash(_)
                    | Action::LoseCommit(_)
                    | Action::Forget(_)
            );
            // A step that spends a fault (a reset) is one too.
            !fault && self.step(w, a).is_some_and(|n| n != *w && n.left == w.left)
        })
    }

    /// The world after `action`, faults counted as they happen.
    fn step(&self, w: &World, action: Action) -> Option<World> {
        let mut w = match action {
            Action::Proc(p, step) => {
                let mut w = sink::take(self, w, p, step)?;
                w.normalize();
                return Some(w);
            }
            _ => w.clone(),
        };
        match action {
            Action::Tick => {
                let horizon = Millis(self.bounds.horizon.as_millis() as u64);
                if w.now >= horizon {
                    return None;
                }
                // Checking liveness, a second passes with something able
                // to move only as a fault (a stall).
                if self.bounds.fair.is_some() && self.can_move(&w) {
                    w.left.stalls = w.left.stalls.checked_sub(1)?;
                }
                w.now = w.now.after(Duration::from_secs(1));
                // max_execution_time: a query running that long is stopped.
                let t = self.settings.insert_timeout;
                while let Some(i) = w
                    .inserts
                    .iter()
                    .position(|i| i.running_since.is_some_and(|s| w.now.since(s) >= t))
                {
                    w.answer(i, Answer::Unknown);
                }
            }
            Action::Rebalance(p, q) => {
                if w.left.rebalances == 0 {
                    return None;
                }
                w.left.rebalances -= 1;
                let g = &mut w.parts[q].group;
                g.generation += 1;
                g.member = Some(p);
                g.shared = false;
            }
            Action::LoseCommit(q) => {
                if w.left.lost_commits == 0 || w.parts[q].group.committed.is_none() {
                    return None;
                }
                w.left.lost_commits -= 1;
                w.parts[q].group.committed = None;
            }
            Action::Crash(p) => {
                if w.left.crashes == 0 {
                    return None;
                }
                w.left.crashes -= 1;
                w.ids += 1;
                let heard = w.parts.iter().map(|q| q.group.generation).collect();
                let proc = &mut w.procs[p];
                proc.id = w.ids;
                proc.heard = heard;
                proc.parts = Parts::new();
                proc.job = None;
                proc.clock = crate::world::server_clock();
                // Checking liveness, it rejoins the group: a new generation.
                if self.bounds.fair.is_some() {
                    for q in &mut w.parts {
                        q.group.generation += 1;
                    }
                }
            }
            Action::Arrive(i, s) => {
                let server = w.server_ms(s);
                let ins = w.inserts.get_mut(i)?;
                if ins.running_since.is_some() {
                    return None;
                }
                if ins.deadline_ms.is_some_and(|d| server > d) {
                    w.answer(i, Answer::TooLate);
                } else {
                    ins.running_since = Some(w.now);
                }
            }
            Action::Store(i) | Action::StoreBefore(i) => {
                let ins = w.inserts.get(i)?;
                ins.running_since?;
                let rejects = self.bounds.rejected;
                let bad = ins
                    .rows
                    .iter()
                    .position(|r| rejects & (1 << r.offset.0) != 0);
                let stored = match (action, bad) {
                    (Action::Store(_), None) => ins.rows.len(),
                    (Action::Store(_), Some(_)) => 0,
                    (_, Some(at)) if at > 0 => at,
                    _ => return None,
                };
                let landed: Vec<Row> = ins.rows[..stored].to_vec();
                for r in landed {
                    w.parts[r.partition as usize].table[r.offset.0 as usize] += 1;
                }
                match bad {
                    None => {
                        w.answer(i, Answer::Stored);
                    }
                    Some(at) => {
                        let ins = w.inserts.remove(i);
                        sink::on_rejected(self, &mut w, &ins, ins.rows[at]);
                    }
                }
            }
            Action::Refuse(i, k) => {
                let ins = w.inserts.get(i)?;
                ins.running_since?;
                if w.left.refusals == 0 || k + 1 >= ins.rows.len() {
                    return None;
                }
                w.left.refusals -= 1;
                let landed: Vec<Row> = ins.rows[..k].to_vec();
                for r in landed {
                    w.parts[r.partition as usize].table[r.offset.0 as usize] += 1;
                }
                let ins = w.inserts.remove(i);
                if let Some(proc) = w.proc_of(ins.from) {
                    sink::on_refused(proc, &ins, &self.rules);
                }
            }
            Action::LandMark(q) => {
                if !w.parts[q].mark_in_flight {
                    return None;
                }
                w.parts[q].mark_in_flight = false;
                w.parts[q].register = Owner::Clean;
            }
            Action::LandRewrite => {
                let (id, q) = w.rewrite_in_flight.take()?;
                w.parts[q].register = Owner::Process(id);
                for p in w.procs.iter_mut().filter(|p| p.id == id) {
                    let sent = p.parts.get(&q).map(|h| h.extra.rewrite) == Some(Rewrite::Sent);
                    if let Some(part) = p.parts.get_mut(&q).filter(|_| sent) {
                        part.extra.rewrite = Rewrite::Stored;
                    }
                }
            }
            Action::Forget(q) => {
                if w.left.forgets == 0 || w.parts[q].register == Owner::Nobody {
                    return None;
                }
                w.left.forgets -= 1;
                w.parts[q].register = Owner::Nobody;
            }
            Action::LandLetter(i) => {
                if i >= w.letters.len() {
                    return None;
                }
                w.land_letter(i);
            }
            Action::Proc(..) => unreachable!(),
        }
        w.normalize();
        Some(w)
    }
}

/// Every record is stored once, in the DLQ or a duplicate of a stored key,
/// and the group's commit passes it, in every partition.
fn done(m: &Sluice, w: &World) -> bool {
    w.parts.iter().all(|q| {
        let all = q.table.len();
        let landed = (0..all).all(|o| {
            q.table[o] == 1
                || q.dlq[o] > 0
                || (shares_key(&m.bounds, o) && key_stored(&m.bounds, q, o))
        });
        landed && committed(q) == all
    })
}

/// The offsets the group's commit of partition `q` passes (of the records
/// in the log).
fn committed(q: &Partition) -> usize {
    let c = q.group.committed.map_or(0, |c| c.0.max(0) as usize);
    c.min(q.table.len())
}

/// Whether key dedup may drop the record at `o`: another record of its
/// partition has its key.
fn shares_key(b: &Bounds, o: usize) -> bool {
    let keys = b.keys;
    (0..keys.len()).any(|i| i != o && keys[i] == keys[o])
}

/// Whether partition `q`'s rows in the table hold a copy of the key of the
/// record at `o`.
fn key_stored(b: &Bounds, q: &Partition, o: usize) -> bool {
    let keys = b.keys;
    (0..keys.len()).any(|i| keys[i] == keys[o] && q.table[i] > 0)
}

/// A counterexample in plain words: one line per action, with the time and
/// the table after it, and what a batch held or an insert sent.
pub fn trace(m: &Sluice, path: &Path<World, Action>) -> String {
    let mut out = String::new();
    for (state, action) in path.clone().into_vec() {
        let Some(a) = action else { continue };
        let after = m.next_state(&state, a).expect("a step of the path");
        let each = |f: &dyn Fn(&Partition) -> String| match after.parts.as_slice() {
            [one] => f(one),
            parts => format!("[{}]", parts.iter().map(f).collect::<Vec<_>>().join(", ")),
        };
        out.push_str(&format!(
            "t={:>2}s {:<32} table={} dlq={} register={} committed={}{}\n",
            state.now.0 / 1000,
            format!("{a:?}"),
            each(&|q| format!("{:?}", q.table)),
            each(&|q| format!("{:?}", q.dlq)),
            each(&|q| format!("{:?}", q.register)),
            each(&|q| format!("{:?}", q.group.committed.map(|c| c.0))),
            note(m, &state, &after, a),
        ));
    }
    out
}

/// Rows as the trace shows them: offsets, with their partition where the
/// topic has several.
fn shown(m: &Sluice, rows: impl Iterator<Item = Row>) -> String {
    let rows: Vec<String> = rows
        .map(|r| match m.bounds.partitions {
            1 => r.offset.to_string(),
            _ => format!("{}:{}", r.partition, r.offset),
        })
        .collect();
    format!("[{}]", rows.join(", "))
}

/// What a cut batch holds, what an insert sends, or which row ClickHouse
/// rejected.
fn note(m: &Sluice, before: &World, after: &World, a: Action) -> String {
    match a {
        Action::Proc(p, Step::Cut { .. }) => {
            after.procs[p].job.as_ref().map_or_else(String::new, |j| {
                let batch = j.delivery.batch();
                let rows = shown(m, batch.rows());
                let ends: Vec<i64> = batch.ends().iter().map(|e| e.1 .0).collect();
                let cond = j.delivery.conditional();
                match cond.is_empty() {
                    true => format!("  batch to {ends:?}: rows {rows}"),
                    false => {
                        let (r, c): (Vec<Row>, Vec<Row>) = cond.iter().copied().unzip();
                        let (r, c) = (shown(m, r.into_iter()), shown(m, c.into_iter()));
                        format!("  batch to {ends:?}: rows {rows}, rows {r} unless copies {c}")
                    }
                }
            })
        }
        Action::Proc(_, Step::Send) if after.inserts.len() > before.inserts.len() => {
            let sent = after
                .inserts
                .last()
                .map(|i| shown(m, i.rows.iter().copied()));
            format!("  sends {}", sent.unwrap_or_default())
        }
        Action::Refuse(i, k) => {
            let stored = shown(m, before.inserts[i].rows[..k].iter().copied());
            format!("  stores {stored}, then refused: too many table partitions")
        }
        Action::Store(i) | Action::StoreBefore(i) => {
            let rows = &before.inserts[i].rows;
            match rows
                .iter()
                .find(|r| m.bounds.rejected & (1 << r.offset.0) != 0)
            {
                Some(&r) => {
                    let at = shown(m, std::iter::once(r));
                    format!("  rejected at offset {}", at.trim_matches(['[', ']']))
                }
                None => String::new(),
            }
        }
        _ => String::new(),
    }
}
