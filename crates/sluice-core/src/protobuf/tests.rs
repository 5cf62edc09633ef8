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

// ---------------------------------------------------------------------------
// Review (attacker's tests). Tests marked `// FINDING:` fail on 7667351.
// ---------------------------------------------------------------------------

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The contract for one input: the direct path declines (and leaves `out`
/// as it was), or the slow path accepts and writes the same bytes. Returns
/// whether the direct path took it.
fn held(s: &ProtoSchema, path: &[i32], bytes: &[u8], limit: usize) -> bool {
    let mut slow = b"prefix".to_vec();
    let slow_result = s.slow_json(path, bytes, &mut slow, limit);
    let mut fast = b"prefix".to_vec();
    if s.plans.write(path, bytes, &mut fast, limit).is_none() {
        assert_eq!(lossy(&fast), "prefix");
        return false;
    }
    assert!(
        slow_result.is_ok(),
        "the direct path wrote {} where the slow path refuses: {:?}",
        lossy(&fast),
        slow_result.unwrap_err()
    );
    assert_eq!(lossy(&fast), lossy(&slow));
    assert_eq!(fast, slow);
    true
}

/// Runs the test `name` of this module in a child process (for inputs that
/// overflow the stack, which aborts the whole test binary): passes when the
/// child does.
fn in_child(name: &str, f: impl FnOnce()) {
    const CHILD: &str = "SLUICE_REVIEW_CHILD";
    if std::env::var_os(CHILD).is_some() {
        f();
        return;
    }
    let module = module_path!().split_once("::").unwrap().1;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            &format!("{module}::{name}"),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the child died ({:?}): {}",
        out.status,
        stderr.lines().rev().take(4).collect::<Vec<_>>().join(" | ")
    );
}

// FINDING: a field key over u32::MAX (a field number of 2^29 .. 2^32, which
// prost's decode_key refuses: "invalid key value") is skipped as an unknown
// field by the direct path, which then writes the row; the slow path refuses
// the payload. The same inside a map entry.
#[test]
fn finding_a_key_past_u32_max_is_refused_by_the_slow_path_only() {
    let s = ProtoSchema::parse(ALL, &[]).unwrap();
    // Field number 2^29 (key 2^32, a varint), value 0; then i32 = 7.
    let mut bytes = varint_bytes(1u64 << 32);
    bytes.push(0);
    bytes.extend([0x18, 7]);
    let mut slow = Vec::new();
    assert!(s.slow_json(&[0], &bytes, &mut slow, usize::MAX).is_err());
    // In a map entry of `ms` (21): key "k", value 1, and the bad key.
    let mut entry = vec![0x0a, 1, b'k', 0x10, 1];
    entry.extend(varint_bytes((1u64 << 32) | 0));
    entry.push(0);
    let map_bytes = [vec![0xaa, 0x01], len_prefixed(entry)].concat();
    let r1 = std::panic::catch_unwind(|| held(&s, &[0], &bytes, usize::MAX));
    let r2 = std::panic::catch_unwind(|| held(&s, &[0], &map_bytes, usize::MAX));
    assert!(
        r1.is_ok() && r2.is_ok(),
        "top level: {}, map entry: {}",
        r1.is_ok(),
        r2.is_ok()
    );
}

/// A file that defines its own `google.protobuf.Timestamp` (or that a
/// registry reference named `google/protobuf/timestamp.proto` supplies).
fn fake_time(body: &str, name: &str) -> ProtoSchema {
    let file = format!(
        r#"syntax = "proto3"; package google.protobuf; message {name} {{ {body} }} message M {{ {name} t = 1; }}"#
    );
    ProtoSchema::parse(&file, &[]).unwrap()
}

// FINDING: `Form::Timestamp`/`Form::Duration` take the message's first
// field as `seconds` and any other as `nanos`, by position and without
// looking at kinds, while the slow path reads the fields by name and
// refuses a Timestamp without them. A Timestamp with no fields: the direct
// path writes "1970-01-01T00:00:00.000000000Z", the slow path refuses.
#[test]
fn finding_a_timestamp_without_seconds_is_written_by_the_direct_path() {
    let s = fake_time("", "Timestamp");
    held(&s, &[1], &[0x0a, 0x00], usize::MAX);
}

