//! Every default the docs state is the code's default.
//!
//! In: `docs/configuration.md`, whose ```` ```toml ```` blocks, read in
//! order, are one annotated config file. A key line starts at the start of
//! a line, as `key = value` or `# key = value`, under the last `[section]`
//! header above it (commented out or not). Its value is the key's default,
//! unless its comment starts with `required` or `no default` (an example).
//!
//! Out, per stated default: the value the real loader
//! ([`RawConfig::from_toml`] → [`RawConfig::validate`]) gives when the key
//! is absent from a minimal file, compared with the doc's. A default
//! changed in the code and not in the doc (or the other way round) fails
//! here. Around that: the annotated file loads as it is; every key it
//! shows, uncommented, is one the loader knows; every setting is shown; and
//! a key shown with `no default` is indeed unset when absent.

use super::{env, Config, Delivery, InsertFormat, Overrides, RawConfig};
use std::collections::BTreeMap;
use std::time::Duration;

const DOC: &str = include_str!("../../../../docs/configuration.md");

/// The smallest valid file; the `[[route]]` comes last, so a route key
/// can be appended.
const MIN: &str = "[kafka]\nbrokers = '127.0.0.1:9092'\n\
                   [clickhouse]\nurl = 'http://127.0.0.1:8123'\n\
                   [[route]]\ntopic = 'orders'\ntable = 'shop.orders'\n";

/// Keys that are not scalar settings with a `SLUICE_…` variable
/// ([`env::FIELDS`]), which the doc must show too.
const OTHER_KEYS: &[&str] = &[
    "kafka.properties",
    "clickhouse.settings",
    "clickhouse.read_settings",
    "route.topic",
    "route.table",
    "route.format",
    "route.subject",
    "route.dedup_key",
    "route.dedup_window",
    "route.dedup_max_keys",
    "route.required",
    "route.extra_fields",
];

/// One key line of the annotated file.
#[derive(Debug)]
struct Line {
    /// `section.key` (`route.topic` for `[[route]]`).
    path: String,
    /// The value as written (TOML).
    value: String,
    comment: String,
    /// Its line in the doc, for messages.
    number: usize,
}

impl Line {
    /// Whether the value is an example rather than the default.
    fn is_example(&self) -> bool {
        self.comment.starts_with("required") || self.comment.starts_with("no default")
    }
}

/// The lines of the doc's ```toml blocks, in order, with their line
/// numbers in the doc.
fn block_lines() -> Vec<(usize, &'static str)> {
    let mut out = Vec::new();
    let mut inside = false;
    for (i, line) in DOC.lines().enumerate() {
        match (inside, line.trim_end()) {
            (false, "```toml") => inside = true,
            (true, "```") => inside = false,
            (true, _) => out.push((i + 1, line)),
            _ => {}
        }
    }
    assert!(
        !out.is_empty(),
        "docs/configuration.md has no ```toml block"
    );
    out
}

/// The ```toml blocks of the doc, in order, as one text.
fn annotated() -> String {
    let lines: Vec<&str> = block_lines().into_iter().map(|(_, l)| l).collect();
    lines.join("\n") + "\n"
}

/// `line` without a leading `#` (and the spaces after it), and whether it
/// had one. `None` for an indented line (a comment continued).
fn uncomment(line: &str) -> Option<(&str, bool)> {
    if line.starts_with(char::is_whitespace) {
        return None;
    }
    match line.strip_prefix('#') {
        Some(rest) => Some((rest.trim_start(), true)),
        None => Some((line, false)),
    }
}

/// The table name of a header line (`[kafka.tls]`, `[[route]]`).
fn header(text: &str) -> Option<String> {
    let name = text.strip_prefix('[')?.trim_start_matches('[');
    let name = &name[..name.find(']')?];
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.');
    ok.then(|| name.to_string())
}

