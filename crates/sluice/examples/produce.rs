//! Produces sample order events as JSON lines, for `make demo` and benches.
//!
//! `cargo run --release --example produce -- TOPIC COUNT [PARTITIONS]`
//! creates the topic if needed and sends COUNT records spread over its
//! partitions, with an idempotent producer and `acks=all`.

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(topic), Some(count)) = (args.get(1), args.get(2)) else {
        anyhow::bail!("usage: produce TOPIC COUNT [PARTITIONS]");
    };
    let count: u64 = count.parse()?;
    let partitions: i32 = args.get(3).map_or(Ok(8), |p| p.parse())?;
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:19092".into());

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    let created = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await?;
    for r in created {
        if let Err((t, e)) = r {
            if e != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists {
                anyhow::bail!("creating topic {t}: {e}");
            }
        }
    }

    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "20")
        .set("compression.type", "lz4")
        .create()?;
    let started = Instant::now();
    for i in 0..count {
        let value = format!(
            r#"{{"order_id":{i},"user_id":{},"amount":{}.{:02},"status":"paid","created_at":"2026-11-30 12:00:{:02}.000"}}"#,
            i * 7919 % 100_000,
            i % 500,
            i % 100,
            i % 60
        );
        let mut rec = BaseRecord::<(), str>::to(topic)
            .payload(&value)
            .partition((i % partitions as u64) as i32);
        while let Err((e, r)) = producer.send(rec) {
            if !matches!(
                e,
                rdkafka::error::KafkaError::MessageProduction(
                    rdkafka::types::RDKafkaErrorCode::QueueFull
                )
            ) {
                anyhow::bail!("producing record {i}: {e}");
            }
            rec = r;
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    producer.flush(Duration::from_secs(120))?;
    eprintln!(
        "produced {count} records to {topic} ({partitions} partitions) in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
