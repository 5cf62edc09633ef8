//! End-to-end delivery: a million records land once, and kill -9 at random
//! instants is harmless in exactly-once mode and visible in at-least-once.

use crate::harness::*;
use rand::Rng;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_records_land_exactly_once() {
    let n: u64 = std::env::var("SLUICE_TEST_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let (topic, table, ch) = setup("million", PARTITIONS, n).await;

    let mut spec = SinkSpec::new(&topic, &table);
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
    assert!(
        status.success(),
        "sluice exit {status:?}: {}",
        sink.log_tail()
    );
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
/// after it made progress and restarted with a different batch size, while
/// records keep arriving (also while the sink is down); then one run that
/// finishes. Returns what landed and how many ids are missing.
async fn kill9_scenario(delivery: &'static str, n: u64, kills: u32) -> (Landed, u64) {
    let (topic, table, ch) = setup(&format!("kill_{}", delivery.replace('-', "_")), PARTITIONS, 0).await;
    let chunks = u64::from(kills) * 3;
    let t = topic.clone();
    let producer = tokio::task::spawn_blocking(move || {
        for c in 0..chunks {
            produce(&t, PARTITIONS, c * n / chunks, n / chunks);
            std::thread::sleep(Duration::from_millis(2500));
        }
    });

    let mut spec = SinkSpec::new(&topic, &table);
    spec.delivery = delivery;
    spec.insert_timeout_s = 2;
    spec.fence_wait_ms = 3_000;
    spec.commit_interval_ms = 2_000;
    let _keepalive = GroupKeepalive::start(&spec.group).await;
    let mut rng = rand::rng();
    let mut killed_mid_ingest = 0;
    for i in 0..kills {
        spec.max_batch_rows = rng.random_range(200..8_000);
        let mut sink = spec.start();
        // Wait until this run has inserted something, then kill at a random instant.
        let before = landed(&ch, &table).await.rows;
        let deadline = Instant::now() + Duration::from_secs(60);
        while landed(&ch, &table).await.rows == before && Instant::now() < deadline {
            assert!(
                sink.is_running(),
                "run {i} stopped on its own: {}",
                sink.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..1500))).await;
        assert!(
            sink.is_running(),
            "run {i} stopped on its own: {}",
            sink.log_tail()
        );
        sink.kill9();
        if landed(&ch, &table).await.distinct_offsets < n {
            killed_mid_ingest += 1;
        }
    }
    producer.await.unwrap();
    spec.max_batch_rows = 5_000;
    let mut sink = spec.start();
    wait_for(&ch, &table, n, Duration::from_secs(300)).await;
    // Let a replay (if any) finish before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got = landed(&ch, &table).await;
    assert!(
        sink.stop(Duration::from_secs(60)).success(),
        "{}",
        sink.log_tail()
    );
    eprintln!("{delivery}: {kills} kills ({killed_mid_ingest} mid-ingest): {got:?}");
    assert!(
        killed_mid_ingest >= kills * 3 / 4,
        "most kills must land during ingest"
    );
    (got, missing_ids(&ch, &table, n).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_twenty_times_exactly_once() {
    let n = 300_000;
    let (got, missing) = kill9_scenario("exactly-once", n, 20).await;
    assert_eq!(missing, 0, "lost records");
    assert_eq!(got.duplicates(), 0, "duplicate rows: {got:?}");
    assert_eq!(got.rows, n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_shows_duplicates_at_least_once() {
    let n = 100_000;
    let (got, missing) = kill9_scenario("at-least-once", n, 5).await;
    assert_eq!(missing, 0, "at-least-once loses nothing either");
    assert!(
        got.duplicates() > 0,
        "the harness must see the duplicates that exactly-once prevents: {got:?}"
    );
}
