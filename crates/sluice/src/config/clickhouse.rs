//! The `[clickhouse]` section: where rows go and how inserts are bounded.
//!
//! In: the section as written ([`RawClickHouse`]) and the `--clickhouse-url`
//! flag. Out: a [`ClickHouseConfig`] with every default filled in and the
//! password resolved (inline, `password_file` or its `SLUICE_…` variable),
//! or a [`ConfigError`] naming the field.

use super::{bounded, invalid, secret, ConfigError, Secret};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

#[serde_with::skip_serializing_none]
#[derive(Debug, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawClickHouse {
    /// HTTP(S) endpoint. `CLICKHOUSE_URL` fills it in when nothing sets it.
    pub url: Option<String>,
    /// Database for tables named without one. Default `default`.
    pub(crate) database: Option<String>,
    /// User name. Default `default`.
    pub(crate) user: Option<String>,
    /// Password. Default empty. Prefer `password_file` or
    /// `SLUICE_CLICKHOUSE_PASSWORD`.
    pub(crate) password: Option<String>,
    /// A file holding the password (one trailing newline is removed).
    pub(crate) password_file: Option<PathBuf>,
    /// The longest one insert may live, on the client and on the server
    /// (`max_execution_time` and the HTTP timeouts). Default 30s.
    #[serde(default, with = "humantime_serde")]
    pub insert_timeout: Option<Duration>,
    /// How inserts write their rows: `json` (default) or `binary`.
    pub(crate) insert_format: Option<InsertFormat>,
    /// Extra settings sent with every insert.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// Extra settings sent with every read the exactly-once protocol relies
    /// on (the resume watermark, reconciliation, the key window, the fence).
    #[serde(default)]
    pub read_settings: BTreeMap<String, String>,
    /// The cluster whose replicas may run sluice's inserts (several servers
    /// behind `url`): the fence then looks for an attempt on every replica
    /// (`clusterAllReplicas`, `KILL QUERY ON CLUSTER`), not only on the
    /// server that answers.
    pub(crate) cluster: Option<String>,
}

/// How inserts write their rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum InsertFormat {
    /// `RowBinaryWithDefaults`, typed by the table's columns, wherever each
    /// row converts exactly as ClickHouse's JSON parser would read it;
    /// `JSONEachRow` for the rest (counted in
    /// `sluice_json_fallback_batches_total`). Not the default yet: the
    /// conversion costs the sink more than it saves the server
    /// (`docs/bench-pipeline.md`).
    Binary,
    /// `JSONEachRow` always.
    #[default]
    Json,
}

#[derive(Clone)]
pub struct ClickHouseConfig {
    pub url: String,
    pub database: String,
    pub user: String,
    pub password: Secret,
    pub insert_timeout: Duration,
    pub insert_format: InsertFormat,
    pub settings: BTreeMap<String, String>,
    pub read_settings: BTreeMap<String, String>,
    pub cluster: Option<String>,
}

/// Settings every request carries, over the server's profile. A profile can
/// limit what a query reads or returns and say `break` (or `any`) when the
/// limit is reached: the answer is then cut short without an error. So the
/// limits are lifted (sluice's reads are narrow: one topic, one partition's
/// range), and should one be left that this list does not name, the
/// overflow modes make it fail loudly; no profile-wide `LIMIT`, `OFFSET`,
/// row filter, skipped shard, query cache or skipped input row applies. A user's `settings` or `read_settings` cannot change
/// them ([`pinned_refusal`]).
pub(crate) const PINNED: &[(&str, &str)] = &[
    ("max_rows_to_read", "0"),
    ("max_bytes_to_read", "0"),
    ("max_rows_to_read_leaf", "0"),
    ("max_bytes_to_read_leaf", "0"),
    ("max_result_rows", "0"),
    ("max_result_bytes", "0"),
    ("max_rows_to_group_by", "0"),
    ("max_rows_to_sort", "0"),
    ("max_bytes_to_sort", "0"),
    ("max_rows_in_set", "0"),
    ("max_bytes_in_set", "0"),
    ("max_rows_in_join", "0"),
    ("max_bytes_in_join", "0"),
    ("max_rows_in_distinct", "0"),
    ("max_bytes_in_distinct", "0"),
    ("max_rows_to_transfer", "0"),
    ("max_bytes_to_transfer", "0"),
    ("read_overflow_mode", "throw"),
    ("read_overflow_mode_leaf", "throw"),
    ("result_overflow_mode", "throw"),
    ("timeout_overflow_mode", "throw"),
    ("timeout_overflow_mode_leaf", "throw"),
    ("group_by_overflow_mode", "throw"),
    ("sort_overflow_mode", "throw"),
    ("set_overflow_mode", "throw"),
    ("join_overflow_mode", "throw"),
    ("distinct_overflow_mode", "throw"),
    ("transfer_overflow_mode", "throw"),
    ("limit", "0"),
    ("offset", "0"),
    ("additional_table_filters", "{}"),
    ("additional_result_filter", ""),
    ("skip_unavailable_shards", "0"),
    ("final", "0"),
    ("parallel_replicas_count", "0"),
    // A cached answer to a reconciliation read is a stale one.
    ("use_query_cache", "0"),
    // `maxOrNull` would change the watermark's type under the row decoder.
    ("aggregate_functions_null_for_empty", "0"),
    // An insert that skips rows it cannot parse and answers 200.
    ("input_format_allow_errors_num", "0"),
    ("input_format_allow_errors_ratio", "0"),
];

