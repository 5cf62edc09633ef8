//! `sluice.toml` → a validated [`Config`].
//!
//! Two steps, as in vector and ripgrep: [`RawConfig`] mirrors the file with
//! `deny_unknown_fields` and a doc comment on every field; [`RawConfig::validate`]
//! turns it into [`Config`], with one [`ConfigError`] variant per broken rule.
//!
//! Precedence, lowest first: built-in defaults, the generic
//! `KAFKA_BROKERS` / `CLICKHOUSE_URL` (they only fill in what nothing else
//! sets), the file, `SLUICE_…` environment variables ([`env`]), then
//! command-line flags. Secrets: [`secret`]. Kafka TLS and SASL: `security`.
//!
//! One room per section, each validating its own: `[kafka]` (`kafka.rs`),
//! `[clickhouse]` (`clickhouse.rs`), `[sink]` with its defaults (`sink.rs`),
//! `[[route]]` (`route.rs`); this module joins them and checks the rules
//! that span sections (a DLQ topic that is also routed, a topic routed twice).

mod clickhouse;
pub(crate) mod env;
mod kafka;
mod registry;
mod route;
pub mod secret;
pub(crate) mod security;
mod sink;

#[cfg(test)]
mod documented_defaults;
#[cfg(test)]
mod fuzz_tests;

pub(crate) use clickhouse::PINNED;
pub use clickhouse::{ClickHouseConfig, InsertFormat, RawClickHouse};
pub use kafka::{KafkaConfig, RawKafka};
pub use registry::{RawSchemaRegistry, SchemaRegistryConfig};
pub use route::{Format, KeyDedup, RawRoute, Route};
pub use secret::Secret;
pub(crate) use security::KafkaSecurity;
pub use sink::{Delivery, RawSink, SinkConfig};

use serde::{Deserialize, Serialize};
use sluice_formats::{MetadataColumns, RowEncoder};
use sluice_protocol::timing;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[serde_with::skip_serializing_none]
#[derive(Debug, Deserialize, Serialize, Default)]
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
    /// Where records that cannot become rows go.
    #[serde(default)]
    pub dlq: RawDlq,
    /// Where Avro and Protobuf routes find their schemas.
    #[serde(default)]
    pub schema_registry: RawSchemaRegistry,
    /// Where the endpoints came from (filled by the loader, not the file).
    #[serde(skip)]
    pub(crate) origins: env::Origins,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawDlq {
    /// The dead-letter topic (same cluster and credentials as `[kafka]`).
    /// Default: none, and a record that cannot become a row stops the sink.
    pub topic: Option<String>,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    /// `host:port` to serve `/metrics`, `/health` and `/ready` on
    /// (e.g. `127.0.0.1:9464`). Default: not served.
    pub listen: Option<String>,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub kafka: KafkaConfig,
    pub clickhouse: ClickHouseConfig,
    pub sink: SinkConfig,
    pub routes: Vec<Route>,
    /// Where to serve `/metrics`, `/health` and `/ready`.
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,
    /// The dead-letter topic, if any.
    pub dlq: Option<String>,
    /// The schema registry, if the file (or `SCHEMA_REGISTRY_URL`) names
    /// one; every Avro or Protobuf route needs it.
    pub(crate) schema_registry: Option<SchemaRegistryConfig>,
    /// Where the endpoints came from.
    pub(crate) origins: env::Origins,
}

impl Config {
    /// `kafka.brokers = k:9092 (from the config file)`, and the same for
    /// `clickhouse.url`: what the start-up log and `check-config` print.
    pub(crate) fn endpoints(&self) -> [String; 2] {
        let o = &self.origins;
        [
            format!(
                "kafka.brokers = {} (from {})",
                self.kafka.brokers, o.brokers
            ),
            format!(
                "clickhouse.url = {} (from {})",
                secret::redact_url(&self.clickhouse.url),
                o.clickhouse_url
            ),
        ]
    }

