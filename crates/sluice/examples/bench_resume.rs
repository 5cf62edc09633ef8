//! Benchmark of the resume lookup: the highest stored offset per partition,
//! read the way `sluice run` reads it on every assignment.
//!
//! `cargo run --release --example bench_resume -- [ROWS]` (default 100 M)
//! fills `bench_resume.events_<ROWS>` once (8 partitions, business-key
//! order, the watermark projection), then times the lookup with the
//! projection and, for comparison, the same query forced to scan.

use sluice::ch::ClickHouse;
use sluice::config::{ClickHouseConfig, Delivery, Route};
use sluice_formats::MetadataColumns;
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let rows: u64 = std::env::args()
        .nth(1)
        .map_or(Ok(100_000_000), |s| s.parse())?;
    let url = std::env::var("CLICKHOUSE_URL").unwrap_or_else(|_| "http://127.0.0.1:18123".into());
    let client = clickhouse::Client::default().with_url(&url);
    let table = format!("events_{rows}");
    client
        .query("CREATE DATABASE IF NOT EXISTS bench_resume")
        .execute()
        .await?;
    let exists: u64 = client
        .query("SELECT count() FROM system.tables WHERE database = 'bench_resume' AND name = ?")
        .bind(&table)
        .fetch_one()
        .await?;
    let filled: u64 = if exists == 1 {
        client
            .query(&format!("SELECT count() FROM bench_resume.{table}"))
            .fetch_one()
            .await?
    } else {
        0
    };
    if filled != rows {
        client
            .query(&format!("DROP TABLE IF EXISTS bench_resume.{table}"))
            .execute()
            .await?;
        client
            .query(&format!(
                "CREATE TABLE bench_resume.{table} (
                    order_id UInt64, amount UInt32,
                    _topic LowCardinality(String), _partition UInt32, _offset UInt64,
                    PROJECTION watermark (SELECT _topic, _partition, max(_offset) GROUP BY _topic, _partition)
                ) ENGINE = ReplacingMergeTree(_offset) ORDER BY order_id
                SETTINGS deduplicate_merge_projection_mode = 'rebuild'"
            ))
            .execute()
            .await?;
        let t0 = Instant::now();
        let step = 10_000_000u64;
        for start in (0..rows).step_by(step as usize) {
            let n = step.min(rows - start);
            client
                .query(&format!(
                    "INSERT INTO bench_resume.{table}
                     SELECT cityHash64(number) AS order_id, number % 1000, 'orders', number % 8, intDiv(number, 8)
                     FROM numbers({start}, {n})"
                ))
                .with_setting("max_execution_time", "0")
                .execute()
                .await?;
            eprintln!(
                "filled {} rows ({:.0}s)",
                start + n,
                t0.elapsed().as_secs_f64()
            );
        }
    }
    let parts: u64 = client
        .query("SELECT count() FROM system.parts WHERE database = 'bench_resume' AND table = ? AND active")
        .bind(&table)
        .fetch_one()
        .await?;

    let cfg = ClickHouseConfig {
        database: "bench_resume".into(),
        ..ClickHouseConfig::at(url.clone())
    };
    let ch = ClickHouse::connect(
        &cfg,
        MetadataColumns::default(),
        Delivery::ExactlyOnce,
        100_000,
    )
    .await?;
    let route = Route {
        topic: "orders".into(),
        database: "bench_resume".into(),
        table: table.clone(),
        dedup: None,
        required: Vec::new(),
        format: sluice::config::Format::Json,
        subject: None,
        extra_to_dlq: false,
    };
    let mut with = Vec::new();
    for _ in 0..20 {
        let t0 = Instant::now();
        let marks = ch.watermarks(&route).await?;
        with.push(t0.elapsed());
        assert_eq!(marks.len(), 8);
    }
    let mut without = Vec::new();
    for _ in 0..3 {
        let t0 = Instant::now();
        client
            .query(&format!(
                "SELECT toInt32(_partition), toInt64(max(_offset)) FROM bench_resume.{table}
                 WHERE _topic = 'orders' GROUP BY _topic, _partition
                 SETTINGS optimize_use_projections = 0"
            ))
            .fetch_all::<(i32, i64)>()
            .await?;
        without.push(t0.elapsed());
    }
    with.sort();
    without.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!("resume lookup on {rows} rows ({parts} active parts), 8 partitions:");
    println!(
        "  with the watermark projection: median {:.1} ms, max {:.1} ms (20 runs)",
        ms(with[with.len() / 2]),
        ms(with[with.len() - 1])
    );
    println!(
        "  plain scan (projection off):   median {:.1} ms (3 runs)",
        ms(without[without.len() / 2])
    );
    println!(
        "  ratio: {:.0}x",
        ms(without[without.len() / 2]) / ms(with[with.len() / 2]).max(0.001)
    );
    Ok(())
}
