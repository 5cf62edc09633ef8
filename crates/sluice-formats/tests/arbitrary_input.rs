//! Arbitrary input cannot crash the record-to-row path (issue 11).
//!
//! Arbitrary bytes, generated JSON text (deep nesting, huge numbers, escapes
//! and lone surrogates, duplicate keys, metadata column names spelled plainly
//! or with escapes, non-object values) and mutated JSON (invalid UTF-8,
//! truncation, stray bytes) go through [`RowEncoder::encode`] and
//! [`RowEncoder::encode_keyed`] under several encoder setups. Each case is
//! checked against an oracle built on `serde_json::Value`:
//!
//! - a rejection leaves `out` as it was and is one of the named kinds, with
//!   a message, and is the rejection the oracle expects;
//! - an accepted value becomes exactly `value` + metadata + `}\n`: valid
//!   UTF-8 JSON whose metadata hold the topic, partition and offset, which
//!   reads back (as a `Value`, minus the metadata) as the input, whose
//!   `original` is the input, and which re-encodes to itself with the same
//!   business key (the writer recomputes keys that way);
//! - the business key is the hash of the key fields' canonical text.
//!
//! Every property runs a bounded number of cases (a few seconds in release).

use proptest::prelude::*;
use proptest::sample::{select, Index};
use proptest::test_runner::{FileFailurePersistence, TestCaseError};
use serde::de::IgnoredAny;
use serde_json::{Map, Value};
use sluice_formats::row::{MAX_KEY_FIELDS, MAX_REQUIRED_FIELDS};
use sluice_formats::{MetadataColumns, RowEncoder, RowError};
use sluice_protocol::dedup::{key_hash, KeyHash};

const CASES: u32 = 256;

/// Every kind `RowError::kind` may name.
const KINDS: [&str; 6] = [
    "tombstone",
    "not-json",
    "not-object",
    "reserved-field",
    "missing-field",
    "too-large",
];

/// An encoder with what it was built from, for the oracle.
struct Setup {
    enc: RowEncoder,
    topic: String,
    columns: MetadataColumns,
    /// As the encoder keeps them (truncated).
    key: Vec<String>,
    required: Vec<String>,
    max: usize,
}

fn setup(
    topic: &str,
    columns: MetadataColumns,
    key: &[&str],
    required: &[&str],
    max: usize,
) -> Setup {
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let enc = RowEncoder::new(topic, columns.clone())
        .with_key(owned(key))
        .with_required(owned(required))
        .with_max_bytes(max);
    let mut key = owned(key);
    key.truncate(MAX_KEY_FIELDS);
    let mut required = owned(required);
    required.truncate(MAX_REQUIRED_FIELDS);
    Setup {
        enc,
        topic: topic.into(),
        columns,
        key,
        required,
        max,
    }
}

fn setups() -> Vec<Setup> {
    let short = MetadataColumns {
        topic: "t".into(),
        partition: "p".into(),
        offset: "o".into(),
    };
    let many_keys: Vec<String> = (0..MAX_KEY_FIELDS + 2).map(|i| format!("k{i}")).collect();
    let many_keys: Vec<&str> = many_keys.iter().map(String::as_str).collect();
    let many_req: Vec<String> = (0..MAX_REQUIRED_FIELDS + 1)
        .map(|i| format!("r{i}"))
        .collect();
    let many_req: Vec<&str> = many_req.iter().map(String::as_str).collect();
    vec![
        setup("orders", MetadataColumns::default(), &[], &[], usize::MAX),
        setup(
            "orders",
            MetadataColumns::default(),
            &["id", "k"],
            &["id"],
            1 << 20,
        ),
        setup("we\"ird\n\u{1F600}\\", short, &["a"], &[], 256),
        setup(
            "t",
            MetadataColumns::default(),
            &many_keys,
            &many_req,
            usize::MAX,
        ),
    ]
}

thread_local! {
    static SETUPS: Vec<Setup> = setups();
}

