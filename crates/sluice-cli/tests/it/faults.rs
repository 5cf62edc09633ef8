//! Faults between the sink and ClickHouse, and group membership changes.

use crate::harness::*;
use sluice_lab::proxy::Fault;
use sluice_protocol::token::{insert_token, query_id};
use sluice_protocol::Row;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 8;

/// Runs a sink behind a proxy that injects `fault` into its first insert;
/// returns what landed, how many ids are missing, and the sink's log.
async fn behind_proxy(fault: Fault, hold: Duration) -> (Landed, u64, String) {
    let n = 50_000;
    let (topic, table, ch) = setup("proxy", PARTITIONS, n).await;
    let proxy = clickhouse_proxy(hold).await;
    proxy.arm(fault);
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = proxy.url.clone();
    spec.insert_timeout = Duration::from_secs(3);
    spec.max_batch_rows = 2_000;
    let mut sink = spec.start();
    wait_for(&ch, &table, n, Duration::from_secs(180)).await;
    // Give a late duplicate every chance to appear before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = landed(&ch, &table).await;
    assert!(sink.stop(Duration::from_secs(60)), "{}", sink.log_tail());
    assert_eq!(proxy.fired(), 1, "the fault must have been injected");
    let log = std::fs::read_to_string(&sink.log).unwrap();
    (got, missing_ids(&ch, &table, n).await, log)
}

/// A network blip at start-up: the first reads sluice makes (its
/// connection check, the tables' columns) are held for 8 s and hung up on.
/// sluice logs them and tries again; it never exits, and every record
/// lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_held_at_start_up_are_retried_and_every_record_lands() {
    let n = 2_000;
    let (topic, table, ch) = setup("startblip", PARTITIONS, n).await;
    let proxy = clickhouse_proxy(Duration::from_secs(8)).await;
    proxy.hold_reads(2);
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = proxy.url.clone();
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, n, Duration::from_secs(120)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = got.max_rows(landed(&ch, &table).await);
    assert!(sink.is_running(), "{}", sink.log_tail());
    assert_eq!(
        (got.rows, got.distinct_offsets),
        (n, n),
        "{}",
        sink.log_tail()
    );
    assert_eq!(proxy.fired(), 2, "both reads must have been held");
    let log = std::fs::read_to_string(&sink.log).unwrap();
    assert!(
        log.contains("cannot connect to ClickHouse and check the tables yet"),
        "{log}"
    );
    assert!(sink.stop(Duration::from_secs(60)), "{}", sink.log_tail());
}

/// The documents' re-submit: the server committed, the client never heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withheld_response_after_commit_makes_no_duplicate() {
    let (got, missing, log) = behind_proxy(Fault::WithholdResponse, Duration::from_secs(8)).await;
    assert!(log.contains("reconciled"), "the sink must have reconciled");
    assert_eq!(got.duplicates(), 0, "{got:?}");
    assert_eq!((got.rows, missing), (50_000, 0), "{got:?}");
}

