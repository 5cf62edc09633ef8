//! `sluice run --until-caught-up` and `sluice status` at their edges, from
//! an adversarial review: partitions with nothing to read, a signal before
//! the end, a member given nothing, a partition moved between two runs of
//! the group, rows above a gap, unreachable ends, and a status that must
//! leave a running sink and its group alone.

use crate::harness::*;
use crate::status::{partitions as json_parts, status_of};
use std::time::{Duration, Instant};

/// At least once, a partition with nothing to read (empty, or committed up
/// to its high watermark) has no batch tracker (one is made at its first
/// record): it counts as caught up by the group's commit, and the run ends
/// (it hung for ever before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_caught_up_at_least_once_with_an_empty_partition_exits() {
    // One record: partition 0 has it, partition 1 is empty.
    let (topic, table, ch) = setup("rv-alo-empty", 2, 1).await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.delivery = "at-least-once";
    spec.args = vec!["--until-caught-up".into()];
    let sink = spec.start();
    let (code, log) = tokio::task::spawn_blocking(move || exit_of(sink, Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(landed(&ch, &table).await.distinct_offsets, 1);
}

/// A signal before it is caught up ends `--until-caught-up` with exit 1,
/// not the 0 of a finished run: a batch scheduler (a Kubernetes Job's
/// deadline, systemd's stop) must not read an interrupted backfill as done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_caught_up_interrupted_does_not_exit_0() {
    let (topic, table, ch) = setup("rv-sigterm", 1, 500).await;
    let proxy = clickhouse_proxy(Duration::from_secs(30)).await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = proxy.url.clone();
    spec.args = vec!["--until-caught-up".into()];
    spec.insert_timeout = Duration::from_secs(2);
    let mut sink = spec.start();
    // Every insert now waits past the insert timeout: nothing lands.
    proxy.slow_inserts(Duration::from_secs(60));
    assert!(
        sink.wait_for_log("partition active", Duration::from_secs(60))
            .await,
        "{}",
        sink.log_tail()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    sink.signal("-TERM");
    let (code, log) = tokio::task::spawn_blocking(move || exit_of(sink, Duration::from_secs(60)))
        .await
        .unwrap();
    let got = landed(&ch, &table).await;
    assert!(got.distinct_offsets < 500, "everything landed: {got:?}");
    assert_ne!(
        code,
        Some(0),
        "interrupted with {} of 500 records in ClickHouse, yet exit 0: {log}",
        got.distinct_offsets
    );
}

/// Rows above a gap (an insert cut short, batches landing out of order, an
/// older topic of the same name) are not progress: the sink treats the
/// table's highest offset as an upper bound only, and so does status. It
/// reports the lag from the group's commit, and `--stuck-after` exits 1
/// with no sink running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_does_not_count_a_gap_below_clickhouse_offset_as_done() {
    let (topic, table, ch) = setup("rv-gap", 1, 500).await;
    // The last 100 records of the partition are stored, the first 400 not
    // (a later batch landed; an earlier one did not).
    exec(
        &ch,
        &format!(
            "INSERT INTO {table} (id, payload, _topic, _partition, _offset)
             SELECT number, '', '{topic}', 0, number FROM numbers(400, 100)"
        ),
    )
    .await;
    // A sink config (the process itself is not left running).
    let mut spec = SinkSpec::new(&topic, &table);
    spec.args = vec!["--until-caught-up".into()];
    let mut sink = spec.start();
    sink.kill9();
    let parts = json_parts(&status_of(&sink.config, &["--json"]));
    let p0 = &parts[&0];
    let stuck = status_of(&sink.config, &["--stuck-after", "3s", "--interval", "1s"]);
    // What the sink makes of it: it reads from the start and inserts the
    // 400 missing records.
    let sink = spec.start();
    let (code, log) = tokio::task::spawn_blocking(move || exit_of(sink, Duration::from_secs(120)))
        .await
        .unwrap();
    assert_eq!(code, Some(0), "{log}");
    let got = landed(&ch, &table).await;
    assert_eq!(got.distinct_offsets, 500, "{log}");
    assert!(
        p0["lag_records"].as_i64().unwrap_or(0) >= 400,
        "400 records were not in ClickHouse (the sink then inserted them): {p0}"
    );
    assert_eq!(
        stuck.code, 1,
        "--stuck-after with no sink and 400 records missing: {}\n{}",
        stuck.stdout, stuck.stderr
    );
}

