//! The sink's state on the consumer thread: partitions, batches, completions
//! and commits. Only the consumer thread touches it (rebalance callbacks
//! included, through the consumer's context).
//!
//! Records in ([`Sink::on_record`]: [`record`] decides what becomes of each,
//! [`Sink`] counts it) → per-partition [`BatchBuilder`]s → due batches
//! sent as insert tasks ([`Sink::cut`]) → [`Event`]s back from the tasks
//! ([`Sink::on_event`]) → each partition's [`AckTracker`] → the durable
//! frontier, committed to Kafka ([`Sink::commit`]). Partitions come, go and
//! are taken over in [`handoff`].
//!
//! The partitions this process holds live in the protocol's [`Machine`],
//! one generation of each at a time, each a [`Held`]: the protocol's
//! [`Partition`] (position, batch being built, acks, commits, phase) and
//! the sink's [`Side`] (abandon token, DLQ letters, registry values,
//! stall, pause). The machine decides what spans partitions and
//! generations (which generation a slice's end or a commit counts for,
//! what a revocation, a taking or a stop does to each, what to commit);
//! its [`Act`]s are carried out by [`Sink::carry_out`].
//!
//! The state does no I/O at all: it calls neither the Kafka consumer nor
//! ClickHouse nor the registry, and starts no task. What it decides the
//! world should do is queued as [`Action`]s, which the consumer thread
//! carries out after each call ([`super::edge`]); the answers come back as
//! calls ([`Sink::on_seek`], [`Sink::on_committed`]) or [`Event`]s
//! ([`Sink::on_event`]). A record that needs an answer first (the schema
//! its id names, [`Schemas`]; its table's columns read again,
//! [`TableColumns`]) holds its partition back ([`Stall`]): the state asks
//! for the answer ([`Action::FetchSchema`], [`Action::RereadColumns`]),
//! the partition is paused, and once the answer is in it is sought back to
//! that record, which is read again.
//!
//! Memory: builders plus in-flight batches stay under their share of
//! `max_buffered_bytes` (the rest is librdkafka's); over it, every partition
//! is paused (the consumer keeps polling, so the group does not evict it)
//! until half of it is free.
//!
//! [`BatchBuilder`]: sluice_protocol::BatchBuilder
//! [`AckTracker`]: sluice_protocol::AckTracker

mod handoff;
mod record;
#[cfg(test)]
mod tests;

use super::action::{Action, AfterSeek};
use super::columns::{Fields, TableColumns};
use super::dlq::Letter;
use super::event::{Completion, Event, Outcome, Settled};
use super::fates::Fates;
use super::schemas::{Decoded, Originals, Schemas};
use super::writer::{Job, Slice, WriterCtx};
use crate::config::{Config, Route};
use crate::owners::{Key, Owners};
use crate::registry::Registry;
use crate::telemetry::{self, TopicCounters};
use anyhow::anyhow;
pub(super) use record::Record;
use record::{Fate, Value};
use sluice_formats::RowError;
use sluice_protocol::cut::{Load, RouteCut};
use sluice_protocol::dedup::{KeyHash, KeyWindow};
use sluice_protocol::machine::{Act, Held, Machine};
use sluice_protocol::partition::{Partition, Phase};
use sluice_protocol::resume::{Mismatch, MISMATCH_MARK};
use sluice_protocol::{Batch, NextOffset, Offset, PartitionId, Row};
use std::collections::{HashMap, VecDeque};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

/// How soon a partition whose seek back to a stalled record failed tries
/// again.
const STALL_RETRY: Duration = Duration::from_millis(500);

/// A batch is cut once it accounts for this many DLQ writes.
const MAX_LETTERS_PER_BATCH: usize = 10_000;

/// Where a partition waits (paused) for what the record at `at` needs
/// before it can be judged; it is read again once that is known.
#[derive(Debug, Clone, Copy)]
struct Stall {
    at: Offset,
    wait: Wait,
    /// When to try seeking back again, after a seek failed.
    retry_at: Option<Instant>,
}

/// What a stalled partition waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// The decoder of this schema id ([`Action::FetchSchema`]).
    Schema(u32),
    /// Its route's table's columns, read again ([`Action::RereadColumns`]).
    Columns,
}

/// A partition this process holds, in one generation: the protocol's
/// [`Held`] (its [`Partition`] and when it went active), with what only
/// the binary keeps beside it ([`Side`]).
type Part = Held<Instant, KeyWindow, Side>;

