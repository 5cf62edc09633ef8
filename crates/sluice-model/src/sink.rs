//! One step of one sink process, in the order the sink takes them.
//!
//! In: the world and the process's step ([`Step`]). Out: the world after
//! it, or `None` where the step cannot be taken now. Each step is one
//! atomic piece of the sink: a read or a write of the register
//! (`sink/prepare.rs`, `sink/lease.rs`), fetching a record and cutting a
//! batch, each record's key dedup verdict included (`sink/state`), one turn
//! of the writer's loop (`sink/writer.rs`: which rows an attempt holds, a
//! row ClickHouse rejected), a batch's completion (the window forgets a
//! rejected copy), a commit or a hand-off (`sink/state/handoff.rs`). The
//! decisions are `sluice-protocol`'s: a process holds its partitions in the
//! sink's own `machine::Machine` (a claim while preparing, then the
//! sink's own `partition::Partition`: records admitted, read and pushed,
//! batches cut, slices settled, commits), whose revocation, claim-back,
//! hand-off, expiry, slice ends and commits are the sink's calls, and a
//! batch's way is the sink's own `Delivery`. The unsafe [`Rules`] replace
//! one decision each (the key window's through [`crate::world::Keys`]).
//! Still the model's own: one step fetches and cuts a batch (the sink
//! reads records one by one), and a job's letters and early settling
//! follow `sink/writer.rs` by hand.

use crate::world::{
    Claim, Insert, Job, Keys, Letter, Part, Parts, Proc, Rewrite, Side, Wait, World,
};
use crate::{
    ClaimConfirm, ClaimYield, DlqConfirm, LateGuard, LostSlice, RefusedInsert, RewriteCheck, Rules,
    Sluice, UnbackedRows,
};
use sluice_protocol::acks::Ticket;
use sluice_protocol::attempt::Answer;
use sluice_protocol::claim::{Do, Start, Why};
use sluice_protocol::deadline::{attempt_deadline, Fence, FenceStep, Millis, Moment};
use sluice_protocol::dedup::{KeyHash, KeyWindow};
use sluice_protocol::delivery::{Delivery, Next};
use sluice_protocol::lease::{on_register, Leases, Owner, Renewal};
use sluice_protocol::machine::{Act, Revoke};
use sluice_protocol::partition::{Admit, Partition, Phase};
use sluice_protocol::resume::{resume_plan, Committed, LogBounds, ResetPolicy};
use sluice_protocol::token::{insert_token, query_id};
use sluice_protocol::{Batch, BatchLimits, NextOffset, Offset, PartitionId, Row};
use std::sync::Arc;
use std::time::Duration;

/// What a process does next. Steps on one partition name it (`q`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Hears that the coordinator assigned it partition `q`.
    Hear(usize),
    /// Hears that partition `q` was revoked.
    Revoke(usize),
    /// The next step of its claim of partition `q`.
    Claim(usize),
    /// Fetches `rows` records of each partition in `parts` (a bit per
    /// partition) and cuts them as one batch.
    Cut { rows: usize, parts: u8 },
    /// Reads the register to renew the leases of its partitions.
    Renew,
    /// Sends the write of itself back into a register entry that forgot it.
    Rewrite(usize),
    /// Hears that write acknowledged.
    RewriteAcked(usize),
    /// Commits the durable frontier of every partition whose frontier
    /// moved.
    Commit,
    /// Revoked partition `q`, whose rows are no longer in flight, hands off.
    Settle(usize),
    /// Revoked partition `q`, whose lease ran out, is given up (its rows
    /// in flight with it).
    Expire(usize),
    /// One look of the fence of the last unsettled attempt, answered by
    /// this server.
    Fence(u8),
    /// Asks which rows of the batch the table holds.
    Reconcile,
    /// Sends the next attempt.
    Send,
    /// Stops waiting for the answer (a timeout, or a reset).
    GiveUp,
}

pub const TABLE: &str = "db.events";
pub const TOPIC: &str = "events";
const KEY: () = ();

