//! The `[[route]]` sections: which topic goes to which table, and the
//! route's record checks and key dedup.
//!
//! In: one section as written ([`RawRoute`]), its index (for error
//! messages), the default database and the metadata column names. Out: a
//! [`Route`], or a [`ConfigError`] naming the field (`route[i].…`).

use super::{bounded, invalid, positive, ConfigError};
use crate::sql::TableRef;
use serde::{Deserialize, Serialize};
use sluice_formats::MetadataColumns;
use std::time::Duration;

/// How long a written key is remembered when the route does not say.
pub(crate) const DEFAULT_DEDUP_WINDOW: Duration = Duration::from_secs(3600);
/// Keys remembered per partition when the route does not say.
pub(crate) const DEFAULT_DEDUP_MAX_KEYS: usize = 10_000_000;

#[serde_with::skip_serializing_none]
#[derive(Debug, Deserialize, Serialize)]
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
    /// Top-level fields every record must have; a record without one of
    /// them cannot become a row (it goes to the DLQ). Default: none.
    #[serde(default)]
    pub required: Vec<String>,
    /// How record values are written: `json` (default), `avro` or
    /// `protobuf` (the schema registry's wire format).
    pub format: Option<String>,
    /// The registry subject whose schemas `check-config` and `schema` read.
    /// Default `<topic>-value`. Only for `avro` and `protobuf`.
    pub subject: Option<String>,
    /// What becomes of a record with a top-level field the table has no
    /// column for: `ignore` (default: the row lands without it) or `dlq`.
    pub extra_fields: Option<String>,
}

/// How a route's record values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    /// Avro in the schema registry's wire format.
    Avro,
    /// Protobuf in the schema registry's wire format.
    Protobuf,
}

impl Format {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Avro => "avro",
            Format::Protobuf => "protobuf",
        }
    }

    /// Whether records are in the schema registry's wire format.
    pub(crate) fn is_registry(self) -> bool {
        self != Format::Json
    }

    /// The insert settings this format's rows rely on, over the user's
    /// (`extra_to_dlq`: the route's `extra_fields = "dlq"`). The registry
    /// decoders write timestamps as RFC 3339 in UTC (`sluice_formats::avro`),
    /// which only `best_effort` reads exactly, and floats as their shortest
    /// text, which only the precise parser reads exactly when it has an
    /// exponent (the fast one, the default before 26.7, reads
    /// `3.4028235e38` one unit off); a field the row lacks takes the
    /// column's default. A field the table lacks (a newer schema's) is
    /// ignored, or, with `extra_to_dlq`, makes ClickHouse refuse the row,
    /// which then goes to the DLQ: the server's columns at the time of the
    /// insert decide. JSON routes otherwise keep the server's defaults, so
    /// that a user's rows mean what they meant before.
    pub fn insert_settings(self, extra_to_dlq: bool) -> &'static [(&'static str, &'static str)] {
        const REGISTRY: [(&str, &str); 3] = [
            ("date_time_input_format", "best_effort"),
            ("precise_float_parsing", "1"),
            ("input_format_defaults_for_omitted_fields", "1"),
        ];
        const IGNORE: (&str, &str) = ("input_format_skip_unknown_fields", "1");
        const REFUSE: (&str, &str) = ("input_format_skip_unknown_fields", "0");
        match (self, extra_to_dlq) {
            (Format::Json, false) => &[],
            (Format::Json, true) => &[REFUSE],
            (_, false) => &[REGISTRY[0], REGISTRY[1], REGISTRY[2], IGNORE],
            (_, true) => &[REGISTRY[0], REGISTRY[1], REGISTRY[2], REFUSE],
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A topic and the table its rows go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub topic: String,
    pub database: String,
    pub table: String,
    pub dedup: Option<KeyDedup>,
    /// Fields every record must have.
    pub required: Vec<String>,
    pub format: Format,
    /// The registry subject of the route's schemas (`avro`, `protobuf`).
    pub subject: Option<String>,
    /// Records with a top-level field the table lacks go to the DLQ
    /// (`extra_fields = "dlq"`) rather than land without it.
    pub extra_to_dlq: bool,
}

/// Key-level dedup settings of a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDedup {
    pub fields: Vec<String>,
    pub(crate) window: Duration,
    pub(crate) max_keys: usize,
}

