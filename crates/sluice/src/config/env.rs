//! `SLUICE_…` environment variables → values in the parsed config file.
//!
//! Every scalar setting has a variable: its path in upper case with `.`
//! turned into `_` (`sink.max_batch_rows` → `SLUICE_SINK_MAX_BATCH_ROWS`,
//! `kafka.sasl.password` → `SLUICE_KAFKA_SASL_PASSWORD`). [`apply`] writes
//! each one set into the file's table before it is deserialized, typed from
//! [`FIELDS`] (so `SLUICE_KAFKA_GROUP_ID=42` stays a string). Routes and the
//! `properties` / `settings` maps come from the file only. A variable under a
//! section prefix (`SLUICE_KAFKA_…`, `SLUICE_SINK_…`) that names no setting
//! is an error, like an unknown key in the file.
//!
//! The generic `KAFKA_BROKERS` and `CLICKHOUSE_URL`, which other tools read
//! too, only fill an endpoint that neither the file nor a `SLUICE_…`
//! variable sets: a variable left in the shell for another tool never
//! redirects a sink whose file names its servers. Each endpoint's
//! [`Origin`] is kept so the start-up log can say where it came from, and a
//! generic variable that was ignored is reported.

use super::ConfigError;
use toml::{Table, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Str,
    Int,
    Bool,
}

use Kind::*;

/// Every setting a variable can set, with its type in the file.
pub(crate) const FIELDS: &[(&str, Kind)] = &[
    ("kafka.brokers", Str),
    ("kafka.group_id", Str),
    ("kafka.instance_id", Str),
    ("kafka.session_timeout", Str),
    ("kafka.heartbeat_interval", Str),
    ("kafka.auto_offset_reset", Str),
    ("kafka.security_protocol", Str),
    ("kafka.tls.ca_file", Str),
    ("kafka.tls.cert_file", Str),
    ("kafka.tls.key_file", Str),
    ("kafka.tls.key_password", Str),
    ("kafka.tls.key_password_file", Str),
    ("kafka.tls.verify_hostname", Bool),
    ("kafka.sasl.mechanism", Str),
    ("kafka.sasl.username", Str),
    ("kafka.sasl.password", Str),
    ("kafka.sasl.password_file", Str),
    ("clickhouse.url", Str),
    ("clickhouse.database", Str),
    ("clickhouse.user", Str),
    ("clickhouse.password", Str),
    ("clickhouse.password_file", Str),
    ("clickhouse.insert_timeout", Str),
    ("clickhouse.insert_format", Str),
    ("clickhouse.cluster", Str),
    ("sink.delivery", Str),
    ("sink.max_batch_rows", Int),
    ("sink.max_batch_bytes", Int),
    ("sink.max_batch_age", Str),
    ("sink.max_buffered_bytes", Int),
    ("sink.max_concurrent_inserts", Int),
    ("sink.max_record_bytes", Int),
    ("sink.commit_interval", Str),
    ("sink.fence_wait", Str),
    ("sink.progress_interval", Str),
    ("sink.columns.topic", Str),
    ("sink.columns.partition", Str),
    ("sink.columns.offset", Str),
    ("metrics.listen", Str),
    ("dlq.topic", Str),
    ("schema_registry.url", Str),
    ("schema_registry.username", Str),
    ("schema_registry.password", Str),
    ("schema_registry.password_file", Str),
    ("schema_registry.ca_file", Str),
    ("schema_registry.cert_file", Str),
    ("schema_registry.key_file", Str),
    ("schema_registry.timeout", Str),
];

/// Prefixes whose variables must name a setting.
const SECTIONS: &[&str] = &[
    "KAFKA_",
    "CLICKHOUSE_",
    "SINK_",
    "METRICS_",
    "DLQ_",
    "SCHEMA_REGISTRY_",
];

const PREFIX: &str = "SLUICE_";

/// Variables other tools read too, and the endpoint each one fills when
/// nothing more specific sets it.
pub(crate) const GENERIC: &[(&str, &str)] = &[
    ("kafka.brokers", "KAFKA_BROKERS"),
    ("clickhouse.url", "CLICKHOUSE_URL"),
    ("schema_registry.url", "SCHEMA_REGISTRY_URL"),
];