/// Takes `step` for process `p`; `None` if it cannot be taken now.
pub fn take(m: &Sluice, w: &World, p: usize, step: Step) -> Option<World> {
    if idle(m, w, p, step) {
        return None;
    }
    let (rules, s) = (m.rules, &m.settings);
    let mut w = w.clone();
    let now = w.now;
    let records = m.bounds.records;
    let id = w.procs[p].id;
    match step {
        Step::Hear(q) => {
            let g = &w.parts.get(q)?.group;
            let fresh = g.assigned(p) && w.procs[p].heard[q] < g.generation;
            if !fresh || w.procs[p].parts.get(&q).is_some() {
                return None;
            }
            let claim = Claim::new(id, g.generation, g.committed(), s, Start::Now);
            w.procs[p].heard[q] = g.generation;
            claiming(m, &mut w.procs[p], q, claim);
        }
        Step::Revoke(q) => {
            let g = &w.parts.get(q)?.group;
            let current = g.assigned(p) && g.generation == generation(&w, p, q)?;
            let leaving = w.procs[p].parts.get(&q)?.core.phase() == Phase::Leaving;
            if current || leaving {
                return None;
            }
            // Let go while claiming; leaving once active.
            w.procs[p].parts.revoke(&[q], Revoke::Leave);
            carry_out(&mut w, p, &rules);
        }
        Step::Claim(q) => {
            // One read, write or look of the claim (`sink/prepare.rs`),
            // decided by the sink's own `Claim`; reads are atomic here.
            let register = w.parts.get(q)?.register;
            let entry = |_: &()| register;
            let c = claim_of(&mut w.procs[p], q)?;
            let (generation, committed) = (c.generation, c.committed);
            match c.claim.next() {
                Do::Done => return None,
                Do::ReadCommits => {
                    c.committed = w.parts[q].group.committed();
                    c.claim.commits_read();
                }
                Do::Read => {
                    if let Some(((), read_at)) = c.claim.read(now, now, entry).pop() {
                        activate(m, &mut w, p, q, generation, committed, read_at);
                    }
                }
                Do::Write => {
                    w.parts[q].register = Owner::Process(id);
                    if rules.claim == ClaimConfirm::TrustWrite {
                        activate(m, &mut w, p, q, generation, committed, now);
                        return Some(w);
                    }
                    claim_of(&mut w.procs[p], q)?.claim.written(now);
                }
                // The backoff may last any time: the step may come at any
                // time.
                Do::Backoff => c.claim.woke(now),
                Do::Wait { until, .. } if now >= until => c.claim.woke(now),
                Do::Wait {
                    until,
                    why: Why::Yield,
                } if rules.claim_yield == ClaimYield::AtOnce => c.claim.woke(until),
                Do::Wait { .. } => {
                    if !c.claim.watched(now, entry) {
                        return None;
                    }
                }
            }
        }
        Step::Cut { rows, parts } => {
            // Fetches `rows` records of each partition named and cuts them
            // as one batch: full (`max_rows`), or cut short by its age.
            let max_rows = m.bounds.max_rows;
            if w.procs[p].job.is_some() || rows == 0 || rows > max_rows || parts == 0 {
                return None;
            }
            let mut slices = Vec::new();
            let mut tickets = Vec::new();
            let mut letters = Vec::new();
            let mut conditional = Vec::new();
            let mut uncertain = false;
            for q in 0..w.parts.len() {
                if parts & (1 << q) == 0 {
                    continue;
                }
                let part = active(&mut w, p, q)?;
                let next = part.core.position()?;
                if rows as i64 > records - next.0 {
                    return None;
                }
                let row_of = |o: Offset| Row::new(q as i32, o.0);
                for o in (next.0..next.0 + rows as i64).map(Offset) {
                    // The sink's intake (`sink/state/record.rs`): admit,
                    // read, then a row, a letter or a drop for its key.
                    if part.core.admit(o, false) != Admit::Take {
                        return None;
                    }
                    part.core.read(o);
                    let row =
                        |buf: &mut Vec<u8>| buf.extend_from_slice(format!("{o}\n").as_bytes());
                    if m.bounds.bad & (1 << o.0) != 0 {
                        // It cannot become a row: the batch accounts for it,
                        // and it goes to the DLQ.
                        part.core.skip(o, now);
                        letters.push(row_of(o));
                    } else if part.core.keyed() {
                        let key = KeyHash::from(m.bounds.keys[o.0 as usize]);
                        part.core
                            .push_keyed(o, None, now, |buf| {
                                row(buf);
                                Ok::<_, ()>(Some(key))
                            })
                            .ok()?;
                    } else {
                        part.core
                            .push(o, now, |buf| {
                                row(buf);
                                Ok::<_, ()>(())
                            })
                            .ok()?;
                    }
                }
                // Full, or cut short by its age (`max_age` is one step):
                // the search picks when.
                let cut = part.core.cut()?;
                tickets.push((q, part.core.generation(), cut.ticket));
                uncertain |= cut.uncertain;
                conditional.extend(cut.conditional.iter().map(|&(r, c)| (row_of(r), row_of(c))));
                slices.push(cut.batch);
            }
            w.letters.extend(letters.iter().map(|&row| Letter {
                from: id,
                row,
                sent: now,
            }));
            if rules.dlq == DlqConfirm::Queued {
                letters.clear();
            }
            // Only a batch with letters remembers when it queued them:
            // the rest stay equal to batches cut at other moments.
            let letters_sent = if letters.is_empty() { Millis(0) } else { now };
            conditional.sort_unstable();
            w.procs[p].job = Some(Arc::new(Job {
                delivery: Delivery::new(Batch::concat(slices), true, uncertain)
                    .with_conditional(conditional, Vec::new()),
                tickets,
                wait: Wait::Ready,
                letters,
                letters_sent,
            }));
        }
        Step::Renew => {
            // One read of the register shows every partition's entry
            // (`sink/lease.rs`); one task reads and writes: no read while
            // it writes.
            let registers: Vec<Owner> = w.parts.iter().map(|q| q.register).collect();
            if w.procs[p]
                .parts
                .iter()
                .any(|(_, part)| part.extra.rewrite != Rewrite::No)
            {
                return None;
            }
            let mut changed = false;
            for (q, &register) in registers.iter().enumerate() {
                let Some(part) = active(&mut w, p, q) else {
                    continue;
                };
                let g = part.core.generation();
                let live = part.extra.leases.live(KEY, g, now);
                let leaving = part.core.phase() == Phase::Leaving;
                match on_register(Some(register), id, live, leaving) {
                    Renewal::Renew => part.extra.leases.renew(KEY, g, now),
                    Renewal::Rewrite => part.extra.rewrite = Rewrite::Decided,
                    Renewal::Taken(by) => {
                        // Someone else claimed it: give it up (its rows in
                        // flight leave the batch) and claim it back after
                        // `fence_wait`.
                        let watch = matches!(by, Owner::Process(_));
                        taken(m, &mut w, p, q, g, watch);
                    }
                    Renewal::Reclaim => taken(m, &mut w, p, q, g, false),
                    Renewal::Keep => continue,
                }
                changed = true;
            }
            if !changed {
                return None;
            }
        }
        Step::Rewrite(q) => {
            let busy = w.rewrite_in_flight.is_some();
            let part = active(&mut w, p, q)?;
            if part.extra.rewrite != Rewrite::Decided || busy {
                return None;
            }
            let live = part.extra.leases.live(KEY, part.core.generation(), now);
            part.extra.rewrite = if live { Rewrite::Sent } else { Rewrite::No };
            if live {
                w.rewrite_in_flight = Some((id, q));
            }
        }
        Step::RewriteAcked(q) => {
            let part = active(&mut w, p, q)?;
            if part.extra.rewrite != Rewrite::Stored {
                return None;
            }
            part.extra.rewrite = Rewrite::No;
            let g = part.core.generation();
            // Acknowledged after the lease ended: it may have landed over
            // a new owner's claim. Claim again.
            if !part.extra.leases.live(KEY, g, now)
                && m.rules.rewrite == RewriteCheck::AckWithinLease
            {
                taken(m, &mut w, p, q, g, false);
            }
        }
        Step::Commit => {
            // One commit of every partition whose frontier moved, each
            // under its live lease (`sink/state`, `commit`).
            let offsets = to_commit(&w.procs[p], now);
            if offsets.is_empty() {
                return None;
            }
            for (q, generation, frontier) in offsets {
                w.procs[p].parts.committed(&q, generation, frontier);
                // Taken whatever the generation: a coordinator that fences
                // stale commits only helps.
                w.parts[q].group.committed = Some(frontier);
            }
        }
        Step::Settle(q) => {
            let live = live(w.procs[p].parts.get(&q)?, now);
            if !w.procs[p].parts.hand_off(&q, live) {
                return None;
            }
            carry_out(&mut w, p, &rules);
        }
        Step::Expire(q) => {
            let live = live(w.procs[p].parts.get(&q)?, now);
            if !w.procs[p].parts.expire(&q, live) {
                return None;
            }
            carry_out(&mut w, p, &rules);
        }
        Step::Fence(at) => {
            if at >= m.bounds.servers {
                return None;
            }
            let server = w.server_ms(at);
            let job = w.procs[p].job.as_ref()?;
            let Next::Reconcile {
                fence: Some(previous),
                ..
            } = job.delivery.next()
            else {
                return None;
            };
            let mut fence = match &job.wait {
                Wait::Ready => {
                    Fence::with_margin(previous.deadline_ms, s.insert_timeout, s.clock_margin_ms)
                }
                Wait::Fencing(f) => *f,
                _ => return None,
            };
            let before = job.wait.clone();
            let running = w.running(&previous.query_id);
            let step = fence.step(server, Some(running));
            // Each look is a reading of the clock of the server answering
            // (kept only where it changes the estimate, so that states that
            // estimate alike compare equal).
            let clock = &mut w.procs[p].clock;
            if clock.ms_at(now) != Some(server) {
                clock.observe(server, now, now, false);
            }
            let job = w.procs[p].job.as_mut().map(Arc::make_mut)?;
            match step {
                FenceStep::Done => job.wait = Wait::Fenced,
                FenceStep::KillAgain => {
                    job.wait = Wait::Fencing(fence);
                    kill(&mut w, &previous.query_id);
                }
                FenceStep::WaitUntil(_) => {
                    job.wait = Wait::Fencing(fence);
                    if before == job.wait {
                        return None;
                    }
                }
            }
        }
        Step::Reconcile => {
            let job = w.procs[p].job.as_ref()?;
            let Next::Reconcile { fence, rows } = job.delivery.next() else {
                return None;
            };
            let fenced = match job.wait {
                Wait::Ready => fence.is_none(),
                Wait::Fenced => true,
                _ => false,
            };
            if !fenced || lease_end(&w.procs[p], now, &rules).is_none() {
                return None;
            }
            let present = w.present(&rows);
            let proc = &mut w.procs[p];
            let job = proc.job.as_mut().map(Arc::make_mut)?;
            job.delivery.reconciled(&present);
            job.wait = Wait::Ready;
            settle_early(proc);
            if proc
                .job
                .as_ref()
                .is_some_and(|j| matches!(j.delivery.next(), Next::Durable(_)))
            {
                durable(proc);
            }
        }
        Step::Send => {
            let server = w.server_ms(0);
            let proc = &mut w.procs[p];
            let lease_end = lease_end(proc, now, &rules)?;
            let job = proc.job.as_mut().map(Arc::make_mut)?;
            if job.wait != Wait::Ready {
                return None;
            }
            let (batch, number) = match job.delivery.next() {
                Next::Insert { rows, number } => (rows, number),
                // Every record went to the DLQ or was dropped for its key:
                // nothing to insert.
                Next::Durable(_) => {
                    durable(proc);
                    return Some(w);
                }
                Next::Reconcile { .. } | Next::Waiting => return None,
            };
            let token = insert_token(TABLE, TOPIC, batch.rows());
            let qid = query_id(&token, number);
            let clock = proc.clock;
            let deadline = attempt_deadline(
                |t| clock.ms_at(t).unwrap_or(server),
                lease_end,
                now,
                s.insert_timeout,
            );
            let sent_deadline = match rules.late {
                LateGuard::ServerDeadline => Some(deadline),
                // The client's own bound, on its own clock.
                LateGuard::ClientTimeout => None,
            };
            let job = proc.job.as_mut().map(Arc::make_mut)?;
            job.delivery.sent(qid.clone(), Some(deadline));
            job.wait = Wait::InFlight { sent: now };
            w.inserts.push(Insert {
                from: id,
                query_id: qid,
                rows: batch.rows().collect(),
                deadline_ms: sent_deadline,
                sent: now,
                running_since: None,
            });
        }
        Step::GiveUp => {
            let timeout = s.insert_timeout;
            let reset_left = w.left.resets > 0;
            let proc = &mut w.procs[p];
            let job = proc.job.as_ref()?;
            let Wait::InFlight { sent } = &job.wait else {
                return None;
            };
            let (query_id, _) = job.delivery.in_flight()?;
            let timed_out = now.since(*sent) >= timeout;
            if !timed_out && !reset_left {
                return None;
            }
            let lost = Insert {
                from: id,
                query_id: query_id.to_string(),
                rows: Vec::new(),
                deadline_ms: None,
                sent: *sent,
                running_since: None,
            };
            on_answer(proc, &lost, Answer::Unknown, now);
            if !timed_out {
                w.left.resets -= 1;
            }
        }
    }
    Some(w)
}