fn with_setup<R>(i: usize, f: impl FnOnce(&Setup) -> R) -> R {
    SETUPS.with(|s| f(&s[i % s.len()]))
}

/// What the row for a value must end with, after the value's own bytes
/// (less its closing brace).
fn suffix(s: &Setup, empty: bool, partition: i32, offset: i64) -> Vec<u8> {
    let q = |x: &str| serde_json::to_string(x).unwrap();
    format!(
        "{}{}:{},{}:{partition},{}:{offset}}}\n",
        if empty { "" } else { "," },
        q(&s.columns.topic),
        q(&s.topic),
        q(&s.columns.partition),
        q(&s.columns.offset),
    )
    .into_bytes()
}

fn is_ws(b: &u8) -> bool {
    b.is_ascii_whitespace()
}

/// A key field's text as the encoder hashes it.
fn key_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(if let Some(u) = n.as_u64() {
            u.to_string()
        } else if let Some(i) = n.as_i64() {
            i.to_string()
        } else {
            n.as_f64()?.to_string()
        }),
        _ => None,
    }
}

fn expected_key(s: &Setup, m: &Map<String, Value>) -> Option<KeyHash> {
    if s.key.is_empty() {
        return None;
    }
    let texts: Vec<String> = s
        .key
        .iter()
        .map(|f| m.get(f).and_then(key_text))
        .collect::<Option<_>>()?;
    Some(key_hash(texts.iter().map(|t| t.as_bytes())))
}

/// Why `serde_json` may refuse a value as a `Value` that is nonetheless
/// well-formed JSON the encoder may pass on (ClickHouse decides): a number
/// no `f64` holds, a lone UTF-16 surrogate escape, nesting deeper than
/// `serde_json`'s recursion limit.
fn exotic(e: &serde_json::Error) -> bool {
    let m = e.to_string();
    m.contains("number out of range")
        || m.contains("surrogate")
        // A leading surrogate not followed by `\u`.
        || m.contains("unexpected end of hex escape")
        || m.contains("recursion limit")
}

