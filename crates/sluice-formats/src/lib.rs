//! A Kafka record's value → its ClickHouse row, per format, free of I/O.
//!
//! A route's records flow in as bytes (a JSON object, or a registry-framed
//! Avro or Protobuf payload); out comes one JSONEachRow line per record,
//! with the route's metadata columns and the hash of its dedup key, or the
//! reason it cannot become a row (which sends it to the DLQ):
//!
//! - [`wire`]: a registry-framed record value → its schema id and payload.
//! - [`avro`]: an Avro record and its registry schema → one JSON row, typed
//!   for ClickHouse.
//! - [`protobuf`]: a Protobuf message and its registry schema → one JSON
//!   row, typed as [`avro`] types it.
//! - [`row`]: one record value (JSON, or what a decoder wrote) → one
//!   JSONEachRow line with metadata and the dedup key's hash.
//! - [`binary`]: a JSONEachRow row → the same row in
//!   RowBinaryWithDefaults, typed by the table's columns, or a fallback to
//!   JSON where the conversion is not known to be exact.
//! - `json_text`: the one way the decoders write a string, a number and a
//!   time as JSON.
//! - `work`: the decoders' steps and comparisons, tallied in tests (which
//!   bound costs by counting work, not by timing it).

pub mod avro;
pub mod binary;
mod json_text;
pub mod protobuf;
pub mod row;
pub mod wire;
mod work;

pub use row::{MetadataColumns, RowEncoder, RowError};
