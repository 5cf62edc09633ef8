//! `extra_fields = "dlq"`: a record with a top-level field its table has no
//! column for goes to the DLQ as an `extra-field`, on JSON and Avro routes
//! alike; once the column is added, records with the field land. Counted on
//! a plain `MergeTree` with no dedup window: nothing lost, nothing doubled.

use crate::binary::{framed, produce_raw, SCHEMA_V1, SCHEMA_V2};
use crate::harness::*;
use crate::registry::{register, registry_url};
use sluice::lab::poison::read_dlq;
use std::collections::BTreeSet;
use std::ops::Range;
use std::time::Duration;

async fn extra_fields_wait_for_their_column(format: &'static str) {
    let topic = unique(&format!("extra_{format}"));
    let dlq = unique("extra_dlq");
    stack().create_topic(&topic, 1).await.unwrap();
    stack().create_topic(&dlq, 1).await.unwrap();
    let ch = ch();
    let table = create_table(&ch, &unique("extra")).await;
    let subject = format!("{topic}-value");
    let body = |s: &str| serde_json::json!({ "schema": s });
    let ids = match format {
        "avro" => Some((
            register(&registry_url(), None, &subject, body(SCHEMA_V1)).await as u32,
            register(&registry_url(), None, &subject, body(SCHEMA_V2)).await as u32,
        )),
        _ => None,
    };
    // Records `range`, with the field `extra` (1) or without.
    let records = |extra: bool, range: Range<u64>| match ids {
        Some((_, v2)) if extra => framed(SCHEMA_V2, v2, range),
        Some((v1, _)) => framed(SCHEMA_V1, v1, range),
        None => range
            .map(|i| {
                let more = if extra { r#","extra":1"# } else { "" };
                format!(r#"{{"id":{i},"payload":"p{i}"{more}}}"#).into_bytes()
            })
            .collect(),
    };
    let b = brokers();
    produce_raw(&b, &topic, 0, &records(false, 0..100));
    produce_raw(&b, &topic, 0, &records(true, 100..150));
    produce_raw(&b, &topic, 0, &records(false, 150..200));

    let mut spec = SinkSpec::new(&topic, &table);
    spec.format = format;
    spec.schema_registry = Some(registry_url());
    spec.dlq_topic = Some(dlq.clone());
    spec.extra_fields = Some("dlq");
    spec.max_batch_rows = 40;
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, 150, Duration::from_secs(90)).await;
    assert_eq!(
        (got.rows, got.distinct_offsets),
        (150, 150),
        "{}",
        sink.log_tail()
    );
    let dlq_read = dlq.clone();
    let entries = tokio::task::spawn_blocking(move || {
        read_dlq(&brokers(), &dlq_read, 50, Duration::from_secs(60)).unwrap()
    })
    .await
    .unwrap();
    let refused: BTreeSet<(i64, String)> =
        entries.iter().map(|e| (e.offset, e.kind.clone())).collect();
    let want: BTreeSet<(i64, String)> = (100..150).map(|o| (o, "extra-field".into())).collect();
    assert_eq!(refused, want, "{entries:?}");
    assert!(
        entries[0].reason.contains("`extra`"),
        "{}",
        entries[0].reason
    );

    // The column comes: records with the field land with it (the sink
    // reads the columns again before it refuses one).
    exec(&ch, &format!("ALTER TABLE {table} ADD COLUMN extra Int32")).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    produce_raw(&b, &topic, 0, &records(true, 200..300));
    let got = wait_for(&ch, &table, 250, Duration::from_secs(90)).await;
    assert_eq!(
        (got.rows, got.distinct_offsets, got.distinct_ids),
        (250, 250, 250),
        "{}",
        sink.log_tail()
    );
    let extras: u64 = ch
        .query(&format!(
            "SELECT toUInt64(sum(extra)) FROM {table} WHERE id >= 200"
        ))
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(extras, 100);
    let entries = tokio::task::spawn_blocking(move || {
        read_dlq(&brokers(), &dlq, 50, Duration::from_secs(30)).unwrap()
    })
    .await
    .unwrap();
    assert_eq!(entries.len(), 50, "nothing more went to the DLQ");
    sink.stop(Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_records_with_a_field_the_table_lacks_go_to_the_dlq_until_it_has_the_column() {
    extra_fields_wait_for_their_column("json").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_records_with_a_field_the_table_lacks_go_to_the_dlq_until_it_has_the_column() {
    extra_fields_wait_for_their_column("avro").await;
}
