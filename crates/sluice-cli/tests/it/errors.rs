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

/// The same refusal, for one batch of a route's four partitions: the sink
/// splits it into shares of fewer rows; a partition whose rows a stored
/// share holds is settled at once, ahead of the rest of its batch (a
/// revoked one would hand off without waiting for the others). Every row
/// lands once and every partition's commit reaches its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_batch_of_four_partitions_settles_each_as_its_rows_land() {
    let topic = unique("backfill4");
    create_topic(&topic, 4).await;
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
    // 300 days, 75 to each partition, read as one batch of the route.
    produce(&topic, 4, 0, 300);
    let mut spec = SinkSpec::new(&topic, &table);
    spec.max_batch_age = Duration::from_secs(3);
    let mut sink = spec.start();
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
    let log = std::fs::read_to_string(&sink.log).unwrap();
    assert!(log.contains("splitting it"), "{log}");
    assert!(
        log.contains("durable ahead of the rest of its batch"),
        "{log}"
    );
    assert!(sink.stop(Duration::from_secs(30)), "{}", sink.log_tail());
    for p in 0..4 {
        assert_eq!(
            committed_in(&spec.brokers, &spec.group, &topic, p),
            Some(75),
            "partition {p}"
        );
    }
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

/// Answers from something in front of the server, without a ClickHouse
/// code, are classified by what a retry can fix. Each of these answers one
/// insert that never reaches the server: a gateway's 502, 503 and 504 pages
/// are retried like a refused connection, a 200 whose body carries an
/// exception is a failure (its rows would be missing if it counted as
/// stored), and a 413 of a body limit splits the batch. Every record lands
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_from_in_front_of_the_server_are_retried_or_split() {
    let html = "Content-Type: text/html";
    let answers: [(u16, &[&str], &str); 6] = [
        (502, &[html], "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"),
        (503, &[html], "<html><body><h1>503 Service Unavailable</h1>\nNo server is available to handle this request.\n</body></html>\n"),
        (504, &[html], "<html><head><title>504 Gateway Time-out</title></head><body><h1>504 Gateway Time-out</h1></body></html>\n"),
        (503, &["Content-Type: text/plain"], "upstream connect error or disconnect/reset before headers. reset reason: connection failure"),
        (200, &["X-ClickHouse-Format: JSONEachRow"], "Code: 241. DB::Exception: Memory limit (total) exceeded: would use 9.31 GiB (attempt to allocate chunk of 4194304 bytes), maximum: 9.31 GiB. (MEMORY_LIMIT_EXCEEDED) (version 25.3.2.39 (official build))\n"),
        (413, &[html], "<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n<center><h1>413 Request Entity Too Large</h1></center>\r\n</body>\r\n</html>\r\n"),
    ];
    let round = 400;
    let (topic, table, ch) = setup("gateway", 1, 0).await;
    let proxy = clickhouse_proxy(Duration::from_secs(5)).await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = proxy.url.clone();
    let mut sink = spec.start();
    for (i, (status, headers, body)) in answers.iter().enumerate() {
        let i = i as u64;
        proxy.answer_next_insert(*status, headers, body);
        produce(&topic, 1, i * round, round);
        let got = wait_for(&ch, &table, (i + 1) * round, Duration::from_secs(60)).await;
        assert_eq!(
            got.rows,
            (i + 1) * round,
            "{status}: {got:?}\n{}",
            sink.log_tail()
        );
        assert_eq!(proxy.fired(), i as u32 + 1, "{status} was never given");
    }
    let log = sink.log_tail();
    assert!(sink.stop(Duration::from_secs(60)), "{log}");
    assert!(
        log.contains("splitting it"),
        "the 413 split no batch: {log}"
    );
    let got = landed(&ch, &table).await;
    let n = round * answers.len() as u64;
    assert_eq!((got.rows, got.distinct_offsets), (n, n), "{got:?}");
}

/// Any other 4xx from something in front of the server (here nginx's 403
/// page) is not something a retry fixes: the sink stops with the status and
/// the start of the body, and lands nothing of that batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateways_other_refusal_stops_the_sink_with_its_status() {
    let (topic, table, ch) = setup("gateway403", 1, 100).await;
    let proxy = clickhouse_proxy(Duration::from_secs(5)).await;
    proxy.answer_next_insert(
        403,
        &["Content-Type: text/html"],
        "<html>\r\n<head><title>403 Forbidden</title></head>\r\n<body>\r\n<center><h1>403 Forbidden</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n",
    );
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = proxy.url.clone();
    let (code, log) = exit_of(spec.start(), Duration::from_secs(90));
    assert_eq!(code, Some(2), "{log}");
    assert!(
        log.contains("HTTP 403 from something in front of ClickHouse"),
        "{log}"
    );
    assert!(log.contains("<title>403 Forbidden</title>"), "{log}");
    assert_eq!(landed(&ch, &table).await.rows, 0);
    assert_eq!(proxy.fired(), 1);
}
