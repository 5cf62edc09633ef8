//! Binary vs JSON on the real engine: a row `sluice_formats::binary` encodes
//! lands in ClickHouse as exactly the bytes its JSONEachRow line lands as.
//!
//! Needs the stack's ClickHouse (`scripts/stack.sh up`, then
//! `eval "$(scripts/stack.sh env)"`): without `CLICKHOUSE_URL` every test
//! here fails; none skips.
//!
//! Per type family (and per settings profile: the JSON route's, a server
//! reading times as `basic`, a route that refuses extra fields), proptest
//! generates batches of rows. Each row puts one generated value in a
//! "focus" column (three in four from the family's in-scope generators,
//! one in four from its edge cases) and in-scope values or nothing in the
//! others, in random order, with the sink's metadata columns last. Twin
//! MergeTree tables get the batch: one as JSONEachRow, one as
//! RowBinaryWithDefaults (only the rows the encoder converts), each by the
//! sink's statement (`INSERT INTO t SELECT * FROM input() WHERE <deadline>
//! FORMAT f`, data in the body) and insert settings. Then:
//!
//! - a row JSONEachRow refuses (its `(at row N)`) must be one the encoder
//!   fell back on, and the binary insert must succeed;
//! - each converted row must read back (`formatRow('RowBinary', ...)`, so
//!   NaN payloads and enum numbers count) as its JSON twin does;
//! - per column, at least 95% of the in-scope values (rows whose values
//!   are all in scope) must convert, so an encoder that always falls back
//!   fails.
//!
//! The encoder's settings are read from the server as the insert sees them
//! (`system.settings` with the profile's settings applied). A failure
//! shrinks to a small batch and is kept in
//! `proptest-regressions/binary_vs_json.txt`. Run with `--nocapture` to see
//! each family's figures.

#[path = "binary_vs_json/families.rs"]
mod families;
#[path = "binary_vs_json/rows.rs"]
mod rows;
#[path = "binary_vs_json/server.rs"]
mod server;
#[path = "binary_vs_json/values.rs"]
mod values;

use families::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use rows::rows;
use server::{check, exec, Profile, Server, Stats, BASIC, DLQ, JSON_ROUTE};
use std::fmt::Write as _;
use std::rc::Rc;
use std::sync::Mutex;
use std::time::Instant;
use values::*;

/// Batches per family and profile (`PROPTEST_CASES` overrides it, for a
/// longer search).
const CASES: u32 = 4;
/// The least share of in-scope values that must convert, per column.
const MIN_CONVERTED: f64 = 0.95;

/// Runs `family`'s batches under `profile` and checks the figures.
fn run(family: &str, profile: &Profile, cols: Vec<Col>, select: &str) {
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(Server::new(family, profile, &cols, select));
    let names: Vec<String> = cols.iter().map(|c| c.key.clone()).collect();
    let cols = Rc::new(cols);
    let stats = Mutex::new(Stats::default());
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok());
    let mut runner = TestRunner::new(Config {
        cases: cases.unwrap_or(CASES),
        max_shrink_iters: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/binary_vs_json.txt",
        ))),
        ..Config::default()
    });
    let result = runner.run(&rows(&cols), |batch| {
        rt.block_on(check(&server, &batch, &stats, names.len()))
            .map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!(
            "{family}/{}: {e}\n(tables kept in {})",
            profile.name, server.db
        );
    }
    let s = stats.into_inner().unwrap();
    let mut report = format!(
        "{family}/{}: {} rows compared in {:.1} s\n  {:<16} {:>5} {:>9} {:>9} {:>13}\n",
        profile.name,
        s.compared,
        started.elapsed().as_secs_f64(),
        "column",
        "rows",
        "converted",
        "in-scope",
        "json-refused"
    );
    let mut low = Vec::new();
    for (name, t) in names.iter().zip(&s.per_col) {
        let _ = writeln!(
            report,
            "  {name:<16} {:>5} {:>9} {:>4}/{:<4} {:>13}",
            t.rows, t.converted, t.good_converted, t.good, t.json_refused
        );
        if t.good > 0 && (t.good_converted as f64) < MIN_CONVERTED * t.good as f64 {
            low.push(format!(
                "{name}: {}/{} in-scope values converted",
                t.good_converted, t.good
            ));
        }
    }
    let _ = writeln!(report, "  fallbacks: {:?}", s.reasons);
    eprintln!("{report}");
    assert!(
        low.is_empty(),
        "{family}/{}: too many in-scope values fall back: {low:?}\n{report}",
        profile.name
    );
    assert!(
        s.compared > 0,
        "{family}/{}: no row converted",
        profile.name
    );
    rt.block_on(exec(
        &server.client,
        &format!("DROP DATABASE {}", server.db),
    ));
}

