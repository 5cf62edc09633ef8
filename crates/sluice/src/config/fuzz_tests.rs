//! Arbitrary TOML through the config loader (issue 11): random text, lines
//! of config-like TOML in any order (duplicates, bad syntax), generated
//! documents mixing the real sections and keys with wrong types, unknown
//! keys, huge numbers, negative and enormous durations and empty strings,
//! and `SLUICE_…` variables with arbitrary values. The loader must never
//! panic, and every refusal must name what it refuses: a setting's path
//! (`sink.max_batch_rows`, `route[1].dedup_key[0]`), a variable, or a TOML
//! error with its line.
//!
//! Files named by `*_file` settings are drawn from a fixed set of harmless
//! paths (the loader opens them).

use super::*;
use proptest::prelude::*;
use proptest::sample::select;
use toml::{Table, Value};

const CASES: u32 = 256;

fn route_field(f: &str) -> bool {
    let Some(rest) = f.strip_prefix("route[") else {
        return false;
    };
    let Some((n, rest)) = rest.split_once(']') else {
        return false;
    };
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let Some(rest) = rest.strip_prefix('.') else {
        return rest.is_empty();
    };
    let (name, index) = match rest.split_once('[') {
        Some((name, i)) => (name, Some(i)),
        None => (rest, None),
    };
    let known = [
        "topic",
        "table",
        "dedup_key",
        "dedup_window",
        "dedup_max_keys",
        "required",
    ];
    known.contains(&name)
        && index.is_none_or(|i| {
            i.strip_suffix(']')
                .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// Whether an error's `field` names a setting of the file.
fn names_a_setting(f: &str) -> bool {
    const SECTIONS: [&str; 4] = ["route", "kafka.tls", "kafka.sasl", "sink.columns"];
    env::FIELDS.iter().any(|(p, _)| *p == f)
        || SECTIONS.contains(&f)
        || route_field(f)
        || f.strip_prefix("kafka.properties.\"")
            .is_some_and(|k| k.ends_with('"'))
        || f.strip_prefix("clickhouse.settings.")
            .is_some_and(|k| !k.is_empty())
}

/// Loads `text` with `vars` the way `sluice` does and checks the outcome.
fn check(text: &str, vars: &[(String, String)]) -> Result<(), TestCaseError> {
    let raw = RawConfig::from_toml_with_env(text, vars.iter().cloned());
    if vars.is_empty() {
        // The two entry points agree (their messages may differ: one
        // parses into a table first).
        let plain = RawConfig::from_toml(text);
        prop_assert_eq!(
            raw.is_ok(),
            plain.is_ok(),
            "{:?} vs {:?}",
            raw.as_ref().err(),
            plain.as_ref().err()
        );
    }
    let env_used = vars
        .iter()
        .any(|(k, _)| env::FIELDS.iter().any(|(p, _)| env::var_name(p) == *k));
    match raw.and_then(|r| r.validate(Overrides::default())) {
        Ok(c) => {
            prop_assert!(!c.routes.is_empty());
            prop_assert!(c.sink.limits.max_rows > 0 && c.sink.limits.max_bytes > 0);
            prop_assert!(c.sink.max_record_bytes <= c.sink.limits.max_bytes);
            prop_assert!(c
                .kafka
                .heartbeat_interval
                .checked_mul(3)
                .is_some_and(|h| h <= c.kafka.session_timeout));
            // The sink's deadline arithmetic on the durations cannot
            // overflow: `now + insert_timeout * 3 + 5s` (inserts),
            // `now + heartbeat_interval * 2 + 1s` (the insert lease), …
            let now = std::time::Instant::now();
            let fits = |d: Duration, k: u32| {
                d.checked_mul(k)
                    .and_then(|d| d.checked_add(Duration::from_secs(5)))
                    .and_then(|d| now.checked_add(d))
                    .is_some()
            };
            let s = &c.sink;
            for (name, d, k) in [
                ("insert_timeout", c.clickhouse.insert_timeout, 3),
                ("heartbeat_interval", c.kafka.heartbeat_interval, 2),
                ("session_timeout", c.kafka.session_timeout, 1),
                ("fence_wait", s.fence_wait, 1),
                ("commit_interval", s.commit_interval, 1),
                ("max_batch_age", s.limits.max_age, 1),
                (
                    "progress_interval",
                    s.progress_interval.unwrap_or_default(),
                    1,
                ),
            ] {
                prop_assert!(
                    fits(d, k),
                    "{} = {:?} overflows the sink's arithmetic",
                    name,
                    d
                );
            }
            let _ = c.kafka.client_config();
            let _ = (
                c.sink.kafka_buffer_bytes(),
                c.sink.batch_buffer_bytes(),
                format!("{c:?}"),
            );
            for r in &c.routes {
                let _ = r.table_ref().sql();
            }
        }
        Err(e) => {
            let shown = e.to_string();
            prop_assert!(!shown.trim().is_empty(), "{e:?} prints nothing");
            match &e {
                ConfigError::Parse { path, message } => {
                    prop_assert_eq!(path, "<inline>");
                    prop_assert!(!message.trim().is_empty(), "{e:?}");
                    prop_assert!(
                        message.contains("TOML parse error at line ")
                            || (env_used && message.contains("from the environment)")),
                        "no line and no variable in {shown:?}"
                    );
                }
                ConfigError::Read { .. } => {
                    return Err(TestCaseError::fail(format!("read a file: {shown}")))
                }
                ConfigError::File {
                    field,
                    path: _,
                    reason,
                } => {
                    prop_assert!(
                        field.ends_with("_file") && names_a_setting(field),
                        "{shown}"
                    );
                    prop_assert!(!reason.is_empty() && shown.contains(field.as_str()));
                }
                ConfigError::UnknownVar(name) => {
                    prop_assert!(
                        vars.iter().any(|(k, _)| k == name) && shown.contains(name.as_str()),
                        "{shown}"
                    );
                }
                ConfigError::Missing { field, expected } => {
                    prop_assert!(names_a_setting(field), "{shown}");
                    prop_assert!(!expected.is_empty() && shown.contains(field));
                }
                ConfigError::Invalid {
                    field, expected, ..
                } => {
                    let var = vars.iter().any(|(k, _)| k == field);
                    prop_assert!(var || names_a_setting(field), "unnamed field in {shown:?}");
                    prop_assert!(!expected.is_empty() && shown.contains(field.as_str()));
                }
                ConfigError::DuplicateTopic(_) => prop_assert!(shown.starts_with("route:")),
                ConfigError::BufferTooSmall { .. } => {
                    prop_assert!(shown.contains("sink.max_buffered_bytes"))
                }
                ConfigError::Heartbeat { .. } => {
                    prop_assert!(shown.contains("kafka.heartbeat_interval"))
                }
                ConfigError::Columns => prop_assert!(shown.contains("sink.columns")),
            }
        }
    }
    Ok(())
}

// ---- generators -----------------------------------------------------------

/// Paths the loader may open without harm (it reads the ones that exist:
/// tests run in the crate's directory).
const PATHS: [&str; 5] = ["/nonexistent/sluice", "", "/", "Cargo.toml", "src"];

const DURATIONS: [&str; 22] = [
    "0s",
    "1ms",
    "500ms",
    "1s",
    "3s",
    "10s",
    "1h",
    "-1s",
    "-5m",
    "1.5s",
    "10",
    "s",
    "soon",
    "1y 1y",
    "6148914691236517206s",
    "6148914691236517205s 999ms",
    "9223372036854775807s",
    "18446744073709551615s",
    "18446744073709551616s",
    "584942417355y",
    "1000000000000000000000y",
    "99999999999999999999ns",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => select(vec![
            "", " ", "h:1", "http://x:8123", "https://x", "ftp://x", "earliest", "latest",
            "middle", "exactly-once", "at-least-once", "token-only", "twice", "plaintext",
            "ssl", "sasl_ssl", "sasl_plaintext", "SSL", "PLAIN", "scram-sha-256", "GSSAPI",
            "127.0.0.1:9464", "[::1]:0", "nowhere", "_topic", "_partition", "_offset", "orders",
            "shop.orders", ".", "a.", ".b", "db.t.x", "dlq", "sasl.password", "x\u{0}y",
        ])
        .prop_map(String::from),
        2 => select(DURATIONS.to_vec()).prop_map(String::from),
        1 => "[0-9]{1,25}(ns|us|ms|s|m|h|d|w|y)?",
        2 => "\\PC{0,16}",
    ]
}

fn integer() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => select(vec![
            0, 1, -1, 2, 3, 8, 9, 64, 65, 1000, 1 << 30, (1 << 30) + 1, 1 << 31,
            u32::MAX as i64, i64::MAX, i64::MIN,
        ]),
        1 => any::<i64>(),
    ]
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => text().prop_map(Value::String),
        3 => integer().prop_map(Value::Integer),
        1 => select(vec![0.0, -0.0, 1.5, 1e300, f64::INFINITY, -f64::INFINITY, f64::NAN])
            .prop_map(Value::Float),
        1 => any::<bool>().prop_map(Value::Boolean),
        1 => select(vec!["1979-05-27T07:32:00Z", "1979-05-27", "07:32:00"])
            .prop_map(|d| Value::Datetime(d.parse().unwrap())),
    ]
}