/// Runs one value through both entry points of the encoder and checks
/// everything the module promises about the outcome.
fn check(
    s: &Setup,
    value: Option<&[u8]>,
    partition: i32,
    offset: i64,
) -> Result<(), TestCaseError> {
    let prefix = b"{\"previous\":\"row\"}\n".to_vec();
    let mut out = prefix.clone();
    let keyed = s.enc.encode_keyed(value, partition, offset, &mut out);
    let mut plain_out = prefix.clone();
    let plain = s.enc.encode(value, partition, offset, &mut plain_out);
    prop_assert_eq!(&plain, &keyed.clone().map(|_| ()));
    prop_assert_eq!(&plain_out, &out);

    let parsed = value.map(serde_json::from_slice::<Value>);
    match &keyed {
        Err(e) => {
            prop_assert_eq!(&out, &prefix, "a rejected value left bytes in out");
            prop_assert!(KINDS.contains(&e.kind()), "unnamed kind {:?}", e.kind());
            let msg = e.to_string();
            prop_assert!(!msg.trim().is_empty());
            if let RowError::NotJson(why) = e {
                prop_assert!(!why.trim().is_empty(), "not-json without a reason");
            }
            let Some(v) = value else {
                prop_assert_eq!(e, &RowError::Tombstone);
                return Ok(());
            };
            if v.len() > s.max {
                let want = RowError::TooLarge {
                    bytes: v.len(),
                    max: s.max,
                };
                prop_assert_eq!(e, &want);
                return Ok(());
            }
            prop_assert!(
                !matches!(e, RowError::Tombstone | RowError::TooLarge { .. }),
                "{e:?} for a {}-byte value",
                v.len()
            );
            match parsed.unwrap() {
                Ok(Value::Object(m)) => {
                    let meta = [&s.columns.topic, &s.columns.partition, &s.columns.offset];
                    let reserved: Vec<&&String> =
                        meta.iter().filter(|c| m.contains_key(c.as_str())).collect();
                    let missing = s.required.iter().find(|f| !m.contains_key(f.as_str()));
                    match e {
                        RowError::ReservedField(name) => prop_assert!(
                            reserved.iter().any(|c| **c == name),
                            "reserved {name:?} is not a metadata column of the value"
                        ),
                        RowError::MissingField(name) => {
                            prop_assert!(reserved.is_empty(), "a reserved field went unnoticed");
                            prop_assert_eq!(Some(name), missing);
                        }
                        other => {
                            return Err(TestCaseError::fail(format!(
                                "a valid object was refused: {other:?}"
                            )))
                        }
                    }
                }
                Ok(_) => prop_assert_eq!(e, &RowError::NotObject),
                // Not a `Value`: any named rejection but the two decided
                // before parsing.
                Err(_) => {}
            }
        }
        Ok(key) => {
            let Some(v) = value else {
                return Err(TestCaseError::fail("a tombstone became a row"));
            };
            prop_assert!(v.len() <= s.max, "{} bytes over {}", v.len(), s.max);
            let row = &out[prefix.len()..];
            prop_assert_eq!(&out[..prefix.len()], &prefix[..]);
            let start = v.iter().position(|b| !is_ws(b)).unwrap();
            let end = v.iter().rposition(|b| !is_ws(b)).unwrap();
            prop_assert_eq!(v[start], b'{');
            prop_assert_eq!(v[end], b'}');
            let empty = v[start + 1..end].iter().all(is_ws);
            let want = [&v[..end], &suffix(s, empty, partition, offset)[..]].concat();
            prop_assert_eq!(row, &want[..], "the row is not value + metadata");
            // One row: the only newlines are the value's own whitespace and
            // the terminator (JSONEachRow rows are objects, not lines).
            let nl = |b: &[u8]| b.iter().filter(|&&c| c == b'\n').count();
            prop_assert_eq!(nl(row), nl(&v[..end]) + 1);
            prop_assert!(row.ends_with(b"}\n"), "no terminator");
            prop_assert!(
                std::str::from_utf8(row).is_ok(),
                "the row is not UTF-8: {:?}",
                String::from_utf8_lossy(row)
            );
            prop_assert!(
                serde_json::from_slice::<IgnoredAny>(row).is_ok(),
                "the row is not JSON: {:?}",
                String::from_utf8_lossy(row)
            );
            // The DLQ gets the value back; the writer re-encodes it for its key.
            let original = s.enc.original(row);
            prop_assert_eq!(original.as_deref(), Some(&v[..=end]));
            let mut again = Vec::new();
            let re = s
                .enc
                .encode_keyed(original.as_deref(), partition, offset, &mut again);
            prop_assert_eq!(&re, &keyed);
            prop_assert_eq!(&again[..], row);
            match parsed.unwrap() {
                Ok(Value::Object(m)) => {
                    let meta = [&s.columns.topic, &s.columns.partition, &s.columns.offset];
                    for c in meta {
                        prop_assert!(
                            !m.contains_key(c.as_str()),
                            "metadata column {c:?} let through"
                        );
                    }
                    for f in &s.required {
                        prop_assert!(m.contains_key(f.as_str()), "required {f:?} missing");
                    }
                    prop_assert_eq!(key, &expected_key(s, &m));
                    let Ok(Value::Object(mut o)) = serde_json::from_slice::<Value>(row) else {
                        return Err(TestCaseError::fail("the row is not an object"));
                    };
                    prop_assert_eq!(
                        o.remove(&s.columns.topic),
                        Some(Value::String(s.topic.clone()))
                    );
                    prop_assert_eq!(o.remove(&s.columns.partition), Some(Value::from(partition)));
                    prop_assert_eq!(o.remove(&s.columns.offset), Some(Value::from(offset)));
                    prop_assert_eq!(o, m, "the row does not read back as the value");
                }
                Ok(other) => {
                    return Err(TestCaseError::fail(format!(
                        "a non-object became a row: {other}"
                    )))
                }
                Err(e) => prop_assert!(
                    exotic(&e),
                    "accepted a value serde_json refuses: {e}: {:?}",
                    String::from_utf8_lossy(v)
                ),
            }
        }
    }
    Ok(())
}

