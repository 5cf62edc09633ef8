//! Partitions changing hands: assignment, preparation and revocation.
//!
//! Assign (exactly-once): the partitions are taken at once (so the group
//! sees them owned) but paused; nothing else happens in the rebalance
//! callback. A task, off the consumer thread, reads the group's committed
//! positions and hand-off markers, waits out `fence_wait` unless the
//! previous owner handed over cleanly (an unreadable marker is not a clean
//! one), reads the watermarks from ClickHouse and the log's bounds from the
//! broker, and plans each partition with [`resume_plan`]: what ClickHouse
//! holds decides, the reset policy applies only where it holds nothing. The
//! plans come back as [`Prepared`] events; the consumer thread seeks,
//! commits an `open` marker and only then resumes each partition
//! ([`Sink::activate`]). A failed seek or marker commit is retried with
//! backoff ([`Sink::retry_prepared`]); the partition stays paused meanwhile.
//!
//! Revoke: stop batching the partitions, wait for their in-flight inserts,
//! commit their frontier with a `clean` marker. If the assignment was lost
//! instead, abandon their work at once: the group has already moved on.

use super::dedup::{rebuild, Seeds};
use super::state::{Event, Key, Phase, Sink, MARK_CLEAN, MARK_OPEN};
use super::SinkContext;
use crate::ch::ClickHouse;
use crate::config::{KafkaConfig, Route};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset as KOffset, TopicPartitionList};
use sluice_core::resume::{resume_plan, Committed, LogBounds, ResetPolicy, ResumePlan};
use sluice_core::NextOffset;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// A partition whose start position is known.
pub(super) struct Prepared {
    pub key: Key,
    pub generation: u64,
    pub plan: ResumePlan,
    /// Keys for the partition's dedup window, when its route has one.
    pub seeds: Option<Seeds>,
    /// Failed attempts to activate it (seek or ownership marker).
    pub attempts: u32,
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
        let mut parts: BTreeMap<usize, Vec<(Key, u64)>> = BTreeMap::new();
        for &(ri, p) in &keys {
            let mut part = self.new_part(ri, p, Phase::Preparing);
            part.paused = true;
            parts
                .entry(ri)
                .or_default()
                .push(((ri, p), part.generation));
            self.parts.insert((ri, p), part);
        }
        let prep = Preparation {
            ch: self.ctx.ch.clone(),
            kafka: self.cfg.kafka.clone(),
            routes: self.routes.clone(),
            tx: self.tx.clone(),
            stopping: self.stopping.clone(),
            exactly_once,
            fence_wait: self.cfg.sink.fence_wait,
            reset: if self.cfg.kafka.auto_offset_reset == "latest" {
                ResetPolicy::Latest
            } else {
                ResetPolicy::Earliest
            },
            parts,
        };
        self.handle.spawn(prep.run());
        Ok(())
    }

    /// Sends `p` back to the consumer thread after a backoff that grows
    /// with its failed attempts (0.5 s, 1 s, 2 s, 4 s, then 5 s).
    pub(super) fn retry_prepared(&self, mut p: Prepared) {
        let delay =
            (Duration::from_millis(500) * 2u32.pow(p.attempts.min(4))).min(Duration::from_secs(5));
        p.attempts += 1;
        let tx = self.tx.clone();
        let stopping = self.stopping.clone();
        self.handle.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(delay) => { let _ = tx.send(Event::Prepared(p)); }
                _ = stopping.cancelled() => {}
            }
        });
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

/// What the group committed for one partition, and its hand-off marker.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Commit {
    position: Committed,
    marker: String,
}

impl Commit {
    const UNKNOWN: Commit = Commit {
        position: Committed::Unknown,
        marker: String::new(),
    };

    /// From one element of a committed-offsets answer.
    fn from_answer(offset: KOffset, error: KafkaResult<()>, metadata: &str) -> Commit {
        let position = match (error, offset) {
            (Err(_), _) => Committed::Unknown,
            (Ok(()), KOffset::Offset(n)) if n >= 0 => Committed::At(NextOffset(n)),
            (Ok(()), KOffset::Invalid) => Committed::Nothing,
            // Not a position a commit can hold: do not guess.
            (Ok(()), _) => Committed::Unknown,
        };
        Commit {
            marker: match position {
                Committed::Unknown => String::new(),
                _ => metadata.to_string(),
            },
            position,
        }
    }

