use super::*;
use proptest::prelude::*;
use prost_reflect::prost::Message;

const MONEY: &str = r#"syntax = "proto3"; package common; message Money { int64 units = 1; }"#;

const ORDER: &str = r#"
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/duration.proto";
import "common/money.proto";
enum Status { NEW = 0; PAID = 1; }
message Order {
  int64 id = 1;
  uint32 qty = 2;
  bool paid = 3;
  float ratio = 4;
  double score = 5;
  string name = 6;
  bytes blob = 7;
  Status status = 8;
  google.protobuf.Timestamp at = 9;
  google.protobuf.Int64Value maybe = 10;
  google.protobuf.StringValue absent = 11;
  google.protobuf.Duration took = 12;
  repeated string tags = 13;
  map<string, int64> attrs = 14;
  common.Money total = 15;
  optional int32 opt = 16;
  oneof pay { string card = 17; string cash = 18; }
  message Line { string sku = 1; }
  repeated Line lines = 19;
}
"#;

fn schema() -> ProtoSchema {
    ProtoSchema::parse(ORDER, &[("common/money.proto", MONEY)]).unwrap()
}

fn message(s: &ProtoSchema, path: &[i32]) -> DynamicMessage {
    DynamicMessage::new(s.message(path).unwrap())
}

fn sub(parent: &DynamicMessage, field: &str) -> DynamicMessage {
    let f = parent.descriptor().get_field_by_name(field).unwrap();
    match f.kind() {
        Kind::Message(m) => DynamicMessage::new(m),
        k => panic!("{field} is a {k:?}"),
    }
}

fn order(s: &ProtoSchema) -> DynamicMessage {
    let mut o = message(s, &[0]);
    o.set_field_by_name("id", Value::I64(i64::MIN));
    o.set_field_by_name("qty", Value::U32(7));
    o.set_field_by_name("ratio", Value::F32(0.1));
    o.set_field_by_name("score", Value::F64(f64::INFINITY));
    o.set_field_by_name("name", Value::String("a \"q\"\n".into()));
    o.set_field_by_name("blob", Value::Bytes(vec![0xff, b'x'].into()));
    o.set_field_by_name("status", Value::EnumNumber(1));
    let mut at = sub(&o, "at");
    at.set_field_by_name("seconds", Value::I64(-2));
    at.set_field_by_name("nanos", Value::I32(500_000_000));
    o.set_field_by_name("at", Value::Message(at));
    let mut maybe = sub(&o, "maybe");
    maybe.set_field_by_name("value", Value::I64(0));
    o.set_field_by_name("maybe", Value::Message(maybe));
    let mut took = sub(&o, "took");
    took.set_field_by_name("nanos", Value::I32(-500_000_000));
    o.set_field_by_name("took", Value::Message(took));
    o.set_field_by_name("tags", Value::List(vec![Value::String("a".into())]));
    let attrs = [("z", 1), ("a", 2)]
        .into_iter()
        .map(|(k, v)| (MapKey::String(k.into()), Value::I64(v)))
        .collect();
    o.set_field_by_name("attrs", Value::Map(attrs));
    let mut total = sub(&o, "total");
    total.set_field_by_name("units", Value::I64(5));
    o.set_field_by_name("total", Value::Message(total));
    o.set_field_by_name("cash", Value::String("yes".into()));
    let mut line = message(s, &[0, 1]);
    line.set_field_by_name("sku", Value::String("X1".into()));
    o.set_field_by_name("lines", Value::List(vec![Value::Message(line)]));
    o
}

/// The payload after the schema id: message indexes, then the message.
fn payload(indexes: &[u8], m: &DynamicMessage) -> Vec<u8> {
    let mut p = indexes.to_vec();
    p.extend(m.encode_to_vec());
    p
}

fn json(s: &ProtoSchema, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    s.to_json(payload, &mut out, usize::MAX).unwrap();
    out
}

