//! Records that cannot become rows → the dead-letter topic.
//!
//! In: a [`Letter`]: the record's coordinates, key and value, and why it
//! failed (the encoder refused it, or ClickHouse rejected its row). The
//! batch's writer queues it ([`Dlq::send`]). Out: a [`Pending`] write. The batch that accounts for the record's offset holds
//! its pending writes and counts as done only once they are acknowledged
//! ([`confirm`]), so the committed position never passes a record that is
//! neither a row nor in the DLQ.
//!
//! The producer is idempotent with `acks=all` and retries without a deadline
//! (`message.timeout.ms=0`): while the DLQ cannot be reached the batch stays
//! pending, the position holds, its bytes stay counted as in flight, and
//! fetching pauses once `max_buffered_bytes` is reached. A write that fails
//! for good (record too large for the topic, no permission) stops the sink.
//!
//! Each DLQ record keeps the original key and value and carries headers:
//! `sluice.error.kind`, `sluice.error.reason`, `sluice.source.topic`,
//! `sluice.source.partition`, `sluice.source.offset`, and
//! `sluice.source.timestamp` when known. The DLQ is at-least-once: after a
//! crash a record may be written again; its source headers identify it.

use crate::config::KafkaConfig;
use crate::retry::Delays;
use crate::telemetry;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub(crate) struct Dlq {
    producer: FutureProducer,
    topic: String,
}

/// A record on its way to the DLQ. Owned: the consumer thread builds it
/// and the batch's writer queues it, so a full producer queue never blocks
/// the consumer thread.
#[derive(Debug, Clone)]
pub(crate) struct Letter {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) timestamp: Option<i64>,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) value: Option<Vec<u8>>,
    /// A short name: `not-json`, `missing-field`, `rejected`, …
    pub(crate) kind: &'static str,
    pub(crate) reason: String,
}

impl Letter {
    /// The memory it holds, counted against `max_buffered_bytes`.
    pub(crate) fn bytes(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len)
            + self.value.as_ref().map_or(0, Vec::len)
            + self.reason.len()
            + self.topic.len()
    }
}

/// A DLQ write not yet acknowledged.
pub(crate) struct Pending {
    what: String,
    topic: String,
    kind: &'static str,
    delivery: DeliveryFuture,
}

impl Dlq {
    pub(crate) fn new(k: &KafkaConfig, topic: &str) -> Result<Self, KafkaError> {
        let producer = k
            .client_config()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", "0")
            .set("linger.ms", "5")
            .set("compression.type", "lz4")
            .create()?;
        Ok(Self {
            producer,
            topic: topic.to_string(),
        })
    }

    pub(crate) fn topic(&self) -> &str {
        &self.topic
    }

    /// Queues `l` for the DLQ, waiting while the producer's queue is full;
    /// `None` if `abandon` fired first. An error here means the record
    /// could not even be queued.
    pub(crate) async fn send(
        &self,
        l: &Letter,
        abandon: &CancellationToken,
    ) -> Result<Option<Pending>, KafkaError> {
        let mut delays = Delays::up_to(Duration::from_millis(10), Duration::from_millis(50));
        loop {
            match self.try_send(l) {
                Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)) => {
                    if !delays.wait(abandon).await {
                        return Ok(None);
                    }
                }
                other => return other.map(Some),
            }
        }
    }

    /// One try at queueing `l`.
    fn try_send(&self, l: &Letter) -> Result<Pending, KafkaError> {
        let partition = l.partition.to_string();
        let offset = l.offset.to_string();
        let ts = l.timestamp.map(|t| t.to_string());
        let mut headers = OwnedHeaders::new_with_capacity(6)
            .insert(header("sluice.error.kind", l.kind))
            .insert(header("sluice.error.reason", &l.reason))
            .insert(header("sluice.source.topic", &l.topic))
            .insert(header("sluice.source.partition", &partition))
            .insert(header("sluice.source.offset", &offset));
        if let Some(ts) = &ts {
            headers = headers.insert(header("sluice.source.timestamp", ts));
        }
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&self.topic).headers(headers);
        if let Some(k) = &l.key {
            record = record.key(k);
        }
        if let Some(v) = &l.value {
            record = record.payload(v);
        }
        if let Some(t) = l.timestamp {
            record = record.timestamp(t);
        }
        match self.producer.send_result(record) {
            Ok(delivery) => Ok(Pending {
                what: format!("{}[{}]@{}", l.topic, l.partition, l.offset),
                topic: l.topic.clone(),
                kind: l.kind,
                delivery,
            }),
            Err((e, _)) => Err(e),
        }
    }
}

fn header<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
    Header {
        key,
        value: Some(value),
    }
}

/// Why a record that cannot become a row could not be put in the DLQ
/// either: the sink stops rather than skip it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DlqError {
    #[error("{what} {why}, and no DLQ topic is configured")]
    NoTopic { what: String, why: String },
    #[error("{what} {why}, and it cannot be queued for the DLQ topic {topic:?}")]
    Queue {
        what: String,
        why: String,
        topic: String,
        #[source]
        source: KafkaError,
    },
    #[error("writing {what} to the DLQ topic {topic:?} failed")]
    Write {
        what: String,
        topic: String,
        #[source]
        source: KafkaError,
    },
    #[error("the DLQ producer went away before {what} was written")]
    Gone { what: String },
}

/// Waits until every write in `pending` is acknowledged. `Ok(false)` if
/// `abandon` fired first; `Err` names the record whose write failed.
pub(crate) async fn confirm(
    pending: Vec<Pending>,
    dlq_topic: &str,
    abandon: &CancellationToken,
) -> Result<bool, DlqError> {
    for p in pending {
        let mut delivery = p.delivery;
        let mut waited = Duration::ZERO;
        let step = Duration::from_secs(30);
        let result = loop {
            tokio::select! {
                r = &mut delivery => break r,
                _ = abandon.cancelled() => return Ok(false),
                _ = tokio::time::sleep(step) => {
                    waited += step;
                    tracing::warn!(
                        record = %p.what,
                        dlq = dlq_topic,
                        waited = ?waited,
                        "the DLQ has not acknowledged this record; holding the position until it does"
                    );
                }
            }
        };
        match result {
            Ok(Ok(_)) => telemetry::dlq_written(&p.topic, p.kind),
            Ok(Err((source, _))) => {
                return Err(DlqError::Write {
                    what: p.what,
                    topic: dlq_topic.into(),
                    source,
                })
            }
            Err(_) => return Err(DlqError::Gone { what: p.what }),
        }
    }
    Ok(true)
}
