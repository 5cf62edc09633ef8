//! Partitions changing hands: assignment, preparation and revocation.
//!
//! Assign (exactly-once): the partitions are taken at once (so the group
//! sees them owned) but paused. Their committed positions and hand-off
//! markers are read; then a task, off the consumer thread, waits out
//! `fence_wait` unless the previous owner handed over cleanly, and reads the
//! watermarks from ClickHouse. The resulting [`ResumePlan`]s come back as
//! [`Prepared`] events; the consumer thread seeks, records an `open` marker
//! and resumes each partition ([`Sink::activate`]). Nothing blocks inside the
//! rebalance callback for longer than one broker round trip.
//!
//! Revoke: stop batching the partitions, wait for their in-flight inserts,
//! commit their frontier with a `clean` marker. If the assignment was lost
//! instead, abandon their work at once: the group has already moved on.

use super::dedup::{rebuild, Seeds};
use super::state::{Event, Key, Phase, Sink, MARK_CLEAN, MARK_OPEN};
use super::SinkContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset as KOffset, TopicPartitionList};
use sluice_core::resume::{resume_plan, ResumePlan};
use sluice_core::NextOffset;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// A partition whose start position is known.
pub(super) struct Prepared {
    pub key: Key,
    pub generation: u64,
    pub plan: ResumePlan,
    /// Keys for the partition's dedup window, when its route has one.
    pub seeds: Option<Seeds>,
}

impl Sink {
    fn keys_of(&self, tpl: &TopicPartitionList) -> Vec<Key> {
        tpl.elements()
            .iter()
            .filter_map(|e| Some((self.route_of(e.topic())?, e.partition())))
            .collect()
    }

    fn name(&self, k: Key) -> String {
        format!("{}[{}]", self.routes[k.0].topic, k.1)
    }

