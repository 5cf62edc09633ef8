//! An Avro record, written under a registry schema → one JSON object whose
//! values ClickHouse reads into typed columns.
//!
//! In: the writer's schema (the registry's text for an id, with the schemas
//! it references: [`AvroSchema::parse`]) and a payload ([`AvroSchema::to_json`],
//! after [`crate::wire::frame`]). Out: a JSON object, one key per field of
//! the record, written for `JSONEachRow` with `date_time_input_format =
//! 'best_effort'`:
//!
//! | Avro | JSON | ClickHouse column |
//! | --- | --- | --- |
//! | `null`, `boolean`, `int`, `long` | as is | `Nullable(…)`, `Bool`, `Int*` |
//! | `float`, `double` | a number; NaN and ±∞ as `"nan"`, `"inf"`, `"-inf"` | `Float*` |
//! | `string`, `bytes`, `fixed` | a string (bytes as they are, escaped) | `String`, `FixedString` |
//! | `decimal` | the exact decimal, quoted (`"-12.50"`) | `Decimal(P, S)` |
//! | `uuid` | its text | `UUID` |
//! | `date` | `"YYYY-MM-DD"` | `Date32`, `Date` |
//! | `timestamp-millis/-micros/-nanos` | RFC 3339 in UTC, 3/6/9 digits | `DateTime64(3/6/9)` |
//! | `local-timestamp-*` | the same without `Z` (the column's time zone) | `DateTime64` |
//! | `time-millis/-micros` | `"hh:mm:ss.fff[fff]"` | `Time64(3/6)` |
//! | `enum` | the symbol | `Enum8`, `LowCardinality(String)` |
//! | `["null", T]` | `null` or T | `Nullable(T)` |
//! | `array`, `map`, `record` | an array, an object (keys sorted), an object | `Array`, `Map`, `Tuple` / `JSON` |
//! | `duration` | `[months, days, millis]` | `Tuple(UInt32, UInt32, UInt32)` |
//!
//! Nothing passes through floating point that was not a float, and no value
//! is rounded: what ClickHouse cannot hold (a decimal out of its column's
//! range, a date out of `Date32`'s) it rejects, and the row goes to the DLQ.

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::schema::{NamesRef, ResolvedSchema};
use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::Schema;
use num_bigint::BigInt;
use std::io::Write;
use thiserror::Error;

/// Why an Avro value cannot become a row.
#[derive(Debug, Error)]
pub enum AvroError {
    /// The registry's schema (or one it references) does not parse.
    #[error("the writer's schema is not a valid Avro schema: {0}")]
    Schema(String),
    /// The schema is valid, but not a record's: a row needs named fields.
    #[error("the writer's schema is a {0}, not a record: a row needs named fields")]
    NotRecord(String),
    /// The bytes do not decode under the schema.
    #[error("the payload does not decode under its schema: {0}")]
    Undecodable(String),
    /// A JSON value that does not fit the schema ([`AvroSchema::from_json`]).
    #[error("the value does not fit the schema: {0}")]
    Unencodable(String),
}

/// The parsed schemas, owned; the reader and the names borrow them.
struct Schemas {
    root: Schema,
    referenced: Vec<Schema>,
}

/// What decoding and encoding need, built once per schema id.
struct Reader<'a> {
    datum: GenericDatumReader<'a>,
    writer: GenericDatumWriter<'a>,
    names: ResolvedSchema<'a>,
}

self_cell::self_cell!(
    struct Parsed {
        owner: Schemas,
        #[covariant]
        dependent: Reader,
    }
);

/// A writer's schema, ready to decode payloads written with it.
pub struct AvroSchema(Parsed);

impl std::fmt::Debug for AvroSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AvroSchema")
            .field(&self.0.borrow_owner().root.name())
            .finish()
    }
}

