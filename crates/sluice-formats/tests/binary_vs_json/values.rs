//! The generators of field values: each a JSON text marked in the
//! encoder's scope or an edge case, by type family; and the columns they
//! fill.

use proptest::prelude::*;
use proptest::sample::select;
use std::fmt::Write as _;

// ---- generated values --------------------------------------------------

/// One field's value as JSON text, and whether it is in the encoder's
/// scope (an edge case may fall back).
#[derive(Debug, Clone)]
pub(crate) struct Frag {
    pub(crate) text: Vec<u8>,
    pub(crate) good: bool,
}

pub(crate) type Gen = BoxedStrategy<Frag>;

pub(crate) fn good(s: impl Strategy<Value = String> + 'static) -> Gen {
    s.prop_map(|t| Frag {
        text: t.into_bytes(),
        good: true,
    })
    .boxed()
}

pub(crate) fn edge(s: impl Strategy<Value = String> + 'static) -> Gen {
    s.prop_map(|t| Frag {
        text: t.into_bytes(),
        good: false,
    })
    .boxed()
}

pub(crate) fn texts(list: &[&str]) -> BoxedStrategy<String> {
    select(list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).boxed()
}

pub(crate) fn goods(list: &[&str]) -> Gen {
    good(texts(list))
}

pub(crate) fn edges(list: &[&str]) -> Gen {
    edge(texts(list))
}

/// Strings matching a regular expression.
pub(crate) fn re(pattern: &str) -> BoxedStrategy<String> {
    proptest::string::string_regex(pattern).unwrap().boxed()
}

pub(crate) fn quoted(s: &str) -> String {
    format!("\"{s}\"")
}

/// One field of a row: its JSON key text, the column it fills (`ddl`:
/// name and type as `CREATE TABLE` takes them; `None`: a field the table
/// lacks) and its values.
pub(crate) struct Col {
    pub(crate) key: String,
    pub(crate) ddl: Option<String>,
    pub(crate) gen: Gen,
    /// In-scope values, for rows where another field is in focus (`None`:
    /// the field appears only in focus).
    pub(crate) good: Option<Gen>,
}

/// `c`, appearing only in focus.
pub(crate) fn focus_only(mut c: Col) -> Col {
    c.good = None;
    c
}

pub(crate) fn col(name: &str, ty: &str, good: Gen, edge: Gen) -> Col {
    Col {
        key: serde_json::to_string(name).unwrap(),
        ddl: Some(format!("`{name}` {ty}")),
        gen: prop_oneof![3 => good.clone(), 1 => edge].boxed(),
        good: Some(good),
    }
}

/// A field that names no column (key as JSON text).
pub(crate) fn extra(key: &str, good: Gen, edge: Gen) -> Col {
    Col {
        key: key.to_string(),
        ddl: None,
        gen: prop_oneof![3 => good.clone(), 1 => edge].boxed(),
        good: Some(good),
    }
}

pub(crate) fn with_null(g: Gen) -> Gen {
    prop_oneof![8 => g, 1 => goods(&["null"])].boxed()
}

// Integers.

pub(crate) fn incr(digits: &str) -> String {
    let mut d: Vec<u8> = digits.bytes().collect();
    let mut i = d.len();
    loop {
        if i == 0 {
            d.insert(0, b'1');
            break;
        }
        i -= 1;
        if d[i] == b'9' {
            d[i] = b'0';
        } else {
            d[i] += 1;
            break;
        }
    }
    String::from_utf8(d).unwrap()
}

pub(crate) fn int_bounds(bits: u32, signed: bool) -> (String, String) {
    match (bits, signed) {
        (256, true) => (
            "-57896044618658097711785492504343953926634992332820282019728792003956564819968".into(),
            "57896044618658097711785492504343953926634992332820282019728792003956564819967".into(),
        ),
        (256, false) => (
            "0".into(),
            "115792089237316195423570985008687907853269984665640564039457584007913129639935".into(),
        ),
        (b, true) => (
            (i128::MIN >> (128 - b)).to_string(),
            (i128::MAX >> (128 - b)).to_string(),
        ),
        (b, false) => ("0".into(), (u128::MAX >> (128 - b)).to_string()),
    }
}

