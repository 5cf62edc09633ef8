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

/// Every kind of field, for comparing the direct path with the slow one.
const ALL: &str = r#"
syntax = "proto3";
package diff;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/duration.proto";
enum Color { option allow_alias = true; RED = 0; GREEN = 1; VERDE = 1; BLUE = -3; }
message All {
  double d = 1; float f = 2; int32 i32 = 3; int64 i64 = 4; uint32 u32 = 5; uint64 u64 = 6;
  sint32 s32 = 7; sint64 s64 = 8; fixed32 x32 = 9; fixed64 x64 = 10; sfixed32 sx32 = 11;
  sfixed64 sx64 = 12; bool b = 13; string s = 14; bytes by = 15; Color c = 16;
  All child = 17;
  repeated int32 ri = 18; repeated string rs = 19; repeated All rm = 20;
  map<string, int32> ms = 21; map<int64, All> mm = 22; map<bool, string> mb = 23;
  map<sint32, Color> mc = 24;
  google.protobuf.Timestamp t = 25; google.protobuf.Duration du = 26;
  google.protobuf.Int32Value w = 27;
  optional int64 o = 28;
  oneof one { string a = 29; int32 n = 30; }
  repeated double rd = 31 [packed = false];
  repeated fixed32 rx = 32;
  google.protobuf.StringValue ws = 33;
  map<fixed64, string> mf = 34;
  repeated Color rc = 35;
  uint32 big = 5000;
}
"#;

/// What a field's value is on the wire, for the generator.
#[derive(Debug, Clone, Copy)]
enum P {
    Varint,
    F64,
    F32,
    Str,
    Msg(Ty),
    Packed(u8),
}

#[derive(Debug, Clone, Copy)]
enum Ty {
    All,
    Time,
    WrapI32,
    WrapStr,
    /// A map entry: the key's and the value's wire form.
    Entry(&'static P, &'static P),
}

fn table(t: Ty) -> Vec<(u32, P)> {
    use P::*;
    match t {
        Ty::All => vec![
            (1, F64),
            (2, F32),
            (3, Varint),
            (4, Varint),
            (5, Varint),
            (6, Varint),
            (7, Varint),
            (8, Varint),
            (9, F32),
            (10, F64),
            (11, F32),
            (12, F64),
            (13, Varint),
            (14, Str),
            (15, Str),
            (16, Varint),
            (17, Msg(Ty::All)),
            (18, Varint),
            (18, Packed(0)),
            (19, Str),
            (20, Msg(Ty::All)),
            (21, Msg(Ty::Entry(&Str, &Varint))),
            (22, Msg(Ty::Entry(&Varint, &Msg(Ty::All)))),
            (23, Msg(Ty::Entry(&Varint, &Str))),
            (24, Msg(Ty::Entry(&Varint, &Varint))),
            (25, Msg(Ty::Time)),
            (26, Msg(Ty::Time)),
            (27, Msg(Ty::WrapI32)),
            (28, Varint),
            (29, Str),
            (30, Varint),
            (31, F64),
            (31, Packed(1)),
            (32, F32),
            (32, Packed(5)),
            (33, Msg(Ty::WrapStr)),
            (34, Msg(Ty::Entry(&F64, &Str))),
            (35, Packed(0)),
            (35, Varint),
            (5000, Varint),
        ],
        Ty::Time => vec![(1, Varint), (2, Varint)],
        Ty::WrapI32 => vec![(1, Varint)],
        Ty::WrapStr => vec![(1, Str)],
        Ty::Entry(k, v) => vec![(1, *k), (2, *v)],
    }
}

fn wire_type(p: P) -> u8 {
    match p {
        P::Varint => 0,
        P::F64 => 1,
        P::F32 => 5,
        _ => 2,
    }
}

