//! A Protobuf message, written under a registry schema → one JSON object
//! whose values ClickHouse reads into typed columns.
//!
//! In: the writer's schema (the registry's text of a `.proto` file, or the
//! base64 of a `FileDescriptorProto` as some clients register it, with the
//! files it imports: [`ProtoSchema::parse`]) and a payload after the schema
//! id ([`ProtoSchema::to_json`]: message indexes, then the message). Out: a
//! JSON object for `JSONEachRow` with `date_time_input_format =
//! 'best_effort'`, mapped as [`crate::avro`] maps Avro:
//!
//! | Protobuf | JSON | ClickHouse column |
//! | --- | --- | --- |
//! | integers, `bool` | as is | `Int*`, `UInt*`, `Bool` |
//! | `float`, `double` | a number; NaN and ±∞ as strings | `Float*` |
//! | `string`, `bytes` | a string (bytes as they are, escaped) | `String` |
//! | enum | the value's name (its number if the schema has none) | `Enum8`, `LowCardinality(String)` |
//! | `google.protobuf.Timestamp` | RFC 3339 in UTC, 9 digits | `DateTime64(3/6/9)` |
//! | `google.protobuf.Duration` | seconds, exactly (`"-1.500000000"`) | `Decimal(18, 9)` |
//! | wrappers (`Int64Value`, …) | the value | `Nullable(T)` |
//! | `repeated`, `map` | an array, an object (keys sorted) | `Array`, `Map` |
//! | a message | an object | `Tuple`, `JSON` |
//!
//! A field with no presence (proto3's plain fields) is always written, its
//! default when unset; a field with presence (`optional`, a message, a
//! `oneof` member, proto2) only when set, so that an unset one takes the
//! column's default (`NULL` for a `Nullable` column).

use crate::wire::{message_indexes, FrameError};
use base64::Engine;
use prost_reflect::{
    DescriptorPool, DynamicMessage, FileDescriptor, Kind, MapKey, MessageDescriptor,
    ReflectMessage, Value,
};
use protox::file::{File, FileResolver, GoogleFileResolver};
use std::collections::HashMap;
use std::io::Write;
use thiserror::Error;

/// Why a Protobuf value cannot become a row.
#[derive(Debug, Error)]
pub enum ProtoError {
    /// The registry's schema (or a file it imports) does not compile.
    #[error("the writer's schema is not a valid Protobuf file: {0}")]
    Schema(String),
    /// The message indexes name no message of the schema.
    #[error("the message indexes {0:?} name no message of the writer's schema")]
    NoMessage(Vec<i32>),
    /// The bytes do not decode under the schema.
    #[error("the payload does not decode under its schema: {0}")]
    Undecodable(String),
    /// A JSON value that does not fit the message ([`ProtoSchema::from_json`]).
    #[error("the value does not fit the message: {0}")]
    Unencodable(String),
}

impl From<FrameError> for ProtoError {
    fn from(e: FrameError) -> Self {
        ProtoError::Undecodable(e.to_string())
    }
}

/// A writer's schema, compiled.
#[derive(Debug, Clone)]
pub struct ProtoSchema {
    file: FileDescriptor,
    plans: direct::Plans,
}

/// The name the schema's own file compiles under when its text does not
/// name one.
const MAIN: &str = "sluice/registry-schema.proto";

/// Files by import name: the schema's own and the ones it references; the
/// well-known types (`google/protobuf/…`) come with the compiler.
struct Files(HashMap<String, File>);

impl FileResolver for Files {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        match self.0.get(name) {
            Some(f) => Ok(f.clone()),
            None => GoogleFileResolver::new().open_file(name),
        }
    }
}

/// One file from the registry's text: `.proto` source, or the base64 of a
/// `FileDescriptorProto`. Returns its name and the file.
fn file(name: &str, text: &str) -> Result<(String, File), ProtoError> {
    let bad = |e: protox::Error| ProtoError::Schema(format!("{name}: {e}"));
    let engine = base64::engine::general_purpose::STANDARD;
    if let Ok(bytes) = engine.decode(text.trim()) {
        if let Ok(f) = File::decode_file_descriptor_proto(bytes.as_slice()) {
            let named = f.name().to_string();
            let named = if named.is_empty() {
                name.to_string()
            } else {
                named
            };
            return Ok((named, f));
        }
    }
    Ok((
        name.to_string(),
        File::from_source(name, text).map_err(bad)?,
    ))
}