/// What the binary keeps beside a partition's protocol state: the
/// machine's `extra` ([`Machine`]). Cloned only if the machine's handle on
/// it were shared, which it never is.
#[derive(Clone)]
struct Side {
    /// Cancelled when this generation is abandoned ([`Act::Abandon`]):
    /// its rows in flight leave their batches.
    abandon: CancellationToken,
    /// Paused by backpressure (preparing partitions are always paused).
    paused: bool,
    /// DLQ writes for records of the batch being built.
    letters: Vec<Letter>,
    /// The memory `letters` hold.
    letter_bytes: usize,
    /// What became of this activation's rows, for conditional rows.
    fates: Arc<Fates>,
    /// Waiting (paused) for the schema of a record, or its table's
    /// columns ([`Sink::on_record`]).
    stalled: Option<Stall>,
    /// The record the table's columns were just read again for: they judge
    /// it as they are ([`Sink::on_record`]).
    reread_for: Option<Offset>,
    /// The values of the batch being built, on a registry route.
    originals: Originals,
    /// The Kafka timestamp (ms) of the first record of the batch being built.
    building_since: Option<i64>,
    /// Each cut batch's end and the Kafka timestamp of its first record,
    /// until the durable frontier passes it: how long records have waited.
    cut_since: VecDeque<(NextOffset, Option<i64>)>,
}

impl Side {
    fn new(phase: Phase) -> Self {
        Self {
            abandon: CancellationToken::new(),
            paused: phase == Phase::Preparing,
            letters: Vec::new(),
            letter_bytes: 0,
            fates: Arc::default(),
            stalled: None,
            reread_for: None,
            originals: Originals::default(),
            building_since: None,
            cut_since: VecDeque::new(),
        }
    }
}

/// What `part`'s batch being built holds.
fn load(part: &Part) -> Load {
    Load {
        rows: part.core.builder().rows(),
        bytes: part.core.builder().bytes(),
        letters: part.extra.letters.len(),
    }
}

/// Whether `part` has something built to send.
fn building(part: &Part) -> bool {
    !part.core.builder().is_empty()
}

/// The Kafka timestamp (ms) of `part`'s oldest record read and not yet
/// durable, if it has one.
fn oldest_pending(part: &mut Part) -> Option<i64> {
    let frontier = part.core.frontier()?;
    let side = &mut part.extra;
    while side
        .cut_since
        .front()
        .is_some_and(|(end, _)| *end <= frontier)
    {
        side.cut_since.pop_front();
    }
    side.cut_since
        .iter()
        .find_map(|(_, ts)| *ts)
        .or(side.building_since)
}

/// The sink's counts since it started, for the progress and stop lines.
#[derive(Default, Debug, Clone, Copy)]
pub(super) struct Stats {
    pub(crate) records: u64,
    pub(crate) rows_inserted: u64,
    pub(crate) batches: u64,
    /// Records dropped because their key was written within the window.
    pub(crate) dedup_dropped: u64,
    /// Records of a dedup route without a usable key (kept).
    pub(crate) dedup_keyless: u64,
    /// Records the client delivered a second time (ignored).
    pub(crate) redelivered: u64,
    /// Records this process wrote to the DLQ, acknowledged.
    pub(crate) dlq: u64,
}

/// All state of the sink; lives in the consumer context so rebalance
/// callbacks can reach it.
pub(super) struct Sink {
    cfg: Config,
    routes: Vec<Arc<Route>>,
    /// Per-route metrics, indexed like `routes`: bumped with [`Stats`], in
    /// [`Sink::note`] and [`Sink::on_completion`] only.
    counters: Vec<TopicCounters>,
    stats: Stats,
    /// The partitions this process holds, one generation of each at a
    /// time: preparing, active, or revoked (exactly-once) and leaving
    /// while their inserts finish ([`Sink::on_revoke`]); with how often
    /// each was taken by another owner ([`Sink::on_taken`]). The
    /// protocol's [`Machine`] decides; [`Sink::carry_out`] does its acts.
    parts: Machine<Key, Instant, KeyWindow, Side>,
    /// Per route, indexed like `routes`: what its partitions' batches being
    /// built hold, and so when the route's batch is cut.
    building: Vec<RouteCut<Instant>>,
    ctx: Arc<WriterCtx>,
    /// The runtime the edge runs the sink's tasks on; the state starts none.
    handle: Handle,
    tx: mpsc::Sender<Event>,
    rx: mpsc::Receiver<Event>,
    in_flight_bytes: usize,
    in_flight: usize,
    next_generation: u64,
    overloaded: bool,
    /// Why the sink stops, once it must.
    fatal: Option<anyhow::Error>,
    stopping: CancellationToken,
    /// The register of owners, and this process's id in it.
    owners: Owners,
    me: u64,
    /// The registry routes' decoders, by schema id.
    schemas: Schemas,
    /// The tables' columns, on routes that refuse fields their table lacks.
    columns: TableColumns,
    /// The registry's client, for the edge's fetches ([`Action::FetchSchema`]).
    registry: Option<Registry>,
    /// A registry route's decoded row, before the encoder takes it.
    decoded: Vec<u8>,
    /// The group has answered with an assignment (perhaps an empty one).
    assigned: bool,
    /// What the world is to do, in order ([`Sink::next_action`]).
    out: VecDeque<Action>,
}

