//! One batch → durable in ClickHouse, or abandoned, or a permanent error.
//!
//! In: a [`Job`]: an encoded batch of one route's rows from one or more of
//! its partitions, and per partition a [`Slice`] (its lease generation,
//! abandon token, DLQ writes and key dedup state). Out: a [`Completion`]
//! sent back to the driver, with a [`Settled`] per slice.
//!
//! Exactly-once: every attempt carries a deadline on the server's clock
//! after which the server refuses to start it: the earliest end of its
//! slices' leases. An attempt whose outcome is unknown (timeout, reset,
//! 5xx) makes the batch *uncertain*. Before the next attempt the writer
//! makes sure the earlier one can no longer commit (kill it, wait until the
//! server's clock is past its deadline and it is gone from the process
//! list), asks ClickHouse which rows of the batch (by partition and offset)
//! it holds, and inserts only the missing rows. It never re-sends blind and
//! never skips. No attempt starts unless every slice's partition is held
//! under a live lease ([`Lease`]). A partition given up while the batch is
//! in flight (`abandon`: taken, lost, or revoked with its lease run out)
//! leaves the batch: its rows are never sent again by this writer, an
//! attempt out that holds them is still answered or fenced before the rest
//! goes, and what it stored is the next owner's to find.
//!
//! At-least-once and token-only: the same bytes (token-only: with the same
//! token) are re-sent until one attempt succeeds.
//!
//! With a DLQ, a row ClickHouse rejects (a permanent error naming the row,
//! `(at row N)`: a wrong type, an unparsable date) goes to the DLQ and the
//! rest of the batch is tried again (exactly-once: after reconciling). Every
//! insert is parsed in one stream (`input_format_parallel_parsing = 0`), so
//! the row number counts from the body's first row: in parallel, ClickHouse
//! counts from each segment's (ClickHouse #34203). The
//! batch is durable once its rows are stored and its DLQ writes are
//! acknowledged.
//!
//! A batch whose rows fall into more of the table's partitions than one
//! insert may create parts for (`max_partitions_per_insert_block`, code 252),
//! or whose body a proxy refuses as too large (413), is split: each insert takes half as many rows as the one refused, until
//! the server takes them, and the batch is durable once every share is
//! stored. The next batch of the route starts at twice the size that last
//! fitted, so a backfill pays at most one refusal per batch, and batches go
//! back to one insert once the rows spread less. Each share is an insert of its own (its own token and query id;
//! exactly-once reconciles the whole batch before a retry, as always), so
//! the parts one insert creates stay within the server's limit, whatever it
//! is set to.
//!
//! Key dedup: a row written while the copy of its key it duplicates was still
//! in flight is *conditional*; each attempt leaves it out once that copy is
//! covered ([`conditional_excluded`]), so one copy of the key lands even when
//! ClickHouse rejects another ([`Fates`]).

use super::body::Bodies;
use super::dlq::{self, Dlq, DlqError, Letter, Pending};
use super::event::{Completion, Event, Outcome, Settled, SliceDone};
use super::fates::Fates;
use super::lease::Lease;
use super::schemas::Originals;
use crate::ch::{
    deadline_passed, ChError, ChErrorKind, ClickHouse, InsertRequest, RowFormat, COLUMNS_CHANGED,
};
use crate::config::{Delivery, Route};
use crate::retry::Delays;
use crate::telemetry;
use sluice_formats::RowEncoder;
use sluice_protocol::acks::Ticket;
use sluice_protocol::attempt::{Answer, Unsettled, REFUSED_AT_START};
use sluice_protocol::dedup::KeyHash;
use sluice_protocol::delivery::{self, Durable, Next};
use sluice_protocol::token::{insert_token, query_id};
use sluice_protocol::{Batch, Offset, Row};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// What the writer needs from its surroundings.
pub(crate) struct WriterCtx {
    pub(crate) ch: ClickHouse,
    /// Per route: how an insert's rows are written.
    pub(crate) bodies: Bodies,
    pub(crate) lease: Lease,
    pub(crate) delivery: Delivery,
    pub(crate) permits: Semaphore,
    /// Where rows that cannot be stored go, if anywhere.
    pub(crate) dlq: Option<Dlq>,
    /// Per route: turns a rejected row back into its record value.
    pub(crate) encoders: Vec<RowEncoder>,
    /// Per route: the rows per insert that last fitted the server's
    /// partition limit (0: no split needed).
    pub(crate) per_insert: Vec<AtomicUsize>,
}

