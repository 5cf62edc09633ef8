//! Where a partition starts, and when it may start inserting (issue 11).
//!
//! - A group whose commits are gone, with `auto_offset_reset = "latest"`:
//!   what ClickHouse holds decides; nothing is skipped.
//! - An owner whose `open` marker cannot be committed inserts nothing.
//! - A consumer that librdkafka declares fatally broken stops the process.

use crate::harness::*;
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use sluice_lab::fixture::Stack;
use sluice_lab::kafka_proxy::ProxiedBroker;
use std::time::{Duration, Instant};

/// Fills `table` with the rows of the records whose ids pass `keep`, among
/// the first `n`, as the sink would have written them: record `i` of a
/// topic produced by [`produce`] is at offset `i / partitions` of partition
/// `i % partitions`.
async fn prefill(
    ch: &clickhouse::Client,
    table: &str,
    topic: &str,
    partitions: u64,
    n: u64,
    keep: &str,
) {
    exec(
        ch,
        &format!(
            "INSERT INTO {table} (id, payload, _topic, _partition, _offset)
             SELECT number, repeat('x', 60), '{topic}', number % {partitions}, intDiv(number, {partitions})
             FROM numbers({n}) WHERE {keep}"
        ),
    )
    .await;
}

/// Rows whose position is not where [`prefill`] assumed records are.
async fn misplaced(ch: &clickhouse::Client, table: &str, partitions: u64) -> u64 {
    ch.query(&format!(
        "SELECT count() FROM {table} WHERE _partition != id % {partitions} OR _offset != intDiv(id, {partitions})"
    ))
    .fetch_one()
    .await
    .unwrap()
}

/// A fresh group (no commits) with `latest`, a table that holds part of the
/// topic already: the sink must fill in the rest, and only the rest.
async fn lost_commits(partitions: i32, keep: &str) -> (Landed, u64, String) {
    let n = 1_000;
    let (topic, table, ch) = setup("lostcommit", partitions, n).await;
    prefill(&ch, &table, &topic, partitions as u64, 500, keep).await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.auto_offset_reset = Some("latest".into());
    spec.fence_wait = Duration::from_millis(500);
    spec.max_batch_rows = 100;
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, n, Duration::from_secs(60)).await;
    // A late duplicate has every chance to show before the count.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = got.max_rows(landed(&ch, &table).await);
    let log = std::fs::read_to_string(&sink.log).unwrap_or_default();
    assert!(sink.stop(Duration::from_secs(30)), "{}", sink.log_tail());
    assert_eq!(misplaced(&ch, &table, partitions as u64).await, 0);
    (got, missing_ids(&ch, &table, n).await, log)
}

/// Issue 11, item 5, as reproduced: offsets 0..=499 in ClickHouse, no
/// commit, `latest`. Before the fix the partition started at 1000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_commits_with_latest_reset_lose_nothing() {
    let (got, missing, log) = lost_commits(1, "1").await;
    assert_eq!(
        (got.distinct_offsets, got.duplicates(), missing),
        (1_000, 0, 0),
        "{got:?}"
    );
    // ClickHouse holds every offset up to its watermark: no re-read.
    let plan = log.lines().find(|l| l.contains("resume plan"));
    assert!(
        plan.is_some_and(|l| l.contains("start=500") && l.contains("check_through=None")),
        "{plan:?}"
    );
}

/// The same with a gap below the watermark (an insert cut short): the
/// partition is read from its beginning and reconciled, the gap filled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_commits_with_a_gap_reconcile_from_the_beginning() {
    // Offsets 100..=119 of partition 1 (odd ids 201..=239) are missing.
    let gap = "NOT (number BETWEEN 200 AND 239 AND number % 2 = 1)";
    let (got, missing, log) = lost_commits(2, gap).await;
    assert_eq!(
        (got.distinct_offsets, got.duplicates(), missing),
        (1_000, 0, 0),
        "{got:?}"
    );
    // Partition 1 has the gap and starts at 0; partition 0 has none.
    let plans: Vec<&str> = log.lines().filter(|l| l.contains("resume plan")).collect();
    assert!(
        plans
            .iter()
            .any(|l| l.contains("start=0") && l.contains("check_through=Some(249)")),
        "{plans:?}"
    );
    assert!(plans.iter().any(|l| l.contains("start=250")), "{plans:?}");
}