/// Status while a sink runs: no rebalance in the sink, the group's
/// committed offsets unchanged, nothing committed under the status
/// consumer's own group id. Exactly-once and at least once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_leaves_a_running_sink_and_its_group_alone() {
    for delivery in ["exactly-once", "at-least-once"] {
        let (topic, table, ch) = setup("rv-ro", 1, 300).await;
        let mut spec = SinkSpec::new(&topic, &table);
        spec.delivery = delivery;
        // The sink is frozen through four status calls (one waits out
        // --stuck-after): a 6 s session could end in the freeze itself,
        // and the rebalance after it would be the freeze's, not status's.
        spec.session_timeout = Duration::from_secs(30);
        let mut sink = spec.start();
        let got = wait_for(&ch, &table, 300, Duration::from_secs(90)).await;
        assert_eq!(got.distinct_offsets, 300, "{}", sink.log_tail());
        let deadline = Instant::now() + Duration::from_secs(20);
        while committed(&brokers(), &spec.group, &topic) != Some(300) {
            assert!(Instant::now() < deadline, "never committed 300");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Some lag, for the timestamp reader and --stuck-after.
        sink.freeze();
        produce(&topic, 1, 300, 20);
        for args in [
            &["--json"][..],
            &[][..],
            &["--stuck-after", "2s", "--interval", "500ms"][..],
        ] {
            let r = status_of(&sink.config, args);
            assert!(
                r.code == 0 || r.code == 1,
                "{args:?}: {}\n{}",
                r.stdout,
                r.stderr
            );
        }
        assert_eq!(
            committed(&brokers(), &spec.group, &topic),
            Some(300),
            "{delivery}: status moved the group's commit"
        );
        assert_eq!(
            committed(&brokers(), &format!("{}.sluice-status", spec.group), &topic),
            None,
            "{delivery}: the status consumer committed"
        );
        sink.thaw();
        let got = wait_for(&ch, &table, 320, Duration::from_secs(60)).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let log = std::fs::read_to_string(&sink.log).unwrap_or_default();
        assert_eq!(got.distinct_offsets, 320, "{log}");
        assert!(!log.contains("revoked"), "{delivery}: a rebalance: {log}");
        assert_eq!(
            log.matches("assigned").count(),
            1,
            "{delivery}: assigned again: {log}"
        );
        assert!(sink.stop(Duration::from_secs(30)));
    }
}

/// Kafka, or ClickHouse, unreachable or silent: exit 2 within bounded
/// time, naming the address, no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_an_unreachable_end_and_exits_2() {
    // A listener that accepts and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let dead = free_port();
    let topic = unique("rv-unreach");
    create_topic(&topic, 1).await;
    let table = create_table(&ch(), &unique("it")).await;
    let cases = [
        ("kafka", format!("127.0.0.1:{dead}"), clickhouse_url()),
        ("clickhouse", brokers(), format!("http://127.0.0.1:{dead}")),
        (
            "silent clickhouse",
            brokers(),
            format!("http://{silent_addr}"),
        ),
    ];
    for (what, kafka, url) in cases {
        let mut spec = SinkSpec::new(&topic, &table);
        spec.brokers = kafka.clone();
        spec.clickhouse_url = url.clone();
        let mut sink = spec.start();
        sink.kill9();
        let started = Instant::now();
        let r = status_of(&sink.config, &["--json"]);
        let took = started.elapsed();
        assert_eq!(r.code, 2, "{what}: {}\n{}", r.stdout, r.stderr);
        assert!(!r.stderr.contains("panicked"), "{what}: {}", r.stderr);
        let named = if what == "kafka" { &kafka } else { &url };
        let named = named.trim_start_matches("http://");
        assert!(r.stderr.contains(named), "{what}: not named: {}", r.stderr);
        assert!(took < Duration::from_secs(40), "{what}: took {took:?}");
        eprintln!("{what}: exit 2 in {took:?}: {}", r.stderr.trim());
    }
    drop(silent);
}