/// Whether `step` is certain to change nothing, as `take` would find after
/// cloning the world (the two most frequent cases: a commit with nothing
/// to commit, a claim waiting that reads nothing new).
fn idle(m: &Sluice, w: &World, p: usize, step: Step) -> bool {
    let now = w.now;
    match step {
        Step::Commit => to_commit(&w.procs[p], now).is_empty(),
        Step::Claim(q) => {
            let Some(c) = w.procs[p]
                .parts
                .get(&q)
                .and_then(|h| h.extra.claim.as_ref())
            else {
                return true;
            };
            match c.claim.next() {
                Do::Done => true,
                Do::Wait { until, why } => {
                    let at_once = why == Why::Yield && m.rules.claim_yield == ClaimYield::AtOnce;
                    let clean = w.parts[q].register == Owner::Clean;
                    now < until && !at_once && !(why.watches() && clean)
                }
                _ => false,
            }
        }
        _ => false,
    }
}

/// When the leases of the partitions the process's batch holds rows of
/// end (the earliest), if every one is live: an attempt starts only then
/// (`sink/writer.rs`). Under [`LostSlice::KeepSending`] a partition no
/// longer held does not count.
fn lease_end(proc: &Proc, now: Millis, rules: &Rules) -> Option<Millis> {
    let job = proc.job.as_ref()?;
    let mut end: Option<Millis> = None;
    for &(q, _, _) in &job.tickets {
        let part = proc
            .parts
            .get(&q)
            .filter(|h| h.core.phase() != Phase::Preparing);
        let until = part.and_then(|h| h.extra.leases.until(KEY, h.core.generation(), now));
        match until {
            Some(u) => end = Some(end.map_or(u, |e: Millis| e.min(u))),
            None if rules.lost_slice == LostSlice::KeepSending && part.is_none() => {}
            None => return None,
        }
    }
    end
}

