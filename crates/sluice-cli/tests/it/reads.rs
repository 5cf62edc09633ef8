//! Every read the exactly-once protocol relies on (the resume watermark,
//! reconciliation, the key window, the fence) carries
//! `[clickhouse] read_settings`: on a replicated table that is what makes
//! those reads see every acknowledged insert. Checked through
//! `system.query_log`, where a `log_comment` read setting marks each one.

use crate::harness::*;
use sluice_lab::proxy::{Fault, Proxy};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_settings_reach_every_protocol_read() {
    let (topic, table, ch) = setup("reads", 2, 2_000).await;
    let mark = unique("reads_mark");
    // The first insert's answer is withheld: the fence and reconciliation run.
    let upstream = clickhouse_url()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let proxy = Proxy::start(upstream, Duration::from_secs(6))
        .await
        .unwrap();
    proxy.arm(Fault::WithholdResponse);
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = proxy.url.clone();
    spec.insert_timeout = Duration::from_secs(3);
    spec.max_batch_rows = 500;
    spec.dedup_key = Some("id".into());
    spec.read_settings = vec![("log_comment".into(), mark.clone())];
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, 2_000, Duration::from_secs(120)).await;
    assert_eq!(got.distinct_offsets, 2_000, "{}", sink.log_tail());
    // A restart reads the watermark and rebuilds the key window.
    assert!(sink.stop(Duration::from_secs(60)), "{}", sink.log_tail());
    let t = topic.clone();
    tokio::task::spawn_blocking(move || produce(&t, 2, 2_000, 500))
        .await
        .unwrap();
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, 2_500, Duration::from_secs(120)).await;
    assert!(sink.stop(Duration::from_secs(60)), "{}", sink.log_tail());
    assert_eq!((got.rows, got.distinct_offsets), (2_500, 2_500));
    assert_eq!(proxy.fired(), 1);

    // Every read has finished (the sink stopped): write them to query_log
    // now rather than at its next flush.
    exec(&ch, "SYSTEM FLUSH LOGS").await;
    let name = table.split('.').nth(1).unwrap().to_string();
    let db = table.split('.').next().unwrap().to_string();
    let reads: Vec<(String, String)> = ch
        .query(
            "SELECT query, log_comment FROM system.query_log \
             WHERE type = 'QueryFinish' AND query NOT LIKE 'INSERT%' \
               AND query NOT LIKE '%system.columns%' AND query NOT LIKE '%system.tables%' \
               AND query NOT LIKE '%query_log%' \
               AND (position(query, ?) > 0 OR log_comment = ?)",
        )
        .bind(format!("`{db}`.`{name}`"))
        .bind(&mark)
        .fetch_all()
        .await
        .unwrap();
    let unmarked: Vec<&String> = reads
        .iter()
        .filter(|(_, c)| *c != mark)
        .map(|(q, _)| q)
        .collect();
    assert!(
        unmarked.is_empty(),
        "reads without the read settings: {unmarked:#?}"
    );
    let has = |needle: &str| reads.iter().any(|(q, _)| q.contains(needle));
    assert!(has("max("), "the watermark: {reads:#?}");
    assert!(has("toInt64(`_offset`) FROM"), "reconciliation: {reads:#?}");
    assert!(has("arrayStringConcat"), "the key window: {reads:#?}");
    assert!(has("now64(3)), (SELECT count()"), "the fence: {reads:#?}");
}

