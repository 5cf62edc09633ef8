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
//! The payload is read straight into the row, led by the schema, without a
//! value tree in between; a schema whose payloads could cost more than
//! their size to read (a recursive type, an array of items that take no
//! bytes) is refused when parsed. Nothing passes through floating point
//! that was not a float, and no value is rounded: what ClickHouse cannot hold (a decimal out of its column's
//! range, a date out of `Date32`'s) it rejects, and the row goes to the DLQ.

use apache_avro::schema::{NamesRef, ResolvedSchema};
use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::Schema;
use num_bigint::BigInt;
use std::collections::HashMap;
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
            bounded(&s.root, names.get_names()).map_err(AvroError::Schema)?;
            let writer = GenericDatumWriter::builder(&s.root)
                .resolved_schemata(names.clone())
                .build()
                .map_err(bad)?;
            Ok::<_, AvroError>(Reader { writer, names })
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

    /// Decodes `payload` and appends it to `out` as one JSON object,
    /// straight from the bytes, led by the schema (no value tree), of at
    /// most about `limit` bytes (decoding stops past it). Bytes left over
    /// after the record mean it was not written with this schema.
    pub fn to_json(
        &self,
        payload: &[u8],
        out: &mut Vec<u8>,
        limit: usize,
    ) -> Result<(), AvroError> {
        let (schemas, reader) = (self.0.borrow_owner(), self.0.borrow_dependent());
        let start = out.len();
        let mut json = Json {
            names: reader.names.get_names(),
            input: payload,
            end: start.saturating_add(limit),
            depth: 0,
            out,
        };
        let mut written = json.value(&schemas.root);
        if written.is_ok() && !json.input.is_empty() {
            written = Err(AvroError::Undecodable(format!(
                "{} bytes are left after the record",
                json.input.len()
            )));
        }
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
        let names = reader.names.get_names();
        if let Some(field) = unknown_field(&json, &schemas.root, names, 0) {
            // Avro's resolution would drop it without a word.
            return Err(AvroError::Unencodable(format!(
                "the schema has no field {field:?}"
            )));
        }
        let value = Value::try_from(json)
            .and_then(|v| v.resolve_with_names(&schemas.root, reader.names.get_names()))
            .map_err(bad)?;
        reader.writer.write_value_to_vec(value).map_err(bad)
    }
}

/// The first key of `json` (or of an object nested in it where the schema
/// has a record) that names no field of its record.
fn unknown_field(
    json: &serde_json::Value,
    schema: &Schema,
    names: &NamesRef<'_>,
    depth: usize,
) -> Option<String> {
    let schema = match schema {
        Schema::Ref { name } => *names.get(name)?,
        s => s,
    };
    let (Schema::Record(r), serde_json::Value::Object(o)) = (schema, json) else {
        return None;
    };
    for (k, v) in o {
        let Some(f) = r.fields.iter().find(|f| f.name == *k) else {
            return Some(k.clone());
        };
        if depth < MAX_DEPTH {
            if let Some(inner) = unknown_field(v, &f.schema, names, depth + 1) {
                return Some(format!("{k}.{inner}"));
            }
        }
    }
    None
}

fn undecodable(e: impl std::fmt::Display) -> AvroError {
    AvroError::Undecodable(e.to_string())
}

/// Reads values from a payload and writes them as JSON, led by their schema.
struct Json<'a, 's> {
    names: &'a NamesRef<'s>,
    /// What is left of the payload.
    input: &'a [u8],
    /// Where `out` may end.
    end: usize,
    /// How deep the value being read nests.
    depth: usize,
    out: &'a mut Vec<u8>,
}

/// A read past the end of the payload.
fn cut_short() -> AvroError {
    AvroError::Undecodable("the payload ends inside the record".into())
}

impl<'a, 's> Json<'a, 's> {
    fn value(&mut self, schema: &'s Schema) -> Result<(), AvroError> {
        self.depth += 1;
        let written = self.value_at(schema);
        self.depth -= 1;
        written
    }

