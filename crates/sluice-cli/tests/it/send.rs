//! `sluice send`: every record is either confirmed by the broker or in the
//! retry file, with the reason. Against the stack's Apache Kafka for the
//! plain path; against librdkafka's mock cluster for injected broker
//! errors. Transactions read back under `read_committed` (aborted records
//! never land) are in `broker.rs`, on the real broker.

use crate::harness::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::{ClientConfig, Message};
use sluice::send::input::Line;
use sluice::send::{send, SendError, SendOptions};
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn lines(start: u64, n: u64) -> Vec<Line> {
    (start..start + n)
        .map(|i| Line {
            source: format!("input:{i}"),
            text: format!(r#"{{"id":{i},"payload":"p{i}"}}"#),
        })
        .collect()
}

fn options(brokers: &str, topic: &str) -> SendOptions {
    SendOptions {
        brokers: brokers.into(),
        kafka: None,
        topic: topic.into(),
        key_field: Some("id".into()),
        transactional_id: None,
        transaction_size: 100,
        retry_file: std::env::temp_dir().join(format!("{}.jsonl", unique("retry"))),
        delivery_timeout: Duration::from_secs(30),
        transaction_timeout: Duration::from_secs(60),
        properties: Vec::new(),
        framing: None,
    }
}

/// `(source, error)` of every line of a retry file (none: no file).
fn retried(path: &PathBuf) -> Vec<(String, String)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["source"].as_str().unwrap().to_string(),
                v["sluice_error"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The ids in `topic`, read with `read_committed` until `want` or a timeout.
fn consume_ids(brokers: &str, topic: &str, want: usize) -> Vec<u64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", unique("read"))
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    c.subscribe(&[topic]).unwrap();
    let mut ids = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut idle_since = Instant::now();
    while Instant::now() < deadline {
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let v: serde_json::Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
                ids.push(v["id"].as_u64().unwrap());
                idle_since = Instant::now();
            }
            _ if ids.len() >= want && idle_since.elapsed() > Duration::from_secs(2) => break,
            _ => {}
        }
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_send_confirms_every_record_and_keeps_the_bad_ones() {
    let topic = unique("send");
    create_topic(&topic, 4).await;
    let mut input = lines(0, 1000);
    input.insert(
        10,
        Line {
            source: "input:bad1".into(),
            text: "{not json".into(),
        },
    );
    input.insert(
        20,
        Line {
            source: "input:bad2".into(),
            text: r#"{"no_id":1}"#.into(),
        },
    );
    input.insert(
        30,
        Line {
            source: "input:bad3".into(),
            text: "[1,2]".into(),
        },
    );
    let opts = options(&brokers(), &topic);
    let o = opts.clone();
    let report = tokio::task::spawn_blocking(move || send(&o, &input))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((report.read, report.sent, report.failed), (1003, 1000, 3));
    let r = retried(&opts.retry_file);
    assert_eq!(
        r.iter().map(|x| x.0.as_str()).collect::<Vec<_>>(),
        ["input:bad1", "input:bad2", "input:bad3"]
    );
    assert!(r[0].1.contains("not valid JSON"), "{r:?}");
    assert!(r[1].1.contains("no key field \"id\""), "{r:?}");
    let b = brokers();
    let ids = tokio::task::spawn_blocking(move || consume_ids(&b, &topic, 1000))
        .await
        .unwrap();
    assert_eq!(ids.len(), 1000);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 1000);
}

#[test]
fn transactions_commit_in_chunks_on_the_mock_cluster() {
    let mock = MockCluster::new(3).unwrap();
    mock.create_topic("orders", 4, 3).unwrap();
    let mut opts = options(&mock.bootstrap_servers(), "orders");
    opts.transactional_id = Some(unique("txn"));
    let report = send(&opts, &lines(0, 1000)).unwrap();
    assert_eq!(
        (report.sent, report.failed, report.transactions_committed),
        (1000, 0, 10),
        "{report:?}"
    );
    assert!(retried(&opts.retry_file).is_empty());
    let ids = consume_ids(&mock.bootstrap_servers(), "orders", 1000);
    assert_eq!(ids.len(), 1000);
}

#[test]
fn broker_errors_are_retried_without_duplicates() {
    let mock = MockCluster::new(3).unwrap();
    mock.create_topic("orders", 2, 3).unwrap();
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; 6],
    );
    let opts = options(&mock.bootstrap_servers(), "orders");
    let report = send(&opts, &lines(0, 500)).unwrap();
    assert_eq!((report.sent, report.failed), (500, 0), "{report:?}");
    let ids = consume_ids(&mock.bootstrap_servers(), "orders", 500);
    assert_eq!(
        ids.len(),
        500,
        "the idempotent producer's retries wrote nothing twice"
    );
}

#[test]
fn a_fenced_producer_puts_everything_uncommitted_in_the_retry_file() {
    let mock = MockCluster::new(3).unwrap();
    mock.create_topic("orders", 2, 3).unwrap();
    // The third commit finds the producer fenced (another instance took
    // its transactional.id).
    mock.request_errors(
        RDKafkaApiKey::EndTxn,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED,
        ],
    );
    let mut opts = options(&mock.bootstrap_servers(), "orders");
    opts.transactional_id = Some(unique("txn"));
    let report = send(&opts, &lines(0, 1000)).unwrap();
    assert_eq!(report.transactions_committed, 2, "{report:?}");
    assert_eq!((report.sent, report.failed), (200, 800), "{report:?}");
    assert!(
        report.stopped.as_deref().unwrap_or("").contains("stopped"),
        "{report:?}"
    );
    let r = retried(&opts.retry_file);
    let want: Vec<String> = (200..1000).map(|i| format!("input:{i}")).collect();
    assert_eq!(r.iter().map(|x| x.0.clone()).collect::<Vec<_>>(), want);
}