/// Partition `q` is no longer the process's to write: its rows leave the
/// batch in flight ([`LostSlice::Drop`]), and the batch no longer counts
/// toward its acks.
fn lose(proc: &mut Proc, q: usize, rules: &Rules) {
    let Some(job) = proc.job.as_mut().map(Arc::make_mut) else {
        return;
    };
    if !job.holds(q) {
        return;
    }
    if rules.lost_slice == LostSlice::Drop {
        job.delivery.drop_partition(q as i32);
        job.tickets.retain(|t| t.0 != q);
        job.letters.retain(|r| r.partition != q as i32);
    }
    if job.tickets.is_empty() {
        proc.job = None;
    }
}

/// The job waiting for the answer to request `to`, if any.
fn waiting_for<'a>(proc: &'a mut Proc, to: &Insert) -> Option<&'a mut Job> {
    let job = proc.job.as_ref()?;
    let asked = job.delivery.in_flight().map(|(q, _)| q) == Some(to.query_id.as_str());
    match job.wait {
        Wait::InFlight { sent } if asked && sent == to.sent => proc.job.as_mut().map(Arc::make_mut),
        _ => None,
    }
}

/// The answer to request `to` reaches the writer, if it still waits for it.
pub fn on_answer(proc: &mut Proc, to: &Insert, answer: Answer, now: Millis) {
    let Some(job) = waiting_for(proc, to) else {
        return;
    };
    job.delivery.answered(answer);
    job.wait = Wait::Ready;
    let held: Vec<usize> = job.tickets.iter().map(|t| t.0).collect();
    settle_early(proc);
    if proc
        .job
        .as_ref()
        .is_some_and(|j| matches!(j.delivery.next(), Next::Durable(_)))
    {
        durable(proc);
    }
    // Refused after its deadline: the clock may have stood still.
    if answer == Answer::TooLate {
        for q in held {
            if proc
                .parts
                .get(&q)
                .is_some_and(|h| h.core.phase() != Phase::Preparing)
            {
                if let Some(part) = proc.parts.get_mut(&q) {
                    let g = part.core.generation();
                    part.extra.leases.suspect(KEY, g, now);
                }
            }
        }
    }
}

