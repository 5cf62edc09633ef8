//! The `reject-every-type` data: values JSON carries but ClickHouse refuses,
//! one column type family at a time.
//!
//! [`FAMILIES`] lists a column for each type family a user has, with a value
//! it takes and one it refuses (each checked against the stack's server
//! with the sink's insert settings); [`table_ddl`] makes a table with all of
//! them and a `CHECK`; [`record`] makes a record value with every good value
//! but one bad one; [`mix`] makes `n` records, one in `every` refused, the
//! families taking turns. Every refused row must reach the DLQ as
//! `rejected`, every other one land once.

/// One column type family: its column, a value it takes, and a value JSON
/// can carry but ClickHouse refuses for that column alone (each checked
/// against the stack's server with the sink's insert settings; the lenient
/// JSON input reads, e.g., a number for a `Bool` only as 0 or 1, and takes
/// any JSON value for a `String` but a lone UTF-16 surrogate).
pub struct Family {
    pub column: &'static str,
    pub ty: &'static str,
    pub good: &'static str,
    pub bad: &'static str,
}

pub const FAMILIES: &[Family] = &[
    Family {
        column: "e",
        ty: "Enum8('a' = 1, 'b' = 2)",
        good: r#""a""#,
        bad: r#""zz""#,
    },
    Family {
        column: "u",
        ty: "UUID",
        good: r#""61f0c404-5cb3-11e7-907b-a6006ad3dba0""#,
        bad: r#""not-a-uuid""#,
    },
    Family {
        column: "ip4",
        ty: "IPv4",
        good: r#""10.0.0.1""#,
        bad: r#""1.2.3.999""#,
    },
    Family {
        column: "ip6",
        ty: "IPv6",
        good: r#""2001:db8::1""#,
        bad: r#""zz::""#,
    },
    Family {
        column: "b",
        ty: "Bool",
        good: "true",
        bad: "5",
    },
    Family {
        column: "d",
        ty: "Date",
        good: r#""2024-01-02""#,
        bad: r#""yesterday""#,
    },
    Family {
        column: "dt",
        ty: "DateTime64(3)",
        good: r#""2024-01-02 03:04:05.678""#,
        bad: r#""yesterday""#,
    },
    Family {
        column: "dec",
        ty: "Decimal(9, 2)",
        good: r#""12.34""#,
        bad: "12345678.9",
    },
    Family {
        column: "arr",
        ty: "Array(UInt8)",
        good: "[1,2]",
        bad: r#""x""#,
    },
    Family {
        column: "m",
        ty: "Map(String, UInt8)",
        good: r#"{"k":1}"#,
        bad: r#"{"k":"x"}"#,
    },
    Family {
        column: "tup",
        ty: "Tuple(UInt8, String)",
        good: r#"[1,"x"]"#,
        bad: "[1]",
    },
    Family {
        column: "fs",
        ty: "FixedString(2)",
        good: r#""ab""#,
        bad: r#""abc""#,
    },
    Family {
        column: "lc",
        ty: "LowCardinality(String)",
        good: r#""x""#,
        bad: r#""\ud800""#,
    },
    Family {
        column: "nu",
        ty: "Nullable(UInt8)",
        good: "null",
        bad: r#""x""#,
    },
    // The table's `CHECK n < 1000`.
    Family {
        column: "n",
        ty: "UInt32",
        good: "1",
        bad: "5000",
    },
];

/// A record value `id`: every family's good value, but `bad`'s bad one.
pub fn record(id: u64, bad: Option<&Family>) -> String {
    let fields: Vec<String> = FAMILIES
        .iter()
        .map(|f| {
            let v = match bad {
                Some(b) if b.column == f.column => b.bad,
                _ => f.good,
            };
            format!(r#""{}":{v}"#, f.column)
        })
        .collect();
    format!(r#"{{"id":{id},{}}}"#, fields.join(","))
}

/// A table `{db}.typed` with a column of each family, `id` and the
/// metadata columns, on a plain `MergeTree` without a dedup window.
pub fn table_ddl(db: &str) -> String {
    let columns: Vec<String> = FAMILIES
        .iter()
        .map(|f| format!("{} {}", f.column, f.ty))
        .collect();
    format!(
        "CREATE TABLE {db}.typed (
            id UInt64,
            {},
            _topic LowCardinality(String),
            _partition UInt32,
            _offset UInt64,
            CONSTRAINT c CHECK n < 1000
        ) ENGINE = MergeTree ORDER BY (_topic, _partition, _offset)
        SETTINGS non_replicated_deduplication_window = 0",
        columns.join(",\n            ")
    )
}

/// `n` records, record `i` refused when `i % every == every - 1` (the
/// families taking turns): the values, and the indexes of the refused ones.
pub fn mix(n: u64, every: u64) -> (Vec<Option<String>>, Vec<u64>) {
    let mut values = Vec::with_capacity(n as usize);
    let mut bad = Vec::new();
    for i in 0..n {
        let family =
            (i % every == every - 1).then(|| &FAMILIES[(i / every) as usize % FAMILIES.len()]);
        if family.is_some() {
            bad.push(i);
        }
        values.push(Some(record(i, family)));
    }
    (values, bad)
}
