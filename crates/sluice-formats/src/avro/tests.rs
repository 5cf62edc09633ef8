use super::*;
use apache_avro::types::Value as V;
use apache_avro::writer::datum::GenericDatumWriter;
use proptest::prelude::*;

/// A record of every type the module maps.
const EVERY_TYPE: &str = r#"{
  "type": "record", "name": "Order", "namespace": "shop",
  "fields": [
    {"name": "id", "type": "long"},
    {"name": "qty", "type": "int"},
    {"name": "paid", "type": "boolean"},
    {"name": "ratio", "type": "float"},
    {"name": "score", "type": "double"},
    {"name": "name", "type": "string"},
    {"name": "blob", "type": "bytes"},
    {"name": "code", "type": {"type": "fixed", "name": "Code", "size": 2}},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "big", "type": {"type": "fixed", "name": "Big", "size": 16, "logicalType": "decimal", "precision": 38, "scale": 10}},
    {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "at_ns", "type": {"type": "long", "logicalType": "timestamp-nanos"}},
    {"name": "wall", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
    {"name": "tod", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "tod_us", "type": {"type": "long", "logicalType": "time-micros"}},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "attrs", "type": {"type": "map", "values": "long"}},
    {"name": "ship", "type": {"type": "record", "name": "Ship", "fields": [{"name": "city", "type": "string"}]}},
    {"name": "again", "type": ["null", "Ship"]}
  ]
}"#;

fn encode(schema: &str, value: V) -> Vec<u8> {
    let s = Schema::parse_str(schema).unwrap();
    let w = GenericDatumWriter::builder(&s).build().unwrap();
    w.write_value_to_vec(value).unwrap()
}

fn json(schema: &AvroSchema, payload: &[u8]) -> String {
    let mut out = b"prefix ".to_vec();
    schema.to_json(payload, &mut out, usize::MAX).unwrap();
    String::from_utf8(out)
        .unwrap()
        .strip_prefix("prefix ")
        .unwrap()
        .to_string()
}

