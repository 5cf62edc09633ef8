//! Owners the group coordinator does not stop (issue 11, item 7).
//!
//! Owner A of a one-partition topic keeps reaching the partition leader and
//! ClickHouse while a second sink B, in the same group, is given the
//! partition. Records keep arriving all along, so an A that went on writing
//! would insert rows that B writes too; on a plain `MergeTree` with no
//! dedup window every one of them would show.
//!
//! - Cut off: a proxy swallows A's group requests (heartbeats, commits,
//!   offset reads). A cannot read itself back in the register of owners,
//!   its lease runs out, and it stops on its own clock.
//! - Two owners at once: B joins with A's static `instance_id`, and the
//!   coordinator (tansu) hands B the partition without a word to A, which
//!   keeps it too. A sees B in the register of owners and stops; B's fence
//!   outlasts A's last inserts. They take the partition from each other
//!   while the coordinator keeps both, each waiting longer every time.

use crate::harness::*;
use sluice::lab::kafka_proxy::ProxiedBroker;
use std::time::Duration;

async fn second_owner(prefix: &str, cut_off: bool) {
    let ProxiedBroker {
        broker,
        proxy,
        stack: own,
    } = ProxiedBroker::start(&clickhouse_url()).await.unwrap();
    let topic = unique(prefix);
    own.create_topic(&topic, 1).await.unwrap();
    let produce = |start: u64, n: u64| {
        let (o, t) = (own.clone(), topic.clone());
        tokio::task::spawn_blocking(move || o.produce(&t, 1, start, n))
    };
    let first = 1_000;
    produce(0, first).await.unwrap().unwrap();
    let ch = ch();
    let table = create_table(&ch, &unique("it")).await;

    let group = unique("g");
    let spec = |client: &str| {
        let mut s = SinkSpec::new(&topic, &table);
        s.group = group.clone();
        s.brokers = proxy.addr.clone();
        s.kafka_properties = vec![("client.id".into(), client.into())];
        s.insert_timeout_s = 3;
        // 2 × insert_timeout + a 4 s lease + 5 s.
        s.fence_wait_ms = 15_000;
        s.max_batch_rows = 50;
        s.instance_id = (!cut_off).then(|| "member-1".to_string());
        s
    };
    let a = spec("owner-a").start();
    let got = wait_for(&ch, &table, first, Duration::from_secs(90)).await;
    assert_eq!(got.distinct_offsets, first, "A alone: {}", a.log_tail());

    if cut_off {
        proxy.cut_off_group(Some("owner-a"));
    }
    let mut b = spec("owner-b").start();
    // Records keep coming while B takes over.
    let more = 3_000;
    for chunk in 0..30 {
        produce(first + chunk * 100, 100).await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let n = first + more;
    let got = wait_for(&ch, &table, n, Duration::from_secs(180)).await;
    // A late insert of A's has every chance to show before the count.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let got = got.max_rows(landed(&ch, &table).await);
    let (log_a, log_b) = (a.log_tail(), b.log_tail());
    assert_eq!(
        (got.distinct_offsets, got.duplicates()),
        (n, 0),
        "{got:?}\nA: {log_a}\nB: {log_b}"
    );
    let full_a = std::fs::read_to_string(&a.log).unwrap_or_default();
    let full_b = std::fs::read_to_string(&b.log).unwrap_or_default();
    assert!(
        full_b.contains("partition active"),
        "B never wrote: {log_b}"
    );
    if cut_off {
        assert!(proxy.swallowed() > 0, "nothing was cut off");
        assert!(
            full_a.contains("cannot read the register of owners"),
            "A: {log_a}"
        );
    } else {
        assert!(
            full_a.contains("another owner claimed the partition")
                || full_b.contains("another owner claimed the partition"),
            "no owner saw the other: A: {log_a}\nB: {log_b}"
        );
    }
    b.stop(Duration::from_secs(30));
    drop(a);
    drop(broker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_cut_off_from_the_coordinator_stops_before_the_next_one_writes() {
    second_owner("cutoff", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_owners_of_one_partition_never_write_at_once() {
    second_owner("twoowners", false).await;
}
