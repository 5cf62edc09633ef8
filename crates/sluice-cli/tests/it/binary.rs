//! `sluice run` on Avro and Protobuf routes: records produced by the
//! official Confluent serializers land exactly once in a plain `MergeTree`
//! (no dedup window), across two schema versions, with their values exact;
//! bad records go to the DLQ under their kind; a registry that stops holds
//! only the partitions that need it, and nothing is lost or doubled.

use crate::harness::*;
use crate::registry::{register, registry_url, PrivateRegistry};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use sluice_formats::avro::AvroSchema;
use sluice_formats::wire::write_header;
use sluice_lab::poison::read_dlq;
use std::collections::BTreeSet;
use std::time::Duration;

/// Produces records of `shop.Order` with the official clients
/// (`stack/produce_registry.py`); returns the schema id.
async fn produce_official(topic: &str, format: &str, start: u64, n: u64, version: u8) -> u32 {
    let python = std::env::var("SLUICE_CLIENTS_PYTHON")
        .expect("SLUICE_CLIENTS_PYTHON is not set: the stack is missing (make stack)");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../stack/produce_registry.py"
    );
    let out = tokio::process::Command::new(python)
        .arg(script)
        .args(["--brokers", &brokers(), "--registry", &registry_url()])
        .args(["--topic", topic, "--format", format])
        .args(["--start", &start.to_string(), "--n", &n.to_string()])
        .args(["--version", &version.to_string()])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "produce_registry.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Produces raw values to `partition` of `topic` on `brokers`.
pub(crate) fn produce_raw(brokers: &str, topic: &str, partition: i32, values: &[Vec<u8>]) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    for v in values {
        p.send(
            BaseRecord::<(), [u8]>::to(topic)
                .partition(partition)
                .payload(v),
        )
        .unwrap();
    }
    p.flush(Duration::from_secs(60)).unwrap();
}

async fn orders_table(ch: &clickhouse::Client, avro: bool) -> String {
    let db = unique("bin");
    exec(ch, &format!("CREATE DATABASE {db}")).await;
    let amount = if avro { "amount Decimal(12, 2)," } else { "" };
    exec(
        ch,
        &format!(
            "CREATE TABLE {db}.orders (
                id UInt64, payload String, {amount}
                at DateTime64(3, 'UTC'), note Nullable(String),
                _topic LowCardinality(String), _partition UInt32, _offset UInt64
            ) ENGINE = MergeTree ORDER BY (_topic, _partition, _offset)
            SETTINGS non_replicated_deduplication_window = 0"
        ),
    )
    .await;
    format!("{db}.orders")
}