fn record(fields: Vec<(&str, V)>) -> V {
    V::Record(
        fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

fn every_type(note: Option<&str>) -> V {
    let big = BigInt::parse_bytes(b"-123456789012345678901234567890", 10).unwrap();
    let mut big_bytes = big.to_signed_bytes_be();
    while big_bytes.len() < 16 {
        big_bytes.insert(0, 0xff);
    }
    record(vec![
        ("id", V::Long(-9_223_372_036_854_775_808)),
        ("qty", V::Int(7)),
        ("paid", V::Boolean(true)),
        ("ratio", V::Float(0.1)),
        ("score", V::Double(f64::NAN)),
        ("name", V::String("a \"quoted\" \\ line\nbreak é".into())),
        ("blob", V::Bytes(vec![0xff, b'"', 0x01, b'x'])),
        ("code", V::Fixed(2, b"AB".to_vec())),
        (
            "price",
            V::Decimal(apache_avro::Decimal::from(
                BigInt::from(-1250).to_signed_bytes_be(),
            )),
        ),
        ("big", V::Decimal(apache_avro::Decimal::from(big_bytes))),
        (
            "uid",
            V::Uuid("123e4567-e89b-12d3-a456-426614174000".parse().unwrap()),
        ),
        ("day", V::Date(-1)),
        ("at", V::TimestampMillis(-1_500)),
        ("at_us", V::TimestampMicros(1_700_000_000_123_456)),
        ("at_ns", V::TimestampNanos(1)),
        ("wall", V::LocalTimestampMillis(1_700_000_000_123)),
        ("tod", V::TimeMillis(45_296_789)),
        ("tod_us", V::TimeMicros(1)),
        ("status", V::Enum(1, "PAID".into())),
        (
            "note",
            match note {
                Some(n) => V::Union(1, Box::new(V::String(n.into()))),
                None => V::Union(0, Box::new(V::Null)),
            },
        ),
        (
            "tags",
            V::Array(vec![V::String("a".into()), V::String("b".into())]),
        ),
        (
            "attrs",
            V::Map([("z".to_string(), V::Long(1)), ("a".to_string(), V::Long(2))].into()),
        ),
        ("ship", record(vec![("city", V::String("Oslo".into()))])),
        (
            "again",
            V::Union(
                1,
                Box::new(record(vec![("city", V::String("Rome".into()))])),
            ),
        ),
    ])
}

#[test]
fn every_type_is_written_as_clickhouse_reads_it() {
    let schema = AvroSchema::parse(EVERY_TYPE, &[]).unwrap();
    let mut out = Vec::new();
    schema
        .to_json(&encode(EVERY_TYPE, every_type(None)), &mut out, usize::MAX)
        .unwrap();
    let mut expected = concat!(
        r#"{"id":-9223372036854775808,"qty":7,"paid":true,"ratio":0.1,"score":"nan","#,
        r#""name":"a \"quoted\" \\ line\u000abreak é","blob":""#
    )
    .as_bytes()
    .to_vec();
    // Bytes as they are, but `"` and control characters escaped.
    expected.extend_from_slice(b"\xff\\\"\\u0001x");
    expected.extend_from_slice(
        concat!(
            r#"","code":"AB","price":"-12.50","big":"-12345678901234567890.1234567890","#,
            r#""uid":"123e4567-e89b-12d3-a456-426614174000","day":"1969-12-31","#,
            r#""at":"1969-12-31T23:59:58.500Z","at_us":"2023-11-14T22:13:20.123456Z","#,
            r#""at_ns":"1970-01-01T00:00:00.000000001Z","wall":"2023-11-14 22:13:20.123","#,
            r#""tod":"12:34:56.789","tod_us":"00:00:00.000001","status":"PAID","note":null,"#,
            r#""tags":["a","b"],"attrs":{"a":2,"z":1},"ship":{"city":"Oslo"},"again":{"city":"Rome"}}"#
        )
        .as_bytes(),
    );
    assert_eq!(
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(&expected)
    );
    assert_eq!(out, expected);
}

#[test]
fn what_is_valid_utf_8_parses_back_as_the_same_json() {
    let schema = AvroSchema::parse(EVERY_TYPE, &[]).unwrap();
    let mut v = every_type(Some("ok"));
    if let V::Record(fields) = &mut v {
        fields[6].1 = V::Bytes(b"plain".to_vec());
    }
    let text = json(&schema, &encode(EVERY_TYPE, v));
    let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(parsed["note"], "ok");
    assert_eq!(parsed["name"], "a \"quoted\" \\ line\nbreak é");
    assert_eq!(parsed["blob"], "plain");
}

#[test]
fn references_to_named_types_of_other_schemas_resolve() {
    let money = r#"{"type": "record", "name": "Money", "namespace": "common",
        "fields": [{"name": "units", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 3}}]}"#;
    let order = r#"{"type": "record", "name": "Order", "namespace": "shop",
        "fields": [{"name": "total", "type": "common.Money"}]}"#;
    let schema = AvroSchema::parse(order, &[money]).unwrap();
    let (s, refs) = Schema::parse_str_with_list(order, [money]).unwrap();
    let w = GenericDatumWriter::builder(&s)
        .schemata(refs.iter().collect())
        .unwrap()
        .build()
        .unwrap();
    let total = V::Decimal(apache_avro::Decimal::from(
        BigInt::from(5).to_signed_bytes_be(),
    ));
    let payload = w
        .write_value_to_vec(record(vec![("total", record(vec![("units", total)]))]))
        .unwrap();
    assert_eq!(json(&schema, &payload), r#"{"total":{"units":"0.005"}}"#);
}

#[test]
fn bad_schemas_and_bad_payloads_are_named() {
    let e = AvroSchema::parse("{not json", &[]).unwrap_err();
    assert!(matches!(e, AvroError::Schema(_)), "{e}");
    let e = AvroSchema::parse(r#""string""#, &[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the writer's schema is a string, not a record: a row needs named fields"
    );
    let e = AvroSchema::parse(
        r#"{"type":"record","name":"A","fields":[{"name":"x","type":"Nope"}]}"#,
        &[],
    );
    assert!(matches!(e, Err(AvroError::Schema(_))));

    let schema = AvroSchema::parse(EVERY_TYPE, &[]).unwrap();
    let payload = encode(EVERY_TYPE, every_type(None));
    let mut out = b"kept".to_vec();
    let e = schema
        .to_json(&payload[..payload.len() - 3], &mut out, usize::MAX)
        .unwrap_err();
    assert!(matches!(e, AvroError::Undecodable(_)), "{e}");
    assert_eq!(out, b"kept", "nothing is left half written");
    let mut longer = payload.clone();
    longer.push(0);
    let e = schema.to_json(&longer, &mut out, usize::MAX).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the payload does not decode under its schema: 1 bytes are left after the record"
    );
}

