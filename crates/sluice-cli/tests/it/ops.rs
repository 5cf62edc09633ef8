//! The operator tools against the real ClickHouse engine: every number that
//! `sluice window`, `audit` and `repair` print is checked against data made
//! with known duplicates of each kind, through the sink and by direct
//! inserts; `repair` is interrupted at every step and raced by a writer.

use crate::harness::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// Runs `sluice ARGS` against the stack; returns (exit code, stdout, stderr).
fn tool(args: &[&str]) -> (i32, String, String) {
    let r = run(&mut sluice(args));
    (r.code, r.stdout, r.stderr)
}

/// Runs a tool with `--json` and parses its report; asserts the exit code.
fn report(args: &[&str], code: i32) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let (c, out, err) = tool(&all);
    assert_eq!(c, code, "sluice {args:?}: stdout {out}\nstderr {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn u(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{path} in {v:#}"))
}

async fn count(ch: &clickhouse::Client, sql: &str) -> u64 {
    ch.query(sql)
        .fetch_one::<u64>()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Sends a JSONEachRow body as one INSERT, with a dedup token.
async fn insert_block(table: &str, body: String, token: &str) {
    let mut insert = ch()
        .insert_formatted_with(format!("INSERT INTO {table} FORMAT JSONEachRow"))
        .with_setting("async_insert", "0")
        .with_setting("insert_deduplicate", "1")
        .with_setting("insert_deduplication_token", token);
    let sent = insert.send(body.into()).await;
    sent.and(insert.end().await)
        .unwrap_or_else(|e| panic!("insert into {table}: {e}"));
}

/// A table partitioned by day, with a time column, like a real target.
async fn dated_table(ch: &clickhouse::Client, window: u32) -> String {
    let db = unique("ops");
    exec(ch, &format!("CREATE DATABASE {db}")).await;
    exec(
        ch,
        &format!(
            "CREATE TABLE {db}.events (
                id UInt64, payload String,
                day Date DEFAULT toDate('2026-07-30') + (id % 2),
                _topic LowCardinality(String), _partition UInt32, _offset UInt64
            ) ENGINE = MergeTree PARTITION BY day ORDER BY id
            SETTINGS non_replicated_deduplication_window = {window}"
        ),
    )
    .await;
    format!("{db}.events")
}

fn rows(ids: impl Iterator<Item = u64>, offset_base: u64) -> String {
    ids.map(|i| {
        format!(
            r#"{{"id":{i},"payload":"p","_topic":"t","_partition":0,"_offset":{}}}"#,
            offset_base + i
        )
    })
    .collect::<Vec<_>>()
    .join("\n")
}