/// What a route's records are read and checked with besides its encoder:
/// the registry's schemas, the tables' columns, and the registry's client
/// the edge fetches schemas with.
pub(super) struct RowChecks {
    pub(crate) schemas: Schemas,
    pub(crate) columns: TableColumns,
    pub(crate) registry: Option<Registry>,
}

impl Sink {
    /// A sink with no partitions yet, on the current tokio runtime. Tasks
    /// report to it through [`Sink::events`].
    pub(crate) fn new(
        cfg: Config,
        routes: Vec<Arc<Route>>,
        ctx: Arc<WriterCtx>,
        owners: Owners,
        me: u64,
        stopping: CancellationToken,
        checks: RowChecks,
    ) -> Self {
        let RowChecks {
            schemas,
            columns,
            registry,
        } = checks;
        let (tx, rx) = mpsc::channel();
        Self {
            building: vec![RouteCut::default(); routes.len()],
            counters: routes
                .iter()
                .map(|r| TopicCounters::new(&r.topic))
                .collect(),
            cfg,
            routes,
            stats: Stats::default(),
            parts: Machine::new(),
            ctx,
            handle: Handle::current(),
            tx,
            rx,
            in_flight_bytes: 0,
            in_flight: 0,
            next_generation: 0,
            overloaded: false,
            fatal: None,
            stopping,
            owners,
            me,
            schemas,
            columns,
            registry,
            decoded: Vec::new(),
            assigned: false,
            out: VecDeque::new(),
        }
    }

    /// Where tasks report to this sink.
    pub(crate) fn events(&self) -> mpsc::Sender<Event> {
        self.tx.clone()
    }

    /// The next thing the world is to do for this sink, in the order the
    /// sink decided them.
    pub(crate) fn next_action(&mut self) -> Option<Action> {
        self.out.pop_front()
    }

    /// A report of a task, if one is waiting (or within `wait`).
    pub(crate) fn next_event(&self, wait: Duration) -> Option<Event> {
        if wait.is_zero() {
            return self.rx.try_recv().ok();
        }
        self.rx.recv_timeout(wait).ok()
    }

    /// The runtime the sink's tasks run on.
    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// What insert tasks share.
    pub(crate) fn writer_ctx(&self) -> Arc<WriterCtx> {
        self.ctx.clone()
    }

    /// The register of owners.
    pub(crate) fn owners(&self) -> &Owners {
        &self.owners
    }

    /// The token cancelled when the sink stops.
    pub(crate) fn stopping(&self) -> &CancellationToken {
        &self.stopping
    }

    /// The topic of route `ri`.
    pub(crate) fn topic(&self, ri: usize) -> &str {
        &self.routes[ri].topic
    }

    /// Route `ri`.
    pub(crate) fn route(&self, ri: usize) -> &Arc<Route> {
        &self.routes[ri]
    }

    /// The registry's client, if a route reads the registry's wire format.
    pub(crate) fn registry(&self) -> Option<&Registry> {
        self.registry.as_ref()
    }

    /// How long a stop or a revocation (at least once) waits for inserts.
    pub(crate) fn drain_timeout(&self) -> Duration {
        self.cfg.clickhouse.insert_timeout * 3
    }

    pub(crate) fn stats(&self) -> Stats {
        self.stats
    }

    /// Stops the sink with `e`, unless it is stopping for an earlier reason.
    pub(crate) fn fail(&mut self, e: anyhow::Error) {
        self.fatal.get_or_insert(e);
    }

    pub(crate) fn failed(&self) -> bool {
        self.fatal.is_some()
    }

    /// Logs the progress line: the counts, and the rate since `last`, `secs` ago.
    pub(crate) fn log_progress(&self, last: &Stats, secs: f64) {
        let st = self.stats;
        tracing::info!(
            records = st.records,
            records_per_sec = ((st.records - last.records) as f64 / secs.max(1e-3)).round(),
            rows_inserted = st.rows_inserted,
            batches = st.batches,
            dlq = st.dlq,
            dedup_dropped = st.dedup_dropped,
            dedup_keyless = st.dedup_keyless,
            redelivered = st.redelivered,
            in_flight = self.in_flight,
            in_flight_mb = self.in_flight_bytes / (1 << 20),
            partitions = self
                .parts
                .iter()
                .filter(|(_, p)| p.core.phase() == Phase::Active)
                .count(),
            "progress"
        );
    }