impl AvroSchema {
    /// Parses the registry's text of a schema and of the schemas it
    /// references (named types defined elsewhere), in any order.
    pub fn parse(text: &str, references: &[&str]) -> Result<Self, AvroError> {
        let bad = |e: apache_avro::Error| AvroError::Schema(e.to_string());
        let (root, referenced) = if references.is_empty() {
            (Schema::parse_str(text).map_err(bad)?, Vec::new())
        } else {
            Schema::parse_str_with_list(text, references).map_err(bad)?
        };
        if !matches!(root, Schema::Record(_)) {
            let kind = format!("{:?}", apache_avro::schema::SchemaKind::from(&root));
            return Err(AvroError::NotRecord(kind.to_lowercase()));
        }
        let parsed = Parsed::try_new(Schemas { root, referenced }, |s| {
            // What is referenced first, so that the root's references resolve.
            let all = s
                .referenced
                .iter()
                .chain(std::iter::once(&s.root))
                .collect();
            let names = ResolvedSchema::new_with_schemata(all).map_err(bad)?;
            bounded(&s.root, names.get_names(), &mut Vec::new()).map_err(AvroError::Schema)?;
            let datum = GenericDatumReader::builder(&s.root)
                .resolved_writer_schemata(names.clone())
                .build()
                .map_err(bad)?;
            let writer = GenericDatumWriter::builder(&s.root)
                .resolved_schemata(names.clone())
                .build()
                .map_err(bad)?;
            Ok::<_, AvroError>(Reader {
                datum,
                writer,
                names,
            })
        })?;
        Ok(AvroSchema(parsed))
    }

    /// The ClickHouse columns that hold this record's fields as
    /// [`Self::to_json`] writes them: `(name, type)` in field order.
    pub fn columns(&self) -> Vec<(String, String)> {
        let (schemas, reader) = (self.0.borrow_owner(), self.0.borrow_dependent());
        let names = reader.names.get_names();
        let Schema::Record(r) = &schemas.root else {
            return Vec::new();
        };
        r.fields
            .iter()
            .map(|f| (f.name.clone(), column_type(&f.schema, names, 0)))
            .collect()
    }

    /// Decodes `payload` and appends it to `out` as one JSON object. Bytes
    /// left over after the record mean it was not written with this schema.
    pub fn to_json(&self, payload: &[u8], out: &mut Vec<u8>) -> Result<(), AvroError> {
        let undecodable = |e: apache_avro::Error| AvroError::Undecodable(e.to_string());
        let mut input = Tracked {
            rest: payload,
            past_end: false,
        };
        let (schemas, reader) = (self.0.borrow_owner(), self.0.borrow_dependent());
        let value = reader.datum.read_value(&mut input).map_err(undecodable)?;
        // apache-avro answers some fields cut short by the end of the
        // payload (a string, a boolean, a union's branch) with a null.
        if input.past_end {
            return Err(AvroError::Undecodable(
                "the payload ends inside the record".into(),
            ));
        }
        if !input.rest.is_empty() {
            return Err(AvroError::Undecodable(format!(
                "{} bytes are left after the record",
                input.rest.len()
            )));
        }
        let start = out.len();
        let names = reader.names.get_names();
        let written = Json { names, out }.value(value, &schemas.root);
        if written.is_err() {
            out.truncate(start);
        }
        written
    }
}

impl AvroSchema {
    /// Encodes a JSON object as a payload written with this schema (for
    /// producers: `sluice send`). JSON values take the schema's types by
    /// Avro's resolution rules: a number for an `int`, a `long` or a
    /// `timestamp-millis` (in its unit), a string for an enum or a `uuid`,
    /// a union's branch by the value's type, a missing field its default.
    pub fn from_json(&self, text: &str) -> Result<Vec<u8>, AvroError> {
        let bad = |e: apache_avro::Error| AvroError::Unencodable(e.to_string());
        let json: serde_json::Value =
            serde_json::from_str(text).map_err(|e| AvroError::Unencodable(e.to_string()))?;
        let (schemas, reader) = (self.0.borrow_owner(), self.0.borrow_dependent());
        let value = Value::try_from(json)
            .and_then(|v| v.resolve_with_names(&schemas.root, reader.names.get_names()))
            .map_err(bad)?;
        reader.writer.write_value_to_vec(value).map_err(bad)
    }
}

/// Bounds what one length read from a payload may allocate, for the whole
/// process (apache-avro takes the first bound it is given).
pub fn limit_allocations(bytes: usize) {
    apache_avro::util::max_allocation_bytes(bytes);
}

/// The payload as the decoder reads it, noting any read past its end: a
/// whole record never needs one.
struct Tracked<'a> {
    rest: &'a [u8],
    past_end: bool,
}

impl std::io::Read for Tracked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.len() > self.rest.len() {
            self.past_end = true;
        }
        self.rest.read(buf)
    }
}

/// Writes values as JSON, led by their schema.
struct Json<'a, 's> {
    names: &'a NamesRef<'s>,
    out: &'a mut Vec<u8>,
}