// ---- generators -----------------------------------------------------------

fn ws() -> impl Strategy<Value = &'static str> {
    select(vec!["", "", "", " ", "\t", "\n", "\r\n", "  "])
}

/// Pieces of a string literal's contents, escapes included (valid or not as
/// Unicode: lone and reversed surrogates).
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z_ ]{0,4}",
        3 => select(vec![
            r"\n", r#"\""#, r"\\", r"\/", r"\b\f\r\t", r"\u0000", r"\u00e9", r"\u005f",
            r"\ud800", r"\udfff", r"\ud83d\ude00", r"\ud83d", r"\uDC00\uD800", r"\u0073",
            "é", "\u{1F600}", "\u{7f}", "\u{feff}", "\u{2028}",
        ])
        .prop_map(String::from),
        1 => any::<char>().prop_filter("not a control", |c| *c >= ' ' && *c != '"' && *c != '\\')
            .prop_map(String::from),
    ]
}

fn string_lit() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => any::<String>().prop_map(|s| serde_json::to_string(&s).unwrap()),
        2 => prop::collection::vec(fragment(), 0..6).prop_map(|f| format!("\"{}\"", f.concat())),
    ]
}

/// Object keys: the encoders' key, required and metadata names (plain and
/// escaped, and near misses), or any string.
fn key_lit() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => select(vec![
            "id", "k", "a", "b", "x", "y", "r0", "r1", "r63", "r64", "k0", "k7", "k8",
        ])
        .prop_map(|k| serde_json::to_string(k).unwrap()),
        1 => select(vec!["_topic", "_partition", "_offset", "t", "p", "o"])
            .prop_map(|k| serde_json::to_string(k).unwrap()),
        1 => select(vec![
            r#""_off\u0073et""#, r#""\u005ftopic""#, r#""_partitio\u006e""#, r#""\u0074""#,
            r#""_Offset""#, r#""_offset ""#, r#"" _topic""#, r#""\u0069d""#, r#""_topic\u0000""#,
            r#""\ud800""#,
        ])
        .prop_map(String::from),
        2 => string_lit(),
    ]
}

fn number_lit() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => any::<i64>().prop_map(|n| n.to_string()),
        2 => any::<u64>().prop_map(|n| n.to_string()),
        2 => any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| serde_json::to_string(&f).unwrap()),
        1 => select(vec![
            "1e400", "-1e400", "1E+400", "1e-400", "18446744073709551616", "18446744073709551617",
            "-9223372036854775809", "-0", "-0.0", "0e0", "0.0000000000000000000000000000001",
            "1.7976931348623157e308", "1.7976931348623159e308", "5e-324", "1e99999999999999999999",
        ])
        .prop_map(String::from),
        1 => "-?[1-9][0-9]{19,300}(\\.[0-9]{1,50})?([eE][-+]?[0-9]{1,4})?",
    ]
}

fn join<T>(items: &[T], f: impl Fn(&T) -> String) -> String {
    items.iter().map(f).collect::<Vec<_>>().join(",")
}

fn object_of(value: BoxedStrategy<String>) -> impl Strategy<Value = String> {
    (
        ws(),
        prop::collection::vec((ws(), key_lit(), ws(), ws(), value, ws()), 0..7),
    )
        .prop_map(|(inner, members)| {
            let body = join(&members, |(a, k, b, c, v, d)| {
                format!("{a}{k}{b}:{c}{v}{d}")
            });
            format!("{{{inner}{body}}}")
        })
}

fn value_lit() -> BoxedStrategy<String> {
    let leaf = prop_oneof![
        1 => select(vec!["null", "true", "false"]).prop_map(String::from),
        2 => number_lit(),
        2 => string_lit(),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            (
                ws(),
                prop::collection::vec((ws(), inner.clone(), ws()), 0..6)
            )
                .prop_map(|(inner_ws, items)| format!(
                    "[{inner_ws}{}]",
                    join(&items, |(a, v, b)| format!("{a}{v}{b}"))
                )),
            object_of(inner),
        ]
    })
    .boxed()
}