    pub(crate) fn route_of(&self, topic: &str) -> Option<usize> {
        self.routes.iter().position(|r| r.topic == topic)
    }

    /// The protocol state of a new generation of partition `partition`
    /// of route `ri`.
    fn new_core(&mut self, ri: usize, partition: i32, phase: Phase) -> Partition<Instant> {
        self.next_generation += 1;
        let id = PartitionId {
            topic: self.routes[ri].topic.clone(),
            partition,
        };
        Partition::new(id, self.cfg.sink.limits, self.next_generation, phase)
    }

    /// Takes one record into its partition's batch ([`record`]), counts
    /// what became of it, and cuts the batch when it is due. On a registry
    /// route the record is decoded first; if its schema id is not known
    /// yet, the partition waits for it ([`Action::FetchSchema`]; paused by
    /// [`Sink::apply_backpressure`]) and the record is read again once the
    /// answer is in ([`Sink::resume_stalled`]). A record whose fields its
    /// table's columns must be read again to judge waits the same way
    /// ([`Action::RereadColumns`]).
    pub(crate) fn on_record(&mut self, rec: &Record, now: Instant) {
        let Some(ri) = self.route_of(rec.topic) else {
            return;
        };
        let key = (ri, rec.partition);
        let Some(part) = self.parts.get_mut(&key) else {
            return;
        };
        // A record this partition does not take now (paused, or read
        // again below its position) is neither decoded nor checked.
        if let Some(fate) = record::admit(part, rec) {
            self.note(ri, rec, fate);
            return;
        }
        let value = if !self.schemas.is_registry(ri) {
            Value::Json
        } else {
            match self.schemas.decode(ri, rec.payload, &mut self.decoded, now) {
                Decoded::Row => Value::Decoded(&self.decoded),
                Decoded::Refused(e) => Value::Refused(e),
                Decoded::Missing(id) => {
                    part.extra.stalled = Some(Stall {
                        at: rec.offset,
                        wait: Wait::Schema(id),
                        retry_at: None,
                    });
                    tracing::info!(record = %rec, schema_id = id, "fetching the schema; the partition waits");
                    if self.schemas.want(ri, id) {
                        self.out.push_back(Action::FetchSchema { route: ri, id });
                    }
                    return;
                }
            }
        };
        // Below `check_through` a record may be stored already (the
        // writer finds out): only ClickHouse judges its fields, on the rows
        // it still has to take. Refusing it here could send a stored row
        // to the DLQ, after a column was dropped.
        let row = match &value {
            _ if part.core.may_be_stored(rec.offset) => None,
            Value::Json => rec.payload,
            Value::Decoded(row) => Some(*row),
            Value::Refused(_) => None,
        };
        let may_reread = part.extra.reread_for.take() != Some(rec.offset);
        let fields = row.map_or(Fields::Fit, |row| {
            self.columns.extra_field(ri, row, now, may_reread)
        });
        let value = match fields {
            Fields::Fit => value,
            Fields::Extra(field) => Value::Refused(RowError::ExtraField(field)),
            Fields::Reread => {
                part.extra.stalled = Some(Stall {
                    at: rec.offset,
                    wait: Wait::Columns,
                    retry_at: None,
                });
                tracing::debug!(record = %rec, "reading the table's columns again; the partition waits");
                if self.columns.want(ri) {
                    self.out.push_back(Action::RereadColumns { route: ri });
                }
                return;
            }
        };
        let held = load(part);
        let fate = record::take(
            part,
            &self.ctx.encoders[ri],
            rec,
            value,
            self.ctx.dlq.is_some(),
            now,
        );
        if part.extra.building_since.is_none() && building(part) {
            part.extra.building_since = rec.timestamp;
        }
        if building(part) {
            self.building[ri].grow(load(part).beyond(held), now);
        }
        let aligned = self.cfg.sink.limits.aligned;
        let due = if aligned {
            part.core.builder().is_due(now) || part.extra.letters.len() >= MAX_LETTERS_PER_BATCH
        } else {
            self.route_due(ri, now)
        };
        if self.decoded.capacity() > 4 << 20 {
            self.decoded = Vec::new();
        }
        if self.note(ri, rec, fate) && due {
            if aligned {
                self.cut(ri, &[key]);
            } else {
                self.cut_route(ri);
            }
        }
    }

    /// Whether route `ri`'s batch is due ([`RouteCut::is_due`]).
    fn route_due(&self, ri: usize, now: Instant) -> bool {
        self.building[ri].is_due(&self.cfg.sink.limits, MAX_LETTERS_PER_BATCH, now)
    }

