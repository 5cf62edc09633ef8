//! The consumer thread and its lifecycle: start, poll, stop.
//!
//! One OS thread owns the librdkafka consumer and all partition state
//! ([`Sink`]). Each turn of [`poll_loop`] handles what the insert tasks
//! reported, applies backpressure, polls one record, sends due batches and
//! commits the durable frontier every `commit_interval`. Rebalances run on
//! this thread too, inside `poll` ([`super::handoff`]). On shutdown it stops
//! fetching, flushes what was read, waits for every insert, commits with a
//! and marks the hand-off clean and leaves the group.
//!
//! Consumer errors: librdkafka recovers from most of them by itself; those
//! are logged (at most once per code every ten seconds). A fatal one
//! (librdkafka's notion, such as a static member fenced by another with its
//! `group.instance.id`) or one no retry can fix (credentials, authorization,
//! the group id) stops the process with the cause: it abandons its work,
//! inserts nothing more and exits non-zero.

use super::body::Bodies;
use super::columns::TableColumns;
use super::dlq::Dlq;
use super::edge;
use super::lease::renew;
use super::lease::Lease;
use super::schemas::Schemas;
use super::state::{RowChecks, Sink, Stats};
use super::writer::WriterCtx;
use super::SinkContext;
use crate::ch::{ChError, ChErrorKind, ClickHouse};
use crate::config::secret::redact_url;
use crate::config::{Config, Route};
use crate::http;
use crate::owners::{client_id, new_owner, register_group, Key, Owners};
use crate::registry::Registry;
use crate::retry::while_transient;
use crate::telemetry::Metrics;
use anyhow::{anyhow, Context as _};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use sluice_formats::RowEncoder;
use sluice_protocol::deadline::CLOCK_REREAD;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// How often every active partition commits its frontier again, moved or
/// not ([`Sink::recommit`]).
const RECOMMIT_EVERY: Duration = Duration::from_secs(30);

impl rdkafka::ClientContext for SinkContext {
    /// librdkafka's statistics (every `statistics.interval.ms`): the lag
    /// of each partition this process holds, from the broker's last stable
    /// offset to the durable frontier. librdkafka also reports partitions
    /// it no longer holds, with their old offsets: those are left out. The
    /// report is skipped if it comes while the consumer thread is inside
    /// the sink (a poll while draining).
    fn stats(&self, stats: rdkafka::Statistics) {
        let Ok(sink) = self.sink.try_lock() else {
            return;
        };
        for (topic, t) in &stats.topics {
            for (p, part) in &t.partitions {
                let high = if part.ls_offset >= 0 {
                    part.ls_offset
                } else {
                    part.hi_offset
                };
                if let (true, Some(done)) = (high >= 0, sink.durable_through(topic, *p)) {
                    crate::telemetry::consumer_lag(topic, *p, high - done);
                }
            }
        }
    }
}

impl rdkafka::consumer::ConsumerContext for SinkContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut rdkafka::TopicPartitionList,
    ) {
        let mut sink = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                edge::assign(consumer, &mut sink, tpl)
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                edge::revoke(consumer, &mut sink, tpl)
            }
            other => {
                tracing::error!(error = ?other, "rebalance error; giving up the partitions");
                edge::revoke(consumer, &mut sink, tpl)
            }
        };
        if let Err(e) = result {
            tracing::error!(error = %e, "rebalance handling failed");
        }
    }
}

/// When `sluice run` stops of its own accord.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Only on a signal (or a permanent error): the daemon.
    Stopped,
    /// Once every partition it holds is durable up to the high watermark
    /// seen at start (a backfill, a batch job); or on a signal first.
    CaughtUp,
}

/// How a run that did not fail ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// By a signal (or `shutdown`).
    Stopped,
    /// [`Until::CaughtUp`] was met.
    CaughtUp,
}