/// Where an endpoint's effective value came from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum Origin {
    /// Not set anywhere (a default applies, or it is missing).
    #[default]
    Unset,
    File,
    /// An environment variable, by name.
    Var(String),
    /// A command-line flag, by name.
    Flag(&'static str),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Unset => f.write_str("the default"),
            Origin::File => f.write_str("the config file"),
            Origin::Var(v) => f.write_str(v),
            Origin::Flag(flag) => f.write_str(flag),
        }
    }
}

/// Where the two endpoints came from, and the generic variables that were
/// set but not used.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Origins {
    pub(crate) brokers: Origin,
    pub(crate) clickhouse_url: Origin,
    pub(crate) schema_registry_url: Origin,
    /// `(endpoint, sentence)` for each generic variable set but not used.
    pub(crate) ignored: Vec<(&'static str, String)>,
}

impl Origins {
    /// The sentences to warn with.
    pub(crate) fn warnings(&self) -> impl Iterator<Item = &str> {
        self.ignored.iter().map(|(_, s)| s.as_str())
    }

    /// A flag set `path`: what the file or a variable said no longer matters.
    pub(crate) fn flag(&mut self, path: &str, flag: &'static str) {
        self.ignored.retain(|(p, _)| *p != path);
        if let Some(o) = self.of(path) {
            *o = Origin::Flag(flag);
        }
    }

    fn of(&mut self, path: &str) -> Option<&mut Origin> {
        match path {
            "kafka.brokers" => Some(&mut self.brokers),
            "clickhouse.url" => Some(&mut self.clickhouse_url),
            "schema_registry.url" => Some(&mut self.schema_registry_url),
            _ => None,
        }
    }
}

/// What [`apply`] did.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    /// The variables whose values went into the table.
    pub(crate) used: Vec<String>,
    pub(crate) origins: Origins,
}

/// `sink.max_batch_rows` → `SLUICE_SINK_MAX_BATCH_ROWS`.
pub(crate) fn var_name(path: &str) -> String {
    format!("{PREFIX}{}", path.replace('.', "_").to_ascii_uppercase())
}

/// Writes the settings found in `vars` into `table`: the `SLUICE_…` ones
/// over the file, then the [`GENERIC`] ones where nothing set the endpoint.
pub(crate) fn apply(
    table: &mut Table,
    vars: impl IntoIterator<Item = (String, String)>,
) -> Result<Applied, ConfigError> {
    let mut used = Vec::new();
    let mut origins = Origins::default();
    for (path, _) in GENERIC {
        if lookup(table, path).is_some() {
            *origins.of(path).expect("an endpoint") = Origin::File;
        }
    }
    let vars: Vec<(String, String)> = vars.into_iter().collect();
    let generic: Vec<(&str, &str, &str)> = GENERIC
        .iter()
        .filter_map(|&(path, name)| {
            let (_, v) = vars.iter().find(|(k, v)| k == name && !v.is_empty())?;
            Some((path, name, v.as_str()))
        })
        .collect();
    let mut vars: Vec<(String, String)> = vars
        .iter()
        .filter(|(k, _)| k.starts_with(PREFIX))
        .cloned()
        .collect();
    vars.sort();
    for (name, raw) in vars {
        let Some(&(path, kind)) = FIELDS.iter().find(|(p, _)| var_name(p) == name) else {
            let rest = &name[PREFIX.len()..];
            if SECTIONS.iter().any(|s| rest.starts_with(s)) {
                return Err(ConfigError::UnknownVar(name));
            }
            continue; // another tool's variable (SLUICE_LOG, SLUICE_CACHE, …)
        };
        let value = match kind {
            Str => Value::String(raw),
            Int => Value::Integer(raw.trim().parse().map_err(|_| ConfigError::Invalid {
                field: name.clone(),
                expected: "an integer",
                found: raw.clone(),
            })?),
            Bool => Value::Boolean(match raw.trim() {
                "true" | "1" => true,
                "false" | "0" => false,
                _ => {
                    return Err(ConfigError::Invalid {
                        field: name.clone(),
                        expected: "true or false",
                        found: raw,
                    })
                }
            }),
        };
        set(table, path, value, &name)?;
        if let Some(o) = origins.of(path) {
            *o = Origin::Var(name.clone());
        }
        used.push(name);
    }
    for (path, name, value) in generic {
        let origin = origins.of(path).expect("an endpoint");
        if *origin == Origin::Unset {
            set(table, path, Value::String(value.into()), name)?;
            *origin = Origin::Var(name.into());
            used.push(name.into());
        } else if lookup(table, path).and_then(Value::as_str) != Some(value) {
            let sentence = format!(
                "{name}={} is ignored: {path} is set by {origin}",
                super::secret::redact_url(value)
            );
            origins.ignored.push((path, sentence));
        }
    }
    Ok(Applied { used, origins })
}