pub(crate) fn int_text(bits: u32, signed: bool) -> BoxedStrategy<String> {
    match (bits, signed) {
        (256, true) => "-?[1-9][0-9]{0,75}".boxed(),
        (256, false) => "[1-9][0-9]{0,76}"
            .prop_filter("in range", |s| s.len() < 77 || s.as_str() < "1157")
            .boxed(),
        (b, true) => any::<i128>()
            .prop_map(move |v| (v >> (128 - b)).to_string())
            .boxed(),
        (b, false) => any::<u128>()
            .prop_map(move |v| (v >> (128 - b)).to_string())
            .boxed(),
    }
}

pub(crate) fn int_good(bits: u32, signed: bool) -> Gen {
    let (min, max) = int_bounds(bits, signed);
    let mut fixed = vec![min, max, "0".to_string(), "true".into(), "false".into()];
    if signed {
        fixed.push("-0".into());
    }
    good(prop_oneof![
        4 => int_text(bits, signed),
        2 => select(fixed),
        1 => int_text(bits, signed).prop_map(|t| quoted(&t)),
    ])
}

pub(crate) fn int_col(name: &str, bits: u32, signed: bool) -> Col {
    let (min, max) = int_bounds(bits, signed);
    let below = if signed {
        format!("-{}", incr(&min[1..]))
    } else {
        "-1".into()
    };
    let mut bad = vec![incr(&max), below, quoted(&incr(&max))];
    if !signed {
        bad.push("-0".into());
    }
    let bad = prop_oneof![
        select(bad),
        texts(&[
            "1.0", "1e2", "1.5", "0.0", "\"\"", "\" 1\"", "\"0x10\"", "\"1e2\"", "[]", "\"12a\"",
            "\"+1\"", "{}"
        ]),
    ];
    let ty = format!("{}Int{bits}", if signed { "" } else { "U" });
    col(name, &ty, with_null(int_good(bits, signed)), edge(bad))
}

// Floats.

pub(crate) fn float_text() -> BoxedStrategy<String> {
    let f64s = any::<u64>()
        .prop_map(f64::from_bits)
        .prop_filter("finite", |x| x.is_finite());
    let f32s = any::<u32>()
        .prop_map(f32::from_bits)
        .prop_filter("finite", |x| x.is_finite());
    prop_oneof![
        f64s.clone().prop_map(|x| format!("{x}")),
        f64s.clone().prop_map(|x| format!("{x:e}")),
        f64s.prop_map(|x| format!("{x:E}").replace("E", "E+").replace("E+-", "E-")),
        f32s.clone().prop_map(|x| format!("{x}")),
        f32s.prop_map(|x| format!("{x:e}")),
        any::<i64>().prop_map(|v| v.to_string()),
        "-?[1-9][0-9]{15,30}",
        "-?[0-9]\\.[0-9]{10,30}[eE]-?[0-9]{1,3}",
        "-?0\\.[0-9]{1,25}",
        (-2000i32..2000).prop_map(|e| format!("1e{e}")),
        texts(&[
            "-0",
            "-0.0",
            "0",
            "1e309",
            "-1e309",
            "4.9e-324",
            "2e-324",
            "1.7976931348623157e308",
            "3.4028235e38",
            "3.4028236e38",
            "1e39",
            "1e-46",
            "1.000000059604644775390625",
            "1.00000005960464477539062501",
            "16777217",
            "0.30000000000000004",
            "1E+2",
        ]),
    ]
    .boxed()
}

pub(crate) fn float_good() -> Gen {
    good(prop_oneof![
        6 => float_text(),
        1 => float_text().prop_map(|t| quoted(&t)),
        1 => texts(&["\"nan\"", "\"NaN\"", "\"inf\"", "\"-inf\"", "\"Infinity\"", "\"-Infinity\"", "true", "false"]),
    ])
}

pub(crate) fn float_col(name: &str, ty: &str) -> Col {
    let edge = edges(&[
        "\"\"",
        "\" 1\"",
        "\"+1\"",
        "\"-nan\"",
        "\"NAN\"",
        "\"INF\"",
        "\"infinity\"",
        "\".5\"",
        "\"1.\"",
        "\"0x1p3\"",
        "[1]",
        "{}",
        "\"1e\"",
    ]);
    col(name, ty, with_null(float_good()), edge)
}

// Strings.

