//! `sluice.toml` → a validated [`Config`].
//!
//! Two steps, as in vector and ripgrep: [`RawConfig`] mirrors the file with
//! `deny_unknown_fields` and a doc comment on every field; [`RawConfig::validate`]
//! turns it into [`Config`], with one [`ConfigError`] variant per broken rule.
//!
//! Precedence, lowest first: built-in defaults, the file, environment
//! variables (`KAFKA_BROKERS`, `CLICKHOUSE_URL`), command-line flags.

use serde::Deserialize;
use sluice_core::{BatchLimits, MetadataColumns};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// How strongly records are delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Delivery {
    /// Resume from ClickHouse, reconcile unknown outcomes, fence on rebalance.
    #[default]
    ExactlyOnce,
    /// Commit after insert and re-send blindly on failure (today's pipelines).
    AtLeastOnce,
    /// Deterministic batch boundaries and an `insert_deduplication_token` on
    /// every insert, nothing else: the design of sinks that rely on
    /// ClickHouse's dedup window. A baseline for `sluice lab`.
    TokenOnly,
}

impl Delivery {
    /// Whether the sink resumes from ClickHouse, reconciles and fences.
    pub fn is_exactly_once(self) -> bool {
        self == Delivery::ExactlyOnce
    }

    /// Whether every insert carries a deterministic dedup token.
    pub fn sends_tokens(self) -> bool {
        self != Delivery::AtLeastOnce
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Where records come from.
    #[serde(default)]
    pub kafka: RawKafka,
    /// Where rows go.
    #[serde(default)]
    pub clickhouse: RawClickHouse,
    /// How records become inserts.
    #[serde(default)]
    pub sink: RawSink,
    /// One entry per topic: which table its records go to.
    #[serde(default, rename = "route")]
    pub routes: Vec<RawRoute>,
    /// Where `/metrics`, `/health` and `/ready` are served.
    #[serde(default)]
    pub metrics: RawMetrics,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    /// `host:port` to serve `/metrics`, `/health` and `/ready` on
    /// (e.g. `127.0.0.1:9464`). Default: not served.
    pub listen: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawKafka {
    /// Bootstrap servers, `host:port[,host:port]`. Overridden by `KAFKA_BROKERS`.
    pub brokers: Option<String>,
    /// Consumer group id. Default `sluice`.
    pub group_id: Option<String>,
    /// Static group membership (`group.instance.id`, KIP-345): a restarted
    /// instance with the same id takes its partitions back at once, without
    /// a rebalance. Give each instance its own, stable id (a pod name).
    pub instance_id: Option<String>,
    /// Group session timeout. Default 10s.
    #[serde(default, with = "humantime_serde")]
    pub session_timeout: Option<Duration>,
    /// Heartbeat interval. Default 3s (a third of the session timeout at most).
    #[serde(default, with = "humantime_serde")]
    pub heartbeat_interval: Option<Duration>,
    /// Where to start when nothing is committed: `earliest` (default) or `latest`.
    pub auto_offset_reset: Option<String>,
    /// Extra librdkafka properties, passed through as they are.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawClickHouse {
    /// HTTP(S) endpoint. Overridden by `CLICKHOUSE_URL`.
    pub url: Option<String>,
    /// Database for tables named without one. Default `default`.
    pub database: Option<String>,
    /// User name. Default `default`.
    pub user: Option<String>,
    /// Password. Default empty.
    pub password: Option<String>,
    /// The longest one insert may live, on the client and on the server
    /// (`max_execution_time` and the HTTP timeouts). Default 30s.
    #[serde(default, with = "humantime_serde")]
    pub insert_timeout: Option<Duration>,
    /// Extra settings sent with every insert.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawSink {
    /// `exactly-once` (default), `at-least-once` or `token-only`.
    pub delivery: Option<Delivery>,
    /// Rows per insert, at most. Default 100000.
    pub max_batch_rows: Option<usize>,
    /// Bytes per insert, at most (approximately). Default 16 MiB.
    pub max_batch_bytes: Option<usize>,
    /// How long a row may wait for its batch to fill. Default 1s.
    #[serde(default, with = "humantime_serde")]
    pub max_batch_age: Option<Duration>,
    /// Bytes buffered in batches being built or sent; over it, fetching
    /// pauses. Default 256 MiB.
    pub max_buffered_bytes: Option<usize>,
    /// Inserts running at once. Default 4.
    pub max_concurrent_inserts: Option<usize>,
    /// How often durable positions are committed to Kafka. Default 1s.
    #[serde(default, with = "humantime_serde")]
    pub commit_interval: Option<Duration>,
    /// How long a new owner waits before reading ClickHouse when the previous
    /// owner did not hand the partition over cleanly. Default: insert
    /// timeout + 5s.
    #[serde(default, with = "humantime_serde")]
    pub fence_wait: Option<Duration>,
    /// Names of the metadata columns.
    #[serde(default)]
    pub columns: RawColumns,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawColumns {
    /// Column for the source topic. Default `_topic`.
    pub topic: Option<String>,
    /// Column for the source partition. Default `_partition`.
    pub partition: Option<String>,
    /// Column for the source offset. Default `_offset`.
    pub offset: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    /// Kafka topic to consume.
    pub topic: String,
    /// Target table, `table` or `database.table`.
    pub table: String,
    /// Key-level dedup: the top-level JSON fields that make a record's
    /// business key. A record whose key was written within `dedup_window`
    /// is dropped. Empty (default): off.
    #[serde(default)]
    pub dedup_key: Vec<String>,
    /// How long a written key is remembered, in record time. Default 1h.
    #[serde(default, with = "humantime_serde")]
    pub dedup_window: Option<Duration>,
    /// Keys remembered per partition at most; past it the oldest are
    /// forgotten early. Default 10,000,000 (about 600 MB per partition).
    pub dedup_max_keys: Option<usize>,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub kafka: KafkaConfig,
    pub clickhouse: ClickHouseConfig,
    pub sink: SinkConfig,
    pub routes: Vec<Route>,
    /// Where to serve `/metrics`, `/health` and `/ready`.
    pub metrics_listen: Option<std::net::SocketAddr>,
}

#[derive(Debug, Clone)]
pub struct KafkaConfig {
    pub brokers: String,
    pub group_id: String,
    pub instance_id: Option<String>,
    pub session_timeout: Duration,
    pub heartbeat_interval: Duration,
    pub auto_offset_reset: String,
    pub properties: BTreeMap<String, String>,
}

#[derive(Clone)]
pub struct ClickHouseConfig {
    pub url: String,
    pub database: String,
    pub user: String,
    pub password: String,
    pub insert_timeout: Duration,
    pub settings: BTreeMap<String, String>,
}

/// The password never reaches a log line through `{:?}`.
impl std::fmt::Debug for ClickHouseConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClickHouseConfig")
            .field("url", &self.url)
            .field("database", &self.database)
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .field("insert_timeout", &self.insert_timeout)
            .field("settings", &self.settings)
            .finish()
    }
}

#[derive(Debug, Clone)]
pub struct SinkConfig {
    pub delivery: Delivery,
    pub limits: BatchLimits,
    pub max_buffered_bytes: usize,
    pub max_concurrent_inserts: usize,
    pub commit_interval: Duration,
    pub fence_wait: Duration,
    pub columns: MetadataColumns,
}

/// A topic and the table its rows go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub topic: String,
    pub database: String,
    pub table: String,
    pub dedup: Option<KeyDedup>,
}