/// An object that starts with the keyed setups' key fields (`id`, `k`,
/// `a`), holding any value, scalars mostly.
fn keyed_object() -> impl Strategy<Value = String> {
    let field = || {
        prop_oneof![
            4 => number_lit(),
            4 => string_lit(),
            1 => select(vec!["true", "false", "null"]).prop_map(String::from),
            1 => value_lit(),
        ]
    };
    (
        (select(vec!["id", "\\u0069d"]), field()),
        field(),
        field(),
        object_of(value_lit()),
    )
        .prop_flat_map(|(id, k, a, rest)| {
            let fields = vec![id, ("k", k), ("a", a)];
            (Just(fields).prop_shuffle(), Just(rest))
        })
        .prop_map(|(first, rest)| {
            let rest = &rest[1..];
            let sep = if rest.trim_start().starts_with('}') {
                ""
            } else {
                ","
            };
            let first = join(&first, |(k, v)| format!("\"{k}\":{v}"));
            format!("{{{first}{sep}{rest}")
        })
}

/// A record value: mostly an object, sometimes any JSON value, with
/// whitespace around it.
fn document() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (ws(), object_of(value_lit()), ws()).prop_map(|(a, o, b)| format!("{a}{o}{b}")),
        3 => (ws(), keyed_object(), ws()).prop_map(|(a, o, b)| format!("{a}{o}{b}")),
        1 => (ws(), value_lit(), ws()).prop_map(|(a, v, b)| format!("{a}{v}{b}")),
    ]
}

/// Which setup: the keyed one most, the 64-required one least (random
/// objects rarely have all its fields).
fn which() -> impl Strategy<Value = usize> {
    select(vec![0, 0, 0, 1, 1, 1, 1, 2, 2, 3])
}

#[derive(Debug, Clone)]
enum Mutation {
    Set(Index, u8),
    Insert(Index, Vec<u8>),
    Delete(Index),
    Truncate(Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let bad_utf8 = select(vec![
        vec![0xff],
        vec![0x80],
        vec![0xc3, 0x28],
        vec![0xc0, 0xaf],
        vec![0xe2, 0x82],
        vec![0xed, 0xa0, 0x80],
        vec![0xf4, 0x90, 0x80, 0x80],
        vec![0xf8, 0x88, 0x80, 0x80, 0x80],
    ]);
    let stray = select(vec![
        b"\"".to_vec(),
        b"\\".to_vec(),
        b",".to_vec(),
        b"}".to_vec(),
        b"{".to_vec(),
        b"[".to_vec(),
        b":".to_vec(),
        b"\0".to_vec(),
        b"\x0c".to_vec(),
        b"\n".to_vec(),
    ]);
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        (any::<Index>(), bad_utf8).prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<Index>(), stray).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<Index>().prop_map(Mutation::Delete),
        any::<Index>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(mut v: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        match m {
            Mutation::Set(i, b) if !v.is_empty() => {
                let i = i.index(v.len());
                v[i] = *b;
            }
            Mutation::Insert(i, bytes) => {
                let i = i.index(v.len() + 1);
                v.splice(i..i, bytes.iter().copied());
            }
            Mutation::Delete(i) if !v.is_empty() => {
                v.remove(i.index(v.len()));
            }
            Mutation::Truncate(i) => v.truncate(i.index(v.len() + 1)),
            _ => {}
        }
    }
    v
}

#[derive(Debug, Clone, Copy)]
enum Shape {
    Arrays,
    Objects,
    Mixed,
}

/// `depth` levels of nesting around a scalar, closed or not.
fn nested(shape: Shape, depth: usize, closed: bool) -> String {
    let (open, close): (&str, &str) = match shape {
        Shape::Arrays => ("[", "]"),
        Shape::Objects => ("{\"a\":", "}"),
        Shape::Mixed => ("[{\"a\":", "}]"),
    };
    let mut s = open.repeat(depth);
    s.push('1');
    if closed {
        s.push_str(&close.repeat(depth));
    }
    s
}

