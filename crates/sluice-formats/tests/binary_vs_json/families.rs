//! The families' columns beyond the scalar ones: UUIDs and addresses,
//! enums, Nullable, arrays, maps and tuples, and the fields that test
//! missing values, defaults and keys the table lacks.

use crate::values::*;
use proptest::prelude::*;
use proptest::sample::select;

// UUIDs and addresses.

pub(crate) fn uuid_col() -> Col {
    let forms = (any::<u128>(), 0..4u8).prop_map(|(v, f)| {
        let h = format!("{v:032x}");
        let dashed = format!(
            "{}-{}-{}-{}-{}",
            &h[..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..]
        );
        quoted(&match f {
            0 => dashed,
            1 => dashed.to_uppercase(),
            2 => h,
            _ => h.to_uppercase(),
        })
    });
    let edge = edges(&[
        "\"{61f0c404-5cb3-11e7-907b-a6006ad3dba0}\"",
        "\"\"",
        "\"61f0c404-5cb3-11e7-907b-a6006ad3dbaz\"",
        "1",
        "\"61f0c404-5cb311e7-907b-a6006ad3dba0\"",
        "\"61f0c4045cb311e7907ba6006ad3dba\"",
    ]);
    col("u", "UUID", with_null(good(forms)), edge)
}

pub(crate) fn ipv4_text() -> BoxedStrategy<String> {
    any::<u32>()
        .prop_map(|v| std::net::Ipv4Addr::from(v).to_string())
        .boxed()
}

pub(crate) fn ip_cols() -> Vec<Col> {
    let v4_edge = edges(&[
        "\"01.2.3.4\"",
        "\"1.2.3\"",
        "\"256.1.1.1\"",
        "\"\"",
        "16909060",
        "\"16909060\"",
        "\" 1.2.3.4\"",
        "\"1.2.3.4 \"",
        "\"1.2.3.04\"",
    ]);
    let v6 = prop_oneof![
        3 => any::<u128>().prop_map(|v| std::net::Ipv6Addr::from(v).to_string()),
        1 => any::<[u16; 8]>().prop_map(|g| g.iter().map(|x| format!("{x:04X}")).collect::<Vec<_>>().join(":")),
        1 => ipv4_text(),
        1 => ipv4_text().prop_map(|v| format!("::ffff:{v}")),
        1 => texts(&["::", "::1", "1::", "2001:db8::1", "::1.2.3.4", "1:2:3:4:5:6:1.2.3.4"]),
        1 => (any::<u64>(), 0..8usize).prop_map(|(v, n)| {
            let g: Vec<String> = (0..8).map(|i| format!("{:x}", (v >> (i * 8)) & 0xff)).collect();
            format!("{}::{}", g[..n].join(":"), g[n..7].join(":"))
        }),
    ];
    let v6_edge = edges(&[
        "\"1:2:3:4:5:6:7:8:9\"",
        "\"fe80::1%eth0\"",
        "\"\"",
        "\"[::1]\"",
        "\"1::2::3\"",
        "\":::\"",
        "\"12345::\"",
        "\"::ffff:01.2.3.4\"",
        "\"01.2.3.4\"",
        "\"1:2:3:4:5:6:7\"",
    ]);
    vec![
        col(
            "v4",
            "IPv4",
            with_null(good(ipv4_text().prop_map(|t| quoted(&t)))),
            v4_edge,
        ),
        col(
            "v6",
            "IPv6",
            with_null(good(v6.prop_map(|t| quoted(&t)))),
            v6_edge,
        ),
    ]
}

// Enums.

pub(crate) fn enum_cols() -> Vec<Col> {
    vec![
        col(
            "e8",
            "Enum8('a' = 1, 'b' = -2, 'c\\'d' = 3, '' = 4, 'é' = 5)",
            with_null(goods(&[
                "\"a\"", "\"b\"", "\"c'd\"", "\"\"", "\"é\"", "1", "-2", "5",
            ])),
            edges(&[
                "\"A\"",
                "\"x\"",
                "6",
                "\"1\"",
                "\"-2\"",
                "\"\\u00e9\"",
                "true",
                "1.0",
                "-0",
            ]),
        ),
        col(
            "e16",
            "Enum16('x' = 1000, 'y' = -1000, 'z' = 0)",
            with_null(goods(&["\"x\"", "\"y\"", "\"z\"", "1000", "-1000", "0"])),
            edges(&["\"X\"", "1001", "\"0\"", "\"\""]),
        ),
        col(
            "ez",
            "Enum8('x' = 5, 'y' = 2)",
            with_null(goods(&["\"x\"", "\"y\"", "5", "2"])),
            edges(&["\"\"", "0", "\"5\""]),
        ),
    ]
}