/// Issue 11, item 4: a new owner goes active only once its `open` marker is
/// committed, or a later owner could take the previous owner's `clean`
/// marker for the truth and skip the fence. Commits are refused by a proxy
/// in front of a broker of the test's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_insert_while_the_ownership_marker_cannot_be_committed() {
    let ProxiedBroker {
        broker,
        proxy,
        stack: own,
    } = ProxiedBroker::start(&clickhouse_url()).await.unwrap();
    let topic = unique("marker");
    own.create_topic(&topic, 1).await.unwrap();
    let n = 300;
    let o = own.clone();
    let t = topic.clone();
    tokio::task::spawn_blocking(move || o.produce(&t, 1, 0, n))
        .await
        .unwrap()
        .unwrap();
    let ch = ch();
    let table = create_table(&ch, &unique("it")).await;

    proxy.refuse_commits(true);
    let mut spec = SinkSpec::new(&topic, &table);
    spec.brokers = proxy.addr.clone();
    spec.fence_wait = Duration::from_millis(500);
    spec.max_batch_rows = 50;
    let mut sink = spec.start();
    assert!(
        sink.wait_for_log("ownership marker", Duration::from_secs(90))
            .await,
        "no marker commit was tried: {}",
        sink.log_tail()
    );
    // Several tries, all refused: the partition stays paused.
    let deadline = Instant::now() + Duration::from_secs(60);
    while proxy.refused() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = landed(&ch, &table).await;
    let log = std::fs::read_to_string(&sink.log).unwrap_or_default();
    assert_eq!(
        held.rows,
        0,
        "inserted without a committed marker: {}",
        sink.log_tail()
    );
    assert!(!log.contains("partition active"), "{}", sink.log_tail());
    assert!(proxy.refused() >= 3, "refused {}", proxy.refused());
    assert!(sink.is_running(), "{}", sink.log_tail());

    // Commits go through again: the marker, then every record.
    proxy.refuse_commits(false);
    let got = wait_for(&ch, &table, n, Duration::from_secs(120)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = got.max_rows(landed(&ch, &table).await);
    assert_eq!(
        (got.distinct_offsets, got.duplicates()),
        (n, 0),
        "{got:?}: {}",
        sink.log_tail()
    );
    sink.stop(Duration::from_secs(30));
    drop(broker);
}

/// Issue 11, item 8: a static member fenced by another with its
/// `group.instance.id` is a fatal consumer error; the process stops and
/// says why. Here the mock cluster injects the broker's answer,
/// `FENCED_INSTANCE_ID` on a heartbeat, at once; `coordinator.rs` has
/// Apache Kafka's coordinator fence a member that another one replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_static_member_exits_non_zero_naming_the_cause() {
    let mock = MockCluster::new(1).unwrap();
    let topic = unique("fenced");
    mock.create_topic(&topic, 2, 1).unwrap();
    let brokers = mock.bootstrap_servers();
    let own = Stack {
        brokers: brokers.clone(),
        clickhouse_url: clickhouse_url(),
    };
    let t = topic.clone();
    tokio::task::spawn_blocking(move || own.produce(&t, 2, 0, 200))
        .await
        .unwrap()
        .unwrap();
    let ch = ch();
    let table = create_table(&ch, &unique("it")).await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.brokers = brokers;
    spec.instance_id = Some("sluice-0".into());
    spec.fence_wait = Duration::from_millis(500);
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, 200, Duration::from_secs(60)).await;
    assert_eq!(got.distinct_offsets, 200, "{}", sink.log_tail());

    mock.request_errors(
        RDKafkaApiKey::Heartbeat,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while sink.is_running() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let code = sink.exit_code();
    let log = std::fs::read_to_string(&sink.log).unwrap_or_default();
    assert!(
        code.is_some_and(|c| c != 0),
        "exit {code:?}: {}",
        sink.log_tail()
    );
    // sluice's own last word, not only librdkafka's log line.
    assert!(
        log.contains("cannot go on: FencedInstanceId"),
        "{}",
        sink.log_tail()
    );
    assert_eq!(landed(&ch, &table).await.duplicates(), 0);
}