/// `key = value  # comment` → its parts; `None` for anything else (prose).
fn key_line(text: &str) -> Option<(String, String, String)> {
    let (key, rest) = text.split_once('=')?;
    let key = key.trim_end();
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
        return None;
    }
    // The comment starts at the first `#` outside a string.
    let mut in_string = false;
    let mut split = rest.len();
    for (i, c) in rest.char_indices() {
        match c {
            '"' => in_string = !in_string,
            '#' if !in_string => {
                split = i;
                break;
            }
            _ => {}
        }
    }
    let value = rest[..split].trim().to_string();
    let comment = rest[split..].trim_start_matches('#').trim().to_string();
    Some((key.to_string(), value, comment))
}

/// Every key line of the annotated file.
fn lines() -> Vec<Line> {
    let mut section = String::new();
    let mut out = Vec::new();
    for (number, line) in block_lines() {
        let Some((text, _)) = uncomment(line) else {
            continue;
        };
        if let Some(name) = header(text) {
            section = name;
        } else if let Some((key, value, comment)) = key_line(text) {
            assert!(
                !section.is_empty(),
                "line {number}: a key before any [section]"
            );
            out.push(Line {
                path: format!("{section}.{key}"),
                value,
                comment,
                number,
            });
        }
    }
    out
}

fn load(text: &str) -> Config {
    RawConfig::from_toml(text)
        .and_then(|raw| raw.validate(Overrides::default()))
        .unwrap_or_else(|e| panic!("{e}\nin:\n{text}"))
}

/// What the code gives for a key left out.
#[derive(Debug)]
enum Code {
    Duration(Duration),
    Value(toml::Value),
}

fn string(s: &str) -> Code {
    Code::Value(toml::Value::String(s.to_string()))
}

fn int(n: usize) -> Code {
    Code::Value(toml::Value::Integer(n as i64))
}

fn strings(v: &[String]) -> Code {
    Code::Value(toml::Value::Array(
        v.iter().cloned().map(toml::Value::String).collect(),
    ))
}

fn map(m: &BTreeMap<String, String>) -> Code {
    Code::Value(toml::Value::Table(
        m.iter()
            .map(|(k, v)| (k.clone(), toml::Value::String(v.clone())))
            .collect(),
    ))
}

/// The configs the defaults are read from: the minimal file, and the
/// minimal file with what a key's default needs around it.
struct Loaded {
    base: Config,
    /// With an empty `[kafka.tls]`.
    tls: Config,
    /// An avro route and a registry.
    registry: Config,
    /// Key dedup on the route.
    dedup: Config,
}

impl Loaded {
    fn new() -> Self {
        Self {
            base: load(MIN),
            tls: load(&format!("{MIN}[kafka.tls]\n")),
            registry: load(&format!(
                "{MIN}format = 'avro'\n[schema_registry]\nurl = 'http://127.0.0.1:8081'\n"
            )),
            dedup: load(&format!("{MIN}dedup_key = ['id']\n")),
        }
    }