/// Any TOML value: a scalar, an array, an inline table.
fn any_value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key_name(), inner, 0..3)
                .prop_map(|m| Value::Table(m.into_iter().collect())),
        ]
    })
}

fn key_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => select(vec![
            "topic", "table", "brokers", "url", "kafka", "route", "sink", "id", "x",
            "fetch.min.bytes", "sasl.password", "security.protocol", "max_execution_time",
        ])
        .prop_map(String::from),
        1 => "\\PC{0,8}",
    ]
}

/// What a setting holds in the file.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Str,
    /// A string, one of these when the document is clean.
    OneOf(&'static [&'static str]),
    Int,
    Bool,
    Dur,
    Path,
    StrList,
    Map,
    Section,
}

const NAMES: &[&str] = &["orders", "events", "sluice", "db", "u", "x"];

/// Every setting of the file, by its path.
const SCHEMA: &[(&str, Kind)] = &[
    ("kafka.brokers", Kind::OneOf(&["h:1", "a:1,b:2", ""])),
    ("kafka.group_id", Kind::OneOf(NAMES)),
    ("kafka.instance_id", Kind::OneOf(&["pod-0", ""])),
    ("kafka.session_timeout", Kind::Dur),
    ("kafka.heartbeat_interval", Kind::Dur),
    (
        "kafka.auto_offset_reset",
        Kind::OneOf(&["earliest", "latest"]),
    ),
    (
        "kafka.security_protocol",
        Kind::OneOf(&["plaintext", "ssl", "sasl_plaintext", "SASL_SSL"]),
    ),
    ("kafka.properties", Kind::Map),
    ("kafka.tls", Kind::Section),
    ("kafka.tls.ca_file", Kind::Path),
    ("kafka.tls.cert_file", Kind::Path),
    ("kafka.tls.key_file", Kind::Path),
    ("kafka.tls.key_password", Kind::OneOf(&["pw", ""])),
    ("kafka.tls.key_password_file", Kind::Path),
    ("kafka.tls.verify_hostname", Kind::Bool),
    ("kafka.sasl", Kind::Section),
    (
        "kafka.sasl.mechanism",
        Kind::OneOf(&["PLAIN", "scram-sha-256", "SCRAM-SHA-512"]),
    ),
    ("kafka.sasl.username", Kind::OneOf(&["u", ""])),
    ("kafka.sasl.password", Kind::OneOf(&["pw", ""])),
    ("kafka.sasl.password_file", Kind::Path),
    (
        "clickhouse.url",
        Kind::OneOf(&["http://ch:8123", "https://ch", "ch:8123"]),
    ),
    ("clickhouse.database", Kind::OneOf(NAMES)),
    ("clickhouse.user", Kind::OneOf(NAMES)),
    ("clickhouse.password", Kind::OneOf(&["pw", ""])),
    ("clickhouse.password_file", Kind::Path),
    ("clickhouse.insert_timeout", Kind::Dur),
    (
        "clickhouse.insert_format",
        Kind::OneOf(&["binary", "json", "native"]),
    ),
    ("clickhouse.settings", Kind::Map),
    ("clickhouse.read_settings", Kind::Map),
    ("clickhouse.cluster", Kind::OneOf(NAMES)),
    (
        "sink.delivery",
        Kind::OneOf(&["exactly-once", "at-least-once", "token-only"]),
    ),
    ("sink.max_batch_rows", Kind::Int),
    ("sink.max_batch_bytes", Kind::Int),
    ("sink.max_batch_age", Kind::Dur),
    ("sink.max_buffered_bytes", Kind::Int),
    ("sink.max_concurrent_inserts", Kind::Int),
    ("sink.commit_interval", Kind::Dur),
    ("sink.fence_wait", Kind::Dur),
    ("sink.max_record_bytes", Kind::Int),
    ("sink.progress_interval", Kind::Dur),
    (
        "sink.columns.topic",
        Kind::OneOf(&["_topic", "src", "_offset", ""]),
    ),
    (
        "sink.columns.partition",
        Kind::OneOf(&["_partition", "part"]),
    ),
    (
        "sink.columns.offset",
        Kind::OneOf(&["_offset", "off", "id"]),
    ),
    (
        "metrics.listen",
        Kind::OneOf(&["127.0.0.1:9464", "[::1]:0", "nowhere"]),
    ),
    ("dlq.topic", Kind::OneOf(&["bad", "orders", ""])),
];