impl ProtoSchema {
    /// Compiles the registry's text of a schema with the files it imports
    /// (`(import name, text)`, as the registry's references name them).
    pub fn parse(text: &str, references: &[(&str, &str)]) -> Result<Self, ProtoError> {
        let mut files = HashMap::new();
        for (name, text) in references {
            let (named, f) = file(name, text)?;
            files.insert(named, f);
        }
        let (main, f) = file(MAIN, text)?;
        files.insert(main.clone(), f);
        let mut compiler = protox::Compiler::with_file_resolver(Files(files));
        compiler.include_imports(true);
        compiler
            .open_file(&main)
            .map_err(|e| ProtoError::Schema(e.to_string()))?;
        let pool: DescriptorPool = compiler.descriptor_pool();
        let file = pool
            .get_file_by_name(&main)
            .ok_or_else(|| ProtoError::Schema(format!("{main} is not in the compiled set")))?;
        if file.messages().len() == 0 {
            return Err(ProtoError::Schema("the file defines no message".into()));
        }
        let plans = direct::Plans::compile(&file);
        Ok(ProtoSchema { file, plans })
    }

    /// The ClickHouse columns that hold the fields of the message type at
    /// `path` (`[0]`: the file's first) as [`Self::to_json`] writes them.
    pub fn columns(&self, path: &[i32]) -> Result<Vec<(String, String)>, ProtoError> {
        let m = self.message(path)?;
        Ok(m.fields()
            .map(|f| (f.name().to_string(), field_type(&f, 0)))
            .collect())
    }

    /// The message type the `path` of message indexes names.
    pub fn message(&self, path: &[i32]) -> Result<MessageDescriptor, ProtoError> {
        let missing = || ProtoError::NoMessage(path.to_vec());
        let index = |i: i32| usize::try_from(i).map_err(|_| missing());
        let (first, rest) = path.split_first().ok_or_else(missing)?;
        let mut m = self
            .file
            .messages()
            .nth(index(*first)?)
            .ok_or_else(missing)?;
        for &i in rest {
            let child = m.child_messages().nth(index(i)?);
            m = child.ok_or_else(missing)?;
        }
        Ok(m)
    }

    /// The message indexes of the message type named `name` (its full name,
    /// or its name alone if that is unique in the file); `None`: the first.
    pub fn path_of(&self, name: Option<&str>) -> Result<Vec<i32>, ProtoError> {
        let Some(name) = name else {
            return Ok(vec![0]);
        };
        fn walk(
            messages: impl Iterator<Item = MessageDescriptor>,
            name: &str,
            path: &mut Vec<i32>,
            found: &mut Vec<Vec<i32>>,
        ) {
            for (i, m) in messages.enumerate() {
                path.push(i as i32);
                if m.full_name() == name || m.name() == name {
                    found.push(path.clone());
                }
                walk(m.child_messages(), name, path, found);
                path.pop();
            }
        }
        let mut found = Vec::new();
        walk(self.file.messages(), name, &mut Vec::new(), &mut found);
        match found.len() {
            1 => Ok(found.remove(0)),
            0 => Err(ProtoError::Schema(format!("no message named {name:?}"))),
            n => Err(ProtoError::Schema(format!(
                "{n} messages are named {name:?}: give the full name"
            ))),
        }
    }

    /// Encodes a JSON object (Protobuf's JSON mapping) as a payload of the
    /// message type at `path`: the message indexes, then the message (for
    /// producers: `sluice send`).
    pub fn from_json(&self, path: &[i32], text: &str) -> Result<Vec<u8>, ProtoError> {
        use prost_reflect::prost::Message as _;
        let desc = self.message(path)?;
        let mut de = serde_json::Deserializer::from_str(text);
        let msg = DynamicMessage::deserialize(desc, &mut de)
            .and_then(|m| de.end().map(|_| m))
            .map_err(|e| ProtoError::Unencodable(e.to_string()))?;
        let mut out = Vec::new();
        crate::wire::write_message_indexes(path, &mut out);
        msg.encode(&mut out)
            .map_err(|e| ProtoError::Unencodable(e.to_string()))?;
        Ok(out)
    }

