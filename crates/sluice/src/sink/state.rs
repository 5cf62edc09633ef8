//! The sink's state on the consumer thread: partitions, batches, completions
//! and commits.
//!
//! Records in ([`Sink::on_record`]) → per-partition [`BatchBuilder`]s → due
//! batches spawned as insert tasks ([`Sink::cut`]) → [`Event`]s back from
//! the tasks ([`Sink::on_event`]) → each partition's [`AckTracker`] → the
//! durable frontier, committed to Kafka ([`Sink::commit`]).
//!
//! Memory: builders plus in-flight batches stay under their share of
//! `max_buffered_bytes` (the rest is librdkafka's); over it, every partition
//! is paused (the consumer keeps polling, so the group does not evict it)
//! until half of it is free.

use super::dlq::Letter;
use super::fates::Fates;
use super::handoff::Prepared;
use super::owners::{Owner, Owners};
use super::writer::{deliver, Completion, Job, Outcome, WriterCtx};
use super::SinkContext;
use crate::config::{Config, Route};
use crate::telemetry;
use anyhow::anyhow;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset as KOffset, TopicPartitionList};
use sluice_core::dedup::{verdict, KeyWindow, Verdict};
use sluice_core::{AckTracker, BatchBuilder, NextOffset, Offset, PartitionId, RowEncoder};
use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

pub(super) type Key = (usize, i32);

/// Marks `keys` clean in the register: their inserts drained under leases
/// that have just ended ([`Sink::leases_ended`]), the first of them at
/// `until`, so the next owner need not fence, or stops fencing. The mark
/// must land before `until`, while no new owner can have finished its fence;
/// one acknowledged later is reported.
async fn mark_clean(owners: Owners, (keys, until): (Vec<Key>, Option<Instant>)) {
    let Some(until) = until else {
        return;
    };
    match tokio::task::spawn_blocking(move || owners.write(keys, 0)).await {
        Ok(Ok(())) if Instant::now() > until => tracing::warn!(
            late_ms = (Instant::now() - until).as_millis() as u64,
            "the clean mark was acknowledged after the lease ended; a new owner that finished its fence meanwhile would take it for clean"
        ),
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot mark the hand-off clean; the next owner fences")
        }
        Err(e) => tracing::warn!(error = %e, "marking the hand-off clean failed"),
    }
}

/// How long a seek may hold the consumer thread (a heartbeat interval);
/// one that takes longer is tried again.
const SEEK_WAIT: Duration = Duration::from_secs(1);

/// A batch is cut once it accounts for this many DLQ writes.
const MAX_LETTERS_PER_BATCH: usize = 10_000;

