//! Preparing partitions, off the consumer thread: where each one starts.
//!
//! In: the partitions of one assignment (paused on the consumer thread,
//! see [`super::state`]), with their generations. A task reads the group's
//! committed positions until it knows them, then, in exactly-once mode,
//! *claims* each partition in the register of owners ([`crate::owners`]):
//! [`Claim`] (`sluice-protocol`) decides each read, write and wait, with its
//! fence and its yield, and this task does them. A partition given up
//! meanwhile (revoked, lost, taken) leaves the claim within a second. Then
//! the task ends any insert of the partitions still running on the server
//! (an earlier owner's, late past its deadline), reads the watermarks from ClickHouse and the log's bounds from
//! the broker, and plans each partition with [`resume_plan`]: what
//! ClickHouse holds decides, the reset policy applies only where it holds
//! nothing. Out: each plan, as an [`Event::Prepared`] to the consumer
//! thread, which seeks and resumes the partition.

use super::dedup::rebuild;
use super::event::{Event, Prepared};
use crate::ch::ClickHouse;
use crate::config::{KafkaConfig, Route};
use crate::owners::{Key, Owner, Owners};
use crate::retry::{self, Delays};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset as KOffset, TopicPartitionList};
use sluice_protocol::claim::{Claim, ClaimTimes, Do, Start, Why, WATCH_EVERY};
use sluice_protocol::resume::{
    check_log, resume_plan, Committed, LogBounds, Mismatch, ResetPolicy,
};
use sluice_protocol::NextOffset;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// What the group committed for one partition, from one element of a
/// committed-offsets answer.
fn committed_of(offset: KOffset, error: KafkaResult<()>) -> Committed {
    match (error, offset) {
        (Err(_), _) => Committed::Unknown,
        (Ok(()), KOffset::Offset(n)) if n >= 0 => Committed::At(NextOffset(n)),
        (Ok(()), KOffset::Invalid) => Committed::Nothing,
        // Not a position a commit can hold: do not guess.
        (Ok(()), _) => Committed::Unknown,
    }
}

/// The work of preparing one assignment, off the consumer thread.
pub(super) struct Preparation {
    pub(super) ch: ClickHouse,
    pub(super) kafka: KafkaConfig,
    pub(super) routes: Vec<Arc<Route>>,
    pub(super) owners: Owners,
    pub(super) tx: mpsc::Sender<Event>,
    pub(super) stopping: CancellationToken,
    pub(super) exactly_once: bool,
    pub(super) fence_wait: Duration,
    pub(super) reset: ResetPolicy,
    /// This process's id in the register.
    pub(super) me: u64,
    /// How long to wait before claiming: a partition just taken from this
    /// process waits (see [`super::state::Sink::on_taken`]).
    pub(super) wait: Duration,
    /// Whether the wait ends once the register shows the partitions
    /// handed off cleanly.
    pub(super) watch: bool,
    /// Per route: the partitions and their generations.
    pub(super) parts: BTreeMap<usize, Vec<(Key, u64)>>,
    /// Cancelled when this generation of a partition is given up (revoked,
    /// lost, taken): its preparation stops claiming it.
    pub(super) given_up: HashMap<(Key, u64), CancellationToken>,
}

/// Reads the group's offsets and the log's bounds without joining the
/// group: a client of its own with the group's id, used off the consumer
/// thread.
type Lookup = Arc<BaseConsumer>;