#[test]
fn every_cut_of_a_payload_is_refused() {
    let schema = AvroSchema::parse(EVERY_TYPE, &[]).unwrap();
    for note in [None, Some("n")] {
        let payload = encode(EVERY_TYPE, every_type(note));
        for keep in 0..payload.len() {
            let mut out = Vec::new();
            let r = schema.to_json(&payload[..keep], &mut out, usize::MAX);
            assert!(
                r.is_err(),
                "{keep} of {} bytes decoded (note {note:?})",
                payload.len()
            );
        }
    }
}

#[test]
fn decimals_are_exact() {
    assert_eq!(decimal(&BigInt::from(0), 2), "0.00");
    assert_eq!(decimal(&BigInt::from(-5), 3), "-0.005");
    assert_eq!(decimal(&BigInt::from(12345), 0), "12345");
    assert_eq!(decimal(&BigInt::from(-12345), 2), "-123.45");
}

#[test]
fn dates_and_times_keep_their_calendar() {
    assert_eq!(date(0).unwrap(), "1970-01-01");
    assert_eq!(date(-25_567).unwrap(), "1900-01-01");
    assert_eq!(date(120_529).unwrap(), "2299-12-31");
    assert!(time_of_day(86_400_000, 1_000, 3).is_err());
    assert!(time_of_day(-1, 1_000, 3).is_err());
}

