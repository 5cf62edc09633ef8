//! One batch → durable in ClickHouse, or abandoned, or a permanent error.
//!
//! In: a [`Job`] (an encoded batch, its table, whether some of its rows may
//! already be stored). Out: a [`Completion`] sent back to the driver.
//!
//! Exactly-once: every attempt carries a deadline on the server's clock
//! after which the server refuses to start it. An attempt whose outcome is
//! unknown (timeout, reset, 5xx) makes the batch *uncertain*. Before the
//! next attempt the writer makes sure the earlier one can no longer commit
//! (kill it, wait until the server's clock is past its deadline and it is
//! gone from the process list), asks ClickHouse which offsets of the batch
//! it holds, and inserts only the missing rows. It never re-sends blind and never skips. No attempt starts
//! while the process's group membership is in doubt ([`Lease`]) or after the
//! partition was given up (`abandon`).
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

use super::dlq::{self, Dlq, DlqError, Letter, Pending};
use super::event::{Completion, Outcome};
use super::fates::Fates;
use super::lease::Lease;
use super::schemas::Originals;
use crate::ch::{deadline_passed, ChError, ChErrorKind, ClickHouse, InsertRequest};
use crate::config::{Delivery, Route};
use crate::retry::Delays;
use crate::telemetry;
use sluice_formats::RowEncoder;
use sluice_protocol::acks::Ticket;
use sluice_protocol::attempt::{Answer, Unsettled, REFUSED_AT_START};
use sluice_protocol::delivery::{self, Durable, Next};
use sluice_protocol::token::{insert_token, query_id};
use sluice_protocol::{Batch, Offset, PartitionId, Row};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// What the writer needs from its surroundings.
pub(crate) struct WriterCtx {
    pub(crate) ch: ClickHouse,
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

pub(crate) struct Job {
    pub(crate) route: Arc<Route>,
    pub(crate) route_idx: usize,
    /// The partition the batch's rows come from.
    pub(crate) partition: PartitionId,
    pub(crate) batch: Batch,
    /// Some rows may already be stored: reconcile before the first attempt.
    pub(crate) uncertain: bool,
    pub(crate) ticket: Ticket,
    pub(crate) generation: u64,
    /// Cancelled when the partition is given up.
    pub(crate) abandon: CancellationToken,
    /// Records this batch accounts for that go to the DLQ.
    pub(crate) letters: Vec<Letter>,
    /// The memory it holds (rows and letters), counted as in flight.
    pub(crate) bytes: usize,
    /// Key dedup: `(row, copy)`, ascending, for rows written on the
    /// condition that the copy of their key at `copy` is not stored.
    pub(crate) conditional: Vec<(Offset, Offset)>,
    /// What became of the partition's earlier rows.
    pub(crate) fates: Arc<Fates>,
    /// On a registry route, the records' own values, for the DLQ.
    pub(crate) originals: Originals,
}

/// Delivers one batch; always returns a completion.
pub(crate) async fn deliver(mut job: Job, ctx: Arc<WriterCtx>) -> Completion {
    let refused = std::mem::take(&mut job.letters);
    let (mut outcome, letters) = match queue(&ctx, refused, &job.abandon).await {
        Ok(Some(mut letters)) => (attempt_until_done(&job, &ctx, &mut letters).await, letters),
        Ok(None) => (Outcome::Abandoned, Vec::new()),
        Err(e) => (Outcome::DlqFailed(e), Vec::new()),
    };
    let offset = |r: Row| r.offset;
    match (
        &outcome,
        job.batch.first().map(offset),
        job.batch.last().map(offset),
    ) {
        (Outcome::Durable { rejected, .. }, Some(first), Some(last)) => {
            let uncovered: Vec<Offset> = rejected.iter().map(|r| r.0).collect();
            job.fates.finish(first, last, &uncovered);
        }
        (Outcome::Failed(_) | Outcome::DlqFailed(_), ..) => job.fates.fail(),
        _ => {}
    }
    let mut dlq = 0;
    if let (Outcome::Durable { .. }, Some(d)) = (&outcome, &ctx.dlq) {
        let n = letters.len();
        match dlq::confirm(letters, d.topic(), &job.abandon).await {
            Ok(true) => dlq = n,
            Ok(false) => outcome = Outcome::Abandoned,
            Err(e) => outcome = Outcome::DlqFailed(e),
        }
    }
    Completion {
        route_idx: job.route_idx,
        partition: job.partition.partition,
        ticket: job.ticket,
        generation: job.generation,
        bytes: job.bytes,
        dlq,
        copies: job.conditional.iter().map(|c| c.1).collect(),
        outcome,
    }
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

/// Drives the batch's [`delivery::Delivery`]: each step's I/O, until it is durable.
async fn attempt_until_done(job: &Job, ctx: &WriterCtx, letters: &mut Vec<Pending>) -> Outcome {
    let exactly_once = ctx.delivery.is_exactly_once();
    let mut delays = Delays::new(Duration::from_millis(100));
    // ClickHouse refused a field the route's cached columns hold.
    let mut stale_columns = false;
    let p = &job.partition;
    let table = job.route.table_ref();
    let label = table.to_string();
    let Some(uncovered) = earlier_uncovered(job).await else {
        return Outcome::Abandoned;
    };
    let key = (job.route_idx, p.partition);
    let row = |offset| Row {
        partition: p.partition,
        offset,
    };
    // Rows per insert, once the server asked for fewer (code 252).
    let hint = &ctx.per_insert[job.route_idx];
    let per_insert = match hint.load(Ordering::Relaxed) {
        0 => None,
        n => Some(n.saturating_mul(2)),
    };
    let mut way = delivery::Delivery::new(job.batch.clone(), exactly_once, job.uncertain)
        .with_conditional(
            job.conditional
                .iter()
                .map(|&(r, c)| (row(r), row(c)))
                .collect(),
            uncovered.into_iter().map(row).collect(),
        )
        .with_per_insert(per_insert);
    loop {
        // Durable needs no lease and no permit: a leaving partition's last
        // batch is done even if its lease ran out meanwhile.
        if let Next::Durable(done) = way.next() {
            return durable(job, ctx, done, stale_columns);
        }
        if exactly_once {
            tokio::select! {
                _ = ctx.lease.ready(key, job.generation) => {}
                _ = job.abandon.cancelled() => return Outcome::Abandoned,
            }
        }
        if job.abandon.is_cancelled() {
            return Outcome::Abandoned;
        }
        let Ok(_permit) = ctx.permits.acquire().await else {
            return Outcome::Abandoned;
        };
        let (batch, attempt) = match way.next() {
            Next::Durable(done) => return durable(job, ctx, done, stale_columns),
            Next::Reconcile { fence, rows } => {
                match reconcile(job, &rows, ctx, fence.as_ref()).await {
                    Ok(present) => way.reconciled(&present),
                    Err(e) => {
                        tracing::warn!(partition = %p, error = %e, "reconciliation failed; will retry");
                        delays.wait(&job.abandon).await;
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
        // and let the deadline end with the lease. A jump of the server's
        // clock seen by now suspects the lease first; one seen until the
        // deadline is computed sends this attempt back to wait for a
        // renewal (its deadline may be on the new reading, past a lease
        // that ran out while this host stood still).
        let jumps = ctx.ch.clock_jumps();
        ctx.lease.follow_clock(jumps);
        let lease_end = ctx.lease.until(key, job.generation);
        if exactly_once && (lease_end.is_none() || job.abandon.is_cancelled()) {
            continue;
        }
        let token = ctx
            .delivery
            .sends_tokens()
            .then(|| insert_token(&table.sql(), &p.topic, batch.rows()));
        let qid = match &token {
            Some(t) => query_id(t, attempt),
            None => format!(
                "sluice-alo-{}-{}-{attempt}",
                p.partition,
                batch.first().map_or(-1, |r| r.offset.0),
            ),
        };
        let started = Instant::now();
        let deadline_ms = lease_end
            .filter(|_| exactly_once)
            .map(|end| ctx.ch.deadline_by(end));
        if exactly_once && ctx.ch.clock_jumps() != jumps {
            ctx.lease.follow_clock(ctx.ch.clock_jumps());
            continue;
        }
        let req = InsertRequest {
            table: table.clone(),
            body: batch.body().clone(),
            token,
            query_id: qid.clone(),
            deadline_ms,
            format_settings: job.route.insert_settings(),
        };
        way.sent(qid, deadline_ms);
        let result = ctx.ch.insert(req).await;
        let answered = answer(&result);
        way.answered(answered);
        match (answered, result) {
            (_, Ok(())) => {
                tracing::debug!(partition = %p, rows = batch.len(), attempt, "inserted");
                telemetry::batch_inserted(&label, batch.len(), started.elapsed());
                hint.store(way.per_insert().unwrap_or(0), Ordering::Relaxed);
            }
            (_, Err(e)) if e.wants_fewer_rows() => {
                if !way.split() {
                    return Outcome::Failed(e);
                }
                telemetry::insert_retried(&label, "partitions");
                tracing::warn!(
                    partition = %p,
                    rows = batch.len(),
                    per_insert = way.per_insert(),
                    error = %e,
                    "ClickHouse takes fewer rows per insert (too many table partitions, or too large a body); splitting it"
                );
            }
            (Answer::TooLate, Err(_)) => {
                // It reached the server too late and stored nothing: the
                // clocks moved apart, or the request was held on the way.
                tracing::warn!(partition = %p, attempt, "insert reached ClickHouse after its deadline; retrying");
                telemetry::insert_retried(&label, "deadline");
                // Our clock may have stood still (a suspended VM): trust the
                // lease again only after a renewal read sent from now on.
                ctx.lease.suspect(key, job.generation);
                match ctx.ch.server_now(true).await {
                    Ok(_) => {
                        ctx.lease.follow_clock(ctx.ch.clock_jumps());
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot read the server's clock"),
                }
                delays.wait(&job.abandon).await;
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
                tracing::warn!(partition = %p, offset = named_at.offset.0, rows = refused.len(), error = %e, "ClickHouse rejected rows; sending them to the DLQ");
                for (at, row) in refused {
                    let offset = at.offset;
                    let value = match job.originals.get(offset) {
                        Some(v) => v.to_vec(),
                        None => encoder.original(row).unwrap_or_else(|| row.to_vec()),
                    };
                    let letter = Letter {
                        topic: p.topic.clone(),
                        partition: p.partition,
                        offset: offset.0,
                        timestamp: None,
                        key: None,
                        value: Some(value),
                        kind: e.row_kind(),
                        reason: e.to_string(),
                    };
                    match d.send(&letter, &job.abandon).await {
                        Ok(Some(pending)) => letters.push(pending),
                        Ok(None) => return Outcome::Abandoned,
                        Err(source) => {
                            return Outcome::DlqFailed(DlqError::Queue {
                                what: format!("record {p}@{}", offset.0),
                                why: format!("was rejected by ClickHouse ({e})"),
                                topic: d.topic().to_string(),
                                source,
                            })
                        }
                    }
                    way.reject([at]);
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
                    partition = %p,
                    first = batch.first().map_or(-1, |r| r.offset.0),
                    last = batch.last().map_or(-1, |r| r.offset.0),
                    attempt,
                    error = %e,
                    "{what}"
                );
                delays.wait(&job.abandon).await;
            }
        }
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

/// The record of `batch` a permanent ClickHouse error names ([`ChError::row`],
/// from 1), with its encoded row.
fn rejected_row<'b>(e: &ChError, batch: &'b Batch) -> Option<(Row, &'b [u8])> {
    if e.kind != ChErrorKind::Server {
        return None;
    }
    batch.row(e.row?.checked_sub(1)?)
}

/// The copies in earlier batches that conditional rows of `job` depend on
/// and that turned out not stored; `None` if that will never be known (the
/// partition was given up, or an earlier batch failed).
async fn earlier_uncovered(job: &Job) -> Option<Vec<Offset>> {
    let Some(first) = job.batch.first().map(|r| r.offset) else {
        return Some(Vec::new());
    };
    let mut uncovered = Vec::new();
    for &(_, copy) in job.conditional.iter().filter(|c| c.1 < first) {
        let covered = tokio::select! {
            c = job.fates.covered(copy) => c?,
            _ = job.abandon.cancelled() => return None,
        };
        if !covered {
            uncovered.push(copy);
        }
    }
    Some(uncovered)
}

/// The outcome of a batch whose rows are stored; a rejected row carries its
/// business key (read back from the row) so the dedup window can forget it.
fn durable(job: &Job, ctx: &WriterCtx, done: Durable, stale_columns: bool) -> Outcome {
    let Durable {
        inserted,
        rejected,
        excluded,
    } = done;
    let encoder = &ctx.encoders[job.route_idx];
    let batch = &job.batch;
    let rejected = rejected
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
            (r.offset, key)
        })
        .collect();
    Outcome::Durable {
        inserted,
        rejected,
        excluded,
        stale_columns,
    }
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
    use sluice_protocol::{BatchBuilder, BatchLimits};

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