    /// The code's default of `path`; `None` for a key this test cannot
    /// read (the test then fails: teach it the key).
    fn default_of(&self, path: &str) -> Option<Code> {
        let c = &self.base;
        let route = &c.routes[0];
        let tls = || self.tls.kafka.security.tls.as_ref().expect("[kafka.tls]");
        let registry = || self.registry.schema_registry.as_ref().expect("a registry");
        let dedup = || self.dedup.routes[0].dedup.as_ref().expect("dedup_key");
        Some(match path {
            "kafka.group_id" => string(&c.kafka.group_id),
            "kafka.session_timeout" => Code::Duration(c.kafka.session_timeout),
            "kafka.heartbeat_interval" => Code::Duration(c.kafka.heartbeat_interval),
            "kafka.auto_offset_reset" => string(c.kafka.auto_offset_reset.as_str()),
            "kafka.security_protocol" => string(&c.kafka.security.protocol),
            "kafka.properties" => map(&c.kafka.properties),
            "kafka.tls.verify_hostname" => Code::Value(toml::Value::Boolean(tls().verify_hostname)),
            "clickhouse.database" => string(&c.clickhouse.database),
            "clickhouse.user" => string(&c.clickhouse.user),
            "clickhouse.password" => string(c.clickhouse.password.expose()),
            "clickhouse.insert_timeout" => Code::Duration(c.clickhouse.insert_timeout),
            "clickhouse.insert_format" => string(match c.clickhouse.insert_format {
                InsertFormat::Binary => "binary",
                InsertFormat::Json => "json",
            }),
            "clickhouse.settings" => map(&c.clickhouse.settings),
            "clickhouse.read_settings" => map(&c.clickhouse.read_settings),
            "sink.delivery" => string(match c.sink.delivery {
                Delivery::ExactlyOnce => "exactly-once",
                Delivery::AtLeastOnce => "at-least-once",
                Delivery::TokenOnly => "token-only",
            }),
            "sink.max_batch_rows" => int(c.sink.limits.max_rows),
            "sink.max_batch_bytes" => int(c.sink.limits.max_bytes),
            "sink.max_batch_age" => Code::Duration(c.sink.limits.max_age),
            "sink.max_buffered_bytes" => int(c.sink.max_buffered_bytes),
            "sink.max_concurrent_inserts" => int(c.sink.max_concurrent_inserts),
            "sink.commit_interval" => Code::Duration(c.sink.commit_interval),
            "sink.fence_wait" => Code::Duration(c.sink.fence_wait),
            "sink.max_record_bytes" => int(c.sink.max_record_bytes),
            // `0s` turns it off.
            "sink.progress_interval" => {
                Code::Duration(c.sink.progress_interval.unwrap_or(Duration::ZERO))
            }
            "sink.columns.topic" => string(&c.sink.columns.topic),
            "sink.columns.partition" => string(&c.sink.columns.partition),
            "sink.columns.offset" => string(&c.sink.columns.offset),
            "schema_registry.timeout" => Code::Duration(registry().timeout),
            "route.format" => string(route.format.name()),
            "route.subject" => string(
                self.registry.routes[0]
                    .subject
                    .as_deref()
                    .expect("an avro route's subject"),
            ),
            "route.dedup_key" => strings(route.dedup.as_ref().map_or(&[][..], |d| &d.fields)),
            "route.dedup_window" => Code::Duration(dedup().window),
            "route.dedup_max_keys" => int(dedup().max_keys),
            "route.required" => strings(&route.required),
            "route.extra_fields" => string(if route.extra_to_dlq { "dlq" } else { "ignore" }),
            _ => return None,
        })
    }

    /// For a key shown as an example with `no default`: whether the code
    /// leaves it unset when absent. `None` for a key this test cannot read.
    fn unset(&self, path: &str) -> Option<bool> {
        let c = &self.base;
        let tls = self.tls.kafka.security.tls.as_ref()?;
        let registry = self.registry.schema_registry.as_ref()?;
        Some(match path {
            "kafka.instance_id" => c.kafka.instance_id.is_none(),
            "kafka.tls.ca_file" => tls.ca_file.is_none(),
            "kafka.tls.cert_file" => tls.cert_file.is_none(),
            "kafka.tls.key_file" => tls.key_file.is_none(),
            "kafka.tls.key_password" | "kafka.tls.key_password_file" => tls.key_password.is_none(),
            "kafka.sasl.password" => c.kafka.security.sasl.is_none(),
            // Without it (and without `password`) the password is empty.
            "clickhouse.password_file" => c.clickhouse.password.expose().is_empty(),
            "clickhouse.cluster" => c.clickhouse.cluster.is_none(),
            "metrics.listen" => c.metrics_listen.is_none(),
            "dlq.topic" => c.dlq.is_none(),
            "schema_registry.username"
            | "schema_registry.password"
            | "schema_registry.password_file" => registry.auth.is_none(),
            "schema_registry.ca_file" => registry.ca_file.is_none(),
            "schema_registry.cert_file" | "schema_registry.key_file" => registry.identity.is_none(),
            _ => return None,
        })
    }
}

/// Whether the doc's `value` (TOML) is the code's.
fn same(value: &str, code: &Code) -> bool {
    let parsed = match toml::from_str::<toml::Table>(&format!("v = {value}")) {
        Ok(mut t) => t.remove("v"),
        Err(_) => None,
    };
    match (parsed, code) {
        (Some(toml::Value::String(s)), Code::Duration(d)) => {
            humantime::parse_duration(&s).is_ok_and(|x| x == *d)
        }
        (Some(v), Code::Value(c)) => v == *c,
        _ => false,
    }
}