    fn value_at(&mut self, schema: &'s Schema) -> Result<(), AvroError> {
        // What `shape` lets through nests at most MAX_DEPTH deep: a second
        // guard, for the stack's sake.
        if self.depth > 2 * MAX_DEPTH {
            return Err(AvroError::Undecodable("values nest too deep".into()));
        }
        // Each value writes at most its own bytes of payload, or a few
        // bytes of text, before the next check.
        if self.out.len() > self.end {
            return Err(AvroError::Undecodable(
                "the row would be larger than a row may be".into(),
            ));
        }
        match self.resolve(schema)? {
            Schema::Null => self.raw(b"null"),
            Schema::Boolean => match self.take(1)? {
                [0] => self.raw(b"false"),
                [1] => self.raw(b"true"),
                b => Err(AvroError::Undecodable(format!(
                    "{:#04x} is not a boolean",
                    b[0]
                ))),
            },
            Schema::Int => {
                let n = self.int()?;
                crate::json_text::int(self.out, n);
                Ok(())
            }
            Schema::Long => {
                let n = self.long()?;
                crate::json_text::int(self.out, n);
                Ok(())
            }
            Schema::Float => {
                let b = self.take(4)?;
                let x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                crate::json_text::f32(self.out, x);
                Ok(())
            }
            Schema::Double => {
                let b = self.take(8)?;
                let x = f64::from_le_bytes(b.try_into().map_err(|_| cut_short())?);
                crate::json_text::f64(self.out, x);
                Ok(())
            }
            Schema::Bytes => {
                let b = self.bytes()?;
                self.string(b)
            }
            Schema::String => {
                let b = self.text()?;
                self.string(b)
            }
            Schema::Fixed(f) => {
                let b = self.take(f.size)?;
                self.string(b)
            }
            Schema::Decimal(d) => {
                let b = match &d.inner {
                    apache_avro::schema::InnerDecimalSchema::Bytes => self.bytes()?,
                    apache_avro::schema::InnerDecimalSchema::Fixed(f) => self.take(f.size)?,
                };
                let b = significant(b);
                if b.len() > MAX_DECIMAL_BYTES {
                    return Err(AvroError::Undecodable(format!(
                        "a decimal of {} bytes, over {MAX_DECIMAL} digits",
                        b.len()
                    )));
                }
                self.quoted(decimal(&BigInt::from_signed_bytes_be(b), d.scale))
            }
            Schema::Uuid(u) => {
                let uuid = match u {
                    apache_avro::schema::UuidSchema::String => {
                        let text = std::str::from_utf8(self.text()?).map_err(undecodable)?;
                        apache_avro::Uuid::parse_str(text).map_err(undecodable)?
                    }
                    apache_avro::schema::UuidSchema::Bytes => {
                        apache_avro::Uuid::from_slice(self.bytes()?).map_err(undecodable)?
                    }
                    apache_avro::schema::UuidSchema::Fixed(f) => {
                        apache_avro::Uuid::from_slice(self.take(f.size)?).map_err(undecodable)?
                    }
                };
                self.quoted(uuid)
            }
            Schema::Date => {
                let days = self.int()?;
                self.quoted(date(days)?)
            }
            Schema::TimeMillis => {
                let t = self.int()?;
                self.quoted(time_of_day(i64::from(t), 1_000, 3)?)
            }
            Schema::TimeMicros => {
                let t = self.long()?;
                self.quoted(time_of_day(t, 1_000_000, 6)?)
            }
            Schema::TimestampMillis => self.time(1_000, 3, true),
            Schema::TimestampMicros => self.time(1_000_000, 6, true),
            Schema::TimestampNanos => self.time(1_000_000_000, 9, true),
            Schema::LocalTimestampMillis => self.time(1_000, 3, false),
            Schema::LocalTimestampMicros => self.time(1_000_000, 6, false),
            Schema::LocalTimestampNanos => self.time(1_000_000_000, 9, false),
            Schema::Duration(_) => {
                let b = self.take(12)?;
                let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
                let text = format!("[{},{},{}]", u(0), u(4), u(8));
                self.raw(text.as_bytes())
            }
            Schema::Enum(e) => {
                let i = self.int()?;
                let symbol = usize::try_from(i)
                    .ok()
                    .and_then(|i| e.symbols.get(i))
                    .ok_or_else(|| {
                        AvroError::Undecodable(format!("enum {} has no symbol {i}", e.name))
                    })?;
                self.string(symbol.as_bytes())
            }
            Schema::Union(u) => {
                let i = self.long()?;
                let variant = usize::try_from(i)
                    .ok()
                    .and_then(|i| u.variants().get(i))
                    .ok_or_else(|| {
                        AvroError::Undecodable(format!("union branch {i} does not exist"))
                    })?;
                self.value(variant)
            }
            Schema::Array(a) => {
                self.raw(b"[")?;
                let mut first = true;
                while let Some(n) = self.block()? {
                    for _ in 0..n {
                        if !std::mem::take(&mut first) {
                            self.raw(b",")?;
                        }
                        self.value(&a.items)?;
                    }
                }
                self.raw(b"]")
            }
            Schema::Map(m) => {
                // Written sorted by key, the last of equal keys kept: one
                // row per map whatever order the producer wrote. Values are
                // written in place (the row's limit holds), then reordered.
                let start = self.out.len();
                let mut entries: Vec<(&'a [u8], std::ops::Range<usize>)> = Vec::new();
                while let Some(n) = self.block()? {
                    for _ in 0..n {
                        let key = self.text()?;
                        let at = self.out.len() - start;
                        self.value(&m.types)?;
                        entries.push((key, at..self.out.len() - start));
                    }
                }
                entries.sort_by(|a, b| a.0.cmp(b.0));
                let values = self.out.split_off(start);
                self.raw(b"{")?;
                let mut first = true;
                for (i, (key, range)) in entries.iter().enumerate() {
                    if entries.get(i + 1).is_some_and(|next| next.0 == *key) {
                        continue;
                    }
                    if !std::mem::take(&mut first) {
                        self.raw(b",")?;
                    }
                    self.string(key)?;
                    self.raw(b":")?;
                    self.raw(&values[range.clone()])?;
                }
                self.raw(b"}")
            }
            Schema::Record(r) => {
                self.raw(b"{")?;
                for (i, f) in r.fields.iter().enumerate() {
                    if i > 0 {
                        self.raw(b",")?;
                    }
                    self.string(f.name.as_bytes())?;
                    self.raw(b":")?;
                    self.value(&f.schema)?;
                }
                self.raw(b"}")
            }
            other => Err(AvroError::Undecodable(format!(
                "a {:?} schema is not read",
                apache_avro::schema::SchemaKind::from(other)
            ))),
        }
    }

    /// The next `n` bytes.
    fn take(&mut self, n: usize) -> Result<&'a [u8], AvroError> {
        if n > self.input.len() {
            return Err(cut_short());
        }
        let (head, rest) = self.input.split_at(n);
        self.input = rest;
        Ok(head)
    }