/// Key-level dedup settings of a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDedup {
    pub fields: Vec<String>,
    pub window: Duration,
    pub max_keys: usize,
}

impl Route {
    /// `` `db`.`table` `` for SQL.
    pub fn qualified(&self) -> String {
        format!(
            "{}.{}",
            quote_ident(&self.database),
            quote_ident(&self.table)
        )
    }
}

/// Back-quotes an identifier for ClickHouse SQL.
pub fn quote_ident(s: &str) -> String {
    format!("`{}`", s.replace('\\', "\\\\").replace('`', "\\`"))
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: String, message: String },
    #[error("{field}: missing; expected {expected}")]
    Missing {
        field: &'static str,
        expected: &'static str,
    },
    #[error("{field}: expected {expected}, found {found:?}")]
    Invalid {
        field: String,
        expected: &'static str,
        found: String,
    },
    #[error("route: topic {0:?} is routed twice; each topic goes to one table")]
    DuplicateTopic(String),
    #[error(
        "sink.max_buffered_bytes ({buffered}) must be at least twice sink.max_batch_bytes ({batch})"
    )]
    BufferTooSmall { buffered: usize, batch: usize },
    #[error(
        "kafka.heartbeat_interval ({heartbeat:?}) must be under a third of kafka.session_timeout ({session:?})"
    )]
    Heartbeat {
        heartbeat: Duration,
        session: Duration,
    },
    #[error("sink.columns: the metadata column names must be distinct and non-empty")]
    Columns,
}