/// What tasks report back to the consumer thread.
pub(super) enum Event {
    Completion(Completion),
    Prepared(Prepared),
    /// Another owner (`by`) is in the register for this generation of the
    /// partition.
    Taken {
        key: Key,
        generation: u64,
        by: Owner,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Assigned and paused; the start position is being worked out.
    Preparing,
    /// Positioned; its records are being batched and inserted.
    Active,
}

pub(super) struct Part {
    pub phase: Phase,
    pub builder: BatchBuilder,
    /// The batch being built holds rows that may already be stored.
    pub builder_uncertain: bool,
    pub acks: Option<AckTracker>,
    pub committed: Option<NextOffset>,
    pub check_through: Option<Offset>,
    pub generation: u64,
    pub abandon: CancellationToken,
    /// Paused by backpressure (preparing partitions are always paused).
    pub paused: bool,
    /// Business keys written within the route's dedup window, if it has one.
    pub keys: Option<KeyWindow>,
    /// The offset after the last record taken: a record below it was
    /// delivered twice by the client and is ignored.
    pub position: Option<NextOffset>,
    /// DLQ writes for records of the batch being built.
    pub letters: Vec<Letter>,
    /// The memory `letters` hold.
    pub letter_bytes: usize,
    /// Key dedup: rows of the batch being built written on condition,
    /// `(row, copy)` ([`sluice_core::dedup::Verdict::WriteUnless`]).
    pub conditional: Vec<(Offset, Offset)>,
    /// The copies that conditional rows, in flight or being batched, wait
    /// on (with their counts): [`Fates`] keeps what is at or above the
    /// lowest.
    pub waiting: BTreeMap<Offset, usize>,
    /// What became of this activation's rows, for conditional rows.
    pub fates: Arc<Fates>,
    /// When it went active.
    pub active_since: Option<Instant>,
}

#[derive(Default, Debug, Clone, Copy)]
pub(super) struct Stats {
    pub records: u64,
    pub rows_inserted: u64,
    pub batches: u64,
    /// Records dropped because their key was written within the window.
    pub dedup_dropped: u64,
    /// Records of a dedup route without a usable key (kept).
    pub dedup_keyless: u64,
    /// Records the client delivered a second time (ignored).
    pub redelivered: u64,
    /// Records this process wrote to the DLQ, acknowledged.
    pub dlq: u64,
}

/// All state of the sink; lives in the consumer context so rebalance
/// callbacks can reach it. Only the consumer thread ever locks it.
pub(super) struct Sink {
    pub cfg: Config,
    pub routes: Vec<Arc<Route>>,
    pub encoders: Vec<RowEncoder>,
    /// Per-route counters, indexed like `routes`.
    pub counters: Vec<telemetry::TopicCounters>,
    pub parts: HashMap<Key, Part>,
    /// Revoked partitions (exactly-once) whose inserts are finishing, off
    /// the consumer thread's way ([`Sink::on_revoke`]).
    pub leaving: HashMap<Key, Part>,
    pub ctx: Arc<WriterCtx>,
    pub handle: Handle,
    pub tx: mpsc::Sender<Event>,
    pub rx: mpsc::Receiver<Event>,
    pub in_flight_bytes: usize,
    pub in_flight: usize,
    pub next_generation: u64,
    pub overloaded: bool,
    pub fatal: Option<anyhow::Error>,
    pub stopping: CancellationToken,
    pub stats: Stats,
    /// The register of owners, and this process's id in it.
    pub owners: Owners,
    pub me: u64,
    /// How often each partition was taken from this process since the
    /// group last assigned it ([`Sink::on_taken`]).
    pub taken: HashMap<Key, u32>,
}

impl Sink {
    pub fn route_of(&self, topic: &str) -> Option<usize> {
        self.routes.iter().position(|r| r.topic == topic)
    }

    pub fn new_part(&mut self, ri: usize, partition: i32, phase: Phase) -> Part {
        self.next_generation += 1;
        Part {
            phase,
            builder: BatchBuilder::new(
                PartitionId {
                    topic: self.routes[ri].topic.clone(),
                    partition,
                },
                self.cfg.sink.limits,
            ),
            builder_uncertain: false,
            acks: None,
            committed: None,
            check_through: None,
            generation: self.next_generation,
            abandon: CancellationToken::new(),
            paused: false,
            keys: None,
            position: None,
            letters: Vec::new(),
            letter_bytes: 0,
            conditional: Vec::new(),
            waiting: BTreeMap::new(),
            fates: Arc::default(),
            active_since: None,
        }
    }