/// A settings profile on the server that cuts answers short without an
/// error (`result_overflow_mode = 'break'`, `read_overflow_mode = 'break'`,
/// a profile-wide `limit`) must not cut a protocol read: reconciliation after
/// a withheld answer and the resume watermark after a restart see every
/// stored row, so nothing is sent twice and nothing is let in unchecked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_that_cuts_reads_short_cuts_no_protocol_read() {
    let n = 3_000;
    let topic = unique("profile");
    create_topic(&topic, 1).await;
    produce(&topic, 1, 0, n);
    let port = free_port();
    let dir = std::env::temp_dir().join(unique("chdb"));
    let profile: Vec<String> = [
        ("max_block_size", "100"),
        ("max_result_rows", "100"),
        ("result_overflow_mode", "break"),
        ("max_rows_to_read", "200"),
        ("read_overflow_mode", "break"),
        ("limit", "150"),
        ("aggregate_functions_null_for_empty", "1"),
        ("input_format_allow_errors_num", "5"),
    ]
    .iter()
    .map(|(k, v)| format!("--profile={k}={v}"))
    .collect();
    let _server = private_clickhouse(port, dir, &profile);
    let url = format!("http://127.0.0.1:{port}");
    let ch = ch_at(&url);
    let table = create_table(&ch, &unique("it")).await;
    let proxy = Proxy::start(
        url.trim_start_matches("http://").into(),
        Duration::from_secs(6),
    )
    .await
    .unwrap();
    // The first insert commits and its answer is lost: the sink reconciles.
    proxy.arm(Fault::WithholdResponse);
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = proxy.url.clone();
    spec.insert_timeout = Duration::from_secs(3);
    spec.max_batch_rows = 1_000;
    let mut sink = spec.start();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let count = |ch: clickhouse::Client, table: String| async move {
        ch.query(&format!("SELECT count(), uniqExact(_offset) FROM {table}"))
            .fetch_one::<(u64, u64)>()
            .await
            .unwrap()
    };
    while count(ch.clone(), table.clone()).await.1 < n && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(proxy.fired(), 1, "{}", sink.log_tail());
    assert!(sink.stop(Duration::from_secs(60)), "{}", sink.log_tail());
    // A restart with a fresh group reads the watermark: nothing is sent again.
    spec.group = unique("g");
    let mut sink = spec.start();
    wait_for_log(&sink, "partition active", Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(sink.stop(Duration::from_secs(60)), "{}", sink.log_tail());
    assert_eq!(
        count(ch.clone(), table.clone()).await,
        (n, n),
        "{}",
        sink.log_tail()
    );
}

/// A server clock that steps back while the sink runs: the sink reads the
/// clock on a schedule, so the deadlines of its later inserts follow the
/// new clock (a deadline counted on the old one would let an attempt start
/// that much later than its lease allows), and every record lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_follow_a_server_clock_that_steps_back() {
    let ClockRun {
        topic,
        clock,
        ch,
        table,
        mut sink,
        _server,
    } = clock_run("clockstep", 1).await;
    // The server's clock goes back a minute.
    let step_ms: i64 = -60_000;
    std::fs::write(&clock, step_ms.to_string()).unwrap();
    wait_for_log(
        &sink,
        "ClickHouse's clock went back",
        Duration::from_secs(30),
    )
    .await;
    let t = topic.clone();
    tokio::task::spawn_blocking(move || produce(&t, 1, 500, 500))
        .await
        .unwrap();
    let got = wait_for(&ch, &table, 1_000, Duration::from_secs(90)).await;
    assert!(sink.stop(Duration::from_secs(60)), "{}", sink.log_tail());
    assert_eq!((got.rows, got.distinct_offsets), (1_000, 1_000));
    // Each insert sent on the stepped clock carries a deadline within its
    // timeout (5 s) of that clock, not of the old one. The test server
    // writes the stepped clock into the query: `now64(3)` becomes the
    // moment its head arrived, and `nowInBlock()` is moved by the step.
    exec(&ch, "SYSTEM FLUSH LOGS").await;
    let queries: Vec<String> = ch
        .query(
            "SELECT query FROM system.query_log WHERE type = 'QueryStart' \
               AND query LIKE '%throwIf%' AND query LIKE ?",
        )
        // (not naming the function: the test server moves it in this query too)
        .bind(format!("%, {})) * 1000%", step_ms / 1000))
        .fetch_all()
        .await
        .unwrap();
    assert!(!queries.is_empty(), "no insert after the step");
    let number_after = |q: &str, marker: &str| -> i64 {
        q.split(marker)
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|d| d.parse().ok())
            .unwrap_or_else(|| panic!("no {marker:?} in {q}"))
    };
    for q in &queries {
        let started = number_after(q, "fromUnixTimestamp64Milli(toInt64(");
        let deadline = number_after(q, ") > ");
        let ahead = deadline - started;
        assert!(
            ahead <= 6_000,
            "deadline {ahead} ms ahead of the server's clock: {q}"
        );
    }
}