/// The value at a dotted path, if the table has one.
fn lookup<'a>(table: &'a Table, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let first = table.get(parts.next()?)?;
    parts.try_fold(first, |v, p| v.as_table()?.get(p))
}

fn set(table: &mut Table, path: &str, value: Value, var: &str) -> Result<(), ConfigError> {
    let mut parts: Vec<&str> = path.split('.').collect();
    let leaf = parts.pop().unwrap_or(path);
    let mut t = table;
    for p in parts {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| Value::Table(Table::new()));
        t = entry.as_table_mut().ok_or_else(|| ConfigError::Invalid {
            field: var.to_string(),
            expected: "a section in the file to put it in",
            found: format!("`{p}` is not a table in the file"),
        })?;
    }
    t.insert(leaf.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn typed_by_the_setting_not_by_the_text() {
        let mut t: Table = toml::from_str("[kafka]\ngroup_id = 'file'").unwrap();
        let used = apply(
            &mut t,
            vars(&[
                ("SLUICE_KAFKA_GROUP_ID", "42"),
                ("SLUICE_SINK_MAX_BATCH_ROWS", " 5000"),
                ("SLUICE_KAFKA_TLS_VERIFY_HOSTNAME", "false"),
                ("SLUICE_LOG", "debug"),
                ("PATH", "/bin"),
            ]),
        )
        .unwrap()
        .used;
        assert_eq!(used.len(), 3);
        assert_eq!(t["kafka"]["group_id"].as_str(), Some("42"));
        assert_eq!(t["sink"]["max_batch_rows"].as_integer(), Some(5000));
        assert_eq!(t["kafka"]["tls"]["verify_hostname"].as_bool(), Some(false));
    }

    #[test]
    fn errors_name_the_variable() {
        let err = |k: &str, v: &str| {
            apply(&mut Table::new(), vars(&[(k, v)]))
                .unwrap_err()
                .to_string()
        };
        assert!(err("SLUICE_KAFKA_BROKRS", "x").contains("SLUICE_KAFKA_BROKRS"));
        let e = err("SLUICE_SINK_MAX_BATCH_ROWS", "ten");
        assert!(
            e.contains("SLUICE_SINK_MAX_BATCH_ROWS") && e.contains("integer"),
            "{e}"
        );
        let e = err("SLUICE_KAFKA_TLS_VERIFY_HOSTNAME", "maybe");
        assert!(e.contains("true or false"), "{e}");
    }

    #[test]
    fn generic_variables_fill_only_what_nothing_else_sets() {
        let apply_to = |file: &str, v: &[(&str, &str)]| {
            let mut t: Table = toml::from_str(file).unwrap();
            let a = apply(&mut t, vars(v)).unwrap();
            (t, a.origins)
        };
        let generic = [
            ("KAFKA_BROKERS", "elsewhere:9092"),
            ("CLICKHOUSE_URL", "http://elsewhere:8123"),
        ];
        // The file names both servers: the generic variables are ignored, and said to be.
        let file = "[kafka]\nbrokers = 'k:1'\n[clickhouse]\nurl = 'http://ch:1'";
        let (t, o) = apply_to(file, &generic);
        assert_eq!(t["kafka"]["brokers"].as_str(), Some("k:1"));
        assert_eq!(t["clickhouse"]["url"].as_str(), Some("http://ch:1"));
        assert_eq!((o.brokers, o.clickhouse_url), (Origin::File, Origin::File));
        assert_eq!(o.ignored.len(), 2, "{:?}", o.ignored);
        assert!(o.ignored[1]
            .1
            .contains("CLICKHOUSE_URL=http://elsewhere:8123 is ignored"));
        assert!(o.ignored[1].1.contains("the config file"));
        // The same value as the file's is no conflict.
        let (_, o) = apply_to(file, &[("KAFKA_BROKERS", "k:1")]);
        assert!(o.ignored.is_empty());
        // A SLUICE_ variable beats both.
        let mut v = generic.to_vec();
        v.push(("SLUICE_CLICKHOUSE_URL", "http://mine:1"));
        let (t, o) = apply_to(file, &v);
        assert_eq!(t["clickhouse"]["url"].as_str(), Some("http://mine:1"));
        assert_eq!(
            o.clickhouse_url,
            Origin::Var("SLUICE_CLICKHOUSE_URL".into())
        );
        // Nothing else sets them: the generic variables fill them.
        let (t, o) = apply_to("", &generic);
        assert_eq!(t["kafka"]["brokers"].as_str(), Some("elsewhere:9092"));
        assert_eq!(o.brokers, Origin::Var("KAFKA_BROKERS".into()));
        assert!(o.ignored.is_empty());
        let (_, o) = apply_to("", &[]);
        assert_eq!(o.brokers, Origin::Unset);
        // An empty variable is no variable.
        let (t, o) = apply_to(file, &[("KAFKA_BROKERS", "")]);
        assert!(o.ignored.is_empty());
        assert_eq!(t["kafka"]["brokers"].as_str(), Some("k:1"));
        let (t, _) = apply_to("", &[("KAFKA_BROKERS", "")]);
        assert!(t.get("kafka").is_none());
        // A secret in another tool's URL never reaches the warning.
        let (_, o) = apply_to(file, &[("CLICKHOUSE_URL", "http://u:pw@h:1/?password=pw")]);
        assert!(!o.ignored[0].1.contains("pw"), "{:?}", o.ignored);
        // A flag makes the variable moot.
        let (_, mut o) = apply_to(file, &generic);
        o.flag("clickhouse.url", "--clickhouse-url");
        assert_eq!(o.ignored.len(), 1);
        assert_eq!(o.clickhouse_url, Origin::Flag("--clickhouse-url"));
    }

    /// Every field of every section has its variable, and every variable
    /// names a field: read from the types themselves, so neither side can
    /// drift from the other. Maps (`properties`, `settings`,
    /// `read_settings`) and sections come from the file only.
    #[test]
    fn every_setting_has_a_variable_and_back() {
        use crate::config::{security, RawClickHouse, RawKafka};
        use serde_aux::serde_introspection::serde_introspect;
        let file_only = [
            "properties",
            "settings",
            "read_settings",
            "tls",
            "sasl",
            "columns",
        ];
        let sections: [(&str, &[&str]); 9] = [
            ("kafka", serde_introspect::<RawKafka>()),
            ("kafka.tls", serde_introspect::<security::RawTls>()),
            ("kafka.sasl", serde_introspect::<security::RawSasl>()),
            ("clickhouse", serde_introspect::<RawClickHouse>()),
            ("sink", serde_introspect::<crate::config::RawSink>()),
            (
                "sink.columns",
                serde_introspect::<crate::config::sink::RawColumns>(),
            ),
            ("metrics", serde_introspect::<crate::config::RawMetrics>()),
            ("dlq", serde_introspect::<crate::config::RawDlq>()),
            (
                "schema_registry",
                serde_introspect::<crate::config::RawSchemaRegistry>(),
            ),
        ];
        let mut from_types: Vec<String> = sections
            .iter()
            .flat_map(|(section, fields)| {
                fields
                    .iter()
                    .filter(|f| !file_only.contains(f))
                    .map(move |f| format!("{section}.{f}"))
            })
            .collect();
        let mut listed: Vec<String> = FIELDS.iter().map(|(p, _)| p.to_string()).collect();
        from_types.sort();
        listed.sort();
        assert_eq!(from_types, listed);
    }

    #[test]
    fn every_variable_name_is_unique() {
        let mut names: Vec<String> = FIELDS.iter().map(|(p, _)| var_name(p)).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), FIELDS.len());
    }
}
