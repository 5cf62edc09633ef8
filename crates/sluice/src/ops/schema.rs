//! `sluice schema`: the recommended DDL for a sluice target table.
//!
//! In: a table name, its business key and its columns (given on the command
//! line, read from the table if it exists, or from an Avro or Protobuf
//! schema in a schema registry). Out: a `CREATE TABLE` on
//! stdout with
//! - the metadata columns sluice writes (`_topic`, `_partition`, `_offset`);
//! - the `watermark` projection that answers the resume lookup (highest
//!   stored offset per partition) in milliseconds, and a minmax index on
//!   `_offset` for reconciliation reads;
//! - `ReplacingMergeTree(_offset)` ordered by the key, so copies of a key
//!   fold into the one with the highest offset, and a note on `FINAL`.

use super::db::{parse_columns, Columns, Table};
use super::OpsError;
use crate::ch::{ChArgs, Conn};
use crate::report::Outcome;
use crate::sql::{ident as qi, ident_list, TableRef};
use sluice_formats::MetadataColumns;

#[derive(Debug, Clone, clap::Args)]
pub struct SchemaArgs {
    /// The table, as DB.TABLE.
    #[arg(long, value_parser = TableRef::parse)]
    pub(crate) table: TableRef,
    /// The business key, comma-separated columns (becomes ORDER BY).
    #[arg(long, value_parser = parse_columns)]
    pub(crate) key: Columns,
    /// The data columns, e.g. "order_id UInt64, amount Decimal(12, 2)".
    /// Default: read them from the existing table.
    #[arg(long, conflicts_with = "registry")]
    pub(crate) columns: Option<String>,
    /// Take the data columns from a schema registry: the latest Avro or
    /// Protobuf schema of --subject (its first message, for Protobuf).
    #[arg(long, requires = "subject")]
    pub(crate) registry: Option<String>,
    /// The registry subject, e.g. orders-value.
    #[arg(long, requires = "registry")]
    pub(crate) subject: Option<String>,
    /// A PARTITION BY expression, e.g. "toYYYYMM(created_at)".
    #[arg(long)]
    pub(crate) partition_by: Option<String>,
    /// Emit ReplicatedReplacingMergeTree, ON CLUSTER this cluster.
    #[arg(long)]
    pub(crate) cluster: Option<String>,
    #[command(flatten)]
    pub ch: ChArgs,
}

/// The metadata columns' types, in order: topic, partition, offset.
pub(crate) const METADATA_TYPES: [&str; 3] = ["LowCardinality(String)", "UInt32", "UInt64"];

/// What the DDL is built from.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) table: TableRef,
    pub(crate) key: Vec<String>,
    /// `(name, type)` of the data columns, metadata excluded.
    pub(crate) columns: Vec<(String, String)>,
    pub(crate) partition_by: Option<String>,
    pub(crate) cluster: Option<String>,
    /// The metadata columns' names (`[sink.columns]` with --config).
    pub(crate) meta: MetadataColumns,
}