    /// The previous owner drained and said so.
    fn is_clean(&self) -> bool {
        !matches!(self.position, Committed::Unknown) && self.marker == MARK_CLEAN
    }
}

/// The work of preparing one assignment, off the consumer thread.
struct Preparation {
    ch: ClickHouse,
    kafka: KafkaConfig,
    routes: Vec<Arc<Route>>,
    tx: mpsc::Sender<Event>,
    stopping: CancellationToken,
    exactly_once: bool,
    fence_wait: Duration,
    reset: ResetPolicy,
    /// Per route: the partitions and their generations.
    parts: BTreeMap<usize, Vec<(Key, u64)>>,
}

/// Reads the group's offsets and the log's bounds without joining the
/// group: a client of its own with the group's id, used off the consumer
/// thread.
type Lookup = Arc<BaseConsumer>;

impl Preparation {
    async fn run(self) {
        let Some(lookup) = self
            .retry("create a Kafka lookup client", || {
                let kafka = self.kafka.clone();
                async move { blocking(move || lookup_client(&kafka)).await }
            })
            .await
        else {
            return;
        };
        self.prepare(&lookup).await;
        // Closing a client waits for its threads: not on a runtime worker.
        tokio::task::spawn_blocking(move || drop(lookup));
    }

    async fn prepare(&self, lookup: &Lookup) {
        let Some(commits) = self.committed(lookup).await else {
            return;
        };
        // A partition missing from the answer has no known marker.
        let clean = self
            .parts
            .values()
            .flatten()
            .all(|(key, _)| commits.get(key).is_some_and(Commit::is_clean));
        let fence = if clean || !self.exactly_once {
            Duration::ZERO
        } else {
            self.fence_wait
        };
        if !fence.is_zero() {
            tracing::info!(
                wait_ms = fence.as_millis() as u64,
                "no clean hand-off; waiting out the previous owner's inserts before reading ClickHouse"
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(fence) => {}
            _ = self.stopping.cancelled() => return,
        }
        for (ri, parts) in &self.parts {
            let route = &self.routes[*ri];
            let Some(marks) = self
                .retry("read watermarks", || async {
                    let t0 = Instant::now();
                    let m = self.ch.watermarks(route).await?;
                    tracing::info!(table = %route.qualified(), ms = t0.elapsed().as_millis() as u64, "read watermarks");
                    Ok::<_, anyhow::Error>(m)
                })
                .await
            else {
                return;
            };
            for &(key, generation) in parts {
                let commit = commits.get(&key).cloned().unwrap_or(Commit::UNKNOWN);
                let w = marks.get(&key.1).copied();
                let Some(log) = self
                    .retry("read the partition's log bounds", || {
                        let (lookup, topic) = (lookup.clone(), route.topic.clone());
                        async move {
                            let (low, high) = blocking(move || {
                                lookup.fetch_watermarks(&topic, key.1, Duration::from_secs(5))
                            })
                            .await?;
                            Ok::<_, anyhow::Error>(LogBounds {
                                low: NextOffset(low),
                                high: NextOffset(high),
                            })
                        }
                    })
                    .await
                else {
                    return;
                };
                let Some(seeds) = self
                    .retry("rebuild the key dedup window", || {
                        rebuild(&self.kafka, &self.ch, route, key.1, w)
                    })
                    .await
                else {
                    return;
                };
                // At-least-once comes here for the dedup window only: it
                // resumes where committed and reconciles nothing.
                let mut plan = resume_plan(
                    commit.position,
                    w.filter(|_| self.exactly_once),
                    log,
                    self.reset,
                );
                // If ClickHouse holds every offset of the zone, nothing there
                // needs reading again.
                if let Some((first, last)) = plan.zone() {
                    match self.ch.distinct_offsets(route, key.1, first, last).await {
                        Ok(n) => plan = plan.with_zone_count(n),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot count the stored offsets; reconciling the range instead")
                        }
                    }
                }
                tracing::info!(
                    partition = %format!("{}[{}]", route.topic, key.1),
                    committed = ?commit.position,
                    marker = %commit.marker,
                    watermark = ?w.map(|w| w.0),
                    log_low = log.low.0,
                    log_high = log.high.0,
                    start = plan.start.0,
                    check_through = ?plan.check_through.map(|o| o.0),
                    "resume plan"
                );
                let _ = self.tx.send(Event::Prepared(Prepared {
                    key,
                    generation,
                    plan,
                    seeds,
                    attempts: 0,
                }));
            }
        }
    }

