//! Key-level dedup in `sluice run`: copies of a record made before Kafka (a
//! producer retry, a manual re-send: same key, new offset) are dropped
//! within the window, also across a kill -9 and restart, which rebuilds the
//! window from the table; without `dedup_key` they land.

use crate::harness::*;
use std::time::Duration;

const PARTITIONS: i32 = 2;

async fn settle(table: &str, group: &str, topic: &str, want: u64) -> Landed {
    let (l, _) = stack()
        .quiesce(
            table,
            (group, topic, PARTITIONS),
            want,
            Duration::from_secs(3),
            Duration::from_secs(120),
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    Landed {
        rows: l.rows,
        distinct_offsets: l.distinct_offsets,
        distinct_ids: l.distinct_ids,
    }
}

fn produce_async(topic: &str, start: u64, n: u64) -> tokio::task::JoinHandle<()> {
    let t = topic.to_string();
    // Record i always goes to partition i % PARTITIONS: the key decides it.
    tokio::task::spawn_blocking(move || produce(&t, PARTITIONS, start, n))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_dedup_drops_copies_also_across_a_restart() {
    let (topic, table, ch) = setup("dedup_on", PARTITIONS, 0).await;
    produce_async(&topic, 0, 1000).await.unwrap();
    produce_async(&topic, 0, 100).await.unwrap(); // a retry table re-sent 100
    let mut spec = SinkSpec::new(&topic, &table);
    spec.dedup_key = Some("id".into());
    let mut sink = spec.start();
    let got = settle(&table, &spec.group, &topic, 1000).await;
    assert_eq!(
        (got.rows, got.distinct_ids),
        (1000, 1000),
        "{}",
        sink.log_tail()
    );

    // kill -9, more copies arrive while it is down, then a restart: the
    // window comes back from the table.
    sink.kill9();
    produce_async(&topic, 500, 200).await.unwrap();
    produce_async(&topic, 1000, 300).await.unwrap(); // new keys
    let mut sink = spec.start();
    let got = settle(&table, &spec.group, &topic, 1300).await;
    assert!(sink.stop(Duration::from_secs(30)), "{}", sink.log_tail());
    assert_eq!(
        (got.rows, got.distinct_ids),
        (1300, 1300),
        "{}",
        sink.log_tail()
    );
    assert_eq!(missing_ids(&ch, &table, 1300).await, 0);
    let log = std::fs::read_to_string(&sink.log).unwrap();
    assert!(log.contains("rebuilt the key dedup window"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_key_dedup_the_copies_land() {
    let (topic, table, ch) = setup("dedup_off", PARTITIONS, 0).await;
    produce_async(&topic, 0, 1000).await.unwrap();
    produce_async(&topic, 0, 100).await.unwrap();
    let spec = SinkSpec::new(&topic, &table);
    let mut sink = spec.start();
    let got = settle(&table, &spec.group, &topic, 1000).await;
    assert!(sink.stop(Duration::from_secs(30)), "{}", sink.log_tail());
    // Exactly once per offset: the 100 copies are new offsets, so they land.
    assert_eq!(
        (got.rows, got.distinct_offsets, got.distinct_ids),
        (1100, 1100, 1000)
    );
    assert_eq!(missing_ids(&ch, &table, 1000).await, 0);

    // `sluice audit` sees them and names the entry point.
    let out = run(&mut sluice([
        "audit", "--table", &table, "--key", "id", "--json",
    ]));
    assert_eq!(out.code, 1, "duplicates found");
    let r: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(r["producer_side_rows"], 100, "{r}");
    assert_eq!(r["sink_replay_rows"], 0, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resend_sends_only_the_records_the_table_lacks() {
    let (topic, table, ch) = setup("resend", PARTITIONS, 0).await;
    produce_async(&topic, 0, 1000).await.unwrap();
    let spec = SinkSpec::new(&topic, &table);
    let mut sink = spec.start();
    settle(&table, &spec.group, &topic, 1000).await;
    // A retry table's export: ids 500..1500, half of which landed.
    let dir = std::env::temp_dir().join(unique("resend"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("retry-table.jsonl");
    let text: String = (500..1500)
        .map(|i| format!("{{\"id\":{i},\"payload\":\"again\"}}\n"))
        .collect();
    std::fs::write(&file, text).unwrap();
    let resend = |dry: bool| {
        let mut cmd = sluice([
            "resend",
            "--table",
            &table,
            "--key-field",
            "id",
            "--topic",
            &topic,
        ]);
        cmd.arg("--retry-file").arg(dir.join("retry.jsonl"));
        if dry {
            cmd.arg("--dry-run");
        }
        cmd.arg(&file).output().unwrap()
    };
    let dry = resend(true);
    let err = String::from_utf8_lossy(&dry.stderr);
    assert!(dry.status.success(), "{err}");
    assert!(err.contains("1000 read, 500 already in"), "{err}");
    assert_eq!(String::from_utf8_lossy(&dry.stdout).lines().count(), 500);
    let real = resend(false);
    let err = String::from_utf8_lossy(&real.stderr);
    assert!(real.status.success(), "{err}");
    assert!(err.contains("500 sent"), "{err}");
    let got = settle(&table, &spec.group, &topic, 1500).await;
    assert!(sink.stop(Duration::from_secs(30)), "{}", sink.log_tail());
    assert_eq!((got.rows, got.distinct_ids), (1500, 1500));
    assert_eq!(missing_ids(&ch, &table, 1500).await, 0);
}

/// Key dedup after a rejection (issue 11, item 3): a copy ClickHouse
/// rejects into the DLQ does not stand for its key, so the corrected record
/// that follows lands: whether it comes in the same batch as the rejected
/// copy (`rows_per_batch` 100) or in a later one while the rejected copy is
/// still in flight or already settled (1 row a batch). Copies of a key whose
/// row is stored are still dropped.
async fn a_rejected_copy_does_not_hide_its_key(rows_per_batch: usize) {
    let topic = unique("dedup_reject");
    let dlq_topic = unique("dedup_reject_dlq");
    create_topic(&topic, 1).await;
    create_topic(&dlq_topic, 1).await;
    let ch = ch();
    let db = unique("it");
    exec(&ch, &format!("CREATE DATABASE IF NOT EXISTS {db}")).await;
    let table = format!("{db}.events");
    exec(
        &ch,
        &format!(
            "CREATE TABLE {table} (id UInt64, n UInt64,
                _topic LowCardinality(String), _partition UInt32, _offset UInt64)
             ENGINE = MergeTree ORDER BY (_topic, _partition, _offset)
             SETTINGS non_replicated_deduplication_window = 0"
        ),
    )
    .await;
    // 1 bad, 2 good, 1 corrected, 2 again (a retry), 3 bad, 3 bad again,
    // 3 corrected, 3 again.
    let values: Vec<Option<String>> = [
        r#"{"id":1,"n":"not-a-number"}"#,
        r#"{"id":2,"n":2}"#,
        r#"{"id":1,"n":1}"#,
        r#"{"id":2,"n":2}"#,
        r#"{"id":3,"n":"x"}"#,
        r#"{"id":3,"n":"y"}"#,
        r#"{"id":3,"n":3}"#,
        r#"{"id":3,"n":3}"#,
    ]
    .iter()
    .map(|v| Some(v.to_string()))
    .collect();
    let (b, t) = (brokers(), topic.clone());
    tokio::task::spawn_blocking(move || sluice_lab::poison::produce(&b, &t, 1, &values))
        .await
        .unwrap()
        .unwrap();
    let mut spec = SinkSpec::new(&topic, &table);
    spec.dedup_key = Some("id".into());
    spec.dlq_topic = Some(dlq_topic.clone());
    spec.max_batch_rows = rows_per_batch;
    let mut sink = spec.start();
    let (b, t) = (brokers(), dlq_topic.clone());
    let dlq = tokio::task::spawn_blocking(move || {
        sluice_lab::poison::read_dlq(&b, &t, 3, Duration::from_secs(90))
    })
    .await
    .unwrap()
    .unwrap();
    let mut rows: Vec<(u64, u64, u64)> = Vec::new();
    for _ in 0..60 {
        rows = ch
            .query(&format!(
                "SELECT id, n, _offset FROM {table} ORDER BY _offset"
            ))
            .fetch_all()
            .await
            .unwrap();
        if rows.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Let anything late land before judging.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again: Vec<(u64, u64, u64)> = ch
        .query(&format!(
            "SELECT id, n, _offset FROM {table} ORDER BY _offset"
        ))
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(rows, again);
    assert!(sink.stop(Duration::from_secs(30)), "{}", sink.log_tail());
    assert_eq!(
        rows,
        vec![(2, 2, 1), (1, 1, 2), (3, 3, 6)],
        "{}",
        sink.log_tail()
    );
    let mut offsets: Vec<i64> = dlq.iter().map(|e| e.offset).collect();
    offsets.sort();
    assert_eq!(offsets, vec![0, 4, 5], "{dlq:?}");
    assert!(dlq.iter().all(|e| e.kind == "rejected"), "{dlq:?}");
    // The stop line counts the rows that went to the DLQ.
    let log = std::fs::read_to_string(&sink.log).unwrap();
    let stop = log.lines().rfind(|l| l.contains("stopped")).unwrap_or("");
    assert!(stop.contains("dlq=3"), "{stop}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_copy_does_not_hide_its_key_in_one_batch() {
    a_rejected_copy_does_not_hide_its_key(100).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_copy_does_not_hide_its_key_across_batches() {
    a_rejected_copy_does_not_hide_its_key(1).await;
}

/// Sends `records` (payload, CreateTime in ms) to partition 0 of `topic`.
fn produce_at(topic: &str, records: &[(&str, i64)]) {
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    let producer: ThreadedProducer<DefaultProducerContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    for (payload, ts) in records {
        producer
            .send(
                BaseRecord::<(), str>::to(topic)
                    .payload(payload)
                    .partition(0)
                    .timestamp(*ts),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

/// The rows of each id in `table`, for ids stored more than once.
async fn ids_twice(ch: &clickhouse::Client, table: &str) -> Vec<(u64, u64)> {
    ch.query(&format!(
        "SELECT id, count() FROM {table} GROUP BY id HAVING count() > 1 ORDER BY id"
    ))
    .fetch_all()
    .await
    .unwrap()
}

/// A restart reads again the records from the commit to the table's last
/// row, at a later stream time than they were first judged at. Here (a 1 h
/// window) id 1 at T and id 1 again at T+50 min (dropped), id 2 at
/// T+100 min; the sink dies before it commits anything. The restart judges
/// the second id 1 again: it must be dropped again, though id 1's own time
/// is over a window before the table's last row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_dropped_before_a_restart_is_dropped_again_after_it() {
    for (name, minutes) in [("in order", [0, 50, 100]), ("out of order", [100, 110, 5])] {
        let topic = unique("dedup_replay");
        create_topic(&topic, 1).await;
        let ch = ch();
        let table = create_table(&ch, &unique("it")).await;
        let t0 = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
            - 3 * 3_600_000;
        let at = |m: i64| t0 + m * 60_000;
        let records = [
            (r#"{"id":1,"payload":"first"}"#, at(minutes[0])),
            (r#"{"id":1,"payload":"copy"}"#, at(minutes[1])),
            (r#"{"id":2,"payload":"other"}"#, at(minutes[2])),
        ];
        let t = topic.clone();
        tokio::task::spawn_blocking(move || produce_at(&t, &records))
            .await
            .unwrap();
        let mut spec = SinkSpec::new(&topic, &table);
        spec.dedup_key = Some("id".into());
        // No commit before the kill: the restart reads everything again.
        spec.commit_interval = Duration::from_millis(3_600_000);
        let mut sink = spec.start();
        wait_for(&ch, &table, 2, Duration::from_secs(60)).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        sink.kill9();
        assert_eq!(
            landed(&ch, &table).await.rows,
            2,
            "{name}: {}",
            sink.log_tail()
        );
        let (b, g, t) = (brokers(), spec.group.clone(), topic.clone());
        let commit = tokio::task::spawn_blocking(move || committed(&b, &g, &t))
            .await
            .unwrap();
        assert!(
            commit.is_none_or(|c| c <= 1),
            "{name}: committed {commit:?}"
        );

        spec.commit_interval = Duration::from_millis(1_000);
        let mut sink = spec.start();
        wait_for_log(
            &sink,
            "rebuilt the key dedup window",
            Duration::from_secs(60),
        )
        .await;
        // The replay is three records: give it time to land anything.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let log = sink.log_tail();
        assert!(sink.stop(Duration::from_secs(60)), "{log}");
        assert_eq!(ids_twice(&ch, &table).await, vec![], "{name}: {log}");
        assert_eq!(landed(&ch, &table).await.rows, 2, "{name}: {log}");
    }
}