// Nullable.

pub(crate) fn nullable_cols() -> Vec<Col> {
    let n = |name: &str, ty: &str, inner: Gen, edge: Gen| {
        col(
            name,
            ty,
            prop_oneof![2 => goods(&["null"]), 3 => inner].boxed(),
            edge,
        )
    };
    let not_null = edges(&["\"null\"", "\"NULL\"", "\"\\\\N\"", "\"\""]);
    vec![
        n(
            "ni",
            "Nullable(Int32)",
            int_good(32, true),
            not_null.clone(),
        ),
        n("nf", "Nullable(Float64)", float_good(), not_null.clone()),
        n(
            "nd",
            "Nullable(Date)",
            goods(&["\"2024-01-02\"", "19000", "0"]),
            not_null.clone(),
        ),
        n(
            "ns",
            "LowCardinality(Nullable(String))",
            string_good(),
            string_edge(),
        ),
        n(
            "ndt",
            "Nullable(DateTime64(3, 'UTC'))",
            goods(&["\"2024-01-02 03:04:05.123\"", "1700000000.5"]),
            not_null.clone(),
        ),
        n(
            "ne",
            "Nullable(Enum8('x' = 5, 'y' = 2))",
            goods(&["\"x\"", "2"]),
            not_null.clone(),
        ),
        n(
            "nfs",
            "Nullable(FixedString(2))",
            fixed_good(2),
            edges(&["\"abc\"", "1"]),
        ),
        n(
            "nde",
            "Nullable(Decimal(9, 2))",
            goods(&["1.5", "\"-3.14159\"", "0"]),
            not_null,
        ),
    ]
}

// Arrays, maps, tuples.

pub(crate) fn ws() -> BoxedStrategy<&'static str> {
    select(vec!["", "", " ", "\n "]).boxed()
}

/// A JSON array of `elem`'s values (good only if every one is).
pub(crate) fn array_of(elem: Gen, max: usize) -> Gen {
    (proptest::collection::vec(elem, 0..max), ws())
        .prop_map(|(vs, w)| {
            let good = vs.iter().all(|f| f.good);
            let parts: Vec<String> = vs
                .iter()
                .map(|f| String::from_utf8_lossy(&f.text).into_owned())
                .collect();
            Frag {
                text: format!("[{w}{}{w}]", parts.join(&format!("{w},{w}"))).into_bytes(),
                good,
            }
        })
        .boxed()
}

/// A JSON object of `(key text, value)` pairs.
pub(crate) fn object_of(pairs: BoxedStrategy<(String, Frag)>, max: usize) -> Gen {
    (proptest::collection::vec(pairs, 0..max), ws())
        .prop_map(|(kv, w)| {
            let good = kv.iter().all(|(_, f)| f.good);
            let parts: Vec<String> = kv
                .iter()
                .map(|(k, f)| format!("{k}{w}:{w}{}", String::from_utf8_lossy(&f.text)))
                .collect();
            Frag {
                text: format!("{{{w}{}{w}}}", parts.join(&format!("{w},{w}"))).into_bytes(),
                good,
            }
        })
        .boxed()
}

pub(crate) fn nulls_in(g: Gen) -> Gen {
    prop_oneof![5 => g, 1 => goods(&["null"])].boxed()
}