    /// Counts what became of a record, in the stats and the metrics; the
    /// one place a record's fate is counted. False when the sink must stop.
    fn note(&mut self, ri: usize, rec: &Record, fate: Fate) -> bool {
        let bytes = rec.payload.map_or(0, <[u8]>::len);
        let counters = &self.counters[ri];
        match fate {
            Fate::Ignored => return true,
            Fate::Redelivered { expected } => {
                self.stats.redelivered += 1;
                counters.redelivered();
                tracing::warn!(
                    record = %rec,
                    expected = expected.map(|p| p.0),
                    "ignored a record the client delivered a second time"
                );
                return true;
            }
            _ => {}
        }
        self.stats.records += 1;
        counters.record_read(bytes);
        match fate {
            Fate::Row { keyless } => self.stats.dedup_keyless += u64::from(keyless),
            Fate::Dropped => {
                self.stats.dedup_dropped += 1;
                counters.dedup_dropped(1);
                tracing::debug!(record = %rec, "dropped: its key was written within the dedup window");
            }
            Fate::Refused {
                error,
                queued: true,
            } => {
                tracing::debug!(record = %rec, error = %error, "for the DLQ");
            }
            Fate::Refused {
                error,
                queued: false,
            } => {
                self.fail(anyhow!(
                    "record {rec} cannot become a row: {error}. \
                     sluice stops rather than skip it; set [dlq] topic to send such records there"
                ));
                return false;
            }
            Fate::Ignored | Fate::Redelivered { .. } => {}
        }
        true
    }

    /// Sends every due batch (every non-empty one with `all`): per route,
    /// or per partition where batches must end on aligned offsets
    /// (token-only, so that a replay forms the same batches).
    pub(crate) fn cut_due(&mut self, now: Instant, all: bool) {
        if self.cfg.sink.limits.aligned {
            let due: Vec<Key> = self
                .parts
                .iter()
                .filter(|(_, p)| building(p) && (all || p.core.builder().is_due(now)))
                .map(|(k, _)| *k)
                .collect();
            for key in due {
                self.cut(key.0, &[key]);
            }
            return;
        }
        for ri in 0..self.routes.len() {
            if (all && self.building[ri].pending()) || self.route_due(ri, now) {
                self.cut_route(ri);
            }
        }
    }

    /// Cuts one batch of every partition of route `ri` with something built.
    fn cut_route(&mut self, ri: usize) {
        let mut keys: Vec<Key> = self
            .parts
            .iter()
            .filter(|(k, p)| k.0 == ri && building(p))
            .map(|(k, _)| *k)
            .collect();
        keys.sort_unstable();
        self.cut(ri, &keys);
        self.building[ri].cut();
    }

    /// Sends what `keys` (partitions of route `ri`, ascending) have built as
    /// one insert task: one batch, a slice per partition.
    fn cut(&mut self, ri: usize, keys: &[Key]) {
        let mut pieces = Vec::with_capacity(keys.len());
        let mut slices = Vec::with_capacity(keys.len());
        let (mut uncertain, mut bytes) = (false, 0);
        for key in keys {
            let Some(part) = self.parts.get_mut(key) else {
                continue;
            };
            let since = part.extra.building_since.take();
            let Some(cut) = part.core.cut() else {
                // A record taken gives its partition acks first.
                debug_assert!(!building(part), "built without acks");
                continue;
            };
            let batch = cut.batch;
            uncertain |= cut.uncertain;
            let generation = part.core.generation();
            let side = &mut part.extra;
            side.cut_since.push_back((cut.end, since));
            let letters = std::mem::take(&mut side.letters);
            let originals = std::mem::take(&mut side.originals);
            self.building[ri].shrink(Load {
                rows: batch.len(),
                bytes: batch.bytes(),
                letters: letters.len(),
            });
            bytes += batch.bytes() + std::mem::take(&mut side.letter_bytes) + originals.bytes();
            slices.push(Slice {
                partition: key.1,
                ticket: cut.ticket,
                generation,
                abandon: side.abandon.clone(),
                letters,
                conditional: cut.conditional,
                fates: side.fates.clone(),
                originals,
            });
            pieces.push(batch);
        }
        if pieces.is_empty() {
            return;
        }
        self.in_flight_bytes += bytes;
        telemetry::in_flight_bytes(self.in_flight_bytes);
        self.in_flight += 1;
        self.stats.batches += 1;
        let job = Job {
            route: self.routes[ri].clone(),
            route_idx: ri,
            batch: Batch::concat(pieces),
            uncertain,
            bytes,
            slices,
        };
        self.out.push_back(Action::Insert(Box::new(job)));
    }