/// A server clock that jumps ahead of ours is what a host suspended under
/// the sink looks like from inside it: its monotonic clock stood still
/// while the leases' real time ran out, and a deadline on the new reading
/// would reach past them. Every lease waits for a renewal read sent after
/// the jump; the sink goes on, and every record lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_clock_that_jumps_ahead_makes_every_lease_renew_first() {
    let ClockRun {
        topic,
        clock,
        ch,
        table,
        mut sink,
        _server,
    } = clock_run("clockjump", 2).await;
    std::fs::write(&clock, "60000").unwrap();
    wait_for_log(&sink, "ran ahead of ours", Duration::from_secs(30)).await;
    let t = topic.clone();
    tokio::task::spawn_blocking(move || produce(&t, 2, 500, 500))
        .await
        .unwrap();
    let got = wait_for(&ch, &table, 1_000, Duration::from_secs(90)).await;
    assert!(sink.stop(Duration::from_secs(60)), "{}", sink.log_tail());
    assert_eq!((got.rows, got.distinct_offsets), (1_000, 1_000));
}

/// A sink on a test server whose clock a file moves, with 500 records of
/// `partitions` partitions landed.
struct ClockRun {
    topic: String,
    clock: std::path::PathBuf,
    ch: clickhouse::Client,
    table: String,
    sink: Sink,
    _server: PrivateClickHouse,
}

async fn clock_run(prefix: &str, partitions: i32) -> ClockRun {
    let topic = unique(prefix);
    create_topic(&topic, partitions).await;
    produce(&topic, partitions, 0, 500);
    let port = free_port();
    let dir = std::env::temp_dir().join(unique("chdb"));
    let clock = std::env::temp_dir().join(unique("clock"));
    std::fs::write(&clock, "0").unwrap();
    let _server = private_clickhouse(port, dir, &[format!("--clock-file={}", clock.display())]);
    let ch = ch_at(&format!("http://127.0.0.1:{port}"));
    let table = create_table(&ch, &unique("it")).await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = format!("http://127.0.0.1:{port}");
    spec.max_batch_rows = 100;
    let sink = spec.start();
    let got = wait_for(&ch, &table, 500, Duration::from_secs(90)).await;
    assert_eq!(got.distinct_offsets, 500, "{}", sink.log_tail());
    ClockRun {
        topic,
        clock,
        ch,
        table,
        sink,
        _server,
    }
}

/// Reconciliation asks, in one query, which rows of several partitions'
/// spans the table holds: exactly those, ordered by partition and offset,
/// a row stored twice listed twice, nothing of another partition or topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_reconciliation_reads_the_spans_of_several_partitions() {
    use sluice::config::{ClickHouseConfig, Delivery, Format, Route};
    use sluice_protocol::{Offset, Row};
    let client = ch();
    let db = unique("spans");
    let table = create_table(&client, &db).await;
    let mut values = Vec::new();
    for (topic, p) in [("t", 0), ("t", 1), ("t", 2), ("other", 0)] {
        for o in 0..6 {
            values.push(format!("({o}, '', '{topic}', {p}, {o})"));
        }
    }
    values.push("(3, '', 't', 0, 3)".into());
    exec(
        &client,
        &format!(
            "INSERT INTO {table} SETTINGS async_insert = 0 VALUES {}",
            values.join(", ")
        ),
    )
    .await;
    let service = sluice::ch::ClickHouse::connect(
        &ClickHouseConfig::at(clickhouse_url()),
        Default::default(),
        Delivery::ExactlyOnce,
        1000,
    )
    .await
    .expect("a connection");
    let route = Route {
        topic: "t".into(),
        database: db.clone(),
        table: "events".into(),
        dedup: None,
        required: Vec::new(),
        format: Format::Json,
        subject: None,
        extra_to_dlq: false,
    };
    let o = Offset;
    let present = service
        .present_rows(&route, &[(0, o(1), o(3)), (2, o(4), o(9))])
        .await
        .expect("the rows present");
    let r = Row::new;
    assert_eq!(
        present,
        [r(0, 1), r(0, 2), r(0, 3), r(0, 3), r(2, 4), r(2, 5)]
    );
    assert!(service.present_rows(&route, &[]).await.unwrap().is_empty());
    exec(&client, &format!("DROP DATABASE {db}")).await;
}