#[tokio::test]
async fn window_reports_settings_rate_and_caught_resubmits() {
    let ch = ch();
    let table = dated_table(&ch, 100).await;
    // 20 blocks of 50 rows (even ids: one partition, so one part each),
    // then three of them re-sent inside the 100-block window.
    let block = |b: u64| rows((0..50).map(|j| b * 100 + 2 * j), 0);
    for b in 0..20u64 {
        insert_block(&table, block(b), &format!("tok{b}")).await;
    }
    for b in [3u64, 7, 11] {
        insert_block(&table, block(b), &format!("tok{b}")).await;
    }
    assert_eq!(
        count(&ch, &format!("SELECT count() FROM {table}")).await,
        1000
    );
    exec(&ch, "SYSTEM FLUSH LOGS").await;

    let r = report(&["window", "--table", &table, "--since", "1h"], 0);
    assert_eq!(u(&r, "/window_blocks"), 100);
    assert_eq!(r["replicated"], false);
    let nonrep = r["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "non_replicated_deduplication_window")
        .unwrap();
    assert_eq!(nonrep["table_override"], "100");
    assert_eq!(nonrep["effective"], "100");
    assert_eq!(nonrep["server_default"], "0");
    let hosts = r["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 1);
    assert_eq!(
        u(&r, "/hosts/0/blocks"),
        20,
        "error = 389 rows are not blocks"
    );
    assert_eq!(u(&r, "/hosts/0/rows"), 1000);
    assert_eq!(r["rows_per_block"].as_f64(), Some(50.0));
    let measured = u(&r, "/part_log/measured_secs") as f64;
    let rate = r["blocks_per_sec"].as_f64().unwrap();
    assert!(
        (rate - 20.0 / measured).abs() < 1e-9,
        "{rate} vs 20/{measured}"
    );
    let window = r["window_secs"].as_f64().unwrap();
    assert!((window - 100.0 / rate).abs() < 1e-6, "{window}");
    assert_eq!(
        u(&r, "/recommendation/minimum_blocks"),
        (rate * 124.0).ceil() as u64
    );
    assert_eq!(u(&r, "/caught_resubmits"), 3);
    let hours: u64 = r["caught_per_hour"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["count"].as_u64().unwrap())
        .sum();
    assert_eq!(hours, 3);
    assert_eq!(r["catches_max"], true);
    assert_eq!(
        r["recommendation"]["setting"],
        "non_replicated_deduplication_window"
    );
    assert!(
        r["recommendation"]["znodes_this_table"].is_null(),
        "no Keeper cost"
    );

    // The readable report says the same.
    let (code, text, _) = tool(&["window", "--table", &table, "--since", "1h"]);
    assert_eq!(code, 0);
    assert!(
        text.contains("Re-submits the window caught (error = 389): 3"),
        "{text}"
    );
    assert!(text.contains("│ total"), "{text}");

    // A table whose window is off: exit 1, and a warning.
    let off = dated_table(&ch, 0).await;
    insert_block(&off, rows(0..10, 0), "x").await;
    let r = report(&["window", "--table", &off, "--since", "1h"], 1);
    assert_eq!(u(&r, "/window_blocks"), 0);
    assert!(r["warnings"].to_string().contains("dedup is off"), "{r}");
}

#[tokio::test]
async fn window_rejects_bad_input() {
    let (code, _, err) = tool(&["window", "--table", "nodb.nosuch"]);
    assert_eq!(code, 2);
    assert!(err.contains("table nodb.nosuch does not exist"), "{err}");
    let (code, _, err) = tool(&["window", "--table", "nodot"]);
    assert_eq!(code, 2);
    assert!(err.contains("is not DB.TABLE"), "{err}");
    let (code, _, err) = tool(&["window", "--table", "a.b", "--retry-interval", "9s..3s"]);
    assert_eq!(code, 2);
    assert!(err.contains("runs backwards"), "{err}");
}

/// Keys 0..1000 through the sink, ids 0..100 produced a second time (a
/// producer retry: same key, new offset); then a second consumer group in
/// exactly-once mode (adds nothing: it resumes from the table) and one in
/// at-least-once mode (replays all 1100 offsets); then 30 rows copied with
/// their offsets by a direct insert (a re-submit).
async fn table_with_both_kinds() -> (clickhouse::Client, String) {
    let ch = ch();
    let table = dated_table(&ch, 0).await;
    let topic = unique("audit");
    create_topic(&topic, 2).await;
    let t = topic.clone();
    tokio::task::spawn_blocking(move || {
        produce(&t, 2, 0, 1000);
        produce(&t, 2, 0, 100);
    })
    .await
    .unwrap();
    let mut sink = SinkSpec::new(&topic, &table).start();
    let got = wait_for(&ch, &table, 1100, Duration::from_secs(120)).await;
    assert!(sink.stop(Duration::from_secs(30)), "{}", sink.log_tail());
    assert_eq!(
        (got.rows, got.distinct_offsets, got.distinct_ids),
        (1100, 1100, 1000),
        "{}",
        sink.log_tail()
    );
    let mut again = SinkSpec::new(&topic, &table).start();
    let mut replay = SinkSpec::new(&topic, &table);
    replay.delivery = "at-least-once";
    let mut replay = replay.start();
    let deadline = Instant::now() + Duration::from_secs(120);
    while landed(&ch, &table).await.rows < 2200 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Give the exactly-once group time to (not) write anything.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(again.stop(Duration::from_secs(30)), "{}", again.log_tail());
    assert!(
        replay.stop(Duration::from_secs(30)),
        "{}",
        replay.log_tail()
    );
    let got = landed(&ch, &table).await;
    assert_eq!(
        (got.rows, got.distinct_offsets),
        (2200, 1100),
        "{}\n{}",
        again.log_tail(),
        replay.log_tail()
    );
    exec(
        &ch,
        &format!(
            "INSERT INTO {table} SELECT * FROM {table} ORDER BY _partition, _offset LIMIT 30 \
             SETTINGS async_insert = 0"
        ),
    )
    .await;
    (ch, table)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_classifies_and_repair_folds_each_partition() {
    let (ch, table) = table_with_both_kinds().await;
    // Ground truth, per day partition, from what was written.
    let replays_per_day: Vec<(String, u64)> = ch
        .query(&format!(
            "SELECT toString(day), count() - uniqExact(_topic, _partition, _offset) FROM {table} \
             GROUP BY day ORDER BY day"
        ))
        .fetch_all()
        .await
        .unwrap();
    let replays: u64 = replays_per_day.iter().map(|r| r.1).sum();
    assert_eq!(replays, 1130);

    let r = report(&["audit", "--table", &table, "--key", "id"], 1);
    assert_eq!(u(&r, "/rows"), 2230);
    assert_eq!(u(&r, "/distinct_offsets"), 1100);
    assert_eq!(u(&r, "/distinct_keys"), 1000);
    assert_eq!(u(&r, "/sink_replay_rows"), 1130);
    assert_eq!(u(&r, "/producer_side_rows"), 100);
    assert_eq!(u(&r, "/duplicate_rows"), 1230);
    assert_eq!(r["time_column"], "day");
    let breakdown = r["by_partition_day"].as_array().unwrap();
    let extra = |ep: &str, day: &str| -> u64 {
        breakdown
            .iter()
            .filter(|b| b["entry_point"] == ep && b["day"] == day)
            .map(|b| b["extra_rows"].as_u64().unwrap())
            .sum()
    };
    // Even ids land on 07-30, odd on 07-31: 50 re-produced keys each.
    assert_eq!(extra("producer-side", "2026-07-30"), 50);
    assert_eq!(extra("producer-side", "2026-07-31"), 50);
    for (day, n) in &replays_per_day {
        assert_eq!(extra("sink-replay", day), *n, "{day}");
    }
    for b in breakdown {
        assert_eq!(
            b["partition"].as_str().unwrap().replace('-', ""),
            b["day"].as_str().unwrap().replace('-', "")
        );
    }
    let samples = r["samples"].as_array().unwrap();
    assert!(samples.iter().any(|s| s["entry_point"] == "producer-side"
        && s["copies"] == 2
        && s["offsets"].as_str().unwrap().contains(", ")));
    // By offset alone, only the sink's copies show.
    let r = report(&["audit", "--table", &table], 1);
    assert_eq!(u(&r, "/duplicate_rows"), 1130);
    // One partition only.
    let r = report(
        &[
            "audit",
            "--table",
            &table,
            "--key",
            "id",
            "--partition",
            "20260730",
        ],
        1,
    );
    assert_eq!(u(&r, "/producer_side_rows"), 50);
    assert_eq!(u(&r, "/sink_replay_rows"), replays_per_day[0].1);

    // Dry run: the plan and the counts, and nothing changes.
    let before = count(&ch, &format!("SELECT count() FROM {table}")).await;
    let dry = report(
        &[
            "repair",
            "--table",
            &table,
            "--partition",
            "20260730",
            "--key",
            "id",
        ],
        0,
    );
    let want_removed = 50 + replays_per_day[0].1;
    assert_eq!(u(&dry, "/removed_rows"), want_removed);
    assert_eq!(u(&dry, "/before/keys"), 500);
    assert_eq!(dry["plan"].as_array().unwrap().len(), 6);
    assert_eq!(
        count(&ch, &format!("SELECT count() FROM {table}")).await,
        before
    );
    let (db, _) = table.split_once('.').unwrap();
    let sluice_tables = format!(
        "SELECT count() FROM system.tables WHERE database = '{db}' AND name LIKE '%__sluice_%'"
    );
    assert_eq!(count(&ch, &sluice_tables).await, 0);

    // Both partitions, for real.
    for p in ["20260730", "20260731"] {
        let r = report(
            &[
                "repair",
                "--table",
                &table,
                "--partition",
                p,
                "--key",
                "id",
                "--execute",
            ],
            0,
        );
        assert_eq!(u(&r, "/after/rows"), 500, "{r}");
        assert_eq!(u(&r, "/after/keys"), 500);
        assert_eq!(u(&r, "/before/max_offset"), u(&r, "/after/max_offset"));
    }
    assert_eq!(
        count(&ch, &format!("SELECT count() FROM {table}")).await,
        1000
    );
    // The copy kept for each key is the one with the highest offset.
    let kept_highest = count(
        &ch,
        &format!(
            "SELECT count() FROM {table} WHERE (id, _offset) IN \
             (SELECT id, max(_offset) FROM {table}__sluice_backup_20260730 GROUP BY id)"
        ),
    )
    .await;
    assert_eq!(kept_highest, 500);
    // The backups hold the partitions as they were; staging is gone.
    let mut backed_up = 0;
    for p in ["20260730", "20260731"] {
        backed_up += count(
            &ch,
            &format!("SELECT count() FROM {table}__sluice_backup_{p}"),
        )
        .await;
    }
    assert_eq!(backed_up, 2230);
    assert_eq!(count(&ch, &sluice_tables).await, 2);
    // Clean now; running the repair again is a no-op.
    report(&["audit", "--table", &table, "--key", "id"], 0);
    let again = report(
        &[
            "repair",
            "--table",
            &table,
            "--partition",
            "20260730",
            "--key",
            "id",
            "--execute",
        ],
        0,
    );
    assert!(
        again["notes"].to_string().contains("already repaired"),
        "{again}"
    );
}

/// A partition of `n` rows over `n / 2` keys (each key twice, at two offsets).
async fn doubled_table(ch: &clickhouse::Client, n: u64) -> String {
    let db = unique("rep");
    exec(ch, &format!("CREATE DATABASE {db}")).await;
    exec(
        ch,
        &format!(
            "CREATE TABLE {db}.t (id UInt64, v String, doubled UInt64 MATERIALIZED id * 2,
                _topic LowCardinality(String), _partition UInt32, _offset UInt64)
             ENGINE = MergeTree PARTITION BY id % 2 ORDER BY id"
        ),
    )
    .await;
    exec(
        ch,
        &format!(
            "INSERT INTO {db}.t (id, v, _topic, _partition, _offset) \
             SELECT intDiv(number, 2) * 2, toString(number), 't', 0, number FROM numbers({n}) \
             SETTINGS async_insert = 0"
        ),
    )
    .await;
    format!("{db}.t")
}

#[tokio::test]
async fn repair_interrupted_at_every_step_finishes_or_rolls_back() {
    let ch = ch();
    for step in ["create-tables", "backup", "stage", "replace", "cleanup"] {
        let table = doubled_table(&ch, 2000).await;
        let args = [
            "repair",
            "--table",
            &table,
            "--partition",
            "0",
            "--key",
            "id",
            "--execute",
        ];
        let mut first = args.to_vec();
        first.extend(["--interrupt-after", step]);
        let (code, _, err) = tool(&first);
        assert_eq!(code, 2, "{step}: {err}");
        assert!(err.contains("interrupted after"), "{step}: {err}");
        // Before the replace, the run names what it left and how to go on.
        let before_replace = !matches!(step, "replace" | "cleanup");
        let note = format!("This run left {table}__sluice_staging_0 and {table}__sluice_backup_0");
        assert_eq!(
            err.contains(&note) && err.contains("the next run drops them"),
            before_replace,
            "{step}: {err}"
        );
        let r = report(&args, 0);
        let (rows, keys, materialized): (u64, u64, u64) = ch
            .query(&format!(
                "SELECT count(), uniqExact(id), sum(doubled = id * 2) FROM {table}"
            ))
            .fetch_one()
            .await
            .unwrap();
        assert_eq!(
            (rows, keys, materialized),
            (1000, 1000, 1000),
            "{step}: {r}"
        );
        let highest = count(
            &ch,
            &format!("SELECT count() FROM {table} WHERE _offset % 2 = 1"),
        )
        .await;
        assert_eq!(highest, 1000, "{step}: the later copy of each key is kept");
        assert_eq!(
            count(
                &ch,
                &format!("SELECT count() FROM {table}__sluice_backup_0")
            )
            .await,
            2000,
            "{step}"
        );
        let (db, _) = table.split_once('.').unwrap();
        let staging = count(
            &ch,
            &format!("SELECT count() FROM system.tables WHERE database = '{db}' AND name LIKE '%staging%'"),
        )
        .await;
        assert_eq!(staging, 0, "{step}");
        let notes = r["notes"].to_string();
        match step {
            "replace" | "cleanup" => assert!(notes.contains("finishing"), "{step}: {notes}"),
            _ => assert!(notes.contains("rolled back"), "{step}: {notes}"),
        }
    }
}

#[tokio::test]
async fn repair_killed_at_random_instants_finishes_when_run_again() {
    use rand::Rng;
    let ch = ch();
    for round in 0..8 {
        let table = doubled_table(&ch, 200_000).await;
        let args = [
            "repair",
            "--table",
            &table,
            "--partition",
            "0",
            "--key",
            "id",
            "--execute",
        ];
        let mut child = sluice(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let delay = rand::rng().random_range(0..180);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        // The server may still be finishing the statement it was sent.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let r = report(&args, 0);
        let (rows, keys): (u64, u64) = ch
            .query(&format!("SELECT count(), uniqExact(id) FROM {table}"))
            .fetch_one()
            .await
            .unwrap();
        assert_eq!(
            (rows, keys),
            (100_000, 100_000),
            "round {round} (killed at {delay} ms): {r}"
        );
        assert_eq!(
            count(
                &ch,
                &format!("SELECT count() FROM {table} WHERE _offset % 2 = 1")
            )
            .await,
            100_000
        );
        let backup = format!("{table}__sluice_backup_0");
        assert_eq!(
            count(&ch, &format!("SELECT count() FROM {backup}")).await,
            200_000,
            "round {round}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_refuses_a_partition_that_is_being_written() {
    let ch = ch();
    let table = doubled_table(&ch, 400_000).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (t, s) = (table.clone(), stop.clone());
    let writer = tokio::spawn(async move {
        let mut written = 0u64;
        let mut i = 10_000_000u64;
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            let body = format!(r#"{{"id":{i},"v":"w","_topic":"t","_partition":0,"_offset":{i}}}"#);
            insert_block(&t, body, &format!("w{i}")).await;
            written += 1;
            i += 2;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        written
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let (code, out, err) = tool(&[
        "repair",
        "--table",
        &table,
        "--partition",
        "0",
        "--key",
        "id",
        "--execute",
    ]);
    eprintln!("repair took {:?}", started.elapsed());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.await.unwrap();
    let (db, _) = table.split_once('.').unwrap();
    if code == 0 {
        // The server ran the writer's inserts only around the repair's
        // own statements (a loaded machine): no write fell inside its
        // window, and none may be lost.
        assert_eq!(
            count(&ch, &format!("SELECT count() FROM {table}")).await,
            200_000 + written,
            "a repair that saw no write keeps every row: stdout {out}\nstderr {err}"
        );
        return;
    }
    assert_eq!(code, 2, "stdout {out}\nstderr {err}");
    let sluice_tables = format!(
        "SELECT count() FROM system.tables WHERE database = '{db}' AND name LIKE '%sluice%'"
    );
    if err.contains("refused") {
        // Seen before the replace: nothing was lost and the sluice tables are gone.
        assert!(err.contains("received writes"), "{err}");
        assert_eq!(
            count(&ch, &format!("SELECT count() FROM {table}")).await,
            400_000 + written
        );
        assert_eq!(count(&ch, &sluice_tables).await, 0);
    } else {
        // A write in the instant between the last check and the replace:
        // the replace dropped it, and the run says so loudly, with the count,
        // and keeps the backup.
        assert!(
            err.contains("system.part_log shows") && err.contains("re-send what is missing"),
            "{err}"
        );
        let rows = count(&ch, &format!("SELECT count() FROM {table}")).await;
        let reported: u64 = err
            .split("shows ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{err}"));
        // Writes after the replace count in part_log too: the report is an
        // upper bound on what was lost, never less.
        assert!(rows <= 200_000 + written, "{rows} {written}: {err}");
        assert!(
            rows + reported >= 200_000 + written,
            "{rows} {written}: {err}"
        );
        let backup = sluice_tables.replace("%sluice%", "%sluice_backup%");
        assert_eq!(count(&ch, &backup).await, 1, "the backup stays");
    }
}

#[tokio::test]
async fn schema_prints_ddl_the_engine_accepts() {
    let ch = ch();
    let db = unique("schema");
    exec(&ch, &format!("CREATE DATABASE {db}")).await;
    let table = format!("{db}.orders");
    let (code, ddl, err) = tool(&[
        "schema",
        "--table",
        &table,
        "--key",
        "order_id",
        "--columns",
        "order_id UInt64, amount Decimal(12, 2), created_at DateTime64(3)",
        "--partition-by",
        "toYYYYMM(created_at)",
    ]);
    assert_eq!(code, 0, "{err}");
    exec(&ch, &ddl).await;
    let (engine, sorting): (String, String) = ch
        .query(
            "SELECT engine, sorting_key FROM system.tables WHERE database = ? AND name = 'orders'",
        )
        .bind(&db)
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(
        (engine.as_str(), sorting.as_str()),
        ("ReplacingMergeTree", "order_id")
    );
    let create: String = ch
        .query(&format!("SELECT create_table_query FROM system.tables WHERE database = '{db}' AND name = 'orders'"))
        .fetch_one()
        .await
        .unwrap();
    assert!(create.contains("PROJECTION watermark"), "{create}");
    // Folding: two copies of a key, read with FINAL, are one row, the later.
    exec(
        &ch,
        &format!(
            "INSERT INTO {table} (order_id, amount, created_at, _topic, _partition, _offset) VALUES \
             (1, 1, now(), 't', 0, 5), (1, 2, now(), 't', 0, 9)"
        ),
    )
    .await;
    let (n, amount): (u64, f64) = ch
        .query(&format!(
            "SELECT count(), toFloat64(any(amount)) FROM {table} FINAL"
        ))
        .fetch_one()
        .await
        .unwrap();
    assert_eq!((n, amount), (1, 2.0));
    // Columns can also come from an existing table.
    let (code, again, _) = tool(&["schema", "--table", &table, "--key", "order_id"]);
    assert_eq!(code, 0);
    assert!(again.contains("`amount` Decimal(12, 2)"), "{again}");
    assert_eq!(again.matches("`_offset` UInt64").count(), 1, "{again}");
    // A key that is not a column.
    let (code, _, err) = tool(&["schema", "--table", &table, "--key", "nope"]);
    assert_eq!(code, 2);
    assert!(err.contains("\"nope\""), "{err}");
}

/// `audit` and `repair` with `--config`: the sink's metadata column names
/// (`[sink.columns]`) and connection; `repair` on each partition layout (none,
/// one expression, a tuple) with a sorting key of two columns, because its
/// copies must take the original's keys exactly for REPLACE PARTITION.
#[tokio::test]
async fn audit_and_repair_follow_the_config_on_every_layout() {
    let ch = ch();
    let dir = std::env::temp_dir().join(unique("ops_cfg"));
    std::fs::create_dir_all(&dir).unwrap();
    for (layout, partition_by, order_by) in [
        ("none", "", "(id, r)"),
        ("monthly", "PARTITION BY toYYYYMM(d)", "tuple(id, r)"),
        ("tuple", "PARTITION BY (toYYYYMM(d), r)", "(id, r)"),
    ] {
        let db = unique("layout");
        exec(&ch, &format!("CREATE DATABASE {db}")).await;
        let table = format!("{db}.t");
        exec(
            &ch,
            &format!(
                "CREATE TABLE {table} (id UInt64, d Date, r String,
                    src_topic LowCardinality(String), src_partition UInt32, src_offset UInt64)
                 ENGINE = MergeTree {partition_by} ORDER BY {order_by}
                 SETTINGS non_replicated_deduplication_window = 0, index_granularity = 4096"
            ),
        )
        .await;
        // Two records per key (a producer-side duplicate), then the first
        // 100 offsets stored again (a sink replay).
        for sql in [
            "SELECT intDiv(number, 2), '2026-07-30', 'x', 't', 0, number FROM numbers(2000)",
            "SELECT intDiv(number, 2), '2026-07-30', 'x', 't', 0, number FROM numbers(100)",
        ] {
            exec(
                &ch,
                &format!("INSERT INTO {table} {sql} SETTINGS async_insert = 0"),
            )
            .await;
        }
        let cfg = dir.join(format!("{layout}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[kafka]\nbrokers = \"127.0.0.1:1\"\n[clickhouse]\nurl = \"{}\"\n\
                 [sink.columns]\ntopic = \"src_topic\"\npartition = \"src_partition\"\n\
                 offset = \"src_offset\"\n[[route]]\ntopic = \"t\"\ntable = \"{table}\"\n",
                clickhouse_url()
            ),
        )
        .unwrap();
        let cfg = cfg.to_str().unwrap();
        // Without the file, the default names are not there: a clear error.
        let (code, _, err) = tool(&["audit", "--table", &table, "--key", "id"]);
        assert_eq!(code, 2, "{layout}: {err}");
        assert!(err.contains("\"_topic\""), "{layout}: {err}");
        let a = report(
            &["audit", "--config", cfg, "--table", &table, "--key", "id"],
            1,
        );
        assert_eq!(u(&a, "/rows"), 2100, "{layout}: {a}");
        assert_eq!(u(&a, "/sink_replay_rows"), 100, "{layout}: {a}");
        assert_eq!(u(&a, "/producer_side_rows"), 1000, "{layout}: {a}");
        let pid: String = ch
            .query("SELECT any(partition_id) FROM system.parts WHERE database = ? AND table = 't' AND active")
            .bind(&db)
            .fetch_one()
            .await
            .unwrap();
        let args = [
            "repair",
            "--config",
            cfg,
            "--table",
            &table,
            "--partition",
            &pid,
            "--key",
            "id",
            "--execute",
        ];
        let r = report(&args, 0);
        assert_eq!(u(&r, "/removed_rows"), 1100, "{layout}: {r}");
        let (rows, keys, latest): (u64, u64, u64) = ch
            .query(&format!(
                "SELECT count(), uniqExact(id), sum(src_offset % 2 = 1) FROM {table}"
            ))
            .fetch_one()
            .await
            .unwrap();
        assert_eq!((rows, keys, latest), (1000, 1000, 1000), "{layout}: {r}");
        let a = report(
            &["audit", "--config", cfg, "--table", &table, "--key", "id"],
            0,
        );
        assert_eq!(u(&a, "/duplicate_rows"), 0, "{layout}: {a}");
    }
}