    pub fn on_assign(
        &mut self,
        consumer: &BaseConsumer<SinkContext>,
        tpl: &TopicPartitionList,
    ) -> KafkaResult<()> {
        let keys = self.keys_of(tpl);
        consumer.incremental_assign(tpl)?;
        if keys.is_empty() {
            return Ok(());
        }
        tracing::info!(partitions = ?keys.iter().map(|k| self.name(*k)).collect::<Vec<_>>(), "assigned");
        let exactly_once = self.cfg.sink.delivery.is_exactly_once();
        let dedup = keys.iter().any(|k| self.routes[k.0].dedup.is_some());
        if !exactly_once && !dedup {
            for &(ri, p) in &keys {
                let part = self.new_part(ri, p, Phase::Active);
                self.parts.insert((ri, p), part);
            }
            return Ok(());
        }
        consumer.pause(tpl)?;
        let committed = committed_with_retry(consumer, tpl);
        let mut generations = Vec::new();
        for &(ri, p) in &keys {
            let mut part = self.new_part(ri, p, Phase::Preparing);
            part.paused = true;
            generations.push(((ri, p), part.generation));
            self.parts.insert((ri, p), part);
        }
        let clean = keys.iter().all(|&(ri, p)| {
            committed
                .get(&(self.routes[ri].topic.clone(), p))
                .is_some_and(|(_, m)| m == MARK_CLEAN)
        });
        let fence = if clean || !exactly_once {
            Duration::ZERO
        } else {
            self.cfg.sink.fence_wait
        };
        if !fence.is_zero() {
            tracing::info!(
                wait_ms = fence.as_millis() as u64,
                "no clean hand-off; waiting out the previous owner's inserts before reading ClickHouse"
            );
        }
        let ch = self.ctx.ch.clone();
        let kafka = self.cfg.kafka.clone();
        let routes = self.routes.clone();
        let tx = self.tx.clone();
        let stopping = self.stopping.clone();
        let mut by_route: BTreeMap<usize, Vec<(Key, u64)>> = BTreeMap::new();
        for (key, generation) in generations {
            by_route.entry(key.0).or_default().push((key, generation));
        }
        self.handle.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(fence) => {}
                _ = stopping.cancelled() => return,
            }
            for (ri, parts) in by_route {
                let route = &routes[ri];
                let mut backoff = Duration::from_millis(200);
                let marks = loop {
                    let t0 = Instant::now();
                    match ch.watermarks(route).await {
                        Ok(m) => {
                            tracing::info!(table = %route.qualified(), ms = t0.elapsed().as_millis() as u64, "read watermarks");
                            break m;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot read watermarks yet; retrying");
                            tokio::select! {
                                _ = tokio::time::sleep(backoff) => {}
                                _ = stopping.cancelled() => return,
                            }
                            backoff = (backoff * 2).min(Duration::from_secs(5));
                        }
                    }
                };
                for (key, generation) in parts {
                    let c = committed.get(&(route.topic.clone(), key.1)).and_then(|(c, _)| *c);
                    let w = marks.get(&key.1).copied();
                    let seeds = loop {
                        match rebuild(&kafka, &ch, route, key.1, w).await {
                            Ok(s) => break s,
                            Err(e) => {
                                tracing::warn!(error = %format!("{e:#}"), "cannot rebuild the key dedup window yet; retrying");
                                tokio::select! {
                                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                                    _ = stopping.cancelled() => return,
                                }
                            }
                        }
                    };
                    if !exactly_once {
                        // Only the dedup window was needed: resume where committed.
                        let plan = resume_plan(c, None);
                        let _ = tx.send(Event::Prepared(Prepared { key, generation, plan, seeds }));
                        continue;
                    }
                    let mut plan = resume_plan(c, w);
                    // If ClickHouse holds every offset between the commit and
                    // the watermark, nothing there needs reading again.
                    if let Some((first, last)) = plan.zone() {
                        match ch.distinct_offsets(route, key.1, first, last).await {
                            Ok(n) => plan = plan.with_zone_count(n),
                            Err(e) => tracing::warn!(error = %e, "cannot count the stored offsets; reconciling the range instead"),
                        }
                    }
                    tracing::info!(
                        partition = %format!("{}[{}]", route.topic, key.1),
                        committed = ?c.map(|c| c.0),
                        watermark = ?w.map(|w| w.0),
                        start = ?plan.start,
                        check_through = ?plan.check_through.map(|o| o.0),
                        "resume plan"
                    );
                    let _ = tx.send(Event::Prepared(Prepared { key, generation, plan, seeds }));
                }
            }
        });
        Ok(())
    }

    pub fn on_revoke(
        &mut self,
        consumer: &BaseConsumer<SinkContext>,
        tpl: &TopicPartitionList,
    ) -> KafkaResult<()> {
        let keys: Vec<Key> = self
            .keys_of(tpl)
            .into_iter()
            .filter(|k| self.parts.contains_key(k))
            .collect();
        let lost = consumer.assignment_lost();
        if !keys.is_empty() {
            tracing::info!(lost, partitions = ?keys.iter().map(|k| self.name(*k)).collect::<Vec<_>>(), "revoked");
        }
        for k in &keys {
            if let Some(p) = self.parts.get_mut(k) {
                p.builder.clear();
                p.builder_uncertain = false;
                // Their records are read again by the next owner.
                p.letters.clear();
            }
        }
        if !lost {
            let timeout = self.cfg.clickhouse.insert_timeout * 3;
            let drained = self.wait_in_flight(consumer, Some(&keys), timeout);
            let marker = if drained { MARK_CLEAN } else { MARK_OPEN };
            self.commit(consumer, Some(&keys), marker, CommitMode::Sync);
        }
        for k in &keys {
            if let Some(p) = self.parts.remove(k) {
                p.abandon.cancel();
            }
        }
        consumer.incremental_unassign(tpl)
    }
}

/// `(topic, partition) → (committed position, marker)`.
fn committed_with_retry(
    consumer: &BaseConsumer<SinkContext>,
    tpl: &TopicPartitionList,
) -> HashMap<(String, i32), (Option<NextOffset>, String)> {
    for attempt in 0..3 {
        match consumer.committed_offsets(tpl.clone(), Duration::from_secs(5)) {
            Ok(list) => {
                return list
                    .elements()
                    .iter()
                    .map(|e| {
                        let pos = match e.offset() {
                            KOffset::Offset(n) if n >= 0 => Some(NextOffset(n)),
                            _ => None,
                        };
                        (
                            (e.topic().to_string(), e.partition()),
                            (pos, e.metadata().to_string()),
                        )
                    })
                    .collect();
            }
            Err(e) => {
                tracing::warn!(attempt, error = %e, "cannot read committed offsets");
                std::thread::sleep(Duration::from_millis(300));
            }
        }
    }
    // Unknown: no position (reconcile from the start) and no clean marker.
    HashMap::new()
}