/// Values that override the file, from the environment and flags.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub brokers: Option<String>,
    pub clickhouse_url: Option<String>,
    pub group_id: Option<String>,
    pub delivery: Option<Delivery>,
    pub max_batch_rows: Option<usize>,
    pub metrics_listen: Option<String>,
}

impl RawConfig {
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.display().to_string(),
                message,
            },
            other => other,
        })
    }

    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: "<inline>".into(),
            message: e.to_string(),
        })
    }

    /// Applies overrides, fills defaults and checks every cross-field rule.
    pub fn validate(self, o: Overrides) -> Result<Config, ConfigError> {
        let brokers = o
            .brokers
            .or(self.kafka.brokers)
            .ok_or(ConfigError::Missing {
                field: "kafka.brokers",
                expected: "host:port (or KAFKA_BROKERS / --brokers)",
            })?;
        let url = o
            .clickhouse_url
            .or(self.clickhouse.url)
            .ok_or(ConfigError::Missing {
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
        let reset = self
            .kafka
            .auto_offset_reset
            .unwrap_or_else(|| "earliest".into());
        if reset != "earliest" && reset != "latest" {
            return Err(invalid(
                "kafka.auto_offset_reset",
                "earliest or latest",
                &reset,
            ));
        }
        let session = self
            .kafka
            .session_timeout
            .unwrap_or(Duration::from_secs(10));
        let heartbeat = self
            .kafka
            .heartbeat_interval
            .unwrap_or_else(|| (session / 3).min(Duration::from_secs(3)));
        if heartbeat * 3 > session {
            return Err(ConfigError::Heartbeat { heartbeat, session });
        }
        let database = self.clickhouse.database.unwrap_or_else(|| "default".into());
        let insert_timeout = self
            .clickhouse
            .insert_timeout
            .unwrap_or(Duration::from_secs(30));
        if insert_timeout < Duration::from_secs(1) {
            return Err(invalid(
                "clickhouse.insert_timeout",
                "at least 1s",
                &format!("{insert_timeout:?}"),
            ));
        }

        let s = self.sink;
        let limits = BatchLimits {
            max_rows: positive(
                "sink.max_batch_rows",
                o.max_batch_rows.or(s.max_batch_rows),
                100_000,
            )?,
            max_bytes: positive("sink.max_batch_bytes", s.max_batch_bytes, 16 << 20)?,
            max_age: s.max_batch_age.unwrap_or(Duration::from_secs(1)),
            aligned: o.delivery.or(s.delivery) == Some(Delivery::TokenOnly),
        };
        if limits.max_bytes > 1 << 30 {
            return Err(invalid(
                "sink.max_batch_bytes",
                "at most 1 GiB",
                &limits.max_bytes.to_string(),
            ));
        }
        let max_buffered_bytes =
            positive("sink.max_buffered_bytes", s.max_buffered_bytes, 256 << 20)?;
        if max_buffered_bytes < 2 * limits.max_bytes {
            return Err(ConfigError::BufferTooSmall {
                buffered: max_buffered_bytes,
                batch: limits.max_bytes,
            });
        }
        let defaults = MetadataColumns::default();
        let columns = MetadataColumns {
            topic: s.columns.topic.unwrap_or(defaults.topic),
            partition: s.columns.partition.unwrap_or(defaults.partition),
            offset: s.columns.offset.unwrap_or(defaults.offset),
        };
        if columns.topic.is_empty()
            || columns.partition.is_empty()
            || columns.offset.is_empty()
            || columns.topic == columns.partition
            || columns.topic == columns.offset
            || columns.partition == columns.offset
        {
            return Err(ConfigError::Columns);
        }

        if self.routes.is_empty() {
            return Err(ConfigError::Missing {
                field: "route",
                expected: "at least one [[route]] with topic and table",
            });
        }
        let mut routes: Vec<Route> = Vec::new();
        for (i, r) in self.routes.into_iter().enumerate() {
            if r.topic.is_empty() {
                return Err(invalid(
                    &format!("route[{i}].topic"),
                    "a topic name",
                    &r.topic,
                ));
            }
            let (db, table) = match r.table.split_once('.') {
                Some((db, t)) => (db.to_string(), t.to_string()),
                None => (database.clone(), r.table.clone()),
            };
            if db.is_empty() || table.is_empty() {
                return Err(invalid(
                    &format!("route[{i}].table"),
                    "table or database.table",
                    &r.table,
                ));
            }
            if routes.iter().any(|x| x.topic == r.topic) {
                return Err(ConfigError::DuplicateTopic(r.topic));
            }
            let dedup = key_dedup(i, &r, &columns)?;
            routes.push(Route {
                topic: r.topic,
                database: db,
                table,
                dedup,
            });
        }

        let metrics_listen =
            match o.metrics_listen.or(self.metrics.listen) {
                None => None,
                Some(a) => Some(a.parse().map_err(|_| {
                    invalid("metrics.listen", "host:port, such as 127.0.0.1:9464", &a)
                })?),
            };
        Ok(Config {
            metrics_listen,
            kafka: KafkaConfig {
                brokers,
                group_id: o
                    .group_id
                    .or(self.kafka.group_id)
                    .unwrap_or_else(|| "sluice".into()),
                instance_id: self.kafka.instance_id.filter(|s| !s.is_empty()),
                session_timeout: session,
                heartbeat_interval: heartbeat,
                auto_offset_reset: reset,
                properties: self.kafka.properties,
            },
            clickhouse: ClickHouseConfig {
                url,
                database,
                user: self.clickhouse.user.unwrap_or_else(|| "default".into()),
                password: self.clickhouse.password.unwrap_or_default(),
                insert_timeout,
                settings: self.clickhouse.settings,
            },
            sink: SinkConfig {
                delivery: o.delivery.or(s.delivery).unwrap_or_default(),
                limits,
                max_buffered_bytes,
                max_concurrent_inserts: positive(
                    "sink.max_concurrent_inserts",
                    s.max_concurrent_inserts,
                    4,
                )?,
                commit_interval: s.commit_interval.unwrap_or(Duration::from_secs(1)),
                fence_wait: s
                    .fence_wait
                    .unwrap_or(insert_timeout + Duration::from_secs(5)),
                columns,
            },
            routes,
        })
    }
}

/// A route's key dedup: its fields must be named, distinct and not metadata
/// columns; a window or cap without fields is a mistake.
fn key_dedup(
    i: usize,
    r: &RawRoute,
    columns: &MetadataColumns,
) -> Result<Option<KeyDedup>, ConfigError> {
    if r.dedup_key.is_empty() {
        if r.dedup_window.is_some() || r.dedup_max_keys.is_some() {
            return Err(invalid(
                &format!("route[{i}].dedup_key"),
                "the key fields, since dedup_window or dedup_max_keys is set",
                "nothing",
            ));
        }
        return Ok(None);
    }
    if r.dedup_key.len() > sluice_core::row::MAX_KEY_FIELDS {
        return Err(invalid(
            &format!("route[{i}].dedup_key"),
            "at most 8 fields",
            &r.dedup_key.join(", "),
        ));
    }
    for (j, f) in r.dedup_key.iter().enumerate() {
        let meta = [&columns.topic, &columns.partition, &columns.offset];
        if f.is_empty() || meta.contains(&f) || r.dedup_key[..j].contains(f) {
            return Err(invalid(
                &format!("route[{i}].dedup_key[{j}]"),
                "a distinct top-level field of the records, not a metadata column",
                f,
            ));
        }
    }
    let window = r.dedup_window.unwrap_or(Duration::from_secs(3600));
    if window.is_zero() {
        return Err(invalid(
            &format!("route[{i}].dedup_window"),
            "a positive duration such as 1h",
            "0s",
        ));
    }
    Ok(Some(KeyDedup {
        fields: r.dedup_key.clone(),
        window,
        max_keys: positive(
            &format!("route[{i}].dedup_max_keys"),
            r.dedup_max_keys,
            10_000_000,
        )?,
    }))
}

fn invalid(field: &str, expected: &'static str, found: &str) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_string(),
        expected,
        found: found.to_string(),
    }
}