proptest! {
    #[test]
    fn a_decimal_reads_back_as_its_value(unscaled in any::<i128>(), scale in 0usize..30) {
        let text = decimal(&BigInt::from(unscaled), scale);
        // Read back without floating point: drop the point, compare digits.
        let negative = text.starts_with('-');
        let digits: String = text.chars().filter(|c| c.is_ascii_digit()).collect();
        let back: i128 = digits.parse::<u128>().map(|m| m as i128).unwrap_or(i128::MIN);
        let back = if negative && back != i128::MIN { -back } else { back };
        prop_assert_eq!(back, unscaled);
        let frac = text.split_once('.').map_or(0, |(_, f)| f.len());
        prop_assert_eq!(frac, scale);
    }

    #[test]
    fn timestamps_read_back_as_their_instant(ms in -2_208_988_800_000i64..10_413_792_000_000) {
        let schema = AvroSchema::parse(r#"{"type":"record","name":"T","fields":[{"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#, &[]).unwrap();
        let payload = encode(r#"{"type":"record","name":"T","fields":[{"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#, record(vec![("at", V::TimestampMillis(ms))]));
        let text = json(&schema, &payload);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let at = chrono::DateTime::parse_from_rfc3339(v["at"].as_str().unwrap()).unwrap();
        prop_assert_eq!(at.timestamp_millis(), ms);
    }

    #[test]
    fn a_payload_cut_short_never_decodes(cut in 1usize..200, note in proptest::option::of(".{0,8}")) {
        let schema = AvroSchema::parse(EVERY_TYPE, &[]).unwrap();
        let payload = encode(EVERY_TYPE, every_type(note.as_deref()));
        let keep = payload.len().saturating_sub(cut);
        let mut out = Vec::new();
        prop_assert!(schema.to_json(&payload[..keep], &mut out, usize::MAX).is_err(), "{} of {} bytes", keep, payload.len());
        prop_assert!(out.is_empty());
    }

    #[test]
    fn no_payload_panics(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let schema = AvroSchema::parse(EVERY_TYPE, &[]).unwrap();
        let mut out = Vec::new();
        let _ = schema.to_json(&bytes, &mut out, usize::MAX);
    }
}

#[test]
fn json_resolved_by_avros_rules_encodes_to_what_decodes_back() {
    let s = AvroSchema::parse(
        r#"{"type": "record", "name": "Order", "fields": [
            {"name": "id", "type": "long"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
            {"name": "note", "type": ["null", "string"], "default": null},
            {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []}
        ]}"#,
        &[],
    )
    .unwrap();
    let payload = s
        .from_json(
            r#"{"id": 5, "at": 1714557600250, "status": "PAID", "note": "n", "tags": ["a"]}"#,
        )
        .unwrap();
    assert_eq!(
        json(&s, &payload),
        r#"{"id":5,"at":"2024-05-01T10:00:00.250Z","status":"PAID","note":"n","tags":["a"]}"#
    );
    // Missing fields take their defaults.
    let payload = s
        .from_json(r#"{"id": 6, "at": 0, "status": "NEW"}"#)
        .unwrap();
    assert_eq!(
        json(&s, &payload),
        r#"{"id":6,"at":"1970-01-01T00:00:00.000Z","status":"NEW","note":null,"tags":[]}"#
    );
    for bad in [
        r#"{"id": 1, "at": 0, "status": "NEW", "stauts": "PAID"}"#,
        r#"{"id": "x", "at": 0, "status": "NEW"}"#,
        r#"{"id": 1, "at": 0, "status": "GONE"}"#,
        r#"{"at": 0, "status": "NEW"}"#,
        "not json",
    ] {
        let e = s.from_json(bad).unwrap_err();
        assert!(matches!(e, AvroError::Unencodable(_)), "{bad}: {e}");
    }
}

#[test]
fn schemas_whose_payloads_could_cost_more_than_their_size_are_refused() {
    let recursive =
        r#"{"type":"record","name":"Node","fields":[{"name":"next","type":["null","Node"]}]}"#;
    let e = AvroSchema::parse(recursive, &[]).unwrap_err().to_string();
    assert!(e.contains("Node contains itself"), "{e}");
    for items in [
        r#""null""#,
        r#"{"type":"record","name":"E","fields":[]}"#,
        r#"{"type":"fixed","name":"Z","size":0}"#,
    ] {
        let s = format!(
            r#"{{"type":"record","name":"R","fields":[{{"name":"a","type":{{"type":"array","items":{items}}}}}]}}"#
        );
        let e = AvroSchema::parse(&s, &[]).unwrap_err().to_string();
        assert!(e.contains("take no bytes"), "{items}: {e}");
    }
    // A named type used twice is not recursion; a map of nulls costs a key each.
    let twice = r#"{"type":"record","name":"R","fields":[
        {"name":"a","type":{"type":"record","name":"P","fields":[{"name":"x","type":"int"}]}},
        {"name":"b","type":"P"},
        {"name":"m","type":{"type":"map","values":"null"}},
        {"name":"l","type":{"type":"array","items":{"type":"array","items":"P"}}}]}"#;
    AvroSchema::parse(twice, &[]).unwrap();
}

/// apache-avro's own reader of `payload` under EVERY_TYPE: whether it reads
/// one whole record from it, without reading past its end.
fn apache_avro_reads(payload: &[u8]) -> bool {
    struct Counted<'a>(&'a [u8], bool);
    impl std::io::Read for Counted<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.1 |= buf.len() > self.0.len();
            self.0.read(buf)
        }
    }
    let s = Schema::parse_str(EVERY_TYPE).unwrap();
    let r = apache_avro::reader::datum::GenericDatumReader::builder(&s)
        .build()
        .unwrap();
    let mut input = Counted(payload, false);
    r.read_value(&mut input).is_ok() && !input.1 && input.0.is_empty()
}

proptest! {
    /// The decoder reads the bytes itself: whatever it takes for a record,
    /// apache-avro's reader takes for one too (one byte changed anywhere in
    /// a valid payload, or a run of them).
    #[test]
    fn what_decodes_is_a_record_to_apache_avro_too(
        at in 0usize..200,
        bytes in prop::collection::vec(any::<u8>(), 1..4),
        note in proptest::option::of(".{0,4}"),
    ) {
        let schema = AvroSchema::parse(EVERY_TYPE, &[]).unwrap();
        let mut payload = encode(EVERY_TYPE, every_type(note.as_deref()));
        let at = at % payload.len();
        let end = (at + bytes.len()).min(payload.len());
        payload.splice(at..end, bytes);
        let mut out = Vec::new();
        if schema.to_json(&payload, &mut out, usize::MAX).is_ok() {
            prop_assert!(apache_avro_reads(&payload), "{payload:?}");
        } else {
            prop_assert!(out.is_empty());
        }
    }
}