/// Whether a user's setting `name = value` would change a [`PINNED`] one.
fn pinned_refusal(name: &str, value: &str) -> bool {
    PINNED
        .iter()
        .any(|(n, pinned)| *n == name && value.trim() != *pinned)
}

/// The database and user when the file names none.
pub(crate) const DEFAULT_DATABASE: &str = "default";
pub(crate) const DEFAULT_USER: &str = "default";
/// How long one insert attempt may take when the file does not say.
pub(crate) const DEFAULT_INSERT_TIMEOUT: Duration = Duration::from_secs(30);

impl ClickHouseConfig {
    /// The server at `url` with every default: what the operator tools use
    /// without a config file.
    pub fn at(url: String) -> Self {
        Self {
            url,
            database: DEFAULT_DATABASE.into(),
            user: DEFAULT_USER.into(),
            password: Secret::default(),
            insert_timeout: DEFAULT_INSERT_TIMEOUT,
            insert_format: InsertFormat::default(),
            settings: BTreeMap::new(),
            read_settings: BTreeMap::new(),
            cluster: None,
        }
    }
}

/// The password never reaches a log line through `{:?}`.
impl std::fmt::Debug for ClickHouseConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClickHouseConfig")
            .field("url", &self.url)
            .field("database", &self.database)
            .field("user", &self.user)
            .field("password", &self.password)
            .field("insert_timeout", &self.insert_timeout)
            .field("insert_format", &self.insert_format)
            .field("settings", &self.settings)
            .field("read_settings", &self.read_settings)
            .field("cluster", &self.cluster)
            .finish()
    }
}

impl RawClickHouse {
    /// The section with defaults filled in; `url` (a flag) beats the file's.
    pub(super) fn validate(self, url: Option<String>) -> Result<ClickHouseConfig, ConfigError> {
        let url = url.or(self.url).ok_or(ConfigError::Missing {
            field: "clickhouse.url",
            expected: "http(s)://host:port (or CLICKHOUSE_URL / --clickhouse-url)",
        })?;
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(invalid(
                "clickhouse.url",
                "an http:// or https:// URL",
                &url,
            ));
        }
        let insert_timeout = bounded("clickhouse.insert_timeout", self.insert_timeout)?
            .unwrap_or(DEFAULT_INSERT_TIMEOUT);
        if insert_timeout < Duration::from_secs(1) {
            return Err(invalid(
                "clickhouse.insert_timeout",
                "at least 1s",
                &format!("{insert_timeout:?}"),
            ));
        }
        for (section, map) in [
            ("settings", &self.settings),
            ("read_settings", &self.read_settings),
        ] {
            if let Some((name, value)) = map.iter().find(|(n, v)| pinned_refusal(n, v)) {
                return Err(invalid(
                    &format!("clickhouse.{section}.{name}"),
                    "the value sluice pins (0 for a limit, throw for an overflow mode, no \
                     filter): another can cut a read short without an error",
                    value,
                ));
            }
        }
        let password = secret::resolve(
            "clickhouse.password",
            self.password,
            self.password_file.as_deref(),
        )?
        .unwrap_or_default();
        Ok(ClickHouseConfig {
            url,
            database: self.database.unwrap_or_else(|| DEFAULT_DATABASE.into()),
            user: self.user.unwrap_or_else(|| DEFAULT_USER.into()),
            password,
            insert_timeout,
            insert_format: self.insert_format.unwrap_or_default(),
            settings: self.settings,
            read_settings: self.read_settings,
            cluster: self.cluster,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_settings_cannot_be_changed() {
        assert!(pinned_refusal("result_overflow_mode", "break"));
        assert!(pinned_refusal("limit", "10"));
        assert!(pinned_refusal("additional_table_filters", "{'t': 'x > 1'}"));
        assert!(!pinned_refusal("read_overflow_mode", "throw"));
        assert!(!pinned_refusal("max_threads", "10"));
        let mut raw = RawClickHouse::default();
        raw.read_settings
            .insert("read_overflow_mode".into(), "break".into());
        let e = raw.validate(Some("http://h:8123".into())).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "clickhouse.read_settings.read_overflow_mode: expected the value sluice pins"
            ),
            "{e}"
        );
    }
}
