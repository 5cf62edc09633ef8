//! Raw broker fetch rate: how fast one librdkafka consumer can read a topic
//! when it does nothing with the records. The ceiling for any Kafka sink.
//!
//! `cargo run --release --example raw_fetch -- TOPIC [QUEUED_KB]`
//!
//! Data flow: metadata → the topic's partitions and their high watermarks →
//! assign every partition at its low watermark → poll a BaseConsumer,
//! counting records and payload bytes, until each partition's position
//! reaches the high watermark read at start → print one JSON line
//! `{"records":…,"bytes":…,"seconds":…,"first_record_seconds":…}` on stdout. The clock starts before
//! the consumer is created, as a sink's would. Every 500 ms a progress line
//! `{"t":…,"records":…}` goes to stderr. Fetch properties mirror
//! `sluice run` (read_committed, `queued.max.messages.kbytes`, the rest
//! librdkafka defaults); no group, no commits.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::time::{Duration, Instant};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let Some(topic) = args.get(1) else {
        anyhow::bail!("usage: raw_fetch TOPIC [MAX_BUFFERED_BYTES]");
    };
    // As `sluice run` with this max_buffered_bytes: a quarter (1..=64 MiB)
    // for librdkafka's prefetch queue.
    let max_buffered: u64 = args.get(2).map_or(Ok(128 << 20), |s| s.parse())?;
    let queued_kb = (max_buffered / 4).clamp(1 << 20, 64 << 20) / 1024;
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:19092".into());

    let started = Instant::now();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", format!("raw-fetch-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("queued.max.messages.kbytes", queued_kb.to_string())
        .set("enable.partition.eof", "false")
        .create()?;

    let timeout = Duration::from_secs(10);
    let md = consumer.fetch_metadata(Some(topic), timeout)?;
    let parts: Vec<i32> = md
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    anyhow::ensure!(!parts.is_empty(), "topic {topic} has no partitions");
    let mut end: HashMap<i32, i64> = HashMap::new();
    let mut tpl = TopicPartitionList::new();
    for &p in &parts {
        let (low, high) = consumer.fetch_watermarks(topic, p, timeout)?;
        if high > low {
            end.insert(p, high);
            tpl.add_partition_offset(topic, p, Offset::Offset(low))?;
        }
    }
    consumer.assign(&tpl)?;

    let (mut records, mut bytes) = (0u64, 0u64);
    let mut next_report = Instant::now();
    let mut first: Option<f64> = None;
    while !end.is_empty() {
        if Instant::now() >= next_report {
            let t = started.elapsed().as_secs_f64();
            eprintln!("{}", serde_json::json!({ "t": t, "records": records }));
            next_report += Duration::from_millis(500);
        }
        match consumer.poll(Duration::from_millis(500)) {
            None => {}
            Some(Err(e)) => anyhow::bail!("fetch failed: {e}"),
            Some(Ok(m)) => {
                first.get_or_insert_with(|| started.elapsed().as_secs_f64());
                records += 1;
                bytes += m.payload().map_or(0, |p| p.len()) as u64;
                let p = m.partition();
                if end.get(&p).is_some_and(|&h| m.offset() + 1 >= h) {
                    end.remove(&p);
                }
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "records": records, "bytes": bytes, "seconds": seconds, "first_record_seconds": first
        })
    );
    Ok(())
}
