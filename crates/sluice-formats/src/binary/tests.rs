//! The binary encoder without a server: each type's encoding of values
//! whose bytes are known (unit tests and properties), the row's flags, and
//! the fallbacks. `tests/binary_vs_json.rs` checks the same rules against
//! the engine.

use super::server_defaults;
use super::*;
use proptest::prelude::*;

fn enc(ty: &str, json: &str) -> Result<Vec<u8>, Fallback> {
    encode_value(&Type::parse(ty), &server_defaults(), json.as_bytes())
}

fn ok(ty: &str, json: &str) -> Vec<u8> {
    enc(ty, json).unwrap_or_else(|e| panic!("{ty} from {json}: {e}"))
}

fn falls_back(ty: &str, json: &str) {
    assert!(
        enc(ty, json).is_err(),
        "{ty} from {json} should fall back, got {:?}",
        enc(ty, json)
    );
}

fn spec(name: &str, ty: &str, kind: DefaultKind) -> ColumnSpec {
    ColumnSpec {
        name: name.into(),
        type_name: ty.into(),
        default_kind: kind,
    }
}

#[test]
fn integers() {
    assert_eq!(ok("Int8", "-128"), [0x80]);
    assert_eq!(ok("UInt16", "65535"), [0xff, 0xff]);
    assert_eq!(ok("Int32", "\"-7\""), (-7i32).to_le_bytes());
    assert_eq!(ok("Int64", "true"), 1i64.to_le_bytes());
    assert_eq!(ok("UInt8", "false"), [0]);
    assert_eq!(ok("Int128", "-1"), [0xff; 16]);
    for (ty, v) in [
        ("Int8", "128"),
        ("UInt8", "-1"),
        ("UInt8", "-0"),
        ("Int32", "1.0"),
        ("Int32", "1e2"),
        ("Int32", "\"\""),
        ("Int32", "\" 1\""),
        ("Int32", "[]"),
    ] {
        falls_back(ty, v);
    }
}

#[test]
fn floats() {
    assert_eq!(ok("Float64", "-0"), (-0.0f64).to_le_bytes());
    assert_eq!(ok("Float64", "1E+2"), 100f64.to_le_bytes());
    assert_eq!(ok("Float64", "1e309"), f64::INFINITY.to_le_bytes());
    assert_eq!(ok("Float64", "\"nan\""), f64::NAN.to_le_bytes());
    assert_eq!(
        ok("Float32", "\"-Infinity\""),
        f32::NEG_INFINITY.to_le_bytes()
    );
    assert_eq!(ok("Float32", "3.4028236e38"), f32::INFINITY.to_le_bytes());
    // Straight to f32, not through f64.
    assert_eq!(
        ok("Float32", "1.00000005960464477539062501"),
        1.000_000_1f32.to_le_bytes()
    );
    assert_eq!(ok("Float32", "true"), 1f32.to_le_bytes());
    falls_back("Float64", "\"\"");
    falls_back("Float64", "\"-nan\"");
    let mut s = server_defaults();
    s.precise_float_parsing = false;
    assert!(encode_value(&Type::Float64, &s, b"1.5").is_err());
}

