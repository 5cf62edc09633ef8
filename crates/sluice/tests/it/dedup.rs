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
    spec.dedup_key = Some("id");
    let _keepalive = keepalive(&spec.group).await;
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
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["audit", "--table", &table, "--key", "id", "--json"])
        .env("CLICKHOUSE_URL", clickhouse_url())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "duplicates found");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
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
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.args([
            "resend",
            "--table",
            &table,
            "--key-field",
            "id",
            "--topic",
            &topic,
        ])
        .arg("--retry-file")
        .arg(dir.join("retry.jsonl"))
        .env("CLICKHOUSE_URL", clickhouse_url())
        .env("KAFKA_BROKERS", brokers());
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
