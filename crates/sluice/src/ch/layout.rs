//! A route's table as the binary insert path needs it: its columns, the
//! input settings its inserts are read with, and the guard that keeps a
//! binary body from landing in a table that changed since.
//!
//! In: a route. Out: a [`TableLayout`]: the encoder's
//! [`Layout`] (the columns of `system.columns` in table order with their
//! types and default kinds, and [`InputSettings`] read from
//! `system.settings` under the very settings the route's inserts carry),
//! and a `WHERE` condition for the insert that fails it at its start
//! (`throwIf` in a scalar subquery) unless `system.columns` still lists
//! the same columns (compared by a digest, so that the insert's URL stays
//! short however wide the table). A `RowBinaryWithDefaults` body carries no column
//! names: read against other columns it would misparse, or worse, land as
//! other values; with the guard, a table changed between this read and the
//! insert makes the insert fail whole instead ([`COLUMNS_CHANGED`]).

use super::error::ChError;
use super::service::ClickHouse;
use crate::config::Route;
use crate::sql::literal;
use sluice_formats::binary::{ColumnSpec, DefaultKind, InputSettings, Layout};

/// The text of the error a binary insert raises when the table's columns
/// are not the ones its body was encoded for.
pub(crate) const COLUMNS_CHANGED: &str = "sluice: the table's columns changed";

/// A route's table, read for the binary path.
#[derive(Debug)]
pub(crate) struct TableLayout {
    pub(crate) layout: Layout,
    /// A condition true while the table has the columns `layout` was
    /// built from, which throws otherwise.
    pub(crate) guard: std::sync::Arc<str>,
}

/// The table's columns in order, as (position, name, type, default kind),
/// and the digest of all but the positions, read in one query so that the
/// guard checks for exactly the columns the layout was built from.
#[derive(Debug, clickhouse::Row, serde::Deserialize)]
struct Columns {
    columns: Vec<(u64, String, String, String)>,
    digest: String,
}

/// The digest of a table's columns, as the guard computes it on the server:
/// a fixed size, whatever the number of columns (the insert's URL carries
/// it).
const COLUMNS_DIGEST: &str = "hex(sipHash128(arrayMap(c -> (c.2, c.3, c.4), \
     arraySort(c -> c.1, groupArray((position, name, type, default_kind))))))";

#[derive(Debug, clickhouse::Row, serde::Deserialize)]
struct SettingRow {
    name: String,
    value: String,
}

impl ClickHouse {
    /// `route`'s table for the binary path: `Ok(Err(why))` when its rows
    /// cannot be encoded here (they go as JSONEachRow).
    pub(crate) async fn table_layout(
        &self,
        route: &Route,
    ) -> Result<Result<TableLayout, String>, ChError> {
        let Columns { columns, digest } = self
            .bounded(
                self.client()
                    .query(&format!(
                        "SELECT arraySort(c -> c.1, groupArray((position, name, type, default_kind))), \
                         {COLUMNS_DIGEST} FROM system.columns WHERE database = ? AND table = ?"
                    ))
                    .bind(&route.database)
                    .bind(&route.table)
                    .fetch_one(),
            )
            .await?;
        if columns.is_empty() {
            return Ok(Err(format!("table {} has no columns", route.table_ref())));
        }
        let mut specs = Vec::with_capacity(columns.len());
        for (_, name, type_name, default_kind) in columns {
            let Some(kind) = DefaultKind::parse(&default_kind) else {
                return Ok(Err(format!(
                    "column {name} has a default kind not known here ({default_kind})"
                )));
            };
            specs.push(ColumnSpec {
                name,
                type_name,
                default_kind: kind,
            });
        }
        // The settings as the route's inserts see them.
        let settings = self.insert_settings_of(route);
        let mut q = self
            .client()
            .query("SELECT name, value FROM system.settings WHERE name IN ?")
            .bind(InputSettings::NAMES);
        for (k, v) in &settings {
            q = q.with_setting(k, v);
        }
        let values: Vec<SettingRow> = self.bounded(q.fetch_all()).await?;
        let mut q = self.client().query("SELECT timezone()");
        for (k, v) in &settings {
            q = q.with_setting(k, v);
        }
        let timezone: String = self.bounded(q.fetch_one()).await?;
        let value = |name: &str| {
            values
                .iter()
                .find(|s| s.name == name)
                .map(|s| s.value.as_str())
        };
        let input = match InputSettings::from_values(value, &timezone) {
            Ok(input) => input,
            Err(why) => return Ok(Err(why)),
        };
        let layout = Layout::new(&specs, input);
        if let Some(why) = layout.unusable() {
            return Ok(Err(why.to_string()));
        }
        Ok(Ok(TableLayout {
            layout,
            guard: guard(route, &digest).into(),
        }))
    }
}

/// The insert's condition that throws [`COLUMNS_CHANGED`] unless
/// `route`'s table still has the columns whose [`COLUMNS_DIGEST`] is
/// `digest` (names, types and default kinds, in order). A scalar subquery:
/// evaluated once, when the query starts, before any row is read.
fn guard(route: &Route, digest: &str) -> String {
    format!(
        "(SELECT throwIf({COLUMNS_DIGEST} != {}, {}) \
         FROM system.columns WHERE database = {} AND table = {}) = 0",
        literal(digest),
        literal(COLUMNS_CHANGED),
        literal(&route.database),
        literal(&route.table),
    )
}
