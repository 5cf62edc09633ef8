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
    let topic = unique("million");
    create_topic(&topic, PARTITIONS).await;
    let ch = ch();
    let table = create_table(&ch, &unique("it")).await;
    let t = topic.clone();
    tokio::task::spawn_blocking(move || produce(&t, PARTITIONS, 0, n))
        .await
        .unwrap();

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

/// Runs `kills` sink processes, each killed with SIGKILL after a random
/// while and restarted with a different batch size, then one that finishes.
async fn kill9_scenario(delivery: &'static str, n: u64, kills: u32) -> (Landed, u64) {
    let topic = unique(&format!("kill_{}", delivery.replace('-', "_")));
    create_topic(&topic, PARTITIONS).await;
    let ch = ch();
    let table = create_table(&ch, &unique("it")).await;
    let t = topic.clone();
    tokio::task::spawn_blocking(move || produce(&t, PARTITIONS, 0, n))
        .await
        .unwrap();

    let mut spec = SinkSpec::new(&topic, &table);
    spec.delivery = delivery;
    spec.insert_timeout_s = 3;
    spec.fence_wait_ms = 4_000;
    spec.commit_interval_ms = 3_000;
    let mut rng = rand::rng();
    let mut killed_mid_ingest = 0;
    for i in 0..kills {
        spec.max_batch_rows = rng.random_range(200..8_000);
        let mut sink = spec.start();
        // Wait until this run has made progress, then kill at a random instant.
        let before = landed(&ch, &table).await.rows;
        let deadline = Instant::now() + Duration::from_secs(60);
        while landed(&ch, &table).await.rows == before
            && Instant::now() < deadline
            && sink.is_running()
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..1500))).await;
        assert!(
            sink.is_running(),
            "run {i} stopped on its own: {}",
            sink.log_tail()
        );
        sink.kill9();
        let l = landed(&ch, &table).await;
        if l.distinct_offsets < n {
            killed_mid_ingest += 1;
        }
    }
    spec.max_batch_rows = 5_000;
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, n, Duration::from_secs(300)).await;
    // Let a replay (if any) finish before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got = if got.distinct_offsets >= n {
        landed(&ch, &table).await
    } else {
        got
    };
    assert!(
        sink.stop(Duration::from_secs(60)).success(),
        "{}",
        sink.log_tail()
    );
    eprintln!("{delivery}: {kills} kills ({killed_mid_ingest} mid-ingest): {got:?}");
    assert!(
        killed_mid_ingest >= kills / 2,
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