/// ClickHouse refused request `to` for holding too many table partitions
/// (after storing some of its rows): if its sender still waits for it, the
/// next attempts send shares of half as many rows (`sink/writer.rs`).
pub fn on_refused(proc: &mut Proc, to: &Insert, rules: &Rules) {
    let Some(job) = waiting_for(proc, to) else {
        return;
    };
    job.delivery.answered(match rules.refused {
        RefusedInsert::MayHaveStored => Answer::Refused,
        RefusedInsert::NothingStored => Answer::NotSent,
    });
    job.wait = Wait::Ready;
    // The model refuses only inserts of more than one row: the sink stops
    // on a row that fits no insert.
    job.delivery.split();
}

/// ClickHouse rejected request `to` at `row` (`(at row N)`; the query
/// ended). If its sender still waits for it, the row goes to the DLQ and
/// the rest of the batch is tried again (`sink/writer.rs`).
pub fn on_rejected(m: &Sluice, w: &mut World, to: &Insert, row: Row) {
    let now = w.now;
    let Some(proc) = w.proc_of(to.from) else {
        return;
    };
    let Some(job) = waiting_for(proc, to) else {
        return;
    };
    job.delivery.answered(Answer::Rejected);
    job.delivery.reject([row]);
    job.wait = Wait::Ready;
    // One stamp per job for its letters (its earlier ones, if any, have
    // landed when it has none left).
    if job.letters.is_empty() {
        job.letters_sent = now;
    }
    if m.rules.dlq == DlqConfirm::Acknowledged {
        job.letters.push(row);
    }
    let sent = job.letters_sent;
    w.letters.push(Letter {
        from: to.from,
        row,
        sent,
    });
}

