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

use super::ConfigError;
use toml::{Table, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Str,
    Int,
    Bool,
}

use Kind::*;

/// Every setting a variable can set, with its type in the file.
pub const FIELDS: &[(&str, Kind)] = &[
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
];

/// Prefixes whose variables must name a setting.
const SECTIONS: &[&str] = &["KAFKA_", "CLICKHOUSE_", "SINK_", "METRICS_", "DLQ_"];

const PREFIX: &str = "SLUICE_";

/// `sink.max_batch_rows` → `SLUICE_SINK_MAX_BATCH_ROWS`.
pub fn var_name(path: &str) -> String {
    format!("{PREFIX}{}", path.replace('.', "_").to_ascii_uppercase())
}

/// Writes the settings found in `vars` into `table`; returns the names of
/// the variables used.
pub fn apply(
    table: &mut Table,
    vars: impl IntoIterator<Item = (String, String)>,
) -> Result<Vec<String>, ConfigError> {
    let mut used = Vec::new();
    let mut vars: Vec<(String, String)> = vars
        .into_iter()
        .filter(|(k, _)| k.starts_with(PREFIX))
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
        used.push(name);
    }
    Ok(used)
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
        .unwrap();
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
    fn every_variable_name_is_unique() {
        let mut names: Vec<String> = FIELDS.iter().map(|(p, _)| var_name(p)).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), FIELDS.len());
    }
}