/// A second `--until-caught-up` process of the group that the group gives
/// nothing does not hang (librdkafka calls the rebalance callback with an
/// empty incremental assignment): it ends once the group's commit shows the
/// other's partition done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_caught_up_a_member_given_nothing() {
    let (topic, table, ch) = setup("rv-nothing", 1, 400).await;
    let proxy = clickhouse_proxy(Duration::from_secs(30)).await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.args = vec!["--until-caught-up".into()];
    spec.max_batch_rows = 50;
    spec.insert_timeout = Duration::from_secs(10);
    let mut a_spec = spec.clone();
    a_spec.clickhouse_url = proxy.url.clone();
    proxy.slow_inserts(Duration::from_secs(2));
    let mut a = a_spec.start();
    assert!(
        a.wait_for_log("partition active", Duration::from_secs(60))
            .await,
        "{}",
        a.log_tail()
    );
    let b = spec.start();
    let started = Instant::now();
    let (code_b, log_b) = tokio::task::spawn_blocking(move || exit_of(b, Duration::from_secs(90)))
        .await
        .unwrap();
    eprintln!("B exited {code_b:?} after {:?}", started.elapsed());
    assert_eq!(code_b, Some(0), "{log_b}");
    proxy.slow_inserts(Duration::ZERO);
    let (code_a, log_a) = tokio::task::spawn_blocking(move || exit_of(a, Duration::from_secs(120)))
        .await
        .unwrap();
    let got = landed(&ch, &table).await;
    assert_eq!(code_a, Some(0), "{log_a}");
    assert_eq!(
        (got.distinct_offsets, got.duplicates()),
        (400, 0),
        "A: {log_a}\nB: {log_b}"
    );
}

/// Two `--until-caught-up` processes of one group on a broker with a
/// two-round cooperative rebalance (librdkafka's mock cluster, whose
/// timing the test controls). All the records
/// are on partition 0. B joins while A drains: in the first round A gives
/// partition 0 up and B is assigned nothing. Each ends only once the
/// group's commit has passed every partition's start watermark, so one of
/// them finishes partition 0 (before, both exited 0 with 8,000 of 20,000
/// records missing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_caught_up_two_members_leave_nothing_behind() {
    let mock = rdkafka::mocking::MockCluster::new(1).unwrap();
    let topic = unique("rv-two");
    mock.create_topic(&topic, 2, 1).unwrap();
    let own = sluice_lab::fixture::Stack {
        brokers: mock.bootstrap_servers(),
        clickhouse_url: clickhouse_url(),
    };
    let t = topic.clone();
    // Everything on partition 0; partition 1 stays empty.
    tokio::task::spawn_blocking(move || own.produce(&t, 1, 0, 20_000))
        .await
        .unwrap()
        .unwrap();
    let ch = ch();
    let table = create_table(&ch, &unique("it")).await;
    let proxy = clickhouse_proxy(Duration::from_secs(30)).await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.brokers = mock.bootstrap_servers();
    spec.args = vec!["--until-caught-up".into()];
    spec.max_batch_rows = 1000;
    spec.insert_timeout = Duration::from_secs(10);
    spec.fence_wait = Duration::from_millis(500);
    spec.clickhouse_url = proxy.url.clone();
    proxy.slow_inserts(Duration::from_secs(3));
    let mut a = spec.start();
    assert!(
        a.wait_for_log("partition active", Duration::from_secs(60))
            .await,
        "{}",
        a.log_tail()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let b = spec.start();
    let (code_b, log_b) = tokio::task::spawn_blocking(move || exit_of(b, Duration::from_secs(180)))
        .await
        .unwrap();
    let (code_a, log_a) = tokio::task::spawn_blocking(move || exit_of(a, Duration::from_secs(180)))
        .await
        .unwrap();
    let got = landed(&ch, &table).await;
    assert!(
        code_a != Some(0) || code_b != Some(0) || got.distinct_offsets == 20_000,
        "both exited 0 with {} of 20000 records in ClickHouse\nA:\n{log_a}\nB:\n{log_b}",
        got.distinct_offsets
    );
}
