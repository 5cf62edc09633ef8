//! The `poison-records` data: good records mixed with every kind of bad one,
//! and the dead-letter topic read back.
//!
//! [`mix`] makes the values (record `i` is bad when `i % every == every - 1`,
//! the kinds taking turns); [`produce`] writes them round-robin over the
//! partitions; [`read_dlq`] reads the whole DLQ topic and returns each
//! record's source coordinates and error kind from its headers. The
//! accounting the lab checks: produced = rows + distinct DLQ sources.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The bad kinds, in turn, and the error kind the DLQ should name.
pub const KINDS: &[&str] = &[
    "not-json",
    "not-object",
    "missing-field",
    "reserved-field",
    "tombstone",
    "too-large",
    "rejected",
];

/// Values larger than this are `too-large` (the scenario's `max_record_bytes`).
pub const MAX_RECORD_BYTES: usize = 2048;

pub struct Mix {
    pub values: Vec<Option<String>>,
    pub good: u64,
    /// Bad records per expected kind.
    pub bad: BTreeMap<&'static str, u64>,
}

/// `n` records, one in `every` bad; good ones are `{"id": i, "payload": …}`
/// and the route requires `id`.
pub fn mix(n: u64, every: u64) -> Mix {
    let pad = "x".repeat(60);
    let mut m = Mix {
        values: Vec::with_capacity(n as usize),
        good: 0,
        bad: BTreeMap::new(),
    };
    for i in 0..n {
        if i % every != every - 1 {
            m.values
                .push(Some(format!(r#"{{"id":{i},"payload":"{pad}"}}"#)));
            m.good += 1;
            continue;
        }
        let kind = KINDS[(i / every) as usize % KINDS.len()];
        let v = match kind {
            "not-json" => Some(format!(r#"{{"id":{i},"payload":"#)),
            "not-object" => Some(format!("[{i}]")),
            "missing-field" => Some(format!(r#"{{"payload":"no id {i}"}}"#)),
            "reserved-field" => Some(format!(r#"{{"id":{i},"_offset":1}}"#)),
            "tombstone" => None,
            "too-large" => Some(format!(
                r#"{{"id":{i},"payload":"{}"}}"#,
                "y".repeat(MAX_RECORD_BYTES)
            )),
            // A string where ClickHouse wants a UInt64: only the server knows.
            _ => Some(format!(r#"{{"id":"n{i}","payload":"wrong type"}}"#)),
        };
        m.values.push(v);
        *m.bad.entry(kind).or_default() += 1;
    }
    m
}

/// Writes `values` to `topic`, record `i` to partition `i % partitions`.
pub fn produce(
    brokers: &str,
    topic: &str,
    partitions: i32,
    values: &[Option<String>],
) -> anyhow::Result<()> {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "20")
        .create()?;
    for (i, v) in values.iter().enumerate() {
        let key = i.to_string();
        let mut rec = BaseRecord::<str, str>::to(topic)
            .key(&key)
            .partition(i as i32 % partitions);
        if let Some(v) = v {
            rec = rec.payload(v);
        }
        let mut rec = rec;
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((e, r)) => {
                    rec = r;
                    tracing::debug!(error = %e, "producer queue full");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(60))?;
    Ok(())
}

/// One DLQ record, as its headers describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DlqEntry {
    pub source_topic: String,
    pub partition: i32,
    pub offset: i64,
    pub kind: String,
    pub reason: String,
}

/// Waits until `topic` (one partition) holds at least `at_least` records,
/// then reads all of it, to the end it has then. Stopping at a count instead
/// would miss records whenever the DLQ holds copies (it is at-least-once).
pub fn read_dlq(
    brokers: &str,
    topic: &str,
    at_least: usize,
    timeout: Duration,
) -> anyhow::Result<Vec<DlqEntry>> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", super::fixture::Stack::unique("dlq_reader"))
        .set("enable.auto.commit", "false")
        .create()?;
    let deadline = Instant::now() + timeout;
    let end = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (_, end) = c.fetch_watermarks(topic, 0, left.max(Duration::from_secs(1)))?;
        if end >= at_least as i64 || Instant::now() >= deadline {
            break end;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut from = TopicPartitionList::new();
    from.add_partition_offset(topic, 0, Offset::Beginning)?;
    c.assign(&from)?;
    let mut out = Vec::new();
    let mut next = 0;
    while next < end {
        anyhow::ensure!(
            Instant::now() < deadline,
            "read {next} of the {end} records of the DLQ {topic} in {timeout:?}"
        );
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = match m {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "reading the DLQ");
                continue;
            }
        };
        next = m.offset() + 1;
        let mut h: BTreeMap<String, String> = BTreeMap::new();
        if let Some(hs) = m.headers() {
            for x in hs.iter() {
                let v = x.value.map(String::from_utf8_lossy).unwrap_or_default();
                h.insert(x.key.to_string(), v.into_owned());
            }
        }
        let get = |k: &str| h.get(k).cloned().unwrap_or_default();
        out.push(DlqEntry {
            source_topic: get("sluice.source.topic"),
            partition: get("sluice.source.partition").parse().unwrap_or(-1),
            offset: get("sluice.source.offset").parse().unwrap_or(-1),
            kind: get("sluice.error.kind"),
            reason: get("sluice.error.reason"),
        });
    }
    Ok(out)
}
