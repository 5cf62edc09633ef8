//! The consumer thread: records in, batches out, completions back, commits.
//!
//! One OS thread owns the librdkafka consumer and all partition state. It
//! polls records, encodes them into per-partition batches, hands due batches
//! to insert tasks on the tokio runtime, folds their completions into each
//! partition's [`AckTracker`] and commits the durable frontier. Rebalances
//! run on this thread too, inside `poll`:
//!
//! - assign (exactly-once): read the committed position and its hand-off
//!   marker; without a clean hand-off wait `fence_wait` so any insert of the
//!   previous owner has ended; read the watermark from ClickHouse; start at
//!   the committed position and reconcile every record up to the watermark;
//!   commit an `open` marker before any insert.
//! - revoke: stop batching the partition, wait for its in-flight inserts,
//!   commit the frontier with a `clean` marker. If the assignment was lost
//!   instead, abandon in-flight work at once: the group has moved on.
//!
//! Memory: builders plus in-flight batches stay under `max_buffered_bytes`;
//! over it, every partition is paused (the consumer keeps polling, so the
//! group does not evict it) until half of it is free.

use super::lease::Lease;
use super::writer::{deliver, Completion, Job, Outcome, WriterCtx};
use crate::ch::ClickHouse;
use crate::config::{Config, Delivery, Route};
use anyhow::{anyhow, Context as _};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, ClientContext, Offset as KOffset, TopicPartitionList};
use sluice_core::resume::{resume_plan, StartAt};
use sluice_core::{AckTracker, BatchBuilder, NextOffset, Offset, PartitionId, RowEncoder};
use std::collections::HashMap;
use std::future::Future;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

const MARK_OPEN: &str = "sluice:open";
const MARK_CLEAN: &str = "sluice:clean";

type Key = (usize, i32);

struct Part {
    builder: BatchBuilder,
    /// The batch being built holds rows that may already be stored.
    builder_uncertain: bool,
    acks: Option<AckTracker>,
    committed: Option<NextOffset>,
    check_through: Option<Offset>,
    generation: u64,
    abandon: CancellationToken,
}

/// All state of the sink; lives in the consumer context so rebalance
/// callbacks can reach it. Only the consumer thread ever locks it.
struct Sink {
    cfg: Config,
    routes: Vec<Arc<Route>>,
    encoders: Vec<RowEncoder>,
    parts: HashMap<Key, Part>,
    ctx: Arc<WriterCtx>,
    handle: Handle,
    tx: mpsc::Sender<Completion>,
    rx: mpsc::Receiver<Completion>,
    in_flight_bytes: usize,
    in_flight: usize,
    next_generation: u64,
    paused: bool,
    fatal: Option<anyhow::Error>,
    stopping: CancellationToken,
    stats: Stats,
}

#[derive(Default, Debug, Clone, Copy)]
struct Stats {
    records: u64,
    rows_inserted: u64,
    batches: u64,
}

struct SinkContext {
    sink: Mutex<Sink>,
}

impl ClientContext for SinkContext {}

impl ConsumerContext for SinkContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let mut sink = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => sink.on_assign(consumer, tpl),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => sink.on_revoke(consumer, tpl),
            other => {
                tracing::error!(error = ?other, "rebalance error; giving up the partitions");
                sink.on_revoke(consumer, tpl)
            }
        };
        if let Err(e) = result {
            tracing::error!(error = %e, "rebalance handling failed");
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, _: &Rebalance<'_>) {}
}