/// One batch of a route: rows of one or more of its partitions.
pub(crate) struct Job {
    pub(crate) route: Arc<Route>,
    pub(crate) route_idx: usize,
    pub(crate) batch: Batch,
    /// Some rows may already be stored: reconcile before the first attempt.
    pub(crate) uncertain: bool,
    /// The memory it holds (rows, letters, originals), counted as in flight.
    pub(crate) bytes: usize,
    /// Per partition of the batch, ascending.
    pub(crate) slices: Vec<Slice>,
}

/// A partition's share of a batch and what its rows answer to: its lease
/// (by generation), its abandon token, its DLQ writes and key dedup state.
pub(crate) struct Slice {
    pub(crate) partition: i32,
    pub(crate) ticket: Ticket,
    pub(crate) generation: u64,
    /// Cancelled when the partition is given up.
    pub(crate) abandon: CancellationToken,
    /// Records of it this batch accounts for that go to the DLQ.
    pub(crate) letters: Vec<Letter>,
    /// Key dedup: `(row, copy)`, ascending, for rows written on the
    /// condition that the copy of their key at `copy` is not stored.
    pub(crate) conditional: Vec<(Offset, Offset)>,
    /// What became of the partition's earlier rows.
    pub(crate) fates: Arc<Fates>,
    /// On a registry route, the records' own values, for the DLQ.
    pub(crate) originals: Originals,
}

/// A job's slices while it runs: which are still this process's to write
/// (not given up) and the DLQ writes each awaits.
struct Slices<'j> {
    job: &'j Job,
    given_up: Vec<bool>,
    /// Settled ahead of the rest, their completion sent ([`settle_early`]).
    early: Vec<bool>,
    letters: Vec<Vec<Pending>>,
}

impl<'j> Slices<'j> {
    fn new(job: &'j Job) -> Self {
        Self {
            job,
            given_up: vec![false; job.slices.len()],
            early: vec![false; job.slices.len()],
            letters: job.slices.iter().map(|_| Vec::new()).collect(),
        }
    }

    fn live(&self) -> impl Iterator<Item = &'j Slice> + '_ {
        let job = self.job;
        job.slices
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.given_up[*i] && !self.early[*i])
            .map(|(_, s)| s)
    }

    fn index(&self, partition: i32) -> Option<usize> {
        self.job
            .slices
            .iter()
            .position(|s| s.partition == partition)
    }

    /// The live slice of `partition`.
    fn of(&self, partition: i32) -> Option<&'j Slice> {
        let i = self.index(partition)?;
        (!self.given_up[i] && !self.early[i]).then(|| &self.job.slices[i])
    }

    /// Gives up the slice of `partition`: its rows leave `way`.
    fn give_up(&mut self, partition: i32, way: Option<&mut delivery::Delivery>) {
        if let Some(i) = self.index(partition) {
            if !self.given_up[i] {
                self.given_up[i] = true;
                self.letters[i].clear();
                tracing::info!(topic = %self.job.route.topic, partition, "partition given up; its rows leave the batch in flight");
            }
        }
        if let Some(way) = way {
            way.drop_partition(partition);
        }
    }

    /// Gives up every slice whose partition was given up; false once no
    /// slice is left.
    fn follow_abandon(&mut self, mut way: Option<&mut delivery::Delivery>) -> bool {
        let gone: Vec<i32> = self
            .live()
            .filter(|s| s.abandon.is_cancelled())
            .map(|s| s.partition)
            .collect();
        for p in gone {
            self.give_up(p, way.as_deref_mut());
        }
        self.live().next().is_some()
    }

    /// Resolves once some live slice's partition is given up.
    async fn any_abandoned(&self) {
        let waits: Vec<_> = self
            .live()
            .map(|s| Box::pin(s.abandon.cancelled()))
            .collect();
        if waits.is_empty() {
            return;
        }
        futures::future::select_all(waits).await;
    }
}