impl Preparation {
    pub(super) async fn run(self) {
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

    /// Plans every partition; in exactly-once mode, claims each one first
    /// ([`Claim`] decides; this drives it).
    async fn prepare(&self, lookup: &Lookup) {
        let keys: Vec<(Key, u64)> = self.parts.values().flatten().copied().collect();
        if !self.exactly_once {
            if self.wait.is_zero() || self.sleep(self.wait).await {
                if let Some(commits) = self.committed(lookup, &keys).await {
                    let now = Instant::now();
                    let all: Vec<_> = keys.iter().map(|&p| (p, now)).collect();
                    self.plan(lookup, &all, &commits).await;
                }
            }
            return;
        }
        let start = if self.wait.is_zero() {
            Start::Now
        } else {
            tracing::info!(
                wait_ms = self.wait.as_millis() as u64,
                "the partition was taken; waiting before claiming it back"
            );
            Start::After {
                until: Instant::now() + self.wait,
                watch: self.watch,
            }
        };
        let times = ClaimTimes::new(self.fence_wait);
        let mut claim = Claim::new(keys, self.me, times, start);
        let mut commits = HashMap::new();
        let mut delays = Delays::new(Duration::from_millis(500));
        loop {
            claim.retain(Instant::now(), |p| self.current(p));
            let ks: Vec<Key> = claim.keys().iter().map(|(k, _)| *k).collect();
            match claim.next() {
                Do::Done => return,
                Do::ReadCommits => {
                    let Some(c) = self.committed(lookup, claim.keys()).await else {
                        return;
                    };
                    commits = c;
                    claim.commits_read();
                }
                Do::Read => {
                    let Some((found, sent)) = self.read_owners_at(&ks).await else {
                        return;
                    };
                    let entry =
                        |(k, _): &(Key, u64)| found.get(k).copied().unwrap_or(Owner::Nobody);
                    let ours = claim.read(sent, Instant::now(), entry);
                    if !claim.contested().is_empty() {
                        tracing::warn!(
                            partitions = claim.contested().len(),
                            "another owner claimed partitions this process is assigned, at the same time or during the fence"
                        );
                    }
                    if !self.plan(lookup, &ours, &commits).await {
                        return;
                    }
                    claim.planned(Instant::now());
                }
                Do::Write => {
                    let (owners, me) = (self.owners.clone(), self.me);
                    match blocking(move || owners.write(ks, me)).await {
                        Ok(()) => claim.written(Instant::now()),
                        Err(e) => {
                            tracing::warn!(
                                error = %format!("{e:#}"),
                                "cannot record the ownership marker (the claim) yet; the partitions wait"
                            );
                            claim.write_failed(Instant::now());
                        }
                    }
                }
                Do::Wait { until, why } => {
                    match why {
                        Why::Fence => tracing::info!(
                            wait_ms = until.saturating_duration_since(Instant::now()).as_millis() as u64,
                            "no clean hand-off; claimed, waiting out the previous owner's inserts before reading ClickHouse"
                        ),
                        Why::Yield => tracing::info!(
                            wait_ms = until.saturating_duration_since(Instant::now()).as_millis() as u64,
                            "another owner claimed partitions this process is assigned; yielding before claiming them back"
                        ),
                        Why::Taken { .. } | Why::Settle => {}
                    }
                    let Some(clean) = self.wait_watching(&mut claim, until, why).await else {
                        return;
                    };
                    match (clean, why) {
                        (false, _) => {}
                        (true, Why::Fence) => tracing::info!(
                            "the previous owner marked the partitions clean during the fence; claiming them again"
                        ),
                        (true, Why::Taken { .. }) => tracing::info!(
                            "the owner that took the partition handed it off cleanly; claiming it now"
                        ),
                        (true, _) => tracing::info!(
                            "the owner that claimed the partitions handed them off cleanly; claiming them now"
                        ),
                    }
                }
                Do::Backoff => {
                    if !delays.wait(&self.stopping).await {
                        return;
                    }
                    claim.woke(Instant::now());
                }
            }
        }
    }

    /// Waits until `until`, checking every [`WATCH_EVERY`] whether the
    /// partitions are still to be claimed and, if `why` watches, reading the
    /// register. `Some(true)` when a read ended the wait, `Some(false)` at
    /// its end or once nothing is left, `None` when stopping.
    ///
    /// Only an owner holding a lease, with nothing in flight, writes
    /// `clean`; any owner before it had been fenced out before it went
    /// active. So once the register shows `clean`, nothing anyone started
    /// can still commit.
    async fn wait_watching(
        &self,
        claim: &mut Claim<(Key, u64), Instant>,
        until: Instant,
        why: Why,
    ) -> Option<bool> {
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            if !self.sleep(left.min(WATCH_EVERY)).await {
                return None;
            }
            claim.retain(Instant::now(), |p| self.current(p));
            if claim.next() != (Do::Wait { until, why }) {
                return Some(false);
            }
            if !why.watches() {
                continue;
            }
            let (owners, ks) = (self.owners.clone(), claim.keys().to_vec());
            let ks: Vec<Key> = ks.into_iter().map(|(k, _)| k).collect();
            let Ok(found) = blocking(move || owners.read(ks, Duration::from_secs(5))).await else {
                continue;
            };
            let entry = |(k, _): &(Key, u64)| found.get(k).copied().unwrap_or(Owner::Nobody);
            if claim.watched(Instant::now(), entry) {
                return Some(true);
            }
        }
        claim.woke(Instant::now());
        Some(false)
    }