/// Runs the sink until `shutdown` resolves or a permanent error occurs.
pub async fn run(
    cfg: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let ch = connect_clickhouse(&cfg).await?;
    for route in &cfg.routes {
        ch.check_table(route).await.map_err(|e| anyhow!("{e}"))?;
    }
    let hold = cfg.kafka.heartbeat_interval * 2 + Duration::from_secs(1);
    let lease = Lease::start(Duration::from_millis(1500), hold);
    let ctx = Arc::new(WriterCtx {
        ch,
        lease,
        delivery: cfg.sink.delivery,
        permits: Semaphore::new(cfg.sink.max_concurrent_inserts),
    });
    let stopping = CancellationToken::new();
    let (tx, rx) = mpsc::channel();
    let sink = Sink {
        routes: cfg.routes.iter().cloned().map(Arc::new).collect(),
        encoders: cfg
            .routes
            .iter()
            .map(|r| RowEncoder::new(&r.topic, cfg.sink.columns.clone()))
            .collect(),
        cfg: cfg.clone(),
        parts: HashMap::new(),
        ctx,
        handle: Handle::current(),
        tx,
        rx,
        in_flight_bytes: 0,
        in_flight: 0,
        next_generation: 0,
        paused: false,
        fatal: None,
        stopping: stopping.clone(),
        stats: Stats::default(),
    };
    let consumer = build_consumer(&cfg, sink)?;
    let topics: Vec<&str> = cfg.routes.iter().map(|r| r.topic.as_str()).collect();
    consumer
        .subscribe(&topics)
        .context("subscribing to the topics")?;

    let stop = stopping.clone();
    tokio::spawn(async move {
        shutdown.await;
        stop.cancel();
    });
    let thread = std::thread::Builder::new()
        .name("sluice-consumer".into())
        .spawn(move || poll_loop(consumer))
        .context("starting the consumer thread")?;
    tokio::task::spawn_blocking(move || thread.join())
        .await
        .map_err(|e| anyhow!("consumer thread: {e}"))?
        .map_err(|_| anyhow!("the consumer thread panicked"))?
}

async fn connect_clickhouse(cfg: &Config) -> anyhow::Result<ClickHouse> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match ClickHouse::connect(
            &cfg.clickhouse,
            cfg.sink.columns.clone(),
            cfg.sink.delivery,
            cfg.sink.limits.max_rows,
        )
        .await
        {
            Ok(ch) => return Ok(ch),
            Err(e) if e.is_retriable() && Instant::now() < deadline => {
                tracing::warn!(url = %cfg.clickhouse.url, error = %e, "ClickHouse not reachable yet");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => {
                return Err(anyhow!(
                    "cannot use ClickHouse at {}: {e}",
                    cfg.clickhouse.url
                ));
            }
        }
    }
}

fn build_consumer(cfg: &Config, sink: Sink) -> anyhow::Result<BaseConsumer<SinkContext>> {
    let k = &cfg.kafka;
    let queued_kb = (cfg.sink.max_buffered_bytes / 4 / 1024).clamp(1024, 65536);
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &k.brokers)
        .set("group.id", &k.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set(
            "session.timeout.ms",
            k.session_timeout.as_millis().to_string(),
        )
        .set(
            "heartbeat.interval.ms",
            k.heartbeat_interval.as_millis().to_string(),
        )
        .set("auto.offset.reset", &k.auto_offset_reset)
        .set("queued.max.messages.kbytes", queued_kb.to_string())
        .set("enable.partition.eof", "false");
    for (key, v) in &k.properties {
        cc.set(key, v);
    }
    cc.create_with_context(SinkContext {
        sink: Mutex::new(sink),
    })
    .with_context(|| format!("creating the Kafka consumer for {}", k.brokers))
}

