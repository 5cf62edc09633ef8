//! `sluice audit`: duplicate rows in a table, counted by entry point.
//!
//! In: a table, optionally a business key and a filter (one table partition,
//! or a look-back period on a time column). Out: how many rows are extra
//! copies, split by how they got there, per table partition and day, with
//! sample groups:
//!
//! - the same `(_topic, _partition, _offset)` stored more than once is a
//!   **sink replay or re-submit** (the record went through Kafka once);
//! - the same key at different offsets is a **producer retry or manual
//!   re-send** (Kafka holds the record twice).
//!
//! The two classes add up: `rows − distinct keys = replay + producer`.
//! Exit status: 0 when clean, 1 when duplicates were found, 2 on error.

use super::db::{parse_columns, Columns, Table};
use super::{progress, thousands, OpsError};
use crate::ch::{ChArgs, Conn};
use crate::report::{grid, Outcome};
use crate::sql::{ident as qi, ident_list, literal, TableRef};
use serde::Serialize;
use sluice_formats::MetadataColumns;
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// The table, as DB.TABLE.
    #[arg(long, value_parser = TableRef::parse)]
    pub(crate) table: TableRef,
    /// The business key, comma-separated columns. Without it only the same
    /// offset stored twice is found.
    #[arg(long, value_parser = parse_columns)]
    pub(crate) key: Option<Columns>,
    /// Only this table partition (its ID, as `system.parts.partition_id`).
    #[arg(long, conflicts_with = "since")]
    pub(crate) partition: Option<String>,
    /// Only rows whose time column is this recent.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) since: Option<Duration>,
    /// The column that dates a row (default: the first Date/DateTime column).
    #[arg(long)]
    pub(crate) time_column: Option<String>,
    /// Sample groups to show per entry point.
    #[arg(long, default_value_t = 5)]
    pub(crate) samples: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub ch: ChArgs,
}

/// The entry point a duplicate came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum EntryPoint {
    /// Same offset twice: the sink replayed or re-submitted a batch.
    SinkReplay,
    /// Same key at different offsets: a producer retry or a manual re-send.
    ProducerSide,
}