    /// Decodes `payload` (the message indexes, then the message) and
    /// appends it to `out` as one JSON object.
    /// The row is at most about `limit` bytes: writing stops past it (a
    /// repeated message of many fields without presence writes them all,
    /// set or not, from two bytes a message).
    pub fn to_json(
        &self,
        payload: &[u8],
        out: &mut Vec<u8>,
        limit: usize,
    ) -> Result<(), ProtoError> {
        let (path, bytes) = message_indexes(payload)?;
        if self.plans.write(&path, bytes, out, limit).is_some() {
            return Ok(());
        }
        self.slow_json(&path, bytes, out, limit)
    }

    /// [`Self::to_json`] through a `DynamicMessage`: the reference the
    /// direct path is held to, and the one that decides what it leaves.
    fn slow_json(
        &self,
        path: &[i32],
        bytes: &[u8],
        out: &mut Vec<u8>,
        limit: usize,
    ) -> Result<(), ProtoError> {
        let desc = self.message(path)?;
        let msg = DynamicMessage::decode(desc, bytes)
            .map_err(|e| ProtoError::Undecodable(e.to_string()))?;
        let start = out.len();
        let end = start.saturating_add(limit);
        let written = Json { out, end }.message(&msg);
        if written.is_err() {
            out.truncate(start);
        }
        written
    }
}

/// Writes messages as JSON.
struct Json<'a> {
    out: &'a mut Vec<u8>,
    /// Where `out` may end.
    end: usize,
}

impl Json<'_> {
    fn message(&mut self, msg: &DynamicMessage) -> Result<(), ProtoError> {
        let desc = msg.descriptor();
        match well_known(&desc) {
            Some(WellKnown::Timestamp) => return self.timestamp(msg),
            Some(WellKnown::Duration) => return self.duration(msg),
            None => {}
        }
        if let Some(field) = wrapped(&desc) {
            return self.value(&msg.get_field(&field), &field.kind());
        }
        self.out.push(b'{');
        let mut first = true;
        for field in desc.fields() {
            if field.supports_presence() && !msg.has_field(&field) {
                continue;
            }
            if !std::mem::take(&mut first) {
                self.out.push(b',');
            }
            self.string(field.name().as_bytes());
            self.out.push(b':');
            self.value(&msg.get_field(&field), &field.kind())?;
        }
        self.out.push(b'}');
        Ok(())
    }

    fn value(&mut self, v: &Value, kind: &Kind) -> Result<(), ProtoError> {
        if self.out.len() > self.end {
            return Err(ProtoError::Undecodable(
                "the row would be larger than a row may be".into(),
            ));
        }
        match v {
            Value::Bool(b) => self
                .out
                .extend_from_slice(if *b { b"true" } else { b"false" }),
            Value::I32(n) => self.display(n),
            Value::I64(n) => self.display(n),
            Value::U32(n) => self.display(n),
            Value::U64(n) => self.display(n),
            Value::F32(x) => crate::json_text::f32(self.out, *x),
            Value::F64(x) => crate::json_text::f64(self.out, *x),
            Value::String(s) => self.string(s.as_bytes()),
            Value::Bytes(b) => self.string(b),
            Value::EnumNumber(n) => match kind {
                Kind::Enum(e) => match e.get_value(*n) {
                    Some(v) => self.string(v.name().as_bytes()),
                    None => self.display(n),
                },
                _ => self.display(n),
            },
            Value::Message(m) => self.message(m)?,
            Value::List(items) => {
                self.out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.out.push(b',');
                    }
                    self.value(item, kind)?;
                }
                self.out.push(b']');
            }
            Value::Map(entries) => {
                let value_kind = match kind {
                    Kind::Message(entry) => entry.map_entry_value_field().kind(),
                    other => other.clone(),
                };
                let mut entries: Vec<_> = entries.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                self.out.push(b'{');
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        self.out.push(b',');
                    }
                    match k {
                        MapKey::String(s) => self.string(s.as_bytes()),
                        MapKey::Bool(b) => self.quoted(b),
                        MapKey::I32(n) => self.quoted(n),
                        MapKey::I64(n) => self.quoted(n),
                        MapKey::U32(n) => self.quoted(n),
                        MapKey::U64(n) => self.quoted(n),
                    }
                    self.out.push(b':');
                    self.value(v, &value_kind)?;
                }
                self.out.push(b'}');
            }
        }
        Ok(())
    }

    /// `google.protobuf.Timestamp` as RFC 3339 in UTC with 9 digits.
    fn timestamp(&mut self, msg: &DynamicMessage) -> Result<(), ProtoError> {
        let (secs, nanos) = seconds_and_nanos(msg, WellKnown::Timestamp)?;
        if crate::json_text::datetime(self.out, secs, nanos as u64, 9, true) {
            Ok(())
        } else {
            Err(ProtoError::Undecodable(format!(
                "timestamp {secs} s is out of any calendar's range"
            )))
        }
    }

    /// `google.protobuf.Duration` as exact seconds.
    fn duration(&mut self, msg: &DynamicMessage) -> Result<(), ProtoError> {
        let (secs, nanos) = seconds_and_nanos(msg, WellKnown::Duration)?;
        duration_text(self.out, secs, nanos);
        Ok(())
    }

    fn display(&mut self, v: impl std::fmt::Display) {
        write!(self.out, "{v}").expect("writing to a Vec");
    }

    fn quoted(&mut self, v: impl std::fmt::Display) {
        write!(self.out, "\"{v}\"").expect("writing to a Vec");
    }

    /// A JSON string of `bytes`, as [`crate::avro`] writes one.
    fn string(&mut self, bytes: &[u8]) {
        crate::json_text::string(self.out, bytes);
    }
}

