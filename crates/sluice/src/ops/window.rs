//! `sluice window`: how long a table's block-level dedup window lasts.
//!
//! In: a table, optionally a cluster, a look-back period and the client's
//! re-submit interval. The server's `system.merge_tree_settings` and the
//! table's own `SETTINGS` give the effective window; `system.part_log`
//! gives the table's block rate (`NewPart`, `error = 0`, summed over
//! replicas) and the re-submits the window caught (`error = 389`). Out: a
//! report, readable or JSON, with the window in seconds set against the
//! re-submit interval, a recommended size and its Keeper cost. The
//! arithmetic lives in [`sluice_protocol::window`].
//!
//! Exit status: 0 when the window covers the longest re-submit, 1 when it
//! does not, 2 on error.

use super::db::Table;
use super::{progress, thousands, OpsError};
use crate::ch::{ChArgs, Conn};
use crate::report::{grid, Outcome};
use crate::sql::{literal, TableRef};
use comfy_table::Table as Grid;
use serde::Serialize;
use sluice_protocol::window::{self, Recommendation, RetryInterval, WindowSettings};
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct WindowArgs {
    /// The table, as DB.TABLE.
    #[arg(long, value_parser = TableRef::parse)]
    pub(crate) table: TableRef,
    /// Sum the block rate over every replica of this cluster
    /// (`clusterAllReplicas`).
    #[arg(long)]
    pub(crate) cluster: Option<String>,
    /// How far back to measure the block rate.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub(crate) since: Duration,
    /// When a timed-out INSERT is re-submitted: `MIN..MAX` or one duration.
    #[arg(long, default_value = "32s..124s", value_parser = RetryInterval::parse)]
    pub(crate) retry_interval: RetryInterval,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub ch: ChArgs,
}

const SETTINGS: [&str; 3] = [
    "replicated_deduplication_window",
    "replicated_deduplication_window_seconds",
    "non_replicated_deduplication_window",
];