/// A schema of named records: `R0` holds an int, each `Rk` holds `fields`
/// fields of `R(k-1)` (defined as siblings, so the text stays flat).
fn chain(levels: usize, fields: usize) -> String {
    let mut defs =
        vec![r#"{"type":"record","name":"R0","fields":[{"name":"x","type":"int"}]}"#.to_string()];
    for k in 1..=levels {
        let fs: Vec<String> = (0..fields)
            .map(|i| format!(r#"{{"name":"f{i}","type":"R{}"}}"#, k - 1))
            .collect();
        defs.push(format!(
            r#"{{"type":"record","name":"R{k}","fields":[{}]}}"#,
            fs.join(",")
        ));
    }
    let fs: Vec<String> = defs
        .iter()
        .enumerate()
        .map(|(i, d)| format!(r#"{{"name":"d{i}","type":["null",{d}]}}"#))
        .collect();
    format!(
        r#"{{"type":"record","name":"Top","fields":[{}]}}"#,
        fs.join(",")
    )
}

/// The types `schema` writes: each node of its tree, where a named type
/// mentioned again is a reference.
fn types_written(schema: &Schema) -> u64 {
    1 + match schema {
        Schema::Record(r) => r.fields.iter().map(|f| types_written(&f.schema)).sum(),
        Schema::Array(a) => types_written(&a.items),
        Schema::Map(m) => types_written(&m.types),
        Schema::Union(u) => u.variants().iter().map(types_written).sum(),
        _ => 0,
    }
}

/// Schemas that nest too deep or write too much are refused, and the check
/// looks at each type the schema writes once at most ([`crate::work`]
/// tallies each look): a reference to a named type already looked at is
/// answered from what that look found.
///
/// Counted, not timed (it took 249, 85, 85 and 80 looks below). A check
/// that followed every reference instead (as one once did: billions of
/// looks for `chain(30, 2)`) exceeds the bound on every chain here: with
/// those answers taken out, `chain(200, 1)` took 4,031 looks for its 805
/// types and `chain(30, 2)` 655,339 for its 155 (the width check stops it
/// at `R17`); the accepted `chain(20, 1)` took 505 for 85 and
/// `chain(15, 2)` 327,660 for 80.
#[test]
fn schemas_that_nest_too_deep_or_write_too_wide_are_refused_looking_once_at_each_type() {
    for (text, refused) in [
        (chain(200, 1), Some("nest")),
        (chain(30, 2), Some("values, more than")),
        (chain(20, 1), None),
        (chain(15, 2), None),
    ] {
        let written = types_written(&Schema::parse_str(&text).unwrap());
        let (parsed, work) = crate::work::of(|| AvroSchema::parse(&text, &[]));
        match (parsed, refused) {
            (Err(e), Some(why)) => assert!(e.to_string().contains(why), "{e}"),
            (Ok(_), None) => {}
            (parsed, _) => panic!("{parsed:?}, wanted refused: {refused:?}"),
        }
        eprintln!("{} looks for {written} types", work.steps);
        assert!(
            work.steps <= written,
            "{} looks for the {written} types of a schema of {} B",
            work.steps,
            text.len()
        );
    }
    let decimal = |p: u32, s: u32| {
        format!(
            r#"{{"type":"record","name":"D","fields":[{{"name":"d","type":{{"type":"bytes","logicalType":"decimal","precision":{p},"scale":{s}}}}}]}}"#
        )
    };
    assert!(AvroSchema::parse(&decimal(65535, 65535), &[]).is_err());
    AvroSchema::parse(&decimal(76, 76), &[]).unwrap();
    let zero_decimals = r#"{"type":"record","name":"Z","fields":[{"name":"a","type":{"type":"array","items":{"type":"fixed","name":"F0","size":0,"logicalType":"decimal","precision":4,"scale":0}}}]}"#;
    assert!(AvroSchema::parse(zero_decimals, &[]).is_err());
}

#[test]
fn a_row_stops_at_its_limit() {
    // An array of records of an int and 200 nulls: 200 values a byte.
    let nulls: Vec<String> = (0..200)
        .map(|i| format!(r#"{{"name":"n{i}","type":"null"}}"#))
        .collect();
    let s = format!(
        r#"{{"type":"record","name":"W","fields":[{{"name":"a","type":{{"type":"array","items":{{"type":"record","name":"I","fields":[{{"name":"x","type":"int"}},{}]}}}}}}]}}"#,
        nulls.join(",")
    );
    let schema = AvroSchema::parse(&s, &[]).unwrap();
    // 1000 items of one byte each.
    let mut payload = vec![0xd0, 0x0f];
    payload.extend(std::iter::repeat_n(0u8, 1000));
    payload.push(0);
    let mut out = b"kept".to_vec();
    let e = schema.to_json(&payload, &mut out, 100_000).unwrap_err();
    assert!(e.to_string().contains("larger than a row may be"), "{e}");
    assert_eq!(out, b"kept");
    schema.to_json(&payload, &mut out, usize::MAX).unwrap();
    assert!(out.len() > 1_000_000);
}

#[test]
fn no_part_of_a_schema_hides_behind_a_wide_record() {
    let wide: Vec<String> = (0..100_001)
        .map(|i| format!(r#"{{"name":"n{i}","type":"null"}}"#))
        .collect();
    let s = format!(
        r#"{{"type":"record","name":"Root","fields":[{{"name":"xs","type":{{"type":"array","items":{{"type":"record","name":"A","fields":[
            {{"name":"w","type":["int",{{"type":"record","name":"Wide","fields":[{}]}}]}},
            {{"name":"next","type":["null","A"]}}]}}}}}}]}}"#,
        wide.join(",")
    );
    let e = AvroSchema::parse(&s, &[]).unwrap_err().to_string();
    assert!(e.contains("more than 100000"), "{e}");
}

