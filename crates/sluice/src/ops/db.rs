//! The ClickHouse connection the operator tools share, and what they ask it
//! about a table.
//!
//! In: `--config` or `--clickhouse-url`, the user and password, and
//! `DB.TABLE` names. Out: a [`Conn`] (a client built as the sink builds
//! its own, and the metadata column names), the table's engine, keys and
//! columns, and SQL quoting. Every
//! failure is an [`OpsError`](super::OpsError) that names the table or column involved.

use super::OpsError;
use crate::ch::TableRef;
use crate::config::{ClickHouseConfig, ConfigError, RawConfig, Secret};
use sluice_formats::row::MetadataColumns;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How to reach ClickHouse; shared by every operator command.
#[derive(Debug, Clone, clap::Args)]
pub struct ChArgs {
    /// Reach ClickHouse as `sluice run` does with this config file: its
    /// `[clickhouse]` section (URL, user, password, database, read
    /// settings) and its metadata column names (`[sink.columns]`), with
    /// `SLUICE_…` variables applied.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub server: ChServer,
}

impl ChArgs {
    pub fn connect(&self) -> Result<Conn, ConfigError> {
        self.server.connect(self.config.as_deref())
    }
}

/// The flags that name the server, its user and the query bound; with a
/// config file they override the file's.
#[derive(Debug, Clone, clap::Args)]
pub struct ChServer {
    /// ClickHouse HTTP URL; overrides the file's. Without --config,
    /// SLUICE_CLICKHOUSE_URL, then CLICKHOUSE_URL stand in for it
    /// [default: http://127.0.0.1:8123].
    #[arg(long)]
    pub clickhouse_url: Option<String>,
    /// ClickHouse user; overrides the file's. Without --config,
    /// SLUICE_CLICKHOUSE_USER stands in for it [default: default]. The
    /// password comes from the file or SLUICE_CLICKHOUSE_PASSWORD.
    #[arg(long)]
    pub user: Option<String>,
    /// How long each query may run on the server (`max_execution_time`;
    /// by default the server's own limit, or the file's `read_settings`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub query_timeout: Option<Duration>,
}

/// A connection an operator tool works through.
#[derive(Clone)]
pub struct Conn {
    pub client: clickhouse::Client,
    /// The server's URL, for error messages.
    pub url: String,
    /// The names of the metadata columns in the tables sluice writes.
    pub columns: MetadataColumns,
}

impl ChServer {
    /// Resolves the flags (and the config file, if any) into a client built
    /// as the sink builds its own ([`crate::ch::client`]), with the file's
    /// read settings on every query. Only the file's `[clickhouse]` and
    /// `[sink.columns]` are read: the rest of it is not required.
    pub fn connect(&self, config: Option<&Path>) -> Result<Conn, ConfigError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let (mut cfg, columns) = match config {
            Some(path) => RawConfig::load(path, std::env::vars())?
                .clickhouse_side(self.clickhouse_url.clone())?,
            None => {
                let url = self
                    .clickhouse_url
                    .clone()
                    .or_else(|| var("SLUICE_CLICKHOUSE_URL"))
                    .or_else(|| var("CLICKHOUSE_URL"))
                    .unwrap_or_else(|| DEFAULT_URL.into());
                let mut cfg = ClickHouseConfig::at(url);
                if let Some(user) = var("SLUICE_CLICKHOUSE_USER") {
                    cfg.user = user;
                }
                if let Some(p) = var("SLUICE_CLICKHOUSE_PASSWORD") {
                    cfg.password = Secret::new(p);
                }
                (cfg, MetadataColumns::default())
            }
        };
        if let Some(user) = &self.user {
            cfg.user = user.clone();
        }
        let mut client = crate::ch::client(&cfg);
        for (k, v) in &cfg.read_settings {
            client = client.with_setting(k, v);
        }
        if let Some(t) = self.query_timeout {
            // Last, so the flag beats the file.
            client = client.with_setting("max_execution_time", t.as_secs().max(1).to_string());
        }
        Ok(Conn {
            client,
            url: cfg.url,
            columns,
        })
    }
}

/// Where the operator tools look without a flag, a file or CLICKHOUSE_URL.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8123";

/// A comma-separated column list (`--key order_id,region`), as one flag value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns(pub Vec<String>);

impl std::ops::Deref for Columns {
    type Target = [String];
    fn deref(&self) -> &[String] {
        &self.0
    }
}

/// Parses a [`Columns`] flag.
pub fn parse_columns(s: &str) -> Result<Columns, String> {
    let cols: Vec<String> = s
        .split(',')
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
        .collect();
    if cols.is_empty() {
        return Err("expected one or more column names, comma-separated".into());
    }
    Ok(Columns(cols))
}

/// What `system.tables` says about a table.
#[derive(Debug, Clone, clickhouse::Row, serde::Deserialize)]
pub struct TableInfo {
    pub engine: String,
    pub engine_full: String,
    pub partition_key: String,
    pub sorting_key: String,
    pub primary_key: String,
    pub sampling_key: String,
    pub storage_policy: String,
}

impl TableInfo {
    pub fn is_replicated(&self) -> bool {
        self.engine.starts_with("Replicated")
    }