/// Paths that are not settings.
const NOT_SETTINGS: &[(&str, Kind)] = &[
    ("kafka.brokrs", Kind::Str),
    ("sink.columns.key", Kind::Str),
    ("dlq.partitions", Kind::Int),
    ("metrics", Kind::Str),
    ("extra.thing", Kind::Int),
];

const ROUTE: &[(&str, Kind)] = &[
    ("topic", Kind::OneOf(&["orders", "events", "", "bad"])),
    (
        "table",
        Kind::OneOf(&["t", "shop.orders", ".x", "x.", "a.b.c"]),
    ),
    ("dedup_key", Kind::StrList),
    ("dedup_window", Kind::Dur),
    ("dedup_max_keys", Kind::Int),
    ("required", Kind::StrList),
];

/// Durations humantime reads (some out of range for the sink).
const GOOD_DURATIONS: &[&str] = &[
    "0s",
    "1ms",
    "500ms",
    "1s",
    "3s",
    "10s",
    "1m",
    "1h",
    "36500d",
    "36501d",
    "6148914691236517206s",
    "18446744073709551615s",
];

/// A value for a setting of `kind`. Clean: of the right type, drawn from
/// values the setting may take (or nearly). Dirty: of the right type with
/// any contents, sometimes of any type. Paths are always harmless ones.
fn value_for(kind: Kind, clean: bool) -> BoxedStrategy<Value> {
    let string = |v: &'static [&'static str]| {
        select(v.to_vec())
            .prop_map(|x| Value::String(x.into()))
            .boxed()
    };
    let right: BoxedStrategy<Value> = match kind {
        Kind::OneOf(v) if clean => string(v),
        Kind::Str | Kind::OneOf(_) => text().prop_map(Value::String).boxed(),
        Kind::Int if clean => prop_oneof![
            3 => 1i64..=1 << 30,
            1 => select(vec![0i64, 1, 1 << 30, (1 << 30) + 1, 1 << 40]),
        ]
        .prop_map(Value::Integer)
        .boxed(),
        Kind::Int => integer().prop_map(Value::Integer).boxed(),
        Kind::Bool => any::<bool>().prop_map(Value::Boolean).boxed(),
        Kind::Dur if clean => string(GOOD_DURATIONS),
        Kind::Dur => prop_oneof![
            3 => select(DURATIONS.to_vec()).prop_map(|d| Value::String(d.into())),
            1 => text().prop_map(Value::String),
        ]
        .boxed(),
        Kind::Path => string(&PATHS),
        Kind::StrList => {
            let field = if clean {
                select(vec![
                    "id", "ts", "a", "b", "", "_topic", "_offset", "k0", "k1", "k2", "k3", "k4",
                    "k5", "k6", "k7", "k8",
                ])
                .prop_map(String::from)
                .boxed()
            } else {
                text().boxed()
            };
            prop::collection::vec(field, 0..11)
                .prop_map(|v| Value::Array(v.into_iter().map(Value::String).collect()))
                .boxed()
        }
        Kind::Map => prop::collection::btree_map(key_name(), text(), 0..4)
            .prop_map(|m| Value::Table(m.into_iter().map(|(k, v)| (k, Value::String(v))).collect()))
            .boxed(),
        Kind::Section if clean => Just(Value::Table(Table::new())).boxed(),
        Kind::Section => prop::collection::btree_map(key_name(), scalar(), 0..3)
            .prop_map(|m| Value::Table(m.into_iter().collect()))
            .boxed(),
    };
    if clean || matches!(kind, Kind::Path) {
        return right;
    }
    prop_oneof![3 => right, 1 => any_value()].boxed()
}