fn depth() -> impl Strategy<Value = usize> {
    prop_oneof![
        select(vec![1, 126, 127, 128, 129, 130, 255, 256, 1000, 10_000]),
        1usize..200,
        200usize..20_000,
    ]
}

// ---- properties -----------------------------------------------------------

/// Bounded cases; failures are kept with the crate's other regressions
/// (cargo runs integration tests from the package directory).
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/arbitrary_input.txt",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Any bytes at all, a tombstone included.
    #[test]
    fn arbitrary_bytes(
        which in which(),
        value in prop::option::weighted(0.95, prop::collection::vec(any::<u8>(), 0..512)),
        partition in any::<i32>(),
        offset in any::<i64>(),
    ) {
        with_setup(which, |s| {
            check(s, value.as_deref(), partition, offset)?;
            // `original` is only given rows, but must not panic on others.
            if let Some(o) = value.as_deref().and_then(|v| s.enc.original(v)) {
                prop_assert!(o.ends_with(b"}"), "{:?}", o);
            }
            Ok(())
        })?;
    }

    /// Well-formed JSON text, including what `serde_json::Value` cannot
    /// hold (huge numbers, lone surrogates) and duplicate keys.
    #[test]
    fn generated_json(
        which in which(),
        doc in document(),
        partition in any::<i32>(),
        offset in any::<i64>(),
    ) {
        with_setup(which, |s| check(s, Some(doc.as_bytes()), partition, offset))?;
    }

    /// Generated JSON with invalid UTF-8, stray bytes, deletions and cuts.
    #[test]
    fn mutated_json(
        which in which(),
        doc in document(),
        ms in prop::collection::vec(mutation(), 1..4),
        partition in any::<i32>(),
        offset in any::<i64>(),
    ) {
        let v = mutate(doc.into_bytes(), &ms);
        with_setup(which, |s| check(s, Some(&v), partition, offset))?;
    }

    /// Nesting far deeper than any recursion limit, at the top level, under
    /// an ordinary field and under a key field; closed or cut short.
    #[test]
    fn deep_nesting(
        which in 0usize..3,
        shape in select(vec![Shape::Arrays, Shape::Objects, Shape::Mixed]),
        depth in depth(),
        closed in any::<bool>(),
        place in 0usize..4,
    ) {
        let deep = nested(shape, depth, closed);
        let v = match place {
            0 => deep,
            1 => format!("{{\"x\":{deep}}}"),
            2 => format!("{{\"id\":{deep},\"k\":1}}"),
            _ => format!("{{\"k\":2,\"a\":{deep}}}"),
        };
        with_setup(which, |s| check(s, Some(v.as_bytes()), 0, 1))?;
    }
}

// ---- fixed cases ----------------------------------------------------------

fn run(s: &Setup, v: &[u8]) -> Result<Option<KeyHash>, RowError> {
    let mut out = Vec::new();
    s.enc.encode_keyed(Some(v), 7, 8, &mut out)
}

fn plain() -> Setup {
    setup("orders", MetadataColumns::default(), &[], &[], usize::MAX)
}