#[test]
fn maps_decimals_and_varints_are_held_to_their_bounds() {
    // A map of 1000 entries whose values write a long field name each.
    let name = "n".repeat(10_000);
    let s = format!(
        r#"{{"type":"record","name":"R","fields":[{{"name":"m","type":{{"type":"map","values":{{"type":"record","name":"V","fields":[{{"name":"{name}","type":"null"}}]}}}}}}]}}"#
    );
    let schema = AvroSchema::parse(&s, &[]).unwrap();
    let mut payload = vec![0xd0, 0x0f];
    payload.extend(std::iter::repeat_n(0u8, 1000)); // empty keys
    payload.push(0);
    let e = schema
        .to_json(&payload, &mut Vec::new(), 1 << 20)
        .unwrap_err();
    assert!(e.to_string().contains("larger than a row may be"), "{e}");

    let dec = AvroSchema::parse(
        r#"{"type":"record","name":"D","fields":[{"name":"d","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}}]}"#,
        &[],
    )
    .unwrap();
    let mut long = vec![0x80, 0x10]; // 1024 bytes
    long.extend(std::iter::repeat_n(0x7f, 1024));
    let e = dec.to_json(&long, &mut Vec::new(), usize::MAX).unwrap_err();
    assert!(e.to_string().contains("decimal of 1024 bytes"), "{e}");
    // Sign extension does not count: -1 written in 40 bytes.
    let mut minus_one = vec![80];
    minus_one.extend(std::iter::repeat_n(0xff, 40));
    assert_eq!(json(&dec, &minus_one), r#"{"d":"-0.01"}"#);

    let long_schema = r#"{"type":"record","name":"L","fields":[{"name":"l","type":"long"}]}"#;
    let l = AvroSchema::parse(long_schema, &[]).unwrap();
    let overlong = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
    assert!(l.to_json(&overlong, &mut Vec::new(), usize::MAX).is_err());
    let max = [0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
    assert_eq!(json(&l, &max), format!(r#"{{"l":{}}}"#, i64::MAX));
}
