//! One batch → durable in ClickHouse, or abandoned, or a permanent error.
//!
//! In: a [`Job`] (an encoded batch, its table, whether some of its rows may
//! already be stored). Out: a [`Completion`] sent back to the driver.
//!
//! Exactly-once: an attempt whose outcome is unknown (timeout, reset, 5xx)
//! makes the batch *uncertain*. Before the next attempt the writer makes sure
//! the earlier one can no longer commit (kill it and wait until it is gone),
//! asks ClickHouse which offsets of the batch it holds, and inserts only the
//! missing rows. It never re-sends blind and never skips. No attempt starts
//! while the process's group membership is in doubt ([`Lease`]) or after the
//! partition was given up (`abandon`).
//!
//! At-least-once and token-only: the same bytes (token-only: with the same
//! token) are re-sent until one attempt succeeds.
//!
//! With a DLQ, a row ClickHouse rejects (a permanent error naming the row,
//! `(at row N)`: a wrong type, an unparsable date) goes to the DLQ and the
//! rest of the batch is tried again (exactly-once: after reconciling). The
//! batch is durable once its rows are stored and its DLQ writes are
//! acknowledged.

use super::dlq::{self, Dlq, Letter, Pending};
use super::lease::Lease;
use crate::ch::{ChError, ChErrorKind, ClickHouse, InsertRequest};
use crate::config::{Delivery, Route};
use crate::telemetry;
use sluice_core::acks::Ticket;
use sluice_core::token::{insert_token, query_id};
use sluice_core::{Batch, Offset, RowEncoder};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// What the writer needs from its surroundings.
pub struct WriterCtx {
    pub ch: ClickHouse,
    pub lease: Lease,
    pub delivery: Delivery,
    pub permits: Semaphore,
    /// Where rows that cannot be stored go, if anywhere.
    pub dlq: Option<Dlq>,
    /// Per route: turns a rejected row back into its record value.
    pub encoders: Vec<RowEncoder>,
}

pub struct Job {
    pub route: Arc<Route>,
    pub route_idx: usize,
    pub batch: Batch,
    /// Some rows may already be stored: reconcile before the first attempt.
    pub uncertain: bool,
    pub ticket: Ticket,
    pub generation: u64,
    /// Cancelled when the partition is given up.
    pub abandon: CancellationToken,
    /// DLQ writes for records this batch accounts for.
    pub letters: Vec<Pending>,
}

#[derive(Debug)]
pub enum Outcome {
    Durable {
        /// Rows inserted by this job (fewer than the batch after reconciliation).
        inserted: usize,
    },
    Abandoned,
    Failed(ChError),
    /// A DLQ write failed for good.
    DlqFailed(String),
}

pub struct Completion {
    pub route_idx: usize,
    pub partition: i32,
    pub ticket: Ticket,
    pub generation: u64,
    pub bytes: usize,
    pub outcome: Outcome,
}

/// Delivers one batch; always returns a completion.
pub async fn deliver(mut job: Job, ctx: Arc<WriterCtx>) -> Completion {
    let mut letters = std::mem::take(&mut job.letters);
    let mut outcome = attempt_until_done(&job, &ctx, &mut letters).await;
    if let (Outcome::Durable { .. }, Some(d)) = (&outcome, &ctx.dlq) {
        match dlq::confirm(letters, d.topic(), &job.abandon).await {
            Ok(true) => {}
            Ok(false) => outcome = Outcome::Abandoned,
            Err(e) => outcome = Outcome::DlqFailed(e),
        }
    }
    Completion {
        route_idx: job.route_idx,
        partition: job.batch.partition.partition,
        ticket: job.ticket,
        generation: job.generation,
        bytes: job.batch.bytes(),
        outcome,
    }
}

