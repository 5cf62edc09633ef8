//! How a command outside the sink reaches ClickHouse: the flags the
//! operator tools and `sluice resend` share.
//!
//! In: `--config` or `--clickhouse-url`, the user and password (flags, the
//! file's `[clickhouse]` section, `SLUICE_…` variables). Out: a [`Conn`]: a
//! client built as the sink builds its own ([`client`](super::client)),
//! with the file's read settings, and the metadata column names.

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
    pub(crate) config: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) server: ChServer,
}

impl ChArgs {
    pub fn connect(&self) -> Result<Conn, ConfigError> {
        self.server.connect(self.config.as_deref())
    }
}

/// The flags that name the server, its user and the query bound; with a
/// config file they override the file's.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ChServer {
    /// ClickHouse HTTP URL; overrides the file's. Without --config,
    /// SLUICE_CLICKHOUSE_URL, then CLICKHOUSE_URL stand in for it
    /// [default: http://127.0.0.1:8123].
    #[arg(long)]
    pub(crate) clickhouse_url: Option<String>,
    /// ClickHouse user; overrides the file's. Without --config,
    /// SLUICE_CLICKHOUSE_USER stands in for it [default: default]. The
    /// password comes from the file or SLUICE_CLICKHOUSE_PASSWORD.
    #[arg(long)]
    pub(crate) user: Option<String>,
    /// How long each query may run on the server (`max_execution_time`;
    /// by default the server's own limit, or the file's `read_settings`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) query_timeout: Option<Duration>,
}

/// A connection an operator tool works through.
#[derive(Clone)]
pub struct Conn {
    pub(crate) client: clickhouse::Client,
    /// The server's URL, for error messages.
    pub url: String,
    /// The names of the metadata columns in the tables sluice writes.
    pub(crate) columns: MetadataColumns,
}

impl ChServer {
    /// Resolves the flags (and the config file, if any) into a client built
    /// as the sink builds its own ([`super::client`]), with the file's
    /// read settings on every query. Only the file's `[clickhouse]` and
    /// `[sink.columns]` are read: the rest of it is not required.
    pub(crate) fn connect(&self, config: Option<&Path>) -> Result<Conn, ConfigError> {
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
        let mut client = super::client(&cfg);
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
pub(crate) const DEFAULT_URL: &str = "http://127.0.0.1:8123";
