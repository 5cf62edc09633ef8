//! One Kafka record value → one JSONEachRow line carrying its origin.
//!
//! In: the raw value bytes of a record and its partition and offset.
//! Out: the same JSON object with the metadata columns (`_topic`,
//! `_partition`, `_offset` by default) appended, followed by `\n`.
//! The value is validated as one JSON object whose top-level keys do not
//! collide with the metadata columns; anything else is a [`RowError`], so a
//! bad record never reaches ClickHouse inside a batch of good ones.

use sluice_protocol::dedup::KeyHash;
use std::borrow::Cow;
use std::collections::HashSet;
use xxhash_rust::xxh3::Xxh3;

/// The most fields a business key may have.
pub const MAX_KEY_FIELDS: usize = 8;
/// The most required fields a route may name.
pub const MAX_REQUIRED_FIELDS: usize = 64;
use memchr::memmem;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use std::fmt;

/// The names of the columns that carry a row's origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataColumns {
    pub topic: String,
    pub partition: String,
    pub offset: String,
}

impl Default for MetadataColumns {
    fn default() -> Self {
        Self {
            topic: "_topic".into(),
            partition: "_partition".into(),
            offset: "_offset".into(),
        }
    }
}

/// Why a record value cannot become a row.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowError {
    #[error("the record has no value (a tombstone)")]
    Tombstone,
    #[error("the value is not valid JSON: {0}")]
    NotJson(String),
    #[error("the value is JSON but not an object")]
    NotObject,
    #[error("the value already has a field named `{0}`, which is a metadata column")]
    ReservedField(String),
    #[error("the value has no field `{0}`, which is required")]
    MissingField(String),
    #[error("the value is {bytes} bytes, over the limit of {max}")]
    TooLarge { bytes: usize, max: usize },
    /// A route reading the registry's wire format got a value without it.
    #[error("the value is not in the schema registry's wire format: {0}")]
    NotFramed(String),
    /// The value's schema id names no schema this route can read: the
    /// registry does not know it, or it is of another format, or invalid.
    #[error("{0}")]
    UnknownSchema(String),
    /// The bytes do not decode under the schema their id names.
    #[error("{0}")]
    Undecodable(String),
    /// The value has a top-level field the table has no column for, on a
    /// route that sends such records to the DLQ ([`extra_field`]).
    #[error("the value has a field `{0}`, which the table has no column for")]
    ExtraField(String),
}

impl RowError {
    /// A short stable name for the kind of error (metrics, DLQ headers).
    pub fn kind(&self) -> &'static str {
        match self {
            RowError::Tombstone => "tombstone",
            RowError::NotJson(_) => "not-json",
            RowError::NotObject => "not-object",
            RowError::ReservedField(_) => "reserved-field",
            RowError::MissingField(_) => "missing-field",
            RowError::TooLarge { .. } => "too-large",
            RowError::NotFramed(_) => "not-registry-framed",
            RowError::UnknownSchema(_) => "unknown-schema",
            RowError::Undecodable(_) => "undecodable",
            RowError::ExtraField(_) => "extra-field",
        }
    }
}