async fn attempt_until_done(job: &Job, ctx: &WriterCtx, letters: &mut Vec<Pending>) -> Outcome {
    let exactly_once = ctx.delivery.is_exactly_once();
    let mut uncertain = exactly_once && job.uncertain;
    let mut previous: Option<(String, Instant)> = None;
    let mut backoff = Backoff::new();
    // Rows ClickHouse rejected, sent to the DLQ: never inserted.
    let mut rejected: Vec<Offset> = Vec::new();
    let p = &job.batch.partition;
    for attempt in 0u32.. {
        if exactly_once {
            tokio::select! {
                _ = ctx.lease.ready() => {}
                _ = job.abandon.cancelled() => return Outcome::Abandoned,
            }
        }
        if job.abandon.is_cancelled() {
            return Outcome::Abandoned;
        }
        let Ok(_permit) = ctx.permits.acquire().await else {
            return Outcome::Abandoned;
        };
        let base = if rejected.is_empty() {
            job.batch.clone()
        } else {
            job.batch.without(&rejected)
        };
        let batch = if uncertain {
            match reconcile(job, &base, ctx, previous.as_ref()).await {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(partition = %p, error = %e, "reconciliation failed; will retry");
                    backoff.wait().await;
                    continue;
                }
            }
        } else {
            base
        };
        if batch.is_empty() {
            return Outcome::Durable { inserted: 0 };
        }
        // Reconciliation takes time: check again right before the insert.
        if exactly_once && (!ctx.lease.wait_needed().is_zero() || job.abandon.is_cancelled()) {
            continue;
        }
        let token = exactly_once.then(|| {
            insert_token(
                &job.route.qualified(),
                &p.topic,
                p.partition,
                batch.offsets(),
            )
        });
        let qid = match &token {
            Some(t) => query_id(t, attempt),
            None => format!(
                "sluice-alo-{}-{}-{}",
                p.partition,
                batch.first().map_or(-1, |o| o.0),
                attempt
            ),
        };
        let started = Instant::now();
        let req_table = format!("{}.{}", job.route.database, job.route.table);
        let req = InsertRequest {
            table: job.route.qualified(),
            body: batch.body().clone(),
            token,
            query_id: qid.clone(),
        };
        match ctx.ch.insert(req).await {
            Ok(()) => {
                tracing::debug!(partition = %p, rows = batch.len(), attempt, "inserted");
                telemetry::batch_inserted(&req_table, batch.len(), started.elapsed());
                return Outcome::Durable {
                    inserted: batch.len(),
                };
            }
            Err(e) if !e.is_retriable() => {
                let Some((offset, row)) = rejected_row(&e, &batch) else {
                    return Outcome::Failed(e);
                };
                let Some(d) = &ctx.dlq else {
                    return Outcome::Failed(e);
                };
                let encoder = &ctx.encoders[job.route_idx];
                let value = encoder.original(row).unwrap_or_else(|| row.to_vec());
                let reason = e.to_string();
                let letter = Letter {
                    topic: &p.topic,
                    partition: p.partition,
                    offset: offset.0,
                    timestamp: None,
                    key: None,
                    value: Some(&value),
                    kind: "rejected",
                    reason: &reason,
                };
                match d.send(&letter) {
                    Ok(pending) => letters.push(pending),
                    Err(err) => {
                        return Outcome::DlqFailed(format!(
                            "{p}@{}: ClickHouse rejected its row ({e}) and it cannot be queued for the DLQ: {err}",
                            offset.0
                        ))
                    }
                }
                tracing::warn!(partition = %p, offset = offset.0, error = %e, "ClickHouse rejected a row; sent it to the DLQ");
                let at = rejected.partition_point(|o| *o < offset);
                rejected.insert(at, offset);
                // A cut-short insert may have stored some rows: check first.
                uncertain = exactly_once;
                previous = None;
            }
            Err(e) => {
                telemetry::insert_retried(&req_table, e.kind.name());
                tracing::warn!(
                    partition = %p,
                    first = batch.first().map_or(-1, |o| o.0),
                    last = batch.last().map_or(-1, |o| o.0),
                    attempt,
                    error = %e,
                    "insert outcome unknown; will reconcile before retrying"
                );
                if exactly_once && e.kind != ChErrorKind::Connect {
                    // Something may have reached the server: reconcile first.
                    uncertain = true;
                    previous = Some((qid, started));
                }
                backoff.wait().await;
            }
        }
    }
    Outcome::Abandoned
}

/// The row a permanent ClickHouse error names (`(at row N)`, from 1).
fn rejected_row<'b>(e: &ChError, batch: &'b Batch) -> Option<(Offset, &'b [u8])> {
    if e.kind != ChErrorKind::Server {
        return None;
    }
    let rest = &e.message[e.message.find("(at row ")? + 8..];
    let digits = &rest[..rest.find(|c: char| !c.is_ascii_digit())?];
    let n: usize = digits.parse().ok()?;
    batch.row(n.checked_sub(1)?)
}

/// Fences the previous attempt, then drops the rows of `batch` ClickHouse
/// already has.
async fn reconcile(
    job: &Job,
    batch: &Batch,
    ctx: &WriterCtx,
    previous: Option<&(String, Instant)>,
) -> Result<Batch, ChError> {
    if let Some((qid, started)) = previous {
        ctx.ch.fence_attempt(qid, *started).await?;
    }
    let (Some(first), Some(last)) = (batch.first(), batch.last()) else {
        return Ok(batch.clone());
    };
    let present = ctx
        .ch
        .present_offsets(&job.route, batch.partition.partition, first, last)
        .await?;
    let rest = batch.without(&present);
    telemetry::reconciled(
        &format!("{}.{}", job.route.database, job.route.table),
        batch.len() - rest.len(),
        batch.len(),
    );
    tracing::info!(
        partition = %batch.partition,
        first = first.0,
        last = last.0,
        present = batch.len() - rest.len(),
        missing = rest.len(),
        "reconciled"
    );
    Ok(rest)
}

struct Backoff(Duration);

impl Backoff {
    fn new() -> Self {
        Self(Duration::from_millis(100))
    }

    async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{BatchBuilder, BatchLimits, PartitionId};

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

    fn server(message: &str) -> ChError {
        ChError {
            kind: ChErrorKind::Server,
            code: Some(27),
            message: message.into(),
        }
    }

    #[test]
    fn the_row_a_rejection_names() {
        let b = batch(&[10, 11, 15]);
        let e = server("Cannot parse input: expected '\"' before: 'abc\"}': (while reading the value of key id): (at row 3)\n: While executing");
        assert_eq!(
            rejected_row(&e, &b),
            Some((Offset(15), b"{\"o\":15}\n".as_slice()))
        );
        assert_eq!(
            rejected_row(&server("(at row 1)"), &b).map(|r| r.0),
            Some(Offset(10))
        );
        // No row named, a row outside the batch, row 0, or not a server answer.
        assert_eq!(rejected_row(&server("Table x does not exist"), &b), None);
        assert_eq!(rejected_row(&server("(at row 4)"), &b), None);
        assert_eq!(rejected_row(&server("(at row 0)"), &b), None);
        assert_eq!(rejected_row(&server("(at row )"), &b), None);
        let timeout = ChError {
            kind: ChErrorKind::Timeout,
            code: None,
            message: "(at row 1)".into(),
        };
        assert_eq!(rejected_row(&timeout, &b), None);
    }
}