// FINDING: nanos declared first (number 1): the direct path writes nanos as
// the seconds and the seconds as the nanos.
#[test]
fn finding_a_timestamp_with_nanos_first_is_read_by_position() {
    let s = fake_time("int32 nanos = 1; int64 seconds = 2;", "Timestamp");
    // nanos = 5, seconds = 7.
    held(&s, &[1], &[0x0a, 0x04, 0x08, 5, 0x10, 7], usize::MAX);
}

// FINDING: a Duration whose seconds are sint64: the slow path unzigzags
// (3 → -2), the direct path writes the raw varint ("3.000000000"). A third
// int32 field is taken for the nanos as well.
#[test]
fn finding_a_duration_of_other_kinds_is_read_raw() {
    let s = fake_time("sint64 seconds = 1; int32 nanos = 2;", "Duration");
    let zigzag = std::panic::catch_unwind(|| held(&s, &[1], &[0x0a, 0x02, 0x08, 3], usize::MAX));
    let s = fake_time(
        "int64 seconds = 1; int32 nanos = 2; int32 extra = 3;",
        "Duration",
    );
    let extra = std::panic::catch_unwind(|| held(&s, &[1], &[0x0a, 0x02, 0x18, 9], usize::MAX));
    assert!(
        zigzag.is_ok() && extra.is_ok(),
        "sint64: {}, extra: {}",
        zigzag.is_ok(),
        extra.is_ok()
    );
}

// FINDING: the same through a registry reference: a schema that imports
// "google/protobuf/timestamp.proto" gets the reference's text, not the
// compiler's, when the registry lists one under that name.
#[test]
fn finding_a_timestamp_from_a_reference_is_read_by_position() {
    let fake = r#"syntax = "proto3"; package google.protobuf; message Timestamp { int32 nanos = 1; int64 seconds = 2; }"#;
    let main = r#"syntax = "proto3"; import "google/protobuf/timestamp.proto"; message M { google.protobuf.Timestamp t = 1; }"#;
    let s = ProtoSchema::parse(main, &[("google/protobuf/timestamp.proto", fake)]).unwrap();
    held(&s, &[0], &[0x0a, 0x04, 0x08, 5, 0x10, 7], usize::MAX);
}

// FINDING: a wrapper type whose one `value` field is repeated (or a map):
// `wrapped` takes it for a wrapper, the direct path writes one occurrence as
// a scalar ({"w":5}), the slow path the list ({"w":[5]}).
#[test]
fn finding_a_repeated_wrapper_value_is_written_as_a_scalar() {
    let file = r#"syntax = "proto3"; package google.protobuf; message Int64Value { repeated int64 value = 1; } message M { Int64Value w = 1; }"#;
    let s = ProtoSchema::parse(file, &[]).unwrap();
    held(&s, &[1], &[0x0a, 0x02, 0x08, 5], usize::MAX);
}

#[test]
fn finding_a_map_wrapper_value_is_written_as_its_entry() {
    let file = r#"syntax = "proto3"; package google.protobuf; message StringValue { map<string, string> value = 1; } message M { StringValue w = 1; }"#;
    let s = ProtoSchema::parse(file, &[]).unwrap();
    // w { value { key "k" value "v" } }
    let entry = [0x0a, 1, b'k', 0x12, 1, b'v'];
    let wrapper = [vec![0x0a], len_prefixed(entry.to_vec())].concat();
    let m = [vec![0x0a], len_prefixed(wrapper)].concat();
    held(&s, &[1], &m, usize::MAX);
}

// FINDING: a wrapper type whose `value` is itself (or another such wrapper):
// `Builder::compile` writes each field's unset text through `Json::value`
// on its default, and the wrapper's default's value is the wrapper's
// default, without end: `ProtoSchema::parse` overflows the stack (the whole
// process aborts; before 7667351 parse returned and `to_json` overflowed).
#[test]
fn finding_a_recursive_wrapper_overflows_the_stack_in_parse() {
    in_child(
        "finding_a_recursive_wrapper_overflows_the_stack_in_parse",
        || {
            let file = r#"syntax = "proto3"; package google.protobuf; message StringValue { StringValue value = 1; } message M { int32 a = 1; }"#;
            let _ = ProtoSchema::parse(file, &[]);
        },
    );
}

