//! The `[clickhouse]` section: where rows go and how inserts are bounded.
//!
//! In: the section as written ([`RawClickHouse`]) and the `--clickhouse-url`
//! flag. Out: a [`ClickHouseConfig`] with every default filled in and the
//! password resolved (inline, `password_file` or its `SLUICE_…` variable),
//! or a [`ConfigError`] naming the field.

use super::{bounded, invalid, secret, ConfigError, Secret};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawClickHouse {
    /// HTTP(S) endpoint. `CLICKHOUSE_URL` fills it in when nothing sets it.
    pub url: Option<String>,
    /// Database for tables named without one. Default `default`.
    pub database: Option<String>,
    /// User name. Default `default`.
    pub user: Option<String>,
    /// Password. Default empty. Prefer `password_file` or
    /// `SLUICE_CLICKHOUSE_PASSWORD`.
    pub password: Option<String>,
    /// A file holding the password (one trailing newline is removed).
    pub password_file: Option<PathBuf>,
    /// The longest one insert may live, on the client and on the server
    /// (`max_execution_time` and the HTTP timeouts). Default 30s.
    #[serde(default, with = "humantime_serde")]
    pub insert_timeout: Option<Duration>,
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
    pub cluster: Option<String>,
}

#[derive(Clone)]
pub struct ClickHouseConfig {
    pub url: String,
    pub database: String,
    pub user: String,
    pub password: Secret,
    pub insert_timeout: Duration,
    pub settings: BTreeMap<String, String>,
    pub read_settings: BTreeMap<String, String>,
    pub cluster: Option<String>,
}

/// The database and user when the file names none.
pub const DEFAULT_DATABASE: &str = "default";
pub const DEFAULT_USER: &str = "default";
/// How long one insert attempt may take when the file does not say.
pub const DEFAULT_INSERT_TIMEOUT: Duration = Duration::from_secs(30);

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
            settings: self.settings,
            read_settings: self.read_settings,
            cluster: self.cluster,
        })
    }
}