/// JSON string text for `s`, each character escaped or not at random
/// (`seed` bits), `\uXXXX` in either case, astral characters as
/// surrogate pairs.
pub(crate) fn escaped(s: &str, seed: u64) -> String {
    let mut out = String::from("\"");
    for (i, c) in s.chars().enumerate() {
        let pick = (seed.rotate_left(i as u32 * 7) >> 3) % 4;
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' if pick == 0 => out.push_str("\\/"),
            '\n' if pick < 2 => out.push_str("\\n"),
            '\t' if pick < 2 => out.push_str("\\t"),
            '\u{8}' if pick < 2 => out.push_str("\\b"),
            '\u{c}' if pick < 2 => out.push_str("\\f"),
            '\r' if pick < 2 => out.push_str("\\r"),
            c if (c as u32) < 0x20 || pick == 1 => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    if pick == 3 {
                        write!(out, "\\u{u:04X}").unwrap();
                    } else {
                        write!(out, "\\u{u:04x}").unwrap();
                    }
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// JSON string text holding `bytes` as they are (a decoder's `bytes`
/// field, UTF-8 or not): only `"`, `\` and control bytes escaped.
pub(crate) fn raw_bytes(bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![b'"'];
    for &b in bytes {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b if b < 0x20 => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            b => out.push(b),
        }
    }
    out.push(b'"');
    out
}

/// A small JSON value, written with random whitespace.
pub(crate) fn json_value() -> BoxedStrategy<String> {
    let leaf = prop_oneof![
        any::<i32>().prop_map(|v| v.to_string()),
        float_text(),
        any::<String>().prop_map(|s| serde_json::to_string(&s).unwrap()),
        texts(&["true", "false", "null", "\"}\"", "\"]\"", "\"\\u00e9\\\"\""]),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        let ws = select(vec!["", " ", "\n  ", "\t"]);
        prop_oneof![
            (proptest::collection::vec(inner.clone(), 0..4), ws.clone())
                .prop_map(|(vs, w)| format!("[{w}{}{w}]", vs.join(&format!(",{w}")))),
            (
                proptest::collection::vec(("[a-z\u{e9}]{0,3}", inner), 0..4),
                ws
            )
                .prop_map(|(kv, w)| {
                    let body: Vec<String> = kv
                        .iter()
                        .map(|(k, v)| format!("{}{w}:{w}{v}", serde_json::to_string(k).unwrap()))
                        .collect();
                    format!("{{{w}{}{w}}}", body.join(&format!("{w},")))
                }),
        ]
    })
    .boxed()
}

pub(crate) fn string_good() -> Gen {
    let strings = prop_oneof![
        3 => any::<String>().prop_map(|s| serde_json::to_string(&s).unwrap()),
        2 => (any::<String>(), any::<u64>()).prop_map(|(s, seed)| escaped(&s, seed)),
        1 => ("[a-z/\"\\\\\n\t\u{1F600}\u{e9}]{0,12}", any::<u64>()).prop_map(|(s, seed)| escaped(&s, seed)),
    ];
    let raw = proptest::collection::vec(any::<u8>(), 0..16).prop_map(|b| Frag {
        text: raw_bytes(&b),
        good: true,
    });
    prop_oneof![
        6 => good(strings),
        2 => good(prop_oneof![float_text(), int_text(64, true), texts(&["true", "false", "-0", "0.000", "1.0E-7"])]),
        2 => good(json_value().prop_filter("composite", |v| v.starts_with(['[', '{']))),
        1 => raw.boxed(),
    ]
    .boxed()
}

pub(crate) fn string_edge() -> Gen {
    edges(&[
        "\"\\a\"",
        "\"\\ud800\"",
        "\"\\udc00\"",
        "\"\\ud83dx\"",
        "\"\\ud83d\\u0041\"",
        "\"\\x41\"",
        "\"\\'\"",
        "\"a\tb\"",
        "\"\\U00e9\"",
    ])
}

pub(crate) fn fixed_good(n: usize) -> Gen {
    let pattern = format!("[a-z\u{e9}\"\\\\]{{0,{n}}}");
    good(
        (re(&pattern), any::<u64>())
            .prop_filter("fits", move |(s, _)| s.len() <= n)
            .prop_map(|(s, seed)| escaped(&s, seed)),
    )
}

// Decimals.