    pub fn on_record(&mut self, m: &impl Message, now: Instant) {
        let (topic, partition, offset) = (m.topic(), m.partition(), m.offset());
        let (timestamp, key, payload) = (m.timestamp().to_millis(), m.key(), m.payload());
        let Some(ri) = self.route_of(topic) else {
            return;
        };
        let Some(part) = self.parts.get_mut(&(ri, partition)) else {
            return;
        };
        if part.phase != Phase::Active {
            // Fetched before the pause took hold; it is read again after the seek.
            return;
        }
        let offset = Offset(offset);
        if part.position.is_some_and(|p| p.covers(offset)) {
            // Offsets only move forward within one activation: this one was
            // taken already. Taking it again would insert it twice.
            self.stats.redelivered += 1;
            self.counters[ri].redelivered();
            tracing::warn!(
                record = %format!("{topic}[{partition}]@{}", offset.0),
                expected = part.position.map(|p| p.0),
                "ignored a record the client delivered a second time"
            );
            return;
        }
        part.position = Some(offset.next());
        self.stats.records += 1;
        self.counters[ri].record_read(payload.map_or(0, <[u8]>::len));
        let encoder = &self.encoders[ri];
        part.acks
            .get_or_insert_with(|| AckTracker::new(NextOffset(offset.0)));
        if part.check_through.is_some_and(|c| offset <= c) {
            part.builder_uncertain = true;
        }
        let mut keyless = false;
        let pushed = match part.keys.as_mut() {
            None => part
                .builder
                .push(offset, now, |buf| {
                    encoder.encode(payload, partition, offset.0, buf)
                })
                .map(|_| true),
            Some(window) => {
                // Below the frontier every row is settled: stored, or
                // rejected and forgotten by the window.
                let settled = part
                    .acks
                    .as_ref()
                    .map_or(NextOffset(offset.0), |a| a.frontier());
                let conditional = &mut part.conditional;
                let waiting = &mut part.waiting;
                part.builder.push_or_skip(offset, now, |buf| {
                    let Some(key) = encoder.encode_keyed(payload, partition, offset.0, buf)? else {
                        keyless = true;
                        return Ok(true);
                    };
                    Ok(
                        match verdict(window.check(key, timestamp, offset), settled) {
                            Verdict::Write => true,
                            Verdict::Drop => false,
                            Verdict::WriteUnless { copy } => {
                                window.replace_copy(key, timestamp, offset);
                                conditional.push((offset, copy));
                                *waiting.entry(copy).or_default() += 1;
                                true
                            }
                        },
                    )
                })
            }
        };
        self.stats.dedup_keyless += u64::from(keyless);
        if let Ok(false) = pushed {
            self.stats.dedup_dropped += 1;
            self.counters[ri].dedup_dropped();
            tracing::debug!(
                record = %format!("{topic}[{partition}]@{}", offset.0),
                "dropped: its key was written within the dedup window"
            );
        }
        if let Err(e) = pushed {
            if self.ctx.dlq.is_none() {
                self.fatal = Some(anyhow!(
                    "record {topic}[{partition}]@{} cannot become a row: {e}. \
                     sluice stops rather than skip it; set [dlq] topic to send such records there",
                    offset.0
                ));
                return;
            }
            tracing::debug!(record = %format!("{topic}[{partition}]@{}", offset.0), error = %e, "for the DLQ");
            part.builder.skip(offset, now);
            let letter = Letter {
                topic: topic.to_string(),
                partition,
                offset: offset.0,
                timestamp,
                key: key.map(<[u8]>::to_vec),
                value: payload.map(<[u8]>::to_vec),
                kind: e.kind(),
                reason: e.to_string(),
            };
            part.letter_bytes += letter.bytes();
            part.letters.push(letter);
        }
        if part.builder.is_due(now) || part.letters.len() >= MAX_LETTERS_PER_BATCH {
            self.cut((ri, partition));
        }
    }

    /// Sends every due batch (every non-empty one with `all`).
    pub fn cut_due(&mut self, now: Instant, all: bool) {
        let due: Vec<Key> = self
            .parts
            .iter()
            .filter(|(_, p)| !p.builder.is_empty() && (all || p.builder.is_due(now)))
            .map(|(k, _)| *k)
            .collect();
        for key in due {
            self.cut(key);
        }
    }