/// A Duration of `secs` and `nanos` (checked) as its exact seconds, quoted.
fn duration_text(out: &mut Vec<u8>, secs: i64, nanos: i32) {
    // Seconds and nanos share a sign; -0.5 s is (0, -500000000).
    if secs < 0 || nanos < 0 {
        out.extend_from_slice(b"\"-");
    } else {
        out.push(b'"');
    }
    crate::json_text::int(out, secs.unsigned_abs());
    out.push(b'.');
    crate::json_text::digits(out, u64::from(nanos.unsigned_abs()), 9);
    out.push(b'"');
}

/// The ClickHouse type of `field` as the module writes it: `Nullable` where
/// the field has presence (unset is left out, so the column's default,
/// `NULL`, applies) and ClickHouse allows it.
fn field_type(field: &prost_reflect::FieldDescriptor, depth: usize) -> String {
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            return "String".into();
        };
        let key = kind_type(&entry.map_entry_key_field().kind(), depth + 1);
        let value = kind_type(&entry.map_entry_value_field().kind(), depth + 1);
        return format!("Map({key}, {value})");
    }
    let t = kind_type(&field.kind(), depth);
    if field.is_list() {
        return format!("Array({t})");
    }
    let composite = ["Array(", "Map(", "Tuple(", "Nullable("]
        .iter()
        .any(|p| t.starts_with(p));
    if field.supports_presence() && !composite {
        format!("Nullable({t})")
    } else {
        t
    }
}

