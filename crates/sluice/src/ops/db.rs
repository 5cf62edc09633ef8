//! What the operator tools ask ClickHouse about a table.
//!
//! In: a client (a [`Conn`](crate::ch::Conn)'s) and `DB.TABLE` names, and
//! `--key`-style column lists. Out: the table's engine, keys, settings and
//! columns. Every failure is an [`OpsError`](super::OpsError) that names
//! the table or column involved.

use super::OpsError;
use crate::sql::TableRef;

/// A comma-separated column list (`--key order_id,region`), as one flag value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Columns(pub(crate) Vec<String>);

impl std::ops::Deref for Columns {
    type Target = [String];
    fn deref(&self) -> &[String] {
        &self.0
    }
}

/// Parses a [`Columns`] flag.
pub(crate) fn parse_columns(s: &str) -> Result<Columns, String> {
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
pub(crate) struct TableInfo {
    pub(crate) engine: String,
    pub(crate) engine_full: String,
    pub(crate) partition_key: String,
    pub(crate) sorting_key: String,
    pub(crate) primary_key: String,
    pub(crate) sampling_key: String,
}

impl TableInfo {
    pub(crate) fn is_replicated(&self) -> bool {
        self.engine.starts_with("Replicated")
    }

    /// `SETTINGS a = 1, b = 'x'` of the engine clause, as written.
    pub(crate) fn settings_clause(&self) -> Option<&str> {
        self.engine_full
            .rfind(" SETTINGS ")
            .map(|i| &self.engine_full[i + " SETTINGS ".len()..])
    }

    /// The table's own value of a MergeTree setting, if it overrides one.
    pub(crate) fn setting(&self, name: &str) -> Option<String> {
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
pub(crate) struct Column {
    pub(crate) name: String,
    #[serde(rename = "type")]
    pub(crate) type_: String,
    /// `''`, `DEFAULT`, `MATERIALIZED`, `ALIAS` or `EPHEMERAL`.
    pub(crate) default_kind: String,
}

impl Column {
    /// Stored in parts (so copied by `INSERT … SELECT`).
    pub(crate) fn is_stored(&self) -> bool {
        !matches!(self.default_kind.as_str(), "ALIAS" | "EPHEMERAL")
    }

    pub(crate) fn is_time(&self) -> bool {
        let t = self
            .type_
            .trim_start_matches("Nullable(")
            .trim_start_matches("LowCardinality(");
        t.starts_with("Date")
    }
}

/// A table that exists, with its columns.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    pub(crate) name: TableRef,
    pub(crate) info: TableInfo,
    pub(crate) columns: Vec<Column>,
}

impl Table {
    /// Reads a table's description; a clear error if it does not exist.
    pub(crate) async fn describe(
        client: &clickhouse::Client,
        name: &TableRef,
    ) -> Result<Self, OpsError> {
        let info: Option<TableInfo> = client
            .query(
                "SELECT engine, engine_full, partition_key, sorting_key, primary_key, \
                 sampling_key FROM system.tables WHERE database = ? AND name = ?",
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
    pub(crate) async fn exists(
        client: &clickhouse::Client,
        name: &TableRef,
    ) -> Result<bool, OpsError> {
        Ok(client
            .query("SELECT count() FROM system.tables WHERE database = ? AND name = ?")
            .bind(&name.database)
            .bind(&name.table)
            .fetch_one::<u64>()
            .await?
            > 0)
    }

    pub(crate) fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// Errors unless every named column exists, naming the first that does not.
    pub(crate) fn require(&self, cols: &[String], what: &str) -> Result<(), OpsError> {
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

    pub(crate) fn is_merge_tree(&self) -> bool {
        self.info.engine.ends_with("MergeTree")
    }

    /// The time column to group by day: the one asked for, else the first
    /// `Date*` column.
    pub(crate) fn time_column(&self, asked: Option<&str>) -> Result<Option<String>, OpsError> {
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