    /// Sends back to their records the partitions waiting for a schema
    /// or columns that are now known ([`Sink::resume_stalled`]).
    pub(crate) fn unstall(&mut self) {
        if self.parts.iter().any(|(_, p)| p.extra.stalled.is_some()) {
            self.resume_stalled();
        }
    }

    /// Acts on what a task reported.
    pub(crate) fn on_event(&mut self, e: Event) {
        match e {
            Event::Completion(c) => self.on_completion(c),
            Event::SliceDone(d) => {
                self.stats.dlq += d.dlq as u64;
                self.stats.dedup_dropped += d.excluded as u64;
                self.counters[d.route_idx].dedup_dropped(d.excluded as u64);
                self.on_slice(d.route_idx, &d.slice, &d.rejected);
            }
            Event::Prepared(p) => self.activate(p),
            Event::Taken {
                key,
                generation,
                by,
            } => self.on_taken(key, generation, by),
            Event::Schema { route, id, answer } => {
                self.schemas.fetched(route, id, answer, Instant::now());
                self.resume_stalled();
            }
            Event::Columns { route, answer } => {
                self.columns.answered(route, answer, Instant::now());
                self.resume_stalled();
            }
            Event::Mismatch(found) => self.on_mismatch(&found),
        }
    }

    /// Partitions whose offsets went back (`sluice_protocol::resume::check_log`):
    /// the sink stops naming each one. In exactly-once mode, those this
    /// process still holds in the generation that found it get the commit
    /// [`MISMATCH_MARK`], so that no later start reads them either once
    /// their logs have grown past the old offsets. No partition of that
    /// preparation was read.
    fn on_mismatch(&mut self, found: &[(Key, u64, Mismatch)]) {
        let mut keys = Vec::new();
        let mut named = Vec::new();
        for (key, generation, why) in found {
            let topic = &self.routes[key.0].topic;
            named.push(format!("partition {topic}[{}]: {why}", key.1));
            let held = self.parts.preparing(key, *generation);
            if *why != Mismatch::Marked && held && self.cfg.sink.delivery.is_exactly_once() {
                keys.push(*key);
            }
        }
        if keys.is_empty() {
            self.mismatch_marked(&named, None);
        } else {
            self.out.push_back(Action::MarkMismatch { keys, named });
        }
    }

    /// Stops the sink naming the partitions whose offsets went back;
    /// `marked`: whether their commit now holds [`MISMATCH_MARK`], if
    /// any was to.
    pub(crate) fn mismatch_marked(&mut self, named: &[String], marked: Option<Result<(), String>>) {
        let marked = match marked {
            None => "",
            Some(Ok(())) => " (marked in the group's commit)",
            Some(Err(e)) => {
                tracing::error!(error = %e, "cannot mark the partitions whose offsets went back");
                " (NOT marked: the group's commit could not be written; a later start may read on once the log has grown past the old offsets)"
            }
        };
        self.fail(anyhow!(
            "{}{marked}. The topic was deleted and created again, its log was truncated, or the \
             cluster was migrated: these offsets are not this log's records, and reading on would \
             skip records as stored. sluice stops; see docs/operations.md, \"A topic whose offsets went \
             back\", for the ways to go on",
            named.join("; ")
        ));
    }

    /// Seeks each partition waiting for a schema or columns that are now
    /// known back to the record that made it wait;
    /// [`Sink::apply_backpressure`] then resumes it. A failed seek is tried
    /// again half a second later.
    fn resume_stalled(&mut self) {
        let now = Instant::now();
        for (key, part) in self.parts.iter_mut() {
            let Some(stall) = part.extra.stalled.as_mut() else {
                continue;
            };
            let answered = match stall.wait {
                Wait::Columns => !self.columns.reading(key.0),
                Wait::Schema(id) => match self.schemas.settled(key.0, id, now) {
                    Some(answered) => answered,
                    // A refusal ran out while it waited: ask again.
                    None => {
                        if self.schemas.want(key.0, id) {
                            self.out.push_back(Action::FetchSchema { route: key.0, id });
                        }
                        continue;
                    }
                },
            };
            if !answered || stall.retry_at.is_some_and(|t| t > now) {
                continue;
            }
            // Not sought twice while the seek is on its way.
            stall.retry_at = Some(now + STALL_RETRY);
            self.out.push_back(Action::Seek {
                key: *key,
                offset: stall.at,
                then: AfterSeek::Unstall,
            });
        }
    }

