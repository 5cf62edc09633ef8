//! What only a real Kafka broker does, counted on a plain `MergeTree` with
//! no dedup window: transactions (aborted records are never read under
//! `read_committed`), a compacted topic (offsets with holes), a dead-letter
//! topic with headers at volume, a broker killed with `kill -9` under load,
//! static membership across a restart, and a topic deleted and created
//! again under the same name.

use crate::harness::*;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{
    BaseProducer, BaseRecord, DefaultProducerContext, Producer, ThreadedProducer,
};
use rdkafka::{ClientConfig, Message};
use sluice_lab::poison;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// `SELECT count() FROM table WHERE cond`.
async fn count_where(ch: &clickhouse::Client, table: &str, cond: &str) -> u64 {
    ch.query(&format!("SELECT count() FROM {table} WHERE {cond}"))
        .fetch_one::<u64>()
        .await
        .unwrap()
}

/// Waits until `table` holds `want` distinct ids (or `timeout`), then gives
/// a late copy 3 s to show.
async fn settle_ids(ch: &clickhouse::Client, table: &str, want: u64, timeout: Duration) -> Landed {
    let deadline = Instant::now() + timeout;
    while landed(ch, table).await.distinct_ids < want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    landed(ch, table).await
}

/// Records of transactions that commit and of transactions that abort,
/// interleaved on two partitions: only the committed ones land, each once.
/// `sluice send --transactional-id` adds committed transactions of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_transactions_never_land_and_committed_ones_land_once() {
    let (topic, table, ch) = setup("txn", 2, 0).await;
    let t = topic.clone();
    // Committed ids: 0..1000; aborted ids: 1_000_000 and up.
    tokio::task::spawn_blocking(move || {
        let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("transactional.id", unique("txn"))
            .create()
            .unwrap();
        let t30 = Duration::from_secs(30);
        p.init_transactions(t30).unwrap();
        let mut committed = 0u64;
        for round in 0..20u64 {
            p.begin_transaction().unwrap();
            let abort = round % 3 == 1;
            for i in 0..50u64 {
                let id = if abort {
                    1_000_000 + round * 50 + i
                } else {
                    committed + i
                };
                let v = format!(r#"{{"id":{id},"payload":"r{round}"}}"#);
                let rec = BaseRecord::<(), str>::to(&t)
                    .payload(&v)
                    .partition((i % 2) as i32);
                p.send(rec).map_err(|(e, _)| e).unwrap();
            }
            if abort {
                p.abort_transaction(t30).unwrap();
            } else {
                p.commit_transaction(t30).unwrap();
                committed += 50;
            }
        }
        assert_eq!(committed, 650);
    })
    .await
    .unwrap();
    // 350 more committed, through `sluice send` in transactions of 100.
    let input: String = (650..1000u64)
        .map(|i| format!("{{\"id\":{i},\"payload\":\"send\"}}\n"))
        .collect();
    let mut cmd = sluice([
        "send",
        "--topic",
        &topic,
        "--transactional-id",
        &unique("send"),
        "--transaction-size",
        "100",
    ]);
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");

    let spec = SinkSpec::new(&topic, &table);
    let mut sink = spec.start();
    let got = settle_ids(&ch, &table, 1000, Duration::from_secs(90)).await;
    let aborted = count_where(&ch, &table, "id >= 1000000").await;
    assert_eq!(
        (got.rows, got.distinct_offsets, got.distinct_ids, aborted),
        (1000, 1000, 1000, 0),
        "{}",
        sink.log_tail()
    );
    assert!(sink.stop(Duration::from_secs(30)), "{}", sink.log_tail());
}