#[test]
fn strings_take_any_json_value_as_text() {
    assert_eq!(ok("String", r#""a\"b\u00e9""#), b"\x05a\"b\xc3\xa9");
    assert_eq!(ok("String", "-1.50"), b"\x05-1.50");
    assert_eq!(ok("String", "true"), b"\x04true");
    assert_eq!(ok("String", r#"{"a": [1, 2] }"#), b"\x0e{\"a\": [1, 2] }");
    assert_eq!(ok("LowCardinality(String)", "[ ]"), b"\x03[ ]");
    assert_eq!(ok("FixedString(3)", "\"ab\""), b"ab\0");
    falls_back("FixedString(3)", "\"abcd\"");
    falls_back("FixedString(3)", "12");
    falls_back("String", r#""\a""#);
}

#[test]
fn decimals_cut_toward_zero() {
    assert_eq!(ok("Decimal(9, 2)", "1.009"), 100i32.to_le_bytes());
    assert_eq!(ok("Decimal(9, 2)", "\"-1.009\""), (-100i32).to_le_bytes());
    assert_eq!(ok("Decimal(18, 4)", "12"), 120_000i64.to_le_bytes());
    assert_eq!(
        ok("Decimal(38, 10)", "-0.12345678905"),
        (-1_234_567_890i128).to_le_bytes()
    );
    falls_back("Decimal(9, 2)", "1e2");
    falls_back("Decimal(9, 2)", "10000000");
    falls_back("Decimal(9, 2)", "true");
}

#[test]
fn dates_and_times() {
    assert_eq!(ok("Date", "\"2024-01-02\""), 19724u16.to_le_bytes());
    assert_eq!(ok("Date", "19724"), 19724u16.to_le_bytes());
    assert_eq!(ok("Date32", "\"1900-01-01\""), (-25567i32).to_le_bytes());
    assert_eq!(ok("Date32", "-1"), (-1i32).to_le_bytes());
    falls_back("Date", "\"1969-12-31\"");
    falls_back("Date", "65536");
    falls_back("Date", "-0");
    assert_eq!(
        ok("DateTime", "\"2024-01-02 03:04:05\""),
        1_704_164_645u32.to_le_bytes()
    );
    assert_eq!(
        ok("DateTime('UTC')", "\"2024-01-02T03:04:05.9+01:00\""),
        1_704_161_045u32.to_le_bytes()
    );
    assert_eq!(
        ok("DateTime('Asia/Tokyo')", "1700000000"),
        1_700_000_000u32.to_le_bytes()
    );
    assert_eq!(
        ok("DateTime('Asia/Tokyo')", "\"2024-01-02T03:04:05Z\""),
        1_704_164_645u32.to_le_bytes()
    );
    falls_back("DateTime('Asia/Tokyo')", "\"2024-01-02 03:04:05\"");
    falls_back("DateTime", "\"1969-12-31 23:59:59\"");
    falls_back("DateTime", "4294967296");
    falls_back("DateTime", "-1");
    falls_back("DateTime", "1.5");
    assert_eq!(
        ok("DateTime64(3)", "\"2024-01-02 03:04:05.1239\""),
        1_704_164_645_123i64.to_le_bytes()
    );
    assert_eq!(ok("DateTime64(3)", "-1.5"), (-1500i64).to_le_bytes());
    assert_eq!(
        ok("DateTime64(3)", "1700000000"),
        1_700_000_000_000i64.to_le_bytes()
    );
    assert_eq!(
        ok("DateTime64(9, 'UTC')", "\"2262-04-11 23:47:16.854775807\""),
        i64::MAX.to_le_bytes()
    );
    falls_back("DateTime64(9, 'UTC')", "\"2262-04-11 23:47:17\"");
    falls_back("DateTime64(3)", "1e3");
    let mut s = server_defaults();
    s.date_time_input_format = DateTimeInput::Basic;
    let basic = |ty: &str, v: &str| encode_value(&Type::parse(ty), &s, v.as_bytes());
    assert!(basic("DateTime", "\"2024-01-02T03:04:05Z\"").is_err());
    assert!(basic("DateTime", "\"2024-01-02 03:04:05.5\"").is_err());
    assert!(basic("DateTime64(3)", "\"2024-01-02 03:04:05.5\"").is_ok());
    s.datetime_number_as_raw = Some(true);
    let raw = encode_value(&Type::parse("DateTime64(3)"), &s, b"1700000000123").unwrap();
    assert_eq!(raw, 1_700_000_000_123i64.to_le_bytes());
    s.datetime_number_as_raw = None;
    assert!(encode_value(&Type::parse("DateTime64(3)"), &s, b"1").is_err());
}

#[test]
fn uuids_and_ips() {
    let u = ok("UUID", "\"61f0c404-5cb3-11e7-907b-a6006ad3dba0\"");
    let mut want = 0x61f0c4045cb311e7u64.to_le_bytes().to_vec();
    want.extend_from_slice(&0x907ba6006ad3dba0u64.to_le_bytes());
    assert_eq!(u, want);
    assert_eq!(ok("IPv4", "\"1.2.3.4\""), 0x01020304u32.to_le_bytes());
    assert_eq!(ok("IPv6", "\"1.2.3.4\"")[10..], [0xff, 0xff, 1, 2, 3, 4]);
    assert_eq!(ok("IPv6", "\"2001:DB8::1\"")[..4], [0x20, 0x01, 0x0d, 0xb8]);
    falls_back("IPv4", "\"01.2.3.4\"");
    falls_back("IPv4", "16909060");
    falls_back("IPv6", "\"fe80::1%eth0\"");
}

#[test]
fn enums_by_name_and_value() {
    let e = "Enum8('a' = 1, 'b' = -2, 'c\\'d' = 3)";
    assert_eq!(ok(e, "\"b\""), [0xfe]);
    assert_eq!(ok(e, "\"c'd\""), [3]);
    assert_eq!(ok(e, "-2"), [0xfe]);
    assert_eq!(ok("Enum16('x' = 1000)", "\"x\""), 1000i16.to_le_bytes());
    for v in ["\"A\"", "5", "\"1\"", "true"] {
        falls_back(e, v);
    }
}

#[test]
fn composites_and_nulls() {
    assert_eq!(ok("Nullable(Int8)", "null"), [1]);
    assert_eq!(ok("Nullable(Int8)", "5"), [0, 5]);
    assert_eq!(ok("Array(Int8)", "[1, null ,3]"), [3, 1, 0, 3]);
    assert_eq!(ok("Array(Nullable(Int8))", "[1,null]"), [2, 0, 1, 1]);
    assert_eq!(ok("Array(Int8)", "null"), [0]);
    assert_eq!(
        ok("Map(String, Int8)", r#"{"a":1,"a":2}"#),
        [2, 1, b'a', 1, 1, b'a', 2]
    );
    assert_eq!(
        ok("Map(Int16, String)", r#"{"-2":"x"}"#),
        [1, 0xfe, 0xff, 1, b'x']
    );
    assert_eq!(ok("Tuple(Int8, String)", r#"[1,"a"]"#), [1, 1, b'a']);
    assert_eq!(
        ok("Tuple(a Int8, b String)", r#"{"b":"x","zz":[1],"a":2}"#),
        [2, 1, b'x']
    );
    assert_eq!(
        ok("Tuple(a Int8, b Nullable(String))", r#"{"a":1}"#),
        [1, 1]
    );
    falls_back("Tuple(Int8, String)", "[1]");
    falls_back("Tuple(a Int8, b String)", r#"[1,"x"]"#);
    falls_back("Tuple(a Int8, b String)", r#"{"a":1,"a":2}"#);
    falls_back("Tuple(a Int8, b String)", r#"{"A":1}"#);
    falls_back("Tuple(a Int8, b String)", r#"{"\u0061":1}"#);
    assert_eq!(ok("Map(String, Int8)", r#"{"\u0061":1}"#), [1, 1, b'a', 1]);
    falls_back("Map(Int16, String)", r#"{"a":"x"}"#);
    // A composite's null element of an Enum without 0.
    falls_back("Array(Enum8('x' = 5))", "[null]");
    assert_eq!(ok("Array(Enum8('x' = 5, 'z' = 0))", "[null]"), [1, 0]);
}

fn layout(cols: &[ColumnSpec]) -> Layout {
    Layout::new(cols, server_defaults())
}

fn row(l: &Layout, json: &str) -> Result<Vec<u8>, Fallback> {
    let mut out = vec![0xaa];
    let r = l.encode(json.as_bytes(), &mut out);
    if r.is_err() {
        assert_eq!(out, [0xaa], "out changed on a fallback");
    }
    r.map(|()| out[1..].to_vec())
}

#[test]
fn rows_flag_missing_and_null_fields() {
    let l = layout(&[
        spec("o", "UInt8", DefaultKind::None),
        spec("a", "Int8", DefaultKind::Default),
        spec("n", "Nullable(Int8)", DefaultKind::Default),
        spec("m", "Int8", DefaultKind::Materialized),
        spec("e", "Enum8('x' = 5, 'y' = 2)", DefaultKind::None),
        spec(
            "t",
            "Tuple(Int8, Enum8('x' = 5, 'y' = 2))",
            DefaultKind::None,
        ),
        spec("d", "Enum8('x' = 5, 'y' = 2)", DefaultKind::Default),
        spec("j", "JSON", DefaultKind::Default),
    ]);
    assert_eq!(l.columns().len(), 7);
    // Missing: the flag, except where the type's default is not the
    // column's zero (an Enum without a DEFAULT): written out.
    assert_eq!(
        row(&l, r#"{"o":1}"#).unwrap(),
        [0, 1, 1, 1, 0, 2, 0, 0, 2, 1, 1]
    );
    // null: the flag for a column that is not Nullable, NULL in one.
    assert_eq!(
        row(
            &l,
            r#"{"o":1,"a":null,"n":null,"e":null,"t":null,"d":null}"#
        )
        .unwrap(),
        [0, 1, 1, 0, 1, 1, 1, 1, 1]
    );
    // Keys are matched unescaped; unknown ones are skipped (a MATERIALIZED
    // column's name is one).
    assert_eq!(
        row(&l, r#"{"\u006f":1,"m":5,"zz":{"x":[1]}}"#).unwrap()[..2],
        [0, 1]
    );
    for bad in [
        r#"{"o":1,"o":2}"#,
        r#"{"O":1}"#,
        r#"{"o":1,"j":{}}"#,
        r#"{"o":1} {"o":2}"#,
        r#"{"o":256}"#,
        r#"[1]"#,
        r#"{"o":1"#,
        r#"{"é":1}"#,
    ] {
        assert!(row(&l, bad).is_err(), "{bad}");
    }
    let e = row(&l, r#"{"o":1,"a":1.5}"#).unwrap_err();
    assert_eq!(e.column, Some(1));
}

#[test]
fn layouts_that_cannot_be_mirrored() {
    let eph = layout(&[
        spec("o", "UInt8", DefaultKind::None),
        spec("x", "UInt8", DefaultKind::Ephemeral),
    ]);
    assert!(eph.unusable().is_some());
    assert!(row(&eph, r#"{"o":1}"#).is_err());
    let case = layout(&[
        spec("a", "UInt8", DefaultKind::None),
        spec("A", "UInt8", DefaultKind::None),
    ]);
    assert!(case.unusable().is_some());
    let nested = layout(&[
        spec("o", "UInt8", DefaultKind::None),
        spec("n.x", "Array(UInt8)", DefaultKind::None),
    ]);
    assert!(row(&nested, r#"{"o":1}"#).is_err());
    let mut s = server_defaults();
    s.skip_unknown_fields = false;
    let strict = Layout::new(&[spec("o", "UInt8", DefaultKind::None)], s);
    assert!(row(&strict, r#"{"o":1}"#).is_ok());
    assert!(row(&strict, r#"{"o":1,"x":2}"#).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_i64_and_u64_is_its_bytes(v in any::<i64>(), u in any::<u64>()) {
        prop_assert_eq!(ok("Int64", &v.to_string()), v.to_le_bytes());
        prop_assert_eq!(ok("UInt64", &u.to_string()), u.to_le_bytes());
        prop_assert_eq!(ok("Int64", &format!("\"{v}\"")), v.to_le_bytes());
        prop_assert_eq!(ok("Int128", &v.to_string()), i128::from(v).to_le_bytes());
        let n = i128::from(v) * i128::from(u);
        prop_assert_eq!(ok("Int128", &n.to_string()), n.to_le_bytes());
        let small = v as i8;
        prop_assert_eq!(ok("Int8", &small.to_string()), small.to_le_bytes());
        if v > i64::from(i8::MAX) || v < i64::from(i8::MIN) {
            prop_assert!(enc("Int8", &v.to_string()).is_err());
        }
    }

    #[test]
    fn every_float_reads_back_from_its_text(bits in any::<u64>(), bits32 in any::<u32>()) {
        let x = f64::from_bits(bits);
        prop_assume!(x.is_finite());
        for text in [format!("{x}"), format!("{x:e}"), format!("{x:E}")] {
            prop_assert_eq!(ok("Float64", &text), x.to_le_bytes());
        }
        let y = f32::from_bits(bits32);
        prop_assume!(y.is_finite());
        prop_assert_eq!(ok("Float32", &format!("{y:e}")), y.to_le_bytes());
        prop_assert_eq!(ok("Float32", &format!("\"{y}\"")), y.to_le_bytes());
    }

    #[test]
    fn every_string_reads_back(s in any::<String>(), raw in proptest::collection::vec(any::<u8>(), 0..20)) {
        let json = serde_json::to_string(&s).unwrap();
        let mut want = Vec::new();
        encode::varint(s.len() as u64, &mut want);
        want.extend_from_slice(s.as_bytes());
        prop_assert_eq!(ok("String", &json), want);
        // Bytes that are not UTF-8 (a decoder's `bytes`) go through as they are.
        let mut text = vec![b'"'];
        crate::json_text::string(&mut text, &raw);
        let text = &text[1..];
        let got = encode_value(&Type::String, &server_defaults(), text).unwrap();
        let mut want = Vec::new();
        encode::varint(raw.len() as u64, &mut want);
        want.extend_from_slice(&raw);
        prop_assert_eq!(got, want);
    }

    #[test]
    fn every_decimal_reads_back(v in any::<i64>(), scale in 0u8..=18) {
        let p = 18u8;
        let s = usize::from(scale);
        let digits = v.unsigned_abs().to_string();
        let digits = format!("{digits:0>width$}", width = s + 1);
        let (i, f) = digits.split_at(digits.len() - s);
        let text = format!("{}{i}{}{f}", if v < 0 { "-" } else { "" }, if s > 0 { "." } else { "" });
        let ty = format!("Decimal({p}, {scale})");
        let int_digits = if i == "0" { 0 } else { i.len() };
        if int_digits <= usize::from(p - scale) {
            prop_assert_eq!(ok(&ty, &text), v.to_le_bytes());
            // One more digit past the scale is cut off.
            if s > 0 {
                prop_assert_eq!(ok(&ty, &format!("{text}7")), v.to_le_bytes());
            }
        } else {
            prop_assert!(enc(&ty, &text).is_err());
        }
    }

    #[test]
    fn every_date_reads_back(days in -25_567i64..=120_529, secs in 0u32..86_400, ms in 0u32..1000) {
        let d = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap() + chrono::Days::new(0) + chrono::TimeDelta::days(days);
        let text = format!("\"{}\"", d.format("%Y-%m-%d"));
        prop_assert_eq!(ok("Date32", &text), (days as i32).to_le_bytes());
        if (0..=65_535).contains(&days) {
            prop_assert_eq!(ok("Date", &text), (days as u16).to_le_bytes());
        } else {
            prop_assert!(enc("Date", &text).is_err());
        }
        let t = chrono::NaiveTime::from_num_seconds_from_midnight_opt(secs, 0).unwrap();
        let stamp = days * 86_400 + i64::from(secs);
        let text = format!("\"{} {}.{ms:03}\"", d.format("%Y-%m-%d"), t.format("%H:%M:%S"));
        prop_assert_eq!(ok("DateTime64(3, 'UTC')", &text), (stamp * 1000 + i64::from(ms)).to_le_bytes());
        let text = format!("\"{}T{}Z\"", d.format("%Y-%m-%d"), t.format("%H:%M:%S"));
        match u32::try_from(stamp) {
            Ok(s) => prop_assert_eq!(ok("DateTime", &text), s.to_le_bytes()),
            Err(_) => prop_assert!(enc("DateTime", &text).is_err()),
        }
    }

    #[test]
    fn every_address_reads_back(v4 in any::<u32>(), v6 in any::<u128>()) {
        let a = std::net::Ipv4Addr::from(v4);
        prop_assert_eq!(ok("IPv4", &format!("\"{a}\"")), v4.to_le_bytes());
        let b = std::net::Ipv6Addr::from(v6);
        prop_assert_eq!(ok("IPv6", &format!("\"{b}\"")), v6.to_be_bytes());
        let u = format!("\"{:032x}\"", v6);
        let mut want = ((v6 >> 64) as u64).to_le_bytes().to_vec();
        want.extend_from_slice(&(v6 as u64).to_le_bytes());
        prop_assert_eq!(ok("UUID", &u), want);
    }

    #[test]
    fn arrays_and_maps_count_their_elements(vs in proptest::collection::vec(any::<i16>(), 0..300)) {
        let json = serde_json::to_string(&vs).unwrap();
        let mut want = Vec::new();
        encode::varint(vs.len() as u64, &mut want);
        for v in &vs {
            want.extend_from_slice(&v.to_le_bytes());
        }
        prop_assert_eq!(ok("Array(Int16)", &json), want);
        let map: Vec<String> = vs.iter().map(|v| format!("\"{v}\":{v}")).collect();
        let json = format!("{{{}}}", map.join(","));
        let mut want = Vec::new();
        encode::varint(vs.len() as u64, &mut want);
        for v in &vs {
            want.extend_from_slice(&v.to_le_bytes());
            want.extend_from_slice(&i32::from(*v).to_le_bytes());
        }
        prop_assert_eq!(ok("Map(Int16, Int32)", &json), want);
    }
}