    /// The encoder of `route`'s records: the sink's columns and record
    /// limit, the route's required fields and dedup key.
    pub fn encoder(&self, route: &Route) -> RowEncoder {
        let e = RowEncoder::new(&route.topic, self.sink.columns.clone())
            .with_required(route.required.clone())
            .with_max_bytes(self.sink.max_record_bytes);
        // A registry route's rows are its decoder's JSON; the record's own
        // size is checked before decoding.
        let e = match route.format.is_registry() {
            true => e.for_decoded().with_max_bytes(usize::MAX),
            false => e,
        };
        match &route.dedup {
            Some(d) => e.with_key(d.fields.clone()),
            None => e,
        }
    }

    /// How long a writer goes on without reading its own ownership marker
    /// back: what the new owner's fence leaves after the previous owner's
    /// last inserts (`2 × insert_timeout`) and a margin, at most 10 s and
    /// at least 2 s ([`Config::fence_is_short`] says when the floor cuts in).
    pub(crate) fn lease(&self) -> Duration {
        timing::lease_term(self.sink.fence_wait, self.clickhouse.insert_timeout)
    }

    /// The fence that covers a previous owner's last inserts and lease,
    /// when `fence_wait` is shorter than that.
    pub(crate) fn fence_is_short(&self) -> Option<Duration> {
        timing::safe_fence(self.sink.fence_wait, self.clickhouse.insert_timeout)
    }
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
    #[error("{field}: cannot read {path}: {reason}")]
    File {
        field: String,
        path: String,
        reason: String,
    },
    #[error("{0}: not a setting (see the SLUICE_* variables in docs/configuration.md)")]
    UnknownVar(String),
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

/// The config file and the endpoint flags that override it, shared by
/// `sluice run` and `check-config`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigArgs {
    /// The config file (TOML).
    #[arg(long, short)]
    pub config: PathBuf,
    /// Kafka bootstrap servers; overrides the file and SLUICE_KAFKA_BROKERS
    /// (KAFKA_BROKERS only fills them in when neither sets them).
    #[arg(long)]
    pub brokers: Option<String>,
    /// ClickHouse HTTP URL; overrides the file and SLUICE_CLICKHOUSE_URL
    /// (CLICKHOUSE_URL only fills it in when neither sets it).
    #[arg(long)]
    pub clickhouse_url: Option<String>,
}

impl ConfigArgs {
    /// The file, with the process's `SLUICE_…` variables and these flags
    /// (and `more` overrides) applied, validated.
    pub fn load(&self, more: Overrides) -> Result<Config, ConfigError> {
        let o = Overrides {
            brokers: self.brokers.clone(),
            clickhouse_url: self.clickhouse_url.clone(),
            ..more
        };
        RawConfig::load(&self.config, std::env::vars())?.validate(o)
    }
}