impl<'s> Json<'_, 's> {
    fn value(&mut self, value: Value, schema: &'s Schema) -> Result<(), AvroError> {
        let schema = self.resolve(schema)?;
        match (value, schema) {
            (Value::Union(i, v), Schema::Union(u)) => {
                let variant = u.variants().get(i as usize).ok_or_else(|| {
                    AvroError::Undecodable(format!("union branch {i} does not exist"))
                })?;
                self.value(*v, variant)
            }
            (Value::Union(_, v), s) => self.value(*v, s),
            (Value::Null, Schema::Null) => self.raw(b"null"),
            // apache-avro answers a string or a boolean cut short by the
            // end of the payload with a null.
            (Value::Null, _) => Err(AvroError::Undecodable(
                "the payload ends inside a field".into(),
            )),
            (Value::Boolean(b), _) => self.raw(if b { b"true" } else { b"false" }),
            (Value::Int(n), _) => self.display(n),
            (Value::Long(n), _) => self.display(n),
            (Value::Float(x), _) => self.float(f64::from(x), x.is_finite().then(|| x.to_string())),
            (Value::Double(x), _) => self.float(x, x.is_finite().then(|| format!("{x:?}"))),
            (Value::String(s), _) => self.string(s.as_bytes()),
            (Value::Bytes(b) | Value::Fixed(_, b), _) => self.string(&b),
            (Value::Enum(_, symbol), _) => self.string(symbol.as_bytes()),
            (Value::Uuid(u), _) => self.quoted(u),
            (Value::Decimal(d), Schema::Decimal(ds)) => {
                let text = decimal(&BigInt::from(d), ds.scale);
                self.quoted(text)
            }
            (Value::Decimal(_), other) => Err(AvroError::Undecodable(format!(
                "a decimal under a {other:?} schema"
            ))),
            (Value::BigDecimal(d), _) => self.quoted(d),
            (Value::Date(days), _) => self.quoted(date(days)?),
            (Value::TimestampMillis(t), _) => self.time(t, 1_000, 3, true),
            (Value::TimestampMicros(t), _) => self.time(t, 1_000_000, 6, true),
            (Value::TimestampNanos(t), _) => self.time(t, 1_000_000_000, 9, true),
            (Value::LocalTimestampMillis(t), _) => self.time(t, 1_000, 3, false),
            (Value::LocalTimestampMicros(t), _) => self.time(t, 1_000_000, 6, false),
            (Value::LocalTimestampNanos(t), _) => self.time(t, 1_000_000_000, 9, false),
            (Value::TimeMillis(t), _) => self.quoted(time_of_day(i64::from(t), 1_000, 3)?),
            (Value::TimeMicros(t), _) => self.quoted(time_of_day(t, 1_000_000, 6)?),
            (Value::Duration(d), _) => {
                let (m, dd, ms) = (
                    u32::from(d.months()),
                    u32::from(d.days()),
                    u32::from(d.millis()),
                );
                self.raw(format!("[{m},{dd},{ms}]").as_bytes())
            }
            (Value::Array(items), Schema::Array(a)) => {
                self.raw(b"[")?;
                for (i, v) in items.into_iter().enumerate() {
                    if i > 0 {
                        self.raw(b",")?;
                    }
                    self.value(v, &a.items)?;
                }
                self.raw(b"]")
            }
            (Value::Map(entries), Schema::Map(m)) => {
                let mut entries: Vec<_> = entries.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                self.raw(b"{")?;
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        self.raw(b",")?;
                    }
                    self.string(k.as_bytes())?;
                    self.raw(b":")?;
                    self.value(v, &m.types)?;
                }
                self.raw(b"}")
            }
            (Value::Record(fields), Schema::Record(r)) => {
                self.raw(b"{")?;
                for (i, ((name, v), f)) in fields.into_iter().zip(&r.fields).enumerate() {
                    if i > 0 {
                        self.raw(b",")?;
                    }
                    self.string(name.as_bytes())?;
                    self.raw(b":")?;
                    self.value(v, &f.schema)?;
                }
                self.raw(b"}")
            }
            (v, s) => Err(AvroError::Undecodable(format!(
                "a {:?} value under a {:?} schema",
                apache_avro::schema::SchemaKind::from(&v),
                apache_avro::schema::SchemaKind::from(s)
            ))),
        }
    }

    /// A named reference, followed to its definition.
    fn resolve(&self, schema: &'s Schema) -> Result<&'s Schema, AvroError> {
        match schema {
            Schema::Ref { name } => {
                self.names.get(name).copied().ok_or_else(|| {
                    AvroError::Schema(format!("{name} is referenced but not defined"))
                })
            }
            s => Ok(s),
        }
    }

    fn raw(&mut self, b: &[u8]) -> Result<(), AvroError> {
        self.out.extend_from_slice(b);
        Ok(())
    }

    fn display(&mut self, v: impl std::fmt::Display) -> Result<(), AvroError> {
        write!(self.out, "{v}").map_err(|e| AvroError::Undecodable(e.to_string()))
    }

    fn quoted(&mut self, v: impl std::fmt::Display) -> Result<(), AvroError> {
        write!(self.out, "\"{v}\"").map_err(|e| AvroError::Undecodable(e.to_string()))
    }

    fn float(&mut self, x: f64, finite: Option<String>) -> Result<(), AvroError> {
        crate::json_text::float(self.out, x, finite);
        Ok(())
    }

    fn string(&mut self, bytes: &[u8]) -> Result<(), AvroError> {
        crate::json_text::string(self.out, bytes);
        Ok(())
    }

    /// `t` units of `1/per` second since the epoch, as RFC 3339 with
    /// `digits` fractional digits (in UTC with `Z`, or as wall-clock time).
    fn time(&mut self, t: i64, per: i64, digits: usize, utc: bool) -> Result<(), AvroError> {
        let (secs, frac) = (t.div_euclid(per), t.rem_euclid(per));
        let at = chrono::DateTime::from_timestamp(secs, 0).ok_or_else(|| {
            AvroError::Undecodable(format!("timestamp {t} is out of any calendar's range"))
        })?;
        let zone = if utc { "Z" } else { "" };
        let date = at.format(if utc {
            "%Y-%m-%dT%H:%M:%S"
        } else {
            "%Y-%m-%d %H:%M:%S"
        });
        self.quoted(format!("{date}.{frac:0digits$}{zone}"))
    }
}