/// Encodes the values of one topic into JSONEachRow lines.
#[derive(Debug, Clone)]
pub struct RowEncoder {
    columns: MetadataColumns,
    /// The business key's fields, for key-level dedup (empty: none).
    key_fields: Vec<String>,
    /// Fields every value must have.
    required: Vec<String>,
    /// The largest value accepted, in bytes.
    max_bytes: usize,
    /// `"_topic":"<topic>","_partition":` with the topic already escaped.
    head: Vec<u8>,
    /// `,"_offset":`
    mid: Vec<u8>,
    /// The metadata column names as they would appear, quoted, in a value
    /// without escapes: a value holding none of them cannot name one.
    quoted: [memmem::Finder<'static>; 3],
    /// Values are rows a registry decoder wrote ([`Self::for_decoded`]).
    decoded: bool,
}

impl RowEncoder {
    pub fn new(topic: &str, columns: MetadataColumns) -> Self {
        let q = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""));
        let head = format!(
            "{}:{},{}:",
            q(&columns.topic),
            q(topic),
            q(&columns.partition)
        );
        let mid = format!(",{}:", q(&columns.offset));
        let finder = |name: &str| memmem::Finder::new(q(name).as_bytes()).into_owned();
        let quoted = [
            finder(&columns.topic),
            finder(&columns.partition),
            finder(&columns.offset),
        ];
        Self {
            columns,
            key_fields: Vec::new(),
            required: Vec::new(),
            max_bytes: usize::MAX,
            head: head.into_bytes(),
            mid: mid.into_bytes(),
            quoted,
            decoded: false,
        }
    }

    /// Takes values that a registry decoder ([`crate::avro`],
    /// [`crate::protobuf`]) wrote: JSON objects whose strings hold a
    /// `bytes` field's bytes as they are, UTF-8 or not (ClickHouse stores
    /// them unchanged). A key field holding bytes that are not UTF-8 gives
    /// no key: the row is kept, as a keyless one.
    pub fn for_decoded(mut self) -> Self {
        self.decoded = true;
        self
    }

    /// Also reads these top-level fields (at most [`MAX_KEY_FIELDS`]; the
    /// rest are ignored) as the record's business key.
    pub fn with_key(mut self, mut fields: Vec<String>) -> Self {
        fields.truncate(MAX_KEY_FIELDS);
        self.key_fields = fields;
        self
    }

    /// Requires these top-level fields (at most [`MAX_REQUIRED_FIELDS`]; the
    /// rest are not checked): a value without one is a
    /// [`RowError::MissingField`].
    pub fn with_required(mut self, mut fields: Vec<String>) -> Self {
        fields.truncate(MAX_REQUIRED_FIELDS);
        self.required = fields;
        self
    }

    /// Values longer than `max` bytes are a [`RowError::TooLarge`].
    pub fn with_max_bytes(mut self, max: usize) -> Self {
        self.max_bytes = max;
        self
    }

    /// The record value a row was encoded from, without the metadata
    /// columns (whitespace aside, the value as it came). `None` if `row`
    /// was not made by this encoder.
    pub fn original(&self, row: &[u8]) -> Option<Vec<u8>> {
        let at = row
            .windows(self.head.len())
            .rposition(|w| w == self.head.as_slice())?;
        let body = &row[..at];
        let body = body.strip_suffix(b",").unwrap_or(body);
        let mut v = body.to_vec();
        v.push(b'}');
        Some(v)
    }

    /// Appends the row for `value` to `out`. On error `out` is unchanged.
    pub fn encode(
        &self,
        value: Option<&[u8]>,
        partition: i32,
        offset: i64,
        out: &mut Vec<u8>,
    ) -> Result<(), RowError> {
        self.encode_keyed(value, partition, offset, out).map(|_| ())
    }

    /// Like [`encode`](Self::encode), and returns the hash of the business
    /// key when key fields are set and every one of them holds a string, a
    /// number or a boolean (`None` otherwise: the record cannot be deduped
    /// by key and is kept). A key field's text is a string's contents or a
    /// number as ClickHouse's `toString` prints it, so keys read back from
    /// the table hash the same.
    pub fn encode_keyed(
        &self,
        value: Option<&[u8]>,
        partition: i32,
        offset: i64,
        out: &mut Vec<u8>,
    ) -> Result<Option<KeyHash>, RowError> {
        let value = value.ok_or(RowError::Tombstone)?;
        if value.len() > self.max_bytes {
            return Err(RowError::TooLarge {
                bytes: value.len(),
                max: self.max_bytes,
            });
        }
        let mut parts: [Option<KeyPart>; MAX_KEY_FIELDS] = Default::default();
        let parts = &mut parts[..self.key_fields.len()];
        let (body, empty) = self.validate(value, parts)?;
        out.reserve(body.len() + self.head.len() + self.mid.len() + 24);
        out.extend_from_slice(body);
        if !empty {
            out.push(b',');
        }
        out.extend_from_slice(&self.head);
        let mut num = itoa::Buffer::new();
        out.extend_from_slice(num.format(partition).as_bytes());
        out.extend_from_slice(&self.mid);
        out.extend_from_slice(num.format(offset).as_bytes());
        out.extend_from_slice(b"}\n");
        if self.key_fields.is_empty() || parts.iter().any(Option::is_none) {
            return Ok(None);
        }
        Ok(Some(hash_parts(parts)))
    }

    /// Checks `value` and returns it without its closing brace, plus whether
    /// the object is empty.
    fn validate<'v>(
        &self,
        value: &'v [u8],
        parts: &mut [Option<KeyPart<'v>>],
    ) -> Result<(&'v [u8], bool), RowError> {
        let start = value.iter().position(|b| !b.is_ascii_whitespace());
        let end = value.iter().rposition(|b| !b.is_ascii_whitespace());
        let (Some(start), Some(end)) = (start, end) else {
            return Err(RowError::NotJson("the value is empty".into()));
        };
        // serde_json checks UTF-8 only in the strings it reads, not in the
        // values it skips: without this, `{"a":"\xff"}` became a row that
        // is not JSON (RFC 8259 §8.1).
        if self.decoded {
            // A decoder wrote it: valid JSON, one object.
            if parts.is_empty() && self.required.is_empty() && !self.may_name_a_column(value) {
                let empty = value[start + 1..end].iter().all(u8::is_ascii_whitespace);
                return Ok((&value[..end], empty));
            }
            return match self.walk_keys(value, end, parts) {
                // Only a key field's bytes can fail to read here.
                Err(RowError::NotJson(_)) if !parts.is_empty() => {
                    parts.iter_mut().for_each(|p| *p = None);
                    self.walk_keys(value, end, &mut [])
                }
                walked => walked,
            };
        }
        if let Err(e) = std::str::from_utf8(value) {
            return Err(RowError::NotJson(format!(
                "invalid UTF-8 at byte {}",
                e.valid_up_to()
            )));
        }
        if value[start] != b'{' {
            // Distinguish "valid JSON, wrong shape" from "not JSON at all".
            return match serde_json::from_slice::<IgnoredAny>(value) {
                Ok(_) => Err(RowError::NotObject),
                Err(e) => Err(RowError::NotJson(e.to_string())),
            };
        }
        if parts.is_empty() && self.required.is_empty() && !self.may_name_a_column(value) {
            // Nothing to read from the keys: a validating skip is enough
            // (and half the cost of walking them).
            serde_json::from_slice::<IgnoredAny>(value)
                .map_err(|e| RowError::NotJson(e.to_string()))?;
            let empty = value[start + 1..end].iter().all(u8::is_ascii_whitespace);
            return Ok((&value[..end], empty));
        }
        self.walk_keys(value, end, parts)
    }

    /// Whether a top-level key of `value` may be a metadata column: it holds
    /// an escape (a key spelled with escapes is read as what it decodes to)
    /// or one of the names, quoted, anywhere.
    fn may_name_a_column(&self, value: &[u8]) -> bool {
        memchr::memchr(b'\\', value).is_some()
            || self.quoted.iter().any(|f| f.find(value).is_some())
    }

    /// Validates `value` (an object ending at `end`) key by key: metadata
    /// columns, required fields and the key fields' values.
    fn walk_keys<'v>(
        &self,
        value: &'v [u8],
        end: usize,
        parts: &mut [Option<KeyPart<'v>>],
    ) -> Result<(&'v [u8], bool), RowError> {
        let mut de = serde_json::Deserializer::from_slice(value);
        let (fields, seen) = de
            .deserialize_map(KeyCheck {
                columns: &self.columns,
                // Without room for the key (`parts` empty), none is read.
                key_fields: &self.key_fields[..parts.len()],
                required: &self.required,
                parts,
            })
            .and_then(|n| de.end().map(|_| n))
            .map_err(|e| match e.classify() {
                serde_json::error::Category::Data => {
                    let msg = e.to_string();
                    match msg.strip_prefix(RESERVED) {
                        Some(rest) => RowError::ReservedField(
                            rest.split(" at line").next().unwrap_or(rest).to_string(),
                        ),
                        None => RowError::NotJson(msg),
                    }
                }
                _ => RowError::NotJson(e.to_string()),
            })?;
        if let Some(missing) = self
            .required
            .iter()
            .enumerate()
            .find(|(i, _)| seen & (1 << i) == 0)
        {
            return Err(RowError::MissingField(missing.1.clone()));
        }
        Ok((&value[..end], fields == 0))
    }
}