pub(crate) fn composite_cols() -> Vec<Col> {
    let i32s = int_good(32, true);
    let strs = string_good();
    let map_keys = prop_oneof![
        any::<String>().prop_map(|s| serde_json::to_string(&s).unwrap()),
        ("[a-c]{0,2}", any::<u64>()).prop_map(|(s, seed)| escaped(&s, seed)),
    ]
    .boxed();
    let date = goods(&["\"2024-01-02\"", "\"1970-01-01\"", "19000", "null"]);
    let named = (
        proptest::option::of(nulls_in(i32s.clone())),
        proptest::option::of(nulls_in(strs.clone())),
        proptest::option::of(array_of(date, 3)),
        proptest::option::of(json_value()),
    )
        .prop_flat_map(|(a, b, c, z)| {
            let mut kv: Vec<(String, Frag)> = Vec::new();
            for (k, v) in [("\"a\"", a), ("\"b\"", b), ("\"c\"", c)] {
                if let Some(v) = v {
                    kv.push((k.to_string(), v));
                }
            }
            if let Some(z) = z {
                kv.push((
                    "\"zz\"".into(),
                    Frag {
                        text: z.into_bytes(),
                        good: true,
                    },
                ));
            }
            Just(kv).prop_shuffle()
        })
        .prop_map(|kv| {
            let good = kv.iter().all(|(_, f)| f.good);
            let parts: Vec<String> = kv
                .iter()
                .map(|(k, f)| format!("{k}:{}", String::from_utf8_lossy(&f.text)))
                .collect();
            Frag {
                text: format!("{{{}}}", parts.join(",")).into_bytes(),
                good,
            }
        })
        .boxed();
    let pair = (nulls_in(i32s.clone()), nulls_in(strs.clone()), ws())
        .prop_map(|(a, b, w)| Frag {
            good: a.good && b.good,
            text: format!(
                "[{w}{}{w},{w}{}{w}]",
                String::from_utf8_lossy(&a.text),
                String::from_utf8_lossy(&b.text)
            )
            .into_bytes(),
        })
        .boxed();
    let int_keys = int_text(32, true).prop_map(|t| quoted(&t)).boxed();
    let tuple_xe = (float_good(), goods(&["\"p\"", "\"q\"", "0", "1", "null"]))
        .prop_map(|(x, e)| Frag {
            good: x.good && e.good,
            text: format!(
                "{{\"e\":{},\"x\":{}}}",
                String::from_utf8_lossy(&e.text),
                String::from_utf8_lossy(&x.text)
            )
            .into_bytes(),
        })
        .boxed();
    vec![
        col(
            "a",
            "Array(Int32)",
            with_null(array_of(nulls_in(i32s.clone()), 6)),
            edges(&["\"[1,2]\"", "1", "[[1]]", "{\"k\":1}", "[1.5]"]),
        ),
        col(
            "an",
            "Array(Nullable(String))",
            with_null(array_of(nulls_in(strs.clone()), 5)),
            edges(&["[\"\\a\"]", "\"x\""]),
        ),
        col(
            "aa",
            "Array(Array(UInt8))",
            with_null(array_of(
                nulls_in(array_of(nulls_in(int_good(8, false)), 4)),
                4,
            )),
            edges(&["[1]", "[[256]]", "[[-1]]"]),
        ),
        col(
            "m",
            "Map(String, Int64)",
            with_null(object_of(
                (map_keys.clone(), nulls_in(int_good(64, true))).boxed(),
                5,
            )),
            edges(&["[]", "\"{}\"", "{\"a\":1.5}"]),
        ),
        col(
            "mk",
            "Map(Int32, Array(String))",
            with_null(object_of((int_keys, array_of(strs.clone(), 3)).boxed(), 4)),
            edges(&[
                "{\"a\":[]}",
                "{\" 1\":[]}",
                "{\"1.0\":[]}",
                "{\"2147483648\":[]}",
                "{\"-0\":[]}",
            ]),
        ),
        col(
            "t",
            "Tuple(Int32, String)",
            with_null(pair),
            edges(&["[1]", "[1,\"a\",3]", "{\"1\":1}", "[]"]),
        ),
        col(
            "nt",
            "Tuple(a Int32, b Nullable(String), c Array(Date))",
            with_null(named),
            edges(&[
                "[1,\"x\",[]]",
                "{\"a\":1,\"a\":2}",
                "{\"A\":1}",
                "{\"\\u00e9\":1}",
                "{\"a\":1.5}",
                "{\"\\u0061\":1}",
                "{\"\\u0062\":\"x\",\"a\":2}",
            ]),
        ),
        col(
            "mt",
            "Map(String, Tuple(x Float64, e Enum8('p' = 0, 'q' = 1)))",
            with_null(object_of((map_keys, nulls_in(tuple_xe)).boxed(), 3)),
            edges(&["{\"k\":[1.5,\"p\"]}", "{\"k\":{\"e\":\"r\"}}"]),
        ),
        col(
            "la",
            "Array(LowCardinality(String))",
            with_null(array_of(strs, 4)),
            edges(&["[{]"]),
        ),
    ]
}