    fn cut(&mut self, key: Key) {
        let Some(part) = self.parts.get_mut(&key) else {
            return;
        };
        let Some(batch) = part.builder.take() else {
            return;
        };
        let uncertain = std::mem::take(&mut part.builder_uncertain);
        let Some(acks) = part.acks.as_mut() else {
            return;
        };
        let ticket = acks.register(batch.end());
        let letters = std::mem::take(&mut part.letters);
        let bytes = batch.bytes() + std::mem::take(&mut part.letter_bytes);
        let conditional = std::mem::take(&mut part.conditional);
        self.in_flight_bytes += bytes;
        telemetry::in_flight_bytes(self.in_flight_bytes);
        self.in_flight += 1;
        self.stats.batches += 1;
        let job = Job {
            route: self.routes[key.0].clone(),
            route_idx: key.0,
            batch,
            uncertain,
            ticket,
            generation: part.generation,
            abandon: part.abandon.clone(),
            letters,
            bytes,
            conditional,
            fates: part.fates.clone(),
        };
        let ctx = self.ctx.clone();
        let tx = self.tx.clone();
        self.handle.spawn(async move {
            let c = deliver(job, ctx).await;
            let _ = tx.send(Event::Completion(c));
        });
    }

    /// Handles everything the tasks reported, without waiting.
    pub fn drain_events(&mut self, consumer: &BaseConsumer<SinkContext>) {
        while let Ok(e) = self.rx.try_recv() {
            self.on_event(consumer, e);
        }
    }

    pub fn on_event(&mut self, consumer: &BaseConsumer<SinkContext>, e: Event) {
        match e {
            Event::Completion(c) => self.on_completion(consumer, c),
            Event::Prepared(p) => self.activate(consumer, p),
            Event::Taken {
                key,
                generation,
                by,
            } => self.on_taken(consumer, key, generation, by),
        }
    }

    fn on_completion(&mut self, consumer: &BaseConsumer<SinkContext>, c: Completion) {
        self.in_flight_bytes -= c.bytes;
        telemetry::in_flight_bytes(self.in_flight_bytes);
        self.in_flight -= 1;
        let key = (c.route_idx, c.partition);
        let leaving = self
            .leaving
            .get(&key)
            .is_some_and(|p| p.generation == c.generation);
        let mut part = if leaving {
            self.leaving.get_mut(&key)
        } else {
            self.parts
                .get_mut(&key)
                .filter(|p| p.generation == c.generation)
        };
        if let Some(p) = part.as_mut() {
            for copy in &c.copies {
                if let Some(n) = p.waiting.get_mut(copy) {
                    *n -= 1;
                    if *n == 0 {
                        p.waiting.remove(copy);
                    }
                }
            }
        }
        match c.outcome {
            Outcome::Durable {
                inserted,
                rejected,
                excluded,
            } => {
                self.stats.rows_inserted += inserted as u64;
                self.stats.dlq += c.dlq as u64;
                self.stats.dedup_dropped += excluded as u64;
                for _ in 0..excluded {
                    self.counters[c.route_idx].dedup_dropped();
                }
                if let Some(p) = part {
                    // A rejected copy does not stand for its key any more.
                    if let Some(window) = p.keys.as_mut() {
                        for (offset, key) in &rejected {
                            if let Some(k) = key {
                                window.forget(*k, *offset);
                            }
                        }
                    }
                    if let Some(acks) = p.acks.as_mut() {
                        acks.ack(c.ticket);
                        let lowest = p.waiting.keys().next().map(|o| NextOffset(o.0));
                        let below = lowest.map_or(acks.frontier(), |w| w.min(acks.frontier()));
                        p.fates.prune_below(below);
                    }
                }
            }
            Outcome::Abandoned => {}
            Outcome::DlqFailed(e) => {
                let e = anyhow::Error::new(e).context("sluice stops rather than skip a record");
                self.fatal.get_or_insert(e);
            }
            Outcome::Failed(e) => {
                let route = &self.routes[c.route_idx];
                self.fatal.get_or_insert(anyhow!(
                    "inserting into {}.{} (topic {:?}, partition {}) failed and cannot succeed by retrying: {e}",
                    route.database,
                    route.table,
                    route.topic,
                    c.partition
                ));
            }
        }
        if leaving {
            self.settle_leaving(consumer, key);
        }
    }

