//! What turning one record into its row costs on the consumer thread, per
//! format, without the broker or ClickHouse: the bench's 200 B record as
//! JSON (checked and copied), and the same values in Avro and Protobuf
//! (decoded, then taken by the encoder). `make bench-formats` runs it
//! before the end-to-end cases.
//!
//! Out: ns a record for each format (the best of five passes over 100,000
//! records) and the ratio to JSON, then what the row's conversion to
//! `RowBinaryWithDefaults` (the insert's body, in the writer) adds, in the
//! bench table's columns. An argument (`json`, `avro`,
//! `protobuf`) runs that format alone, for a profiler.

use sluice_formats::avro::AvroSchema;
use sluice_formats::binary::{server_defaults, ColumnSpec, DefaultKind, Layout};
use sluice_formats::protobuf::ProtoSchema;
use sluice_formats::{MetadataColumns, RowEncoder};
use std::time::Instant;

const N: u64 = 100_000;
const EVENTS: [&str; 7] = [
    "view",
    "click",
    "add_to_cart",
    "purchase",
    "search",
    "login",
    "logout",
];
const COUNTRIES: [&str; 12] = [
    "US", "DE", "FR", "GB", "JP", "BR", "IN", "CN", "CA", "AU", "ES", "IT",
];
const DEVICES: [&str; 3] = ["desktop", "mobile", "tablet"];

