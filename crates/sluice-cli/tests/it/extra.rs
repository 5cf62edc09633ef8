//! `extra_fields = "dlq"`: a record with a top-level field its table has no
//! column for goes to the DLQ as an `extra-field`, on JSON and Avro routes
//! alike; once the column is added, records with the field land. Counted on
//! a plain `MergeTree` with no dedup window: nothing lost, nothing doubled.

use crate::binary::{framed, produce_raw, SCHEMA_V1, SCHEMA_V2};
use crate::harness::*;
use crate::registry::{register, registry_url};
use sluice_lab::poison::read_dlq;
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

// ---------------------------------------------------------------------
// Adversarial cases: columns dropped while running, fields named like
// columns an insert cannot take, crashes around a change of columns, and a
// server that does not answer the read of the columns.
// ---------------------------------------------------------------------

/// The DLQ entries of `dlq` (one partition), waiting up to `wait` for at
/// least `at_least` of them.
async fn dlq_entries(
    dlq: &str,
    at_least: usize,
    wait: Duration,
) -> Vec<sluice_lab::poison::DlqEntry> {
    let dlq = dlq.to_string();
    tokio::task::spawn_blocking(move || read_dlq(&brokers(), &dlq, at_least, wait).unwrap())
        .await
        .unwrap()
}