    /// Every partition's commit. A failure to read them is not "nothing
    /// committed": after a few tries they are [`Committed::Unknown`], which
    /// fences and lets ClickHouse decide. `None` when stopping.
    async fn committed(&self, lookup: &Lookup) -> Option<HashMap<Key, Commit>> {
        let mut tpl = TopicPartitionList::new();
        for (ri, parts) in &self.parts {
            for (key, _) in parts {
                tpl.add_partition(&self.routes[*ri].topic, key.1);
            }
        }
        let mut backoff = Duration::from_millis(300);
        for attempt in 1..=3 {
            let (l, t) = (lookup.clone(), tpl.clone());
            match blocking(move || l.committed_offsets(t, Duration::from_secs(5))).await {
                Ok(list) => {
                    let mut out = HashMap::new();
                    for e in list.elements() {
                        let Some(ri) = self.routes.iter().position(|r| r.topic == e.topic()) else {
                            continue;
                        };
                        let commit = Commit::from_answer(e.offset(), e.error(), e.metadata());
                        out.insert((ri, e.partition()), commit);
                    }
                    return Some(out);
                }
                Err(e) => {
                    tracing::warn!(attempt, error = %e, "cannot read the committed offsets");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = self.stopping.cancelled() => return None,
                    }
                    backoff *= 2;
                }
            }
        }
        tracing::warn!(
            "the committed offsets are unknown: fencing, and starting where ClickHouse says"
        );
        Some(HashMap::new())
    }

    /// Runs `f` until it succeeds, with backoff; `None` once stopping.
    async fn retry<T, F, Fut>(&self, what: &str, mut f: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = anyhow::Result<T>>,
    {
        let mut backoff = Duration::from_millis(200);
        loop {
            if self.stopping.is_cancelled() {
                return None;
            }
            match f().await {
                Ok(v) => return Some(v),
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "cannot {what} yet; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = self.stopping.cancelled() => return None,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

/// A client that shares the group's id without joining it.
fn lookup_client(kafka: &KafkaConfig) -> KafkaResult<Lookup> {
    let mut cc = kafka.client_config();
    cc.set("group.id", &kafka.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false");
    Ok(Arc::new(cc.create()?))
}

/// Runs a blocking librdkafka call on tokio's blocking pool.
async fn blocking<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> anyhow::Result<T>
where
    T: Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    Ok(tokio::task::spawn_blocking(f).await??)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;

    #[test]
    fn a_commit_that_cannot_be_read_is_unknown_and_not_clean() {
        let failed = Err(KafkaError::OffsetFetch(
            RDKafkaErrorCode::CoordinatorNotAvailable,
        ));
        let c = Commit::from_answer(KOffset::Offset(10), failed, MARK_CLEAN);
        assert_eq!(c.position, Committed::Unknown);
        assert!(!c.is_clean());
        assert!(!Commit::UNKNOWN.is_clean());
        let c = Commit::from_answer(KOffset::Stored, Ok(()), MARK_CLEAN);
        assert_eq!(c.position, Committed::Unknown);
    }

    #[test]
    fn a_commit_is_a_position_nothing_or_unknown() {
        let c = Commit::from_answer(KOffset::Offset(10), Ok(()), MARK_CLEAN);
        assert_eq!(c.position, Committed::At(NextOffset(10)));
        assert!(c.is_clean());
        let c = Commit::from_answer(KOffset::Offset(10), Ok(()), MARK_OPEN);
        assert!(!c.is_clean());
        let c = Commit::from_answer(KOffset::Invalid, Ok(()), "");
        assert_eq!(c.position, Committed::Nothing);
        assert!(!c.is_clean());
    }
}