/// The batch's rows are durable: it is done once the DLQ acknowledged its
/// letters (`sink/writer.rs`, `dlq::confirm`). Its completion reaches the
/// consumer thread: each partition's window forgets the keys of its
/// rejected rows, and each partition's frontier moves (`sink/state`,
/// `on_completion`).
fn durable(proc: &mut Proc) {
    let Some(job) = proc.job.as_mut().map(Arc::make_mut) else {
        return;
    };
    if !job.letters.is_empty() {
        job.wait = Wait::Letters;
        return;
    }
    let Some(job) = proc.job.take() else {
        return;
    };
    for &(q, generation, ticket) in &job.tickets {
        let copies = copies_of(&job.delivery, q);
        settle(
            &mut proc.parts,
            q,
            generation,
            ticket,
            &copies,
            job.delivery.rejected(),
        );
    }
}

/// The DLQ acknowledged letter `l`: its batch stops waiting for it.
pub fn on_letter(proc: &mut Proc, l: &Letter) {
    let Some(job) = proc.job.as_mut().map(Arc::make_mut) else {
        return;
    };
    if job.letters_sent != l.sent {
        return;
    }
    job.letters.retain(|&r| r != l.row);
    if job.wait == Wait::Letters {
        durable(proc);
    } else {
        settle_early(proc);
    }
}