const EXPECTED: &str = concat!(
    r#"{"id":-9223372036854775808,"qty":7,"paid":false,"ratio":0.1,"score":"inf","#,
    r#""name":"a \"q\"\u000a","blob":"BLOB","status":"PAID","#,
    r#""at":"1969-12-31T23:59:58.500000000Z","maybe":0,"took":"-0.500000000","#,
    r#""tags":["a"],"attrs":{"a":2,"z":1},"total":{"units":5},"cash":"yes","#,
    r#""lines":[{"sku":"X1"}]}"#
);

#[test]
fn every_type_is_written_as_clickhouse_reads_it() {
    let s = schema();
    let out = json(&s, &payload(&[0], &order(&s)));
    let mut want = EXPECTED.as_bytes().to_vec();
    let at = want.windows(4).position(|w| w == b"BLOB").unwrap();
    want.splice(at..at + 4, [0xff, b'x']);
    assert_eq!(
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(&want)
    );
    assert_eq!(out, want);
}

#[test]
fn a_registered_file_descriptor_decodes_like_its_source() {
    let mut compiler = protox::Compiler::with_file_resolver(Files(
        [
            (
                "main.proto".to_string(),
                File::from_source("main.proto", ORDER).unwrap(),
            ),
            (
                "common/money.proto".to_string(),
                File::from_source("common/money.proto", MONEY).unwrap(),
            ),
        ]
        .into(),
    ));
    compiler.open_file("main.proto").unwrap();
    let set = compiler.file_descriptor_set();
    let main = set.file.iter().find(|f| f.name() == "main.proto").unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(main.encode_to_vec());
    let from_descriptor = ProtoSchema::parse(&b64, &[("common/money.proto", MONEY)]).unwrap();
    let s = schema();
    let p = payload(&[0], &order(&s));
    assert_eq!(json(&from_descriptor, &p), json(&s, &p));
}

#[test]
fn a_nested_message_is_found_by_its_indexes() {
    let s = schema();
    // Order's nested types, as the registry's clients count them: the map's
    // entry type (`AttrsEntry`, [0, 0]), then `Line` ([0, 1]).
    assert_eq!(s.message(&[0, 0]).unwrap().name(), "AttrsEntry");
    let mut line = message(&s, &[0, 1]);
    line.set_field_by_name("sku", Value::String("Y".into()));
    // Two indexes (zigzag 2 = 4), then 0 and 1 (zigzag 2).
    assert_eq!(json(&s, &payload(&[4, 0, 2], &line)), br#"{"sku":"Y"}"#);
    let e = s
        .to_json(&payload(&[4, 0, 4], &line), &mut Vec::new(), usize::MAX)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "the message indexes [0, 2] name no message of the writer's schema"
    );
}

#[test]
fn fields_with_presence_are_left_out_when_unset() {
    let s = schema();
    let out = json(&s, &payload(&[0], &message(&s, &[0])));
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "attrs", "blob", "id", "lines", "name", "paid", "qty", "ratio", "score", "status",
            "tags"
        ],
        "no at, maybe, absent, took, total, opt, card, cash"
    );
    assert_eq!(v["status"], "NEW");
}