    /// A revoked partition whose inserts have all ended commits its
    /// frontier and, under its lease still, is marked clean: the next owner
    /// need not fence (or stops fencing). Off the consumer thread.
    pub fn settle_leaving(&mut self, consumer: &BaseConsumer<SinkContext>, key: Key) {
        let drained = self
            .leaving
            .get(&key)
            .is_some_and(|p| p.acks.as_ref().is_none_or(|a| a.in_flight() == 0));
        let Some(part) = drained.then(|| self.leaving.remove(&key)).flatten() else {
            return;
        };
        if let Some(frontier) = part.acks.as_ref().map(|a| a.frontier()) {
            if part.committed != Some(frontier) && self.ctx.lease.live(key, part.generation) {
                let mut tpl = TopicPartitionList::new();
                let mut e = tpl.add_partition(&self.routes[key.0].topic, key.1);
                let _ = e.set_offset(KOffset::Offset(frontier.0));
                if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
                    tracing::warn!(error = %e, "commit failed");
                }
            }
        }
        let clean = self.leases_ended(&[(key, part.generation)]);
        self.handle.spawn(mark_clean(self.owners.clone(), clean));
    }

    /// Gives up revoked partitions whose lease ran out before their inserts
    /// ended (the next owner claimed them): those inserts are abandoned.
    pub fn expire_leaving(&mut self) {
        let lease = &self.ctx.lease;
        self.leaving.retain(|k, p| {
            let live = lease.live(*k, p.generation);
            if !live {
                p.abandon.cancel();
                lease.give_up(*k, p.generation);
            }
            live
        });
    }

    /// Waits for in-flight batches (of `only`, or of every partition),
    /// handling events meanwhile. False if `timeout` passed first.
    pub fn wait_in_flight(
        &mut self,
        consumer: &BaseConsumer<SinkContext>,
        only: Option<&[Key]>,
        timeout: Duration,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let busy = match only {
                Some(keys) => keys.iter().any(|k| {
                    self.parts
                        .get(k)
                        .and_then(|p| p.acks.as_ref())
                        .is_some_and(|a| a.in_flight() > 0)
                }),
                None => self.in_flight > 0,
            };
            if !busy {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            match self.rx.recv_timeout(left.min(Duration::from_millis(200))) {
                Ok(e) => self.on_event(consumer, e),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return false,
            }
        }
    }

    /// Commits the durable frontier of `keys` (or of every partition that
    /// moved). In exactly-once mode only partitions under a live lease
    /// commit: one whose lease ran out may have a new owner.
    pub fn commit(
        &mut self,
        consumer: &BaseConsumer<SinkContext>,
        keys: Option<&[Key]>,
        mode: CommitMode,
    ) {
        let mut tpl = TopicPartitionList::new();
        let mut moved = Vec::new();
        for (key, part) in &self.parts {
            if keys.is_some_and(|ks| !ks.contains(key)) || part.phase != Phase::Active {
                continue;
            }
            let Some(frontier) = part.acks.as_ref().map(|a| a.frontier()) else {
                continue;
            };
            if part.committed == Some(frontier) || !self.may_write(*key, part.generation) {
                continue;
            }
            let mut e = tpl.add_partition(&self.routes[key.0].topic, key.1);
            let _ = e.set_offset(KOffset::Offset(frontier.0));
            moved.push((*key, frontier));
        }
        if moved.is_empty() {
            return;
        }
        match consumer.commit(&tpl, mode) {
            Ok(()) => {
                for (key, frontier) in moved {
                    if let Some(p) = self.parts.get_mut(&key) {
                        p.committed = Some(frontier);
                    }
                }
            }
            Err(e) => tracing::warn!(
                error = %e,
                "offset commit failed; it is advisory, progress lives in ClickHouse"
            ),
        }
    }

    /// Whether this generation of `key` may insert and commit: always in
    /// at-least-once mode, under a live lease in exactly-once mode.
    fn may_write(&self, key: Key, generation: u64) -> bool {
        !self.cfg.sink.delivery.is_exactly_once() || self.ctx.lease.live(key, generation)
    }