fn positive(field: &str, v: Option<usize>, default: usize) -> Result<usize, ConfigError> {
    match v {
        Some(0) => Err(invalid(field, "a positive number", "0")),
        Some(n) => Ok(n),
        None => Ok(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = r#"
        [kafka]
        brokers = "127.0.0.1:9092"
        [clickhouse]
        url = "http://127.0.0.1:8123"
        [[route]]
        topic = "orders"
        table = "shop.orders"
    "#;

    fn load(text: &str) -> Result<Config, ConfigError> {
        RawConfig::from_toml(text)?.validate(Overrides::default())
    }

    #[test]
    fn defaults_and_routes() {
        let c = load(MIN).unwrap();
        assert_eq!(c.sink.delivery, Delivery::ExactlyOnce);
        assert_eq!(c.routes[0].qualified(), "`shop`.`orders`");
        assert_eq!(c.sink.fence_wait, Duration::from_secs(35));
        assert_eq!(c.kafka.group_id, "sluice");
    }

    #[test]
    fn key_dedup() {
        let route = |extra: &str| format!("{MIN}\n{extra}");
        let c = load(&route("dedup_key = ['order_id', 'region']")).unwrap();
        let d = c.routes[0].dedup.clone().unwrap();
        assert_eq!(d.fields, ["order_id", "region"]);
        assert_eq!(d.window, Duration::from_secs(3600));
        assert_eq!(d.max_keys, 10_000_000);
        let c = load(&route(
            "dedup_key = ['id']\ndedup_window = '10m'\ndedup_max_keys = 5",
        ))
        .unwrap();
        let d = c.routes[0].dedup.clone().unwrap();
        assert_eq!((d.window, d.max_keys), (Duration::from_secs(600), 5));
        assert!(load(MIN).unwrap().routes[0].dedup.is_none());
        let err = |t: &str| load(&route(t)).unwrap_err().to_string();
        assert!(err("dedup_window = '1h'").contains("route[0].dedup_key"));
        assert!(err("dedup_key = ['_offset']").contains("route[0].dedup_key[0]"));
        assert!(err("dedup_key = ['a', 'a']").contains("route[0].dedup_key[1]"));
        assert!(err("dedup_key = ['']").contains("route[0].dedup_key[0]"));
        assert!(err("dedup_key = ['a']\ndedup_window = '0s'").contains("route[0].dedup_window"));
        assert!(err("dedup_key = ['a']\ndedup_max_keys = 0").contains("route[0].dedup_max_keys"));
        assert!(err("dedup_key = ['a','b','c','d','e','f','g','h','i']").contains("at most 8"));
    }

    #[test]
    fn debug_output_hides_the_password() {
        let c = load(&MIN.replace("[clickhouse]", "[clickhouse]\npassword = 'hunter2'")).unwrap();
        assert_eq!(c.clickhouse.password, "hunter2");
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn overrides_win() {
        let c = RawConfig::from_toml(MIN)
            .unwrap()
            .validate(Overrides {
                brokers: Some("b:1".into()),
                delivery: Some(Delivery::AtLeastOnce),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(c.kafka.brokers, "b:1");
        assert_eq!(c.sink.delivery, Delivery::AtLeastOnce);
    }

    #[test]
    fn errors_name_the_field() {
        let err = |t: &str| load(t).unwrap_err().to_string();
        assert!(err("[kafka]\nbrokrs = 'x'").contains("unknown field `brokrs`"));
        assert!(err("").contains("kafka.brokers: missing"));
        let no_route = "[kafka]\nbrokers='a:1'\n[clickhouse]\nurl='http://x'";
        assert!(err(no_route).contains("route: missing"));
        assert!(err(&format!("{MIN}\n[sink]\nmax_batch_rows = 0")).contains("sink.max_batch_rows"));
        assert!(err(&MIN.replace("http://", "ftp://")).contains("clickhouse.url"));
        assert!(err(&format!("{MIN}\n[sink]\ndelivery = 'twice'")).contains("unknown variant"));
        let dup = format!("{MIN}\n[[route]]\ntopic='orders'\ntable='x'");
        assert!(err(&dup).contains("routed twice"));
        assert!(err(&format!("[metrics]\nlisten = 'nowhere'\n{MIN}")).contains("metrics.listen"));
        let buf = format!("{MIN}\n[sink]\nmax_batch_bytes = 1000\nmax_buffered_bytes = 1500");
        assert!(err(&buf).contains("at least twice"));
        let cols = format!("{MIN}\n[sink.columns]\ntopic = '_offset'");
        assert!(err(&cols).contains("distinct"));
    }
}
