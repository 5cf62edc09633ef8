//! Where the sink's state meets the world, on the consumer thread.
//!
//! The state ([`Sink`]) decides and queues [`Action`]s; this module turns
//! librdkafka's calls into the state's events (a record, an assignment, a
//! revocation, the tasks' reports) and carries the actions out with the
//! consumer and the runtime ([`run`]), in order, right after the call that
//! queued them. What the state must learn of an action (a failed seek, a
//! stored commit) goes straight back to it; what a task finds (an insert's
//! end, a schema, a table's columns) comes back as an [`Event`]. Nothing
//! here waits on ClickHouse or the registry: those reads run as tasks. The
//! waits that belong to the consumer thread (a revocation at least once,
//! the stop) are here too: they hand the tasks' reports to the state while
//! they wait.

use super::action::Action;
use super::columns;
use super::event::Event;
use super::schemas;
use super::state::{Record, Sink};
use super::writer::deliver;
use super::SinkContext;
use crate::owners::{Key, Owners};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::Message;
use rdkafka::{Offset as KOffset, TopicPartitionList};
use sluice_protocol::resume::MISMATCH_MARK;
use sluice_protocol::Offset;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a seek may hold the consumer thread (a heartbeat interval);
/// one that takes longer is tried again.
const SEEK_WAIT: Duration = Duration::from_secs(1);

type Consumer_ = BaseConsumer<SinkContext>;

/// A record as the state reads it, borrowed from the client's message.
pub(super) fn record_of(m: &impl Message) -> Record<'_> {
    Record {
        topic: m.topic(),
        partition: m.partition(),
        offset: Offset(m.offset()),
        timestamp: m.timestamp().to_millis(),
        key: m.key(),
        payload: m.payload(),
    }
}

fn keys_of(s: &Sink, tpl: &TopicPartitionList) -> Vec<Key> {
    tpl.elements()
        .iter()
        .filter_map(|e| Some((s.route_of(e.topic())?, e.partition())))
        .collect()
}

fn list_of(s: &Sink, keys: &[Key]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (ri, p) in keys {
        tpl.add_partition(s.topic(*ri), *p);
    }
    tpl
}

/// The group assigned `tpl`: the consumer takes it, then the state.
pub(super) fn assign(c: &Consumer_, s: &mut Sink, tpl: &TopicPartitionList) -> KafkaResult<()> {
    c.incremental_assign(tpl)?;
    s.on_assign(&keys_of(s, tpl));
    run(c, s);
    Ok(())
}

/// The group takes `tpl` back: the state lets go of it (at least once,
/// after its inserts ended and its frontier is committed), then the
/// consumer.
pub(super) fn revoke(c: &Consumer_, s: &mut Sink, tpl: &TopicPartitionList) -> KafkaResult<()> {
    let lost = c.assignment_lost();
    let drain = s.on_revoke(&keys_of(s, tpl), lost);
    run(c, s);
    if !drain.is_empty() {
        wait_in_flight(c, s, Some(&drain), s.drain_timeout());
        s.let_go(&drain);
        run(c, s);
    }
    c.incremental_unassign(tpl)
}

/// Hands the state everything the tasks reported, without waiting.
pub(super) fn drain_events(c: &Consumer_, s: &mut Sink) {
    while let Some(e) = s.next_event(Duration::ZERO) {
        s.on_event(e);
        run(c, s);
    }
    s.unstall();
    run(c, s);
}

/// Waits for in-flight batches (of `only`, or of every partition),
/// handing the state the tasks' reports meanwhile. False if `timeout`
/// passed first.
fn wait_in_flight(c: &Consumer_, s: &mut Sink, only: Option<&[Key]>, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while s.busy(only) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        if let Some(e) = s.next_event(left.min(Duration::from_millis(200))) {
            s.on_event(e);
        }
        // A revoked partition whose lease ran out meanwhile is the next
        // owner's: its inserts are abandoned rather than waited for.
        s.expire_leaving();
        run(c, s);
    }
    true
}

/// The stop: flush what was read (a bad record never entered a batch),
/// wait for every insert, commit, mark the hand-off clean. A consumer
/// that cannot go on (`kafka_failed`: fenced, refused) owns nothing any
/// more: it abandons its work and inserts nothing new. Returns why the
/// sink stopped, if it failed.
pub(super) fn stop(c: &Consumer_, s: &mut Sink, kafka_failed: bool) -> Option<anyhow::Error> {
    let mut drained = false;
    if !kafka_failed {
        s.cut_due(Instant::now(), true);
        run(c, s);
        drained = wait_in_flight(c, s, None, s.drain_timeout());
        s.commit(None, true);
        run(c, s);
    }
    let fatal = s.stopped(drained);
    run(c, s);
    fatal
}

