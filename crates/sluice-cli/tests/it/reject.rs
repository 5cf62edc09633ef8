//! ClickHouse refusing a row: a value its column cannot hold goes to the DLQ
//! as `rejected`, named by the row the server reports, and every other
//! record lands once; the sink never stalls retrying a refusal. A permanent
//! refusal that names no row stops the sink with the cause, as does a
//! reconciliation refused for good.

use crate::harness::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use sluice_lab::poison;
use sluice_lab::proxy::Fault;
use sluice_lab::reject::{self, FAMILIES};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Good records before each bad one, and after the last.
const GOOD_RUN: usize = 3;

async fn create_typed_table(client: &clickhouse::Client) -> String {
    let db = unique("it");
    exec(client, &format!("CREATE DATABASE IF NOT EXISTS {db}")).await;
    exec(client, &reject::table_ddl(&db)).await;
    format!("{db}.typed")
}

/// How many records partition 0 of `topic` holds (its producer is
/// idempotent, not transactional: one offset per record).
fn dlq_len(topic: &str) -> i64 {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let (low, high) = c
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("watermarks of {topic}: {e}"));
    high - low
}

/// The offsets stored in `table`: all of them, and how many distinct.
async fn stored_offsets(client: &clickhouse::Client, table: &str) -> (Vec<u64>, u64) {
    client
        .query(&format!(
            "SELECT arraySort(groupArray(_offset)), uniqExact(_offset) FROM {table}"
        ))
        .fetch_one::<(Vec<u64>, u64)>()
        .await
        .unwrap_or_else(|e| panic!("reading {table}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refused_value_goes_to_the_dlq_and_the_rest_lands_once() {
    let topic = unique("reject");
    let dlq_topic = unique("reject_dlq");
    create_topic(&topic, 1).await;
    create_topic(&dlq_topic, 1).await;
    // GOOD_RUN good records, one bad one per family, …, GOOD_RUN good ones.
    let mut values = Vec::new();
    let mut bad_offsets: Vec<(i64, &'static str)> = Vec::new();
    for f in FAMILIES {
        for _ in 0..GOOD_RUN {
            values.push(Some(reject::record(values.len() as u64, None)));
        }
        bad_offsets.push((values.len() as i64, f.column));
        values.push(Some(reject::record(values.len() as u64, Some(f))));
    }
    for _ in 0..GOOD_RUN {
        values.push(Some(reject::record(values.len() as u64, None)));
    }
    let total = values.len() as i64;
    let bad: BTreeSet<i64> = bad_offsets.iter().map(|b| b.0).collect();
    let good: Vec<u64> = (0..total)
        .filter(|o| !bad.contains(o))
        .map(|o| o as u64)
        .collect();
    let t = topic.clone();
    tokio::task::spawn_blocking(move || poison::produce(&brokers(), &t, 1, &values))
        .await
        .unwrap()
        .unwrap();

    let ch = ch();
    let table = create_typed_table(&ch).await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.dlq_topic = Some(dlq_topic.clone());
    // Several batches, most holding a bad row not at their start.
    spec.max_batch_rows = 10;
    let mut sink = spec.start();

    // The position moves past every record: nothing is retried for ever.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let c = committed(&brokers(), &spec.group, &topic);
        if c == Some(total) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "committed {c:?}, want {total}; {}",
            sink.log_tail()
        );
        assert!(sink.is_running(), "sluice stopped: {}", sink.log_tail());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let (offsets, distinct) = stored_offsets(&ch, &table).await;
    assert_eq!(
        (offsets.len(), distinct),
        (good.len(), good.len() as u64),
        "{}",
        sink.log_tail()
    );
    assert_eq!(offsets, good, "{}", sink.log_tail());

    let n_bad = bad.len();
    let d = dlq_topic.clone();
    let entries = tokio::task::spawn_blocking(move || {
        poison::read_dlq(&brokers(), &d, n_bad, Duration::from_secs(60))
    })
    .await
    .unwrap()
    .unwrap();
    let got: BTreeSet<(i64, String)> = entries.iter().map(|e| (e.offset, e.kind.clone())).collect();
    let want: BTreeSet<(i64, String)> = bad.iter().map(|&o| (o, "rejected".into())).collect();
    assert_eq!(
        got,
        want,
        "families by offset: {bad_offsets:?}; DLQ: {entries:#?}; {}",
        sink.log_tail()
    );
    assert!(
        entries
            .iter()
            .all(|e| e.source_topic == topic && e.partition == 0),
        "{entries:#?}"
    );
    assert!(
        entries
            .iter()
            .all(|e| e.reason.starts_with("ClickHouse error ")),
        "{entries:#?}"
    );
    let enum_at = bad_offsets[0].0;
    assert!(
        entries
            .iter()
            .any(|e| e.offset == enum_at && e.reason.contains("ClickHouse error 691")),
        "{entries:#?}"
    );
    // Each bad record once: the DLQ holds nothing more.
    assert_eq!(dlq_len(&dlq_topic), n_bad as i64);
    assert!(sink.is_running(), "{}", sink.log_tail());
    sink.stop(Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_naming_no_row_stops_the_sink_with_its_cause() {
    let (topic, table, ch) = setup("reject_norow", 1, 50).await;
    let dlq_topic = unique("reject_norow_dlq");
    create_topic(&dlq_topic, 1).await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.dlq_topic = Some(dlq_topic);
    let sink = spec.start();
    let got = wait_for(&ch, &table, 50, Duration::from_secs(60)).await;
    assert_eq!(got.distinct_offsets, 50);

    // The table goes away under the running sink: every insert from now on
    // is refused (UNKNOWN_TABLE), and no row is to blame.
    exec(&ch, &format!("DROP TABLE {table} SYNC")).await;
    let t = topic.clone();
    tokio::task::spawn_blocking(move || produce(&t, 1, 50, 10))
        .await
        .unwrap();
    let (code, log) = tokio::task::spawn_blocking(move || exit_of(sink, Duration::from_secs(90)))
        .await
        .unwrap();
    assert_eq!(code, Some(2), "{log}");
    assert!(
        log.contains("ClickHouse error 60") && log.contains("does not exist"),
        "{log}"
    );
}

/// An insert whose answer is lost, then the table dropped: the
/// reconciliation that must come before the retry is refused for good
/// (UNKNOWN_TABLE). The sink stops naming it, where it used to retry the
/// reconciliation for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciliation_refused_for_good_stops_the_sink_with_its_cause() {
    let (topic, table, ch) = setup("reject_recon", 1, 50).await;
    let proxy = clickhouse_proxy(Duration::from_secs(6)).await;
    proxy.arm(Fault::WithholdResponse);
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = proxy.url.clone();
    spec.insert_timeout = Duration::from_secs(3);
    let sink = spec.start();
    let got = wait_for(&ch, &table, 50, Duration::from_secs(60)).await;
    assert_eq!(got.distinct_offsets, 50);
    // The rows are in; their answer is still held.
    exec(&ch, &format!("DROP TABLE {table} SYNC")).await;
    let (code, log) = tokio::task::spawn_blocking(move || exit_of(sink, Duration::from_secs(120)))
        .await
        .unwrap();
    assert_eq!(proxy.fired(), 1, "{log}");
    assert!(log.contains("insert outcome unknown"), "{log}");
    assert_eq!(code, Some(2), "{log}");
    assert!(
        log.contains("ClickHouse error 60") && log.contains("UNKNOWN_TABLE"),
        "{log}"
    );
}

/// A batch larger than a parallel-parsing segment (10 MiB): a server parsing
/// it in parallel counts `(at row N)` from the start of the segment, not of
/// the body (ClickHouse #34203). The record sent to the DLQ is still exactly
/// the refused one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_row_past_the_first_parsing_segment_is_the_one_sent_to_the_dlq() {
    let topic = unique("segments");
    let dlq_topic = unique("segments_dlq");
    create_topic(&topic, 1).await;
    create_topic(&dlq_topic, 1).await;
    // About 30 MB in one batch; the bad record sits in the third 10 MiB segment.
    let (n, bad) = (60_000u64, 45_000u64);
    let pad = "x".repeat(480);
    let values: Vec<Option<String>> = (0..n)
        .map(|i| match i {
            _ if i == bad => Some(format!(r#"{{"id":"not a number","payload":"{pad}"}}"#)),
            _ => Some(format!(r#"{{"id":{i},"payload":"{pad}"}}"#)),
        })
        .collect();
    let t = topic.clone();
    tokio::task::spawn_blocking(move || poison::produce(&brokers(), &t, 1, &values))
        .await
        .unwrap()
        .unwrap();
    let ch = ch();
    let table = create_table(&ch, &unique("it")).await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.dlq_topic = Some(dlq_topic.clone());
    spec.max_batch_rows = 100_000;
    spec.max_batch_bytes = 40 << 20;
    spec.max_buffered_bytes = 160 << 20;
    spec.insert_timeout = Duration::from_secs(30);
    let mut sink = spec.start();
    let deadline = Instant::now() + Duration::from_secs(240);
    while committed(&brokers(), &spec.group, &topic) != Some(n as i64) {
        assert!(Instant::now() < deadline, "{}", sink.log_tail());
        assert!(sink.is_running(), "sluice stopped: {}", sink.log_tail());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let d = dlq_topic.clone();
    let entries = tokio::task::spawn_blocking(move || {
        poison::read_dlq(&brokers(), &d, 1, Duration::from_secs(60))
    })
    .await
    .unwrap()
    .unwrap();
    let offsets: Vec<i64> = entries.iter().map(|e| e.offset).collect();
    assert_eq!(offsets, vec![bad as i64], "{}", sink.log_tail());
    let got = landed(&ch, &table).await;
    assert_eq!((got.rows, got.distinct_offsets), (n - 1, n - 1));
    assert!(sink.stop(Duration::from_secs(60)), "{}", sink.log_tail());
}

/// An insert whose answer is lost (it committed) and whose query id stays
/// in the process list past the fence's give-up (three insert timeouts and
/// 5 s of kills): here a query the test runs under the attempt's id,
/// which the server cannot interrupt (as a real server cannot while an
/// insert waits on a table lock or a slow body). The fence gives up
/// ("still running after a kill …") and is tried again. Returns whether the
/// sink still ran once that query ended, its log, and what landed after a
/// stop and a restart straight to the server (each row must be there
/// once: nothing of the batch was committed past what is stored).
async fn an_attempt_outliving_the_fence() -> (bool, String, Landed) {
    use sluice_protocol::token::{insert_token, query_id};
    use sluice_protocol::Row;
    let n = 50u64;
    let (topic, table, ch) = setup("reject_longq", 1, n).await;
    let table_sql = sluice::sql::TableRef::parse(&table).unwrap().sql();
    let rows = (0..n as i64).map(|o| Row::new(0, o)).collect::<Vec<_>>();
    let qid = query_id(&insert_token(&table_sql, &topic, rows.into_iter()), 0);
    let proxy = clickhouse_proxy(Duration::from_secs(6)).await;
    proxy.arm(Fault::WithholdResponse);
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = proxy.url.clone();
    spec.insert_timeout = Duration::from_secs(3);
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, n, Duration::from_secs(60)).await;
    assert_eq!(got.distinct_offsets, n);
    assert_eq!(proxy.fired(), 1, "{}", sink.log_tail());
    // The insert committed; its answer is held. Its id runs on, 30 s.
    let long = ch.clone().with_setting("query_id", &qid);
    let sleeper = tokio::spawn(async move {
        long.query("SELECT sleepEachRow(1) FROM numbers(30) SETTINGS max_block_size = 1")
            .execute()
            .await
    });
    let _ = sleeper.await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let running = sink.is_running();
    let log = std::fs::read_to_string(&sink.log).unwrap();
    assert!(log.contains("insert outcome unknown"), "{log}");
    if running {
        assert!(sink.stop(Duration::from_secs(60)), "{}", sink.log_tail());
    }
    // A restart, straight to the server, reconciles the batch.
    spec.clickhouse_url = clickhouse_url();
    let mut next = spec.start();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let got = landed(&ch, &table).await;
    assert!(next.stop(Duration::from_secs(60)), "{}", next.log_tail());
    (running, log, got)
}

/// A lost answer, then the attempt's query still listed after the fence's
/// kills and three insert timeouts: `fence_attempt` gives up, and the
/// reconciliation is retried until the query ends (a wait, not a refusal;
/// the first version of the Reconcile arm's stop took it for one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_outlives_the_fence_is_waited_out() {
    let (running, log, got) = an_attempt_outliving_the_fence().await;
    assert!(running, "the sink stopped:\n{log}");
    assert_eq!((got.rows, got.distinct_offsets), (50, 50), "{got:?}");
}
