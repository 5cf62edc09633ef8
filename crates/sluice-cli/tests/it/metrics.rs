//! `/metrics`, `/health` and `/ready` of `sluice run`: the named series
//! carry the right values after a known run.

use crate::harness::*;
use std::time::Duration;

/// The value of the series whose line starts with `prefix`.
pub fn value(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no series {prefix} in:\n{metrics}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_a_known_run() {
    let (topic, table, ch) = setup("metrics", 2, 5000).await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut spec = SinkSpec::new(&topic, &table);
    spec.max_batch_rows = 1000;
    spec.metrics_listen = Some(addr.clone());
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, 5000, Duration::from_secs(120)).await;
    assert_eq!(got.rows, 5000, "{}", sink.log_tail());
    // The last completions reach the consumer thread: wait until the
    // counters say every record was inserted and nothing is in flight.
    let t = format!("{{topic=\"{topic}\"}}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (status, m) = loop {
        let (status, m) = get(&addr, "/metrics").await;
        let has = |p: &str| m.lines().any(|l| l.starts_with(p));
        let tbl = format!("{{table=\"{table}\"}}");
        let series = [
            format!("sluice_records_total{t}"),
            format!("sluice_rows_inserted_total{tbl}"),
            format!("sluice_batches_total{tbl}"),
            format!("sluice_insert_duration_seconds_count{tbl}"),
            "sluice_in_flight_bytes".to_string(),
        ];
        let done = status == 200
            && series.iter().all(|p| has(p))
            && value(&m, &series[0]) >= 5000.0
            && value(&m, &series[1]) >= 5000.0
            && value(&m, &series[3]) >= value(&m, &series[2])
            && value(&m, &series[4]) == 0.0;
        if done || std::time::Instant::now() > deadline {
            break (status, m);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status, 200);
    assert_eq!(value(&m, &format!("sluice_records_total{t}")), 5000.0);
    let tbl = format!("{{table=\"{table}\"}}");
    assert_eq!(
        value(&m, &format!("sluice_rows_inserted_total{tbl}")),
        5000.0
    );
    let batches = value(&m, &format!("sluice_batches_total{tbl}"));
    assert!(batches >= 5.0, "{m}");
    assert_eq!(
        value(&m, &format!("sluice_insert_duration_seconds_count{tbl}")),
        batches
    );
    assert_eq!(value(&m, "sluice_in_flight_bytes"), 0.0);
    assert!(value(&m, &format!("sluice_record_bytes_total{t}")) > 5000.0 * 60.0);
    assert!(m.contains("# HELP sluice_records_total"), "{m}");
    // librdkafka reports the lag every 10 s, from the last commit it saw:
    // an early report may predate the final commit, so wait for one after
    // it. Caught up, the lag is 0 everywhere.
    let deadline = std::time::Instant::now() + Duration::from_secs(45);
    let lags = loop {
        let (_, m) = get(&addr, "/metrics").await;
        let lags: Vec<f64> = m
            .lines()
            .filter(|l| l.starts_with("sluice_consumer_lag_records{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        let settled = lags.len() == 2 && lags.iter().all(|l| *l == 0.0);
        if settled || std::time::Instant::now() > deadline {
            break lags;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(lags, vec![0.0, 0.0], "one gauge per partition");
    // Per partition: the committed offset (2,500 records each) and nothing
    // waiting; the process: ready, its bound and its start.
    let (_, m) = get(&addr, "/metrics").await;
    for p in 0..2 {
        let labels = format!("{{topic=\"{topic}\",partition=\"{p}\"}}");
        assert_eq!(
            value(&m, &format!("sluice_committed_offset{labels}")),
            2500.0,
            "{m}"
        );
        assert_eq!(
            value(&m, &format!("sluice_consumer_lag_seconds{labels}")),
            0.0,
            "{m}"
        );
    }
    assert_eq!(value(&m, "sluice_ready"), 1.0);
    assert!(value(&m, "sluice_buffer_limit_bytes") > 1e6, "{m}");
    let started = value(&m, "process_start_time_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        started > now - 600.0 && started <= now,
        "{started} vs {now}"
    );
    assert_eq!(get(&addr, "/health").await.0, 200);
    assert_eq!(get(&addr, "/ready").await.0, 200);
    assert_eq!(get(&addr, "/nope").await.0, 404);
    assert!(sink.stop(Duration::from_secs(30)), "{}", sink.log_tail());
}

/// While ClickHouse is unreachable, records wait: the lag gauges of their
/// partitions grow (in records, and in seconds by Kafka timestamp), and
/// fall back to 0 once the records land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_gauges_grow_while_clickhouse_is_down_and_clear_after() {
    use sluice_lab::proxy::Proxy;
    let (topic, table, ch) = setup("lagm", 1, 0).await;
    let upstream = Proxy::upstream_of(&clickhouse_url());
    let proxy = Proxy::start(upstream, Duration::from_secs(1))
        .await
        .unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = proxy.url.clone();
    spec.insert_timeout = Duration::from_secs(2);
    spec.metrics_listen = Some(addr.clone());
    let mut sink = spec.start();
    wait_for_log(&sink, "partition active", Duration::from_secs(60)).await;
    proxy.set_down(true);
    let (s, t) = (stack(), topic.clone());
    tokio::task::spawn_blocking(move || s.produce(&t, 1, 0, 100))
        .await
        .unwrap()
        .unwrap();
    let labels = format!("{{topic=\"{topic}\",partition=\"0\"}}");
    let gauges = |m: &str| {
        (
            value(m, &format!("sluice_consumer_lag_records{labels}")),
            value(m, &format!("sluice_consumer_lag_seconds{labels}")),
        )
    };
    // librdkafka reports the lag every 10 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let waiting = loop {
        let (_, m) = get(&addr, "/metrics").await;
        let g = m
            .contains("sluice_consumer_lag_records{")
            .then(|| gauges(&m));
        match g {
            Some((records, secs)) if records == 100.0 && secs >= 5.0 => break (records, secs),
            _ if std::time::Instant::now() > deadline => panic!("{g:?}\n{m}\n{}", sink.log_tail()),
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    };
    assert_eq!(waiting.0, 100.0);
    proxy.set_down(false);
    let got = wait_for(&ch, &table, 100, Duration::from_secs(60)).await;
    assert_eq!(got.distinct_offsets, 100, "{}", sink.log_tail());
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    loop {
        let (_, m) = get(&addr, "/metrics").await;
        let g = gauges(&m);
        if g == (0.0, 0.0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{g:?}\n{m}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(sink.stop(Duration::from_secs(30)), "{}", sink.log_tail());
}

/// A trickle over many partitions makes one insert per route per
/// `max_batch_age`, not one per partition: 16 partitions, a record to each
/// every 400 ms for 8 s, `max_batch_age` 2 s. One batch per partition would
/// take 16 × 8 / 2 = 64 inserts; one per route takes about 4 (a few more
/// while partitions start at different moments). Every record still lands
/// exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickle_over_sixteen_partitions_makes_one_insert_per_batch_age() {
    let (topic, table, ch) = setup("trickle", 16, 0).await;
    let addr = format!("127.0.0.1:{}", free_port());
    let mut spec = SinkSpec::new(&topic, &table);
    spec.max_batch_age = Duration::from_secs(2);
    spec.metrics_listen = Some(addr.clone());
    let mut sink = spec.start();
    wait_for_log(&sink, "partition active", Duration::from_secs(60)).await;
    let rounds = 20u64;
    let t = topic.clone();
    tokio::task::spawn_blocking(move || {
        for r in 0..rounds {
            produce(&t, 16, r * 16, 16);
            std::thread::sleep(Duration::from_millis(400));
        }
    })
    .await
    .unwrap();
    let n = rounds * 16;
    let got = wait_for(&ch, &table, n, Duration::from_secs(60)).await;
    assert_eq!(got.rows, n, "{}", sink.log_tail());
    assert_eq!(got.distinct_ids, n);
    let tbl = format!("{{table=\"{table}\"}}");
    let (_, m) = get(&addr, "/metrics").await;
    let inserts = value(&m, &format!("sluice_insert_duration_seconds_count{tbl}"));
    assert!(
        (2.0..=16.0).contains(&inserts),
        "{inserts} inserts for {n} records over 16 partitions in ~10 s: {}",
        sink.log_tail()
    );
    assert!(sink.stop(Duration::from_secs(30)), "{}", sink.log_tail());
}