/// The first top-level field of `value`, a JSON object, that is not one of
/// `columns`. `None` when each one is, or when `value` is not a JSON object
/// (the encoder says what is wrong with it).
pub fn extra_field(value: &[u8], columns: &HashSet<String>) -> Option<String> {
    struct Extra<'c>(&'c HashSet<String>);
    impl<'de> Visitor<'de> for Extra<'_> {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<String>, A::Error> {
            let mut extra = None;
            while let Some(FieldName(key)) = map.next_key()? {
                if extra.is_none() && !self.0.contains(&*key) {
                    extra = Some(key.into_owned());
                }
                map.next_value::<IgnoredAny>()?;
            }
            Ok(extra)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(value);
    de.deserialize_map(Extra(columns)).ok().flatten()
}

/// Whether `value`, a JSON object, has the top-level field `name` (false
/// when it is not a JSON object).
pub fn has_field(value: &[u8], name: &str) -> bool {
    struct Has<'n>(&'n str);
    impl<'de> Visitor<'de> for Has<'_> {
        type Value = bool;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
            let mut has = false;
            while let Some(FieldName(key)) = map.next_key()? {
                has |= *key == *self.0;
                map.next_value::<IgnoredAny>()?;
            }
            Ok(has)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(value);
    de.deserialize_map(Has(name)).unwrap_or(false)
}