/// Puts `value` at the dotted `path`, unless something else is in the way.
fn put(t: &mut Table, path: &str, value: Value) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let leaf = parts.pop().unwrap();
    let mut t = t;
    for p in parts {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| Value::Table(Table::new()));
        match entry.as_table_mut() {
            Some(next) => t = next,
            None => return,
        }
    }
    t.insert(leaf.to_string(), value);
}

fn setting(clean: bool) -> impl Strategy<Value = (&'static str, Value)> {
    let n = SCHEMA.len();
    let path = if clean {
        (0..n).prop_map(|i| SCHEMA[i]).boxed()
    } else {
        prop_oneof![
            6 => (0..n).prop_map(|i| SCHEMA[i]),
            1 => (0..NOT_SETTINGS.len()).prop_map(|i| NOT_SETTINGS[i]),
        ]
        .boxed()
    };
    path.prop_flat_map(move |(path, kind)| (Just(path), value_for(kind, clean)))
}

fn route(clean: bool) -> impl Strategy<Value = Value> {
    let extra = (0..ROUTE.len()).prop_flat_map(move |i| {
        let (key, kind) = ROUTE[i];
        (Just(key), value_for(kind, clean))
    });
    let unknown = if clean {
        Just(None).boxed()
    } else {
        prop::option::weighted(0.2, (key_name(), scalar())).boxed()
    };
    (
        prop::option::weighted(0.95, select(vec!["orders", "events", "dlq"])),
        prop::option::weighted(0.95, select(vec!["t", "shop.orders"])),
        prop::collection::vec(extra, 0..4),
        unknown,
    )
        .prop_map(|(topic, table, extra, unknown)| {
            let mut t = Table::new();
            if let Some(topic) = topic {
                t.insert("topic".into(), Value::String(topic.into()));
            }
            if let Some(table) = table {
                t.insert("table".into(), Value::String(table.into()));
            }
            for (k, v) in extra
                .into_iter()
                .chain(unknown.as_ref().map(|(k, v)| (k.as_str(), v.clone())))
            {
                t.insert(k.into(), v);
            }
            Value::Table(t)
        })
}