fn poll_loop(consumer: BaseConsumer<SinkContext>) -> anyhow::Result<()> {
    let (commit_interval, stopping) = {
        let s = lock(&consumer);
        (s.cfg.sink.commit_interval, s.stopping.clone())
    };
    let mut last_commit = Instant::now();
    let mut last_sweep = Instant::now();
    let mut last_report = Instant::now();
    loop {
        {
            let mut s = lock(&consumer);
            s.drain_completions();
            if s.fatal.is_some() || stopping.is_cancelled() {
                break;
            }
            s.apply_backpressure(&consumer);
        }
        let msg = consumer.poll(Duration::from_millis(50));
        let now = Instant::now();
        let mut s = lock(&consumer);
        match msg {
            Some(Ok(m)) => s.on_record(m.topic(), m.partition(), m.offset(), m.payload(), now),
            Some(Err(e)) => tracing::warn!(error = %e, "Kafka consumer error"),
            None => {}
        }
        if now.duration_since(last_sweep) >= Duration::from_millis(20) {
            last_sweep = now;
            s.cut_due(now, false);
        }
        if now.duration_since(last_commit) >= commit_interval {
            last_commit = now;
            s.commit(&consumer, MARK_OPEN, false);
        }
        if now.duration_since(last_report) >= Duration::from_secs(10) {
            last_report = now;
            let st = s.stats;
            tracing::info!(
                records = st.records,
                rows_inserted = st.rows_inserted,
                batches = st.batches,
                in_flight = s.in_flight,
                partitions = s.parts.len(),
                "progress"
            );
        }
    }
    // Graceful stop: flush what was read (unless a record was bad), wait for
    // every insert, commit with a clean hand-off marker, leave the group.
    let fatal = {
        let mut s = lock(&consumer);
        let failed = s.fatal.is_some();
        if !failed {
            s.cut_due(Instant::now(), true);
        }
        let timeout = drain_timeout(&s.cfg);
        s.wait_in_flight(None, timeout);
        s.commit(&consumer, MARK_CLEAN, true);
        s.parts.clear();
        tracing::info!(
            records = s.stats.records,
            rows_inserted = s.stats.rows_inserted,
            "stopped"
        );
        s.fatal.take()
    };
    consumer.unsubscribe();
    drop(consumer);
    match fatal {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn lock(consumer: &BaseConsumer<SinkContext>) -> std::sync::MutexGuard<'_, Sink> {
    consumer
        .context()
        .sink
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn drain_timeout(cfg: &Config) -> Duration {
    cfg.clickhouse.insert_timeout * 3
}

impl Sink {
    fn route_of(&self, topic: &str) -> Option<usize> {
        self.routes.iter().position(|r| r.topic == topic)
    }

    fn on_record(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        payload: Option<&[u8]>,
        now: Instant,
    ) {
        let Some(ri) = self.route_of(topic) else {
            return;
        };
        let Some(part) = self.parts.get_mut(&(ri, partition)) else {
            return;
        };
        self.stats.records += 1;
        let encoder = &self.encoders[ri];
        let offset = Offset(offset);
        part.acks
            .get_or_insert_with(|| AckTracker::new(NextOffset(offset.0)));
        if part.check_through.is_some_and(|c| offset <= c) {
            part.builder_uncertain = true;
        }
        let pushed = part.builder.push(offset, now, |buf| {
            encoder.encode(payload, partition, offset.0, buf)
        });
        if let Err(e) = pushed {
            self.fatal = Some(anyhow!(
                "record {topic}[{partition}]@{} cannot become a row: {e}. \
                 sluice stops rather than skip it; fix or remove the record (a DLQ comes in a later release)",
                offset.0
            ));
            return;
        }
        if part.builder.is_due(now) {
            self.cut((ri, partition));
        }
    }

    /// Sends every due batch (every non-empty one with `all`).
    fn cut_due(&mut self, now: Instant, all: bool) {
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
        self.in_flight_bytes += batch.bytes();
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
        };
        let ctx = self.ctx.clone();
        let tx = self.tx.clone();
        self.handle.spawn(async move {
            let c = deliver(job, ctx).await;
            let _ = tx.send(c);
        });
    }

    fn drain_completions(&mut self) {
        while let Ok(c) = self.rx.try_recv() {
            self.on_completion(c);
        }
    }

    fn on_completion(&mut self, c: Completion) {
        self.in_flight_bytes -= c.bytes;
        self.in_flight -= 1;
        let part = self
            .parts
            .get_mut(&(c.route_idx, c.partition))
            .filter(|p| p.generation == c.generation);
        match c.outcome {
            Outcome::Durable { inserted, .. } => {
                self.stats.rows_inserted += inserted as u64;
                if let Some(acks) = part.and_then(|p| p.acks.as_mut()) {
                    acks.ack(c.ticket);
                }
            }
            Outcome::Abandoned => {}
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
    }

    /// Waits for in-flight batches (of `only`, or of every partition).
    fn wait_in_flight(&mut self, only: Option<&[Key]>, timeout: Duration) -> bool {
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
                Ok(c) => self.on_completion(c),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return false,
            }
        }
    }

    /// Commits the durable frontier of every partition that moved (all with
    /// `force`), tagged with a hand-off marker.
    fn commit(&mut self, consumer: &BaseConsumer<SinkContext>, marker: &str, sync: bool) {
        let mut tpl = TopicPartitionList::new();
        let mut moved = Vec::new();
        for (key, part) in &self.parts {
            let Some(frontier) = part.acks.as_ref().map(|a| a.frontier()) else {
                continue;
            };
            if !sync && part.committed == Some(frontier) {
                continue;
            }
            let topic = &self.routes[key.0].topic;
            add_marked(&mut tpl, topic, key.1, frontier, marker);
            moved.push((*key, frontier));
        }
        if moved.is_empty() {
            return;
        }
        let mode = if sync {
            rdkafka::consumer::CommitMode::Sync
        } else {
            rdkafka::consumer::CommitMode::Async
        };
        match consumer.commit(&tpl, mode) {
            Ok(()) => {
                for (key, frontier) in moved {
                    if let Some(p) = self.parts.get_mut(&key) {
                        p.committed = Some(frontier);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "offset commit failed; it is advisory, progress lives in ClickHouse")
            }
        }
    }

    fn apply_backpressure(&mut self, consumer: &BaseConsumer<SinkContext>) {
        let building: usize = self.parts.values().map(|p| p.builder.bytes()).sum();
        let buffered = self.in_flight_bytes + building;
        let max = self.cfg.sink.max_buffered_bytes;
        let want_pause = if self.paused {
            buffered >= max / 2
        } else {
            buffered >= max
        };
        if want_pause {
            // Send what is built so the memory can drain.
            self.cut_due(Instant::now(), true);
        }
        if want_pause != self.paused {
            if let Ok(assignment) = consumer.assignment() {
                let r = if want_pause {
                    consumer.pause(&assignment)
                } else {
                    consumer.resume(&assignment)
                };
                match r {
                    Ok(()) => {
                        self.paused = want_pause;
                        tracing::debug!(paused = want_pause, buffered, "backpressure");
                    }
                    Err(e) => tracing::warn!(error = %e, "pause/resume failed"),
                }
            }
        }
    }

    fn new_part(&mut self, ri: usize, partition: i32) -> Part {
        self.next_generation += 1;
        Part {
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
        }
    }

    fn on_assign(
        &mut self,
        consumer: &BaseConsumer<SinkContext>,
        tpl: &TopicPartitionList,
    ) -> KafkaResult<()> {
        let keys: Vec<Key> = tpl
            .elements()
            .iter()
            .filter_map(|e| Some((self.route_of(e.topic())?, e.partition())))
            .collect();
        tracing::info!(partitions = ?keys.iter().map(|k| format!("{}[{}]", self.routes[k.0].topic, k.1)).collect::<Vec<_>>(), "assigned");
        if self.cfg.sink.delivery == Delivery::AtLeastOnce {
            for &(ri, p) in &keys {
                let part = self.new_part(ri, p);
                self.parts.insert((ri, p), part);
            }
            return consumer.incremental_assign(tpl);
        }

        // 1. The committed positions and hand-off markers.
        let committed = committed_with_retry(consumer, tpl);
        let clean = !keys.is_empty()
            && keys.iter().all(|&(ri, p)| {
                committed
                    .get(&(self.routes[ri].topic.clone(), p))
                    .is_some_and(|(_, m)| m == MARK_CLEAN)
            });
        // 2. Fence: without a clean hand-off, wait until any insert the
        //    previous owner may have started can no longer commit.
        if !clean && !keys.is_empty() {
            let wait = self.cfg.sink.fence_wait;
            tracing::info!(
                wait_ms = wait.as_millis() as u64,
                "no clean hand-off; waiting out the previous owner's inserts"
            );
            self.sleep_serving_completions(wait);
        }
        // 3. Watermarks from ClickHouse, per route.
        let mut marks: HashMap<usize, HashMap<i32, Offset>> = HashMap::new();
        for ri in keys
            .iter()
            .map(|k| k.0)
            .collect::<std::collections::BTreeSet<_>>()
        {
            let route = self.routes[ri].clone();
            let ch = self.ctx.ch.clone();
            let mut backoff = Duration::from_millis(200);
            let w = loop {
                let t0 = Instant::now();
                match self.handle.block_on(ch.watermarks(&route)) {
                    Ok(w) => {
                        tracing::info!(table = %route.qualified(), ms = t0.elapsed().as_millis() as u64, "read watermarks");
                        break w;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read watermarks yet; retrying");
                        if self.stopping.is_cancelled() {
                            break HashMap::new();
                        }
                        self.sleep_serving_completions(backoff);
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            };
            marks.insert(ri, w);
        }
        // 4. Plans, markers, assignment.
        let mut assign = TopicPartitionList::new();
        let mut markers = TopicPartitionList::new();
        for &(ri, p) in &keys {
            let topic = self.routes[ri].topic.clone();
            let c = committed.get(&(topic.clone(), p)).and_then(|(c, _)| *c);
            let w = marks.get(&ri).and_then(|m| m.get(&p)).copied();
            let plan = resume_plan(c, w);
            let mut part = self.new_part(ri, p);
            part.check_through = plan.check_through;
            match plan.start {
                StartAt::At(n) => {
                    assign.add_partition_offset(&topic, p, KOffset::Offset(n.0))?;
                    add_marked(&mut markers, &topic, p, n, MARK_OPEN);
                    part.acks = Some(AckTracker::new(n));
                    part.committed = Some(n);
                }
                StartAt::Reset => {
                    assign.add_partition_offset(&topic, p, KOffset::Invalid)?;
                }
            }
            tracing::info!(partition = %format!("{topic}[{p}]"), committed = ?c.map(|c| c.0), watermark = ?w.map(|w| w.0), check_through = ?plan.check_through.map(|o| o.0), "resume plan");
            self.parts.insert((ri, p), part);
        }
        if markers.count() > 0 {
            if let Err(e) = consumer.commit(&markers, rdkafka::consumer::CommitMode::Sync) {
                tracing::warn!(error = %e, "could not record the ownership marker");
            }
        }
        consumer.incremental_assign(&assign)
    }

    fn on_revoke(
        &mut self,
        consumer: &BaseConsumer<SinkContext>,
        tpl: &TopicPartitionList,
    ) -> KafkaResult<()> {
        let keys: Vec<Key> = tpl
            .elements()
            .iter()
            .filter_map(|e| Some((self.route_of(e.topic())?, e.partition())))
            .filter(|k| self.parts.contains_key(k))
            .collect();
        let lost = consumer.assignment_lost();
        tracing::info!(lost, partitions = keys.len(), "revoked");
        for k in &keys {
            if let Some(p) = self.parts.get_mut(k) {
                p.builder.clear();
                p.builder_uncertain = false;
            }
        }
        if lost {
            for k in &keys {
                if let Some(p) = self.parts.remove(k) {
                    p.abandon.cancel();
                }
            }
        } else {
            let timeout = drain_timeout(&self.cfg);
            let drained = self.wait_in_flight(Some(&keys), timeout);
            let marker = if drained { MARK_CLEAN } else { MARK_OPEN };
            let mut tpl_commit = TopicPartitionList::new();
            for k in &keys {
                if let Some(f) = self
                    .parts
                    .get(k)
                    .and_then(|p| p.acks.as_ref())
                    .map(|a| a.frontier())
                {
                    add_marked(&mut tpl_commit, &self.routes[k.0].topic, k.1, f, marker);
                }
            }
            if tpl_commit.count() > 0 {
                if let Err(e) = consumer.commit(&tpl_commit, rdkafka::consumer::CommitMode::Sync) {
                    tracing::warn!(error = %e, "final commit on revoke failed");
                }
            }
            for k in &keys {
                if let Some(p) = self.parts.remove(k) {
                    p.abandon.cancel();
                }
            }
        }
        consumer.incremental_unassign(tpl)
    }

    fn sleep_serving_completions(&mut self, d: Duration) {
        let deadline = Instant::now() + d;
        while let Some(left) = deadline
            .checked_duration_since(Instant::now())
            .filter(|l| !l.is_zero())
        {
            if let Ok(c) = self.rx.recv_timeout(left.min(Duration::from_millis(200))) {
                self.on_completion(c);
            }
        }
    }
}

fn add_marked(tpl: &mut TopicPartitionList, topic: &str, p: i32, at: NextOffset, marker: &str) {
    let mut e = tpl.add_partition(topic, p);
    let _ = e.set_offset(KOffset::Offset(at.0));
    e.set_metadata(marker);
}

/// `(topic, partition) → (committed position, marker)`.
fn committed_with_retry(
    consumer: &BaseConsumer<SinkContext>,
    tpl: &TopicPartitionList,
) -> HashMap<(String, i32), (Option<NextOffset>, String)> {
    for attempt in 0..5 {
        match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
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
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
    HashMap::new()
}
