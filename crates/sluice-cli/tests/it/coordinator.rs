//! Owners the group coordinator does not stop in time (issue 11, item 7),
//! on Apache Kafka's real coordinator.
//!
//! Owner A of a one-partition topic keeps reaching the partition leader and
//! ClickHouse while a second sink B, in the same group, is given the
//! partition. Records keep arriving all along, so an A that went on writing
//! would insert rows that B writes too; on a plain `MergeTree` with no
//! dedup window every one of them would show.
//!
//! - Cut off: a proxy swallows A's group requests (heartbeats, commits,
//!   offset reads). A cannot read itself back in the register of owners,
//!   its lease runs out, and it stops on its own clock while the
//!   coordinator, which no longer hears from it, gives B the partition.
//! - Fenced: B joins with A's static `instance_id` (a rolling restart that
//!   started the new process before the old one stopped). The coordinator
//!   hands B A's assignment at once and fences A, which learns of it at its
//!   next heartbeat: until then both hold the partition. B's claim fence
//!   outlasts A's last inserts, and A stops with `FencedInstanceId`.

use crate::harness::*;
use sluice_lab::fixture::{PrivateBroker, Stack};
use sluice_lab::kafka_proxy::{KafkaProxy, ProxiedBroker};
use std::time::{Duration, Instant};

/// The one-partition topic, table and group on a broker of our own behind
/// a proxy; A has landed the first 1,000 records.
struct Owned {
    a: Sink,
    broker: PrivateBroker,
    proxy: KafkaProxy,
    own: Stack,
    topic: String,
    table: String,
    ch: clickhouse::Client,
    spec: SinkSpec,
}

const FIRST: u64 = 1_000;
const MORE: u64 = 3_000;

async fn owned(prefix: &str, instance_id: Option<String>) -> Owned {
    let ProxiedBroker {
        broker,
        proxy,
        stack: own,
    } = ProxiedBroker::start(&clickhouse_url()).await.unwrap();
    let topic = unique(prefix);
    own.create_topic(&topic, 1).await.unwrap();
    own.produce(&topic, 1, 0, FIRST).unwrap();
    let ch = ch();
    let table = create_table(&ch, &unique("it")).await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.brokers = proxy.addr.clone();
    spec.insert_timeout = Duration::from_secs(3);
    // 2 × insert_timeout + a 4 s lease + 5 s.
    spec.fence_wait = Duration::from_millis(15_000);
    spec.max_batch_rows = 50;
    spec.instance_id = instance_id;
    spec.session_timeout = Duration::from_secs(10);
    let a = client(&spec, "owner-a").start();
    let got = wait_for(&ch, &table, FIRST, Duration::from_secs(90)).await;
    assert_eq!(got.distinct_offsets, FIRST, "A alone: {}", a.log_tail());
    Owned {
        a,
        broker,
        proxy,
        own,
        topic,
        table,
        ch,
        spec,
    }
}

fn client(spec: &SinkSpec, id: &str) -> SinkSpec {
    let mut s = spec.clone();
    s.kafka_properties = vec![("client.id".into(), id.into())];
    s
}