/// A million levels, on a thread with a small stack: the encoder walks
/// nested values without recursing, so it cannot overflow the stack.
#[test]
fn a_million_levels_on_a_small_stack() {
    std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(|| {
            let keyed = setup(
                "orders",
                MetadataColumns::default(),
                &["id"],
                &[],
                usize::MAX,
            );
            for shape in [Shape::Arrays, Shape::Objects, Shape::Mixed] {
                let deep = nested(shape, 1_000_000, true);
                let under_field = format!("{{\"x\":{deep}}}");
                let under_key = format!("{{\"id\":{deep}}}");
                assert_eq!(run(&keyed, under_field.as_bytes()), Ok(None));
                assert_eq!(run(&keyed, under_key.as_bytes()), Ok(None));
                let top = run(&keyed, deep.as_bytes());
                match shape {
                    Shape::Objects => assert_eq!(top, Ok(None)),
                    _ => assert_eq!(top, Err(RowError::NotObject)),
                }
                let cut = format!("{{\"x\":{}", nested(shape, 1_000_000, false));
                assert_eq!(
                    run(&keyed, cut.as_bytes()).map_err(|e| e.kind()),
                    Err("not-json")
                );
            }
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn huge_numbers_pass_through_unless_they_are_the_key() {
    let s = plain();
    for n in [
        "1e400",
        "-1e400",
        "18446744073709551617",
        "-9223372036854775809",
        "-0",
        "123456789012345678901234567890123456789012345678901234567890",
    ] {
        let v = format!("{{\"n\":{n}}}");
        assert_eq!(run(&s, v.as_bytes()), Ok(None), "{v}");
    }
    let keyed = setup("t", MetadataColumns::default(), &["id"], &[], usize::MAX);
    let h = |t: &str| Ok(Some(key_hash([t.as_bytes()])));
    assert_eq!(
        run(&keyed, br#"{"id":18446744073709551615}"#),
        h("18446744073709551615")
    );
    assert_eq!(
        run(&keyed, br#"{"id":-9223372036854775808}"#),
        h("-9223372036854775808")
    );
    // Past u64 a number is read as an f64, as ClickHouse would.
    assert_eq!(
        run(&keyed, br#"{"id":18446744073709551617}"#),
        h(&18446744073709551617f64.to_string())
    );
    assert_eq!(run(&keyed, br#"{"id":-0}"#), h("-0"));
    // No f64 holds 1e400: a named rejection, not a crash.
    let e = run(&keyed, br#"{"id":1e400}"#).unwrap_err();
    assert_eq!(e.kind(), "not-json");
    assert!(e.to_string().contains("out of range"), "{e}");
}

#[test]
fn escapes_and_surrogates() {
    let s = plain();
    // Lone surrogates are well-formed JSON; ClickHouse refuses them for a
    // String column, which the writer turns into a `rejected` letter.
    assert_eq!(run(&s, br#"{"a":"\ud800"}"#), Ok(None));
    assert_eq!(run(&s, br#"{"a":"\udc00\ud800","b":["\ud83d"]}"#), Ok(None));
    // Where the encoder reads a string (a field name, a key field), a lone
    // surrogate is not text: a named rejection.
    assert_eq!(
        run(&s, br#"{"\ud800":1}"#).map_err(|e| e.kind()),
        Err("not-json")
    );
    let keyed = setup("t", MetadataColumns::default(), &["id"], &[], usize::MAX);
    assert_eq!(
        run(&keyed, br#"{"id":"\ud800"}"#).map_err(|e| e.kind()),
        Err("not-json")
    );
    assert_eq!(
        run(&keyed, br#"{"id":"\ud83d\ude00\u0000\"\\"}"#),
        Ok(Some(key_hash(["\u{1F600}\0\"\\".as_bytes()])))
    );
}

#[test]
fn invalid_utf8_is_not_json_anywhere() {
    let keyed = setup("t", MetadataColumns::default(), &["id"], &[], usize::MAX);
    for v in [
        &b"{\"a\":\"\xff\"}"[..],
        b"{\"a\":[\"x\xc3\x28\"]}",
        b"{\"a\":{\"b\":\"\xed\xa0\x80\"}}",
        b"{\"\xff\":1}",
        b"{\"id\":\"\xc0\xaf\"}",
        b"\xef\xbb\xbf{\"a\":1}",
        b"\xff",
    ] {
        let mut out = b"x".to_vec();
        let r = keyed.enc.encode_keyed(Some(v), 0, 0, &mut out);
        assert_eq!(
            r.map_err(|e| e.kind()),
            Err("not-json"),
            "{:?}",
            String::from_utf8_lossy(v)
        );
        assert_eq!(out, b"x");
    }
}

#[test]
fn metadata_names_in_any_spelling() {
    let s = plain();
    for (v, name) in [
        (&br#"{"_topic":1}"#[..], "_topic"),
        (br#"{"a":1,"_partition":null}"#, "_partition"),
        (br#"{"_off\u0073et":7}"#, "_offset"),
        (br#"{"\u005f\u0074opic":"x"}"#, "_topic"),
        (br#"{"a":1,"a":2,"_offset":3,"_offset":4}"#, "_offset"),
    ] {
        assert_eq!(run(&s, v), Err(RowError::ReservedField(name.into())));
    }
    // Near misses, and the names below the top level, are ordinary fields.
    for v in [
        &br#"{"_Offset":1}"#[..],
        br#"{"_offset ":1}"#,
        br#"{"_topic\u0000":1}"#,
        br#"{"x":{"_offset":1},"y":[{"_topic":2}]}"#,
    ] {
        assert_eq!(run(&s, v), Ok(None), "{}", String::from_utf8_lossy(v));
    }
    let custom = MetadataColumns {
        topic: "src".into(),
        partition: "part".into(),
        offset: "off".into(),
    };
    let c = setup("t", custom, &[], &[], usize::MAX);
    assert_eq!(run(&c, br#"{"_offset":1}"#), Ok(None));
    assert_eq!(
        run(&c, br#"{"of\u0066":1}"#),
        Err(RowError::ReservedField("off".into()))
    );
}

#[test]
fn duplicate_keys_keep_the_value_as_it_came() {
    let keyed = setup(
        "t",
        MetadataColumns::default(),
        &["id"],
        &["id"],
        usize::MAX,
    );
    let mut out = Vec::new();
    let v = br#"{"id":"a","x":1,"id":"b","x":2}"#;
    // The last occurrence is the key, as serde_json reads the value.
    assert_eq!(
        keyed.enc.encode_keyed(Some(v), 0, 5, &mut out),
        Ok(Some(key_hash([b"b".as_slice()])))
    );
    assert_eq!(keyed.enc.original(&out).unwrap(), v);
    assert_eq!(run(&keyed, br#"{"id":"a","id":null}"#), Ok(None));
}

/// The 64th required field is the top bit of the encoder's mask.
#[test]
fn sixty_four_required_fields() {
    let names: Vec<String> = (0..64).map(|i| format!("r{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let s = setup("t", MetadataColumns::default(), &[], &refs, usize::MAX);
    let all = format!("{{{}}}", join(&names, |n| format!("\"{n}\":1")));
    assert_eq!(run(&s, all.as_bytes()), Ok(None));
    let without_last = all.replace(",\"r63\":1", "");
    assert_eq!(
        run(&s, without_last.as_bytes()),
        Err(RowError::MissingField("r63".into()))
    );
    let without_first = all.replace("\"r0\":1,", "");
    assert_eq!(
        run(&s, without_first.as_bytes()),
        Err(RowError::MissingField("r0".into()))
    );
}

#[test]
fn non_objects_and_empty_values() {
    let s = plain();
    for v in [
        &b"[]"[..],
        b"1e400",
        b"\"\\ud800\"",
        b"null",
        b" true ",
        b"-0",
    ] {
        assert_eq!(
            run(&s, v),
            Err(RowError::NotObject),
            "{}",
            String::from_utf8_lossy(v)
        );
    }
    for v in [
        &b""[..],
        b"   ",
        b"\n",
        b"{",
        b"}",
        b"{}}",
        b"{} {}",
        b"\x0c{}",
        b"{}\x0c",
        b"{\"a\"}",
    ] {
        assert_eq!(
            run(&s, v).map_err(|e| e.kind()),
            Err("not-json"),
            "{}",
            String::from_utf8_lossy(v)
        );
    }
    assert_eq!(run(&s, b"\t{ \n}\r\n"), Ok(None));
    let mut out = Vec::new();
    s.enc.encode(Some(b" { } "), 1, 2, &mut out).unwrap();
    assert_eq!(
        out,
        b" { \"_topic\":\"orders\",\"_partition\":1,\"_offset\":2}\n"
    );
    assert_eq!(s.enc.original(&out).unwrap(), b" { }");
}