/// JSON records `range` (`id`, `payload`), each with `more` appended inside
/// the object (`,"x":1` or "").
fn json_records(range: Range<u64>, more: &str) -> Vec<Vec<u8>> {
    range
        .map(|i| format!(r#"{{"id":{i},"payload":"p{i}"{more}}}"#).into_bytes())
        .collect()
}

async fn u64_of(ch: &clickhouse::Client, sql: &str) -> u64 {
    ch.query(sql)
        .fetch_one::<u64>()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// A column dropped after the sink started is still in its cached columns,
/// so the early check lets its field through; ClickHouse, inserting without
/// skipping unknown fields, refuses those rows, and they go to the DLQ as
/// extra-field: no value is dropped without a trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_dropped_while_running_sends_its_field_to_the_dlq() {
    let topic = unique("xatk_drop");
    let dlq = unique("xatk_drop_dlq");
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    let ch = ch();
    let table = create_table(&ch, &unique("xatk")).await;
    exec(&ch, &format!("ALTER TABLE {table} ADD COLUMN x Int32")).await;
    let b = brokers();
    produce_raw(&b, &topic, 0, &json_records(0..10, r#","x":1"#));
    let mut spec = SinkSpec::new(&topic, &table);
    spec.dlq_topic = Some(dlq.clone());
    spec.extra_fields = Some("dlq");
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, 10, Duration::from_secs(60)).await;
    assert_eq!(got.distinct_offsets, 10, "{}", sink.log_tail());

    exec(&ch, &format!("ALTER TABLE {table} DROP COLUMN x")).await;
    // Well past REREAD_AFTER: the column is gone for 3 s before the
    // records come.
    tokio::time::sleep(Duration::from_secs(3)).await;
    produce_raw(&b, &topic, 0, &json_records(10..20, r#","x":7"#));
    // Give the sink time to decide either way.
    let got = wait_for(&ch, &table, 20, Duration::from_secs(20)).await;
    let entries = dlq_entries(&dlq, 10, Duration::from_secs(10)).await;
    sink.stop(Duration::from_secs(30));
    assert_eq!(
        (got.distinct_offsets, entries.len()),
        (10, 10),
        "records 10..20 carry x = 7, which the table has no column for any more: \
         expected them in the DLQ as extra-field; table holds {} rows, DLQ {:?}",
        got.distinct_offsets,
        entries
    );
    assert!(
        entries.iter().all(|e| e.kind == "extra-field"),
        "{entries:?}"
    );
}

/// A field named like a MATERIALIZED, ALIAS or EPHEMERAL column has no
/// place in sluice's insert (`SELECT * FROM input()` leaves EPHEMERAL
/// columns out): the record goes to the DLQ, none is dropped silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_named_like_a_materialized_alias_or_ephemeral_column_goes_to_the_dlq() {
    let topic = unique("xatk_mat");
    let dlq = unique("xatk_mat_dlq");
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    let ch = ch();
    let db = unique("xatk");
    exec(&ch, &format!("CREATE DATABASE {db}")).await;
    let table = format!("{db}.events");
    // (A column `d DEFAULT e` beside `e EPHEMERAL` makes every insert of
    // the sink fail on 26.9 with code 47, unrelated to this feature.)
    exec(
        &ch,
        &format!(
            "CREATE TABLE {table} (
                id UInt64, payload String,
                m UInt64 MATERIALIZED id * 2, a UInt64 ALIAS id + 1,
                e UInt64 EPHEMERAL,
                _topic LowCardinality(String), _partition UInt32, _offset UInt64
            ) ENGINE = MergeTree ORDER BY (_topic, _partition, _offset)"
        ),
    )
    .await;
    let b = brokers();
    produce_raw(&b, &topic, 0, &json_records(0..3, r#","m":999"#));
    produce_raw(&b, &topic, 0, &json_records(3..6, r#","a":999"#));
    produce_raw(&b, &topic, 0, &json_records(6..9, r#","e":999"#));
    let mut spec = SinkSpec::new(&topic, &table);
    spec.dlq_topic = Some(dlq.clone());
    spec.extra_fields = Some("dlq");
    let mut sink = spec.start();
    let entries = dlq_entries(&dlq, 9, Duration::from_secs(30)).await;
    let got = landed(&ch, &table).await;
    let tail = sink.log_tail();
    sink.stop(Duration::from_secs(30));
    let refused: BTreeSet<(i64, String)> =
        entries.iter().map(|e| (e.offset, e.kind.clone())).collect();
    let want: BTreeSet<(i64, String)> = (0..9).map(|o| (o, "extra-field".into())).collect();
    assert_eq!(refused, want, "{tail}");
    assert_eq!(got.rows, 0, "{tail}");
}

/// kill -9 after the DLQ acknowledged a refused record but before the
/// commit passed it; the operator adds the column; the next owner reads the
/// record again, and it lands. Nothing is lost; the record may sit in the
/// DLQ too (docs/limits.md: the DLQ is at-least-once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_then_column_added_then_kill9_loses_nothing() {
    let topic = unique("xatk_add");
    let dlq = unique("xatk_add_dlq");
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    let ch = ch();
    let table = create_table(&ch, &unique("xatk")).await;
    let b = brokers();
    produce_raw(&b, &topic, 0, &json_records(0..5, ""));
    produce_raw(&b, &topic, 0, &json_records(5..10, r#","extra":1"#));
    let mut spec = SinkSpec::new(&topic, &table);
    spec.dlq_topic = Some(dlq.clone());
    spec.extra_fields = Some("dlq");
    // The window between the DLQ's acknowledgement and the commit, held
    // open (with the default 1 s it is open for up to a second).
    spec.commit_interval = Duration::from_millis(600_000);
    let mut a = spec.start();
    let got = wait_for(&ch, &table, 5, Duration::from_secs(60)).await;
    assert_eq!(got.distinct_offsets, 5, "{}", a.log_tail());
    let entries = dlq_entries(&dlq, 5, Duration::from_secs(60)).await;
    assert_eq!(entries.len(), 5, "{entries:?}");
    // Let the batch holding them complete (its letters acknowledged).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = committed(&b, &spec.group, &topic);
    a.kill9();

    exec(&ch, &format!("ALTER TABLE {table} ADD COLUMN extra Int32")).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut bsink = spec.start();
    assert!(
        bsink
            .wait_for_log("partition active", Duration::from_secs(90))
            .await,
        "inconclusive: the second sink never took the partition: {}",
        bsink.log_tail()
    );
    // B reads offsets 5..10 again: they land (and are in both places), or
    // are refused again (a second DLQ copy each).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let got = loop {
        let got = landed(&ch, &table).await;
        let again = dlq_entries(&dlq, 0, Duration::from_secs(2)).await.len();
        if got.distinct_offsets >= 10 || again >= 10 || std::time::Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let tail = bsink.log_tail();
    bsink.stop(Duration::from_secs(30));
    let entries = dlq_entries(&dlq, 5, Duration::from_secs(5)).await;
    assert!(
        got.distinct_offsets >= 10 || entries.len() >= 10,
        "inconclusive: B decided nothing about 5..10 in 60 s: {got:?} {entries:?}\n{tail}"
    );
    let in_dlq: BTreeSet<i64> = entries.iter().map(|e| e.offset).collect();
    let in_table = u64_of(
        &ch,
        &format!("SELECT toUInt64(count()) FROM {table} WHERE _offset >= 5"),
    )
    .await;
    assert!(
        in_table == 5 || in_dlq.len() == 5,
        "committed before the crash: {before:?}; of offsets 5..10, {in_dlq:?} are in the DLQ \
         and {in_table} in the table (table: {got:?})"
    );
    assert_eq!(got.duplicates(), 0, "{got:?}");
}

/// The other direction: rows landed, kill -9 before the commit, the column
/// is dropped; the next owner reads the records again (a DLQ'd record in
/// the range keeps the zone from being skipped). Those may be stored
/// already: the early check leaves them to the writer, which finds them
/// stored, so none goes to the DLQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn landed_then_column_dropped_then_kill9_sends_no_stored_row_to_the_dlq() {
    let topic = unique("xatk_rep");
    let dlq = unique("xatk_rep_dlq");
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    let ch = ch();
    let table = create_table(&ch, &unique("xatk")).await;
    exec(&ch, &format!("ALTER TABLE {table} ADD COLUMN x Int32")).await;
    let b = brokers();
    produce_raw(&b, &topic, 0, &json_records(0..5, r#","x":1"#));
    produce_raw(&b, &topic, 0, &[b"not json".to_vec()]);
    produce_raw(&b, &topic, 0, &json_records(6..10, r#","x":1"#));
    let mut spec = SinkSpec::new(&topic, &table);
    spec.dlq_topic = Some(dlq.clone());
    spec.extra_fields = Some("dlq");
    spec.commit_interval = Duration::from_millis(600_000);
    let mut a = spec.start();
    let got = wait_for(&ch, &table, 9, Duration::from_secs(60)).await;
    assert_eq!(got.distinct_offsets, 9, "{}", a.log_tail());
    let first = dlq_entries(&dlq, 1, Duration::from_secs(30)).await;
    assert_eq!(first.len(), 1, "{first:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = committed(&b, &spec.group, &topic);
    a.kill9();

    exec(&ch, &format!("ALTER TABLE {table} DROP COLUMN x")).await;
    let mut bsink = spec.start();
    // The not-json record is written again (the DLQ is at-least-once):
    // wait for that copy, then some more.
    let entries = dlq_entries(&dlq, 2, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let entries = dlq_entries(&dlq, entries.len(), Duration::from_secs(5)).await;
    bsink.stop(Duration::from_secs(30));
    let got = landed(&ch, &table).await;
    let stored_and_refused: Vec<_> = entries
        .iter()
        .filter(|e| e.kind == "extra-field")
        .map(|e| e.offset)
        .collect();
    assert!(
        stored_and_refused.is_empty(),
        "committed before the crash: {before:?}; table {got:?}; \
         offsets in the table and in the DLQ as extra-field: {stored_and_refused:?}"
    );
}

/// A proxy in front of ClickHouse that, while `hang` is set, never forwards
/// a request that reads system.columns (the client waits until its own
/// bound); everything else passes.
struct ColumnsHang {
    url: String,
    hang: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ColumnsHang {
    async fn start() -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let upstream = clickhouse_url()
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let hang = std::sync::Arc::new(AtomicBool::new(false));
        let h = hang.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (h, up) = (h.clone(), upstream.clone());
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&up).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let down = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    });
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let chunk = &buf[..n];
                        // A binary insert names system.columns in its
                        // guard: only reads are held.
                        let columns = (chunk.windows(14).any(|w| w == b"system.columns")
                            || chunk.windows(16).any(|w| w == b"system%2Ecolumns"))
                            && !chunk.windows(6).any(|w| w == b"INSERT");
                        if columns && h.load(Ordering::SeqCst) {
                            // Never forwarded, never answered: held
                            // until the client gives up and hangs up.
                            while let Ok(n) = cr.read(&mut buf).await {
                                if n == 0 {
                                    break;
                                }
                            }
                            break;
                        }
                        if sw.write_all(chunk).await.is_err() {
                            break;
                        }
                    }
                    down.abort();
                });
            }
        });
        Self { url, hang }
    }
}

/// While ClickHouse does not answer the columns read (only that read here:
/// inserts go on), a record with an extra field holds back only its own
/// partition while the read runs off the consumer thread (2 s at most,
/// then the columns last read decide); a blocking read there would make
/// the records without extra fields, on any partition, wait behind it.
/// Asserted: the ten good records land within 25 s while ten extra-field
/// records are interleaved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_columns_read_holds_the_consumer_thread_at_most_briefly() {
    let topic = unique("xatk_hang");
    let dlq = unique("xatk_hang_dlq");
    create_topic(&topic, 2).await;
    create_topic(&dlq, 1).await;
    let ch = ch();
    let table = create_table(&ch, &unique("xatk")).await;
    let proxy = ColumnsHang::start().await;
    let b = brokers();
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = proxy.url.clone();
    spec.dlq_topic = Some(dlq.clone());
    spec.extra_fields = Some("dlq");
    spec.insert_timeout = Duration::from_secs(5);
    let mut sink = spec.start();
    produce_raw(&b, &topic, 1, &json_records(0..10, ""));
    let got = wait_for(&ch, &table, 10, Duration::from_secs(60)).await;
    assert_eq!(got.distinct_offsets, 10, "{}", sink.log_tail());

    proxy.hang.store(true, std::sync::atomic::Ordering::SeqCst);
    let started = std::time::Instant::now();
    // Extra-field records on partition 0, good ones on partition 1, in turn.
    for i in 0..10u64 {
        produce_raw(
            &b,
            &topic,
            0,
            &json_records(100 + i..101 + i, r#","extra":1"#),
        );
        produce_raw(&b, &topic, 1, &json_records(10 + i..11 + i, ""));
    }
    let got = wait_for(&ch, &table, 20, Duration::from_secs(25)).await;
    let took = started.elapsed();
    let log = std::fs::read_to_string(&sink.log).unwrap_or_default();
    let rereads = log.matches("cannot read the table's columns again").count();
    proxy.hang.store(false, std::sync::atomic::Ordering::SeqCst);
    let end = wait_for(&ch, &table, 20, Duration::from_secs(240)).await;
    let total = started.elapsed();
    sink.stop(Duration::from_secs(30));
    assert_eq!(
        got.distinct_offsets, 20,
        "after {took:?} only {} of the 20 good rows landed ({rereads} failed column reads; \
         all 20 after {total:?}: {end:?})",
        got.distinct_offsets
    );
}

/// A column dropped after the sink read the columns: the early check still
/// takes the field for a column, so the records reach ClickHouse, which
/// refuses the batch naming one row. The writer sends every row of the
/// batch with that field to the DLQ at once, and the early check reads the
/// columns again: a thousand such rows cost a few attempts, not one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_with_a_dropped_column_cost_a_few_attempts_not_one_each() {
    let n = 1_000u64;
    let ch = ch();
    let topic = unique("xatk_cost");
    let dlq = unique("xatk_cost_dlq");
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    let table = create_table(&ch, &unique("xatk")).await;
    exec(&ch, &format!("ALTER TABLE {table} ADD COLUMN x Int32")).await;
    let b = brokers();
    produce_raw(&b, &topic, 0, &json_records(0..1, r#","x":1"#));
    let mut spec = SinkSpec::new(&topic, &table);
    spec.dlq_topic = Some(dlq.clone());
    spec.extra_fields = Some("dlq");
    spec.max_batch_rows = n as usize;
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, 1, Duration::from_secs(60)).await;
    assert_eq!(got.distinct_offsets, 1, "{}", sink.log_tail());
    exec(&ch, &format!("ALTER TABLE {table} DROP COLUMN x")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = std::time::Instant::now();
    produce_raw(&b, &topic, 0, &json_records(1..n + 1, r#","x":1"#));
    let entries = dlq_entries(&dlq, n as usize, Duration::from_secs(180)).await;
    let took = started.elapsed();
    let log = std::fs::read_to_string(&sink.log).unwrap_or_default();
    let attempts = log.matches("ClickHouse rejected rows").count();
    sink.stop(Duration::from_secs(30));
    let got = landed(&ch, &table).await;
    let offsets: BTreeSet<i64> = entries.iter().map(|e| e.offset).collect();
    assert_eq!(offsets, (1..=n as i64).collect(), "{got:?}");
    assert!(entries.iter().all(|e| e.kind == "extra-field"));
    assert_eq!(got.rows, 1);
    assert!(
        attempts <= 10,
        "{} DLQ entries, {got:?} in the table, after {took:?}: {attempts} insert attempts \
         for {n} rows refused one at a time",
        entries.len()
    );
}

/// ClickHouse's refusal names the field and then the row (`…: <field>: (at
/// row N)`); a field whose own name reads `(at row 1)` must not send row 1
/// to the DLQ in its place. Only the rows that carry the field go, and every
/// other row of the batch lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_named_like_a_row_number_sends_only_the_rows_that_carry_it() {
    let ch = ch();
    let topic = unique("xatk_named");
    let dlq = unique("xatk_named_dlq");
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    let table = create_table(&ch, &unique("xatk")).await;
    exec(
        &ch,
        &format!("ALTER TABLE {table} ADD COLUMN `z (at row 1)` Int32"),
    )
    .await;
    let b = brokers();
    produce_raw(&b, &topic, 0, &json_records(0..1, r#","z (at row 1)":1"#));
    let mut spec = SinkSpec::new(&topic, &table);
    spec.dlq_topic = Some(dlq.clone());
    spec.extra_fields = Some("dlq");
    spec.max_batch_rows = 100;
    let mut sink = spec.start();
    let got = wait_for(&ch, &table, 1, Duration::from_secs(60)).await;
    assert_eq!(got.distinct_offsets, 1, "{}", sink.log_tail());
    exec(
        &ch,
        &format!("ALTER TABLE {table} DROP COLUMN `z (at row 1)`"),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Offsets 1..=5 lack the field; offset 6 carries it.
    let mut records = json_records(1..6, "");
    records.extend(json_records(6..7, r#","z (at row 1)":7"#));
    produce_raw(&b, &topic, 0, &records);
    let got = wait_for(&ch, &table, 6, Duration::from_secs(30)).await;
    let entries = dlq_entries(&dlq, 1, Duration::from_secs(10)).await;
    sink.stop(Duration::from_secs(30));
    let in_dlq: Vec<i64> = entries.iter().map(|e| e.offset).collect();
    assert_eq!((got.distinct_offsets, in_dlq), (6, vec![6]), "{entries:?}");
    assert!(
        entries.iter().all(|e| e.kind == "extra-field"),
        "{entries:?}"
    );
}
