//! Key-level dedup in the sink: rebuilding a partition's window when it
//! changes hands.
//!
//! In: a route with `dedup_key`, a partition, its watermark (the highest
//! offset in the table) and where reading starts (the commit). Out:
//! [`Seeds`], the keys the table already holds for the last `dedup_window`
//! of the partition, to load into a fresh [`KeyWindow`] before the
//! partition's records flow. The records from the start to the watermark
//! are read again, and were first judged at a stream time at least their
//! first record's: so the window is measured in record time back from the
//! earlier of the start record and the watermark record. The broker gives
//! those timestamps and, with `offsets_for_times`, the first offset of the
//! window; ClickHouse gives the keys of the rows in between. So a restart or
//! rebalance does not reopen the door to a duplicate of a key written just
//! before it. The keys loaded count as written at the watermark's time, and
//! do not expire while the records up to the watermark are read again
//! ([`KeyWindow::rebuilt`]): they may be remembered longer than their own
//! time says, never shorter.
//!
//! The decisions themselves ([`KeyWindow::decide`]) happen on the consumer
//! thread, in `state`.

use crate::ch::ClickHouse;
use crate::config::{KafkaConfig, KeyDedup, Route};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset as KOffset, TopicPartitionList};
use sluice_protocol::dedup::{KeyHash, KeyWindow};
use sluice_protocol::{NextOffset, Offset};
use std::time::Duration;

/// Keys already written, the record time they count from, and the
/// table's highest offset (records up to it may be read again).
#[derive(Debug)]
pub(super) struct Seeds {
    pub(crate) keys: Vec<KeyHash>,
    pub(crate) at_ms: i64,
    pub(crate) through: Offset,
}

/// A fresh window for a route, loaded with `seeds`.
pub(super) fn window(d: &KeyDedup, seeds: Option<&Seeds>) -> KeyWindow {
    match seeds {
        Some(s) => KeyWindow::rebuilt(
            d.window,
            d.max_keys,
            s.keys.iter().copied(),
            s.at_ms,
            s.through,
        ),
        None => KeyWindow::new(d.window, d.max_keys),
    }
}

/// Reads the keys of the last window of `partition` from the table.
/// `None` when the route has no key dedup or nothing was written yet.
pub(super) async fn rebuild(
    kafka: &KafkaConfig,
    ch: &ClickHouse,
    route: &Route,
    partition: i32,
    watermark: Option<Offset>,
    start: NextOffset,
) -> anyhow::Result<Option<Seeds>> {
    let (Some(d), Some(w)) = (&route.dedup, watermark) else {
        return Ok(None);
    };
    let (kafka, topic, window) = (kafka.clone(), route.topic.clone(), d.window);
    let (at_ms, from) = tokio::task::spawn_blocking(move || {
        window_start(&kafka, &topic, partition, w, start, window)
    })
    .await??;
    let keys = ch
        .keys_between(route, &d.fields, partition, from, w)
        .await?;
    tracing::info!(
        partition = %format!("{}[{partition}]", route.topic),
        keys = keys.len(),
        from = from.0,
        through = w.0,
        "rebuilt the key dedup window from the table"
    );
    Ok(Some(Seeds {
        keys,
        at_ms,
        through: w,
    }))
}

/// The timestamp of the record at `watermark`, and the first offset whose
/// timestamp is within `window` before it or before the record at `start`
/// (when reading starts at or below the watermark), whichever is earlier.
fn window_start(
    k: &KafkaConfig,
    topic: &str,
    partition: i32,
    watermark: Offset,
    start: NextOffset,
    window: Duration,
) -> anyhow::Result<(i64, Offset)> {
    let mut cc = k.client_config();
    cc.set("group.id", format!("{}-lookup", k.group_id))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "100")
        .set("enable.partition.eof", "false");
    let c: BaseConsumer = cc.create()?;
    let at_ms = timestamp_at(&c, topic, partition, watermark.0)?;
    let earliest = if start.0 <= watermark.0 {
        timestamp_at(&c, topic, partition, start.0)?.min(at_ms)
    } else {
        at_ms
    };
    let since = earliest.saturating_sub(window.as_millis() as i64).max(0);
    let mut q = TopicPartitionList::new();
    q.add_partition_offset(topic, partition, KOffset::Offset(since))?;
    let found = c.offsets_for_times(q, Duration::from_secs(15))?;
    let from = found
        .elements()
        .first()
        .and_then(|e| match e.offset() {
            KOffset::Offset(o) if o >= 0 => Some(o.min(watermark.0)),
            _ => None,
        })
        .unwrap_or(watermark.0);
    Ok((at_ms, Offset(from)))
}

/// The timestamp of the first record at or after `offset` (0 without one).
fn timestamp_at(c: &BaseConsumer, topic: &str, partition: i32, offset: i64) -> anyhow::Result<i64> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, KOffset::Offset(offset))?;
    c.assign(&tpl)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) if m.offset() >= offset => {
                return Ok(m.timestamp().to_millis().unwrap_or(0));
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "reading a record to rebuild the key dedup window")
            }
            _ => {}
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!(
                "cannot read {topic}[{partition}]@{offset} to rebuild the key dedup window"
            );
        }
    }
}
