//! Raw insert rate: how fast ClickHouse takes the rows sluice would write,
//! when nothing else happens. The ceiling for any ClickHouse sink.
//!
//! `cargo run --release --example raw_insert -- CONFIG`
//!
//! Data flow: a `sluice run` config file (its first route) → read the
//! route's topic from the low to the high watermark into memory → encode
//! each record with the product's own encoder and cut the rows into the
//! product's batches (per partition, `max_batch_rows` / `max_batch_bytes`)
//! → start the clock → insert the batches with the product's ClickHouse
//! service (its insert settings and, where the mode sends one, its token),
//! `max_concurrent_inserts` at a time → print one JSON line
//! `{"records":…,"bytes":…,"seconds":…,"batches":…,"body_bytes":…}` on
//! stdout. Every 500 ms a progress line `{"t":…,"records":…}` goes to
//! stderr. Reading and encoding happen before the clock starts.

use futures::stream::{self, StreamExt};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset as KOffset, TopicPartitionList};
use sluice::ch::{ClickHouse, InsertRequest, RowFormat};
use sluice::config::{ConfigArgs, Overrides};
use sluice_protocol::token::{insert_token, query_id};
use sluice_protocol::{Batch, BatchBuilder, Offset, PartitionId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Some(path) = std::env::args().nth(1) else {
        anyhow::bail!("usage: raw_insert CONFIG");
    };
    // As `sluice run --config`: the file, the environment, the defaults.
    let args = ConfigArgs {
        config: path.clone().into(),
        brokers: None,
        clickhouse_url: None,
    };
    let cfg = args.load(Overrides::default())?;
    let route = cfg.routes.first().cloned();
    let Some(route) = route else {
        anyhow::bail!("{path} has no [[route]]");
    };
    let (batches, bytes) = read_batches(&cfg, &route)?;
    let records: u64 = batches.iter().map(|b| b.len() as u64).sum();
    let body_bytes: u64 = batches.iter().map(|b| b.bytes() as u64).sum();
    let n_batches = batches.len();

    let mut ch = ClickHouse::connect(
        &cfg.clickhouse,
        cfg.sink.columns.clone(),
        cfg.sink.delivery,
        cfg.sink.limits.max_rows,
    )
    .await?;
    ch.check_table(&route).await?;
    let engine = ch.engine(&route).await?;
    ch.consistent_for(&route.table_ref(), &engine)?;

    let table = route.table_ref();
    let done = AtomicU64::new(0);
    let started = Instant::now();
    let inserts = stream::iter(batches.into_iter().enumerate())
        .map(|(i, batch)| {
            let (ch, table, done) = (&ch, &table, &done);
            async move {
                let token = cfg
                    .sink
                    .delivery
                    .sends_tokens()
                    .then(|| insert_token(&table.sql(), batch.topic(), batch.rows()));
                let qid = match &token {
                    Some(t) => query_id(t, 0),
                    None => format!("raw-insert-{}-{i}", std::process::id()),
                };
                let rows = batch.len() as u64;
                ch.insert(InsertRequest {
                    table: table.clone(),
                    body: batch.body().clone(),
                    token,
                    query_id: qid,
                    deadline_ms: None,
                    format_settings: &[],
                    format: RowFormat::Json,
                })
                .await?;
                done.fetch_add(rows, Ordering::Relaxed);
                anyhow::Ok(())
            }
        })
        .buffer_unordered(cfg.sink.max_concurrent_inserts);
    tokio::pin!(inserts);
    let mut report = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            next = inserts.next() => match next {
                Some(r) => r?,
                None => break,
            },
            _ = report.tick() => {
                let (t, n) = (started.elapsed().as_secs_f64(), done.load(Ordering::Relaxed));
                eprintln!("{}", serde_json::json!({ "t": t, "records": n }));
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "records": records, "bytes": bytes, "seconds": seconds,
            "batches": n_batches,
            "body_bytes": body_bytes
        })
    );
    Ok(())
}

/// The route's topic, encoded and cut as the sink cuts it; with the
/// records' payload bytes.
fn read_batches(
    cfg: &sluice::config::Config,
    route: &sluice::config::Route,
) -> anyhow::Result<(Vec<Batch>, u64)> {
    let mut cc = cfg.kafka.client_config();
    cc.set("group.id", format!("raw-insert-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false");
    let consumer: BaseConsumer = cc.create()?;
    let timeout = Duration::from_secs(10);
    let topic = &route.topic;
    let md = consumer.fetch_metadata(Some(topic), timeout)?;
    let mut end: HashMap<i32, i64> = HashMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in md.topics().iter().flat_map(|t| t.partitions()) {
        let (low, high) = consumer.fetch_watermarks(topic, p.id(), timeout)?;
        if high > low {
            end.insert(p.id(), high);
            tpl.add_partition_offset(topic, p.id(), KOffset::Offset(low))?;
        }
    }
    anyhow::ensure!(!end.is_empty(), "topic {topic} holds no records");
    consumer.assign(&tpl)?;

    let encoder = cfg.encoder(route);
    let now = Instant::now();
    let mut builders: HashMap<i32, BatchBuilder> = HashMap::new();
    let (mut batches, mut bytes) = (Vec::new(), 0u64);
    while !end.is_empty() {
        let m = match consumer.poll(Duration::from_millis(500)) {
            None => continue,
            Some(m) => m?,
        };
        let (partition, offset) = (m.partition(), m.offset());
        bytes += m.payload().map_or(0, <[u8]>::len) as u64;
        let builder = builders.entry(partition).or_insert_with(|| {
            let id = PartitionId {
                topic: topic.clone(),
                partition,
            };
            BatchBuilder::new(id, cfg.sink.limits)
        });
        builder
            .push(Offset(offset), now, |buf| {
                encoder.encode(m.payload(), partition, offset, buf)
            })
            .map_err(|e| anyhow::anyhow!("record {topic}[{partition}]@{offset}: {e}"))?;
        if builder.is_due(now) {
            batches.extend(builder.take());
        }
        if end.get(&partition).is_some_and(|&h| offset + 1 >= h) {
            end.remove(&partition);
        }
    }
    batches.extend(builders.values_mut().filter_map(BatchBuilder::take));
    Ok((batches, bytes))
}