/// An insert whose head reaches the server at once and whose rows arrive
/// after its deadline, while its owner is killed and a new owner writes the
/// same records: ClickHouse started the query in time, but its rows are
/// checked when they are processed, so the late rows cannot commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_arrives_after_the_deadline_commits_nothing() {
    let n = 1_000;
    let (topic, table, ch) = setup("slowbody", 1, n).await;
    let hold = Duration::from_secs(30);
    let proxy = clickhouse_proxy(hold).await;
    proxy.arm(Fault::SlowBody);
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = proxy.url.clone();
    spec.insert_timeout = Duration::from_secs(3);
    spec.max_batch_rows = 2_000;
    let mut owner = spec.start();
    let deadline = Instant::now() + Duration::from_secs(60);
    while proxy.fired() == 0 {
        assert!(Instant::now() < deadline, "{}", owner.log_tail());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent = Instant::now();
    // The whole body has left the owner (the proxy holds it), then it dies.
    tokio::time::sleep(Duration::from_secs(1)).await;
    owner.kill9();
    // A new owner, straight to the server, takes the partition and writes
    // it in other batches (the same ones would share the old attempt's
    // query id, and the server would refuse them while it runs).
    spec.clickhouse_url = clickhouse_url();
    spec.max_batch_rows = 700;
    let mut next = spec.start();
    let got = wait_for(&ch, &table, n, Duration::from_secs(60)).await;
    assert_eq!(got.distinct_offsets, n, "{}", next.log_tail());
    assert!(
        sent.elapsed() < hold,
        "the new owner was too slow to show anything"
    );
    // The rest of the old body reaches the server, and its query ends.
    while proxy.late_pending() > 0 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got = landed(&ch, &table).await;
    assert!(next.stop(Duration::from_secs(60)), "{}", next.log_tail());
    assert_eq!((got.rows, got.distinct_offsets), (n, n), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_request_loses_nothing() {
    let (got, missing, _) = behind_proxy(Fault::DropRequest, Duration::from_secs(1)).await;
    assert_eq!(missing, 0, "{got:?}");
    assert_eq!(got.duplicates(), 0, "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clickhouse_down_for_a_minute() {
    let n = 200_000;
    let (_broker, kafka) = own_kafka().await;
    let topic = unique("outage");
    kafka.create_topic(&topic, PARTITIONS).await.unwrap();
    let port = free_port();
    let dir = std::env::temp_dir().join(unique("chdb"));
    let mut server = private_clickhouse(port, dir.clone(), &[]);
    let ch = ch_at(&server.url());
    let table = create_table(&ch, "outage").await;
    let (k, t) = (kafka.clone(), topic.clone());
    let producer = tokio::task::spawn_blocking(move || k.produce(&t, PARTITIONS, 0, n).unwrap());

    let mut spec = SinkSpec::new(&topic, &table);
    spec.brokers = kafka.brokers.clone();
    // Nothing here rebalances: a broker slowed by the tests beside this one
    // must not end the session.
    spec.session_timeout = Duration::from_secs(30);
    spec.clickhouse_url = server.url();
    spec.max_batch_rows = 2_000;
    spec.max_buffered_bytes = 32 << 20;
    let mut sink = spec.start();
    // Stop ClickHouse once some rows are in.
    let deadline = Instant::now() + Duration::from_secs(120);
    while landed(&ch, &table).await.rows < 20_000 {
        assert!(
            Instant::now() < deadline,
            "no progress: {}",
            sink.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.stop();
    let mut peak_rss = 0;
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(60) {
        assert!(
            sink.is_running(),
            "the sink must ride out the outage: {}",
            sink.log_tail()
        );
        peak_rss = peak_rss.max(sink.rss_kb());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    producer.await.unwrap();
    let server = private_clickhouse(port, dir, &[]);
    let ch = ch_at(&server.url());
    let got = wait_for(&ch, &table, n, Duration::from_secs(300)).await;
    let log = sink.log_tail();
    assert!(sink.stop(Duration::from_secs(60)), "{}", sink.log_tail());
    eprintln!(
        "outage: {got:?}, peak RSS during outage {} MiB",
        peak_rss / 1024
    );
    assert_eq!(missing_ids(&ch, &table, n).await, 0, "{got:?}\n{log}");
    assert_eq!(got.duplicates(), 0, "{got:?}");
    // 32 MiB of batches plus librdkafka's queue and the runtime.
    assert!(
        peak_rss < 400 * 1024,
        "memory must stay bounded: {peak_rss} KiB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_join_and_leave_during_ingest() {
    let n = 300_000;
    let (topic, table, ch) = setup("rebalance", PARTITIONS, 0).await;
    let t = topic.clone();
    let producer = tokio::task::spawn_blocking(move || {
        for chunk in 0..10 {
            produce(&t, PARTITIONS, chunk * 30_000, 30_000);
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    let mut spec = SinkSpec::new(&topic, &table);
    spec.max_batch_rows = 3_000;
    let mut a = spec.start();
    let mut b = spec.start();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mut c = spec.start();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(a.stop(Duration::from_secs(60)), "{}", a.log_tail());
    producer.await.unwrap();
    let got = wait_for(&ch, &table, n, Duration::from_secs(300)).await;
    assert!(b.stop(Duration::from_secs(60)), "{}", b.log_tail());
    assert!(c.stop(Duration::from_secs(60)), "{}", c.log_tail());
    assert_eq!(missing_ids(&ch, &table, n).await, 0, "{got:?}");
    assert_eq!(got.duplicates(), 0, "{got:?}");
}

/// The zombie: an instance frozen (SIGSTOP) past the session timeout while
/// it holds in-flight work, its partitions taken over, then woken (SIGCONT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_instance_wakes_up_without_writing() {
    let n = 200_000;
    let (topic, table, ch) = setup("zombie", PARTITIONS, 0).await;
    let t = topic.clone();
    let producer = tokio::task::spawn_blocking(move || {
        for chunk in 0..10 {
            produce(&t, PARTITIONS, chunk * 20_000, 20_000);
            std::thread::sleep(Duration::from_millis(1500));
        }
    });
    let mut spec = SinkSpec::new(&topic, &table);
    spec.max_batch_rows = 2_000;
    spec.fence_wait = Duration::from_millis(10_000);
    let mut a = spec.start();
    let mut b = spec.start();
    // Freeze A once both are inserting.
    let deadline = Instant::now() + Duration::from_secs(120);
    while landed(&ch, &table).await.rows < 30_000 {
        assert!(Instant::now() < deadline, "no progress: {}", a.log_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.signal("-STOP");
    // Past the 6 s session timeout: the group moves A's partitions to B.
    tokio::time::sleep(Duration::from_secs(15)).await;
    a.signal("-CONT");
    producer.await.unwrap();
    let got = wait_for(&ch, &table, n, Duration::from_secs(300)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let got = landed(&ch, &table).await.max_rows(got);
    assert!(a.stop(Duration::from_secs(60)), "{}", a.log_tail());
    assert!(b.stop(Duration::from_secs(60)), "{}", b.log_tail());
    let log = std::fs::read_to_string(&a.log).unwrap();
    // A wakes with its leases run out: it learns it lost its partitions
    // from librdkafka, or from the register of owners, before it writes.
    assert!(
        log.contains("lost=true") || log.contains("another owner claimed the partition"),
        "A must notice it lost its partitions: {}",
        a.log_tail()
    );
    assert_eq!(missing_ids(&ch, &table, n).await, 0, "{got:?}");
    assert_eq!(got.duplicates(), 0, "{got:?}");
}

/// One row of the test table, for an insert made by hand.
#[derive(serde::Serialize, clickhouse::Row)]
struct EventRow {
    id: u64,
    payload: String,
    _topic: String,
    _partition: u32,
    _offset: u64,
}

/// An insert an earlier owner started that still runs when a new owner has
/// claimed the partition (its part written late, past its deadline; a
/// paused server) is ended before the new owner reads the table: its rows
/// never land beside the new owner's. Here the earlier owner's insert is
/// made by hand, under the query id sluice would give an insert of these
/// rows beside rows of another partition (partition 7: the id names both),
/// and its body arrives 20 s after its head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_owners_insert_still_running_at_the_claim_is_ended_first() {
    let n = 300u64;
    let (topic, table, ch) = setup("lateowner", 1, n).await;
    let table_ref = sluice::sql::TableRef::parse(&table).unwrap();
    let table_sql = table_ref.sql();
    let rows: Vec<Row> = (0..n as i64)
        .map(|o| Row::new(0, o))
        .chain([Row::new(7, 0)])
        .collect();
    let qid = query_id(&insert_token(&table_sql, &topic, rows.into_iter()), 0);
    assert!(qid.contains("-0.7-"), "{qid}");
    let late = ch
        .clone()
        .with_database(&table_ref.database)
        .with_setting("query_id", &qid);
    let (t, tp) = (table_ref.table.clone(), topic.clone());
    let earlier = tokio::spawn(async move {
        let mut insert = late.insert::<EventRow>(&t).await?;
        for o in 0..n {
            insert
                .write(&EventRow {
                    id: o,
                    payload: "late".into(),
                    _topic: tp.clone(),
                    _partition: 0,
                    _offset: o,
                })
                .await?;
        }
        tokio::time::sleep(Duration::from_secs(20)).await;
        insert.end().await
    });
    // The head has reached the server: the insert runs.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let running: u64 = ch
            .query("SELECT count() FROM system.processes WHERE query_id = ?")
            .bind(&qid)
            .fetch_one()
            .await
            .unwrap();
        if running > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the hand-made insert never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let spec = SinkSpec::new(&topic, &table);
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, n, Duration::from_secs(60)).await;
    assert_eq!(got.distinct_offsets, n, "{}", sink.log_tail());
    // Whatever became of the earlier insert, it has ended by now.
    let ended = tokio::time::timeout(Duration::from_secs(40), earlier).await;
    let got = landed(&ch, &table).await;
    let log = sink.log_tail();
    assert!(sink.stop(Duration::from_secs(60)), "{log}");
    // Killed, or committed before the new owner read the table: either way
    // its rows are there once.
    let _ = ended.expect("the earlier insert still runs").unwrap();
    assert_eq!((got.rows, got.distinct_offsets), (n, n), "{got:?}\n{log}");
}