    /// A seek asked for by [`Action::Seek`] ended (`Err`: why it failed).
    pub(crate) fn on_seek(&mut self, key: Key, then: AfterSeek, result: Result<(), String>) {
        match then {
            AfterSeek::Activate(p) => match result {
                Ok(()) => self.activated(p),
                Err(e) => {
                    tracing::warn!(partition = %self.name(key), attempt = p.attempts, error = %e, "seek failed; retrying");
                    self.retry_prepared(p);
                }
            },
            AfterSeek::Unstall => {
                let Some(part) = self.parts.get_mut(&key) else {
                    return;
                };
                match result {
                    Ok(()) => {
                        // Columns read again for this record judge it.
                        part.extra.reread_for = part
                            .extra
                            .stalled
                            .take()
                            .filter(|s| s.wait == Wait::Columns)
                            .map(|s| s.at);
                    }
                    Err(e) => {
                        tracing::warn!(partition = %part.core.builder().partition(), error = %e, "seek failed; retrying");
                        if let Some(stall) = part.extra.stalled.as_mut() {
                            stall.retry_at = Some(Instant::now() + STALL_RETRY);
                        }
                    }
                }
            }
        }
    }

    /// A batch's end: per slice, its partition's ticket is acknowledged
    /// if its rows are durable (and the partition still of the generation
    /// that cut it); a revoked partition whose last slice ended settles.
    fn on_completion(&mut self, c: Completion) {
        let Completion {
            route_idx: ri,
            bytes,
            dlq,
            outcome,
            slices,
        } = c;
        self.in_flight_bytes -= bytes;
        telemetry::in_flight_bytes(self.in_flight_bytes);
        self.in_flight -= 1;
        let rejected = match outcome {
            Outcome::Durable {
                inserted,
                rejected,
                excluded,
                stale_columns,
            } => {
                if stale_columns {
                    self.columns.stale(ri);
                }
                self.stats.rows_inserted += inserted as u64;
                self.stats.dlq += dlq as u64;
                self.stats.dedup_dropped += excluded as u64;
                self.counters[ri].dedup_dropped(excluded as u64);
                rejected
            }
            Outcome::Abandoned => Vec::new(),
            Outcome::DlqFailed(e) => {
                self.fail(anyhow::Error::new(e).context("sluice stops rather than skip a record"));
                Vec::new()
            }
            Outcome::Failed(e) => {
                let route = &self.routes[ri];
                let partitions: Vec<i32> = slices.iter().map(|s| s.partition).collect();
                self.fail(anyhow!(
                    "inserting into {}.{} (topic {:?}, partitions {partitions:?}) failed and cannot succeed by retrying: {e}",
                    route.database,
                    route.table,
                    route.topic,
                ));
                Vec::new()
            }
        };
        for slice in &slices {
            self.on_slice(ri, slice, &rejected);
        }
    }

    /// One partition's slice of a batch ended (of route `ri`; `rejected`:
    /// the batch's rejected rows, with their keys): if its rows are durable
    /// and the partition is still of the generation that cut it, its
    /// ticket is acknowledged and a rejected copy's key forgotten; a revoked
    /// partition whose last slice ended settles.
    fn on_slice(&mut self, ri: usize, slice: &Settled, rejected: &[(Row, Option<KeyHash>)]) {
        let key = (ri, slice.partition);
        // A rejected copy does not stand for its key any more.
        let rejected = rejected
            .iter()
            .filter(|r| r.0.partition == slice.partition)
            .filter_map(|(row, key)| Some(((*key)?, row.offset)));
        let Some(end) = self.parts.slice_done(
            &key,
            slice.generation,
            slice.ticket,
            &slice.copies,
            slice.durable,
            rejected,
        ) else {
            return;
        };
        if let (Some(below), Some(p)) = (end.below, self.parts.get_mut(&key)) {
            p.extra.fates.prune_below(below);
        }
        if end.leaving {
            self.settle_leaving(key);
        }
    }

    /// Whether batches (of `only`, or of any partition) are in flight.
    pub(crate) fn busy(&self, only: Option<&[Key]>) -> bool {
        match only {
            Some(keys) => keys
                .iter()
                .any(|k| self.parts.get(k).is_some_and(|p| p.core.in_flight() > 0)),
            None => self.in_flight > 0,
        }
    }

    /// Commits the durable frontier of `keys` (or of every partition that
    /// moved; [`Machine::to_commit`]), a revoked one's too while its
    /// batches land. In exactly-once mode only partitions under a live
    /// lease commit: one whose lease ran out may have a new owner.
    pub(crate) fn commit(&mut self, keys: Option<&[Key]>, sync: bool) {
        let offsets = self
            .parts
            .to_commit(keys, |key, generation| self.may_write(*key, generation));
        if !offsets.is_empty() {
            self.out.push_back(Action::Commit { offsets, sync });
        }
    }