/// A topic with `cleanup.policy=compact` and settings that make the cleaner
/// run within seconds: the sink reads across the holes compaction leaves,
/// lands each record the log still holds once, keeps every key's last
/// value, and reaches the end of the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_topic_lands_each_remaining_record_once() {
    const KEYS: u64 = 50;
    const ROUNDS: u64 = 20;
    let topic = unique("compact");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let new = NewTopic::new(&topic, 1, TopicReplication::Fixed(1))
        .set("cleanup.policy", "compact")
        .set("segment.ms", "100")
        .set("min.cleanable.dirty.ratio", "0.01")
        .set("min.compaction.lag.ms", "0")
        .set("delete.retention.ms", "100");
    for r in admin
        .create_topics(&[new], &AdminOptions::new())
        .await
        .unwrap()
    {
        r.unwrap();
    }
    // ROUNDS rounds over the same KEYS keys; record `round * KEYS + k` has
    // key `k`. A segment rolls between rounds.
    let t = topic.clone();
    tokio::task::spawn_blocking(move || {
        let p: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("enable.idempotence", "true")
            .create()
            .unwrap();
        for round in 0..ROUNDS {
            for k in 0..KEYS {
                let id = round * KEYS + k;
                let (key, v) = (k.to_string(), format!(r#"{{"id":{id},"payload":"k{k}"}}"#));
                p.send(BaseRecord::to(&t).key(&key).payload(&v))
                    .map_err(|(e, _)| e)
                    .unwrap();
            }
            p.flush(Duration::from_secs(30)).unwrap();
            std::thread::sleep(Duration::from_millis(300));
        }
    })
    .await
    .unwrap();
    // Wait until the cleaner has removed most of the older rounds.
    let t = topic.clone();
    let remaining = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let n = read_all(&brokers(), &t).len() as u64;
            if n <= KEYS * ROUNDS / 2 || Instant::now() > deadline {
                return n;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    })
    .await
    .unwrap();
    assert!(
        remaining <= KEYS * ROUNDS / 2,
        "the cleaner left {remaining} of {} records",
        KEYS * ROUNDS
    );

    let ch = ch();
    let table = create_table(&ch, &unique("it")).await;
    let spec = SinkSpec::new(&topic, &table);
    let mut sink = spec.start();
    // Every key's last value (the last round) is never compacted away.
    let last = ROUNDS * KEYS - KEYS;
    let deadline = Instant::now() + Duration::from_secs(90);
    while count_where(&ch, &table, &format!("id >= {last}")).await < KEYS {
        assert!(Instant::now() < deadline, "{}", sink.log_tail());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got = landed(&ch, &table).await;
    let (_, high) = {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .create()
            .unwrap();
        c.fetch_watermarks(&topic, 0, Duration::from_secs(10))
            .unwrap()
    };
    let max_offset: u64 = ch
        .query(&format!("SELECT max(_offset) FROM {table}"))
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(got.duplicates(), 0, "{got:?}: {}", sink.log_tail());
    assert!(
        got.rows < KEYS * ROUNDS && got.rows >= KEYS,
        "{got:?} of {} produced, {remaining} left by the cleaner",
        KEYS * ROUNDS
    );
    assert_eq!(max_offset + 1, high as u64, "{}", sink.log_tail());
    assert_eq!(
        count_where(&ch, &table, &format!("id >= {last}")).await,
        KEYS
    );
    assert!(sink.stop(Duration::from_secs(30)), "{}", sink.log_tail());
}

/// Every record of one-partition `topic` as it is now: (offset, key).
fn read_all(brokers: &str, topic: &str) -> Vec<(i64, Option<Vec<u8>>)> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    let (_, high) = c
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, rdkafka::Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut out: Vec<(i64, Option<Vec<u8>>)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.last().is_none_or(|(o, _)| *o + 1 < high) && Instant::now() < deadline {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
            out.push((m.offset(), m.key().map(<[u8]>::to_vec)));
        }
    }
    out
}