/// The ClickHouse type of a value of `schema`, as the module writes it.
/// Named types nested deeper than a few levels (a recursive schema) become
/// `String`: ClickHouse has no recursive type.
/// Checks that decoding a payload written with `schema` costs what the
/// payload's size allows: no named type contains itself (the decoder
/// recurses once per level, and a few hundred bytes would exhaust the
/// stack), and no array holds items that take no bytes (a count of a few
/// bytes could claim billions of them). `open`: the records being checked.
fn bounded<'s>(
    schema: &'s Schema,
    names: &NamesRef<'s>,
    open: &mut Vec<&'s apache_avro::schema::Name>,
) -> Result<(), String> {
    match schema {
        Schema::Ref { name } if open.contains(&name) => Err(format!(
            "{name} contains itself: a row cannot hold a recursive type"
        )),
        Schema::Ref { name } => match names.get(name) {
            Some(s) => bounded(s, names, open),
            None => Err(format!("{name} is referenced but not defined")),
        },
        Schema::Record(r) => {
            open.push(&r.name);
            for f in &r.fields {
                bounded(&f.schema, names, open)?;
            }
            open.pop();
            Ok(())
        }
        Schema::Array(a) if takes_no_bytes(&a.items, names, 0) => Err(
            "an array's items take no bytes (null, an empty record or fixed):              a record could claim any number of them"
                .into(),
        ),
        Schema::Array(a) => bounded(&a.items, names, open),
        Schema::Map(m) => bounded(&m.types, names, open),
        Schema::Union(u) => u.variants().iter().try_for_each(|v| bounded(v, names, open)),
        _ => Ok(()),
    }
}

/// Whether a value of `schema` is written in no bytes at all.
fn takes_no_bytes(schema: &Schema, names: &NamesRef<'_>, depth: usize) -> bool {
    match schema {
        Schema::Null => true,
        Schema::Fixed(f) => f.size == 0,
        Schema::Record(r) if depth < 32 => r
            .fields
            .iter()
            .all(|f| takes_no_bytes(&f.schema, names, depth + 1)),
        Schema::Ref { name } if depth < 32 => names
            .get(name)
            .is_some_and(|s| takes_no_bytes(s, names, depth + 1)),
        _ => false,
    }
}