/// Delivers one batch; always returns a completion.
pub(crate) async fn deliver(mut job: Job, ctx: Arc<WriterCtx>, tx: Sender<Event>) -> Completion {
    let refused: Vec<Vec<Letter>> = job
        .slices
        .iter_mut()
        .map(|s| std::mem::take(&mut s.letters))
        .collect();
    let mut slices = Slices::new(&job);
    let mut outcome = None;
    for (i, letters) in refused.into_iter().enumerate() {
        match queue(&ctx, letters, &job.slices[i].abandon).await {
            Ok(Some(pending)) => slices.letters[i] = pending,
            Ok(None) => slices.give_up(job.slices[i].partition, None),
            Err(e) => {
                outcome = Some(Outcome::DlqFailed(e));
                break;
            }
        }
    }
    let mut outcome = match outcome {
        Some(o) => o,
        None => attempt_until_done(&job, &ctx, &mut slices, &tx).await,
    };
    let mut dlq = 0;
    match &outcome {
        Outcome::Durable { rejected, .. } => {
            for s in slices.live() {
                let mut rows = job.batch.rows_of(s.partition);
                let Some(first) = rows.next() else {
                    continue;
                };
                let last = rows.last().unwrap_or(first);
                let uncovered: Vec<Offset> = rejected
                    .iter()
                    .filter(|r| r.0.partition == s.partition)
                    .map(|r| r.0.offset)
                    .collect();
                s.fates.finish(first.offset, last.offset, &uncovered);
            }
        }
        Outcome::Failed(_) | Outcome::DlqFailed(_) => {
            for s in slices.live() {
                s.fates.fail();
            }
        }
        Outcome::Abandoned => {}
    }
    if let (Outcome::Durable { .. }, Some(d)) = (&outcome, &ctx.dlq) {
        for i in 0..job.slices.len() {
            if slices.given_up[i] || slices.early[i] {
                continue;
            }
            let letters = std::mem::take(&mut slices.letters[i]);
            let n = letters.len();
            match dlq::confirm(letters, d.topic(), &job.slices[i].abandon).await {
                Ok(true) => dlq += n,
                Ok(false) => slices.give_up(job.slices[i].partition, None),
                Err(e) => {
                    outcome = Outcome::DlqFailed(e);
                    break;
                }
            }
        }
    }
    let durable = matches!(outcome, Outcome::Durable { .. });
    let settled = job
        .slices
        .iter()
        .enumerate()
        .filter(|(i, _)| !slices.early[*i])
        .map(|(i, s)| settled(s, durable && !slices.given_up[i]))
        .collect();
    Completion {
        route_idx: job.route_idx,
        bytes: job.bytes,
        dlq,
        outcome,
        slices: settled,
    }
}

/// The end of slice `s`, its rows durable or not.
fn settled(s: &Slice, durable: bool) -> Settled {
    Settled {
        partition: s.partition,
        ticket: s.ticket,
        generation: s.generation,
        durable,
        copies: s.conditional.iter().map(|c| c.1).collect(),
    }
}

/// Ends the slices whose rows are settled while others' are still on
/// their way (a share of a split batch stored, or found stored by a
/// reconciliation): their DLQ writes confirmed, their fates published and
/// their completion sent, so that a partition revoked meanwhile settles
/// without waiting for the rest of the batch. They leave the batch: no
/// later attempt names them. When every slice is settled the batch is
/// durable and [`deliver`] ends them together.
async fn settle_early(
    job: &Job,
    ctx: &WriterCtx,
    slices: &mut Slices<'_>,
    way: &mut delivery::Delivery,
    tx: &Sender<Event>,
) -> Result<(), Outcome> {
    let live: Vec<i32> = slices.live().map(|s| s.partition).collect();
    for p in way.ahead(&live) {
        let (Some(i), Some(settled_rows)) = (slices.index(p), way.settle_partition(p)) else {
            continue;
        };
        let s = &job.slices[i];
        let letters = std::mem::take(&mut slices.letters[i]);
        let mut dlq = 0;
        if let (false, Some(d)) = (letters.is_empty(), &ctx.dlq) {
            let n = letters.len();
            match dlq::confirm(letters, d.topic(), &s.abandon).await {
                Ok(true) => dlq = n,
                Ok(false) => {
                    slices.given_up[i] = true;
                    continue;
                }
                Err(e) => return Err(Outcome::DlqFailed(e)),
            }
        }
        let mut rows = job.batch.rows_of(p);
        if let Some(first) = rows.next() {
            let last = rows.last().unwrap_or(first);
            let uncovered: Vec<Offset> = settled_rows.rejected.iter().map(|r| r.offset).collect();
            s.fates.finish(first.offset, last.offset, &uncovered);
        }
        slices.early[i] = true;
        tracing::info!(topic = %job.route.topic, partition = p, "partition's rows durable ahead of the rest of its batch");
        let _ = tx.send(Event::SliceDone(SliceDone {
            route_idx: job.route_idx,
            slice: settled(s, true),
            rejected: keyed(job, ctx, settled_rows.rejected),
            excluded: settled_rows.excluded,
            dlq,
        }));
    }
    Ok(())
}