/// A partition whose rows are settled ([`Delivery::settled`]) while
/// another's are still on their way, and whose letters the DLQ has
/// acknowledged, leaves the batch at once and is acknowledged
/// (`settle_early`, `sink/writer.rs`): its window forgets its rejected
/// rows' keys and its frontier moves, so a revoked partition may settle
/// before the rest of its batch is done. When every partition is settled
/// the batch is durable and [`durable`] ends them together.
fn settle_early(proc: &mut Proc) {
    let Some(job) = proc.job.as_mut().map(Arc::make_mut) else {
        return;
    };
    let live: Vec<i32> = job.tickets.iter().map(|t| t.0 as i32).collect();
    for q in job.delivery.ahead(&live).into_iter().map(|p| p as usize) {
        if job.letters.iter().any(|r| r.partition == q as i32) {
            continue;
        }
        let copies = copies_of(&job.delivery, q);
        let Some(settled) = job.delivery.settle_partition(q as i32) else {
            continue;
        };
        let Some(at) = job.tickets.iter().position(|t| t.0 == q) else {
            continue;
        };
        let (_, generation, ticket) = job.tickets.remove(at);
        settle(
            &mut proc.parts,
            q,
            generation,
            ticket,
            &copies,
            &settled.rejected,
        );
    }
}

/// The copies in earlier batches that partition `q`'s conditional rows in
/// `delivery` wait on.
fn copies_of(delivery: &Delivery, q: usize) -> Vec<Offset> {
    let conditional = delivery.conditional().iter();
    let of_q = conditional.filter(|(row, _)| row.partition == q as i32);
    of_q.map(|(_, copy)| copy.offset).collect()
}

/// Partition `q`'s rows of `ticket`, cut by `generation`, are durable: if
/// it still holds that generation, its window forgets the keys of the rows
/// ClickHouse `rejected` and its frontier moves (the machine's
/// `slice_done`, as the sink's `on_slice`).
fn settle(
    parts: &mut Parts,
    q: usize,
    generation: u64,
    ticket: Ticket,
    copies: &[Offset],
    rejected: &[Row],
) {
    let Some(keys) = parts.get(&q).map(|h| h.core.keys()) else {
        return;
    };
    let of_q = rejected.iter().filter(|r| r.partition == q as i32);
    let keys: Vec<(KeyHash, Offset)> = match keys {
        Some(keys) => of_q.map(|r| (keys.key(r.offset), r.offset)).collect(),
        None => Vec::new(),
    };
    parts.slice_done(&q, generation, ticket, copies, true, keys);
}

/// The process claimed partition `q` at `read_at` (the send time of the
/// read that showed the claim): it plans where to start from the group's
/// commit (read before the claim) and what the table holds, and writes.
pub fn activate(
    m: &Sluice,
    w: &mut World,
    p: usize,
    q: usize,
    generation: u64,
    committed: Committed,
    read_at: Millis,
) {
    let records = m.bounds.records;
    let log = LogBounds {
        low: NextOffset(0),
        high: NextOffset(records),
    };
    let watermark = match (m.rules.unbacked, committed) {
        (UnbackedRows::ResetPolicy, Committed::Nothing) => None,
        _ => w.watermark(q),
    };
    let mut plan = resume_plan(committed, watermark, log, ResetPolicy::Earliest);
    let table = &w.parts[q].table;
    if let Some((first, last)) = plan.zone() {
        let held = (first.0..=last.0)
            .filter(|&o| table[o as usize] > 0)
            .count();
        plan = plan.with_zone_count(held as u64);
    }
    // A route with key dedup rebuilds its window from the keys the table
    // holds up to the watermark (`sink/dedup.rs`); the model's window
    // covers the whole partition.
    let keys = (!m.bounds.keys.is_empty()).then(|| {
        let of = m.bounds.keys;
        let window = match w.watermark(q) {
            Some(high) => {
                let held = (0..=high.0 as usize).filter(|&o| table[o] > 0);
                let seeds = held.map(|o| KeyHash::from(of[o]));
                KeyWindow::rebuilt(Keys::WINDOW, Keys::MAX_KEYS, seeds, 0, high)
            }
            None => KeyWindow::new(Keys::WINDOW, Keys::MAX_KEYS),
        };
        Keys {
            window,
            of,
            drop: m.rules.key_drop,
            rejected: m.rules.rejected_key,
        }
    });
    // Positioned (`sink/state/handoff.rs`), under a lease from the read.
    let parts = &mut w.procs[p].parts;
    if !parts.activate(&q, generation, w.now, plan.start, plan.check_through, keys) {
        return;
    }
    if let Some(part) = parts.get_mut(&q) {
        part.extra.claim = None;
        part.extra.leases.hold(KEY, generation, read_at);
    }
}