#[test]
fn every_default_the_doc_states_is_the_codes() {
    let loaded = Loaded::new();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for l in lines().iter().filter(|l| !l.is_example()) {
        let Some(code) = loaded.default_of(&l.path) else {
            wrong.push(format!(
                "line {}: {} = {}: a default this test cannot read; add it to `default_of`",
                l.number, l.path, l.value
            ));
            continue;
        };
        checked += 1;
        if !same(&l.value, &code) {
            wrong.push(format!(
                "line {}: the doc says {} = {}, the code's default is {code:?}",
                l.number, l.path, l.value
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/configuration.md:\n{}",
        wrong.join("\n")
    );
    assert!(checked >= 30, "only {checked} defaults found in the doc");
}

#[test]
fn what_the_doc_shows_without_a_default_is_unset() {
    let loaded = Loaded::new();
    let mut wrong = Vec::new();
    for l in lines()
        .iter()
        .filter(|l| l.comment.starts_with("no default"))
    {
        match loaded.unset(&l.path) {
            Some(true) => {}
            Some(false) => wrong.push(format!(
                "{}: set when absent, yet shown with no default",
                l.path
            )),
            None => wrong.push(format!("{}: add it to `unset`", l.path)),
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/configuration.md:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_setting_is_shown_once() {
    let shown: Vec<String> = lines().into_iter().map(|l| l.path).collect();
    let wanted = env::FIELDS
        .iter()
        .map(|(p, _)| *p)
        .chain(OTHER_KEYS.iter().copied());
    let missing: Vec<&str> = wanted.filter(|p| !shown.iter().any(|s| s == p)).collect();
    assert!(
        missing.is_empty(),
        "not in docs/configuration.md: {missing:?}"
    );
    let mut twice = shown.clone();
    twice.sort();
    twice.dedup();
    assert_eq!(twice.len(), shown.len(), "a key shown twice: {shown:?}");
}

#[test]
fn the_annotated_file_loads_as_it_is() {
    load(&annotated());
}

/// Uncommented, every header and key line is one the loader knows
/// (`deny_unknown_fields` refuses the rest).
#[test]
fn every_key_shown_is_a_setting() {
    let text: String = annotated()
        .lines()
        .map(|line| match uncomment(line) {
            Some((text, true)) if header(text).is_some() || key_line(text).is_some() => text,
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    if let Err(e) = RawConfig::from_toml(&text) {
        panic!("{e}\nin:\n{text}");
    }
}

/// The parser itself, on the forms the doc uses.
#[test]
fn key_lines_and_headers_are_read() {
    assert_eq!(header("[kafka.tls]   # x").as_deref(), Some("kafka.tls"));
    assert_eq!(header("[[route]]").as_deref(), Some("route"));
    assert_eq!(header("[not a header"), None);
    let (k, v, c) = key_line(r#"brokers = "a:1#b"   # required (or X)"#).unwrap();
    assert_eq!(
        (k.as_str(), v.as_str(), c.as_str()),
        ("brokers", r#""a:1#b""#, "required (or X)")
    );
    let (_, v, c) = key_line("properties = {}").unwrap();
    assert_eq!((v.as_str(), c.as_str()), ("{}", ""));
    assert_eq!(key_line("every mode refuses x (rows dropped)"), None);
    assert_eq!(
        key_line("timeout_overflow_mode, max_insert_threads = 1"),
        None
    );
    assert_eq!(uncomment("      # continued"), None);
    assert_eq!(
        uncomment("# max_batch_rows = 1"),
        Some(("max_batch_rows = 1", true))
    );
    assert!(same("\"75s\"", &Code::Duration(Duration::from_secs(75))));
    assert!(!same("\"1m\"", &Code::Duration(Duration::from_secs(75))));
    assert!(same("16777216", &int(16 << 20)));
    assert!(!same("\"16777216\"", &int(16 << 20)));
}