/// Queues the records the encoder refused for the DLQ; `None` if the
/// partition was given up meanwhile.
async fn queue(
    ctx: &WriterCtx,
    letters: Vec<Letter>,
    abandon: &CancellationToken,
) -> Result<Option<Vec<Pending>>, DlqError> {
    let mut pending = Vec::with_capacity(letters.len());
    for l in letters {
        let what = format!("record {}[{}]@{}", l.topic, l.partition, l.offset);
        let why = format!("cannot become a row ({})", l.reason);
        let Some(d) = &ctx.dlq else {
            return Err(DlqError::NoTopic { what, why });
        };
        match d.send(&l, abandon).await {
            Ok(Some(p)) => pending.push(p),
            Ok(None) => return Ok(None),
            Err(source) => {
                let topic = d.topic().to_string();
                return Err(DlqError::Queue {
                    what,
                    why,
                    topic,
                    source,
                });
            }
        }
    }
    Ok(Some(pending))
}

/// Drives the batch's [`delivery::Delivery`]: each step's I/O, until it is
/// durable or every slice is given up.
async fn attempt_until_done(
    job: &Job,
    ctx: &WriterCtx,
    slices: &mut Slices<'_>,
    tx: &Sender<Event>,
) -> Outcome {
    let exactly_once = ctx.delivery.is_exactly_once();
    let mut delays = Delays::new(Duration::from_millis(100));
    // ClickHouse refused a field the route's cached columns hold.
    let mut stale_columns = false;
    // A binary attempt of this batch was refused: the rest go as JSON.
    let mut json_only = false;
    let topic = &job.route.topic;
    let table = job.route.table_ref();
    let label = table.to_string();
    let uncovered = earlier_uncovered(job, slices).await;
    // Rows per insert, once the server asked for fewer (code 252).
    let hint = &ctx.per_insert[job.route_idx];
    let per_insert = match hint.load(Ordering::Relaxed) {
        0 => None,
        n => Some(n.saturating_mul(2)),
    };
    let conditional = job
        .slices
        .iter()
        .flat_map(|s| {
            let p = s.partition;
            s.conditional
                .iter()
                .map(move |&(r, c)| (Row::new(p, r.0), Row::new(p, c.0)))
        })
        .collect();
    let mut way = delivery::Delivery::new(job.batch.clone(), exactly_once, job.uncertain)
        .with_conditional(conditional, uncovered)
        .with_per_insert(per_insert);
    for (s, given_up) in job.slices.iter().zip(slices.given_up.clone()) {
        if given_up {
            way.drop_partition(s.partition);
        }
    }
    loop {
        if !slices.follow_abandon(Some(&mut way)) {
            return Outcome::Abandoned;
        }
        if let Err(failed) = settle_early(job, ctx, slices, &mut way, tx).await {
            return failed;
        }
        // Durable needs no lease and no permit: a leaving partition's last
        // batch is done even if its lease ran out meanwhile.
        if let Next::Durable(done) = way.next() {
            return durable(job, ctx, done, stale_columns);
        }
        if exactly_once && !leases_ready(ctx, slices, &mut way).await {
            return Outcome::Abandoned;
        }
        let Ok(_permit) = ctx.permits.acquire().await else {
            return Outcome::Abandoned;
        };
        if !slices.follow_abandon(Some(&mut way)) {
            return Outcome::Abandoned;
        }
        let (batch, attempt) = match way.next() {
            Next::Durable(done) => return durable(job, ctx, done, stale_columns),
            Next::Reconcile { fence, rows } => {
                match reconcile(job, &rows, ctx, fence.as_ref()).await {
                    Ok(present) => way.reconciled(&present),
                    // The table is gone: no retry can tell what landed
                    // (the batch stays uncommitted; a restart reconciles
                    // it again). Anything else may pass (a fence that
                    // gave up on a query still running, a proxy's 4xx in
                    // a deploy, grants being applied): retried.
                    Err(e) if e.table_is_gone() => return Outcome::Failed(e),
                    Err(e) => {
                        tracing::warn!(topic = %topic, error = %e, "reconciliation failed; will retry");
                        wait_or_abandoned(&mut delays, slices).await;
                    }
                }
                continue;
            }
            Next::Insert { rows, number } => (rows, number),
            // Every attempt is answered before the next step; one that were
            // not would be taken as unknown: fenced, then reconciled.
            Next::Waiting => {
                way.answered(Answer::Unknown);
                continue;
            }
        };
        // Reconciliation takes time: check again right before the insert,
        // and let the deadline end with the first lease to end. A jump of
        // the server's clock seen by now suspects the leases first; one
        // seen until the deadline is computed sends this attempt back to
        // wait for a renewal (its deadline may be on the new reading, past
        // a lease that ran out while this host stood still).
        let jumps = ctx.ch.clock_jumps();
        ctx.lease.follow_clock(jumps);
        let lease_end = slices
            .live()
            .map(|s| ctx.lease.until((job.route_idx, s.partition), s.generation))
            .try_fold(None::<Instant>, |first, end| {
                end.map(|e| Some(first.map_or(e, |f| f.min(e))))
            })
            .flatten();
        if exactly_once && (lease_end.is_none() || slices.live().any(|s| s.abandon.is_cancelled()))
        {
            continue;
        }
        let token = ctx
            .delivery
            .sends_tokens()
            .then(|| insert_token(&table.sql(), topic, batch.rows()));
        let qid = match &token {
            Some(t) => query_id(t, attempt),
            None => {
                let first = batch.first().unwrap_or(Row::new(-1, -1));
                format!(
                    "sluice-alo-{}-{}-{attempt}",
                    first.partition, first.offset.0
                )
            }
        };
        let started = Instant::now();
        let deadline_ms = lease_end
            .filter(|_| exactly_once)
            .map(|end| ctx.ch.deadline_by(end));
        if exactly_once && ctx.ch.clock_jumps() != jumps {
            ctx.lease.follow_clock(ctx.ch.clock_jumps());
            continue;
        }
        let (body, format) = ctx
            .bodies
            .body(&ctx.ch, job.route_idx, &job.route, &batch, json_only)
            .await;
        let binary = matches!(format, RowFormat::Binary { .. });
        let req = InsertRequest {
            table: table.clone(),
            body,
            token,
            query_id: qid.clone(),
            deadline_ms,
            format_settings: job.route.insert_settings(),
            format,
        };
        way.sent(qid, deadline_ms);
        let result = ctx.ch.insert(req).await;
        let mut answered = answer(&result);
        if let (true, Err(e)) = (binary, &result) {
            if e.kind == ChErrorKind::Client {
                // Something in front of the server refused it (a binary
                // insert's URL is longer). That says nothing of the
                // server's query, which may run on and commit: fenced as an
                // unknown outcome, reconciled, then sent as JSON.
                answered = Answer::Unknown;
                json_only = true;
                ctx.bodies.refused_in_front(job.route_idx);
            }
        }
        way.answered(answered);
        let parts: Vec<i32> = batch.partitions().collect();
        match (answered, result) {
            (Answer::Rejected, Err(e)) if binary && json_may_differ(&e) => {
                // Nothing of it is stored (a refusal is whole). What the
                // binary path cannot explain (its table changed under it,
                // or a value it took for exact) is ClickHouse's JSON
                // parser's to judge: the batch goes again as JSON, after a
                // reconciliation, and its rows reach the DLQ (or stop the
                // sink) with that parser's reason.
                json_only = true;
                ctx.bodies.refused(job.route_idx);
                telemetry::insert_retried(&label, "binary-refused");
                tracing::warn!(topic = %topic, partitions = ?parts, rows = batch.len(), attempt, error = %e, "ClickHouse refused a RowBinaryWithDefaults insert; sending the batch as JSONEachRow");
            }
            (_, Ok(())) => {
                tracing::debug!(topic = %topic, partitions = ?parts, rows = batch.len(), attempt, "inserted");
                telemetry::batch_inserted(&label, batch.len(), started.elapsed());
                hint.store(way.per_insert().unwrap_or(0), Ordering::Relaxed);
            }
            (_, Err(e)) if e.wants_fewer_rows() => {
                if !way.split() {
                    return Outcome::Failed(e);
                }
                telemetry::insert_retried(&label, "partitions");
                tracing::warn!(
                    topic = %topic,
                    partitions = ?parts,
                    rows = batch.len(),
                    per_insert = way.per_insert(),
                    error = %e,
                    "ClickHouse takes fewer rows per insert (too many table partitions, or too large a body); splitting it"
                );
            }
            (Answer::TooLate, Err(_)) => {
                // It reached the server too late and stored nothing: the
                // clocks moved apart, or the request was held on the way.
                tracing::warn!(topic = %topic, partitions = ?parts, attempt, "insert reached ClickHouse after its deadline; retrying");
                telemetry::insert_retried(&label, "deadline");
                // Our clock may have stood still (a suspended VM): trust the
                // leases again only after a renewal read sent from now on.
                for s in slices.live() {
                    ctx.lease
                        .suspect((job.route_idx, s.partition), s.generation);
                }
                match ctx.ch.server_now(true).await {
                    Ok(_) => {
                        ctx.lease.follow_clock(ctx.ch.clock_jumps());
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot read the server's clock"),
                }
                wait_or_abandoned(&mut delays, slices).await;
            }
            (Answer::Rejected, Err(e)) => {
                let Some(d) = &ctx.dlq else {
                    return Outcome::Failed(e);
                };
                // ClickHouse names one refused row per attempt. For a field
                // it has no column for, every row with that field goes (or a
                // batch of them would cost an attempt each), and only those:
                // a field's name can hold text that reads as another row's
                // number.
                let mut refused: Vec<(Row, &[u8])> = match e.unknown_field() {
                    Some(field) => (0..batch.len())
                        .filter_map(|i| batch.row(i))
                        .filter(|&(_, r)| sluice_formats::row::has_field(r, field))
                        .collect(),
                    None => Vec::new(),
                };
                if refused.is_empty() {
                    match rejected_row(&e, &batch) {
                        Some(named) => refused.push(named),
                        None => return Outcome::Failed(e),
                    }
                }
                let encoder = &ctx.encoders[job.route_idx];
                let named_at = refused[0].0;
                tracing::warn!(topic = %topic, partition = named_at.partition, offset = named_at.offset.0, rows = refused.len(), error = %e, "ClickHouse rejected rows; sending them to the DLQ");
                for (at, row) in refused {
                    // A partition given up meanwhile: its rows are the next
                    // owner's to judge.
                    let Some(slice) = slices.of(at.partition) else {
                        continue;
                    };
                    let value = match slice.originals.get(at.offset) {
                        Some(v) => v.to_vec(),
                        None => encoder.original(row).unwrap_or_else(|| row.to_vec()),
                    };
                    let letter = Letter {
                        topic: topic.clone(),
                        partition: at.partition,
                        offset: at.offset.0,
                        timestamp: None,
                        key: None,
                        value: Some(value),
                        kind: e.row_kind(),
                        reason: e.to_string(),
                    };
                    match d.send(&letter, &slice.abandon).await {
                        Ok(Some(pending)) => {
                            if let Some(i) = slices.index(at.partition) {
                                slices.letters[i].push(pending);
                            }
                            way.reject([at]);
                        }
                        Ok(None) => slices.give_up(at.partition, Some(&mut way)),
                        Err(source) => {
                            return Outcome::DlqFailed(DlqError::Queue {
                                what: format!("record {topic}[{}]@{}", at.partition, at.offset.0),
                                why: format!("was rejected by ClickHouse ({e})"),
                                topic: d.topic().to_string(),
                                source,
                            })
                        }
                    }
                }
                stale_columns |= e.unknown_field().is_some();
            }
            (answered, Err(e)) => {
                telemetry::insert_retried(&label, e.kind.name());
                let what = match answered {
                    Answer::NotSent => "insert not sent; will retry",
                    Answer::Refused => "insert refused before it started; will retry",
                    _ => "insert outcome unknown; will reconcile before retrying",
                };
                tracing::warn!(
                    topic = %topic,
                    partitions = ?parts,
                    rows = batch.len(),
                    attempt,
                    error = %e,
                    "{what}"
                );
                wait_or_abandoned(&mut delays, slices).await;
            }
        }
    }
}

/// Waits until every live slice's partition may be written (a live
/// lease), giving up slices whose partition is given up meanwhile; false
/// once none is left.
async fn leases_ready(
    ctx: &WriterCtx,
    slices: &mut Slices<'_>,
    way: &mut delivery::Delivery,
) -> bool {
    let route = slices.job.route_idx;
    loop {
        if !slices.follow_abandon(Some(way)) {
            return false;
        }
        if slices
            .live()
            .all(|s| ctx.lease.live((route, s.partition), s.generation))
        {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = slices.any_abandoned() => {}
        }
    }
}

/// The next retry delay, cut short when a slice is given up (the loop
/// then drops it).
async fn wait_or_abandoned(delays: &mut Delays, slices: &Slices<'_>) {
    tokio::select! {
        _ = tokio::time::sleep(delays.next_delay()) => {}
        _ = slices.any_abandoned() => {}
    }
}

/// What an insert's result means for the batch's next attempt. A row
/// ClickHouse names in a permanent error goes to the DLQ (if there is
/// none, the batch fails and nothing follows).
fn answer(result: &Result<(), ChError>) -> Answer {
    match result {
        Ok(()) => Answer::Stored,
        Err(e) if e.kind == ChErrorKind::Connect => Answer::NotSent,
        // Refused for its size before it reached the server, or cut off
        // with the body incomplete: nothing of it commits, no fence.
        Err(e) if e.kind == ChErrorKind::TooLarge => Answer::Refused,
        Err(e) if deadline_passed(e) => Answer::TooLate,
        Err(e)
            if e.kind == ChErrorKind::Server
                && e.code.is_some_and(|c| REFUSED_AT_START.contains(&c)) =>
        {
            Answer::Refused
        }
        Err(e) if !e.is_retriable() => Answer::Rejected,
        Err(_) => Answer::Unknown,
    }
}

/// Whether a refused binary insert might have been taken as JSON: the
/// refusal names a row, comes from the guard (the table's columns
/// changed), or is a parsing error. A refusal of the table itself (it is
/// gone, read-only, out of space) is the JSON insert's too.
fn json_may_differ(e: &ChError) -> bool {
    /// CANNOT_PARSE_TEXT, CANNOT_PARSE_INPUT_ASSERTION_FAILED,
    /// CANNOT_READ_ALL_DATA, CANNOT_PARSE_DATE, CANNOT_PARSE_DATETIME,
    /// TYPE_MISMATCH, CANNOT_CONVERT_TYPE, CANNOT_PARSE_NUMBER,
    /// INCORRECT_DATA, TOO_LARGE_ARRAY_SIZE, TOO_LARGE_STRING_SIZE,
    /// UNKNOWN_ELEMENT_OF_ENUM.
    const PARSING: &[u32] = &[6, 27, 33, 38, 41, 53, 70, 72, 117, 128, 131, 691];
    e.kind == ChErrorKind::Server
        && (e.row.is_some()
            || e.message.contains(COLUMNS_CHANGED)
            || e.code.is_some_and(|c| PARSING.contains(&c)))
}

/// The record of `batch` a permanent ClickHouse error names ([`ChError::row`],
/// from 1), with its encoded row.
fn rejected_row<'b>(e: &ChError, batch: &'b Batch) -> Option<(Row, &'b [u8])> {
    if e.kind != ChErrorKind::Server {
        return None;
    }
    batch.row(e.row?.checked_sub(1)?)
}