/// Values that override the file, from flags.
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
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: "<inline>".into(),
            message: e.to_string(),
        })
    }

    /// The file at `path` with the `SLUICE_…` settings of `vars` applied
    /// over it ([`env`]).
    pub(crate) fn load(
        path: &Path,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml_with_env(&text, vars).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.display().to_string(),
                message,
            },
            other => other,
        })
    }

    /// Like [`Self::from_toml`], with the `SLUICE_…` settings of `vars`.
    pub(crate) fn from_toml_with_env(
        text: &str,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let parse = |message: String| ConfigError::Parse {
            path: "<inline>".into(),
            message,
        };
        let mut table: toml::Table = toml::from_str(text).map_err(|e| parse(e.to_string()))?;
        let applied = env::apply(&mut table, vars)?;
        let mut raw = if applied.used.is_empty() {
            // Straight from the text: errors keep their line and column.
            Self::from_toml(text)?
        } else {
            use serde::de::IntoDeserializer;
            Self::deserialize(toml::Value::Table(table).into_deserializer()).map_err(|e| {
                parse(format!(
                    "{} (with {} from the environment)",
                    e.to_string().trim_end(),
                    applied.used.join(", ")
                ))
            })?
        };
        raw.origins = applied.origins;
        Ok(raw)
    }

    /// Applies overrides, fills defaults and checks every cross-field rule.
    pub fn validate(self, o: Overrides) -> Result<Config, ConfigError> {
        let mut origins = self.origins;
        if o.brokers.is_some() {
            origins.flag("kafka.brokers", "--brokers");
        }
        if o.clickhouse_url.is_some() {
            origins.flag("clickhouse.url", "--clickhouse-url");
        }
        let kafka = self.kafka.validate(o.brokers.clone(), o.group_id.clone())?;
        let clickhouse = self.clickhouse.validate(o.clickhouse_url.clone())?;

        let sink = self.sink.validate(&o, &clickhouse)?;

        if self.routes.is_empty() {
            return Err(ConfigError::Missing {
                field: "route",
                expected: "at least one [[route]] with topic and table",
            });
        }
        let mut routes: Vec<Route> = Vec::new();
        for (i, r) in self.routes.into_iter().enumerate() {
            let route = r.validate(i, &clickhouse.database, &sink.columns)?;
            if routes.iter().any(|x| x.topic == route.topic) {
                return Err(ConfigError::DuplicateTopic(route.topic));
            }
            routes.push(route);
        }

        let metrics_listen =
            match o.metrics_listen.or(self.metrics.listen) {
                None => None,
                Some(a) => Some(a.parse().map_err(|_| {
                    invalid("metrics.listen", "host:port, such as 127.0.0.1:9464", &a)
                })?),
            };
        let dlq = match self.dlq.topic {
            Some(t) if t.is_empty() => return Err(invalid("dlq.topic", "a topic name", "")),
            Some(t) if routes.iter().any(|r| r.topic == t) => {
                return Err(invalid(
                    "dlq.topic",
                    "a topic that is not also routed (its records would loop)",
                    &t,
                ))
            }
            other => other,
        };
        let schema_registry = self.schema_registry.validate()?;
        if schema_registry.is_none() {
            if let Some(i) = routes.iter().position(|r| r.format != Format::Json) {
                return Err(ConfigError::Invalid {
                    field: format!("route[{i}].format"),
                    expected: "json, or a [schema_registry] url (or SCHEMA_REGISTRY_URL) for avro and protobuf",
                    found: routes[i].format.to_string(),
                });
            }
        }
        Ok(Config {
            metrics_listen,
            dlq,
            schema_registry,
            kafka,
            clickhouse,
            sink,
            routes,
            origins,
        })
    }
}

impl RawConfig {
    /// Only the `[schema_registry]` section, if there is one: what
    /// `sluice send --format avro|protobuf` needs besides Kafka.
    pub(crate) fn registry_side(&mut self) -> Result<Option<SchemaRegistryConfig>, ConfigError> {
        std::mem::take(&mut self.schema_registry).validate()
    }

    /// Only the `[kafka]` section (with `brokers` overriding the file's):
    /// what `sluice send` needs.
    pub(crate) fn kafka_side(self, brokers: Option<String>) -> Result<KafkaConfig, ConfigError> {
        self.kafka.validate(brokers, None)
    }

    /// Only what the operator tools need: the `[clickhouse]` section (with
    /// `url` overriding the file's) and the metadata column names. The rest
    /// of the file is not required.
    pub(crate) fn clickhouse_side(
        self,
        url: Option<String>,
    ) -> Result<(ClickHouseConfig, MetadataColumns), ConfigError> {
        Ok((
            self.clickhouse.validate(url)?,
            self.sink.columns.validate()?,
        ))
    }
}

fn invalid(field: &str, expected: &'static str, found: &str) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_string(),
        expected,
        found: found.to_string(),
    }
}