#[test]
fn records_not_confirmed_in_time_go_to_the_retry_file() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("orders", 1, 1).unwrap();
    mock.broker_down(1).unwrap();
    let mut opts = options(&mock.bootstrap_servers(), "orders");
    opts.delivery_timeout = Duration::from_secs(2);
    let report = send(&opts, &lines(0, 50)).unwrap();
    assert_eq!((report.sent, report.failed), (0, 50), "{report:?}");
    let r = retried(&opts.retry_file);
    assert_eq!(r.len(), 50);
    assert!(r.iter().all(|x| x.1.contains("timed out")), "{r:?}");
    // The retry file reads back as the records themselves.
    let back = sluice::send::input::read_all(&[opts.retry_file.clone()]).unwrap();
    assert_eq!(back.len(), 50);
    assert_eq!(back[7].text, r#"{"id":7,"payload":"p7"}"#);
}

#[test]
fn transaction_timeout_must_cover_the_delivery_timeout() {
    let mut opts = options("127.0.0.1:1", "orders");
    opts.transactional_id = Some("x".into());
    opts.delivery_timeout = Duration::from_secs(120);
    opts.transaction_timeout = Duration::from_secs(60);
    match send(&opts, &lines(0, 1)) {
        Err(SendError::Invalid(m)) => assert!(m.contains("--transaction-timeout"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_reads_stdin_and_exits_1_when_records_are_left_over() {
    use std::io::Write;
    let topic = unique("send_cli");
    create_topic(&topic, 2).await;
    let retry = std::env::temp_dir().join(format!("{}.jsonl", unique("retry")));
    let mut child = sluice([
        "send",
        "--topic",
        &topic,
        "--key-field",
        "id",
        "--retry-file",
    ])
    .arg(&retry)
    .stdin(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut input: String = (0..200).map(|i| format!("{{\"id\":{i}}}\n")).collect();
    input.push_str("\n{\"id\": \"broken\"\nnot json\n");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("202 read, 200 confirmed, 2 in the retry file"),
        "{err}"
    );
    let r = retried(&retry);
    assert_eq!(
        r.iter().map(|x| x.0.as_str()).collect::<Vec<_>>(),
        ["stdin:202", "stdin:203"]
    );
    let b = brokers();
    let ids = tokio::task::spawn_blocking(move || consume_ids(&b, &topic, 200))
        .await
        .unwrap();
    assert_eq!(ids.len(), 200);
}

/// `sluice send --config`: the connection comes from a `sluice run` config
/// file, with its SASL password never printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_connects_as_the_config_file_says() {
    let topic = unique("send_cfg");
    create_topic(&topic, 2).await;
    let dir = std::env::temp_dir().join(unique("send_cfg"));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |cfg: &str, input: &str, extra: &[&str]| {
        let path = dir.join(format!("{}.toml", unique("cfg")));
        std::fs::write(&path, cfg).unwrap();
        let retry = dir.join(format!("{}.jsonl", unique("retry")));
        let mut cmd = sluice(["send", "--topic", &topic, "--key-field", "id", "--config"]);
        cmd.arg(&path)
            .arg("--retry-file")
            .arg(&retry)
            .args(extra)
            .env_remove("KAFKA_BROKERS")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.as_bytes()).unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&retry).unwrap_or_default()
        );
        (out.status.code(), text)
    };
    let rest = "[clickhouse]\nurl = \"http://127.0.0.1:1\"\n\
                [[route]]\ntopic = \"t\"\ntable = \"d.t\"\n";
    let input: String = (0..50).map(|i| format!("{{\"id\":{i}}}\n")).collect();

    // Plain: the brokers are the file's (no --brokers, no KAFKA_BROKERS).
    let plain = format!("[kafka]\nbrokers = \"{}\"\n{rest}", brokers());
    let (code, text) = run(&plain, &input, &[]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("50 read, 50 confirmed, 0 in the retry file"),
        "{text}"
    );
    let b = brokers();
    let t = topic.clone();
    let ids = tokio::task::spawn_blocking(move || consume_ids(&b, &t, 50))
        .await
        .unwrap();
    assert_eq!(ids.len(), 50);

    // SASL, which the local broker does not speak: nothing is confirmed,
    // everything is in the retry file, and the password is nowhere.
    let secret = "s3cret-never-printed";
    let sasl = format!(
        "[kafka]\nbrokers = \"{}\"\n[kafka.sasl]\nmechanism = \"SCRAM-SHA-256\"\n\
         username = \"u\"\npassword = \"{secret}\"\n{rest}",
        brokers()
    );
    let (code, text) = run(
        &sasl,
        &input,
        &["--delivery-timeout", "3s", "--log", "debug"],
    );
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("50 read, 0 confirmed, 50 in the retry file"),
        "{text}"
    );
    assert!(!text.contains(secret), "the password was printed:\n{text}");

    // A bad file is named, with the field.
    let bad = format!(
        "[kafka]\nbrokers = \"{}\"\n[kafka.sasl]\nmechanism = \"MD5\"\n\
         username = \"u\"\npassword = \"{secret}\"\n{rest}",
        brokers()
    );
    let (code, text) = run(&bad, &input, &[]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("kafka.sasl.mechanism"), "{text}");
    assert!(!text.contains(secret), "the password was printed:\n{text}");
    std::fs::remove_dir_all(&dir).ok();
}