const RESERVED: &str = "reserved:";

/// Walks the top-level keys of an object, skipping values except the key
/// fields', and fails on a metadata column name. Returns the number of
/// fields and a bit per required field present.
struct KeyCheck<'c, 'v> {
    columns: &'c MetadataColumns,
    key_fields: &'c [String],
    required: &'c [String],
    parts: &'c mut [Option<KeyPart<'v>>],
}

impl<'de> Visitor<'de> for KeyCheck<'_, 'de> {
    type Value = (usize, u64);

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(usize, u64), A::Error> {
        let mut n = 0;
        let mut seen = 0u64;
        while let Some(FieldName(key)) = map.next_key()? {
            let c = self.columns;
            if *key == *c.topic || *key == *c.partition || *key == *c.offset {
                return Err(de::Error::custom(format!("{RESERVED}{key}")));
            }
            if let Some(i) = self.required.iter().position(|f| *f == *key) {
                seen |= 1 << i;
            }
            match self.key_fields.iter().position(|f| *f == *key) {
                Some(i) => self.parts[i] = map.next_value::<KeyText<'de>>()?.0,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            n += 1;
        }
        Ok((n, seen))
    }
}

/// A top-level field name, borrowed from the record unless it holds escapes.
/// (serde's own `Cow<str>` always allocates: a `String` per field was a
/// fifth of the consumer thread's time with 200-byte records.)
struct FieldName<'v>(Cow<'v, str>);

