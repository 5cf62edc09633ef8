//! End-to-end delivery: a million records land once, and kill -9 at random
//! instants is harmless in exactly-once mode and visible in at-least-once.

use crate::harness::*;
use rand::Rng;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_records_land_exactly_once() {
    let n: u64 = std::env::var("SLUICE_TEST_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let (_broker, kafka) = own_kafka().await;
    let (topic, table, ch) = setup_on(&kafka, "million", PARTITIONS, n).await;

    let mut spec = SinkSpec::new(&topic, &table);
    spec.brokers = kafka.brokers.clone();
    // Nothing here rebalances: a broker slowed by the tests beside this one
    // must not end the session.
    spec.session_timeout = Duration::from_secs(30);
    spec.max_batch_rows = 50_000;
    let started = Instant::now();
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, n, Duration::from_secs(600)).await;
    let secs = started.elapsed().as_secs_f64();
    let status = sink.stop(Duration::from_secs(60));
    eprintln!(
        "{n} records in {secs:.1}s ({:.0} rows/s incl. start-up)",
        n as f64 / secs
    );
    assert!(status, "sluice did not stop cleanly: {}", sink.log_tail());
    assert_eq!(
        got,
        Landed {
            rows: n,
            distinct_offsets: n,
            distinct_ids: n
        },
        "log: {}",
        sink.log_tail()
    );
    assert_eq!(missing_ids(&ch, &table, n).await, 0);
}

/// Runs `kills` sink processes, each killed with SIGKILL at a random instant
/// after it joined the group and restarted with a different batch size,
/// while records keep arriving (also while the sink is down); then one run
/// that finishes. Returns what landed, how many ids are missing, and how
/// many runs had inserted rows before they were killed.
async fn kill9_scenario(delivery: &'static str, kills: u32) -> (Landed, u64, u32) {
    let (_broker, kafka) = own_kafka().await;
    let (topic, table, ch) = setup_on(
        &kafka,
        &format!("kill_{}", delivery.replace('-', "_")),
        PARTITIONS,
        0,
    )
    .await;
    let producing = Arc::new(AtomicBool::new(true));
    let (k, t, p) = (kafka.clone(), topic.clone(), producing.clone());
    let producer = tokio::task::spawn_blocking(move || {
        let mut n = 0;
        while p.load(Ordering::Relaxed) {
            k.produce(&t, PARTITIONS, n, 4_000)
                .unwrap_or_else(|e| panic!("{e:#}"));
            n += 4_000;
            std::thread::sleep(Duration::from_millis(1000));
        }
        n
    });

    let mut spec = SinkSpec::new(&topic, &table);
    spec.brokers = kafka.brokers.clone();
    spec.delivery = delivery;
    spec.insert_timeout = Duration::from_secs(2);
    spec.fence_wait = Duration::from_millis(3_000);
    spec.commit_interval = Duration::from_millis(2_000);
    let mut rng = rand::rng();
    let mut inserted_before_kill = 0;
    for i in 0..kills {
        spec.max_batch_rows = rng.random_range(200..8_000);
        let mut sink = spec.start();
        let before = landed(&ch, &table).await.rows;
        // Every fifth run dies while it prepares its partitions; the others
        // once active: two in five once rows are landing, the rest at a
        // random instant.
        let ready = match (delivery, i % 5) {
            ("exactly-once", 1..) => "partition active",
            _ => "assigned",
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !std::fs::read_to_string(&sink.log)
            .unwrap_or_default()
            .contains(ready)
        {
            assert!(
                Instant::now() < deadline,
                "run {i} never got ready: {}",
                sink.log_tail()
            );
            assert!(
                sink.is_running(),
                "run {i} stopped on its own: {}",
                sink.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if matches!(i % 5, 1 | 2) {
            // Two in five die while inserting, however slow the stack is
            // (at-least-once: before the next commit, so its replay shows).
            let deadline = Instant::now() + Duration::from_secs(60);
            while landed(&ch, &table).await.rows == before {
                assert!(
                    Instant::now() < deadline,
                    "run {i} never inserted: {}",
                    sink.log_tail()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let within = if delivery == "exactly-once" {
                1_000
            } else {
                200
            };
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..within))).await;
        } else {
            tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..6_000))).await;
        }
        assert!(
            sink.is_running(),
            "run {i} stopped on its own: {}",
            sink.log_tail()
        );
        sink.kill9();
        if landed(&ch, &table).await.rows > before {
            inserted_before_kill += 1;
        }
    }
    producing.store(false, Ordering::Relaxed);
    let n = producer.await.unwrap();
    spec.max_batch_rows = 5_000;
    let mut sink = spec.start();
    // The coordinator evicts the killed members when their sessions end;
    // the final sink then holds every partition and lands every record.
    wait_for(&ch, &table, n, Duration::from_secs(300)).await;
    // Let a replay (if any) finish before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got = landed(&ch, &table).await;
    assert!(sink.stop(Duration::from_secs(60)), "{}", sink.log_tail());
    eprintln!(
        "{delivery}: {n} records, {kills} kills ({inserted_before_kill} after inserting): {got:?}"
    );
    assert!(got.distinct_offsets <= n);
    (got, missing_ids(&ch, &table, n).await, inserted_before_kill)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_twenty_times_exactly_once() {
    let (got, missing, inserted) = kill9_scenario("exactly-once", 20).await;
    assert!(
        inserted >= 5,
        "runs must also be killed after inserting, not only before"
    );
    assert_eq!(missing, 0, "lost records: {got:?}");
    assert_eq!(got.duplicates(), 0, "duplicate rows: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_shows_duplicates_at_least_once() {
    let (got, missing, _) = kill9_scenario("at-least-once", 5).await;
    assert_eq!(missing, 0, "at-least-once loses nothing either: {got:?}");
    assert!(
        got.duplicates() > 0,
        "the harness must see the duplicates that exactly-once prevents: {got:?}"
    );
}