    /// A zigzag varint `long`.
    fn long(&mut self) -> Result<i64, AvroError> {
        let mut n: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            // The tenth byte holds bit 63 only.
            if shift == 63 && b > 1 {
                break;
            }
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok((n >> 1) as i64 ^ -((n & 1) as i64));
            }
        }
        Err(AvroError::Undecodable("a long longer than 10 bytes".into()))
    }

    fn int(&mut self) -> Result<i32, AvroError> {
        let n = self.long()?;
        i32::try_from(n)
            .map_err(|_| AvroError::Undecodable(format!("{n} is out of an int's range")))
    }

    /// A length-prefixed run of bytes (`bytes`, `string`).
    fn bytes(&mut self) -> Result<&'a [u8], AvroError> {
        let n = self.long()?;
        let n = usize::try_from(n)
            .map_err(|_| AvroError::Undecodable(format!("a negative length {n}")))?;
        self.take(n)
    }

    /// A `string`: its bytes, which must be UTF-8.
    fn text(&mut self) -> Result<&'a [u8], AvroError> {
        let b = self.bytes()?;
        std::str::from_utf8(b).map_err(undecodable)?;
        Ok(b)
    }

    /// The item count of the next block of an array or map, `None` at the
    /// end. Every item takes a byte at least ([`bounded`]): a count over
    /// the bytes left is refused before any item is read.
    fn block(&mut self) -> Result<Option<usize>, AvroError> {
        let n = self.long()?;
        if n == 0 {
            return Ok(None);
        }
        if n < 0 {
            self.long()?; // the block's size in bytes
        }
        let n = usize::try_from(n.unsigned_abs())
            .ok()
            .filter(|n| *n <= self.input.len())
            .ok_or_else(|| {
                AvroError::Undecodable(format!(
                    "a block of {n} items in {} bytes",
                    self.input.len()
                ))
            })?;
        Ok(Some(n))
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

    fn quoted(&mut self, v: impl std::fmt::Display) -> Result<(), AvroError> {
        write!(self.out, "\"{v}\"").map_err(|e| AvroError::Undecodable(e.to_string()))
    }

    fn string(&mut self, bytes: &[u8]) -> Result<(), AvroError> {
        crate::json_text::string(self.out, bytes);
        Ok(())
    }

    /// A `long` of `1/per` seconds since the epoch, as RFC 3339 with
    /// `places` fractional digits (in UTC with `Z`, or as wall-clock time).
    fn time(&mut self, per: i64, places: usize, utc: bool) -> Result<(), AvroError> {
        let t = self.long()?;
        let (secs, frac) = (t.div_euclid(per), t.rem_euclid(per));
        if crate::json_text::datetime(self.out, secs, frac as u64, places, utc) {
            Ok(())
        } else {
            Err(AvroError::Undecodable(format!(
                "timestamp {t} is out of any calendar's range"
            )))
        }
    }
}