/// Process `proc` holds partition `q` in a new generation, to claim it
/// with `claim` (`sink/state/handoff.rs`, `prepare`).
pub fn claiming(m: &Sluice, proc: &mut Proc, q: usize, claim: Claim) {
    let limits = BatchLimits {
        max_rows: m.bounds.max_rows,
        max_bytes: 1 << 20,
        max_age: Duration::from_secs(1),
        aligned: false,
    };
    let id = PartitionId {
        topic: TOPIC.into(),
        partition: q as i32,
    };
    let core = Partition::new(id, limits, claim.generation, Phase::Preparing);
    let side = Side {
        claim: Some(claim),
        leases: Leases::new(m.settings.lease),
        rewrite: Rewrite::No,
    };
    proc.parts.hold(q, core, side);
}

/// Carries out what process `p`'s machine decided: a generation
/// abandoned loses its rows in flight ([`lose`]); a leaving one's lease is
/// not renewed; a hand-off commits and marks the register clean.
fn carry_out(w: &mut World, p: usize, rules: &Rules) {
    let acts = w.procs[p].parts.take_acts();
    for act in acts {
        match act {
            Act::Abandon { key: q, .. } => lose(&mut w.procs[p], q, rules),
            Act::Leave { key: q, generation } => {
                if let Some(part) = w.procs[p].parts.get_mut(&q) {
                    part.extra.leases.leave(KEY, generation);
                }
            }
            Act::HandOff {
                key: q, hand_off, ..
            } => {
                if let Some(frontier) = hand_off.commit {
                    w.parts[q].group.committed = Some(frontier);
                }
                if hand_off.clean {
                    w.parts[q].mark_in_flight = true;
                }
            }
        }
    }
}

/// Whether `part`'s lease is live at `now`.
fn live(part: &Part, now: Millis) -> bool {
    part.extra.leases.live(KEY, part.core.generation(), now)
}

/// What process `proc` commits at `now` (the machine's `to_commit`, each
/// partition under its live lease).
fn to_commit(proc: &Proc, now: Millis) -> Vec<(usize, u64, NextOffset)> {
    let parts = &proc.parts;
    parts.to_commit(None, |q, _| parts.get(q).is_some_and(|h| live(h, now)))
}

/// The claim of partition `q`, while `proc` prepares it.
fn claim_of(proc: &mut Proc, q: usize) -> Option<&mut Claim> {
    proc.parts.get(&q)?.extra.claim.as_ref()?;
    proc.parts.get_mut(&q)?.extra.claim.as_mut()
}

/// Partition `q` was taken from process `p`: it gives it up (its rows in
/// flight leave the batch) and claims it back after `claim::taken_again`,
/// or (`watch`) once the register shows a clean hand-off.
fn taken(m: &Sluice, w: &mut World, p: usize, q: usize, generation: u64, watch: bool) {
    let (s, rules) = (&m.settings, &m.rules);
    let committed = w.parts[q].group.committed();
    let now = w.now;
    let Some(wait) = w.procs[p].parts.taken(&q, generation, now, s.fence_wait) else {
        return;
    };
    carry_out(w, p, rules);
    let start = Start::After {
        until: now.after(wait),
        watch,
    };
    let proc = &mut w.procs[p];
    let claim = Claim::new(proc.id, generation, committed, s, start);
    claiming(m, proc, q, claim);
}

/// `KILL QUERY WHERE query_id = …`: every running query with that id ends
/// without storing anything.
fn kill(w: &mut World, qid: &str) {
    while let Some(i) = w
        .inserts
        .iter()
        .position(|i| i.running_since.is_some() && i.query_id == qid)
    {
        w.answer(i, Answer::Unknown);
    }
}

fn generation(w: &World, p: usize, q: usize) -> Option<u64> {
    Some(w.procs[p].parts.get(&q)?.core.generation())
}

/// Partition `q` of process `p`, once active (leaving too).
fn active(w: &mut World, p: usize, q: usize) -> Option<&mut Part> {
    let parts = &mut w.procs[p].parts;
    if parts.get(&q)?.core.phase() == Phase::Preparing {
        return None;
    }
    parts.get_mut(&q)
}