/// `"a UInt64, b Decimal(12, 2)"` → `[(a, UInt64), (b, Decimal(12, 2))]`.
pub(crate) fn parse_column_defs(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let (mut depth, mut cur) = (0i32, String::new());
    for ch in s.chars().chain(std::iter::once(',')) {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                let def = cur.trim();
                if !def.is_empty() {
                    let (n, t) = def.split_once(char::is_whitespace).ok_or_else(|| {
                        format!("column {def:?} has no type (expected \"name Type\")")
                    })?;
                    out.push((n.trim_matches('`').to_string(), t.trim().to_string()));
                }
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    if depth != 0 {
        return Err(format!("unbalanced parentheses in {s:?}"));
    }
    if out.is_empty() {
        return Err("expected one or more \"name Type\" column definitions".into());
    }
    Ok(out)
}

/// The recommended `CREATE TABLE`.
pub(crate) fn ddl(s: &Spec) -> Result<String, String> {
    for k in &s.key {
        if !s.columns.iter().any(|(n, _)| n == k) {
            return Err(format!("key column {k:?} is not among the columns"));
        }
    }
    let on_cluster = s
        .cluster
        .as_ref()
        .map(|c| format!(" ON CLUSTER {}", qi(c)))
        .unwrap_or_default();
    let m = &s.meta;
    let names = [&m.topic, &m.partition, &m.offset];
    let (topic, partition, offset) = (qi(&m.topic), qi(&m.partition), qi(&m.offset));
    let engine = match &s.cluster {
        Some(_) => format!(
            "ReplicatedReplacingMergeTree('/clickhouse/tables/{{shard}}/{}/{}', '{{replica}}', {offset})",
            s.table.database, s.table.table
        ),
        None => format!("ReplacingMergeTree({offset})"),
    };
    let mut cols: Vec<String> = s
        .columns
        .iter()
        .filter(|(n, _)| !names.contains(&n))
        .map(|(n, t)| format!("    {} {t},", qi(n)))
        .collect();
    cols.push("    -- Where each row came from; sluice resumes and reconciles from these.".into());
    cols.extend(
        names
            .iter()
            .zip(METADATA_TYPES)
            .map(|(n, t)| format!("    {} {t},", qi(n))),
    );
    let mut out = format!(
        "-- The recommended sluice target for {t}: one row per Kafka record, folded by key.\n\
         CREATE TABLE {sql}{on_cluster}\n(\n{cols}\n    \
         -- Reconciliation reads one offset range: the minmax index skips the rest.\n    \
         INDEX offset_minmax {offset} TYPE minmax GRANULARITY 1,\n    \
         -- The resume lookup (highest stored offset per partition) reads this\n    \
         -- projection instead of the table: milliseconds on 100 M rows.\n    \
         PROJECTION watermark (SELECT {topic}, {partition}, max({offset}) GROUP BY {topic}, {partition})\n\
         )\n\
         -- Copies of a key (a producer retry, a manual re-send) fold into the row with\n\
         -- the highest {offset} when parts merge.\n\
         ENGINE = {engine}\n",
        t = s.table,
        sql = s.table.sql(),
        cols = cols.join("\n"),
    );
    if let Some(p) = &s.partition_by {
        out += &format!("PARTITION BY {p}\n");
    }
    let order = match s.key.len() {
        1 => ident_list(&s.key),
        _ => format!("({})", ident_list(&s.key)),
    };
    out += &format!(
        "ORDER BY {order}\n\
         -- Merges that fold rows rebuild the projection instead of refusing.\n\
         SETTINGS deduplicate_merge_projection_mode = 'rebuild';\n\
         \n\
         -- Merges run in the background at no fixed time: until a key's copies have\n\
         -- merged, read with FINAL to see one row per key, e.g.\n\
         --   SELECT count() FROM {} FINAL;\n",
        s.table.sql()
    );
    Ok(out)
}

/// The columns of `subject`'s latest schema in the registry at `url`.
async fn registry_columns(url: &str, subject: &str) -> Result<Vec<(String, String)>, OpsError> {
    use crate::registry::{build, Decoder, Registry};
    let cfg = crate::config::SchemaRegistryConfig::from_url(url);
    let invalid = |e: crate::registry::RegistryError| OpsError::Invalid(format!("--registry: {e}"));
    let registry = Registry::new(&cfg).map_err(invalid)?;
    let latest = registry.version(subject, "latest").await.map_err(invalid)?;
    let id = latest.id.unwrap_or(0);
    let expected = match latest.kind().to_ascii_uppercase().as_str() {
        "PROTOBUF" => "protobuf",
        _ => "avro",
    };
    let resolved = registry.resolve(latest).await.map_err(invalid)?;
    match build(id, &resolved, expected).map_err(invalid)? {
        Decoder::Avro(a) => Ok(a.columns()),
        Decoder::Protobuf(p) => p
            .columns(&[0])
            .map_err(|e| OpsError::Invalid(format!("--subject: {e}"))),
    }
}

pub async fn run(args: SchemaArgs, conn: Conn) -> Result<Outcome, OpsError> {
    let columns = match (&args.columns, &args.registry, &args.subject) {
        (Some(c), _, _) => {
            parse_column_defs(c).map_err(|e| OpsError::Invalid(format!("--columns: {e}")))?
        }
        (None, Some(url), Some(subject)) => registry_columns(url, subject).await?,
        _ => {
            let client = &conn.client;
            if !Table::exists(client, &args.table).await? {
                return Err(OpsError::Invalid(format!(
                    "table {} does not exist: give its columns with --columns \"name Type, …\"",
                    args.table
                )));
            }
            Table::describe(client, &args.table)
                .await?
                .columns
                .into_iter()
                .filter(|c| c.is_stored())
                .map(|c| (c.name, c.type_))
                .collect()
        }
    };
    let spec = Spec {
        table: args.table.clone(),
        key: args.key.0.clone(),
        columns,
        partition_by: args.partition_by.clone(),
        cluster: args.cluster.clone(),
        meta: conn.columns,
    };
    let sql = ddl(&spec).map_err(|e| OpsError::Invalid(format!("--key: {e}")))?;
    print!("{sql}");
    Ok(Outcome::Clean)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(cluster: Option<&str>) -> Spec {
        Spec {
            table: TableRef::parse("shop.orders").unwrap(),
            key: vec!["order_id".into()],
            columns: parse_column_defs("order_id UInt64, amount Decimal(12, 2), _offset UInt64")
                .unwrap(),
            partition_by: Some("toYYYYMM(created_at)".into()),
            cluster: cluster.map(String::from),
            meta: MetadataColumns::default(),
        }
    }

    #[test]
    fn column_definitions() {
        let c = parse_column_defs("a UInt64, `b` Decimal(12, 2),c Map(String, UInt8)").unwrap();
        assert_eq!(
            c,
            vec![
                ("a".into(), "UInt64".into()),
                ("b".into(), "Decimal(12, 2)".into()),
                ("c".into(), "Map(String, UInt8)".into())
            ]
        );
        assert!(parse_column_defs("a").is_err());
        assert!(parse_column_defs("a Decimal(12, 2").is_err());
        assert!(parse_column_defs(" ").is_err());
    }

    #[test]
    fn the_ddl() {
        let d = ddl(&spec(None)).unwrap();
        assert!(d.contains("CREATE TABLE `shop`.`orders`\n("));
        assert!(d.contains("    `amount` Decimal(12, 2),"));
        assert_eq!(d.matches("`_offset` UInt64").count(), 1, "{d}");
        assert!(d.contains("PROJECTION watermark"));
        assert!(d.contains("ENGINE = ReplacingMergeTree(`_offset`)\nPARTITION BY toYYYYMM(created_at)\nORDER BY `order_id`\n"));
        assert!(d.contains("FINAL"));
        let r = ddl(&spec(Some("main"))).unwrap();
        assert!(r.contains("CREATE TABLE `shop`.`orders` ON CLUSTER `main`"));
        assert!(r.contains(
            "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/shop/orders', '{replica}', `_offset`)"
        ));
        let mut renamed = spec(None);
        renamed.meta = MetadataColumns {
            topic: "src_topic".into(),
            partition: "src_partition".into(),
            offset: "src_offset".into(),
        };
        let d = ddl(&renamed).unwrap();
        assert!(d.contains("    `src_offset` UInt64,"), "{d}");
        assert!(d.contains("max(`src_offset`) GROUP BY `src_topic`, `src_partition`"));
        assert!(d.contains("ReplacingMergeTree(`src_offset`)") && !d.contains("`_topic`"));
        let mut bad = spec(None);
        bad.key = vec!["nope".into()];
        assert!(ddl(&bad).unwrap_err().contains("\"nope\""));
    }
}