    /// Marks `keys` (or every partition) clean in the register after their
    /// inserts drained, waiting for the write: at a stop.
    pub fn hand_off_clean(&mut self, keys: Option<&[Key]>) {
        let list: Vec<(Key, u64)> = self
            .parts
            .iter()
            .chain(&self.leaving)
            .filter(|(k, p)| keys.is_none_or(|ks| ks.contains(k)) && p.phase == Phase::Active)
            .map(|(k, p)| (*k, p.generation))
            .collect();
        let clean = self.leases_ended(&list);
        self.handle.block_on(mark_clean(self.owners.clone(), clean));
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

    /// Pauses every partition while too much is buffered; preparing
    /// partitions stay paused regardless.
    pub fn apply_backpressure(&mut self, consumer: &BaseConsumer<SinkContext>) {
        let building: usize = self
            .parts
            .values()
            .map(|p| p.builder.bytes() + p.letter_bytes)
            .sum();
        let buffered = self.in_flight_bytes + building;
        let max = self.cfg.sink.batch_buffer_bytes();
        self.overloaded = if self.overloaded {
            buffered >= max / 2
        } else {
            buffered >= max
        };
        if self.overloaded {
            // Send what is built so the memory can drain.
            self.cut_due(Instant::now(), true);
        }
        let mut pause = TopicPartitionList::new();
        let mut resume = TopicPartitionList::new();
        for (key, part) in self.parts.iter_mut() {
            let want = self.overloaded || part.phase == Phase::Preparing;
            if want != part.paused {
                let list = if want { &mut pause } else { &mut resume };
                list.add_partition(&self.routes[key.0].topic, key.1);
                part.paused = want;
            }
        }
        for (list, pausing) in [(pause, true), (resume, false)] {
            if list.count() == 0 {
                continue;
            }
            let r = if pausing {
                consumer.pause(&list)
            } else {
                consumer.resume(&list)
            };
            if let Err(e) = r {
                tracing::warn!(error = %e, pausing, "pause/resume failed");
            }
        }
    }

    /// Positions a prepared partition (claimed and fenced, in exactly-once
    /// mode) and lets its records flow; its lease starts from the read that
    /// last showed this process in the register. A failed seek is tried
    /// again after a backoff ([`Sink::retry_prepared`]).
    pub fn activate(&mut self, consumer: &BaseConsumer<SinkContext>, p: Prepared) {
        let exactly_once = self.cfg.sink.delivery.is_exactly_once();
        let topic = self.routes[p.key.0].topic.clone();
        let name = format!("{topic}[{}]", p.key.1);
        let Some(part) = self
            .parts
            .get_mut(&p.key)
            .filter(|x| x.generation == p.generation && x.phase == Phase::Preparing)
        else {
            return;
        };
        let start = p.plan.start;
        // An earlier generation still finishing was fenced out by this one.
        if let Some(older) = self.leaving.remove(&p.key) {
            older.abandon.cancel();
        }
        let seek = KOffset::Offset(start.0);
        if let Err(e) = consumer.seek(&topic, p.key.1, seek, SEEK_WAIT) {
            tracing::warn!(partition = %name, attempt = p.attempts, error = %e, "seek failed; retrying");
            self.retry_prepared(p);
            return;
        }
        if exactly_once {
            self.ctx.lease.hold(p.key, p.generation, p.confirmed);
        }
        part.check_through = p.plan.check_through;
        if let Some(d) = &self.routes[p.key.0].dedup {
            part.keys = Some(super::dedup::window(d, p.seeds.as_ref()));
        }
        part.position = Some(start);
        part.acks = Some(AckTracker::new(start));
        part.phase = Phase::Active;
        part.active_since = Some(Instant::now());
        tracing::info!(
            partition = %name,
            start = start.0,
            check_through = ?p.plan.check_through.map(|o| o.0),
            "partition active"
        );
    }
}