impl Owned {
    /// Starts B, produces the rest over 30 s while B takes over, and counts
    /// every record once; returns B and A's full log.
    async fn second_owner_lands_everything(&self) -> Sink {
        let b = client(&self.spec, "owner-b").start();
        for chunk in 0..30 {
            self.own
                .produce(&self.topic, 1, FIRST + chunk * 100, 100)
                .unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let n = FIRST + MORE;
        wait_for_log(&b, "partition active", Duration::from_secs(60)).await;
        let got = wait_for(&self.ch, &self.table, n, Duration::from_secs(180)).await;
        // A late insert of A's has every chance to show before the count.
        tokio::time::sleep(Duration::from_secs(8)).await;
        let got = got.max_rows(landed(&self.ch, &self.table).await);
        assert_eq!(
            (got.distinct_offsets, got.duplicates()),
            (n, 0),
            "{got:?}\nA: {}\nB: {}",
            self.a.log_tail(),
            b.log_tail()
        );
        b
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_cut_off_from_the_coordinator_stops_before_the_next_one_writes() {
    let o = owned("cutoff", None).await;
    o.proxy.cut_off_group(Some("owner-a"));
    let mut b = o.second_owner_lands_everything().await;
    let log_a = std::fs::read_to_string(&o.a.log).unwrap_or_default();
    assert!(o.proxy.swallowed() > 0, "nothing was cut off");
    assert!(
        log_a.contains("cannot read the register of owners"),
        "A: {}",
        o.a.log_tail()
    );
    b.stop(Duration::from_secs(30));
    drop(o);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_fenced_by_the_coordinator_stops_and_never_writes_beside_its_successor() {
    let o = owned("fenced", Some(unique("member"))).await;
    let mut b = o.second_owner_lands_everything().await;
    let Owned { a, broker, .. } = o;
    // The coordinator fenced A: it stops by itself, with the cause.
    let (code, log_a) = exit_of(a, Duration::from_secs(60));
    assert_eq!(code, Some(2), "A: {log_a}");
    assert!(log_a.contains("FencedInstanceId"), "A: {log_a}");
    b.stop(Duration::from_secs(30));
    drop(broker);
}

/// Writes `value` into the register of owners of `group` for partition 0
/// of `topic`, as another sluice process would: its id, or 0 for clean.
fn write_register(group: &str, topic: &str, value: i64) {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", format!("{group}.sluice-owners"))
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(value))
        .unwrap();
    c.commit(&tpl, CommitMode::Sync).unwrap();
}

/// A one-partition sink with 500 records landed, whose register entry is
/// then overwritten with `taken_by` (another owner's id, or a clean mark).
/// Once the sink has seen it, 500 more records arrive and the entry becomes
/// `then`, if given. Returns the sink, the table and when the register was
/// last written.
async fn taken(
    prefix: &str,
    taken_by: i64,
    then: Option<i64>,
) -> (Sink, String, clickhouse::Client, Instant) {
    let (topic, table, ch) = setup(prefix, 1, 500).await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.insert_timeout = Duration::from_secs(3);
    // A 10 s lease, read every 2.5 s.
    spec.fence_wait = Duration::from_millis(30_000);
    spec.max_batch_rows = 100;
    let sink = spec.start();
    let got = wait_for(&ch, &table, 500, Duration::from_secs(90)).await;
    assert_eq!(got.distinct_offsets, 500, "{}", sink.log_tail());
    write_register(&spec.group, &topic, taken_by);
    let mut at = Instant::now();
    wait_for_log(
        &sink,
        "the partition was taken; waiting",
        Duration::from_secs(20),
    )
    .await;
    produce(&topic, 1, 500, 500);
    if let Some(v) = then {
        write_register(&spec.group, &topic, v);
        at = Instant::now();
    }
    (sink, table, ch, at)
}

/// The owner that took the partition marks it clean: the coordinator
/// settled on this process, which claims it back at once instead of
/// waiting out its fence (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_handed_back_clean_is_claimed_at_once() {
    let (sink, table, ch, at) = taken("handback", 4_242_424_242, Some(0)).await;
    let got = wait_for(&ch, &table, 1_000, Duration::from_secs(90)).await;
    let log = std::fs::read_to_string(&sink.log).unwrap();
    assert_eq!(
        (got.distinct_offsets, got.duplicates()),
        (1_000, 0),
        "{log}"
    );
    assert!(
        at.elapsed() < Duration::from_secs(15),
        "took {:?}: {log}",
        at.elapsed()
    );
    assert!(log.contains("handed it off cleanly"), "{log}");
}

/// Nobody took the partition, but the register says clean: this process
/// did not write that, so its own inserts may still run. It waits out its
/// fence before claiming again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_mark_nobody_earned_does_not_skip_the_fence() {
    let (sink, table, ch, at) = taken("unearned", 0, None).await;
    let got = wait_for(&ch, &table, 1_000, Duration::from_secs(120)).await;
    let log = std::fs::read_to_string(&sink.log).unwrap();
    assert_eq!(
        (got.distinct_offsets, got.duplicates()),
        (1_000, 0),
        "{log}"
    );
    assert!(
        at.elapsed() >= Duration::from_secs(25),
        "claimed back after {:?}, inside its fence: {log}",
        at.elapsed()
    );
}

/// A coordinator that gives one partition to two members: the other one
/// claims it during this process's fence. This process yields for a fence
/// instead of claiming it straight back (two claimers that each overwrote
/// the other's claim within its fence stalled the lab's `rebalance` run for
/// minutes), then claims it back and lands every record once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_lost_during_the_fence_yields_before_claiming_back() {
    const OTHER: i64 = 4_242_424_242;
    let (topic, table, ch) = setup("yield", 1, 500).await;
    let mut spec = SinkSpec::new(&topic, &table);
    spec.insert_timeout = Duration::from_secs(1);
    spec.fence_wait = Duration::from_millis(9_000);
    let mut sink = spec.start();
    wait_for_log(&sink, "no clean hand-off; claimed", Duration::from_secs(30)).await;
    write_register(&spec.group, &topic, OTHER);
    wait_for_log(
        &sink,
        "yielding before claiming them back",
        Duration::from_secs(30),
    )
    .await;
    // Claiming straight back wrote this process over the other's claim
    // within a second.
    let register = format!("{}.sluice-owners", spec.group);
    let yielded = Instant::now();
    while yielded.elapsed() < Duration::from_secs(5) {
        assert_eq!(
            committed(&brokers(), &register, &topic),
            Some(OTHER),
            "the claim was taken straight back: {}",
            sink.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let got = wait_for(&ch, &table, 500, Duration::from_secs(90)).await;
    assert_eq!(
        (got.rows, got.distinct_offsets),
        (500, 500),
        "{}",
        sink.log_tail()
    );
    assert_ne!(committed(&brokers(), &register, &topic), Some(OTHER));
    assert!(sink.stop(Duration::from_secs(30)), "{}", sink.log_tail());
}