/// Runs the sink until `shutdown` resolves, `until` is met, or a permanent
/// error occurs.
pub async fn run(
    cfg: Config,
    until: Until,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Ended> {
    for line in cfg.endpoints() {
        tracing::info!("{line}");
    }
    for ignored in cfg.origins.warnings() {
        tracing::warn!("{ignored}");
    }
    let stopping = CancellationToken::new();
    let stop = stopping.clone();
    tokio::spawn(async move {
        shutdown.await;
        stop.cancel();
    });
    let Some(ch) = start_clickhouse(&cfg, &stopping).await? else {
        return Ok(Ended::Stopped);
    };
    tracing::info!(
        insert_settings = ?ch.insert_settings(),
        read_settings = ?ch.read_settings(),
        "ClickHouse settings of inserts and protocol reads"
    );
    if let (true, Some(safe)) = (cfg.sink.delivery.is_exactly_once(), cfg.fence_is_short()) {
        tracing::warn!(
            fence_wait = ?cfg.sink.fence_wait,
            safe = ?safe,
            "sink.fence_wait is shorter than 2 × insert_timeout + a 2 s lease + 5 s: \
             a previous owner's last insert can land after this process starts writing"
        );
    }
    let encoders: Vec<RowEncoder> = cfg.routes.iter().map(|r| cfg.encoder(r)).collect();
    let dlq = match &cfg.dlq {
        None => None,
        Some(topic) => Some(
            Dlq::new(&cfg.kafka, topic)
                .with_context(|| format!("creating the DLQ producer for topic {topic:?}"))?,
        ),
    };
    let routes: Vec<Arc<Route>> = cfg.routes.iter().cloned().map(Arc::new).collect();
    let bodies = Bodies::read(&ch, &routes, cfg.clickhouse.insert_format).await;
    let ctx = Arc::new(WriterCtx {
        ch,
        bodies,
        lease: Lease::new(cfg.lease()),
        delivery: cfg.sink.delivery,
        permits: Semaphore::new(cfg.sink.max_concurrent_inserts),
        dlq,
        per_insert: encoders.iter().map(|_| Default::default()).collect(),
        encoders,
    });
    let me = new_owner();
    // Leases are renewed until the consumer thread is done: a graceful stop
    // still inserts and reconciles what it has read.
    let renewing = CancellationToken::new();
    let _stop_renewing = renewing.clone().drop_guard();
    let registry = match &cfg.schema_registry {
        Some(r) if cfg.routes.iter().any(|r| r.format.is_registry()) => Some(
            Registry::new(r)
                .with_context(|| format!("the schema registry at {}", redact_url(&r.url)))?,
        ),
        _ => None,
    };
    let schemas = Schemas::new(
        &routes,
        cfg.sink.max_record_bytes,
        cfg.sink.batch_buffer_bytes(),
    );
    let columns = while_transient(
        "read the tables' columns",
        Duration::from_millis(500),
        &stopping,
        ChError::is_retriable,
        || TableColumns::read(&ctx.ch, &routes),
    )
    .await;
    let Some(columns) = columns else {
        return Ok(Ended::Stopped);
    };
    let columns = columns
        .context("reading the columns of the tables of the routes with extra_fields = \"dlq\"")?;
    let owners = Owners::new(&cfg.kafka, routes.clone())
        .context("creating the client of the register of owners")?;
    // Before the sink: it looks its counters up in the installed recorder.
    let ready = Arc::new(AtomicBool::new(false));
    if let Some(addr) = cfg.metrics_listen {
        let metrics = Metrics::install()?;
        crate::telemetry::started(cfg.sink.batch_buffer_bytes());
        crate::telemetry::ready(false);
        let stop = stopping.clone();
        let bound = http::serve(addr, metrics, ready.clone(), async move {
            stop.cancelled().await
        })
        .await?;
        tracing::info!(%bound, "serving /metrics, /health and /ready");
    }
    let sink = Sink::new(
        cfg.clone(),
        routes,
        ctx.clone(),
        owners.clone(),
        me,
        stopping.clone(),
        RowChecks {
            schemas,
            columns,
            registry,
        },
    );
    if cfg.sink.delivery.is_exactly_once() {
        tracing::info!(
            owner = me,
            register = %register_group(&cfg.kafka.group_id),
            lease = ?cfg.lease(),
            fence_wait = ?cfg.sink.fence_wait,
            "ownership"
        );
        tokio::spawn(renew(
            ctx.lease.clone(),
            owners.clone(),
            me,
            sink.events(),
            renewing.clone(),
        ));
        tokio::spawn(reread_clock(
            ctx.ch.clone(),
            ctx.lease.clone(),
            renewing.clone(),
        ));
    }

    let consumer = build_consumer(&cfg, sink, me)?;
    // Fail fast, with the address, when the brokers cannot be reached.
    consumer
        .fetch_metadata(None, Duration::from_secs(15))
        .with_context(|| format!("cannot reach Kafka at {}", cfg.kafka.brokers))?;
    let targets = match until {
        Until::Stopped => None,
        Until::CaughtUp => Some(high_watermarks(&consumer, &cfg.routes)?),
    };
    let topics: Vec<&str> = cfg.routes.iter().map(|r| r.topic.as_str()).collect();
    consumer
        .subscribe(&topics)
        .context("subscribing to the topics")?;

    let (loop_cfg, loop_stopping) = (cfg.clone(), stopping.clone());
    let thread = std::thread::Builder::new()
        .name("sluice-consumer".into())
        .spawn(move || poll_loop(consumer, &loop_cfg, targets, loop_stopping))
        .context("starting the consumer thread")?;
    // Both ends answered and the group is joined (or being joined).
    ready.store(true, Ordering::SeqCst);
    crate::telemetry::ready(true);
    let result = tokio::task::spawn_blocking(move || thread.join())
        .await
        .map_err(|e| anyhow!("consumer thread: {e}"))?
        .map_err(|_| anyhow!("the consumer thread panicked"))?;
    ready.store(false, Ordering::SeqCst);
    crate::telemetry::ready(false);
    result
}

/// The high watermark of every partition of the routes' topics, by
/// `(route index, partition)`: where `--until-caught-up` stops.
fn high_watermarks(
    consumer: &BaseConsumer<SinkContext>,
    routes: &[Route],
) -> anyhow::Result<HashMap<Key, i64>> {
    let timeout = Duration::from_secs(15);
    let mut targets = HashMap::new();
    for (ri, route) in routes.iter().enumerate() {
        let topic = &route.topic;
        let md = consumer
            .fetch_metadata(Some(topic), timeout)
            .with_context(|| format!("reading the partitions of topic {topic:?}"))?;
        for t in md.topics() {
            if let Some(e) = t.error() {
                return Err(anyhow!("topic {topic:?}: {:?}", RDKafkaErrorCode::from(e)));
            }
            for p in t.partitions() {
                let (_, high) = consumer
                    .fetch_watermarks(topic, p.id(), timeout)
                    .with_context(|| {
                        format!("reading the high watermark of {topic}[{}]", p.id())
                    })?;
                targets.insert((ri, p.id()), high);
            }
        }
    }
    let total: i64 = targets.values().sum();
    tracing::info!(
        partitions = targets.len(),
        high_watermarks_sum = total,
        "running until caught up with the high watermarks seen now"
    );
    Ok(targets)
}

/// Connects to ClickHouse and checks the routes' tables; `None` if a stop
/// came first. An answer no retry can fix (refused credentials, a missing
/// table) fails the start at once, a server that cannot be reached or does
/// not speak ClickHouse's HTTP after 15 s of that; a timeout, a dropped
/// connection or a retriable server code is a blip: logged and tried again
/// with backoff, at start-up as in steady state.
async fn start_clickhouse(
    cfg: &Config,
    stop: &CancellationToken,
) -> anyhow::Result<Option<ClickHouse>> {
    // A refused connection, a dropped one or an answer that is not
    // ClickHouse's (a wrong port, a proxy's 404) may be a wrong address:
    // tried for 15 s from the first of an unbroken run of them, then
    // the start fails with the cause.
    let unreachable_since = std::cell::Cell::new(None::<Instant>);
    let transient = |e: &ChError| {
        if !matches!(e.kind, ChErrorKind::Connect | ChErrorKind::Network) {
            unreachable_since.set(None);
            return e.is_retriable();
        }
        let since = unreachable_since.get().unwrap_or_else(Instant::now);
        unreachable_since.set(Some(since));
        since.elapsed() < Duration::from_secs(15)
    };
    let started = while_transient(
        "connect to ClickHouse and check the tables",
        Duration::from_millis(500),
        stop,
        transient,
        || async {
            let mut ch = ClickHouse::connect(
                &cfg.clickhouse,
                cfg.sink.columns.clone(),
                cfg.sink.delivery,
                cfg.sink.limits.max_rows,
            )
            .await?;
            for route in &cfg.routes {
                ch.check_table(route).await?;
                let engine = ch.engine(route).await?;
                ch.consistent_for(&route.table_ref(), &engine)?;
                if let Some(d) = &route.dedup {
                    ch.check_columns(route, &d.fields).await?;
                }
            }
            Ok(ch)
        },
    )
    .await;
    match started {
        None => Ok(None),
        Some(Ok(ch)) => Ok(Some(ch)),
        Some(Err(e)) => Err(anyhow!(
            "cannot use ClickHouse at {}: {e}",
            redact_url(&cfg.clickhouse.url)
        )),
    }
}

/// How often the consumer asks for the topics' metadata (sluice: 10 s).
const METADATA_REFRESH: &str = "topic.metadata.refresh.interval.ms";

/// librdkafka settings sluice changes unless `[kafka] properties` sets
/// them: a route read at the log end over many partitions otherwise
/// fetches as soon as any record arrives (`fetch.min.bytes` 1), hundreds
/// of fetches a second. Waiting for 256 KiB or 100 ms cut the sink's CPU
/// 11× at 64 partitions and 2,000 records/s, for ~0.1 s of latency
/// (docs/bench-parts.md); a busy route fills 256 KiB at once.
const FETCH_DEFAULTS: [(&str, &str); 3] = [
    (METADATA_REFRESH, "10000"),
    ("fetch.min.bytes", "262144"),
    ("fetch.wait.max.ms", "100"),
];

fn build_consumer(cfg: &Config, sink: Sink, me: u64) -> anyhow::Result<BaseConsumer<SinkContext>> {
    let k = &cfg.kafka;
    // librdkafka's share of the memory bound: its prefetch queue.
    let queued_kb = cfg.sink.kafka_buffer_bytes() / 1024;
    // Exactly-once seeks every partition to a start of its own (see
    // `sluice_protocol::resume`, where `auto_offset_reset` is applied). The
    // client falls back on its policy only when a position is out of range,
    // and then the beginning is the one place that skips nothing that
    // still exists.
    let reset = if cfg.sink.delivery.is_exactly_once() {
        "earliest"
    } else {
        k.auto_offset_reset.as_str()
    };
    let mut cc = k.client_config();
    cc.set("group.id", &k.group_id)
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
        .set("auto.offset.reset", reset)
        .set("queued.max.messages.kbytes", queued_kb.to_string())
        .set("enable.partition.eof", "false")
        .set("statistics.interval.ms", "10000");
    if let Some(id) = &k.instance_id {
        cc.set("group.instance.id", id);
    }
    // A route's topic created after the start (or whose metadata the broker
    // had not yet spread) is read once a metadata refresh shows it:
    // librdkafka's default waits 5 minutes for that. Fetches: see
    // `FETCH_DEFAULTS`.
    for (key, value) in FETCH_DEFAULTS {
        if !k.properties.contains_key(key) {
            cc.set(key, value);
        }
    }
    // Named after the register's owner id, so `sluice status` names the
    // same process whichever it reads.
    if !k.properties.contains_key("client.id") {
        cc.set("client.id", client_id(me));
    }
    cc.create_with_context(SinkContext {
        sink: Mutex::new(sink),
    })
    .with_context(|| format!("creating the Kafka consumer for {}", k.brokers))
}

fn lock(consumer: &BaseConsumer<SinkContext>) -> std::sync::MutexGuard<'_, Sink> {
    consumer
        .context()
        .sink
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn poll_loop(
    consumer: BaseConsumer<SinkContext>,
    cfg: &Config,
    targets: Option<HashMap<Key, i64>>,
    stopping: CancellationToken,
) -> anyhow::Result<Ended> {
    let (commit_interval, progress_every) = (cfg.sink.commit_interval, cfg.sink.progress_interval);
    let mut last_stats = Stats::default();
    let mut last_commit = Instant::now();
    let mut last_recommit = Instant::now();
    let mut last_sweep = Instant::now();
    let mut last_report = Instant::now();
    let mut last_events = Instant::now();
    let mut errors = ConsumerErrors::default();
    let mut kafka_failed = false;
    let mut ended = Ended::Stopped;
    {
        let mut s = lock(&consumer);
        edge::drain_events(&consumer, &mut s);
        s.apply_backpressure();
        edge::run(&consumer, &mut s);
    }
    loop {
        let msg = consumer.poll(Duration::from_millis(50));
        let now = Instant::now();
        // One lock per record; completions, backpressure and a stop request
        // are looked at every millisecond, not every record.
        let mut s = lock(&consumer);
        match msg {
            Some(Ok(m)) => {
                s.on_record(&edge::record_of(&m), now);
                edge::run(&consumer, &mut s);
            }
            Some(Err(e)) => match fatal_cause(&e, consumer.client().fatal_error()) {
                Some(cause) => {
                    let group = &cfg.kafka.group_id;
                    s.fail(anyhow!(
                        "the Kafka consumer of group {group:?} cannot go on: {cause}; sluice stops"
                    ));
                    kafka_failed = true;
                }
                None => errors.note(&e, now),
            },
            None => {}
        }
        if now.duration_since(last_events) >= Duration::from_millis(1) {
            last_events = now;
            edge::drain_events(&consumer, &mut s);
            s.apply_backpressure();
            edge::run(&consumer, &mut s);
            if stopping.is_cancelled() {
                break;
            }
        }
        if s.failed() {
            break;
        }
        if now.duration_since(last_sweep) >= Duration::from_millis(20) {
            last_sweep = now;
            s.cut_due(now, false);
            edge::run(&consumer, &mut s);
        }
        if now.duration_since(last_commit) >= commit_interval {
            last_commit = now;
            if now.duration_since(last_recommit) >= RECOMMIT_EVERY {
                last_recommit = now;
                s.recommit();
            }
            s.commit(None, false);
            edge::run(&consumer, &mut s);
            s.expire_leaving();
            s.report_progress(unix_ms());
            if let Some(t) = &targets {
                let positions = edge::positions(&consumer, &s);
                if s.caught_up(&positions, t, &group_committed(&consumer, &cfg.routes, t)) {
                    tracing::info!("caught up with the high watermarks seen at start: stopping");
                    ended = Ended::CaughtUp;
                    break;
                }
            }
        }
        if progress_every.is_some_and(|every| now.duration_since(last_report) >= every) {
            s.log_progress(&last_stats, now.duration_since(last_report).as_secs_f64());
            (last_report, last_stats) = (now, s.stats());
        }
    }
    // Graceful stop: flush, drain, commit, mark the hand-off clean, then
    // leave the group.
    let fatal = edge::stop(&consumer, &mut lock(&consumer), kafka_failed);
    consumer.unsubscribe();
    drop(consumer);
    match fatal {
        Some(e) => Err(e),
        None => Ok(ended),
    }
}

/// The group's committed offsets of the partitions of `targets` (empty if
/// the broker does not answer in time: the next turn asks again).
fn group_committed(
    consumer: &BaseConsumer<SinkContext>,
    routes: &[Route],
    targets: &HashMap<Key, i64>,
) -> HashMap<Key, i64> {
    let mut tpl = rdkafka::TopicPartitionList::new();
    for (ri, p) in targets.keys() {
        tpl.add_partition(&routes[*ri].topic, *p);
    }
    let Ok(answer) = consumer.committed_offsets(tpl, Duration::from_secs(5)) else {
        return HashMap::new();
    };
    answer
        .elements()
        .iter()
        .filter_map(|e| {
            let ri = routes.iter().position(|r| r.topic == e.topic())?;
            match e.offset() {
                rdkafka::Offset::Offset(o) => Some(((ri, e.partition()), o)),
                _ => None,
            }
        })
        .collect()
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Errors no retry of librdkafka's can fix: the client is refused, or its
/// group cannot have it. librdkafka keeps retrying them (and reports each
/// try), so the process would idle for ever with `/ready` at 200.
const UNUSABLE: &[RDKafkaErrorCode] = &[
    RDKafkaErrorCode::Fatal,
    RDKafkaErrorCode::FencedInstanceId,
    RDKafkaErrorCode::Authentication,
    RDKafkaErrorCode::SaslAuthenticationFailed,
    RDKafkaErrorCode::TopicAuthorizationFailed,
    RDKafkaErrorCode::GroupAuthorizationFailed,
    RDKafkaErrorCode::ClusterAuthorizationFailed,
    RDKafkaErrorCode::InvalidGroupId,
    RDKafkaErrorCode::InconsistentGroupProtocol,
    RDKafkaErrorCode::InvalidSessionTimeout,
    RDKafkaErrorCode::GroupMaxSizeReached,
];

/// Why the consumer cannot go on, if `e` (with the client's fatal error,
/// `rd_kafka_fatal_error`) says so: librdkafka's fatal errors and
/// [`UNUSABLE`]. Anything else is transient: librdkafka recovers from it.
fn fatal_cause(e: &KafkaError, fatal: Option<(RDKafkaErrorCode, String)>) -> Option<String> {
    if let Some((code, reason)) = fatal {
        return Some(format!("{code:?}: {reason}"));
    }
    let code = e.rdkafka_error_code()?;
    (matches!(e, KafkaError::MessageConsumptionFatal(_)) || UNUSABLE.contains(&code))
        .then(|| format!("{code:?}: {e}"))
}

/// Transient consumer errors, logged at most once per error code every
/// [`ConsumerErrors::EVERY`], with the count of those not logged since.
#[derive(Default)]
struct ConsumerErrors {
    /// `(code, last logged, not logged since)`.
    seen: Vec<(Option<RDKafkaErrorCode>, Instant, u64)>,
}

impl ConsumerErrors {
    const EVERY: Duration = Duration::from_secs(10);

    fn note(&mut self, e: &KafkaError, now: Instant) {
        let code = e.rdkafka_error_code();
        match self.seen.iter_mut().find(|(c, _, _)| *c == code) {
            Some((_, last, quiet)) if now.duration_since(*last) < Self::EVERY => *quiet += 1,
            Some((_, last, quiet)) => {
                tracing::warn!(error = %e, repeats = *quiet, "Kafka consumer error; librdkafka retries it");
                (*last, *quiet) = (now, 0);
            }
            None => {
                tracing::warn!(error = %e, "Kafka consumer error; librdkafka retries it");
                self.seen.push((code, now, 0));
            }
        }
    }
}

/// Reads the server's clock every [`CLOCK_REREAD`] until `stop`: a clock
/// that stepped or drifted is seen within that, not only at the next fence
/// or late answer, and every later deadline follows it.
async fn reread_clock(ch: ClickHouse, lease: Lease, stop: CancellationToken) {
    let mut every = tokio::time::interval(CLOCK_REREAD);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.cancelled() => return,
        }
        match ch.server_now(false).await {
            Ok(_) => {
                lease.follow_clock(ch.clock_jumps());
            }
            Err(e) => tracing::debug!(error = %e, "cannot read ClickHouse's clock; will try again"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fatal_errors_stop_and_transient_ones_do_not() {
        let fenced = KafkaError::MessageConsumption(RDKafkaErrorCode::FencedInstanceId);
        assert!(fatal_cause(&fenced, None).is_some_and(|c| c.contains("FencedInstanceId")));
        // librdkafka's own fatal error: its underlying cause is named.
        let fatal = KafkaError::MessageConsumptionFatal(RDKafkaErrorCode::Fatal);
        let cause = fatal_cause(
            &fatal,
            Some((
                RDKafkaErrorCode::FencedInstanceId,
                "fenced by another consumer".into(),
            )),
        );
        assert_eq!(
            cause.as_deref(),
            Some("FencedInstanceId: fenced by another consumer")
        );
        for code in [
            RDKafkaErrorCode::Authentication,
            RDKafkaErrorCode::GroupAuthorizationFailed,
            RDKafkaErrorCode::InvalidGroupId,
        ] {
            assert!(fatal_cause(&KafkaError::MessageConsumption(code), None).is_some());
        }
        for code in [
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::NotCoordinator,
            RDKafkaErrorCode::RequestTimedOut,
        ] {
            assert_eq!(
                fatal_cause(&KafkaError::MessageConsumption(code), None),
                None
            );
        }
    }

    #[test]
    fn transient_errors_are_logged_once_per_interval() {
        let mut log = ConsumerErrors::default();
        let t0 = Instant::now();
        let e = KafkaError::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure);
        for i in 0..100 {
            log.note(&e, t0 + Duration::from_millis(i * 10));
        }
        assert_eq!(log.seen.len(), 1);
        assert_eq!(log.seen[0].2, 99);
        log.note(&e, t0 + Duration::from_secs(11));
        assert_eq!(
            (log.seen[0].1, log.seen[0].2),
            (t0 + Duration::from_secs(11), 0)
        );
    }
}