/// How deep values may nest: the decoder recurses once per level.
const MAX_DEPTH: usize = 64;
/// The most values one record may write without arrays and maps (whose
/// items each take payload bytes).
const MAX_WIDTH: u64 = 100_000;
/// The largest `decimal` scale and precision (ClickHouse's `Decimal256`).
const MAX_DECIMAL: usize = 76;

/// The most bytes of a two's complement decimal: 76 digits take 32.
const MAX_DECIMAL_BYTES: usize = 33;

/// A two's complement number without the bytes that only extend its sign.
fn significant(mut b: &[u8]) -> &[u8] {
    while let [first, second, ..] = b {
        let extends = (*first == 0 && second & 0x80 == 0) || (*first == 0xff && second & 0x80 != 0);
        if !extends {
            break;
        }
        b = &b[1..];
    }
    b
}

/// What [`shape`] finds of a type: how deep its values nest, how many
/// values one writes (arrays and maps counted once), and whether it is
/// written in no bytes at all.
#[derive(Debug, Clone, Copy)]
struct Shape {
    depth: usize,
    width: u64,
    empty: bool,
}

/// Checks that decoding a payload written with `schema` costs what the
/// payload's size allows: no named type contains itself, values nest at
/// most [`MAX_DEPTH`] deep, a record writes at most [`MAX_WIDTH`] values
/// besides its arrays' and maps', no array holds items that take no bytes
/// (a count of a few bytes could claim billions of them), no decimal has a
/// scale or precision over [`MAX_DECIMAL`], and apache-avro's own
/// `big-decimal` is not used. Each named type is looked at once.
fn bounded(schema: &Schema, names: &NamesRef<'_>) -> Result<(), String> {
    shape(schema, names, &mut Vec::new(), &mut HashMap::new()).map(|_| ())
}