/// A document: usually the minimum a config needs, then settings from the
/// schema, and routes. A clean one holds values its settings may take (or
/// nearly), to reach the cross-field rules; a dirty one holds values of
/// the wrong type, unknown keys, and now and then a `route` that is not
/// an array of tables.
fn document() -> impl Strategy<Value = Table> {
    any::<bool>().prop_flat_map(|clean| {
        (
            prop::bool::weighted(0.9),
            prop_oneof![1 => Just(0usize..1), 8 => Just(1usize..4)]
                .prop_flat_map(move |n| prop::collection::vec(route(clean), n)),
            prop::collection::vec(setting(clean), 0..8),
            if clean {
                Just(None).boxed()
            } else {
                prop::option::weighted(0.05, any_value()).boxed()
            },
        )
            .prop_map(|(base, routes, settings, odd_route)| {
                let mut t = Table::new();
                if base {
                    put(&mut t, "kafka.brokers", Value::String("h:1".into()));
                    let url = Value::String("http://ch:8123".into());
                    put(&mut t, "clickhouse.url", url);
                }
                for (path, v) in settings {
                    put(&mut t, path, v);
                }
                if !routes.is_empty() {
                    t.insert("route".into(), Value::Array(routes));
                }
                if let Some(v) = odd_route {
                    t.insert("route".into(), v);
                }
                t
            })
    })
}