    /// Whether this generation of the partition is still being prepared.
    fn current(&self, p: &(Key, u64)) -> bool {
        self.given_up.get(p).is_some_and(|t| !t.is_cancelled())
    }

    /// The register's entries for `keys`, read until every one is known,
    /// with the time the read that answered was sent. `None` when stopping.
    async fn read_owners_at(&self, keys: &[Key]) -> Option<(HashMap<Key, Owner>, Instant)> {
        let mut delays = Delays::new(Duration::from_millis(200));
        loop {
            let (owners, ks) = (self.owners.clone(), keys.to_vec());
            let sent = Instant::now();
            match blocking(move || owners.read(ks, Duration::from_secs(5))).await {
                Ok(o) if keys.iter().all(|k| o.contains_key(k)) => return Some((o, sent)),
                Ok(_) => {
                    tracing::warn!("some ownership markers cannot be read yet; the partitions wait")
                }
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "cannot read the ownership markers yet; the partitions wait")
                }
            }
            if !delays.wait(&self.stopping).await {
                return None;
            }
        }
    }

    /// Plans `keys` from `commits` and what ClickHouse holds, and hands
    /// each plan to the consumer thread. First every partition's log is
    /// checked against its rows and commit ([`check_log`]): one whose
    /// offsets went back stops the sink before any partition of the
    /// assignment is read. False when stopping.
    async fn plan(
        &self,
        lookup: &Lookup,
        keys: &[((Key, u64), Instant)],
        commits: &HashMap<Key, Committed>,
    ) -> bool {
        let mut checked = Vec::new();
        let mut mismatched = Vec::new();
        for (ri, parts) in &self.parts {
            let parts: Vec<((Key, u64), Instant)> = keys
                .iter()
                .filter(|(p, _)| parts.contains(p) && self.current(p))
                .copied()
                .collect();
            if parts.is_empty() {
                continue;
            }
            let route = &self.routes[*ri];
            // No insert an earlier owner started may commit after the read
            // below: end whatever of these partitions still runs, for as
            // long as they are still this preparation's (a partition given
            // up meanwhile has a new owner, whose inserts are not to end).
            if self.exactly_once
                && self
                    .retry("end an earlier owner's inserts", || async {
                        let numbers: Vec<i32> = parts
                            .iter()
                            .filter(|(p, _)| self.current(p))
                            .map(|((k, _), _)| k.1)
                            .collect();
                        if !numbers.is_empty() {
                            self.ch.end_partition_queries(route, &numbers).await?;
                        }
                        Ok::<_, anyhow::Error>(())
                    })
                    .await
                    .is_none()
            {
                return false;
            }
            let Some(marks) = self
                .retry("read watermarks", || async {
                    let t0 = Instant::now();
                    let m = self.ch.watermarks(route).await?;
                    tracing::info!(table = %route.table_ref(), ms = t0.elapsed().as_millis() as u64, "read watermarks");
                    Ok::<_, anyhow::Error>(m)
                })
                .await
            else {
                return false;
            };
            for ((key, generation), confirmed) in parts {
                let position = commits.get(&key).copied().unwrap_or(Committed::Unknown);
                let w = marks.get(&key.1).copied();
                // Read after the watermarks: a row another owner inserts
                // meanwhile is of a record already in the log read here.
                let Some(log) = self.log_bounds(lookup, key).await else {
                    return false;
                };
                // At-least-once comes here for the dedup window only: it
                // resumes where committed and reconciles nothing.
                match check_log(position, w.filter(|_| self.exactly_once), log) {
                    // Past the last stable offset is not past the log's end:
                    // another tool may commit up to the high watermark
                    // while a transaction is open.
                    Err(Mismatch::CommitPastLogEnd { committed, .. })
                        if self.log_end(key).await.is_none_or(|end| committed.0 <= end) =>
                    {
                        checked.push((key, generation, confirmed, position, w, log))
                    }
                    Ok(()) => checked.push((key, generation, confirmed, position, w, log)),
                    Err(why) => mismatched.push((key, generation, why)),
                }
            }
        }
        if !mismatched.is_empty() {
            let _ = self.tx.send(Event::Mismatch(mismatched));
            return false;
        }
        for (key, generation, confirmed, position, w, log) in checked {
            let route = &self.routes[key.0];
            let mut plan = resume_plan(position, w.filter(|_| self.exactly_once), log, self.reset);
            let Some(seeds) = self
                .retry("rebuild the key dedup window", || {
                    rebuild(&self.kafka, &self.ch, route, key.1, w, plan.start)
                })
                .await
            else {
                return false;
            };
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
                committed = ?position,
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
                confirmed,
                attempts: 0,
                delays: Delays::new(Duration::from_millis(500)),
            }));
        }
        true
    }

    /// The partition's high watermark, past any open transaction (`None`
    /// when it cannot be read now: no mismatch is declared on a guess).
    async fn log_end(&self, key: Key) -> Option<i64> {
        let (kafka, topic) = (self.kafka.clone(), self.routes[key.0].topic.clone());
        let read = blocking(move || {
            let c = lookup_client_reading(&kafka, "read_uncommitted")?;
            let end = c.fetch_watermarks(&topic, key.1, Duration::from_secs(5));
            // Closing a client waits for its threads: here, off the runtime.
            drop(c);
            end
        });
        read.await.ok().map(|(_, high)| high)
    }

    /// The bounds of a partition's log, retried until read.
    async fn log_bounds(&self, lookup: &Lookup, key: Key) -> Option<LogBounds> {
        let topic = &self.routes[key.0].topic;
        self.retry("read the partition's log bounds", || {
            let (lookup, topic) = (lookup.clone(), topic.clone());
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
    }

    /// Sleeps `d`; false if stopping first.
    async fn sleep(&self, d: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => true,
            _ = self.stopping.cancelled() => false,
        }
    }

    /// The group's commits of `keys`, read until every one is known: a
    /// failure to read is not "nothing committed". The partitions wait
    /// meanwhile. `None` when stopping.
    async fn committed(
        &self,
        lookup: &Lookup,
        keys: &[(Key, u64)],
    ) -> Option<HashMap<Key, Committed>> {
        let mut delays = Delays::new(Duration::from_millis(300));
        for attempt in 1u32.. {
            let mut tpl = TopicPartitionList::new();
            for ((ri, p), _) in keys {
                tpl.add_partition(&self.routes[*ri].topic, *p);
            }
            let l = lookup.clone();
            match blocking(move || l.committed_offsets(tpl, Duration::from_secs(5))).await {
                Ok(list) => {
                    let mut out = HashMap::new();
                    for e in list.elements() {
                        let Some(ri) = self.routes.iter().position(|r| r.topic == e.topic()) else {
                            continue;
                        };
                        out.insert((ri, e.partition()), committed_of(e.offset(), e.error()));
                    }
                    let known = keys
                        .iter()
                        .all(|(k, _)| out.get(k).is_some_and(|c| !matches!(c, Committed::Unknown)));
                    if known {
                        return Some(out);
                    }
                    tracing::warn!(
                        attempt,
                        "some committed offsets cannot be read yet; the partitions wait"
                    );
                }
                Err(e) => {
                    tracing::warn!(attempt, error = %e, "cannot read the committed offsets yet; the partitions wait")
                }
            }
            if !delays.wait(&self.stopping).await {
                return None;
            }
        }
        None
    }

    /// Runs `f` until it succeeds ([`retry::until_ok`]); `None` once stopping.
    async fn retry<T, F, Fut>(&self, what: &str, f: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = anyhow::Result<T>>,
    {
        let f = retry::until_ok(what, Duration::from_millis(200), &self.stopping, f);
        f.await
    }
}

/// A client that shares the group's id without joining it.
/// Its log bounds are those the sink reads within: under `read_committed`
/// the end is the last stable offset, below a transaction still open.
pub(super) fn lookup_client(kafka: &KafkaConfig) -> KafkaResult<Lookup> {
    lookup_client_reading(kafka, "read_committed")
}

fn lookup_client_reading(kafka: &KafkaConfig, isolation: &str) -> KafkaResult<Lookup> {
    let mut cc = kafka.client_config();
    cc.set("group.id", &kafka.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("isolation.level", isolation);
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
    fn a_commit_is_a_position_nothing_or_unknown() {
        let failed = Err(KafkaError::OffsetFetch(
            RDKafkaErrorCode::CoordinatorNotAvailable,
        ));
        assert_eq!(
            committed_of(KOffset::Offset(10), failed),
            Committed::Unknown
        );
        assert_eq!(committed_of(KOffset::Stored, Ok(())), Committed::Unknown);
        assert_eq!(
            committed_of(KOffset::Offset(10), Ok(())),
            Committed::At(NextOffset(10))
        );
        assert_eq!(committed_of(KOffset::Invalid, Ok(())), Committed::Nothing);
    }
}