    /// Every active partition commits its frontier again at the next
    /// commit, moved or not ([`Machine::recommit`]): a revoked owner's late
    /// commit or a coordinator's failover may have put the group's commit
    /// back.
    pub(crate) fn recommit(&mut self) {
        self.parts.recommit();
    }

    /// The group stored these positions (asked for by [`Action::Commit`]).
    pub(crate) fn on_committed(&mut self, offsets: &[(Key, u64, NextOffset)]) {
        for (key, generation, frontier) in offsets {
            self.parts.committed(key, *generation, *frontier);
        }
    }

    /// Whether every partition of `targets` (by route and partition) has
    /// everything before its target durable, once the group has answered
    /// this process. A partition it holds: nothing buffered or in flight,
    /// and read up to the target (by its frontier, the consumer's position,
    /// which moves past control records, or the group's commit when nothing
    /// was read). Any other partition: the group's commit (`committed`) has
    /// passed the target, whoever holds it; a process given nothing waits
    /// for the others, and takes over what they leave.
    pub(crate) fn caught_up(
        &self,
        positions: &HashMap<Key, i64>,
        targets: &HashMap<Key, i64>,
        committed: &HashMap<Key, i64>,
    ) -> bool {
        let leaving = self
            .parts
            .iter()
            .any(|(_, p)| p.core.phase() == Phase::Leaving);
        if !self.assigned || leaving {
            return false;
        }
        // At least once, a partition without a commit starts at its end:
        // nothing before the target is ever read.
        let starts_at_end = !self.cfg.sink.delivery.is_exactly_once()
            && self.cfg.kafka.auto_offset_reset == sluice_protocol::ResetPolicy::Latest;
        targets.iter().all(|(key, &target)| {
            let commit = committed.get(key).copied();
            let Some(part) = self.parts.get(key) else {
                return target == 0 || commit.is_some_and(|c| c >= target && c != MISMATCH_MARK.0);
            };
            let idle = part.core.phase() == Phase::Active
                && !building(part)
                && part.extra.letters.is_empty()
                && part.extra.stalled.is_none()
                && part.core.in_flight() == 0;
            let read = [
                part.core.frontier().map(|f| f.0),
                positions.get(key).copied(),
                commit,
            ]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(0);
            let never_read = part.core.frontier().is_none() && commit.is_none() && starts_at_end;
            idle && (read >= target || never_read)
        })
    }

    /// Where a partition this process holds, active, is durable up to.
    pub(crate) fn durable_through(&self, topic: &str, partition: i32) -> Option<i64> {
        let part = self.parts.get(&(self.route_of(topic)?, partition))?;
        (part.core.phase() == Phase::Active)
            .then(|| part.core.frontier().map(|f| f.0))
            .flatten()
    }

    /// Each held partition's committed offset and how long its oldest
    /// pending record has waited, for `/metrics`; `now_ms` is the Unix time.
    pub(crate) fn report_progress(&mut self, now_ms: i64) {
        for ((ri, p), part) in self.parts.iter_mut() {
            if part.core.phase() != Phase::Active {
                continue;
            }
            let waited = oldest_pending(part).map_or(0, |ts| (now_ms - ts).max(0) as u64);
            telemetry::partition_progress(
                &self.routes[*ri].topic,
                *p,
                part.core.last_committed().map(|c| c.0),
                std::time::Duration::from_millis(waited),
            );
        }
    }

    /// Whether this generation of `key` may insert and commit: always in
    /// at-least-once mode, under a live lease in exactly-once mode.
    fn may_write(&self, key: Key, generation: u64) -> bool {
        !self.cfg.sink.delivery.is_exactly_once() || self.ctx.lease.live(key, generation)
    }

    /// Pauses every partition while too much is buffered; preparing
    /// partitions stay paused regardless.
    pub(crate) fn apply_backpressure(&mut self) {
        let building: usize = self
            .parts
            .iter()
            .map(|(_, p)| {
                p.core.builder().bytes() + p.extra.letter_bytes + p.extra.originals.bytes()
            })
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
        let (mut pause, mut resume) = (Vec::new(), Vec::new());
        for (key, part) in self.parts.iter_mut() {
            // A revoked partition is the consumer's no more.
            if part.core.phase() == Phase::Leaving {
                continue;
            }
            let want = self.overloaded
                || part.core.phase() == Phase::Preparing
                || part.extra.stalled.is_some();
            if want != part.extra.paused {
                let list = if want { &mut pause } else { &mut resume };
                list.push(*key);
                part.extra.paused = want;
            }
        }
        if !pause.is_empty() {
            self.out.push_back(Action::Pause(pause));
        }
        if !resume.is_empty() {
            self.out.push_back(Action::Resume(resume));
        }
    }
}
