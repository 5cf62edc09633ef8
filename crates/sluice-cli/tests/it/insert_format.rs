//! The binary insert path (`clickhouse.insert_format = "binary"`, set
//! through its variable) against the JSON one, adversarially: tables whose columns are
//! added (with a DEFAULT that reads another column, in the middle), dropped,
//! retyped to the same width, renamed, or swapped for another table while
//! the sink writes; rows the encoder leaves to ClickHouse's JSON parser;
//! retries whose first attempt committed unseen. Each row must land once, as
//! the JSON path stores it: the tables are compared with a twin fed the same
//! records as JSONEachRow by the sink's exactly-once statement
//! (`INSERT … SELECT * FROM input() FORMAT JSONEachRow`). Duplicates are
//! counted on plain MergeTree tables without a dedup window, except where
//! the window is what a test is about.

use crate::binary::produce_raw;
use crate::harness::*;
use crate::metrics::value;
use sluice_lab::proxy::Fault;
use std::time::Duration;

/// The sink's metrics at `addr`.
async fn metrics(addr: &str) -> String {
    get(addr, "/metrics").await.1
}

/// `sluice_json_fallback_batches_total` of `table`, per reason.
fn fallbacks(m: &str, table: &str) -> Vec<(String, f64)> {
    let tbl = format!("table=\"{table}\"");
    m.lines()
        .filter(|l| l.starts_with("sluice_json_fallback_batches_total{") && l.contains(&tbl))
        .filter_map(|l| {
            let reason = l.split("reason=\"").nth(1)?.split('"').next()?.to_string();
            Some((reason, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

/// Attempts sent as JSON for `why` (a reason's start).
fn fallen_back(m: &str, table: &str, why: &str) -> f64 {
    fallbacks(m, table)
        .iter()
        .filter(|(r, _)| r.starts_with(why))
        .map(|(_, n)| n)
        .sum()
}

/// Waits until the metrics count every batch the table got (the last
/// completions reach the consumer thread after the rows are visible).
async fn settled_metrics(addr: &str, table: &str, rows: u64) -> String {
    let tbl = format!("{{table=\"{table}\"}}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let m = metrics(addr).await;
        let inserted = format!("sluice_rows_inserted_total{tbl}");
        let done =
            m.lines().any(|l| l.starts_with(&inserted)) && value(&m, &inserted) >= rows as f64;
        if done || std::time::Instant::now() > deadline {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every row of `table` as text, in `(partition, offset)` order.
async fn rows_of(ch: &clickhouse::Client, table: &str, cols: &str) -> Vec<String> {
    ch.query(&format!(
        "SELECT toString(tuple({cols})) FROM {table} ORDER BY _partition, _offset, id"
    ))
    .fetch_all::<String>()
    .await
    .unwrap_or_else(|e| panic!("reading {table}: {e}"))
}

/// `table` holds the same `n` rows as `twin` in `cols`, in `(partition,
/// offset)` order; the first few that differ otherwise.
async fn same_rows(ch: &clickhouse::Client, table: &str, twin: &str, cols: &str, n: u64) {
    let (sunk, want) = (
        rows_of(ch, table, cols).await,
        rows_of(ch, twin, cols).await,
    );
    assert_eq!(want.len(), n as usize, "{twin}");
    let differ: Vec<_> = sunk
        .iter()
        .zip(&want)
        .filter(|(a, b)| a != b)
        .take(5)
        .collect();
    assert!(
        differ.is_empty() && sunk.len() == want.len(),
        "sink vs JSON ({} rows against {}): {differ:?}",
        sunk.len(),
        want.len()
    );
}

/// `records` (JSON objects, record `i` at `(partition, offset)` of
/// `at(i)`) inserted into `table` as JSONEachRow by the sink's exactly-once
/// statement, with `settings`: what the JSON path stores.
async fn json_twin(
    ch: &clickhouse::Client,
    table: &str,
    topic: &str,
    records: &[(i32, u64, String)],
    settings: &[(String, String)],
) {
    let mut body = Vec::new();
    for (p, o, r) in records {
        let r = r.strip_suffix('}').expect("a JSON object");
        body.extend_from_slice(
            format!(r#"{r},"_topic":"{topic}","_partition":{p},"_offset":{o}}}"#).as_bytes(),
        );
        body.push(b'\n');
    }
    let mut ins = ch
        .insert_formatted_with(format!(
            "INSERT INTO {table} SELECT * FROM input() FORMAT JSONEachRow"
        ))
        .with_setting("input_format_parallel_parsing", "0");
    for (k, v) in settings {
        ins = ins.with_setting(k, v);
    }
    ins.send(bytes::Bytes::from(body)).await.unwrap();
    ins.end()
        .await
        .unwrap_or_else(|e| panic!("the JSON twin {table}: {e}"));
}

/// Produces records `ids` of `record` over two partitions (even ids to 0,
/// odd ones to 1, in order: id `i` is at offset `i / 2`).
fn produce_ids(topic: &str, ids: std::ops::Range<u64>, record: &dyn Fn(u64) -> String) {
    let b = brokers();
    for p in 0..2u64 {
        let values: Vec<Vec<u8>> = ids
            .clone()
            .filter(|i| i % 2 == p)
            .map(|i| record(i).into_bytes())
            .collect();
        if !values.is_empty() {
            produce_raw(&b, topic, p as i32, &values);
        }
    }
}

fn placed(ids: std::ops::Range<u64>, record: &dyn Fn(u64) -> String) -> Vec<(i32, u64, String)> {
    ids.map(|i| ((i % 2) as i32, i / 2, record(i))).collect()
}

/// `sluice run` with `clickhouse.insert_format = format` (`binary` or
/// `json`): a wrapper that sets its variable, for a spec's `spawn`.
fn sluice_as(format: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(unique("ifmt_exe"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("sluice-{format}"));
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nSLUICE_CLICKHOUSE_INSERT_FORMAT={format} exec '{}' \"$@\"\n",
            env!("CARGO_BIN_EXE_sluice")
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Starts `spec` with `insert_format = format`.
fn start_as(spec: &SinkSpec, format: &str) -> Sink {
    spec.spawn(&sluice_as(format)).expect("starting sluice")
}

/// A record of the changing table: fields for every column it has or will
/// have (`d` equal to its DEFAULT `id * 3`, `r` and `r2` both, so that a row
/// lands the same whichever side of a change its insert fell on), a null
/// `nn` every third, no `e` (an Enum with no 0) every fifth.
fn changing_record(i: u64) -> String {
    let nn = if i.is_multiple_of(3) {
        "null".to_string()
    } else {
        format!("\"n{i}\"")
    };
    let e = match i % 5 {
        0 => String::new(),
        _ => format!(r#","e":"{}""#, if i % 2 == 1 { "y" } else { "x" }),
    };
    format!(
        r#"{{"id":{i},"payload":"p{i}","a":{i},"s":"s{}","x":{i},"d":{},"r":{i},"r2":{i},"nn":{nn}{e},"t":"2024-01-02 03:04:05.{:03}"}}"#,
        i % 7,
        i * 3,
        i % 1000
    )
}

/// Columns are added (a DEFAULT reading another column, in the middle; a
/// Nullable one at the front), dropped, renamed and retyped to the same
/// width (UInt32 → Int32, String → LowCardinality(String)), each while the
/// sink holds the columns as they were; then, while it writes in small
/// batches, columns keep changing type under it, to another width and
/// back (Int32 ↔ Int64, Enum8 ↔ Enum16), to a type of the same width read
/// otherwise (DateTime64(3) ↔ DateTime64(6)) and to LowCardinality and
/// back. A body encoded for the columns as they were must be refused by its
/// guard, never read against the new ones: every row lands once, and the
/// table ends up holding exactly what JSONEachRow inserts of the same records
/// into a table of the final columns hold.
///
/// (Columns are not added, dropped or renamed during inserts here: on the
/// stack's server that races in the engine on either path, JSON too: an
/// insert of JSONEachRow rows racing `RENAME COLUMN` loses the column's
/// values, one racing `ADD`/`DROP COLUMN` fails with code 20.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn columns_changing_under_the_sink_land_every_row_once_as_json_would() {
    let topic = unique("ifmt_alter");
    create_topic(&topic, 2).await;
    let ch = ch();
    let db = unique("ifmt");
    exec(&ch, &format!("CREATE DATABASE {db}")).await;
    let table = format!("{db}.events");
    exec(
        &ch,
        &format!(
            "CREATE TABLE {table} (
                id UInt64, a UInt32, s String, x Int32, r UInt64,
                nn Nullable(String), e Enum8('x' = 1, 'y' = 2), t DateTime64(3, 'UTC'),
                payload String,
                _topic LowCardinality(String), _partition UInt32, _offset UInt64
            ) ENGINE = MergeTree ORDER BY (_topic, _partition, _offset)
            SETTINGS non_replicated_deduplication_window = 0"
        ),
    )
    .await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut spec = SinkSpec::new(&topic, &table);
    spec.max_batch_rows = 50;
    spec.max_batch_age = Duration::from_millis(50);
    spec.metrics_listen = Some(addr.clone());
    let mut sink = start_as(&spec, "binary");
    let refused = |m: &str| fallen_back(m, &table, "a binary insert of the batch was refused");

    produce_ids(&topic, 0..300, &changing_record);
    let got = wait_for(&ch, &table, 300, Duration::from_secs(90)).await;
    assert_eq!(got.distinct_offsets, 300, "{}", sink.log_tail());
    let m = settled_metrics(&addr, &table, 300).await;
    assert_eq!(
        fallen_back(&m, &table, ""),
        0.0,
        "every record converts: {:?}",
        fallbacks(&m, &table)
    );

    // Each change comes between the layout's read and the next insert,
    // which is encoded for the old columns and must be refused.
    let steps = [
        "ADD COLUMN d UInt64 DEFAULT id * 3 AFTER a",
        "DROP COLUMN x",
        "RENAME COLUMN r TO r2",
        "ADD COLUMN n Nullable(Int32) AFTER id",
        "MODIFY COLUMN a Int32",
        "MODIFY COLUMN s LowCardinality(String)",
    ];
    let mut at = 300;
    for (k, step) in steps.iter().enumerate() {
        exec(&ch, &format!("ALTER TABLE {table} {step}")).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        produce_ids(&topic, at..at + 100, &changing_record);
        at += 100;
        let got = wait_for(&ch, &table, at, Duration::from_secs(90)).await;
        assert_eq!(
            got.distinct_offsets,
            at,
            "after {step}: {}",
            sink.log_tail()
        );
        let m = settled_metrics(&addr, &table, at).await;
        assert!(
            refused(&m) > k as f64,
            "after {step}, the stale body must have been refused: {:?}\n{}",
            fallbacks(&m, &table),
            sink.log_tail()
        );
    }

    // Types changing under the inserts.
    let n = 3_000;
    let alters = {
        let (ch, table) = (ch.clone(), table.clone());
        tokio::spawn(async move {
            for _ in 0..2 {
                for step in [
                    "MODIFY COLUMN a Int64",
                    "MODIFY COLUMN e Enum16('x' = 1, 'y' = 2, 'z' = 300)",
                    "MODIFY COLUMN t DateTime64(6, 'UTC')",
                    "MODIFY COLUMN s String",
                    "MODIFY COLUMN a Int32",
                    "MODIFY COLUMN e Enum8('x' = 1, 'y' = 2)",
                    "MODIFY COLUMN t DateTime64(3, 'UTC')",
                    "MODIFY COLUMN s LowCardinality(String)",
                ] {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    exec(&ch, &format!("ALTER TABLE {table} {step}")).await;
                }
            }
        })
    };
    let producing = {
        let topic = topic.clone();
        tokio::task::spawn_blocking(move || {
            while at < n {
                let to = (at + 80).min(n);
                produce_ids(&topic, at..to, &changing_record);
                at = to;
                std::thread::sleep(Duration::from_millis(60));
            }
        })
    };
    producing.await.unwrap();
    alters.await.unwrap();
    let got = wait_for(&ch, &table, n, Duration::from_secs(180)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let got = got.max_rows(landed(&ch, &table).await);
    let m = settled_metrics(&addr, &table, n).await;
    let tail = sink.log_tail();
    assert!(sink.stop(Duration::from_secs(60)), "{tail}");
    assert_eq!(
        (got.rows, got.distinct_offsets, got.distinct_ids),
        (n, n, n),
        "{tail}"
    );
    let batches = value(&m, &format!("sluice_batches_total{{table=\"{table}\"}}"));
    let fell = fallen_back(&m, &table, "");
    eprintln!(
        "{batches} batches, {fell} attempts as JSON ({} after a refused binary one): {:?}",
        refused(&m),
        fallbacks(&m, &table)
    );
    assert!(
        refused(&m) > steps.len() as f64,
        "{:?}\n{tail}",
        fallbacks(&m, &table)
    );
    assert!(fell < batches, "binary inserts went on between the changes");

    // The twin: the final columns, every record as JSONEachRow.
    let twin = format!("{db}.twin");
    exec(&ch, &format!("CREATE TABLE {twin} AS {table}")).await;
    json_twin(&ch, &twin, &topic, &placed(0..n, &changing_record), &[]).await;
    let cols = "id, n, a, d, s, r2, nn, e, t, payload, _topic, _partition, _offset";
    same_rows(&ch, &table, &twin, cols, n).await;
    exec(&ch, &format!("DROP DATABASE {db}")).await;
}

/// A record of the swapped tables: `a` and `b` of the same width.
fn swapped_record(i: u64) -> String {
    format!(
        r#"{{"id":{i},"a":{},"b":{},"payload":"p{i}"}}"#,
        i * 7,
        -(i as i64)
    )
}

/// The route's table is swapped (EXCHANGE TABLES) for one whose columns
/// `a UInt32` and `b Int32` trade places, with a DEFAULT column between
/// them: a body encoded for the old one would put each value in the other
/// column without a parse error. The guard refuses it; every row lands
/// once, in the table it was inserted into, as JSON would have stored it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_swapped_for_one_with_columns_in_another_order_gets_its_rows_by_name() {
    let topic = unique("ifmt_swap");
    create_topic(&topic, 2).await;
    let ch = ch();
    let db = unique("ifmt");
    exec(&ch, &format!("CREATE DATABASE {db}")).await;
    let meta = "_topic LowCardinality(String), _partition UInt32, _offset UInt64";
    let engine = "ENGINE = MergeTree ORDER BY (_topic, _partition, _offset) \
                  SETTINGS non_replicated_deduplication_window = 0";
    let table = format!("{db}.events");
    exec(
        &ch,
        &format!(
            "CREATE TABLE {table} (id UInt64, a UInt32, b Int32, payload String, {meta}) {engine}"
        ),
    )
    .await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut spec = SinkSpec::new(&topic, &table);
    spec.max_batch_rows = 40;
    spec.max_batch_age = Duration::from_millis(50);
    spec.metrics_listen = Some(addr.clone());
    let mut sink = start_as(&spec, "binary");
    produce_ids(&topic, 0..200, &swapped_record);
    let got = wait_for(&ch, &table, 200, Duration::from_secs(90)).await;
    assert_eq!(got.distinct_offsets, 200, "{}", sink.log_tail());

    let new = format!("{db}.events_new");
    exec(
        &ch,
        &format!(
            "CREATE TABLE {new} (id UInt64, b Int32, c UInt64 DEFAULT id + a, a UInt32, payload String, {meta}) {engine}"
        ),
    )
    .await;
    exec(&ch, &format!("EXCHANGE TABLES {table} AND {new}")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    produce_ids(&topic, 200..600, &swapped_record);
    let got = wait_for(&ch, &table, 400, Duration::from_secs(90)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let got = got.max_rows(landed(&ch, &table).await);
    let old = landed(&ch, &new).await;
    let m = settled_metrics(&addr, &table, 600).await;
    let tail = sink.log_tail();
    assert!(sink.stop(Duration::from_secs(60)), "{tail}");
    assert_eq!((old.rows, old.distinct_offsets), (200, 200), "{tail}");
    assert_eq!((got.rows, got.distinct_offsets), (400, 400), "{tail}");
    assert!(
        fallen_back(&m, &table, "a binary insert of the batch was refused") >= 1.0,
        "{:?}\n{tail}",
        fallbacks(&m, &table)
    );
    let twin = format!("{db}.twin");
    exec(&ch, &format!("CREATE TABLE {twin} AS {table}")).await;
    json_twin(&ch, &twin, &topic, &placed(200..600, &swapped_record), &[]).await;
    let old_twin = format!("{db}.old_twin");
    exec(&ch, &format!("CREATE TABLE {old_twin} AS {new}")).await;
    json_twin(
        &ch,
        &old_twin,
        &topic,
        &placed(0..200, &swapped_record),
        &[],
    )
    .await;
    let cols = "id, a, b, c, payload, _partition, _offset";
    assert_eq!(
        rows_of(&ch, &table, cols).await,
        rows_of(&ch, &twin, cols).await
    );
    let cols = "id, a, b, payload, _partition, _offset";
    assert_eq!(
        rows_of(&ch, &new, cols).await,
        rows_of(&ch, &old_twin, cols).await
    );
    exec(&ch, &format!("DROP DATABASE {db}")).await;
}

/// A record whose values the encoder leaves to ClickHouse's JSON parser
/// every 25th (an integer past its type, which JSONEachRow wraps; a date
/// before 1970, which it clamps; a quoted number; an address with a leading
/// zero; a time with a fraction past the precision and an offset), clean
/// otherwise.
fn mixed_record(i: u64) -> String {
    let clean = format!(
        r#""u8":{},"d":"2024-03-{:02}","ip":"10.0.0.{}","dt":"2024-05-06 07:08:09","s":"s\"{i}""#,
        i % 200,
        i % 28 + 1,
        i % 250
    );
    let odd = match (i / 25) % 5 {
        _ if i % 25 != 7 => clean,
        0 => clean.replace(&format!(r#""u8":{}"#, i % 200), r#""u8":300"#),
        1 => clean.replace("2024-03-", "1969-12-"),
        2 => clean.replace(&format!(r#""u8":{}"#, i % 200), r#""u8":"12""#),
        3 => clean.replace("\"10.0.0.", "\"010.0.0."),
        _ => clean.replace("07:08:09", "07:08:09.123456789+05:30"),
    };
    format!(r#"{{"id":{i},"payload":"p{i}",{odd}}}"#)
}

/// Rows the encoder is not sure about send their batch as JSON, counted in
/// `sluice_json_fallback_batches_total` by reason; every row lands once as
/// JSONEachRow stores it, under user settings the encoder does not read
/// (a session time zone it does, a bad-escape policy, allowed errors) as
/// much as without; batches without such rows still go binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_the_encoder_leaves_to_json_land_as_json_stores_them_and_are_counted() {
    let topic = unique("ifmt_fallback");
    create_topic(&topic, 2).await;
    let ch = ch();
    let db = unique("ifmt");
    exec(&ch, &format!("CREATE DATABASE {db}")).await;
    let table = format!("{db}.events");
    exec(
        &ch,
        &format!(
            "CREATE TABLE {table} (
                id UInt64, payload String, u8 UInt8, d Date, ip IPv4, dt DateTime('UTC'), s String,
                _topic LowCardinality(String), _partition UInt32, _offset UInt64
            ) ENGINE = MergeTree ORDER BY (_topic, _partition, _offset)
            SETTINGS non_replicated_deduplication_window = 0"
        ),
    )
    .await;
    let settings: Vec<(String, String)> = [
        ("session_timezone", "Asia/Kolkata"),
        ("input_format_json_throw_on_bad_escape_sequence", "0"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut spec = SinkSpec::new(&topic, &table);
    spec.max_batch_rows = 50;
    spec.max_batch_age = Duration::from_millis(50);
    spec.metrics_listen = Some(addr.clone());
    spec.settings = settings.clone();
    let mut sink = start_as(&spec, "binary");
    let n = 1_500;
    for at in (0..n).step_by(250) {
        produce_ids(&topic, at..at + 250, &mixed_record);
    }
    let got = wait_for(&ch, &table, n, Duration::from_secs(120)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let got = got.max_rows(landed(&ch, &table).await);
    let m = settled_metrics(&addr, &table, n).await;
    let tail = sink.log_tail();
    assert!(sink.stop(Duration::from_secs(60)), "{tail}");
    assert_eq!((got.rows, got.distinct_offsets), (n, n), "{tail}");
    let batches = value(&m, &format!("sluice_batches_total{{table=\"{table}\"}}"));
    let json = fallen_back(&m, &table, "");
    eprintln!(
        "{batches} batches, {json} as JSON: {:?}",
        fallbacks(&m, &table)
    );
    assert!(json >= 5.0, "{:?}", fallbacks(&m, &table));
    assert!(json < batches, "{:?}", fallbacks(&m, &table));
    assert_eq!(
        fallen_back(&m, &table, "a binary insert of the batch was refused"),
        0.0,
        "the encoder fell back before sending: {:?}",
        fallbacks(&m, &table)
    );

    let twin = format!("{db}.twin");
    exec(&ch, &format!("CREATE TABLE {twin} AS {table}")).await;
    json_twin(&ch, &twin, &topic, &placed(0..n, &mixed_record), &settings).await;
    let cols = "id, payload, u8, d, ip, dt, s, _partition, _offset";
    same_rows(&ch, &table, &twin, cols, n).await;
    exec(&ch, &format!("DROP DATABASE {db}")).await;
}

/// token-only: the server commits a binary insert, its answer is lost; the
/// retry carries the same token and the same body, and the table's window
/// keeps it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_only_binary_retry_after_a_lost_answer_is_deduplicated_by_its_token() {
    let (got, tail) = lost_answer_retry("token-only", "binary").await;
    assert_eq!(got.rows, got.distinct_offsets, "{got:?}\n{tail}");
}

/// `extra_fields = "dlq"` on the binary path: a column dropped while the
/// sink runs is still in its layout, so records carrying its field are
/// encoded and sent binary; the guard refuses the insert, the batch goes
/// again as JSON, and ClickHouse's JSON parser refuses those records: they
/// reach the DLQ as `extra-field` with its reason. A record a CHECK refuses
/// goes there as `rejected`, once; every other record lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_entries_of_the_binary_path_carry_the_json_parsers_reasons() {
    let topic = unique("ifmt_dlq");
    let dlq = unique("ifmt_dlq_dlq");
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    let ch = ch();
    let db = unique("ifmt");
    exec(&ch, &format!("CREATE DATABASE {db}")).await;
    let table = format!("{db}.events");
    exec(
        &ch,
        &format!(
            "CREATE TABLE {table} (id UInt64, payload String, x Int32,
                _topic LowCardinality(String), _partition UInt32, _offset UInt64,
                CONSTRAINT not_13 CHECK id != 13
            ) ENGINE = MergeTree ORDER BY (_topic, _partition, _offset)
            SETTINGS non_replicated_deduplication_window = 0"
        ),
    )
    .await;
    let records = |ids: std::ops::Range<u64>| -> Vec<Vec<u8>> {
        ids.map(|i| format!(r#"{{"id":{i},"payload":"p{i}","x":{i}}}"#).into_bytes())
            .collect()
    };
    let b = brokers();
    produce_raw(&b, &topic, 0, &records(0..20));
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut spec = SinkSpec::new(&topic, &table);
    spec.dlq_topic = Some(dlq.clone());
    spec.extra_fields = Some("dlq");
    spec.metrics_listen = Some(addr.clone());
    let mut sink = start_as(&spec, "binary");
    let got = wait_for(&ch, &table, 19, Duration::from_secs(60)).await;
    assert_eq!(got.distinct_offsets, 19, "{}", sink.log_tail());

    exec(&ch, &format!("ALTER TABLE {table} DROP COLUMN x")).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    produce_raw(&b, &topic, 0, &records(20..40));
    produce_raw(
        &b,
        &topic,
        0,
        &(40..50)
            .map(|i| format!(r#"{{"id":{i},"payload":"p{i}"}}"#).into_bytes())
            .collect::<Vec<_>>(),
    );
    let got = wait_for(&ch, &table, 29, Duration::from_secs(60)).await;
    let entries = {
        let dlq = dlq.clone();
        tokio::task::spawn_blocking(move || {
            sluice_lab::poison::read_dlq(&brokers(), &dlq, 21, Duration::from_secs(60)).unwrap()
        })
        .await
        .unwrap()
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let got = got.max_rows(landed(&ch, &table).await);
    let m = settled_metrics(&addr, &table, 29).await;
    let tail = sink.log_tail();
    assert!(sink.stop(Duration::from_secs(60)), "{tail}");
    assert_eq!((got.rows, got.distinct_offsets), (29, 29), "{tail}");
    let kinds: std::collections::BTreeMap<i64, String> =
        entries.iter().map(|e| (e.offset, e.kind.clone())).collect();
    let mut want: std::collections::BTreeMap<i64, String> =
        (20..40).map(|o| (o, "extra-field".to_string())).collect();
    want.insert(13, "rejected".into());
    assert_eq!(kinds, want, "{entries:?}\n{tail}");
    assert_eq!(entries.len(), 21, "one entry each: {entries:?}");
    for e in entries.iter().filter(|e| e.kind == "extra-field") {
        assert!(
            e.reason.contains("while parsing JSONEachRow format"),
            "the JSON parser's reason: {}",
            e.reason
        );
    }
    assert!(
        fallen_back(&m, &table, "a binary insert of the batch was refused") >= 1.0,
        "the stale body was refused: {:?}",
        fallbacks(&m, &table)
    );
    exec(&ch, &format!("DROP DATABASE {db}")).await;
}

/// `delivery` on a table with a dedup window (1000 blocks), the first
/// insert's answer lost after the server committed it: the blind retry of
/// the same rows, sent as `format`. What landed (every record, the test
/// checks the copies) and the sink's log.
async fn lost_answer_retry(delivery: &'static str, format: &str) -> (Landed, String) {
    let n = 2_000;
    let topic = unique("ifmt_retry");
    create_topic(&topic, 1).await;
    let ch = ch();
    let db = unique("ifmt");
    exec(&ch, &format!("CREATE DATABASE {db}")).await;
    let table = format!("{db}.events");
    exec(
        &ch,
        &format!(
            "CREATE TABLE {table} (id UInt64, payload String,
                _topic LowCardinality(String), _partition UInt32, _offset UInt64
            ) ENGINE = MergeTree ORDER BY (_topic, _partition, _offset)
            SETTINGS non_replicated_deduplication_window = 1000"
        ),
    )
    .await;
    produce(&topic, 1, 0, n);
    let proxy = clickhouse_proxy(Duration::from_secs(6)).await;
    proxy.arm(Fault::WithholdResponse);
    let mut spec = SinkSpec::new(&topic, &table);
    spec.delivery = delivery;
    spec.clickhouse_url = proxy.url.clone();
    spec.insert_timeout = Duration::from_secs(3);
    spec.max_batch_rows = 500;
    let mut sink = start_as(&spec, format);
    let got = wait_for(&ch, &table, n, Duration::from_secs(120)).await;
    // The first batch is in (its answer withheld): its blind retry comes
    // after the client's timeout and the proxy's hold.
    assert!(
        sink.wait_for_log("insert outcome unknown", Duration::from_secs(30))
            .await,
        "{}",
        sink.log_tail()
    );
    tokio::time::sleep(Duration::from_secs(8)).await;
    let got = got.max_rows(landed(&ch, &table).await);
    let tail = sink.log_tail();
    assert!(sink.stop(Duration::from_secs(60)), "{tail}");
    assert_eq!(proxy.fired(), 1, "{tail}");
    assert_eq!(got.distinct_offsets, n, "{tail}");
    exec(&ch, &format!("DROP DATABASE {db}")).await;
    (got, tail)
}

/// On 26.x an `INSERT … SELECT FROM input()` without a token is
/// deduplicated only with `deduplicate_insert_select =
/// enable_even_for_bad_queries` (the default, `enable_when_possible`, finds
/// the SELECT not "stable"): without it the binary path's blind retry
/// landed a second copy where the JSON path's is caught by the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_once_binary_retry_is_caught_by_the_window_as_json_is() {
    let (json, _) = lost_answer_retry("at-least-once", "json").await;
    assert_eq!(json.duplicates(), 0, "the JSON path: {json:?}");
    let (binary, tail) = lost_answer_retry("at-least-once", "binary").await;
    assert_eq!(
        binary.duplicates(),
        0,
        "the binary path: {binary:?}\n{tail}"
    );
}

/// The guard goes in the insert's URL: spelling out every column, a wide
/// table's binary insert was refused by whatever limits the URL (the
/// stack's server, 64 KiB; nginx's default 8 KiB; ClickHouse's
/// max_query_size 256 KiB), and the sink stopped. A digest of the columns
/// keeps it short: the rows go binary, as the JSON path stores them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wide_table_is_written_as_json_would_be() {
    let n = 200;
    let topic = unique("ifmt_wide");
    create_topic(&topic, 1).await;
    let ch = ch();
    let db = unique("ifmt");
    exec(&ch, &format!("CREATE DATABASE {db}")).await;
    let wide: String = (0..1500)
        .map(|c| format!("c{c:04} Nullable(String), "))
        .collect();
    for t in ["events", "json"] {
        exec(
            &ch,
            &format!(
                "CREATE TABLE {db}.{t} (id UInt64, payload String, {wide}
                    _topic LowCardinality(String), _partition UInt32, _offset UInt64
                ) ENGINE = MergeTree ORDER BY (_topic, _partition, _offset)
                SETTINGS non_replicated_deduplication_window = 0"
            ),
        )
        .await;
    }
    produce(&topic, 1, 0, n);
    let json_table = format!("{db}.json");
    let mut spec = SinkSpec::new(&topic, &json_table);
    let mut sink = start_as(&spec, "json");
    let got = wait_for(&ch, &json_table, n, Duration::from_secs(60)).await;
    let tail = sink.log_tail();
    sink.stop(Duration::from_secs(30));
    assert_eq!(got.distinct_offsets, n, "the JSON path: {tail}");

    let table = format!("{db}.events");
    spec = SinkSpec::new(&topic, &table);
    let mut sink = start_as(&spec, "binary");
    let got = wait_for(&ch, &table, n, Duration::from_secs(60)).await;
    let running = sink.is_running();
    let tail = sink.log_tail();
    sink.stop(Duration::from_secs(30));
    assert_eq!(
        (got.distinct_offsets, running),
        (n, true),
        "the binary path: {tail}"
    );
    assert!(
        !tail.contains("sending the batch as JSONEachRow"),
        "the rows went binary: {tail}"
    );
    let cols = "id, payload, c0000, c1499, _partition, _offset";
    assert_eq!(
        rows_of(&ch, &table, cols).await,
        rows_of(&ch, &json_table, cols).await,
        "each row as the JSON path stores it"
    );
}

// ---- A refusal from something in front of the server (HTTP 4xx, no
// ---- ClickHouse code) of a request it did forward.

/// exactly-once on a MergeTree table without a dedup window (the engine's
/// default), inserts going through a proxy that refuses the first one whose
/// request head holds `marker` (HTTP 403, no ClickHouse code) as `when`
/// says. What landed once the refused insert's server side ended, whether
/// the sink still runs, and its log.
async fn refused_by_a_proxy(
    format: &str,
    marker: &'static [u8],
    when: Fault,
) -> (Landed, bool, String) {
    let n = 300;
    let topic = unique("ifmt_4xx");
    create_topic(&topic, 1).await;
    let ch = ch();
    let table = create_table(&ch, &unique("ifmt")).await;
    produce(&topic, 1, 0, n);
    // A refusal while running: the body's end follows 1.5 s later.
    let proxy = clickhouse_proxy(Duration::from_millis(1500)).await;
    proxy.only_inserts_with(marker);
    proxy.answer_next_insert_as(when, 403, &[], "");
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = proxy.url.clone();
    let mut sink = start_as(&spec, format);
    let got = wait_for(&ch, &table, n, Duration::from_secs(60)).await;
    // The refused insert's server side ends within its hold.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let got = got.max_rows(landed(&ch, &table).await);
    let running = sink.is_running();
    let tail = sink.log_tail();
    sink.stop(Duration::from_secs(30));
    assert_eq!(proxy.fired(), 1, "the proxy refused one insert: {tail}");
    let db = table.split('.').next().unwrap().to_string();
    exec(&ch, &format!("DROP DATABASE {db}")).await;
    (got, running, tail)
}

/// A gateway refuses a binary insert (403, no ClickHouse code) after the
/// server committed it (a response-phase rule): the batch goes again as
/// JSON after a reconciliation, which finds its rows: each row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_insert_refused_by_a_proxy_after_it_committed_lands_once() {
    let (got, running, tail) =
        refused_by_a_proxy("binary", b"RowBinaryWithDefaults", Fault::AnswerAfterCommit).await;
    assert_eq!(
        (got.rows, got.distinct_offsets, running),
        (300, 300, true),
        "{tail}"
    );
}

/// A proxy refuses a binary insert (403, no ClickHouse code) that it
/// forwarded and whose query still runs on the server (the body's last
/// bytes are on their way). A proxy's refusal says nothing of the server's
/// query: the attempt is fenced as an unknown outcome (past its deadline,
/// gone from the process list), reconciled, then sent as JSON. Taken for a
/// refusal (`Answer::Rejected`, reconciled unfenced) the JSON copy and the
/// late binary one both landed: every row twice on a table with no dedup
/// window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_insert_refused_by_a_proxy_while_it_runs_lands_once() {
    let (got, running, tail) = refused_by_a_proxy(
        "binary",
        b"RowBinaryWithDefaults",
        Fault::AnswerWhileRunning,
    )
    .await;
    assert_eq!(
        (got.distinct_offsets, got.duplicates(), running),
        (300, 0, true),
        "{got:?}\n{tail}"
    );
}

/// The JSON path under the same refusal: the 4xx stops the sink (a proxy
/// refusing inserts is the operator's to fix) and the attempt the proxy
/// forwarded lands its rows once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_insert_refused_by_a_proxy_while_running_stops_the_sink_with_each_row_once() {
    let (got, running, tail) =
        refused_by_a_proxy("json", b"JSONEachRow", Fault::AnswerWhileRunning).await;
    assert_eq!(got.duplicates(), 0, "{got:?}\n{tail}");
    assert!(
        !running,
        "a 4xx without a ClickHouse code stops the sink: {tail}"
    );
}

/// A proxy in front of ClickHouse refuses every binary insert for its URL
/// (414, nothing forwarded), as a URL-length limit does: the binary path's
/// fallback to JSON is what carries the sink. A proxy's 4xx of a binary
/// insert is an unknown outcome (fenced: insert timeout + 1 s), so the
/// route must not try binary again for every batch. Returns the refusals,
/// what landed, and the log.
async fn binary_always_refused(n: u64) -> (u32, Landed, String) {
    let topic = unique("ifmt_414");
    create_topic(&topic, 1).await;
    let ch = ch();
    let table = create_table(&ch, &unique("ifmt")).await;
    produce(&topic, 1, 0, n);
    let proxy = clickhouse_proxy(Duration::ZERO).await;
    proxy.only_inserts_with(b"RowBinaryWithDefaults");
    proxy.keep_armed();
    proxy.answer_next_insert(414, &[], "");
    let mut spec = SinkSpec::new(&topic, &table);
    spec.clickhouse_url = proxy.url.clone();
    spec.max_batch_rows = 100;
    spec.insert_timeout = Duration::from_secs(5);
    let mut sink = start_as(&spec, "binary");
    let got = wait_for(&ch, &table, n, Duration::from_secs(300)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = got.max_rows(landed(&ch, &table).await);
    let log = std::fs::read_to_string(&sink.log).unwrap();
    assert!(sink.stop(Duration::from_secs(30)), "{}", sink.log_tail());
    let db = table.split('.').next().unwrap().to_string();
    exec(&ch, &format!("DROP DATABASE {db}")).await;
    (proxy.fired(), got, log)
}

/// Every row lands once through the JSON fallback when the proxy refuses
/// every binary insert, and the route goes as JSON after the first
/// refusal (each would cost a fence): of the ten batches, only those sent
/// before the first refusal came back (at most `max_concurrent_inserts`,
/// 4) are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_inserts_a_proxy_always_refuses_land_once_as_json() {
    let (fired, got, log) = binary_always_refused(1_000).await;
    assert!((1..=4).contains(&fired), "{fired} refusals: {log}");
    assert_eq!((got.rows, got.distinct_offsets), (1_000, 1_000), "{got:?}");
}