fn varint_bytes(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

fn len_prefixed(bytes: Vec<u8>) -> Vec<u8> {
    let mut out = varint_bytes(bytes.len() as u64);
    out.extend(bytes);
    out
}

/// A value of wire form `p`, encoded (a length-delimited one with its length).
fn wire_value(p: P, depth: u32) -> BoxedStrategy<Vec<u8>> {
    let small_or_any = prop_oneof![
        0u64..300,
        any::<u64>(),
        (0u64..4).prop_map(|v| v.wrapping_sub(2))
    ];
    match p {
        P::Varint => small_or_any.prop_map(varint_bytes).boxed(),
        P::F64 => any::<u64>().prop_map(|v| v.to_le_bytes().to_vec()).boxed(),
        P::F32 => any::<u32>().prop_map(|v| v.to_le_bytes().to_vec()).boxed(),
        P::Str => prop_oneof![
            "[a-zé\"\\\\\n]{0,6}".prop_map(|s| s.into_bytes()),
            prop::collection::vec(any::<u8>(), 0..6),
        ]
        .prop_map(len_prefixed)
        .boxed(),
        P::Msg(t) if depth > 0 => wire_message(t, depth - 1).prop_map(len_prefixed).boxed(),
        P::Msg(_) => Just(vec![0]).boxed(),
        P::Packed(w) => {
            let item = match w {
                0 => P::Varint,
                1 => P::F64,
                _ => P::F32,
            };
            prop::collection::vec(wire_value(item, 0), 0..4)
                .prop_map(|items| len_prefixed(items.concat()))
                .boxed()
        }
    }
}

/// A message of type `t` on the wire: its fields in any order, some
/// repeated, some unknown, a few with a wire type that does not fit.
fn wire_message(t: Ty, depth: u32) -> BoxedStrategy<Vec<u8>> {
    let fields = table(t);
    let n = fields.len();
    let one = (0..n + 1, 0u8..40).prop_flat_map(move |(i, twist)| {
        let (number, p) = if i == n { (99, P::Varint) } else { fields[i] };
        let p = match twist {
            0 => P::Str,
            1 => P::F32,
            2 => P::F64,
            3 => P::Varint,
            _ => p,
        };
        let key = varint_bytes(u64::from(number) << 3 | u64::from(wire_type(p)));
        wire_value(p, depth).prop_map(move |v| [key.clone(), v].concat())
    });
    prop::collection::vec(one, 0..8)
        .prop_map(|fields| fields.concat())
        .boxed()
}

/// Runs both paths on `bytes` (a message of the file's first type) with a
/// row limit; true when the direct path took it.
fn both_paths(s: &ProtoSchema, bytes: &[u8], limit: usize) -> Result<bool, TestCaseError> {
    let mut slow = b"prefix".to_vec();
    let slow_result = s.slow_json(&[0], bytes, &mut slow, limit);
    let mut fast = b"prefix".to_vec();
    let taken = s.plans.write(&[0], bytes, &mut fast, limit).is_some();
    if taken {
        prop_assert!(slow_result.is_ok(), "{:?}", slow_result);
        prop_assert_eq!(
            String::from_utf8_lossy(&fast),
            String::from_utf8_lossy(&slow)
        );
        prop_assert_eq!(&fast, &slow);
    } else {
        prop_assert_eq!(fast, b"prefix".to_vec());
    }
    Ok(taken)
}

#[test]
fn the_direct_path_writes_what_the_slow_one_does() {
    use proptest::test_runner::{Config, TestRunner};
    let s = ProtoSchema::parse(ALL, &[]).unwrap();
    let taken = std::cell::Cell::new(0u32);
    let mut runner = TestRunner::new(Config::with_cases(4000));
    runner
        .run(
            &(wire_message(Ty::All, 3), 0usize..800),
            |(bytes, limit)| {
                let limit = if limit < 600 { usize::MAX } else { limit - 600 };
                taken.set(taken.get() + u32::from(both_paths(&s, &bytes, limit)?));
                Ok(())
            },
        )
        .unwrap();
    // The generator must reach the direct path, not only its refusals.
    assert!(
        taken.get() > 800,
        "the direct path took {} of 4000",
        taken.get()
    );
}

proptest! {
    #[test]
    fn the_direct_path_refuses_or_matches_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let s = ProtoSchema::parse(ALL, &[]).unwrap();
        both_paths(&s, &bytes, usize::MAX)?;
    }
}

#[test]
fn the_example_order_takes_the_direct_path() {
    let s = schema();
    let o = order(&s);
    let mut out = Vec::new();
    assert!(s
        .plans
        .write(&[0], &o.encode_to_vec(), &mut out, usize::MAX)
        .is_some());
    // A message field given twice merges: the slow path's.
    let mut twice = o.encode_to_vec();
    twice.extend(o.encode_to_vec());
    assert!(s.plans.write(&[0], &twice, &mut out, usize::MAX).is_none());
    let mut slow = Vec::new();
    s.to_json(&[&[0u8][..], &twice].concat(), &mut slow, usize::MAX)
        .unwrap();
    assert!(slow.starts_with(b"{\"id\":"));
}