// Missing fields, defaults and fields the table lacks.

pub(crate) fn default_cols(mode: Mode) -> Vec<Col> {
    // A field the table lacks: skipped on the JSON route, refused (so only
    // in focus, as an edge case) on one that sends such records to the DLQ.
    let unknown = |c: Col| {
        if mode.skip_unknown {
            c
        } else {
            let Col { key, ddl, gen, .. } = c;
            let gen = gen.prop_map(|f| Frag { good: false, ..f }).boxed();
            focus_only(Col {
                key,
                ddl,
                gen,
                good: None,
            })
        }
    };
    vec![
        col(
            "plain",
            "Int32",
            with_null(int_good(32, true)),
            edges(&["1.5"]),
        ),
        col(
            "d_int",
            "Int32 DEFAULT 42",
            with_null(int_good(32, true)),
            edges(&["1.5"]),
        ),
        col(
            "d_str",
            "String DEFAULT concat('x', toString(_offset))",
            with_null(string_good()),
            string_edge(),
        ),
        col(
            "d_arr",
            "Array(Int32) DEFAULT [7, 8]",
            with_null(array_of(int_good(32, true), 3)),
            edges(&["[1.5]"]),
        ),
        col(
            "d_enum",
            "Enum8('x' = 5, 'y' = 2) DEFAULT 'x'",
            goods(&["\"x\"", "\"y\"", "null"]),
            edges(&["\"z\""]),
        ),
        col(
            "e_nodef",
            "Enum8('x' = 5, 'y' = 2)",
            goods(&["\"x\"", "\"y\"", "null"]),
            edges(&["\"z\""]),
        ),
        col(
            "t_enum",
            "Tuple(Int8, Enum8('x' = 5, 'y' = 2))",
            goods(&["[1,\"x\"]", "null"]),
            edges(&["[1,null]"]),
        ),
        col(
            "n_def",
            "Nullable(Int32) DEFAULT 3",
            with_null(int_good(32, true)),
            edges(&["\"null\""]),
        ),
        col(
            "lc_def",
            "LowCardinality(String) DEFAULT 'q'",
            with_null(string_good()),
            string_edge(),
        ),
        col(
            "dt_def",
            "DateTime('UTC') DEFAULT toDateTime(1700000000, 'UTC')",
            goods(&["1", "\"2024-01-02 03:04:05\"", "null"]),
            edges(&["-1"]),
        ),
        // A type the encoder does not know, with a DEFAULT: missing is fine.
        focus_only(col(
            "pt",
            "Point DEFAULT (1.5, 2.5)",
            edges(&["[1, 2]"]),
            edges(&["null"]),
        )),
        // Not in `input()`: a field of their name is one the table lacks.
        unknown(col(
            "mat",
            "Int64 MATERIALIZED _offset * 2",
            goods(&["5"]),
            edges(&["5"]),
        )),
        unknown(col(
            "ali",
            "Int64 ALIAS _offset + 1",
            goods(&["1"]),
            edges(&["1"]),
        )),
        unknown(extra(
            "\"zz\"",
            good(json_value()),
            edges(&["{\"a\":\"\\a\"}"]),
        )),
        unknown(extra("\"\"", goods(&["1"]), edges(&["1"]))),
        // Keys that may be read as a column's: by case, escaped, not ASCII.
        focus_only(extra("\"PLAIN\"", edges(&["1"]), edges(&["2"]))),
        focus_only(extra("\"\\u0070lain\"", edges(&["1"]), edges(&["2"]))),
        focus_only(extra("\"\\u00e9\"", edges(&["1"]), edges(&["2"]))),
    ]
}