impl<'de> de::Deserialize<'de> for FieldName<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FieldName<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<FieldName<'de>, E> {
                Ok(FieldName(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<FieldName<'de>, E> {
                Ok(FieldName(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

/// One key field's value, borrowed from the record where possible.
#[derive(Debug)]
enum KeyPart<'v> {
    Str(Cow<'v, str>),
    U64(u64),
    I64(i64),
    F64(f64),
    Bool(bool),
}

/// Hashes key parts as [`sluice_protocol::dedup::key_hash`] hashes their canonical
/// text: a string's contents, a number or a boolean as ClickHouse's
/// `toString` prints it, `0x1f` between fields.
fn hash_parts(parts: &[Option<KeyPart>]) -> KeyHash {
    let mut h = Xxh3::new();
    let mut num = itoa::Buffer::new();
    for (i, p) in parts.iter().flatten().enumerate() {
        if i > 0 {
            h.update(&[0x1f]);
        }
        match p {
            KeyPart::Str(s) => h.update(s.as_bytes()),
            KeyPart::U64(v) => h.update(num.format(*v).as_bytes()),
            KeyPart::I64(v) => h.update(num.format(*v).as_bytes()),
            KeyPart::F64(v) => h.update(v.to_string().as_bytes()),
            KeyPart::Bool(v) => h.update(if *v { b"true" } else { b"false" }),
        }
    }
    h.digest128()
}

/// A key field's value; `None` for null, objects and arrays (such a record
/// has no usable key).
struct KeyText<'v>(Option<KeyPart<'v>>);

impl<'de> de::Deserialize<'de> for KeyText<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyText<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<KeyText<'de>, E> {
                Ok(KeyText(Some(KeyPart::Str(Cow::Borrowed(v)))))
            }
            fn visit_str<E>(self, v: &str) -> Result<KeyText<'de>, E> {
                Ok(KeyText(Some(KeyPart::Str(Cow::Owned(v.to_string())))))
            }
            fn visit_u64<E>(self, v: u64) -> Result<KeyText<'de>, E> {
                Ok(KeyText(Some(KeyPart::U64(v))))
            }
            fn visit_i64<E>(self, v: i64) -> Result<KeyText<'de>, E> {
                Ok(KeyText(Some(KeyPart::I64(v))))
            }
            fn visit_f64<E>(self, v: f64) -> Result<KeyText<'de>, E> {
                Ok(KeyText(Some(KeyPart::F64(v))))
            }
            fn visit_bool<E>(self, v: bool) -> Result<KeyText<'de>, E> {
                Ok(KeyText(Some(KeyPart::Bool(v))))
            }
            fn visit_unit<E>(self) -> Result<KeyText<'de>, E> {
                Ok(KeyText(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<KeyText<'de>, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(KeyText(None))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut s: A) -> Result<KeyText<'de>, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok(KeyText(None))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(v: &str) -> Result<String, RowError> {
        let e = RowEncoder::new("orders", MetadataColumns::default());
        let mut out = b"prefix|".to_vec();
        e.encode(Some(v.as_bytes()), 3, 42, &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn a_field_the_table_lacks_is_named() {
        let columns: HashSet<String> = ["id", "name", "_offset"].map(String::from).into();
        let extra = |v: &str| extra_field(v.as_bytes(), &columns);
        assert_eq!(extra(r#"{"id":1,"name":"a"}"#), None);
        assert_eq!(extra(r#"{}"#), None);
        // Nested objects are the column's business, not extra fields.
        assert_eq!(extra(r#"{"id":{"deep":1}}"#), None);
        assert_eq!(extra(r#"{"id":1,"price":2,"qty":3}"#), Some("price".into()));
        // A key spelled with escapes is the name it decodes to.
        assert_eq!(extra(r#"{"\u0069d":1}"#), None);
        assert_eq!(extra(r#"{"n\u00e4me":1}"#), Some("näme".into()));
        // Not an object, or not JSON: the encoder's to refuse.
        assert_eq!(extra("[1]"), None);
        assert_eq!(extra(r#"{"price":"#), None);
        assert_eq!(RowError::ExtraField("price".into()).kind(), "extra-field");
        assert!(has_field(br#"{"id":1,"price":{"x":2}}"#, "price"));
        assert!(has_field(br#"{"\u0070rice":1}"#, "price"));
        assert!(!has_field(br#"{"id":{"price":2}}"#, "price"));
        assert!(!has_field(b"[1]", "price"));
    }

    #[test]
    fn reads_the_business_key() {
        let e = RowEncoder::new("orders", MetadataColumns::default())
            .with_key(vec!["region".into(), "order_id".into()]);
        let key = |v: &str| {
            let mut out = Vec::new();
            e.encode_keyed(Some(v.as_bytes()), 0, 1, &mut out).unwrap()
        };
        let k = key(r#"{"order_id": 1001, "region": "eu", "x": {"order_id": 5}}"#);
        assert_eq!(
            k,
            Some(sluice_protocol::dedup::key_hash([
                b"eu".as_slice(),
                b"1001".as_slice()
            ]))
        );
        // Field order in the record does not matter; other fields do not count.
        assert_eq!(k, key(r#"{"region":"eu","amount":3,"order_id":1001}"#));
        assert_ne!(k, key(r#"{"region":"us","order_id":1001}"#));
        // A string "1001" and a number 1001 are the same key, as in ClickHouse.
        assert_eq!(k, key(r#"{"region":"eu","order_id":"1001"}"#));
        // Escaped strings, negative and float numbers, booleans.
        let one = RowEncoder::new("t", MetadataColumns::default()).with_key(vec!["k".into()]);
        let k1 = |v: &str| {
            one.encode_keyed(Some(v.as_bytes()), 0, 1, &mut Vec::new())
                .unwrap()
        };
        let h = |s: &str| Some(sluice_protocol::dedup::key_hash([s.as_bytes()]));
        assert_eq!(k1(r#"{"k":"a\"b"}"#), h("a\"b"));
        assert_eq!(k1(r#"{"k":-7}"#), h("-7"));
        assert_eq!(k1(r#"{"k":1.5}"#), h("1.5"));
        assert_eq!(k1(r#"{"k":true}"#), h("true"));
        // Missing, null or structured: no key.
        assert_eq!(key(r#"{"region":"eu"}"#), None);
        assert_eq!(key(r#"{"region":"eu","order_id":null}"#), None);
        assert_eq!(key(r#"{"region":"eu","order_id":[1]}"#), None);
        // Without key fields there is never a key.
        let plain = RowEncoder::new("orders", MetadataColumns::default());
        assert_eq!(
            plain.encode_keyed(Some(b"{\"a\":1}"), 0, 1, &mut Vec::new()),
            Ok(None)
        );
    }

    #[test]
    fn appends_metadata() {
        assert_eq!(
            enc(r#" {"id": 1, "s": "a}"} "#).unwrap(),
            "prefix| {\"id\": 1, \"s\": \"a}\",\"_topic\":\"orders\",\"_partition\":3,\"_offset\":42}\n"
        );
        assert_eq!(
            enc("{}").unwrap(),
            "prefix|{\"_topic\":\"orders\",\"_partition\":3,\"_offset\":42}\n"
        );
    }

    #[test]
    fn output_is_valid_json_with_metadata() {
        let line = enc(r#"{"nested":{"_offset":1},"list":[1,2]}"#).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(line.strip_prefix("prefix|").unwrap()).unwrap();
        assert_eq!(v["_offset"], 42);
        assert_eq!(v["_partition"], 3);
        assert_eq!(v["_topic"], "orders");
        assert_eq!(v["nested"]["_offset"], 1);
    }

    #[test]
    fn rejects_bad_values() {
        assert!(matches!(enc("{\"a\":"), Err(RowError::NotJson(_))));
        assert!(matches!(enc("not json"), Err(RowError::NotJson(_))));
        assert!(matches!(enc(""), Err(RowError::NotJson(_))));
        assert_eq!(enc("[1,2]"), Err(RowError::NotObject));
        assert_eq!(enc("\"s\""), Err(RowError::NotObject));
        assert!(matches!(
            enc("{\"a\":1} trailing"),
            Err(RowError::NotJson(_))
        ));
        assert_eq!(
            enc(r#"{"a":1,"_offset":7}"#),
            Err(RowError::ReservedField("_offset".into()))
        );
        // A field name spelled with escapes is read as what it decodes to.
        assert_eq!(
            enc(r#"{"a":1,"_\u006fffset":7}"#),
            Err(RowError::ReservedField("_offset".into()))
        );
        // Invalid UTF-8 is not JSON, in a skipped value as in a field name.
        let e = RowEncoder::new("t", MetadataColumns::default());
        for v in [
            &b"{\"a\":\"\xff\"}"[..],
            b"{\"a\":[{\"b\":\"\xed\xa0\x80\"}]}",
            b"{\"\xc3\x28\":1}",
        ] {
            let mut out = b"x".to_vec();
            let r = e.encode(Some(v), 0, 0, &mut out);
            assert!(
                matches!(&r, Err(RowError::NotJson(m)) if m.contains("UTF-8")),
                "{r:?}"
            );
            assert_eq!(out, b"x");
        }
        let mut out = vec![];
        assert_eq!(e.encode(None, 0, 0, &mut out), Err(RowError::Tombstone));
        assert!(out.is_empty());
    }

    #[test]
    fn decoded_rows_keep_their_bytes_and_their_keys() {
        let e = RowEncoder::new("t", MetadataColumns::default()).for_decoded();
        let mut out = Vec::new();
        e.encode(Some(b"{\"b\":\"\xff\x00\"}"), 1, 2, &mut out)
            .unwrap();
        assert_eq!(
            out,
            b"{\"b\":\"\xff\x00\",\"_topic\":\"t\",\"_partition\":1,\"_offset\":2}\n"
        );
        assert_eq!(
            e.encode(Some(br#"{"_offset":1}"#), 0, 0, &mut Vec::new()),
            Err(RowError::ReservedField("_offset".into()))
        );
        // A key is read as from JSON; a key holding bytes that are not
        // UTF-8 gives none, and the row is kept.
        let keyed = e.clone().with_key(vec!["id".into()]);
        let json = RowEncoder::new("t", MetadataColumns::default()).with_key(vec!["id".into()]);
        let v = br#"{"id":"k1","b":"x"}"#;
        let key = |e: &RowEncoder, v: &[u8]| e.encode_keyed(Some(v), 0, 0, &mut Vec::new());
        assert_eq!(key(&keyed, v), key(&json, v));
        assert!(key(&keyed, v).unwrap().is_some());
        assert_eq!(key(&keyed, b"{\"id\":\"\xff\",\"b\":\"\xfe\"}"), Ok(None));
        let required = e.with_required(vec!["id".into()]);
        assert_eq!(
            required.encode(Some(b"{\"b\":\"\xfe\"}"), 0, 0, &mut Vec::new()),
            Err(RowError::MissingField("id".into()))
        );
    }

    #[test]
    fn required_fields_and_size_limit() {
        let e = RowEncoder::new("t", MetadataColumns::default())
            .with_required(vec!["id".into(), "ts".into()])
            .with_max_bytes(40);
        let run = |v: &str| e.encode(Some(v.as_bytes()), 0, 1, &mut Vec::new());
        assert_eq!(run(r#"{"ts":1,"id":2}"#), Ok(()));
        assert_eq!(run(r#"{"id":2}"#), Err(RowError::MissingField("ts".into())));
        // A nested field of the same name does not count.
        let nested = run(r#"{"x":{"ts":1},"id":2}"#);
        assert_eq!(nested, Err(RowError::MissingField("ts".into())));
        let big = format!(r#"{{"id":1,"ts":2,"pad":"{}"}}"#, "x".repeat(40));
        assert_eq!(
            run(&big),
            Err(RowError::TooLarge {
                bytes: big.len(),
                max: 40
            })
        );
        assert_eq!(RowError::MissingField("x".into()).kind(), "missing-field");
    }

    #[test]
    fn original_strips_the_metadata() {
        let e = RowEncoder::new("t", MetadataColumns::default());
        for v in [r#"{"a":1,"b":"x,\"_topic\":"}"#, "{}", r#"{"a":[1,2]}"#] {
            let mut row = Vec::new();
            e.encode(Some(v.as_bytes()), 3, 99, &mut row).unwrap();
            assert_eq!(e.original(&row).unwrap(), v.as_bytes());
        }
        assert_eq!(e.original(b"{\"a\":1}\n"), None);
    }

    /// Values built from pieces that matter to the fast path: metadata
    /// column names as keys, nested and in strings, escapes, whitespace,
    /// and damage (a cut or a stray byte).
    fn values() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let key = prop::sample::select(vec![
            "a",
            "_topic",
            "_offset",
            "_partition",
            "_\\u006fffset",
            "x\\\"y",
            "src_off",
            "",
        ]);
        let val = prop::sample::select(vec![
            "1",
            "-1.5e3",
            "\"s\"",
            "\"_topic\"",
            r#"{"_offset":1}"#,
            "[1,{\"a\":2}]",
            "null",
            "true",
            "\"a\\\"b\"",
            "\"\u{e9}\"",
            "01",
            "\"\t\"",
            "{}",
            " [ ] ",
        ]);
        let fields = prop::collection::vec((key, val), 0..5);
        (fields, any::<bool>(), any::<u16>(), any::<u8>()).prop_map(|(fields, ws, cut, stray)| {
            let sep = if ws { " , " } else { "," };
            let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            let mut v = format!("{{{}}}", body.join(sep)).into_bytes();
            match cut % 8 {
                0 => v.truncate(cut as usize % (v.len() + 1)),
                1 => v.insert(cut as usize % (v.len() + 1), stray),
                _ => {}
            }
            v
        })
    }

    proptest::proptest! {
        /// The validating skip, where it is taken, decides as the key walk.
        #[test]
        fn the_fast_path_decides_as_the_walk(v in values(), custom in proptest::bool::ANY) {
            let cols = if custom {
                MetadataColumns { topic: "src_topic".into(), partition: "x\"y".into(), offset: "src_off".into() }
            } else {
                MetadataColumns::default()
            };
            let e = RowEncoder::new("t", cols);
            let end = v.iter().rposition(|b| !b.is_ascii_whitespace()).unwrap_or(0);
            let fast = e.validate(&v, &mut []);
            let walk = match std::str::from_utf8(&v) {
                Ok(_) if v.first() == Some(&b'{') => e.walk_keys(&v, end, &mut []),
                _ => fast.clone(),
            };
            proptest::prop_assert_eq!(
                fast.as_ref().map_err(RowError::kind),
                walk.as_ref().map_err(RowError::kind),
                "{}", String::from_utf8_lossy(&v)
            );
        }
    }

    #[test]
    fn escapes_topic_and_custom_columns() {
        let cols = MetadataColumns {
            topic: "src_topic".into(),
            partition: "src_part".into(),
            offset: "src_off".into(),
        };
        let e = RowEncoder::new("we\"ird", cols);
        let mut out = vec![];
        e.encode(Some(b"{\"x\":1}"), 0, 7, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["src_topic"], "we\"ird");
        assert_eq!(v["src_off"], 7);
    }
}