#[test]
fn bad_schemas_and_payloads_are_named() {
    let e = ProtoSchema::parse("syntax = \"proto3\"; message {", &[]).unwrap_err();
    assert!(matches!(e, ProtoError::Schema(_)), "{e}");
    let e = ProtoSchema::parse(ORDER, &[]).unwrap_err();
    assert!(e.to_string().contains("common/money.proto"), "{e}");
    let e = ProtoSchema::parse("syntax = \"proto3\"; enum E { A = 0; }", &[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the writer's schema is not a valid Protobuf file: the file defines no message"
    );
    let s = schema();
    let mut out = b"kept".to_vec();
    let e = s
        .to_json(&[0, 0x0a, 0x05, b'a'], &mut out, usize::MAX)
        .unwrap_err();
    assert!(matches!(e, ProtoError::Undecodable(_)), "{e}");
    assert!(
        s.to_json(&[], &mut out, usize::MAX).is_err(),
        "no message indexes"
    );
    assert_eq!(out, b"kept");
}

proptest! {
    #[test]
    fn no_payload_panics(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let s = schema();
        let mut out = Vec::new();
        let _ = s.to_json(&bytes, &mut out, usize::MAX);
    }

    #[test]
    fn timestamps_read_back_as_their_instant(secs in -2_208_988_800i64..10_413_792_000, nanos in 0i32..1_000_000_000) {
        let s = schema();
        let mut o = message(&s, &[0]);
        let mut at = sub(&o, "at");
        at.set_field_by_name("seconds", Value::I64(secs));
        at.set_field_by_name("nanos", Value::I32(nanos));
        o.set_field_by_name("at", Value::Message(at));
        let v: serde_json::Value = serde_json::from_slice(&json(&s, &payload(&[0], &o))).unwrap();
        let t = chrono::DateTime::parse_from_rfc3339(v["at"].as_str().unwrap()).unwrap();
        prop_assert_eq!((t.timestamp(), t.timestamp_subsec_nanos() as i32), (secs, nanos));
    }
}

#[test]
fn json_in_the_protobuf_mapping_encodes_to_what_decodes_back() {
    let s = schema();
    assert_eq!(s.path_of(None).unwrap(), [0]);
    assert_eq!(s.path_of(Some("shop.Order.Line")).unwrap(), [0, 1]);
    assert_eq!(s.path_of(Some("Line")).unwrap(), [0, 1]);
    assert!(s.path_of(Some("Nope")).is_err());
    let text = r#"{"id":"-5","name":"n","status":"PAID","at":"2024-05-01T10:00:00.250Z","tags":["a","b"],"attrs":{"k":"3"},"cash":"yes"}"#;
    let payload = s.from_json(&[0], text).unwrap();
    let out = String::from_utf8(json(&s, &payload)).unwrap();
    assert!(out.starts_with(r#"{"id":-5,"#), "{out}");
    for part in [
        r#""status":"PAID""#,
        r#""at":"2024-05-01T10:00:00.250000000Z""#,
        r#""tags":["a","b"]"#,
        r#""attrs":{"k":3}"#,
        r#""cash":"yes""#,
    ] {
        assert!(out.contains(part), "{part} in {out}");
    }
    let line = s.from_json(&[0, 1], r#"{"sku":"Y"}"#).unwrap();
    assert_eq!(json(&s, &line), br#"{"sku":"Y"}"#);
    for bad in [r#"{"id":"x"}"#, r#"{"nope":1}"#, "[1]", r#"{"id":1} x"#] {
        let e = s.from_json(&[0], bad).unwrap_err();
        assert!(matches!(e, ProtoError::Unencodable(_)), "{bad}: {e}");
    }
}

#[test]
fn a_message_that_only_takes_a_wrappers_name_is_a_message() {
    let fake = r#"syntax = "proto3"; package google.protobuf; message BoolValue { string s = 2; } message M { BoolValue b = 1; }"#;
    let s = ProtoSchema::parse(fake, &[]).unwrap();
    let mut b = DynamicMessage::new(s.message(&[0]).unwrap());
    b.set_field_by_name("s", Value::String("x".into()));
    let mut m = DynamicMessage::new(s.message(&[1]).unwrap());
    m.set_field_by_name("b", Value::Message(b));
    // Message index [1]: a count of 1 (zigzag 2), then 1 (zigzag 2).
    assert_eq!(json(&s, &payload(&[2, 2], &m)), br#"{"b":{"s":"x"}}"#);
    assert_eq!(
        s.columns(&[1]).unwrap(),
        [("b".to_string(), "Tuple(`s` String)".to_string())]
    );
}