/// 20,000 records, one in four bad: not JSON or without `id` (sluice's
/// own checks), and one in 200 a value only the server refuses: every bad
/// one is in the dead-letter topic with headers naming its topic,
/// partition, offset and kind, and every good one is a row, once.
/// (ClickHouse names one refused row per attempt: a batch with k of them
/// costs k attempts, 100 here. With one in twelve, 1,666, the attempts
/// took 45 s on an idle stack and over 10 minutes beside the suite.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_topic_takes_thousands_of_records_with_their_headers() {
    const N: u64 = 20_000;
    let topic = unique("dlqbulk");
    let dlq = unique("dlqbulk_dlq");
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    let mut bad = BTreeSet::new();
    let values: Vec<Option<String>> = (0..N)
        .map(|i| {
            if i % 4 != 3 {
                return Some(format!(r#"{{"id":{i},"payload":"ok"}}"#));
            }
            let kind = match i % 200 {
                199 => "rejected",
                _ => ["not-json", "missing-field"][(i / 4 % 2) as usize],
            };
            bad.insert((i as i64, kind.to_string()));
            Some(match kind {
                "not-json" => format!(r#"{{"id":{i},"#),
                "missing-field" => format!(r#"{{"payload":"no id {i}"}}"#),
                _ => format!(r#"{{"id":"n{i}","payload":"wrong type"}}"#),
            })
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
    spec.dlq_topic = Some(dlq.clone());
    spec.required = vec!["id".into()];
    let mut sink = spec.start();
    let good = N - bad.len() as u64;
    let got = settle_ids(&ch, &table, good, Duration::from_secs(180)).await;
    assert_eq!(
        (got.rows, got.distinct_offsets, got.distinct_ids),
        (good, good, good),
        "{}",
        sink.log_tail()
    );
    let d = dlq.clone();
    let entries = tokio::task::spawn_blocking(move || {
        poison::read_dlq(&brokers(), &d, bad_len(N), Duration::from_secs(120))
    })
    .await
    .unwrap()
    .unwrap();
    let got_bad: BTreeSet<(i64, String)> =
        entries.iter().map(|e| (e.offset, e.kind.clone())).collect();
    assert!(
        entries
            .iter()
            .all(|e| e.source_topic == topic && e.partition == 0 && !e.reason.is_empty()),
        "{:?}",
        &entries[..3]
    );
    assert_eq!(got_bad.len(), bad.len());
    assert_eq!(
        got_bad.difference(&bad).next(),
        None,
        "a DLQ entry for a good record or of the wrong kind"
    );
    assert!(sink.stop(Duration::from_secs(30)), "{}", sink.log_tail());
}

fn bad_len(n: u64) -> usize {
    (n / 4) as usize
}

/// The test's own broker is killed with `kill -9` twice while records keep
/// arriving and the sink keeps writing; it recovers its log and comes back.
/// Every record produced lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_under_load_loses_and_duplicates_nothing() {
    const N: u64 = 30_000;
    let (mut broker, kafka) = own_kafka().await;
    let (topic, table, ch) = setup_on(&kafka, "brokerkill", 4, 0).await;
    let (k, t) = (kafka.clone(), topic.clone());
    // 30 chunks of 1,000, one every 300 ms; a chunk sent while the broker is
    // down waits for it (the producer is idempotent).
    let producing = tokio::task::spawn_blocking(move || {
        for c in 0..30 {
            k.produce(&t, 4, c * 1000, 1000).unwrap();
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    let mut spec = SinkSpec::new(&topic, &table);
    spec.brokers = kafka.brokers.clone();
    spec.max_batch_rows = 500;
    let mut sink = spec.start();
    for _ in 0..2 {
        let before = landed(&ch, &table).await.rows;
        let deadline = Instant::now() + Duration::from_secs(60);
        while landed(&ch, &table).await.rows < before + 2000 {
            assert!(Instant::now() < deadline, "{}", sink.log_tail());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        broker.kill();
        tokio::time::sleep(Duration::from_secs(4)).await;
        broker.resume().await.unwrap();
    }
    producing.await.unwrap();
    let got = settle_ids(&ch, &table, N, Duration::from_secs(180)).await;
    assert_eq!(
        (got.rows, got.distinct_offsets, got.distinct_ids),
        (N, N, N),
        "{}",
        sink.log_tail()
    );
    assert!(sink.is_running(), "{}", sink.log_tail());
    assert!(sink.stop(Duration::from_secs(30)), "{}", sink.log_tail());
}

/// docs/operations.md's rolling restart with static members: a member stopped and
/// started again within its session gets its own partitions back, and the
/// other member never loses or gains one (no rebalance moves them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_members_keep_their_partitions_across_a_restart() {
    let (topic, table, ch) = setup("static", 4, 1000).await;
    let group = unique("g");
    let spec = |member: &str| {
        let mut s = SinkSpec::new(&topic, &table);
        s.group = group.clone();
        s.instance_id = Some(member.to_string());
        s.session_timeout = Duration::from_secs(30);
        s.max_batch_rows = 100;
        s
    };
    let mut a = spec("m-a").start();
    let b = spec("m-b").start();
    let got = wait_for(&ch, &table, 1000, Duration::from_secs(90)).await;
    assert_eq!(got.distinct_offsets, 1000, "{}", b.log_tail());
    let assigned = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains("assigned") || l.contains("revoked"))
            .map(String::from)
            .collect()
    };
    let b_before = assigned(&std::fs::read_to_string(&b.log).unwrap());
    let a_before = held(&std::fs::read_to_string(&a.log).unwrap());
    assert!(a.stop(Duration::from_secs(60)), "{}", a.log_tail());
    produce(&topic, 4, 1000, 1000);
    let a2 = spec("m-a").start();
    let got = wait_for(&ch, &table, 2000, Duration::from_secs(90)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got = got.max_rows(landed(&ch, &table).await);
    assert_eq!(
        (got.rows, got.distinct_offsets),
        (2000, 2000),
        "{}\n{}",
        a2.log_tail(),
        b.log_tail()
    );
    let b_after = assigned(&std::fs::read_to_string(&b.log).unwrap());
    assert_eq!(b_after, b_before, "B's partitions moved: {}", b.log_tail());
    let a2_held = held(&std::fs::read_to_string(&a2.log).unwrap());
    assert!(!a2_held.is_empty(), "{}", a2.log_tail());
    assert_eq!(a2_held, a_before, "A came back to other partitions");
}

/// The partitions a sink holds at the end of its log: each "assigned" line
/// adds its partitions, each "revoked" line takes them away (cooperative
/// rebalances hand out and take back increments, eager ones whole sets).
fn held(log: &str) -> std::collections::BTreeSet<String> {
    let mut held = std::collections::BTreeSet::new();
    for line in log.lines() {
        let Some(list) = line.split("partitions=").nth(1) else {
            continue;
        };
        let names = list.split('"').skip(1).step_by(2).map(String::from);
        if line.contains("revoked") {
            for name in names {
                held.remove(&name);
            }
        } else if line.contains("assigned") {
            held.extend(names);
        }
    }
    held
}

/// A route's topic that does not exist yet when the sink starts is read
/// once it is created: within seconds, not librdkafka's default metadata
/// refresh of 5 minutes (a topic created by a deploy beside the sink).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_created_after_the_start_is_read_within_seconds() {
    let topic = unique("late_topic");
    let ch = ch();
    let table = create_table(&ch, &unique("it")).await;
    let spec = SinkSpec::new(&topic, &table);
    let mut sink = spec.start();
    wait_for_log(&sink, "Unknown topic or partition", Duration::from_secs(60)).await;
    stack()
        .create_topic(&topic, 2)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    produce(&topic, 2, 0, 100);
    let got = wait_for(&ch, &table, 100, Duration::from_secs(60)).await;
    assert_eq!(
        (got.distinct_offsets, got.duplicates()),
        (100, 0),
        "{}",
        sink.log_tail()
    );
    assert!(sink.stop(Duration::from_secs(60)), "{}", sink.log_tail());
}

async fn recreate_topic(topic: &str, partitions: i32) {
    stack()
        .recreate_topic(topic, partitions)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
}

/// A topic deleted and created again under the same name starts its
/// offsets at 0, under rows the table holds for the old one: reading on
/// would take them for the new records and skip those. sluice stops, exit
/// 2, naming the partition and the offsets; once the operator moved the old
/// rows out (docs/operations.md's way), every new record lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_topic_stops_the_sink_until_the_old_rows_are_moved_out() {
    let (topic, table, ch) = setup("recreated", 2, 200).await;
    let spec = SinkSpec::new(&topic, &table);
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, 200, Duration::from_secs(90)).await;
    assert_eq!(got.distinct_offsets, 200, "{}", sink.log_tail());
    assert!(sink.stop(Duration::from_secs(60)), "{}", sink.log_tail());

    recreate_topic(&topic, 2).await;
    produce(&topic, 2, 1_000, 50);
    let (code, log) = exit_of(spec.start(), Duration::from_secs(90));
    assert_eq!(code, Some(2), "{log}");
    for p in 0..2 {
        let says = format!(
            "partition {topic}[{p}]: ClickHouse holds rows up to offset 99 but the log ends before 25"
        );
        assert!(log.contains(&says), "{log}");
    }
    // Producers go on: the new log passes the old offsets, and the
    // numbers alone would no longer show it. The mark does.
    produce(&topic, 2, 1_050, 250);
    let (code, log) = exit_of(spec.start(), Duration::from_secs(90));
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("an earlier start found"), "{log}");
    let rows = landed(&ch, &table).await.rows;
    assert_eq!(rows, 200, "nothing written meanwhile");

    // The operator keeps the old rows elsewhere and takes them out...
    let archive = format!("{table}_before_recreate");
    exec(&ch, &format!("CREATE TABLE {archive} AS {table}")).await;
    let old = format!("_topic = '{topic}'");
    let keep = format!("INSERT INTO {archive} SELECT * FROM {table} WHERE {old}");
    exec(&ch, &keep).await;
    let delete = format!("ALTER TABLE {table} DELETE WHERE {old} SETTINGS mutations_sync = 2");
    exec(&ch, &delete).await;
    // ...and resets the group's position, which clears the mark.
    reset_to_earliest(&spec.group, &topic, 2);
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, 300, Duration::from_secs(90)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got = got.max_rows(landed(&ch, &table).await);
    assert_eq!(
        (got.rows, got.distinct_ids, got.duplicates()),
        (300, 300, 0),
        "{}",
        sink.log_tail()
    );
    assert_eq!(count_where(&ch, &archive, "1").await, 200);
    assert_eq!(count_where(&ch, &table, "id < 1000").await, 0);
    assert!(sink.stop(Duration::from_secs(60)), "{}", sink.log_tail());
}

fn reset_to_earliest(group: &str, topic: &str, partitions: i32) {
    stack()
        .reset_to_earliest(group, topic, partitions)
        .unwrap_or_else(|e| panic!("{e:#}"));
}