/// The copies in earlier batches that conditional rows of `job` depend on
/// and that turned out not stored. A slice whose partition is given up
/// meanwhile, or whose earlier batch failed (that will never be known),
/// is given up.
async fn earlier_uncovered(job: &Job, slices: &mut Slices<'_>) -> Vec<Row> {
    let mut uncovered = Vec::new();
    for s in &job.slices {
        if slices.of(s.partition).is_none() {
            continue;
        }
        let Some(first) = job.batch.rows_of(s.partition).next() else {
            continue;
        };
        for &(_, copy) in s.conditional.iter().filter(|c| c.1 < first.offset) {
            let covered = tokio::select! {
                c = s.fates.covered(copy) => c,
                _ = s.abandon.cancelled() => None,
            };
            match covered {
                Some(true) => {}
                Some(false) => uncovered.push(Row::new(s.partition, copy.0)),
                None => {
                    slices.give_up(s.partition, None);
                    break;
                }
            }
        }
    }
    uncovered
}

/// The outcome of a batch whose rows are stored; a rejected row carries its
/// business key (read back from the row) so the dedup window can forget it.
fn durable(job: &Job, ctx: &WriterCtx, done: Durable, stale_columns: bool) -> Outcome {
    let Durable {
        inserted,
        rejected,
        excluded,
    } = done;
    Outcome::Durable {
        inserted,
        rejected: keyed(job, ctx, rejected),
        excluded,
        stale_columns,
    }
}

