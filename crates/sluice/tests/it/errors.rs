//! Bad input and bad configuration end in a clear error, never a panic,
//! a silent drop or lost data.

use crate::harness::*;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_table_is_named() {
    let topic = unique("notable");
    create_topic(&topic, 1).await;
    let sink = SinkSpec::new(&topic, "nowhere.nothing").start();
    let (code, log) = exit_of(sink, Duration::from_secs(60));
    assert_eq!(code, Some(2));
    assert!(
        log.contains("table nowhere.nothing") && log.contains("does not exist"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_metadata_column_is_named() {
    let topic = unique("nocol");
    create_topic(&topic, 1).await;
    let ch = ch();
    let db = unique("it");
    exec(&ch, &format!("CREATE DATABASE {db}")).await;
    exec(
        &ch,
        &format!("CREATE TABLE {db}.t (id UInt64, _topic String, _partition UInt32) ENGINE = MergeTree ORDER BY id"),
    )
    .await;
    let sink = SinkSpec::new(&topic, &format!("{db}.t")).start();
    let (code, log) = exit_of(sink, Duration::from_secs(60));
    assert_eq!(code, Some(2));
    assert!(
        log.contains("lacks the metadata column(s) _offset"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_clickhouse_is_named() {
    let topic = unique("noch");
    create_topic(&topic, 1).await;
    let mut spec = SinkSpec::new(&topic, "db.t");
    let port = free_port();
    spec.clickhouse_url = format!("http://127.0.0.1:{port}");
    let (code, log) = exit_of(spec.start(), Duration::from_secs(60));
    assert_eq!(code, Some(2));
    assert!(
        log.contains(&format!("cannot use ClickHouse at http://127.0.0.1:{port}")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_kafka_is_named() {
    let ch = ch();
    let table = create_table(&ch, &unique("it")).await;
    let port = free_port();
    let mut spec = SinkSpec::new("nowhere", &table);
    spec.brokers = format!("127.0.0.1:{port}");
    let (code, log) = exit_of(spec.start(), Duration::from_secs(90));
    assert_eq!(code, Some(2));
    assert!(
        log.contains(&format!("cannot reach Kafka at 127.0.0.1:{port}")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_record_stops_with_its_position_and_keeps_the_rest() {
    let topic = unique("poison");
    create_topic(&topic, 1).await;
    let ch = ch();
    let table = create_table(&ch, &unique("it")).await;
    produce(&topic, 1, 0, 100);
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    producer
        .send(
            BaseRecord::<(), str>::to(&topic)
                .payload("{not json")
                .partition(0),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(Duration::from_secs(10)).unwrap();
    drop(producer);
    produce(&topic, 1, 100, 100);

    let (code, log) = exit_of(
        SinkSpec::new(&topic, &table).start(),
        Duration::from_secs(90),
    );
    assert_eq!(code, Some(2));
    assert!(
        log.contains(&format!("record {topic}[0]@100 cannot become a row")),
        "{log}"
    );
    assert!(log.contains("not valid JSON"), "{log}");
    // Everything before the bad record landed, once; nothing after it was skipped past.
    let got = landed(&ch, &table).await;
    assert_eq!(
        got,
        Landed {
            rows: 100,
            distinct_offsets: 100,
            distinct_ids: 100
        }
    );
}

#[test]
fn bad_config_is_named() {
    let dir = std::env::temp_dir().join(unique("badcfg"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sluice.toml");
    std::fs::write(&path, "[sink]\nmax_batch_rows = 0\n[kafka]\nbrokers='x:1'\n[clickhouse]\nurl='http://x'\n[[route]]\ntopic='t'\ntable='t'\n").unwrap();
    let out = run(sluice(["run", "--config"]).arg(&path));
    assert_eq!(out.code, 2);
    let err = out.stderr;
    assert!(
        err.contains("sink.max_batch_rows: expected a positive number, found \"0\""),
        "{err}"
    );
}

/// A backfill whose rows fall into more of the table's partitions than one
/// insert may create parts for (`max_partitions_per_insert_block`, 100 by
/// default): ClickHouse refuses it with code 252 however often it is sent.
/// The sink splits it until each insert stays within the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_over_more_partitions_than_one_insert_takes_lands_whole() {
    let topic = unique("backfill");
    create_topic(&topic, 1).await;
    let ch = ch();
    let db = unique("it");
    exec(&ch, &format!("CREATE DATABASE {db}")).await;
    let table = format!("{db}.days");
    exec(
        &ch,
        &format!(
            "CREATE TABLE {table} (
                id UInt64, payload String, day Date DEFAULT toDate('2026-01-01') + id,
                _topic String, _partition UInt32, _offset UInt64
            ) ENGINE = MergeTree PARTITION BY day ORDER BY (_topic, _partition, _offset)
            SETTINGS non_replicated_deduplication_window = 0"
        ),
    )
    .await;
    // One record per day over 300 days, read as one batch.
    produce(&topic, 1, 0, 300);
    let mut sink = SinkSpec::new(&topic, &table).start();
    let got = wait_for(&ch, &table, 300, Duration::from_secs(90)).await;
    assert_eq!(
        got,
        Landed {
            rows: 300,
            distinct_offsets: 300,
            distinct_ids: 300
        },
        "{}",
        sink.log_tail()
    );
    let days: u64 = ch
        .query(&format!("SELECT uniqExact(day) FROM {table}"))
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(days, 300);
    let log = std::fs::read_to_string(&sink.log).unwrap();
    assert!(log.contains("splitting it"), "{log}");
    assert!(sink.is_running(), "{log}");
}

/// An asynchronous insert into a `Distributed` table is acknowledged before
/// the shards hold the rows, where reconciliation cannot see them: refused
/// at start, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_distributed_table_is_refused() {
    let topic = unique("distributed");
    create_topic(&topic, 1).await;
    let ch = ch();
    let local = create_table(&ch, &unique("it")).await;
    let (db, name) = local.split_once('.').unwrap();
    let table = format!("{db}.spread");
    exec(
        &ch,
        &format!("CREATE TABLE {table} AS {local} ENGINE = Distributed(sluice_test, {db}, {name}, rand())"),
    )
    .await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.settings = vec![("distributed_foreground_insert".into(), "0".into())];
    let (code, log) = exit_of(spec.start(), Duration::from_secs(60));
    assert_eq!(code, Some(2), "{log}");
    let is = format!("table {table} is Distributed: ");
    assert!(
        log.contains(&format!("{is}its inserts would be asynchronous")),
        "{log}"
    );
    // Synchronous, but the fence would not see the shards' inserts.
    spec.settings.clear();
    let (code, log) = exit_of(spec.start(), Duration::from_secs(60));
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains(&format!("{is}the fence must see")), "{log}");
}