#[derive(Debug, Serialize)]
pub(crate) struct WindowReport {
    pub(crate) table: String,
    pub(crate) engine: String,
    pub(crate) replicated: bool,
    pub(crate) settings: Vec<SettingRow>,
    /// The window that applies to this table, in blocks (0: dedup is off).
    pub(crate) window_blocks: u64,
    /// Its seconds bound, for replicated tables.
    pub(crate) window_seconds_bound: Option<u64>,
    pub(crate) part_log: PartLogState,
    pub(crate) hosts: Vec<HostRate>,
    /// Summed over hosts.
    pub(crate) blocks_per_sec: f64,
    pub(crate) rows_per_block: f64,
    /// `None`: nothing bounds the window (no blocks are being written).
    pub(crate) window_secs: Option<f64>,
    pub(crate) retry_min_secs: f64,
    pub(crate) retry_max_secs: f64,
    pub(crate) catches_min: bool,
    pub(crate) catches_max: bool,
    pub(crate) recommendation: RecommendationOut,
    pub(crate) replicated_tables: u64,
    pub(crate) caught_resubmits: u64,
    pub(crate) caught_per_hour: Vec<HourCount>,
    pub(crate) warnings: Vec<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct SettingRow {
    pub(crate) name: String,
    pub(crate) server_default: Option<String>,
    pub(crate) table_override: Option<String>,
    pub(crate) effective: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct PartLogState {
    pub(crate) enabled: bool,
    /// How much history it holds, seconds.
    pub(crate) history_secs: u64,
    /// The period the rate was measured over, seconds.
    pub(crate) measured_secs: u64,
}

#[derive(Debug, Serialize, clickhouse::Row, serde::Deserialize)]
pub(crate) struct HostRate {
    pub(crate) host: String,
    pub(crate) blocks: u64,
    pub(crate) rows: u64,
    #[serde(skip_deserializing)]
    pub(crate) blocks_per_sec: f64,
}

#[derive(Debug, Serialize, clickhouse::Row, serde::Deserialize)]
pub(crate) struct HourCount {
    pub(crate) hour: String,
    pub(crate) count: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct RecommendationOut {
    pub(crate) setting: String,
    pub(crate) minimum_blocks: u64,
    pub(crate) recommended_blocks: u64,
    pub(crate) minimum_seconds: Option<u64>,
    pub(crate) znodes_this_table: Option<u64>,
    pub(crate) znodes_as_server_default: Option<u64>,
}

/// The `part_log` queries, for one source (`system.part_log` or every
/// replica's).
#[derive(Debug, PartialEq)]
pub(crate) struct PartLogSql {
    pub(crate) rate: String,
    pub(crate) history: String,
    pub(crate) caught: String,
}

pub(crate) fn part_log_sql(cluster: Option<&str>, t: &TableRef, since: Duration) -> PartLogSql {
    let src = match cluster {
        Some(c) => format!("clusterAllReplicas({}, system.part_log)", literal(c)),
        None => "system.part_log".to_string(),
    };
    let table = format!(
        "database = {} AND table = {} AND event_type = 'NewPart'",
        literal(&t.database),
        literal(&t.table)
    );
    let recent = format!("event_time >= now() - INTERVAL {} SECOND", since.as_secs());
    PartLogSql {
        rate: format!(
            "SELECT hostName() AS host, count() AS blocks, sum(rows) AS rows FROM {src} \
             WHERE {table} AND error = 0 AND {recent} GROUP BY host ORDER BY host"
        ),
        history: format!(
            "SELECT toUInt64(ifNull(min(h), 0)) FROM (SELECT hostName() AS host, \
             greatest(0, dateDiff('second', min(event_time), now())) AS h FROM {src} GROUP BY host)"
        ),
        caught: format!(
            "SELECT toString(toStartOfHour(event_time)) AS hour, count() AS count FROM {src} \
             WHERE {table} AND error = 389 AND {recent} GROUP BY hour ORDER BY hour"
        ),
    }
}

pub async fn run(args: WindowArgs, conn: Conn) -> Result<Outcome, OpsError> {
    let report = measure(&args, &conn.client).await?;
    let covered = report.window_blocks > 0 && report.catches_max;
    super::emit(args.json, &report, render)?;
    Ok(if covered {
        Outcome::Clean
    } else {
        Outcome::Found
    })
}

/// What the server said, before any arithmetic.
#[derive(Debug)]
pub(crate) struct Measured {
    pub(crate) table: String,
    pub(crate) engine: String,
    pub(crate) replicated: bool,
    /// `(name, server default)` from `system.merge_tree_settings`.
    pub(crate) defaults: Vec<(String, String)>,
    /// `(name, value)` from the table's own `SETTINGS`.
    pub(crate) overrides: Vec<(String, String)>,
    /// `None`: `system.part_log` does not exist.
    pub(crate) part_log_history_secs: Option<u64>,
    pub(crate) hosts: Vec<HostRate>,
    pub(crate) caught_per_hour: Vec<HourCount>,
    pub(crate) replicated_tables: u64,
}

pub(crate) async fn measure(
    args: &WindowArgs,
    client: &clickhouse::Client,
) -> Result<WindowReport, OpsError> {
    let bar = progress(!args.json, "reading the table's settings");
    let table = Table::describe(client, &args.table).await?;
    if !table.is_merge_tree() {
        return Err(OpsError::Invalid(format!(
            "{} is a {} table; block-level dedup applies to MergeTree tables only",
            args.table, table.info.engine
        )));
    }
    let defaults: Vec<(String, String)> = client
        .query("SELECT name, value FROM system.merge_tree_settings WHERE name IN ?")
        .bind(SETTINGS)
        .fetch_all()
        .await?;
    bar.set_message("reading system.part_log");
    let enabled = client
        .query("SELECT count() FROM system.tables WHERE database = 'system' AND name = 'part_log'")
        .fetch_one::<u64>()
        .await?
        > 0;
    let sql = part_log_sql(args.cluster.as_deref(), &args.table, args.since);
    let (hosts, history, caught_per_hour) = if enabled {
        let hosts: Vec<HostRate> = client.query(&sql.rate).fetch_all().await?;
        let history: u64 = client.query(&sql.history).fetch_one().await?;
        let caught: Vec<HourCount> = client.query(&sql.caught).fetch_all().await?;
        (hosts, Some(history), caught)
    } else {
        (Vec::new(), None, Vec::new())
    };
    let replicated_tables: u64 = client
        .query("SELECT count() FROM system.tables WHERE engine LIKE 'Replicated%MergeTree'")
        .fetch_one()
        .await?;
    bar.finish_and_clear();
    let overrides = SETTINGS
        .iter()
        .filter_map(|n| table.info.setting(n).map(|v| (n.to_string(), v)))
        .collect();
    Ok(assemble(
        Measured {
            table: args.table.to_string(),
            engine: table.info.engine.clone(),
            replicated: table.info.is_replicated(),
            defaults,
            overrides,
            part_log_history_secs: history,
            hosts,
            caught_per_hour,
            replicated_tables,
        },
        args.since,
        args.retry_interval,
    ))
}

/// The report's arithmetic: effective settings, rates, the window in
/// seconds against the re-submit interval, and the recommendation.
pub(crate) fn assemble(m: Measured, since: Duration, iv: RetryInterval) -> WindowReport {
    let settings: Vec<SettingRow> = SETTINGS
        .iter()
        .map(|name| {
            let find =
                |v: &[(String, String)]| v.iter().find(|d| d.0 == *name).map(|d| d.1.clone());
            let (server_default, table_override) = (find(&m.defaults), find(&m.overrides));
            SettingRow {
                name: name.to_string(),
                effective: table_override.clone().or(server_default.clone()),
                server_default,
                table_override,
            }
        })
        .collect();
    let num = |name: &str| -> Option<u64> {
        let s = settings.iter().find(|s| s.name == name)?;
        s.effective.as_deref()?.trim_matches('\'').parse().ok()
    };
    let w = if m.replicated {
        WindowSettings {
            blocks: num(SETTINGS[0]).unwrap_or(0),
            seconds: num(SETTINGS[1]),
        }
    } else {
        WindowSettings {
            blocks: num(SETTINGS[2]).unwrap_or(0),
            seconds: None,
        }
    };
    let mut warnings = Vec::new();
    let history = m.part_log_history_secs.unwrap_or(0);
    match m.part_log_history_secs {
        None => warnings.push(
            "system.part_log does not exist: the server has no <part_log> section (or has not \
             flushed it yet), so the block rate cannot be measured"
                .into(),
        ),
        Some(h) if h < since.as_secs() => warnings.push(format!(
            "system.part_log holds only {} of history, less than --since {}: the rate is \
             measured over what it has",
            humantime::format_duration(Duration::from_secs(h)),
            humantime::format_duration(since)
        )),
        Some(_) => {}
    }
    if w.blocks == 0 {
        warnings.push(format!(
            "the dedup window of {} is 0 blocks: block-level dedup is off for it",
            m.table
        ));
    }
    let measured = since.as_secs().min(history).max(1);
    let mut hosts = m.hosts;
    for h in &mut hosts {
        h.blocks_per_sec = h.blocks as f64 / measured as f64;
    }
    let blocks: u64 = hosts.iter().map(|h| h.blocks).sum();
    let rows: u64 = hosts.iter().map(|h| h.rows).sum();
    let rate = blocks as f64 / measured as f64;
    let rec: Recommendation = window::recommend(rate, iv, w, m.replicated_tables);
    let replicated = m.replicated;
    WindowReport {
        table: m.table,
        engine: m.engine,
        replicated,
        settings,
        window_blocks: w.blocks,
        window_seconds_bound: w.seconds,
        part_log: PartLogState {
            enabled: m.part_log_history_secs.is_some(),
            history_secs: history,
            measured_secs: measured,
        },
        hosts,
        blocks_per_sec: rate,
        rows_per_block: if blocks > 0 {
            rows as f64 / blocks as f64
        } else {
            0.0
        },
        window_secs: window::window_seconds(w, rate),
        retry_min_secs: iv.min.as_secs_f64(),
        retry_max_secs: iv.max.as_secs_f64(),
        catches_min: window::catches(w, rate, iv.min),
        catches_max: window::catches(w, rate, iv.max),
        recommendation: RecommendationOut {
            setting: if replicated { SETTINGS[0] } else { SETTINGS[2] }.to_string(),
            minimum_blocks: rec.minimum_blocks,
            recommended_blocks: rec.recommended_blocks,
            minimum_seconds: replicated.then_some(rec.minimum_seconds),
            znodes_this_table: replicated.then_some(rec.znodes_this_table),
            znodes_as_server_default: replicated.then_some(rec.znodes_as_default),
        },
        replicated_tables: m.replicated_tables,
        caught_resubmits: m.caught_per_hour.iter().map(|h| h.count).sum(),
        caught_per_hour: m.caught_per_hour,
        warnings,
    }
}

/// The readable report.
pub(crate) fn render(r: &WindowReport) -> String {
    let mut out = format!("sluice window: {} ({})\n\n", r.table, r.engine);
    let mut g = grid(["setting", "server default", "table", "effective"]);
    for s in &r.settings {
        let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        g.add_row([
            s.name.clone(),
            dash(&s.server_default),
            dash(&s.table_override),
            dash(&s.effective),
        ]);
    }
    out += &format!("{g}\n\n");

    let span = humantime::format_duration(Duration::from_secs(r.part_log.measured_secs));
    out += &format!("Block rate (system.part_log, NewPart with error = 0, last {span}):\n");
    let mut g: Grid = grid(["host", "blocks", "blocks/s", "rows/block"]);
    for h in &r.hosts {
        g.add_row([
            h.host.clone(),
            thousands(h.blocks),
            rate(h.blocks_per_sec),
            format!("{:.1}", h.rows as f64 / h.blocks.max(1) as f64),
        ]);
    }
    g.add_row([
        "total".to_string(),
        thousands(r.hosts.iter().map(|h| h.blocks).sum()),
        rate(r.blocks_per_sec),
        format!("{:.1}", r.rows_per_block),
    ]);
    out += &format!("{g}\n\n");

    let secs = match r.window_secs {
        Some(s) => format!("≈ {}", fmt_secs(s)),
        None => "unbounded (no blocks written)".into(),
    };
    out += &format!(
        "Window: {} blocks ÷ {} blocks/s {secs}",
        thousands(r.window_blocks),
        rate(r.blocks_per_sec)
    );
    if let Some(b) = r.window_seconds_bound {
        out += &format!(" (capped at {})", fmt_secs(b as f64));
    }
    out += "\n";
    for (after, caught) in [
        (r.retry_min_secs, r.catches_min),
        (r.retry_max_secs, r.catches_max),
    ] {
        let verdict = if caught { "caught" } else { "NOT caught" };
        out += &format!(
            "  a re-submit {} after the first attempt: {verdict}",
            fmt_secs(after)
        );
        if let (false, Some(w)) = (caught, r.window_secs.filter(|w| *w > 0.0)) {
            out += &format!(" ({:.1}× the window)", after / w);
        }
        out += "\n";
    }
    let rec = &r.recommendation;
    out += &format!(
        "\nRecommended: {} ≥ {} (rate × {}); with {}% margin, {}.\n",
        rec.setting,
        thousands(rec.minimum_blocks),
        fmt_secs(r.retry_max_secs),
        ((window::MARGIN - 1.0) * 100.0).round(),
        thousands(rec.recommended_blocks)
    );
    if let (Some(s), Some(z1), Some(zn)) = (
        rec.minimum_seconds,
        rec.znodes_this_table,
        rec.znodes_as_server_default,
    ) {
        out += &format!(
            "  replicated_deduplication_window_seconds must stay ≥ {s}.\n  \
             Keeper cost: +{} znodes for this table alone; as a server default, \
             ≈ {} × {} replicated tables = {} znodes in blocks/.\n",
            thousands(z1),
            thousands(rec.recommended_blocks),
            r.replicated_tables,
            thousands(zn)
        );
    } else {
        out += "  A non-replicated table keeps its dedup log on local disk: no Keeper cost.\n";
    }
    out += &format!(
        "\nRe-submits the window caught (error = 389): {}\n",
        thousands(r.caught_resubmits)
    );
    if !r.caught_per_hour.is_empty() {
        let mut g = grid(["hour", "caught"]);
        for h in &r.caught_per_hour {
            g.add_row([h.hour.clone(), thousands(h.count)]);
        }
        out += &format!("{g}\n");
    }
    for w in &r.warnings {
        out += &format!("warning: {w}\n");
    }
    out += "\nThe window is a best-effort first filter; sluice's exactly-once delivery does not rely on it.\n";
    out
}

fn rate(r: f64) -> String {
    if r > 0.0 && r < 1.0 {
        format!("{r:.3}")
    } else {
        format!("{r:.1}")
    }
}

fn fmt_secs(s: f64) -> String {
    if s < 100.0 {
        format!("{s:.1} s")
    } else {
        format!("{s:.0} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documents' table: 25.3 defaults, three replicas at 36.0, 42.3
    /// and 46.1 blocks/s over 24 h, about 19 rows a block.
    fn documents(window: Option<&str>) -> WindowReport {
        let day = 86_400;
        let host = |name: &str, per_sec: f64, rows_per: f64| {
            let blocks = (per_sec * day as f64).round() as u64;
            HostRate {
                host: name.into(),
                blocks,
                rows: (blocks as f64 * rows_per) as u64,
                blocks_per_sec: 0.0,
            }
        };
        let s = |n: &str, v: &str| (n.to_string(), v.to_string());
        assemble(
            Measured {
                table: "default.events".into(),
                engine: "ReplicatedMergeTree".into(),
                replicated: true,
                defaults: vec![
                    s("replicated_deduplication_window", "1000"),
                    s("replicated_deduplication_window_seconds", "604800"),
                    s("non_replicated_deduplication_window", "0"),
                ],
                overrides: window
                    .map(|w| vec![s("replicated_deduplication_window", w)])
                    .unwrap_or_default(),
                part_log_history_secs: Some(4 * day),
                hosts: vec![
                    host("A", 36.0, 21.4),
                    host("B", 42.3, 19.2),
                    host("C", 46.1, 17.5),
                ],
                caught_per_hour: vec![HourCount {
                    hour: "2025-07-30 10:00:00".into(),
                    count: 12,
                }],
                replicated_tables: 100,
            },
            Duration::from_secs(day),
            RetryInterval::parse("32s..124s").unwrap(),
        )
    }

    #[test]
    fn reproduces_the_documents_conclusions() {
        let r = documents(None);
        assert!(
            (r.blocks_per_sec - 124.4).abs() < 0.01,
            "{}",
            r.blocks_per_sec
        );
        assert!(
            (r.rows_per_block - 19.0).abs() < 0.5,
            "{}",
            r.rows_per_block
        );
        assert!((r.window_secs.unwrap() - 8.04).abs() < 0.01);
        assert!(!r.catches_min && !r.catches_max);
        assert_eq!(r.recommendation.minimum_blocks, 15_426);
        assert_eq!(r.recommendation.recommended_blocks, 20_000);
        assert_eq!(r.recommendation.znodes_as_server_default, Some(2_000_000));
        let text = render(&r);
        assert!(
            text.contains("1,000 blocks ÷ 124.4 blocks/s ≈ 8.0 s"),
            "{text}"
        );
        assert!(
            text.contains("32.0 s after the first attempt: NOT caught (4.0× the window)"),
            "{text}"
        );
        assert!(text.contains("≥ 15,426"), "{text}");
        assert!(text.contains("with 25% margin, 20,000"), "{text}");
        assert!(
            text.contains("Re-submits the window caught (error = 389): 12"),
            "{text}"
        );
        // The 26.3 default, 10,000 blocks: about 80 s; 32 s is caught, 124 s is not.
        let r = documents(Some("10000"));
        assert!((r.window_secs.unwrap() - 80.4).abs() < 0.1);
        assert!(r.catches_min && !r.catches_max);
        assert!(render(&r).contains("≈ 80.4 s"));
        // 20,000 covers 124 s.
        assert!(documents(Some("20000")).catches_max);
    }

    #[test]
    fn cluster_queries_sum_every_replica() {
        let t = TableRef::parse("default.events").unwrap();
        let sql = part_log_sql(Some("default"), &t, Duration::from_secs(86_400));
        assert_eq!(
            sql.rate,
            "SELECT hostName() AS host, count() AS blocks, sum(rows) AS rows FROM \
             clusterAllReplicas('default', system.part_log) WHERE database = 'default' AND \
             table = 'events' AND event_type = 'NewPart' AND error = 0 AND event_time >= now() \
             - INTERVAL 86400 SECOND GROUP BY host ORDER BY host"
        );
        assert!(sql
            .caught
            .contains("FROM clusterAllReplicas('default', system.part_log)"));
        assert!(sql.caught.contains("error = 389"));
        assert!(sql
            .history
            .contains("FROM clusterAllReplicas('default', system.part_log) GROUP BY host"));
        let local = part_log_sql(None, &t, Duration::from_secs(60));
        assert!(local.rate.contains("FROM system.part_log WHERE"));
        assert!(local.rate.contains("INTERVAL 60 SECOND"));
        let odd = part_log_sql(Some("it's"), &t, Duration::from_secs(1));
        assert!(odd
            .rate
            .contains("clusterAllReplicas('it\\'s', system.part_log)"));
    }
}