/// Rejected rows of `job`, each with its business key (read back from the
/// row) so the dedup window can forget it.
fn keyed(job: &Job, ctx: &WriterCtx, rejected: Vec<Row>) -> Vec<(Row, Option<KeyHash>)> {
    let encoder = &ctx.encoders[job.route_idx];
    let batch = &job.batch;
    rejected
        .into_iter()
        .map(|r: Row| {
            let key = batch
                .rows()
                .position(|x| x == r)
                .and_then(|i| batch.row(i))
                .and_then(|(_, row)| encoder.original(row))
                .and_then(|value| {
                    let mut scratch = Vec::new();
                    encoder
                        .encode_keyed(Some(&value), r.partition, r.offset.0, &mut scratch)
                        .ok()
                        .flatten()
                });
            (r, key)
        })
        .collect()
}

/// Fences the previous attempt, then asks which rows of `batch` ClickHouse
/// already has.
async fn reconcile(
    job: &Job,
    batch: &Batch,
    ctx: &WriterCtx,
    previous: Option<&Unsettled>,
) -> Result<Vec<Row>, ChError> {
    if let Some(u) = previous {
        ctx.ch.fence_attempt(&u.query_id, u.deadline_ms).await?;
    }
    let spans = batch.spans();
    let present = ctx.ch.present_rows(&job.route, &spans).await?;
    let held = batch.len() - batch.without(&present).len();
    telemetry::reconciled(&job.route.table_ref().to_string(), held, batch.len());
    tracing::info!(
        topic = batch.topic(),
        spans = ?spans,
        present = held,
        missing = batch.len() - held,
        "reconciled"
    );
    Ok(present)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_protocol::{BatchBuilder, BatchLimits, PartitionId};

    fn batch(offsets: &[i64]) -> Batch {
        let mut b = BatchBuilder::new(
            PartitionId {
                topic: "t".into(),
                partition: 0,
            },
            BatchLimits {
                max_rows: 100,
                max_bytes: 1 << 20,
                max_age: Duration::from_secs(1),
                aligned: false,
            },
        );
        for &o in offsets {
            b.push(Offset(o), Instant::now(), |buf| {
                buf.extend_from_slice(format!("{{\"o\":{o}}}\n").as_bytes());
                Ok::<_, ()>(())
            })
            .unwrap();
        }
        b.take().unwrap()
    }

    /// A server answer, parsed as the client's errors are.
    fn server(message: &str) -> ChError {
        ChError::from_response(format!("Code: 27. DB::Exception: {message}"))
    }

    #[test]
    fn the_row_a_rejection_names() {
        let b = batch(&[10, 11, 15]);
        let e = server("Cannot parse input: expected '\"' before: 'abc\"}': (while reading the value of key id): (at row 3)\n: While executing");
        assert_eq!(
            rejected_row(&e, &b),
            Some((Row::new(0, 15), b"{\"o\":15}\n".as_slice()))
        );
        assert_eq!(
            rejected_row(&server("(at row 1)"), &b).map(|r| r.0),
            Some(Row::new(0, 10))
        );
        // No row named, a row outside the batch, row 0, or not a server answer.
        assert_eq!(rejected_row(&server("Table x does not exist"), &b), None);
        assert_eq!(rejected_row(&server("(at row 4)"), &b), None);
        assert_eq!(rejected_row(&server("(at row 0)"), &b), None);
        assert_eq!(rejected_row(&server("(at row )"), &b), None);
        let timeout = ChError {
            kind: ChErrorKind::Timeout,
            code: None,
            row: Some(1),
            message: "(at row 1)".into(),
        };
        assert_eq!(rejected_row(&timeout, &b), None);
    }
}