impl EntryPoint {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::SinkReplay => "sink replay or re-submit (same offset twice)",
            Self::ProducerSide => "producer retry or manual re-send (same key, new offset)",
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct AuditReport {
    pub(crate) table: String,
    pub(crate) key: Option<Vec<String>>,
    pub(crate) filter: String,
    pub(crate) time_column: Option<String>,
    pub(crate) rows: u64,
    pub(crate) distinct_offsets: u64,
    pub(crate) distinct_keys: Option<u64>,
    /// Extra copies of an offset: `rows − distinct offsets`.
    pub(crate) sink_replay_rows: u64,
    /// Extra offsets of a key: `distinct offsets − distinct keys`.
    pub(crate) producer_side_rows: u64,
    pub(crate) duplicate_rows: u64,
    pub(crate) by_partition_day: Vec<Breakdown>,
    pub(crate) samples: Vec<Sample>,
}

#[derive(Debug, Serialize, clickhouse::Row, serde::Deserialize)]
pub(crate) struct Breakdown {
    pub(crate) partition: String,
    /// Empty when the table has no time column.
    pub(crate) day: String,
    pub(crate) groups: u64,
    pub(crate) extra_rows: u64,
    #[serde(skip_deserializing, default = "replay")]
    pub(crate) entry_point: EntryPoint,
}

fn replay() -> EntryPoint {
    EntryPoint::SinkReplay
}

#[derive(Debug, Serialize, clickhouse::Row, serde::Deserialize)]
pub(crate) struct Sample {
    pub(crate) key: String,
    pub(crate) copies: u64,
    /// `topic/partition@offset`, up to six.
    pub(crate) offsets: String,
    #[serde(skip_deserializing, default = "replay")]
    pub(crate) entry_point: EntryPoint,
}

/// The audit's SQL, built once from the arguments.
#[derive(Debug)]
pub(crate) struct AuditSql {
    pub(crate) totals: String,
    pub(crate) breakdown_replay: String,
    pub(crate) breakdown_producer: Option<String>,
    pub(crate) samples_replay: String,
    pub(crate) samples_producer: Option<String>,
}

pub(crate) fn audit_sql(
    t: &TableRef,
    meta: &MetadataColumns,
    key: Option<&[String]>,
    filter: &str,
    time_col: Option<&str>,
    samples: u64,
) -> AuditSql {
    let tbl = t.sql();
    let (topic, partition, offset) = (qi(&meta.topic), qi(&meta.partition), qi(&meta.offset));
    let off = &format!("{topic}, {partition}, {offset}");
    let at = format!("concat({topic}, '/', toString({partition}), '@', toString({offset}))");
    let day = match time_col {
        Some(c) => format!("toString(any(toDate({})))", qi(c)),
        None => "''".into(),
    };
    let key_str = |k: &[String]| {
        let parts: Vec<String> = k
            .iter()
            .map(|c| format!("concat({}, '=', toString({}))", literal(c), qi(c)))
            .collect();
        format!("arrayStringConcat([{}], ' ')", parts.join(", "))
    };
    let totals = match key {
        Some(k) => format!(
            "SELECT count(), uniqExact({off}), uniqExact({}) FROM {tbl} WHERE {filter}",
            ident_list(k)
        ),
        None => format!("SELECT count(), uniqExact({off}), toUInt64(0) FROM {tbl} WHERE {filter}"),
    };
    let breakdown = |group: &str, n: &str| {
        format!(
            "SELECT pid AS partition, day, count() AS groups, sum(n - 1) AS extra_rows FROM \
             (SELECT any(_partition_id) AS pid, {day} AS day, {n} AS n FROM {tbl} \
             WHERE {filter} GROUP BY {group} HAVING n > 1) GROUP BY pid, day ORDER BY pid, day"
        )
    };
    let offsets_of_group = format!(
        "arrayStringConcat(arrayMap(x -> concat(x.1, '/', toString(x.2), '@', toString(x.3)), \
         arraySlice(arraySort(groupUniqArray(({off}))), 1, 6)), ', ')"
    );
    let samples_replay = format!(
        "SELECT {} AS key, count() AS copies, {at} AS offsets FROM {tbl} WHERE {filter} \
         GROUP BY {off} HAVING copies > 1 ORDER BY copies DESC, {off} LIMIT {samples}",
        key.map(|k| format!("any({})", key_str(k)))
            .unwrap_or_else(|| "''".into())
    );
    AuditSql {
        totals,
        breakdown_replay: breakdown(off, "count()"),
        breakdown_producer: key.map(|k| breakdown(&ident_list(k), &format!("uniqExact({off})"))),
        samples_replay,
        samples_producer: key.map(|k| {
            format!(
                "SELECT {} AS key, uniqExact({off}) AS copies, {offsets_of_group} AS offsets \
                 FROM {tbl} WHERE {filter} GROUP BY {k} HAVING copies > 1 \
                 ORDER BY copies DESC, {k} LIMIT {samples}",
                key_str(k),
                k = ident_list(k)
            )
        }),
    }
}

pub async fn run(args: AuditArgs, conn: Conn) -> Result<Outcome, OpsError> {
    let report = audit(&args, &conn).await?;
    super::emit(args.json, &report, render)?;
    Ok(if report.duplicate_rows == 0 {
        Outcome::Clean
    } else {
        Outcome::Found
    })
}

pub(crate) async fn audit(args: &AuditArgs, conn: &Conn) -> Result<AuditReport, OpsError> {
    let client = &conn.client;
    let bar = progress(!args.json, "reading the table");
    let table = Table::describe(client, &args.table).await?;
    let m = &conn.columns;
    table.require(
        &[m.topic.clone(), m.partition.clone(), m.offset.clone()],
        "metadata",
    )?;
    if let Some(k) = &args.key {
        table.require(k, "key")?;
    }
    let time_col = table.time_column(args.time_column.as_deref())?;
    let filter = match (&args.partition, args.since) {
        (Some(p), _) => format!("_partition_id = {}", literal(p)),
        (None, Some(since)) => {
            let Some(c) = &time_col else {
                return Err(OpsError::Invalid(format!(
                    "--since needs a time column, and {} has no Date/DateTime column; name one with --time-column",
                    args.table
                )));
            };
            format!("{} >= now() - INTERVAL {} SECOND", qi(c), since.as_secs())
        }
        (None, None) => "1".into(),
    };
    let sql = audit_sql(
        &args.table,
        m,
        args.key.as_deref(),
        &filter,
        time_col.as_deref(),
        args.samples,
    );
    bar.set_message("counting rows, offsets and keys");
    let (rows, distinct_offsets, distinct_keys): (u64, u64, u64) =
        client.query(&sql.totals).fetch_one().await?;
    let sink_replay_rows = rows - distinct_offsets;
    let producer_side_rows = match args.key {
        Some(_) => distinct_offsets.saturating_sub(distinct_keys),
        None => 0,
    };
    bar.set_message("grouping sink replays");
    let mut by_partition_day: Vec<Breakdown> =
        client.query(&sql.breakdown_replay).fetch_all().await?;
    let mut samples: Vec<Sample> = client.query(&sql.samples_replay).fetch_all().await?;
    if let (Some(b), Some(s)) = (&sql.breakdown_producer, &sql.samples_producer) {
        bar.set_message("grouping keys stored at several offsets");
        let mut more: Vec<Breakdown> = client.query(b).fetch_all().await?;
        more.iter_mut()
            .for_each(|b| b.entry_point = EntryPoint::ProducerSide);
        by_partition_day.extend(more);
        let mut more: Vec<Sample> = client.query(s).fetch_all().await?;
        more.iter_mut()
            .for_each(|s| s.entry_point = EntryPoint::ProducerSide);
        samples.extend(more);
    }
    bar.finish_and_clear();
    by_partition_day.sort_by(|a, b| (&a.partition, &a.day).cmp(&(&b.partition, &b.day)));
    Ok(AuditReport {
        table: args.table.to_string(),
        key: args.key.clone().map(|k| k.0),
        filter,
        time_column: time_col,
        rows,
        distinct_offsets,
        distinct_keys: args.key.as_ref().map(|_| distinct_keys),
        sink_replay_rows,
        producer_side_rows,
        duplicate_rows: sink_replay_rows + producer_side_rows,
        by_partition_day,
        samples,
    })
}

pub(crate) fn render(r: &AuditReport) -> String {
    let mut out = format!("sluice audit: {} (where {})\n\n", r.table, r.filter);
    let mut g = grid(["", "rows"]);
    g.add_row(["rows".to_string(), thousands(r.rows)]);
    g.add_row([
        "distinct offsets".to_string(),
        thousands(r.distinct_offsets),
    ]);
    if let (Some(k), Some(n)) = (&r.key, r.distinct_keys) {
        g.add_row([format!("distinct keys ({})", k.join(", ")), thousands(n)]);
    }
    g.add_row([
        EntryPoint::SinkReplay.describe().to_string(),
        thousands(r.sink_replay_rows),
    ]);
    if r.key.is_some() {
        g.add_row([
            EntryPoint::ProducerSide.describe().to_string(),
            thousands(r.producer_side_rows),
        ]);
    }
    g.add_row(["duplicate rows".to_string(), thousands(r.duplicate_rows)]);
    out += &format!("{g}\n");
    if r.duplicate_rows == 0 {
        out += "\nNo duplicates.\n";
        return out;
    }
    let day = r.time_column.as_deref().unwrap_or("no time column");
    out += &format!("\nBy table partition and day ({day}):\n");
    let mut g = grid(["partition", "day", "entry point", "groups", "extra rows"]);
    for b in &r.by_partition_day {
        g.add_row([
            b.partition.clone(),
            if b.day.is_empty() {
                "-".into()
            } else {
                b.day.clone()
            },
            kebab(b.entry_point),
            thousands(b.groups),
            thousands(b.extra_rows),
        ]);
    }
    out += &format!("{g}\n\nSamples:\n");
    let mut g = grid(["entry point", "key", "copies", "offsets"]);
    for s in &r.samples {
        g.add_row([
            kebab(s.entry_point),
            s.key.clone(),
            thousands(s.copies),
            s.offsets.clone(),
        ]);
    }
    out += &format!("{g}\n");
    out
}

fn kebab(e: EntryPoint) -> String {
    match e {
        EntryPoint::SinkReplay => "sink-replay",
        EntryPoint::ProducerSide => "producer-side",
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_groups_by_offset_and_by_key() {
        let t = TableRef::parse("db.orders").unwrap();
        let key = vec!["order_id".to_string()];
        let sql = audit_sql(
            &t,
            &MetadataColumns::default(),
            Some(&key),
            "_partition_id = '202607'",
            Some("ts"),
            3,
        );
        assert_eq!(
            sql.totals,
            "SELECT count(), uniqExact(`_topic`, `_partition`, `_offset`), uniqExact(`order_id`) \
             FROM `db`.`orders` WHERE _partition_id = '202607'"
        );
        assert!(sql
            .breakdown_replay
            .contains("GROUP BY `_topic`, `_partition`, `_offset` HAVING n > 1"));
        let producer = sql.breakdown_producer.unwrap();
        assert!(producer.contains("uniqExact(`_topic`, `_partition`, `_offset`) AS n"));
        assert!(producer.contains("GROUP BY `order_id` HAVING n > 1"));
        assert!(producer.contains("toString(any(toDate(`ts`)))"));
        assert!(sql.samples_replay.ends_with("LIMIT 3"));
        let none = audit_sql(&t, &MetadataColumns::default(), None, "1", None, 5);
        assert!(none.breakdown_producer.is_none() && none.samples_producer.is_none());
        assert!(none.breakdown_replay.contains("'' AS day"));
    }
}
