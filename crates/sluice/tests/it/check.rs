//! `sluice check-config`: a verdict for each end, exit 0 only when all pass,
//! and secrets never in the output.

use crate::harness::*;

fn check(toml: &str) -> (i32, String) {
    let dir = std::env::temp_dir().join(unique("check"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sluice.toml");
    std::fs::write(&path, toml).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["check-config", "--config"])
        .arg(&path)
        .env_remove("KAFKA_BROKERS")
        .env_remove("CLICKHOUSE_URL")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

fn config(brokers: &str, url: &str, topic: &str, table: &str) -> String {
    format!(
        r#"
[kafka]
brokers = "{brokers}"
properties = {{ "sasl.password" = "kafka-s3cret-pw" }}
[clickhouse]
url = "{url}"
password = "ch-s3cret-pw"
[[route]]
topic = "{topic}"
table = "{table}"
dedup_key = ["id"]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_for_both_ends_and_no_secrets() {
    let (topic, table, _ch) = setup("check", 3, 0).await;
    let (code, out) = check(&config(&brokers(), &clickhouse_url(), &topic, &table));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("valid"), "{out}");
    assert!(
        out.contains(&format!("topic {topic}")) && out.contains("3 partition(s)"),
        "{out}"
    );
    assert!(out.contains(&format!("table {table}")), "{out}");
    assert!(!out.contains("FAILED"), "{out}");

    // A missing topic and an unreachable ClickHouse: each named, exit 1.
    let (code, out) = check(&config(
        &brokers(),
        "http://127.0.0.1:1",
        "no_such_topic_x",
        &table,
    ));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("topic no_such_topic_x") && out.contains("does not exist"),
        "{out}"
    );
    assert!(
        out.contains("clickhouse http://127.0.0.1:1") && out.contains("unreachable"),
        "{out}"
    );

    // A table without the dedup key column.
    let (db, _) = table.split_once('.').unwrap();
    exec(&ch(), &format!("CREATE TABLE {db}.nokey (x UInt8, _topic String, _partition UInt32, _offset UInt64) ENGINE = MergeTree ORDER BY x")).await;
    let (code, out) = check(&config(
        &brokers(),
        &clickhouse_url(),
        &topic,
        &format!("{db}.nokey"),
    ));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("dedup_key column(s) id"), "{out}");

    // An invalid file: exit 2, the field named.
    let (code, out) = check("[kafka]\nbrokers = 'a:1'\n[clickhouse]\nurl = 'ftp://x'\n");
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("clickhouse.url"), "{out}");

    for (_, out) in [
        check(&config(&brokers(), &clickhouse_url(), &topic, &table)),
        check(&config("127.0.0.1:1", "http://127.0.0.1:1", &topic, &table)),
    ] {
        assert!(!out.contains("s3cret"), "a secret leaked: {out}");
    }
}
