//! The dead-letter topic: a record that cannot become a row counts as done
//! only once the DLQ has acknowledged it, and the sink holds its position
//! while the DLQ does not answer.

use crate::harness::*;
use crate::metrics::value;
use sluice_lab::kafka_proxy::ProxiedBroker;
use sluice_lab::poison;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_unacknowledged_holds_the_position_then_every_record_is_accounted_for() {
    // A broker reached through a proxy that can swallow produce acks: the
    // sink's DLQ writes are stored but never confirmed while it does.
    let ProxiedBroker {
        broker,
        proxy,
        stack: own,
    } = ProxiedBroker::start(&clickhouse_url()).await.unwrap();
    let topic = unique("dlqhold");
    let dlq_topic = unique("dlqhold_dlq");
    own.create_topic(&topic, 1).await.unwrap();
    own.create_topic(&dlq_topic, 1).await.unwrap();
    // 300 good records, then bad ones at 300 and 301, then 300 more good.
    let mut values: Vec<Option<String>> = (0..600u64)
        .map(|i| Some(format!(r#"{{"id":{i},"payload":"p"}}"#)))
        .collect();
    values.insert(300, Some("{not json".into()));
    values.insert(301, Some(r#"{"payload":"no id"}"#.into()));
    let b = proxy.addr.clone();
    let t = topic.clone();
    tokio::task::spawn_blocking(move || poison::produce(&b, &t, 1, &values))
        .await
        .unwrap()
        .unwrap();

    let ch = ch();
    let table = create_table(&ch, &unique("it")).await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut spec = SinkSpec::new(&topic, &table);
    spec.brokers = proxy.addr.clone();
    spec.max_batch_rows = 100;
    spec.dlq_topic = Some(dlq_topic.clone());
    spec.required = vec!["id".into()];
    spec.metrics_listen = Some(addr.clone());
    proxy.drop_acks(true);
    let mut sink = spec.start();

    // Every good row lands: the sink keeps inserting...
    let got = wait_for(&ch, &table, 600, Duration::from_secs(120)).await;
    assert_eq!(got.distinct_offsets, 600, "{}", sink.log_tail());
    // ...but the committed position stays at the first bad record while
    // its DLQ write is unconfirmed.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let held = committed(&proxy.addr, &spec.group, &topic);
    assert!(
        held.is_some_and(|o| o <= 300),
        "committed {held:?} past an unconfirmed DLQ write; {}",
        sink.log_tail()
    );
    assert!(proxy.dropped() > 0, "the proxy swallowed no ack");
    assert!(sink.is_running(), "{}", sink.log_tail());

    // The DLQ answers again: the position moves to the end.
    proxy.drop_acks(false);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let c = committed(&proxy.addr, &spec.group, &topic);
        if c == Some(602) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "committed {c:?}, want 602; {}",
            sink.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let b = proxy.addr.clone();
    let entries = tokio::task::spawn_blocking(move || {
        poison::read_dlq(&b, &dlq_topic, 2, Duration::from_secs(60))
    })
    .await
    .unwrap()
    .unwrap();
    let sources: BTreeSet<(i64, String)> =
        entries.iter().map(|e| (e.offset, e.kind.clone())).collect();
    assert_eq!(
        sources,
        BTreeSet::from([(300, "not-json".into()), (301, "missing-field".into())]),
        "{entries:?}"
    );
    assert!(entries
        .iter()
        .all(|e| e.source_topic == topic && e.partition == 0));
    assert!(entries[0].reason.contains("not valid JSON"), "{entries:?}");
    let got = landed(&ch, &table).await;
    assert_eq!((got.rows, got.distinct_ids), (600, 600));

    let (_, m) = get(&addr, "/metrics").await;
    let series = |reason: &str| {
        value(
            &m,
            &format!("sluice_dlq_records_total{{topic=\"{topic}\",reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(series("not-json"), 1.0);
    assert_eq!(series("missing-field"), 1.0);
    sink.stop(Duration::from_secs(30));
    drop(broker);
}