/// Bytes allocated and not freed, by the thread that allocated them (for
/// measuring what a parsed schema holds).
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static NET: Cell<isize> = const { Cell::new(0) };
    }

    fn add(n: isize) {
        let _ = NET.try_with(|c| c.set(c.get() + n));
    }

    pub struct Counting;

    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            add(l.size() as isize);
            unsafe { System.alloc(l) }
        }
        unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
            add(l.size() as isize);
            unsafe { System.alloc_zeroed(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            add(-(l.size() as isize));
            unsafe { System.dealloc(p, l) }
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
            add(new as isize - l.size() as isize);
            unsafe { System.realloc(p, l, new) }
        }
    }

    #[global_allocator]
    static A: Counting = Counting;

    /// Bytes this thread holds.
    pub fn net() -> isize {
        NET.with(|c| c.get())
    }
}

/// What compiling `text` costs without the plans: protox's pool, as
/// `ProtoSchema::parse` builds it. Returns (bytes held, seconds).
fn pool_only(text: &str) -> (isize, f64) {
    let before = counting::net();
    let t = std::time::Instant::now();
    let files = Files([(MAIN.to_string(), File::from_source(MAIN, text).unwrap())].into());
    let mut compiler = protox::Compiler::with_file_resolver(files);
    compiler.include_imports(true);
    compiler.open_file(MAIN).unwrap();
    let pool = compiler.descriptor_pool();
    drop(compiler);
    let secs = t.elapsed().as_secs_f64();
    let held = counting::net() - before;
    drop(pool);
    (held, secs)
}

/// What `ProtoSchema::parse` of `text` costs: (bytes held, seconds).
fn parsed(text: &str) -> (isize, f64) {
    let before = counting::net();
    let t = std::time::Instant::now();
    let s = ProtoSchema::parse(text, &[]).unwrap();
    let secs = t.elapsed().as_secs_f64();
    let held = counting::net() - before;
    drop(s);
    (held, secs)
}

// FINDING: every field's `unset` text is kept, also for the fields with
// presence that never write it; for a message field it is the whole default
// object of its type. N fields of a message type of N fields hold N² texts:
// a schema of ~60 KB holds tens of MB (quadratic in the schema's size;
// the registry's answers may be 16 MiB).
#[test]
fn finding_unset_texts_grow_with_the_square_of_the_schema() {
    let n = 1500;
    let mut text = String::from("syntax = \"proto3\"; message User {");
    for i in 1..=n {
        text += &format!("Big b{i}={i};");
    }
    text += "} message Big {";
    for i in 1..=n {
        text += &format!("int32 f{i}={i};");
    }
    text += "}";
    let (pool, pool_secs) = pool_only(&text);
    let (all, secs) = parsed(&text);
    eprintln!(
        "schema {} B: the pool holds {pool} B ({pool_secs:.3} s), parse {all} B ({secs:.3} s)",
        text.len()
    );
    assert!(
        all < 2 * pool,
        "the plans hold {} B more than the pool's {pool} B",
        all - pool
    );
}

// FINDING: each plan's `dense` table is sized by its highest field number
// under 1024: 4 KiB for a message of one field numbered 1023, ~150 times
// the 28 bytes of text that declare it.
#[test]
fn finding_dense_tables_cost_4_kib_a_message() {
    let mut text = String::from("syntax = \"proto3\";");
    for i in 0..3000 {
        text += &format!("message M{i}{{int32 a=1023;}}");
    }
    let (pool, pool_secs) = pool_only(&text);
    let (all, secs) = parsed(&text);
    eprintln!(
        "schema {} B: the pool holds {pool} B ({pool_secs:.3} s), parse {all} B ({secs:.3} s)",
        text.len()
    );
    assert!(
        all < 2 * pool,
        "the plans hold {} B more than the pool's {pool} B",
        all - pool
    );
}

// FINDING?: each field's oneof is found by a linear search of the message's
// oneofs by name: compiling a message of K one-member oneofs costs K²
// comparisons.
#[test]
fn finding_many_oneofs_compile_in_quadratic_time() {
    let k = 20_000;
    let mut text = String::from("syntax = \"proto3\"; message M {");
    for i in 1..=k {
        // 19000 to 19999 are reserved.
        let n = if i < 19_000 { i } else { i + 1000 };
        text += &format!("oneof o{i}{{int32 f{i}={n};}}");
    }
    text += "}";
    let (_, pool_secs) = pool_only(&text);
    let (_, secs) = parsed(&text);
    eprintln!(
        "schema {} B: the pool {pool_secs:.3} s, parse {secs:.3} s",
        text.len()
    );
    assert!(
        secs < 2.0 * pool_secs + 0.1,
        "parse {secs:.3} s, the pool {pool_secs:.3} s"
    );
}