/// 1500 records under version 1, 1500 under version 2 (a field the table
/// lacks), three bad ones, 1000 more under version 1: every good one lands
/// once with its values, each bad one is in the DLQ under its kind.
async fn official_records_land_exactly(format: &'static str) {
    let topic = unique(&format!("bin_{format}"));
    let dlq = unique("bin_dlq");
    let kafka = stack();
    kafka.create_topic(&topic, 1).await.unwrap();
    kafka.create_topic(&dlq, 1).await.unwrap();
    let ch = ch();
    let avro = format == "avro";
    let table = orders_table(&ch, avro).await;
    let v1 = produce_official(&topic, format, 0, 1500, 1).await;
    let v2 = produce_official(&topic, format, 1500, 1500, 2).await;
    assert_ne!(v1, v2, "version 2 has its own id");
    let mut unknown = Vec::new();
    write_header(0x7fff_fff0, &mut unknown);
    unknown.extend_from_slice(b"\x02\x00");
    let mut cut = Vec::new();
    write_header(v1, &mut cut);
    // Protobuf: indexes [0], then field 1 (id) with its varint cut off.
    cut.extend_from_slice(if avro { b"\x02\x04p" } else { b"\x00\x08" });
    produce_raw(
        &brokers(),
        &topic,
        0,
        &[br#"{"id":1}"#.to_vec(), unknown, cut],
    );
    produce_official(&topic, format, 3000, 1000, 1).await;

    let mut spec = SinkSpec::new(&topic, &table);
    spec.format = format;
    spec.schema_registry = Some(registry_url());
    spec.dlq_topic = Some(dlq.clone());
    spec.max_batch_rows = 700;
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, 4000, Duration::from_secs(120)).await;
    assert_eq!(
        (got.rows, got.distinct_offsets, got.distinct_ids),
        (4000, 4000, 4000),
        "{}",
        sink.log_tail()
    );
    assert_eq!(missing_ids(&ch, &table, 4000).await, 0);

    // The values, exactly: no float on the way, every null kept.
    let (nulls, first, last, notes): (u64, String, String, String) = ch
        .query(&format!(
            "SELECT countIf(note IS NULL), toString(min(at)), toString(max(at)), \
             toString(sum(toUInt64OrZero(substring(ifNull(note, ''), 2)))) FROM {table}"
        ))
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(nulls, (0..4000u64).filter(|i| i % 3 == 0).count() as u64);
    assert_eq!(first, "2024-01-01 00:00:00.000");
    assert_eq!(last, "2024-01-01 00:00:03.999");
    let want: u64 = (0..4000u64).filter(|i| i % 3 != 0).sum();
    assert_eq!(notes, want.to_string());
    if avro {
        let sum: String = ch
            .query(&format!("SELECT toString(sum(amount)) FROM {table}"))
            .fetch_one()
            .await
            .unwrap();
        // Σ i/100 for i < 4000 = 79980.00
        assert_eq!(sum, "79980");
    }
    let payloads: u64 = ch
        .query(&format!(
            "SELECT count() FROM {table} WHERE payload = concat('p', toString(id))"
        ))
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(payloads, 4000);

    let entries = tokio::task::spawn_blocking(move || {
        read_dlq(&brokers(), &dlq, 3, Duration::from_secs(60)).unwrap()
    })
    .await
    .unwrap();
    let kinds: BTreeSet<(i64, String)> =
        entries.iter().map(|e| (e.offset, e.kind.clone())).collect();
    let want: BTreeSet<(i64, String)> = [
        (3000, "not-registry-framed"),
        (3001, "unknown-schema"),
        (3002, "undecodable"),
    ]
    .into_iter()
    .map(|(o, k)| (o, k.to_string()))
    .collect();
    assert_eq!(kinds, want, "{entries:?}");
    sink.stop(Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_from_the_official_serializer_lands_exactly_once_across_schema_versions() {
    official_records_land_exactly("avro").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_from_the_official_serializer_lands_exactly_once_across_schema_versions() {
    official_records_land_exactly("protobuf").await;
}

pub(crate) const SCHEMA_V1: &str = r#"{"type":"record","name":"Event","fields":[{"name":"id","type":"long"},{"name":"payload","type":"string"}]}"#;
pub(crate) const SCHEMA_V2: &str = r#"{"type":"record","name":"Event","fields":[{"name":"id","type":"long"},{"name":"payload","type":"string"},{"name":"extra","type":"int","default":0}]}"#;

/// Records `ids` written with `schema` (registered as `id`); version 2's
/// carry its field `extra`.
pub(crate) fn framed(schema: &str, id: u32, ids: std::ops::Range<u64>) -> Vec<Vec<u8>> {
    let s = AvroSchema::parse(schema, &[]).unwrap();
    let extra = if schema == SCHEMA_V2 {
        r#","extra":1"#
    } else {
        ""
    };
    ids.map(|i| {
        let mut v = Vec::new();
        write_header(id, &mut v);
        v.extend(
            s.from_json(&format!(r#"{{"id":{i},"payload":"p{i}"{extra}}}"#))
                .unwrap(),
        );
        v
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_stopped_mid_run_holds_only_the_partition_that_needs_it() {
    let mut registry = PrivateRegistry::start(None).await;
    let topic = unique("bin_down");
    stack().create_topic(&topic, 2).await.unwrap();
    let subject = format!("{topic}-value");
    let body = |s: &str| serde_json::json!({ "schema": s });
    let v1 = register(&registry.url, None, &subject, body(SCHEMA_V1)).await as u32;
    let v2 = register(&registry.url, None, &subject, body(SCHEMA_V2)).await as u32;
    let ch = ch();
    let table = create_table(&ch, &unique("bin")).await;
    let b = brokers();
    produce_raw(&b, &topic, 0, &framed(SCHEMA_V1, v1, 0..500));
    produce_raw(&b, &topic, 1, &framed(SCHEMA_V1, v1, 500..1000));

    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut spec = SinkSpec::new(&topic, &table);
    spec.format = "avro";
    spec.schema_registry = Some(registry.url.clone());
    spec.metrics_listen = Some(addr.clone());
    spec.max_batch_rows = 200;
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, 1000, Duration::from_secs(90)).await;
    assert_eq!(got.distinct_offsets, 1000, "{}", sink.log_tail());

    // The registry dies. Partition 0 gets records under version 2, which
    // this process has not seen; partition 1 more under version 1.
    registry.stop();
    produce_raw(&b, &topic, 0, &framed(SCHEMA_V2, v2, 1000..1300));
    produce_raw(&b, &topic, 1, &framed(SCHEMA_V1, v1, 1300..1600));
    let got = wait_for(&ch, &table, 1300, Duration::from_secs(60)).await;
    assert_eq!(got.distinct_offsets, 1300, "{}", sink.log_tail());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let held = landed(&ch, &table).await;
    assert_eq!(
        (held.rows, held.distinct_offsets),
        (1300, 1300),
        "partition 0 went on without its schema: {}",
        sink.log_tail()
    );
    assert!(sink.is_running(), "{}", sink.log_tail());
    let (_, m) = get(&addr, "/metrics").await;
    assert!(
        crate::metrics::value(&m, "sluice_schema_fetch_errors_total{kind=\"unavailable\"}") >= 1.0,
        "{m}"
    );

    // It comes back: partition 0 goes on from where it stopped.
    registry.restart().await;
    let got = wait_for(&ch, &table, 1600, Duration::from_secs(60)).await;
    assert_eq!(
        (got.rows, got.distinct_offsets, got.distinct_ids),
        (1600, 1600, 1600),
        "{}",
        sink.log_tail()
    );
    assert_eq!(missing_ids(&ch, &table, 1600).await, 0);
    sink.stop(Duration::from_secs(30));
}