    /// `SETTINGS a = 1, b = 'x'` of the engine clause, as written.
    pub fn settings_clause(&self) -> Option<&str> {
        self.engine_full
            .rfind(" SETTINGS ")
            .map(|i| &self.engine_full[i + " SETTINGS ".len()..])
    }

    /// The table's own value of a MergeTree setting, if it overrides one.
    pub fn setting(&self, name: &str) -> Option<String> {
        split_settings(self.settings_clause()?)
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }
}

/// `a = 1, b = 'x, y'` → `[(a, 1), (b, 'x, y')]`, respecting quotes.
fn split_settings(clause: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let (mut cur, mut quoted, mut escaped) = (String::new(), false, false);
    for ch in clause.chars().chain(std::iter::once(',')) {
        match ch {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '\'' => quoted = !quoted,
            ',' if !quoted => {
                if let Some((k, v)) = cur.split_once('=') {
                    out.push((k.trim().to_string(), v.trim().to_string()));
                }
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    out
}

/// One column of a table.
#[derive(Debug, Clone, clickhouse::Row, serde::Deserialize)]
pub struct Column {
    pub name: String,
    #[serde(rename = "type")]
    pub type_: String,
    /// `''`, `DEFAULT`, `MATERIALIZED`, `ALIAS` or `EPHEMERAL`.
    pub default_kind: String,
}

impl Column {
    /// Stored in parts (so copied by `INSERT … SELECT`).
    pub fn is_stored(&self) -> bool {
        !matches!(self.default_kind.as_str(), "ALIAS" | "EPHEMERAL")
    }

    pub fn is_time(&self) -> bool {
        let t = self
            .type_
            .trim_start_matches("Nullable(")
            .trim_start_matches("LowCardinality(");
        t.starts_with("Date")
    }
}

/// A table that exists, with its columns.
#[derive(Debug, Clone)]
pub struct Table {
    pub name: TableRef,
    pub info: TableInfo,
    pub columns: Vec<Column>,
}

impl Table {
    /// Reads a table's description; a clear error if it does not exist.
    pub async fn describe(client: &clickhouse::Client, name: &TableRef) -> Result<Self, OpsError> {
        let info: Option<TableInfo> = client
            .query(
                "SELECT engine, engine_full, partition_key, sorting_key, primary_key, \
                 sampling_key, storage_policy FROM system.tables WHERE database = ? AND name = ?",
            )
            .bind(&name.database)
            .bind(&name.table)
            .fetch_optional()
            .await?;
        let Some(info) = info else {
            return Err(OpsError::Invalid(format!("table {name} does not exist")));
        };
        let columns = client
            .query(
                "SELECT name, type, default_kind FROM system.columns \
                 WHERE database = ? AND table = ? ORDER BY position",
            )
            .bind(&name.database)
            .bind(&name.table)
            .fetch_all()
            .await?;
        Ok(Self {
            name: name.clone(),
            info,
            columns,
        })
    }

    /// Whether a table exists.
    pub async fn exists(client: &clickhouse::Client, name: &TableRef) -> Result<bool, OpsError> {
        Ok(client
            .query("SELECT count() FROM system.tables WHERE database = ? AND name = ?")
            .bind(&name.database)
            .bind(&name.table)
            .fetch_one::<u64>()
            .await?
            > 0)
    }

    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// Errors unless every named column exists, naming the first that does not.
    pub fn require(&self, cols: &[String], what: &str) -> Result<(), OpsError> {
        for c in cols {
            if self.column(c).is_none() {
                let have: Vec<&str> = self.columns.iter().map(|c| c.name.as_str()).collect();
                return Err(OpsError::Invalid(format!(
                    "{what} column {c:?} is not a column of {} (it has: {})",
                    self.name,
                    have.join(", ")
                )));
            }
        }
        Ok(())
    }

    pub fn is_merge_tree(&self) -> bool {
        self.info.engine.ends_with("MergeTree")
    }

    /// The time column to group by day: the one asked for, else the first
    /// `Date*` column.
    pub fn time_column(&self, asked: Option<&str>) -> Result<Option<String>, OpsError> {
        match asked {
            Some(c) => {
                self.require(&[c.to_string()], "time")?;
                Ok(Some(c.to_string()))
            }
            None => Ok(self
                .columns
                .iter()
                .find(|c| c.is_time() && c.is_stored())
                .map(|c| c.name.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_clause() {
        let info = TableInfo {
            engine: "ReplicatedReplacingMergeTree".into(),
            engine_full: "ReplicatedReplacingMergeTree('/t/{shard}', '{replica}', _offset) \
                          ORDER BY id SETTINGS replicated_deduplication_window = 20000, \
                          deduplicate_merge_projection_mode = 'rebuild', x = 'a, b'"
                .into(),
            partition_key: String::new(),
            sorting_key: "id".into(),
            primary_key: "id".into(),
            sampling_key: String::new(),
            storage_policy: "default".into(),
        };
        assert!(info.is_replicated());
        assert_eq!(
            info.setting("replicated_deduplication_window").as_deref(),
            Some("20000")
        );
        assert_eq!(info.setting("x").as_deref(), Some("'a, b'"));
        assert_eq!(info.setting("index_granularity"), None);
    }

    #[test]
    fn column_lists() {
        assert_eq!(parse_columns(" a, b ,").unwrap().0, vec!["a", "b"]);
        assert!(parse_columns(" , ").is_err());
    }
}