/// `s`, if it is within [`MAX_DEPTH`] and [`MAX_WIDTH`]: checked at every
/// type, so that no part of a schema goes unlooked at.
fn within(s: Shape) -> Result<Shape, String> {
    if s.depth > MAX_DEPTH {
        return Err(format!(
            "values nest {} deep, more than {MAX_DEPTH}",
            s.depth
        ));
    }
    if s.width > MAX_WIDTH {
        return Err(format!(
            "a record writes {} values, more than {MAX_WIDTH}",
            s.width
        ));
    }
    Ok(s)
}

/// The [`Shape`] of `schema`; `open`: the named types being looked at,
/// `done`: the shapes of those already seen.
fn shape<'s>(
    schema: &'s Schema,
    names: &NamesRef<'s>,
    open: &mut Vec<&'s apache_avro::schema::Name>,
    done: &mut HashMap<&'s apache_avro::schema::Name, Shape>,
) -> Result<Shape, String> {
    // Each look at a type is tallied: tests bound the looks by the types the
    // schema writes, which a walk that followed a named type at each of its
    // references (2^levels for records of two fields of the level below)
    // exceeds.
    crate::work::step(1);
    let leaf = |empty| {
        Ok(Shape {
            depth: 1,
            width: 1,
            empty,
        })
    };
    let deeper = |s: Shape| Shape {
        depth: s.depth.saturating_add(1),
        ..s
    };
    match schema {
        Schema::Ref { name } => {
            if let Some(s) = done.get(name) {
                return Ok(*s);
            }
            if open.contains(&name) {
                return Err(format!(
                    "{name} contains itself: a row cannot hold a recursive type"
                ));
            }
            let s = names
                .get(name)
                .ok_or_else(|| format!("{name} is referenced but not defined"))?;
            shape(s, names, open, done)
        }
        Schema::Record(r) => {
            if let Some(s) = done.get(&r.name) {
                return Ok(*s);
            }
            open.push(&r.name);
            let mut total = Shape {
                depth: 1,
                width: 0,
                empty: true,
            };
            for f in &r.fields {
                let s = shape(&f.schema, names, open, done)?;
                total.depth = total.depth.max(s.depth.saturating_add(1));
                total.width = total.width.saturating_add(s.width);
                total.empty &= s.empty;
                within(total)?;
            }
            open.pop();
            done.insert(&r.name, total);
            Ok(total)
        }
        Schema::Array(a) => {
            let items = shape(&a.items, names, open, done)?;
            if items.empty {
                return Err("an array's items take no bytes (null, an empty record or fixed): a record could claim any number of them".into());
            }
            within(Shape {
                width: 1,
                empty: false,
                ..deeper(items)
            })
        }
        Schema::Map(m) => {
            let values = shape(&m.types, names, open, done)?;
            within(Shape {
                width: 1,
                empty: false,
                ..deeper(values)
            })
        }
        Schema::Union(u) => {
            let mut widest = Shape {
                depth: 1,
                width: 1,
                empty: false,
            };
            for v in u.variants() {
                let s = shape(v, names, open, done)?;
                widest.depth = widest.depth.max(s.depth.saturating_add(1));
                widest.width = widest.width.max(s.width);
                within(widest)?;
            }
            Ok(widest)
        }
        Schema::Decimal(d) if d.scale > MAX_DECIMAL || d.precision > MAX_DECIMAL => Err(format!(
            "a decimal({}, {}) is wider than ClickHouse's widest, {MAX_DECIMAL} digits",
            d.precision, d.scale
        )),
        Schema::Decimal(d) => match &d.inner {
            apache_avro::schema::InnerDecimalSchema::Fixed(f) => leaf(f.size == 0),
            apache_avro::schema::InnerDecimalSchema::Bytes => leaf(false),
        },
        Schema::BigDecimal => Err("apache-avro's big-decimal is not read".into()),
        Schema::Null => leaf(true),
        Schema::Fixed(f) => leaf(f.size == 0),
        _ => leaf(false),
    }
}

/// The ClickHouse type of a value of `schema`, as the module writes it.
/// Named types nested deeper than a few levels become `String`.
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