impl Route {
    /// The settings of the route's inserts, over the user's
    /// ([`Format::insert_settings`]).
    pub(crate) fn insert_settings(&self) -> &'static [(&'static str, &'static str)] {
        self.format.insert_settings(self.extra_to_dlq)
    }

    /// The route's table.
    pub fn table_ref(&self) -> TableRef {
        TableRef::new(&self.database, &self.table)
    }
}

impl RawRoute {
    /// Route `i`, its table in `database` unless it names one.
    pub(crate) fn validate(
        self,
        i: usize,
        database: &str,
        columns: &MetadataColumns,
    ) -> Result<Route, ConfigError> {
        let r = self;
        if r.topic.is_empty() {
            return Err(invalid(
                &format!("route[{i}].topic"),
                "a topic name",
                &r.topic,
            ));
        }
        let (db, table) = match r.table.split_once('.') {
            Some((db, t)) => (db.to_string(), t.to_string()),
            None => (database.to_string(), r.table.clone()),
        };
        if db.is_empty() || table.is_empty() {
            return Err(invalid(
                &format!("route[{i}].table"),
                "table or database.table",
                &r.table,
            ));
        }
        let dedup = key_dedup(i, &r, columns)?;
        distinct_fields(&format!("route[{i}].required"), &r.required, columns)?;
        if r.required.len() > sluice_formats::row::MAX_REQUIRED_FIELDS {
            return Err(invalid(
                &format!("route[{i}].required"),
                "at most 64 fields",
                &r.required.len().to_string(),
            ));
        }
        let format = match r.format.as_deref() {
            None | Some("json") => Format::Json,
            Some("avro") => Format::Avro,
            Some("protobuf") => Format::Protobuf,
            Some(other) => {
                return Err(invalid(
                    &format!("route[{i}].format"),
                    "json, avro or protobuf",
                    other,
                ))
            }
        };
        if format.is_registry() && dedup.is_some() {
            // The window is rebuilt from the table with `toString`, which
            // writes timestamps and decimals otherwise than the decoders do:
            // keys would not match after a hand-off.
            return Err(invalid(
                &format!("route[{i}].dedup_key"),
                "nothing on an avro or protobuf route in this version (offset-level exactly-once still applies)",
                &r.dedup_key.join(","),
            ));
        }
        let subject = match (format, r.subject) {
            (Format::Json, None) => None,
            (Format::Json, Some(s)) => {
                return Err(invalid(
                    &format!("route[{i}].subject"),
                    "nothing for a json route (a subject is for avro and protobuf)",
                    &s,
                ))
            }
            (_, Some(s)) if s.is_empty() => {
                return Err(invalid(
                    &format!("route[{i}].subject"),
                    "a subject name",
                    "",
                ))
            }
            (_, s) => Some(s.unwrap_or_else(|| format!("{}-value", r.topic))),
        };
        let extra_to_dlq = match r.extra_fields.as_deref() {
            None | Some("ignore") => false,
            Some("dlq") => true,
            Some(other) => {
                return Err(invalid(
                    &format!("route[{i}].extra_fields"),
                    "ignore or dlq",
                    other,
                ))
            }
        };
        Ok(Route {
            topic: r.topic,
            database: db,
            table,
            dedup,
            required: r.required,
            format,
            subject,
            extra_to_dlq,
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
    if r.dedup_key.len() > sluice_formats::row::MAX_KEY_FIELDS {
        return Err(invalid(
            &format!("route[{i}].dedup_key"),
            "at most 8 fields",
            &r.dedup_key.join(", "),
        ));
    }
    distinct_fields(&format!("route[{i}].dedup_key"), &r.dedup_key, columns)?;
    let window = bounded(&format!("route[{i}].dedup_window"), r.dedup_window)?
        .unwrap_or(DEFAULT_DEDUP_WINDOW);
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
            DEFAULT_DEDUP_MAX_KEYS,
        )?,
    }))
}

/// Checks that `fields` (the setting `name`) are named, distinct and not
/// metadata columns.
fn distinct_fields(
    name: &str,
    fields: &[String],
    columns: &MetadataColumns,
) -> Result<(), ConfigError> {
    let meta = [&columns.topic, &columns.partition, &columns.offset];
    for (j, f) in fields.iter().enumerate() {
        if f.is_empty() || meta.contains(&f) || fields[..j].contains(f) {
            return Err(invalid(
                &format!("{name}[{j}]"),
                "a distinct top-level field of the records, not a metadata column",
                f,
            ));
        }
    }
    Ok(())
}