/// Lines that look like a config file, valid TOML or not, to be put in
/// any order (repeated tables and keys, keys outside their section, …).
fn line() -> impl Strategy<Value = String> {
    prop_oneof![
        16 => select(vec![
            "[kafka]", "[clickhouse]", "[sink]", "[sink.columns]", "[metrics]", "[dlq]",
            "[[route]]", "[route]", "[kafka.tls]", "[kafka.sasl]", "[kafka.properties]",
            "[clickhouse.settings]", "[[kafka]]", "[kafka.brokers]", "",
            "brokers = 'h:1'", "url = 'http://ch'", "topic = 'orders'", "table = 'shop.orders'",
            "topic = ''", "table = '.'", "brokers = 1", "url = []", "max_batch_rows = -1",
            "max_batch_rows = 0", "max_batch_bytes = 99999999999999999999",
            "max_batch_bytes = 9223372036854775807", "max_buffered_bytes = 1",
            "max_record_bytes = 1e3", "fence_wait = '-1s'", "fence_wait = 1",
            "insert_timeout = '18446744073709551615s'",
            "session_timeout = '18446744073709551615s'",
            "heartbeat_interval = '6148914691236517206s'", "heartbeat_interval = '1000000000000000000000y'",
            "dedup_key = ['id']", "dedup_key = 'id'", "dedup_window = '0s'", "required = [1]",
            "delivery = 'token-only'", "delivery = ''", "offset = ''", "offset = '_topic'",
            "verify_hostname = 'yes'", "mechanism = 'PLAIN'", "password = ''",
            "listen = '0.0.0.0:99999'", "'fetch.min.bytes' = 1", "\"\\uD800\" = 1",
            "a.b.c = 1", "key =", "= 1", "x = \"unterminated", "y = '''multi", "'''",
            "[unknown]", "kafka = 1", "brokers = 'a' # comment", "\u{feff}[kafka]",
            "t = 1979-05-27", "inf = inf", "n = nan", "z = 0x7fffffffffffffff", "w = 1_000",
        ])
        .prop_map(String::from),
        1 => "\\PC{0,30}",
    ]
}

/// `SLUICE_…` variables: real ones with any value, unknown ones under a
/// section prefix (an error) or not (ignored).
fn var() -> impl Strategy<Value = (String, String)> {
    let names: Vec<String> = env::FIELDS
        .iter()
        .map(|(p, _)| env::var_name(p))
        .chain(
            [
                "SLUICE_KAFKA_NOPE",
                "SLUICE_LOG",
                "SLUICE_ROUTE_TOPIC",
                "SLUICE_SINK_",
                "SLUICE_",
            ]
            .map(String::from),
        )
        .collect();
    (select(names), text(), select(PATHS.to_vec())).prop_map(|(name, v, path)| {
        if name.ends_with("_FILE") {
            (name, path.to_string())
        } else {
            (name, v)
        }
    })
}

const MIN: &str = "[kafka]\nbrokers = 'h:1'\n[clickhouse]\nurl = 'http://ch'\n\
                   [[route]]\ntopic = 'orders'\ntable = 'shop.orders'\n";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// Any text at all.
    #[test]
    fn arbitrary_text(text in prop_oneof![
        "\\PC{0,200}",
        any::<String>(),
        "[\\[\\]a-z_.='\" \n0-9{},#-]{0,200}",
    ]) {
        check(&text, &[])?;
    }

    /// Config-like lines in any order, after a valid config or alone.
    #[test]
    fn config_like_lines(
        after_min in any::<bool>(),
        lines in prop::collection::vec(line(), 0..24),
    ) {
        let body = lines.join("\n");
        let text = if after_min { format!("{MIN}{body}") } else { body };
        check(&text, &[])?;
    }

    /// Well-formed TOML with the real sections and keys, holding values of
    /// the wrong type, out of range or empty, next to unknown keys.
    #[test]
    fn generated_documents(doc in document()) {
        let Ok(text) = toml::to_string(&doc) else {
            return Ok(());
        };
        check(&text, &[])?;
    }

    /// Generated documents with arbitrary `SLUICE_…` variables over them.
    #[test]
    fn environment_over_documents(
        doc in prop_oneof![Just(None), document().prop_map(Some)],
        vars in prop::collection::vec(var(), 0..5),
    ) {
        let text = match doc {
            None => MIN.to_string(),
            Some(doc) => match toml::to_string(&doc) {
                Ok(t) => t,
                Err(_) => return Ok(()),
            },
        };
        check(&text, &vars)?;
    }
}

// ---- fixed cases ----------------------------------------------------------

#[test]
fn field_names_are_recognised() {
    for f in [
        "route",
        "route[0].topic",
        "route[12].dedup_key[3]",
        "route[1].required",
        "kafka.properties.\"sasl.password\"",
        "sink.max_batch_rows",
        "kafka.tls.key_password_file",
    ] {
        assert!(names_a_setting(f), "{f}");
    }
    for f in [
        "route[].topic",
        "route[0].x",
        "route[0].topic[",
        "kafka",
        "sink.nope",
    ] {
        assert!(!names_a_setting(f), "{f}");
    }
}