/// The longest a duration setting may be: far past any use, and short
/// enough that the sink's deadlines (`now + insert_timeout * 3`, `now +
/// heartbeat_interval * 2`, …) cannot overflow, which panicked.
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fn bounded(field: &str, v: Option<Duration>) -> Result<Option<Duration>, ConfigError> {
    match v {
        Some(d) if d > MAX_DURATION => Err(invalid(
            field,
            "at most 100 years",
            &humantime::format_duration(d).to_string(),
        )),
        other => Ok(other),
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
        assert_eq!(c.routes[0].table_ref().sql(), "`shop`.`orders`");
        assert_eq!(c.sink.fence_wait, Duration::from_secs(75));
        assert_eq!(c.lease(), Duration::from_secs(10));
        assert_eq!(c.fence_is_short(), None);
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
    fn binary_routes_need_a_registry_and_read_a_subject() {
        let route = |extra: &str| format!("{MIN}\n{extra}");
        let e = load(&route("format = 'avro'")).unwrap_err().to_string();
        assert!(
            e.starts_with("route[0].format: expected json, or a [schema_registry] url"),
            "{e}"
        );
        let with_registry = |extra: &str| {
            format!(
                "{}\n[schema_registry]\nurl = 'http://127.0.0.1:8081'\n",
                route(extra)
            )
        };
        let c = load(&with_registry("format = 'protobuf'")).unwrap();
        assert_eq!(c.routes[0].format, Format::Protobuf);
        assert_eq!(c.routes[0].subject.as_deref(), Some("orders-value"));
        assert_eq!(c.schema_registry.unwrap().url, "http://127.0.0.1:8081");
        let c = load(&with_registry("format = 'avro'\nsubject = 'shop.Order'")).unwrap();
        assert_eq!(c.routes[0].subject.as_deref(), Some("shop.Order"));
        let e = load(&with_registry("format = 'avro'\ndedup_key = ['id']"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("route[0].dedup_key: expected nothing on an avro"),
            "{e}"
        );
        assert_eq!(load(MIN).unwrap().routes[0].format, Format::Json);
        let e = load(&route("subject = 'x'")).unwrap_err().to_string();
        assert!(
            e.starts_with("route[0].subject: expected nothing for a json route"),
            "{e}"
        );
        assert!(!load(MIN).unwrap().routes[0].extra_to_dlq);
        assert!(load(&route("extra_fields = 'dlq'")).unwrap().routes[0].extra_to_dlq);
        assert!(!load(&route("extra_fields = 'ignore'")).unwrap().routes[0].extra_to_dlq);
        // The server refuses what the early check let through.
        let skip = |c: &Config| {
            c.routes[0]
                .insert_settings()
                .iter()
                .find(|(k, _)| *k == "input_format_skip_unknown_fields")
                .map(|(_, v)| *v)
        };
        assert_eq!(skip(&load(MIN).unwrap()), None);
        assert_eq!(
            skip(&load(&route("extra_fields = 'dlq'")).unwrap()),
            Some("0")
        );
        let avro = |more: &str| load(&with_registry(&format!("format = 'avro'\n{more}"))).unwrap();
        assert_eq!(skip(&avro("")), Some("1"));
        assert_eq!(skip(&avro("extra_fields = 'dlq'")), Some("0"));
        let e = load(&route("extra_fields = 'drop'"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("route[0].extra_fields: expected ignore or dlq"),
            "{e}"
        );
        let e = load(&route("format = 'csv'")).unwrap_err().to_string();
        assert!(
            e.starts_with("route[0].format: expected json, avro or protobuf"),
            "{e}"
        );
        let c = with_env(
            &route("format = 'avro'"),
            &[("SCHEMA_REGISTRY_URL", "http://r:1")],
        )
        .unwrap();
        assert_eq!(c.schema_registry.unwrap().url, "http://r:1");
        assert_eq!(
            c.origins.schema_registry_url,
            env::Origin::Var("SCHEMA_REGISTRY_URL".into())
        );
    }

    #[test]
    fn debug_output_hides_the_password() {
        let c = load(&MIN.replace("[clickhouse]", "[clickhouse]\npassword = 'hunter2'")).unwrap();
        assert_eq!(c.clickhouse.password.expose(), "hunter2");
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

    fn with_env(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let vars = vars.iter().map(|(a, b)| (a.to_string(), b.to_string()));
        RawConfig::from_toml_with_env(text, vars)?.validate(Overrides::default())
    }

    #[test]
    fn precedence_file_then_env_then_flags() {
        let file = format!(
            "{MIN}\n[sink]\nmax_batch_rows = 10\n[kafka.properties]\n'fetch.min.bytes' = '1'"
        );
        let c = with_env(&file, &[]).unwrap();
        assert_eq!(c.sink.limits.max_rows, 10);
        let env = [
            ("SLUICE_SINK_MAX_BATCH_ROWS", "20"),
            ("SLUICE_KAFKA_GROUP_ID", "007"),
            ("SLUICE_SINK_PROGRESS_INTERVAL", "0s"),
        ];
        let c = with_env(&file, &env).unwrap();
        assert_eq!(c.sink.limits.max_rows, 20);
        assert_eq!(c.kafka.group_id, "007");
        assert_eq!(c.sink.progress_interval, None);
        assert_eq!(c.kafka.properties["fetch.min.bytes"], "1");
        let vars = env.iter().map(|(a, b)| (a.to_string(), b.to_string()));
        let c = RawConfig::from_toml_with_env(&file, vars)
            .unwrap()
            .validate(Overrides {
                max_batch_rows: Some(30),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(c.sink.limits.max_rows, 30);
        // A variable alone can supply what the file lacks.
        let bare = "[[route]]\ntopic='t'\ntable='x'";
        let c = with_env(
            bare,
            &[
                ("SLUICE_KAFKA_BROKERS", "k:1"),
                ("SLUICE_CLICKHOUSE_URL", "http://c"),
            ],
        )
        .unwrap();
        assert_eq!(
            (c.kafka.brokers.as_str(), c.clickhouse.url.as_str()),
            ("k:1", "http://c")
        );
        // A bad value from the environment is named with its variable.
        let e = with_env(MIN, &[("SLUICE_SINK_DELIVERY", "twice")]).unwrap_err();
        assert!(e.to_string().contains("SLUICE_SINK_DELIVERY"), "{e}");
    }

    #[test]
    fn every_variable_names_a_real_setting() {
        for (path, kind) in env::FIELDS {
            let raw = match kind {
                env::Kind::Int => "1",
                env::Kind::Bool => "true",
                env::Kind::Str => "x",
            };
            let vars = [(env::var_name(path), raw.to_string())];
            if let Err(e) = RawConfig::from_toml_with_env(MIN, vars) {
                assert!(!e.to_string().contains("unknown field"), "{path}: {e}");
            }
        }
    }

    #[test]
    fn kafka_security() {
        let dir = std::env::temp_dir().join(format!("sluice-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pw = dir.join("pw");
        std::fs::write(&pw, "kafka-secret-pw\n").unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, "not checked here").unwrap();
        let sasl = format!(
            "{MIN}\n[kafka.sasl]\nmechanism = 'scram-sha-512'\nusername = 'u'\npassword_file = '{}'",
            pw.display()
        );
        let c = load(&sasl).unwrap();
        let s = &c.kafka.security;
        assert_eq!(s.protocol, "sasl_plaintext");
        let a = s.sasl.as_ref().unwrap();
        assert_eq!(
            (a.mechanism.as_str(), a.password.expose()),
            ("SCRAM-SHA-512", "kafka-secret-pw")
        );
        let both = format!("{sasl}\n[kafka.tls]\nca_file = '{}'", ca.display());
        let c = load(&both).unwrap();
        assert_eq!(c.kafka.security.protocol, "sasl_ssl");
        let cc = c.kafka.client_config();
        assert_eq!(cc.get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(cc.get("sasl.mechanisms"), Some("SCRAM-SHA-512"));
        assert_eq!(
            cc.get("ssl.ca.location"),
            Some(ca.display().to_string().as_str())
        );
        assert!(!format!("{c:?}").contains("kafka-secret-pw"));
        // The password from the environment instead of the file.
        let inline = sasl.replace(&format!("password_file = '{}'", pw.display()), "");
        let c = with_env(&inline, &[("SLUICE_KAFKA_SASL_PASSWORD", "from-env")]).unwrap();
        assert_eq!(c.kafka.security.sasl.unwrap().password.expose(), "from-env");

        let err = |t: &str| load(t).unwrap_err().to_string();
        assert!(err(&inline).contains("kafka.sasl.password: missing"));
        assert!(err(&sasl.replace("scram-sha-512", "GSSAPI")).contains("kafka.sasl.mechanism"));
        assert!(err(&sasl.replace("username = 'u'", "")).contains("kafka.sasl.username"));
        let proto =
            |p: &str| MIN.replace("[kafka]", &format!("[kafka]\nsecurity_protocol = '{p}'"));
        assert!(err(&proto("tls")).contains("kafka.security_protocol"));
        assert!(err(&proto("sasl_ssl")).contains("kafka.sasl"));
        let tls_plain = format!(
            "{}\n[kafka.tls]\nverify_hostname = false",
            proto("plaintext")
        );
        assert!(err(&tls_plain).contains("kafka.tls"));
        let missing_ca = format!("{MIN}\n[kafka.tls]\nca_file = '/nonexistent/ca.pem'");
        let e = err(&missing_ca);
        assert!(
            e.contains("kafka.tls.ca_file") && e.contains("/nonexistent/ca.pem"),
            "{e}"
        );
        let half = format!("{MIN}\n[kafka.tls]\ncert_file = '{}'", ca.display());
        assert!(err(&half).contains("kafka.tls.key_file"));
        let owned = format!("{MIN}\n[kafka.properties]\n'sasl.password' = 'x'");
        assert!(err(&owned).contains("kafka.properties"));
        let p = load(&format!(
            "{MIN}\n[kafka.properties]\n'ssl.keystore.password' = 'ks-secret'"
        ))
        .unwrap();
        assert!(!format!("{p:?}").contains("ks-secret"));
        let ch = MIN.replace(
            "[clickhouse]",
            &format!("[clickhouse]\npassword_file = '{}'", pw.display()),
        );
        assert_eq!(
            load(&ch).unwrap().clickhouse.password.expose(),
            "kafka-secret-pw"
        );
        let both = ch.replace("[clickhouse]", "[clickhouse]\npassword = 'x'");
        assert!(err(&both).contains("clickhouse.password"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dlq_required_and_record_limit() {
        let c = load(&format!("{MIN}\n[dlq]\ntopic = 'bad'")).unwrap();
        assert_eq!(c.dlq.as_deref(), Some("bad"));
        assert_eq!(c.sink.max_record_bytes, 16 << 20);
        assert_eq!(load(MIN).unwrap().dlq, None);
        let err = |t: &str| load(t).unwrap_err().to_string();
        assert!(err(&format!("{MIN}\n[dlq]\ntopic = 'orders'")).contains("dlq.topic"));
        assert!(err(&format!("{MIN}\n[dlq]\ntopic = ''")).contains("dlq.topic"));
        let r = load(&format!("{MIN}\nrequired = ['id', 'ts']")).unwrap();
        assert_eq!(r.routes[0].required, ["id", "ts"]);
        assert!(err(&format!("{MIN}\nrequired = ['id', 'id']")).contains("route[0].required[1]"));
        assert!(err(&format!("{MIN}\nrequired = ['_topic']")).contains("route[0].required[0]"));
        let big = format!("{MIN}\n[sink]\nmax_batch_bytes = 1000\nmax_record_bytes = 2000");
        assert!(err(&big).contains("sink.max_record_bytes"));
        assert!(
            err(&format!("{MIN}\n[sink]\nmax_record_bytes = 0")).contains("sink.max_record_bytes")
        );
        assert!(err(&format!("{MIN}\n[dlq]\ntopc = 'x'")).contains("unknown field `topc`"));
    }

    /// A duration past what the sink can add to a clock is refused by
    /// name; it used to panic here (`heartbeat_interval * 3`, the default
    /// `fence_wait`) or later in the sink (`now + insert_timeout * 3`).
    #[test]
    fn huge_durations_are_refused_not_a_panic() {
        let err = |t: &str| load(t).unwrap_err().to_string();
        let k = |extra: &str| MIN.replace("[kafka]", &format!("[kafka]\n{extra}"));
        let c = |extra: &str| MIN.replace("[clickhouse]", &format!("[clickhouse]\n{extra}"));
        let sink = |extra: &str| format!("{MIN}\n[sink]\n{extra}");
        let huge = "'6148914691236517206s'";
        for (text, want) in [
            (
                k(&format!("heartbeat_interval = {huge}")),
                "kafka.heartbeat_interval",
            ),
            (
                k(&format!("session_timeout = {huge}")),
                "kafka.session_timeout",
            ),
            (
                c(&format!("insert_timeout = {huge}")),
                "clickhouse.insert_timeout",
            ),
            (
                c("insert_timeout = '18446744073709551615s'"),
                "clickhouse.insert_timeout",
            ),
            (sink(&format!("fence_wait = {huge}")), "sink.fence_wait"),
            (
                sink(&format!("commit_interval = {huge}")),
                "sink.commit_interval",
            ),
            (
                sink(&format!("max_batch_age = {huge}")),
                "sink.max_batch_age",
            ),
            (
                sink(&format!("progress_interval = {huge}")),
                "sink.progress_interval",
            ),
            (
                format!("{MIN}\ndedup_key = ['id']\ndedup_window = {huge}"),
                "route[0].dedup_window",
            ),
        ] {
            let e = err(&text);
            assert!(
                e.contains(want) && e.contains("at most 100 years"),
                "{want:?} not in {e:?}"
            );
        }
        let e = with_env(
            MIN,
            &[("SLUICE_KAFKA_HEARTBEAT_INTERVAL", "6148914691236517206s")],
        )
        .unwrap_err();
        assert!(e.to_string().contains("kafka.heartbeat_interval"), "{e}");
        // 100 years is still taken.
        let c = load(&c("insert_timeout = '36500d'")).unwrap();
        assert_eq!(
            c.sink.fence_wait,
            Duration::from_secs(2 * 36500 * 86400 + 15)
        );
        assert_eq!(c.lease(), Duration::from_secs(10));
    }

    /// The lease is what the fence leaves after the last inserts and the
    /// margin, within 2 s and 10 s; a fence too short for 2 s is reported.
    #[test]
    fn the_lease_fits_in_the_fence() {
        let with = |it: &str, fw: &str| {
            load(&format!(
                "{}\n[sink]\nfence_wait = '{fw}'",
                MIN.replace(
                    "[clickhouse]",
                    &format!("[clickhouse]\ninsert_timeout = '{it}'")
                )
            ))
            .unwrap()
        };
        let c = with("5s", "19s");
        assert_eq!(
            (c.lease(), c.fence_is_short()),
            (Duration::from_secs(4), None)
        );
        let c = with("5s", "60s");
        assert_eq!(c.lease(), Duration::from_secs(10));
        let c = with("5s", "6s");
        assert_eq!(c.lease(), Duration::from_secs(2));
        assert_eq!(c.fence_is_short(), Some(Duration::from_secs(17)));
    }

    /// Every remaining rule has its own message naming the field.
    #[test]
    fn every_rule_names_its_field() {
        let err = |t: &str| load(t).unwrap_err().to_string();
        let k = |extra: &str| MIN.replace("[kafka]", &format!("[kafka]\n{extra}"));
        let c = |extra: &str| MIN.replace("[clickhouse]", &format!("[clickhouse]\n{extra}"));
        let sink = |extra: &str| format!("{MIN}\n[sink]\n{extra}");
        for (text, want) in [
            (k("auto_offset_reset = 'middle'"), "kafka.auto_offset_reset"),
            (
                k("session_timeout = '6s'\nheartbeat_interval = '3s'"),
                "kafka.heartbeat_interval",
            ),
            (k("session_timeout = 'soon'"), "session_timeout"),
            (c("insert_timeout = '500ms'"), "clickhouse.insert_timeout"),
            (
                c("settings = { max_execution_time = '0' }"),
                "clickhouse.settings.max_execution_time",
            ),
            (
                c("settings = { async_insert = '1' }"),
                "clickhouse.settings.async_insert",
            ),
            (
                c("settings = { input_format_allow_errors_num = '10' }"),
                "clickhouse.settings.input_format_allow_errors_num",
            ),
            (
                format!(
                    "{}\n[sink]\ndelivery = 'at-least-once'",
                    c("settings = { input_format_allow_errors_ratio = '0.1' }")
                ),
                "clickhouse.settings.input_format_allow_errors_ratio",
            ),
            (sink("max_batch_bytes = 2000000000"), "sink.max_batch_bytes"),
            (
                sink("max_concurrent_inserts = 0"),
                "sink.max_concurrent_inserts",
            ),
            (sink("max_buffered_bytes = 0"), "sink.max_buffered_bytes"),
            (sink("columns = { offset = '' }"), "sink.columns"),
            (
                MIN.replace("topic = \"orders\"", "topic = ''"),
                "route[0].topic",
            ),
            (MIN.replace("shop.orders", "shop."), "route[0].table"),
            (MIN.replace("shop.orders", ".orders"), "route[0].table"),
            (format!("{MIN}\nfoo = 1"), "unknown field `foo`"),
            ("[kafka\n".to_string(), "config file <inline> is not valid"),
        ] {
            let e = err(&text);
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
        let e =
            RawConfig::load(Path::new("/nonexistent/sluice.toml"), std::iter::empty()).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/sluice.toml"), "{e}");
    }
}