const AVRO: &str = r#"{"type":"record","name":"Event","namespace":"bench","fields":[
 {"name":"event_id","type":"long"},{"name":"user_id","type":"long"},
 {"name":"session_id","type":"string"},{"name":"event","type":"string"},
 {"name":"path","type":"string"},{"name":"country","type":"string"},
 {"name":"device","type":"string"},{"name":"duration_ms","type":"int"},
 {"name":"price","type":"double"},
 {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#;

const PROTO: &str = r#"syntax = "proto3"; package bench;
import "google/protobuf/timestamp.proto";
message Event { uint64 event_id = 1; uint32 user_id = 2; string session_id = 3; string event = 4;
  string path = 5; string country = 6; string device = 7; uint32 duration_ms = 8; double price = 9;
  google.protobuf.Timestamp ts = 10; }"#;

/// The bench's 200 B table (`scripts/bench/run.py`), as `system.columns`
/// lists it.
const TABLE: &[(&str, &str)] = &[
    ("event_id", "UInt64"),
    ("user_id", "UInt32"),
    ("session_id", "String"),
    ("event", "LowCardinality(String)"),
    ("path", "String"),
    ("country", "LowCardinality(String)"),
    ("device", "LowCardinality(String)"),
    ("duration_ms", "UInt32"),
    ("price", "Float64"),
    ("ts", "DateTime64(3)"),
    ("_topic", "LowCardinality(String)"),
    ("_partition", "UInt32"),
    ("_offset", "UInt64"),
];

/// Record `i`'s values as JSON, with `ts` written by `ts(millis)`.
fn record(i: u64, ts: impl Fn(u64) -> String) -> String {
    let h = (i.wrapping_mul(2_654_435_761) + 0x9E37_79B9) & 0xFFFF_FFFF;
    let millis = 1_795_996_800_000 + (i % 86_400) * 1000 + h % 1000;
    format!(
        r#"{{"event_id":{i},"user_id":{},"session_id":"{:016x}","event":"{}","path":"/products/{}","country":"{}","device":"{}","duration_ms":{},"price":{}.{:02},"ts":{}}}"#,
        h % 1_000_000,
        h.wrapping_mul(0x5851_F42D),
        EVENTS[(h % 7) as usize],
        h % 50_000,
        COUNTRIES[(h % 12) as usize],
        DEVICES[(h % 3) as usize],
        h % 60_000,
        h % 500,
        h % 100,
        ts(millis)
    )
}

/// Turns a record (its value, its offset) into its row, appended.
type ToRow<'a> = dyn FnMut(&[u8], i64, &mut Vec<u8>) + 'a;

/// The best of five passes of `one` over every record, in ns a record.
fn cost(records: &[Vec<u8>], one: &mut ToRow) -> f64 {
    let mut out = Vec::with_capacity(1 << 20);
    let mut best = f64::MAX;
    let passes = if std::env::args().nth(1).is_some() {
        50
    } else {
        5
    };
    for _ in 0..passes {
        let t = Instant::now();
        for (i, r) in records.iter().enumerate() {
            if out.len() > 1 << 19 {
                out.clear();
            }
            one(r, i as i64, &mut out);
        }
        best = best.min(t.elapsed().as_nanos() as f64 / records.len() as f64);
    }
    best
}

fn main() {
    let json: Vec<Vec<u8>> = (0..N)
        .map(|i| {
            record(i, |ms| {
                let at = chrono::DateTime::from_timestamp_millis(ms as i64).unwrap();
                format!("\"{}\"", at.format("%Y-%m-%d %H:%M:%S%.3f"))
            })
            .into_bytes()
        })
        .collect();
    let avro = AvroSchema::parse(AVRO, &[]).unwrap();
    let avro_records: Vec<Vec<u8>> = (0..N)
        .map(|i| avro.from_json(&record(i, |ms| ms.to_string())).unwrap())
        .collect();
    let proto = ProtoSchema::parse(PROTO, &[]).unwrap();
    let proto_records: Vec<Vec<u8>> = (0..N)
        .map(|i| {
            let text = record(i, |ms| {
                let at = chrono::DateTime::from_timestamp_millis(ms as i64).unwrap();
                format!(
                    "\"{}\"",
                    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                )
            });
            proto.from_json(&[0], &text).unwrap()
        })
        .collect();

    let plain = RowEncoder::new("bench", MetadataColumns::default());
    let decoded = RowEncoder::new("bench", MetadataColumns::default()).for_decoded();
    let mut row = Vec::new();
    let only = std::env::args().nth(1);
    let cost = |name: &str, records: &[Vec<u8>], one: &mut ToRow| match only.as_deref() {
        Some(o) if o != name => f64::NAN,
        _ => cost(records, one),
    };
    let j = cost("json", &json, &mut |r, o, out| {
        plain.encode(Some(r), 0, o, out).unwrap()
    });
    let a = cost("avro", &avro_records, &mut |r, o, out| {
        row.clear();
        avro.to_json(r, &mut row, usize::MAX).unwrap();
        decoded.encode(Some(&row), 0, o, out).unwrap();
    });
    let p = cost("protobuf", &proto_records, &mut |r, o, out| {
        row.clear();
        proto.to_json(r, &mut row, usize::MAX).unwrap();
        decoded.encode(Some(&row), 0, o, out).unwrap();
    });
    // The rows as the writer finds them, each converted to its body.
    let layout = Layout::new(
        &TABLE
            .iter()
            .map(|(name, ty)| ColumnSpec {
                name: name.to_string(),
                type_name: ty.to_string(),
                default_kind: DefaultKind::None,
            })
            .collect::<Vec<_>>(),
        server_defaults(),
    );
    let rows_of = |records: &[Vec<u8>], to_row: &mut ToRow| -> Vec<Vec<u8>> {
        let mut rows = Vec::with_capacity(records.len());
        for (i, r) in records.iter().enumerate() {
            let mut row = Vec::new();
            to_row(r, i as i64, &mut row);
            rows.push(row);
        }
        rows
    };
    let mut scratch = Vec::new();
    let json_rows = rows_of(&json, &mut |r, o, out| {
        plain.encode(Some(r), 0, o, out).unwrap()
    });
    let avro_rows = rows_of(&avro_records, &mut |r, o, out| {
        scratch.clear();
        avro.to_json(r, &mut scratch, usize::MAX).unwrap();
        decoded.encode(Some(&scratch), 0, o, out).unwrap();
    });
    let proto_rows = rows_of(&proto_records, &mut |r, o, out| {
        scratch.clear();
        proto.to_json(r, &mut scratch, usize::MAX).unwrap();
        decoded.encode(Some(&scratch), 0, o, out).unwrap();
    });
    let binary = |name: &str, rows: &[Vec<u8>]| {
        cost(name, rows, &mut |row, _, out| {
            layout.encode(row, out).expect("the bench's rows convert");
        })
    };
    let jb = binary("json", &json_rows);
    let ab = binary("avro", &avro_rows);
    let pb = binary("protobuf", &proto_rows);
    let bytes = |rs: &[Vec<u8>]| rs.iter().map(Vec::len).sum::<usize>() as f64 / rs.len() as f64;
    println!(
        "| format | bytes/record | ns/record to its row | × JSON | + ns to RowBinaryWithDefaults |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for (name, rs, ns, bin) in [
        ("json", &json, j, jb),
        ("avro", &avro_records, a, ab),
        ("protobuf", &proto_records, p, pb),
    ] {
        println!(
            "| {name} | {:.0} | {ns:.0} | {:.2} | {bin:.0} |",
            bytes(rs),
            ns / j
        );
    }
}
