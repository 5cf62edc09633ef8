//! A partition moving between two live sinks while its inserts are slow.
//!
//! Owner A's inserts take 4 s each (a proxy holds every INSERT before
//! forwarding it). Sink B joins and the group moves one of A's two
//! partitions to it. A lets go at once, without waiting on the consumer
//! thread; its inserts finish off it, under A's lease, and A then marks
//! the partition clean. B claimed the partition and is fencing (60 s); it
//! sees the mark and takes the partition well before its fence would end.
//! Every record lands once, on a plain `MergeTree`.

use crate::harness::*;
use sluice_lab::proxy::Proxy;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_partition_is_handed_over_clean_once_its_slow_inserts_end() {
    let (topic, table, ch) = setup("slowhand", 2, 400).await;
    let upstream = Proxy::upstream_of(&clickhouse_url());
    let proxy = Proxy::start(upstream, Duration::from_secs(30))
        .await
        .unwrap();
    let mut spec = SinkSpec::new(&topic, &table);
    spec.insert_timeout = Duration::from_secs(10);
    // A 10 s lease; the fence is far longer than the hand-off may take.
    spec.fence_wait = Duration::from_millis(60_000);
    spec.max_batch_rows = 50;
    let mut a_spec = spec.clone();
    a_spec.clickhouse_url = proxy.url.clone();
    let a = a_spec.start();
    let got = wait_for(&ch, &table, 400, Duration::from_secs(120)).await;
    assert_eq!(got.distinct_offsets, 400, "A alone: {}", a.log_tail());

    proxy.slow_inserts(Duration::from_secs(4));
    let t = topic.clone();
    tokio::task::spawn_blocking(move || produce(&t, 2, 400, 400))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let mut b = spec.start();
    let got = wait_for(&ch, &table, 800, Duration::from_secs(120)).await;
    let took = started.elapsed();
    // Any insert of A's still on its way has time to show.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let got = got.max_rows(landed(&ch, &table).await);
    let (log_a, log_b) = (
        std::fs::read_to_string(&a.log).unwrap_or_default(),
        std::fs::read_to_string(&b.log).unwrap_or_default(),
    );
    assert_eq!(
        (got.distinct_offsets, got.duplicates()),
        (800, 0),
        "A: {log_a}\nB: {log_b}"
    );
    assert!(proxy.fired() > 0, "no insert was slowed");
    assert!(log_a.contains("revoked"), "nothing moved: A: {log_a}");
    assert!(
        log_b.contains("marked the partitions clean during the fence"),
        "B did not see A's clean mark while fencing: B: {log_b}\nA: {log_a}"
    );
    assert!(
        took < Duration::from_secs(45),
        "the hand-off took {took:?}, as long as a fence: B: {log_b}"
    );
    b.stop(Duration::from_secs(30));
}

/// The group takes a partition from A and gives it back while A's earlier
/// inserts of it are still queued (a plain consumer joins the group for a
/// few seconds, then leaves). The partition's new generation in A must
/// stop the old one before it claims the partition, or the old one's
/// backlog lands after the new one read ClickHouse's watermark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_given_back_while_its_old_inserts_are_queued_lands_once() {
    let (topic, table, ch) = setup("backagain", 2, 0).await;
    let upstream = Proxy::upstream_of(&clickhouse_url());
    let proxy = Proxy::start(upstream, Duration::from_secs(30))
        .await
        .unwrap();
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = proxy.url.clone();
    spec.insert_timeout = Duration::from_secs(5);
    // 2 × insert_timeout + a 10 s lease + 5 s.
    spec.fence_wait = Duration::from_millis(25_000);
    spec.max_batch_rows = 50;
    let a = spec.start();
    wait_for_log(&a, "partition active", Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A backlog: 80 batches a partition, 4 s each, behind 4 permits.
    proxy.slow_inserts(Duration::from_secs(4));
    let n = 8_000;
    let t = topic.clone();
    tokio::task::spawn_blocking(move || produce(&t, 2, 0, n))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (group, t) = (spec.group.clone(), topic.clone());
    let got_one = tokio::task::spawn_blocking(move || visit_group(&group, &t))
        .await
        .unwrap();
    // The new generation's fence; then inserts are quick again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    proxy.slow_inserts(Duration::ZERO);
    let got = wait_for(&ch, &table, n, Duration::from_secs(240)).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let got = got.max_rows(landed(&ch, &table).await);
    let log = std::fs::read_to_string(&a.log).unwrap_or_default();
    assert!(got_one, "the visitor was never assigned a partition: {log}");
    assert!(log.contains("revoked"), "nothing moved: {log}");
    assert_eq!((got.distinct_offsets, got.duplicates()), (n, 0), "{log}");
}

/// Joins `group` on `topic` as a plain consumer until the group assigns it
/// a partition (at most 30 s), holds it 2 s, then leaves. Whether it got one.
fn visit_group(group: &str, topic: &str) -> bool {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::ClientConfig;
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", group)
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("session.timeout.ms", "6000")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    c.subscribe(&[topic]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = false;
    while Instant::now() < deadline && !got {
        let _ = c.poll(Duration::from_millis(100));
        got = c.assignment().is_ok_and(|a| a.count() > 0);
    }
    let hold = Instant::now() + Duration::from_secs(2);
    while Instant::now() < hold {
        let _ = c.poll(Duration::from_millis(100));
    }
    c.unsubscribe();
    let leave = Instant::now() + Duration::from_secs(2);
    while Instant::now() < leave {
        let _ = c.poll(Duration::from_millis(100));
    }
    got
}
