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

use super::lease::Lease;
use crate::ch::{ChError, ChErrorKind, ClickHouse, InsertRequest};
use crate::config::{Delivery, Route};
use crate::telemetry;
use sluice_core::acks::Ticket;
use sluice_core::token::{insert_token, query_id};
use sluice_core::Batch;
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
}

#[derive(Debug)]
pub enum Outcome {
    Durable {
        /// Rows inserted by this job (fewer than the batch after reconciliation).
        inserted: usize,
    },
    Abandoned,
    Failed(ChError),
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
pub async fn deliver(job: Job, ctx: Arc<WriterCtx>) -> Completion {
    let outcome = attempt_until_done(&job, &ctx).await;
    Completion {
        route_idx: job.route_idx,
        partition: job.batch.partition.partition,
        ticket: job.ticket,
        generation: job.generation,
        bytes: job.batch.bytes(),
        outcome,
    }
}

async fn attempt_until_done(job: &Job, ctx: &WriterCtx) -> Outcome {
    let exactly_once = ctx.delivery.is_exactly_once();
    let mut uncertain = exactly_once && job.uncertain;
    let mut previous: Option<(String, Instant)> = None;
    let mut backoff = Backoff::new();
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
        let batch = if uncertain {
            match reconcile(job, ctx, previous.as_ref()).await {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(partition = %p, error = %e, "reconciliation failed; will retry");
                    backoff.wait().await;
                    continue;
                }
            }
        } else {
            job.batch.clone()
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
            Err(e) if !e.is_retriable() => return Outcome::Failed(e),
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

/// Fences the previous attempt, then drops the rows ClickHouse already has.
async fn reconcile(
    job: &Job,
    ctx: &WriterCtx,
    previous: Option<&(String, Instant)>,
) -> Result<Batch, ChError> {
    if let Some((qid, started)) = previous {
        ctx.ch.fence_attempt(qid, *started).await?;
    }
    let (Some(first), Some(last)) = (job.batch.first(), job.batch.last()) else {
        return Ok(job.batch.clone());
    };
    let present = ctx
        .ch
        .present_offsets(&job.route, job.batch.partition.partition, first, last)
        .await?;
    let rest = job.batch.without(&present);
    telemetry::reconciled(
        &format!("{}.{}", job.route.database, job.route.table),
        job.batch.len() - rest.len(),
        job.batch.len(),
    );
    tracing::info!(
        partition = %job.batch.partition,
        first = first.0,
        last = last.0,
        present = job.batch.len() - rest.len(),
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