fn column_type(schema: &Schema, names: &NamesRef<'_>, depth: usize) -> String {
    if depth > 16 {
        return "String".into();
    }
    let inner = |s: &Schema| column_type(s, names, depth + 1);
    match schema {
        Schema::Null => "Nullable(Nothing)".into(),
        Schema::Boolean => "Bool".into(),
        Schema::Int => "Int32".into(),
        Schema::Long => "Int64".into(),
        Schema::Float => "Float32".into(),
        Schema::Double => "Float64".into(),
        Schema::Bytes | Schema::String => "String".into(),
        Schema::Fixed(f) => format!("FixedString({})", f.size),
        Schema::Decimal(d) if d.precision <= 76 => format!("Decimal({}, {})", d.precision, d.scale),
        Schema::Decimal(_) | Schema::BigDecimal => "String".into(),
        Schema::Uuid(_) => "UUID".into(),
        Schema::Date => "Date32".into(),
        Schema::TimeMillis => "Time64(3)".into(),
        Schema::TimeMicros => "Time64(6)".into(),
        Schema::TimestampMillis => "DateTime64(3, 'UTC')".into(),
        Schema::TimestampMicros => "DateTime64(6, 'UTC')".into(),
        Schema::TimestampNanos => "DateTime64(9, 'UTC')".into(),
        Schema::LocalTimestampMillis => "DateTime64(3)".into(),
        Schema::LocalTimestampMicros => "DateTime64(6)".into(),
        Schema::LocalTimestampNanos => "DateTime64(9)".into(),
        Schema::Duration(_) => "Tuple(months UInt32, days UInt32, millis UInt32)".into(),
        Schema::Enum(e) if e.symbols.len() <= 127 => {
            let values: Vec<String> = e
                .symbols
                .iter()
                .enumerate()
                .map(|(i, s)| format!("'{}' = {i}", s.replace('\\', "\\\\").replace('\'', "\\'")))
                .collect();
            format!("Enum8({})", values.join(", "))
        }
        Schema::Enum(_) => "LowCardinality(String)".into(),
        Schema::Array(a) => format!("Array({})", inner(&a.items)),
        Schema::Map(m) => format!("Map(String, {})", inner(&m.types)),
        Schema::Record(r) => {
            let fields: Vec<String> = r
                .fields
                .iter()
                .map(|f| format!("{} {}", quote_ident(&f.name), inner(&f.schema)))
                .collect();
            format!("Tuple({})", fields.join(", "))
        }
        Schema::Union(u) => {
            let non_null: Vec<&Schema> = u
                .variants()
                .iter()
                .filter(|v| !matches!(v, Schema::Null))
                .collect();
            let nullable = non_null.len() < u.variants().len();
            match non_null.as_slice() {
                [one] => {
                    let t = inner(one);
                    // Only scalars can be Nullable in ClickHouse: a null
                    // array, map or tuple takes the column's default.
                    let composite = ["Array(", "Map(", "Tuple(", "Nullable("]
                        .iter()
                        .any(|p| t.starts_with(p));
                    if nullable && !composite {
                        format!("Nullable({t})")
                    } else {
                        t
                    }
                }
                // A union of several types: its JSON differs by branch.
                _ => "String".into(),
            }
        }
        Schema::Ref { name } => match names.get(name) {
            Some(s) => column_type(s, names, depth + 1),
            None => "String".into(),
        },
    }
}

/// A name as a ClickHouse identifier, back-quoted.
fn quote_ident(name: &str) -> String {
    format!("`{}`", name.replace('\\', "\\\\").replace('`', "\\`"))
}

/// The decimal `unscaled × 10^-scale`, exactly.
fn decimal(unscaled: &BigInt, scale: usize) -> String {
    let digits = unscaled.magnitude().to_string();
    let sign = if unscaled.sign() == num_bigint::Sign::Minus {
        "-"
    } else {
        ""
    };
    if scale == 0 {
        return format!("{sign}{digits}");
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

/// Days since the epoch as `YYYY-MM-DD`.
fn date(days: i32) -> Result<String, AvroError> {
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("a valid date");
    epoch
        .checked_add_signed(chrono::TimeDelta::days(i64::from(days)))
        .map(|d| d.format("%Y-%m-%d").to_string())
        .ok_or_else(|| {
            AvroError::Undecodable(format!("date {days} is out of any calendar's range"))
        })
}

/// `t` units of `1/per` second after midnight as `hh:mm:ss.f…`.
fn time_of_day(t: i64, per: i64, digits: usize) -> Result<String, AvroError> {
    if !(0..86_400 * per).contains(&t) {
        return Err(AvroError::Undecodable(format!(
            "time of day {t} is not within a day"
        )));
    }
    let (secs, frac) = (t / per, t % per);
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    Ok(format!("{h:02}:{m:02}:{s:02}.{frac:0digits$}"))
}

#[cfg(test)]
mod tests;