const ALL: &str = "*";

#[test]
fn integers_and_bools() {
    let mut cols: Vec<Col> = [8, 16, 32, 64, 128, 256]
        .iter()
        .flat_map(|&b| {
            [
                int_col(&format!("i{b}"), b, true),
                int_col(&format!("u{b}"), b, false),
            ]
        })
        .collect();
    cols.push(col(
        "b",
        "Bool",
        goods(&["true", "false", "0", "1", "null"]),
        edges(&["2", "-1", "\"true\"", "\"1\"", "1.0", "\"yes\"", "-0"]),
    ));
    run("ints", &JSON_ROUTE, cols, ALL);
}

#[test]
fn floats() {
    run(
        "floats",
        &JSON_ROUTE,
        vec![float_col("f32", "Float32"), float_col("f64", "Float64")],
        ALL,
    );
}

#[test]
fn strings() {
    let cols = vec![
        col("s", "String", with_null(string_good()), string_edge()),
        col(
            "lc",
            "LowCardinality(String)",
            with_null(string_good()),
            string_edge(),
        ),
        col(
            "fs",
            "FixedString(4)",
            with_null(fixed_good(4)),
            edges(&[
                "\"abcde\"",
                "\"\\u00e9\\u00e9\\u00e9\"",
                "12",
                "true",
                "[1]",
            ]),
        ),
    ];
    run("strings", &JSON_ROUTE, cols, ALL);
}

#[test]
fn decimals() {
    let cols = vec![
        decimal_col("d9_2", 9, 2),
        decimal_col("d10_0", 10, 0),
        decimal_col("d18_18", 18, 18),
        decimal_col("d38_10", 38, 10),
        decimal_col("d76_30", 76, 30),
        decimal_col("d76_0", 76, 0),
    ];
    run("decimals", &JSON_ROUTE, cols, ALL);
}

#[test]
fn dates() {
    let cols = vec![
        date_col("d", "Date", 0, 65_535),
        date_col("d32", "Date32", -25_567, 120_529),
    ];
    run("dates", &JSON_ROUTE, cols, ALL);
}

fn time_cols(mode: Mode) -> Vec<Col> {
    let t = |p: Option<u32>, utc: bool| TimeCol { precision: p, utc };
    vec![
        time_col("dt", "DateTime", t(None, true), mode),
        time_col("dtu", "DateTime('UTC')", t(None, true), mode),
        time_col("dtk", "DateTime('Asia/Tokyo')", t(None, false), mode),
        time_col("t0", "DateTime64(0)", t(Some(0), true), mode),
        time_col("t3", "DateTime64(3)", t(Some(3), true), mode),
        time_col("t6", "DateTime64(6, 'UTC')", t(Some(6), true), mode),
        time_col("t9", "DateTime64(9, 'UTC')", t(Some(9), true), mode),
        time_col(
            "t3k",
            "DateTime64(3, 'Asia/Tokyo')",
            t(Some(3), false),
            mode,
        ),
    ]
}

const JSON_MODE: Mode = Mode {
    best_effort: true,
    raw: false,
    skip_unknown: true,
};

#[test]
fn times_best_effort() {
    run("times", &JSON_ROUTE, time_cols(JSON_MODE), ALL);
}

#[test]
fn times_basic() {
    let mode = Mode {
        best_effort: false,
        raw: true,
        ..JSON_MODE
    };
    run("times", &BASIC, time_cols(mode), ALL);
}

#[test]
fn uuids_and_ips() {
    let mut cols = vec![uuid_col()];
    cols.extend(ip_cols());
    run("uuid_ip", &JSON_ROUTE, cols, ALL);
}

#[test]
fn enums() {
    run("enums", &JSON_ROUTE, enum_cols(), ALL);
}

#[test]
fn nullables() {
    run("nullable", &JSON_ROUTE, nullable_cols(), ALL);
}

#[test]
fn composites() {
    run("composites", &JSON_ROUTE, composite_cols(), ALL);
}

#[test]
fn defaults_and_extra_fields() {
    run("defaults", &JSON_ROUTE, default_cols(JSON_MODE), "*, mat");
}

#[test]
fn defaults_and_extra_fields_refused() {
    let mode = Mode {
        skip_unknown: false,
        ..JSON_MODE
    };
    run("defaults", &DLQ, default_cols(mode), "*, mat");
}