pub(crate) fn decimal_text(
    p: usize,
    s: usize,
    int_digits: std::ops::RangeInclusive<usize>,
) -> BoxedStrategy<String> {
    (
        any::<bool>(),
        int_digits,
        0..=s + 3,
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(move |(neg, ni, nf, a, b)| {
            let digits = |n: usize, seed: u64| -> String {
                (0..n)
                    .map(|i| char::from(b'0' + (seed.rotate_left(i as u32 * 5) % 10) as u8))
                    .collect()
            };
            let int = if ni == 0 {
                "0".to_string()
            } else {
                format!("{}{}", 1 + a % 9, digits(ni - 1, a / 9))
            };
            let frac = digits(nf, b);
            let sign = if neg { "-" } else { "" };
            let _ = p;
            if frac.is_empty() {
                format!("{sign}{int}")
            } else {
                format!("{sign}{int}.{frac}")
            }
        })
        .boxed()
}

pub(crate) fn decimal_col(name: &str, p: usize, s: usize) -> Col {
    let fits = decimal_text(p, s, 0..=p - s);
    let goods_ = prop_oneof![3 => fits.clone(), 1 => fits.prop_map(|t| quoted(&t))];
    let over = decimal_text(p, s, p - s + 1..=p - s + 3);
    let bad = prop_oneof![
        3 => over,
        2 => texts(&[
            "1e2", "1.5e-1", "1.23E+1", "0.0e999", "1e-1000", "\"+1.5\"", "\".5\"", "\"5.\"", "\"\"", "\"nan\"",
            "true", "\"1e2\"",
        ]),
    ];
    col(
        name,
        &format!("Decimal({p}, {s})"),
        with_null(good(goods_)),
        edge(bad),
    )
}

// Dates and times.

pub(crate) fn ymd(days: i64) -> String {
    (chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap() + chrono::TimeDelta::days(days))
        .format("%Y-%m-%d")
        .to_string()
}

pub(crate) fn date_col(name: &str, ty: &str, lo: i64, hi: i64) -> Col {
    let goods_ = prop_oneof![
        3 => (lo..=hi).prop_map(|d| quoted(&ymd(d))),
        1 => select(vec![lo, hi]).prop_map(|d| quoted(&ymd(d))),
        2 => (lo..=hi).prop_map(|d| d.to_string()),
    ];
    let bad = prop_oneof![
        select(vec![lo - 1, hi + 1]).prop_map(|d| quoted(&ymd(d))),
        select(vec![lo - 1, hi + 1]).prop_map(|d| d.to_string()),
        texts(&[
            "\"2024-1-2\"",
            "\"2024-02-30\"",
            "\"20240102\"",
            "\"2024-01-02 03:04:05\"",
            "\"2024\\u002d01-02\"",
            "1.5",
            "\"19000\"",
            "-0",
            "\"\"",
            "65536",
        ]),
    ];
    col(name, ty, with_null(good(goods_)), edge(bad))
}

/// A time column's shape, for its generators.
#[derive(Clone, Copy)]
pub(crate) struct TimeCol {
    /// `None`: `DateTime`; else `DateTime64(p)`.
    pub(crate) precision: Option<u32>,
    pub(crate) utc: bool,
}

/// The settings a family is generated for.
#[derive(Clone, Copy)]
pub(crate) struct Mode {
    pub(crate) best_effort: bool,
    /// `input_format_read_datetime_number_as_raw_value`.
    pub(crate) raw: bool,
    /// `input_format_skip_unknown_fields`.
    pub(crate) skip_unknown: bool,
}

pub(crate) fn time_text(secs: i64, sep: char, frac: &str, zone: &str) -> String {
    let t = chrono::DateTime::from_timestamp(secs, 0)
        .unwrap()
        .naive_utc();
    let f = if frac.is_empty() {
        String::new()
    } else {
        format!(".{frac}")
    };
    quoted(&format!(
        "{}{sep}{}{f}{zone}",
        t.format("%Y-%m-%d"),
        t.format("%H:%M:%S")
    ))
}

pub(crate) fn time_col(name: &str, ty: &str, tc: TimeCol, mode: Mode) -> Col {
    let (lo, hi) = match tc.precision {
        None => (0i64, i64::from(u32::MAX)),
        Some(9) => (-2_208_988_800, 9_223_372_035),
        Some(_) => (-2_208_988_800, 10_413_791_999),
    };
    let p = tc.precision.unwrap_or(0) as usize;
    let frac = move |n: usize| re(&format!("[0-9]{{{n}}}"));
    let fraction_ok = tc.precision.is_some() || mode.best_effort;
    let mut forms: Vec<(u32, Gen)> = Vec::new();
    let local = move |scope: bool| -> Gen {
        let s = (lo..=hi, select(vec![' ', 'T'])).prop_map(|(s, sep)| time_text(s, sep, "", ""));
        if scope {
            good(s)
        } else {
            edge(s)
        }
    };
    forms.push((3, local(tc.utc)));
    let midnight = (lo / 86_400 + 1..=hi / 86_400).prop_map(|d| quoted(&ymd(d)));
    forms.push((
        1,
        if tc.utc {
            good(midnight)
        } else {
            edge(midnight)
        },
    ));
    let fractional = (lo..=hi, 1..=p.max(1) + 2).prop_flat_map(move |(s, n)| (Just(s), frac(n)));
    let fractional = fractional.prop_map(|(s, f)| time_text(s, ' ', &f, ""));
    forms.push((
        2,
        if tc.utc && fraction_ok {
            good(fractional)
        } else {
            edge(fractional)
        },
    ));
    // With an offset: the wall-clock time `shift` ahead of UTC.
    let zoned = (lo + 86_400..=hi - 86_400, -56i64..=56, 0..3usize, 0..=p + 1)
        .prop_flat_map(move |(s, q, z, n)| (Just(s), Just(q), Just(z), frac(n)))
        .prop_map(|(s, q, z, f)| {
            let shift = q * 900;
            let zone = match (z, shift) {
                (0, _) => "Z".to_string(),
                (1, _) => format!(
                    "{}{:02}:{:02}",
                    if shift < 0 { '-' } else { '+' },
                    shift.abs() / 3600,
                    shift.abs() / 60 % 60
                ),
                _ => format!(
                    "{}{:02}{:02}",
                    if shift < 0 { '-' } else { '+' },
                    shift.abs() / 3600,
                    shift.abs() / 60 % 60
                ),
            };
            let shift = if z == 0 { 0 } else { shift };
            time_text(s + shift, 'T', &f, &zone)
        });
    forms.push((
        2,
        if mode.best_effort && fraction_ok {
            good(zoned)
        } else {
            edge(zoned)
        },
    ));
    let ints = match (tc.precision, mode.raw) {
        (None, _) => good((lo..=hi).prop_map(|s| s.to_string())),
        (Some(p), true) => {
            let scale = 10i64.pow(p);
            good((lo..=hi).prop_flat_map(move |s| {
                (0..scale).prop_map(move |f| s.saturating_mul(scale).saturating_add(f).to_string())
            }))
        }
        (Some(_), false) => good((lo..=hi).prop_map(|s| s.to_string())),
    };
    forms.push((2, ints));
    if tc.precision.is_some() && !mode.raw {
        let num = (lo + 1..=hi - 1, 1..=p + 2).prop_flat_map(move |(s, n)| (Just(s), frac(n)));
        forms.push((2, good(num.prop_map(|(s, f)| format!("{s}.{f}")))));
    }
    let edge_texts = edges(&[
        "\"2024-01-02 24:00:00\"",
        "\"2024-01-02 03:04\"",
        "\"2024-01-02 03:04:05 \"",
        "\"2024-1-2 3:4:5\"",
        "\"1700000000\"",
        "\"20240102\"",
        "\"2024-01-02t03:04:05z\"",
        "\"2024-01-02T03:04:05+1\"",
        "\"1969-12-31 23:59:59\"",
        "\"2106-02-07 06:28:16\"",
        "-1",
        "4294967296",
        "1e3",
        "1.5",
        "\"2024-01-02 03:04:05.\"",
        "\"2024-01-02 03:04:05,123\"",
        "\"2262-04-11 23:47:17\"",
        "\"1899-12-31 23:59:59\"",
        "\"2300-01-01 00:00:00\"",
        "\"2024-01-02 03:04:05\\u0020\"",
        "true",
    ]);
    let goods_: Vec<(u32, Gen)> = forms;
    let mixed = proptest::strategy::Union::new_weighted(goods_).boxed();
    // Only the forms in scope count as good; the union keeps each
    // fragment's own mark.
    Col {
        key: serde_json::to_string(name).unwrap(),
        ddl: Some(format!("`{name}` {ty}")),
        gen: prop_oneof![5 => mixed.clone(), 1 => edge_texts, 1 => goods(&["null"])].boxed(),
        good: Some(mixed.prop_filter("in scope", |f| f.good).boxed()),
    }
}