fn kind_type(kind: &Kind, depth: usize) -> String {
    match kind {
        Kind::Double => "Float64".into(),
        Kind::Float => "Float32".into(),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => "Int32".into(),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => "Int64".into(),
        Kind::Uint32 | Kind::Fixed32 => "UInt32".into(),
        Kind::Uint64 | Kind::Fixed64 => "UInt64".into(),
        Kind::Bool => "Bool".into(),
        Kind::String | Kind::Bytes => "String".into(),
        Kind::Enum(e) => {
            let values: Vec<(String, i32)> = e
                .values()
                .map(|v| (v.name().to_string(), v.number()))
                .collect();
            let fits = |lo: i32, hi: i32| values.iter().all(|(_, n)| (lo..=hi).contains(n));
            let list = || {
                values
                    .iter()
                    .map(|(name, n)| format!("'{name}' = {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            if fits(-128, 127) {
                format!("Enum8({})", list())
            } else if fits(-32768, 32767) {
                format!("Enum16({})", list())
            } else {
                "LowCardinality(String)".into()
            }
        }
        Kind::Message(m) => match (well_known(m), wrapped(m)) {
            (Some(WellKnown::Timestamp), _) => "DateTime64(9, 'UTC')".into(),
            (Some(WellKnown::Duration), _) => "Decimal(38, 9)".into(),
            (_, Some(field)) => format!("Nullable({})", kind_type(&field.kind(), depth)),
            // ClickHouse has no recursive type.
            _ if depth > 16 => "String".into(),
            _ => {
                let fields: Vec<String> = m
                    .fields()
                    .map(|f| format!("`{}` {}", f.name(), field_type(&f, depth + 1)))
                    .collect();
                format!("Tuple({})", fields.join(", "))
            }
        },
    }
}

/// The field holding the value of a wrapper type (`Int64Value`, …): field
/// 1 of one of them, of the kind `google/protobuf/wrappers.proto` gives it.
/// A message that only takes a wrapper's name is a message like any other.
fn wrapped(m: &MessageDescriptor) -> Option<prost_reflect::FieldDescriptor> {
    let field = m.get_field(1)?;
    let kind = match m.full_name() {
        "google.protobuf.DoubleValue" => Kind::Double,
        "google.protobuf.FloatValue" => Kind::Float,
        "google.protobuf.Int64Value" => Kind::Int64,
        "google.protobuf.UInt64Value" => Kind::Uint64,
        "google.protobuf.Int32Value" => Kind::Int32,
        "google.protobuf.UInt32Value" => Kind::Uint32,
        "google.protobuf.BoolValue" => Kind::Bool,
        "google.protobuf.StringValue" => Kind::String,
        "google.protobuf.BytesValue" => Kind::Bytes,
        _ => return None,
    };
    let plain = m.fields().len() == 1 && field.name() == "value";
    (plain && field.kind() == kind && !field.is_list() && !field.is_map()).then_some(field)
}

/// The well-known types written as one value rather than an object.
#[derive(Debug, Clone, Copy, PartialEq)]
enum WellKnown {
    Timestamp,
    Duration,
}

/// Whether `m` is `google.protobuf.Timestamp` or `Duration` as
/// `google/protobuf/*.proto` define them (`int64 seconds = 1; int32 nanos =
/// 2;`). A message that only takes the name is a message like any other.
fn well_known(m: &MessageDescriptor) -> Option<WellKnown> {
    let which = match m.full_name() {
        "google.protobuf.Timestamp" => WellKnown::Timestamp,
        "google.protobuf.Duration" => WellKnown::Duration,
        _ => return None,
    };
    let is = |n: u32, name: &str, kind: Kind| {
        m.get_field(n)
            .is_some_and(|f| f.name() == name && f.kind() == kind && !f.is_list() && !f.is_map())
    };
    (m.fields().len() == 2 && is(1, "seconds", Kind::Int64) && is(2, "nanos", Kind::Int32))
        .then_some(which)
}

/// A Timestamp's or a Duration's `seconds` and `nanos`, checked
/// ([`nanos_fit`]).
fn seconds_and_nanos(msg: &DynamicMessage, which: WellKnown) -> Result<(i64, i32), ProtoError> {
    let secs = msg.get_field_by_name("seconds").and_then(|v| v.as_i64());
    let nanos = msg.get_field_by_name("nanos").and_then(|v| v.as_i32());
    match (secs, nanos) {
        (Some(s), Some(n)) if nanos_fit(which, s, n) => Ok((s, n)),
        (Some(s), Some(n)) => Err(ProtoError::Undecodable(format!(
            "a {which:?} of {s} s and {n} ns: protobuf's rules want nanos within a second{}",
            match which {
                WellKnown::Timestamp => ", not negative",
                WellKnown::Duration => ", of the seconds' sign",
            }
        ))),
        _ => Err(ProtoError::Undecodable(format!(
            "{} lacks its seconds or nanos",
            msg.descriptor().full_name()
        ))),
    }
}

/// Whether `nanos` fit `secs` as protobuf's rules want: a Timestamp's count
/// forward within the second; a Duration's are within a second and of the
/// seconds' sign (-0.5 s is 0 s and -500,000,000 ns).
fn nanos_fit(which: WellKnown, secs: i64, nanos: i32) -> bool {
    match which {
        WellKnown::Timestamp => (0..=999_999_999).contains(&nanos),
        WellKnown::Duration => {
            (-999_999_999..=999_999_999).contains(&nanos)
                && !(secs > 0 && nanos < 0 || secs < 0 && nanos > 0)
        }
    }
}

mod direct;
#[cfg(test)]
mod tests;
