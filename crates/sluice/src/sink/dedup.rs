//! Key-level dedup in the sink: rebuilding a partition's window when it
//! changes hands.
//!
//! In: a route with `dedup_key`, a partition and its watermark (the highest
//! offset in the table). Out: [`Seeds`], the keys the table already holds
//! for the last `dedup_window` of the partition, to load into a fresh
//! [`KeyWindow`] before the partition's records flow. The window is measured
//! in record time back from the watermark record: the broker gives that
//! record's timestamp and, with `offsets_for_times`, the first offset of the
//! window; ClickHouse gives the keys of the rows in between. So a restart or
//! rebalance does not reopen the door to a duplicate of a key written just
//! before it. The keys loaded count as written at the watermark's time (they
//! may be remembered up to one window longer than their own time says).
//!
//! The decisions themselves ([`KeyWindow::decide`]) happen on the consumer
//! thread, in `state`.

use crate::ch::ClickHouse;
use crate::config::{KafkaConfig, KeyDedup, Route};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset as KOffset, TopicPartitionList};
use sluice_core::dedup::{KeyHash, KeyWindow};
use sluice_core::Offset;
use std::time::Duration;

/// Keys already written, and the record time they count from.
#[derive(Debug, Default)]
pub(super) struct Seeds {
    pub keys: Vec<KeyHash>,
    pub at_ms: i64,
}

/// A fresh window for a route, loaded with `seeds`.
pub(super) fn window(d: &KeyDedup, seeds: Option<&Seeds>) -> KeyWindow {
    match seeds {
        Some(s) => KeyWindow::rebuilt(d.window, d.max_keys, s.keys.iter().copied(), s.at_ms),
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
) -> anyhow::Result<Option<Seeds>> {
    let (Some(d), Some(w)) = (&route.dedup, watermark) else {
        return Ok(None);
    };
    let (kafka, topic, window) = (kafka.clone(), route.topic.clone(), d.window);
    let (at_ms, from) =
        tokio::task::spawn_blocking(move || window_start(&kafka, &topic, partition, w, window))
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
    Ok(Some(Seeds { keys, at_ms }))
}

/// The timestamp of the record at `watermark`, and the first offset whose
/// timestamp is within `window` before it.
fn window_start(
    k: &KafkaConfig,
    topic: &str,
    partition: i32,
    watermark: Offset,
    window: Duration,
) -> anyhow::Result<(i64, Offset)> {
    let mut cc = k.client_config();
    cc.set("group.id", format!("{}-lookup", k.group_id))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "100")
        .set("enable.partition.eof", "false");
    let c: BaseConsumer = cc.create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, KOffset::Offset(watermark.0))?;
    c.assign(&tpl)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let at_ms = loop {
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) if m.offset() >= watermark.0 => {
                break m.timestamp().to_millis().unwrap_or(0);
            }
            Some(Err(e)) => tracing::debug!(error = %e, "reading the watermark record"),
            _ => {}
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!(
                "cannot read {topic}[{partition}]@{} to rebuild the key dedup window",
                watermark.0
            );
        }
    };
    let since = at_ms.saturating_sub(window.as_millis() as i64).max(0);
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