/// The consumer's position in each partition it holds.
pub(super) fn positions(c: &Consumer_, s: &Sink) -> HashMap<Key, i64> {
    c.position()
        .map(|tpl| {
            tpl.elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    KOffset::Offset(o) => Some(((s.route_of(e.topic())?, e.partition()), o)),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Carries out what the state queued, in order; what it must learn goes
/// back to it, and what that queues is carried out too.
pub(super) fn run(c: &Consumer_, s: &mut Sink) {
    let handle = s.handle().clone();
    while let Some(action) = s.next_action() {
        match action {
            Action::Pause(keys) => {
                if let Err(e) = c.pause(&list_of(s, &keys)) {
                    tracing::warn!(error = %e, "pause failed");
                }
            }
            Action::Resume(keys) => {
                if let Err(e) = c.resume(&list_of(s, &keys)) {
                    tracing::warn!(error = %e, "resume failed");
                }
            }
            Action::Seek { key, offset, then } => {
                let sought = c.seek(s.topic(key.0), key.1, KOffset::Offset(offset.0), SEEK_WAIT);
                s.on_seek(key, then, sought.map_err(|e| e.to_string()));
            }
            Action::Commit { offsets, sync } => {
                let mut tpl = TopicPartitionList::new();
                for ((ri, p), _, next) in &offsets {
                    let _ = tpl.add_partition_offset(s.topic(*ri), *p, KOffset::Offset(next.0));
                }
                let mode = if sync {
                    CommitMode::Sync
                } else {
                    CommitMode::Async
                };
                match c.commit(&tpl, mode) {
                    Ok(()) => s.on_committed(&offsets),
                    Err(e) => tracing::warn!(
                        error = %e,
                        "offset commit failed; it is advisory, progress lives in ClickHouse"
                    ),
                }
            }
            Action::MarkMismatch { keys, named } => {
                let mut tpl = TopicPartitionList::new();
                for (ri, p) in &keys {
                    let _ = tpl.add_partition_offset(
                        s.topic(*ri),
                        *p,
                        KOffset::Offset(MISMATCH_MARK.0),
                    );
                }
                // A commit can fail around a rebalance: try a few times.
                let mut last = Ok(());
                for wait in [0u64, 500, 1_000, 2_000, 4_000] {
                    std::thread::sleep(Duration::from_millis(wait));
                    last = c.commit(&tpl, CommitMode::Sync).map_err(|e| e.to_string());
                    if last.is_ok() {
                        break;
                    }
                }
                s.mismatch_marked(&named, Some(last));
            }
            Action::Insert(job) => {
                let (ctx, tx) = (s.writer_ctx(), s.events());
                handle.spawn(async move {
                    let c = deliver(*job, ctx, tx.clone()).await;
                    let _ = tx.send(Event::Completion(c));
                });
            }
            Action::Prepare(prep) => {
                handle.spawn(prep.run());
            }
            Action::RetryPrepared { after, prepared } => {
                let (tx, stopping) = (s.events(), s.stopping().clone());
                handle.spawn(async move {
                    tokio::select! {
                        _ = tokio::time::sleep(after) => { let _ = tx.send(Event::Prepared(*prepared)); }
                        _ = stopping.cancelled() => {}
                    }
                });
            }
            Action::MarkClean { keys, until, wait } => {
                let marking = mark_clean(s.owners().clone(), keys, until);
                if wait {
                    handle.block_on(marking);
                } else {
                    handle.spawn(marking);
                }
            }
            Action::FetchSchema { route, id } => {
                let registry = s.registry().cloned();
                let format = s.route(route).format.name();
                let (tx, stopping) = (s.events(), s.stopping().clone());
                handle.spawn(schemas::fetch_task(
                    registry, route, id, format, tx, stopping,
                ));
            }
            Action::RereadColumns { route } => {
                let (ctx, table, tx) = (s.writer_ctx(), s.route(route).clone(), s.events());
                handle.spawn(async move {
                    // A panic answers too: the route's partitions waiting
                    // on the read must not wait for ever.
                    let reading =
                        tokio::spawn(async move { columns::reread(&ctx.ch, &table).await });
                    let answer = reading
                        .await
                        .unwrap_or_else(|e| Err(format!("reading the columns failed: {e}")));
                    let _ = tx.send(Event::Columns { route, answer });
                });
            }
        }
    }
}

/// Marks `keys` clean in the register: their inserts drained under leases
/// that have just ended, the first of them at `until`, so the next owner
/// need not fence, or stops fencing. The mark must land before `until`,
/// while no new owner can have finished its fence; one acknowledged later
/// is reported.
async fn mark_clean(owners: Owners, keys: Vec<Key>, until: Option<Instant>) {
    let Some(until) = until else {
        return;
    };
    match tokio::task::spawn_blocking(move || owners.write(keys, 0)).await {
        Ok(Ok(())) if Instant::now() > until => tracing::warn!(
            late_ms = (Instant::now() - until).as_millis() as u64,
            "the clean mark was acknowledged after the lease ended; a new owner that finished its fence meanwhile would take it for clean"
        ),
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot mark the hand-off clean; the next owner fences")
        }
        Err(e) => tracing::warn!(error = %e, "marking the hand-off clean failed"),
    }
}
