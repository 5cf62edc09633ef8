//! The stack's ClickHouse as the sink meets it: twin tables, the sink's
//! insert statement and settings, the encoder's settings read back, and
//! the check of one batch.

use crate::rows::Row;
use crate::values::Col;
use bytes::Bytes;
use clickhouse::Client;
use sluice_formats::binary::{ColumnSpec, DefaultKind, InputSettings, Layout};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

// ---- the server ----------------------------------------------------------

/// A route's settings over the server's.
pub(crate) struct Profile {
    pub(crate) name: &'static str,
    pub(crate) settings: &'static [(&'static str, &'static str)],
}

/// The JSON route: the server's own input settings.
pub(crate) const JSON_ROUTE: Profile = Profile {
    name: "json",
    settings: &[],
};

/// A server that reads times as `basic`, and a bare integer into a
/// `DateTime64` as ticks (ClickHouse before 26.8).
pub(crate) const BASIC: Profile = Profile {
    name: "basic",
    settings: &[
        ("date_time_input_format", "basic"),
        ("input_format_read_datetime_number_as_raw_value", "1"),
    ],
};

/// A route with `extra_fields = "dlq"`.
pub(crate) const DLQ: Profile = Profile {
    name: "dlq",
    settings: &[("input_format_skip_unknown_fields", "0")],
};

/// The insert settings the sink sends (`ch::service`), before the route's.
pub(crate) const SINK_SETTINGS: &[(&str, &str)] = &[
    ("async_insert", "0"),
    ("insert_deduplicate", "1"),
    ("max_insert_block_size", "1048449"),
    ("min_insert_block_size_rows", "1048449"),
    ("max_insert_block_size_bytes", "0"),
    ("min_insert_block_size_bytes", "0"),
    ("max_insert_threads", "1"),
    ("input_format_parallel_parsing", "0"),
    ("max_execution_time", "30"),
    ("http_receive_timeout", "30"),
    ("http_send_timeout", "30"),
    ("deduplicate_insert", "enable"),
    ("input_format_allow_errors_num", "0"),
    ("input_format_allow_errors_ratio", "0"),
];

pub(crate) struct Server {
    pub(crate) client: Client,
    pub(crate) db: String,
    /// The insert's settings: the sink's (those the server knows) and the
    /// profile's.
    pub(crate) settings: Vec<(String, String)>,
    /// The table's columns as `system.columns` lists them.
    pub(crate) layout: Layout,
    pub(crate) select: String,
}

pub(crate) fn url() -> String {
    std::env::var("CLICKHOUSE_URL").expect(
        "CLICKHOUSE_URL is not set: start the stack (scripts/stack.sh up) and export its env \
         (eval \"$(scripts/stack.sh env)\"); this test fails rather than skip",
    )
}

pub(crate) async fn text(
    client: &Client,
    sql: &str,
    settings: &[(String, String)],
) -> Result<String, String> {
    fetch(client, sql, settings, "TabSeparated").await
}

pub(crate) async fn fetch(
    client: &Client,
    sql: &str,
    settings: &[(String, String)],
    format: &str,
) -> Result<String, String> {
    let mut q = client.query(sql);
    for (k, v) in settings {
        q = q.with_setting(k, v);
    }
    let mut cur = q.fetch_bytes(format).map_err(|e| e.to_string())?;
    let bytes = cur.collect().await.map_err(|e| format!("{sql}: {e}"))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

pub(crate) async fn exec(client: &Client, sql: &str) {
    client
        .query(sql)
        .execute()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

pub(crate) fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

pub(crate) static RUN: AtomicU64 = AtomicU64::new(0);

impl Server {
    pub(crate) async fn new(family: &str, profile: &Profile, cols: &[Col], select: &str) -> Server {
        let client = Client::default().with_url(url());
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            % 1_000_000_000;
        let db = format!(
            "sluice_binary_{family}_{}_{}_{nanos}_{}",
            profile.name,
            std::process::id(),
            RUN.fetch_add(1, Ordering::Relaxed)
        );
        exec(&client, &format!("CREATE DATABASE {db}")).await;
        let mut ddl: Vec<String> = cols.iter().filter_map(|c| c.ddl.clone()).collect();
        ddl.extend([
            "_topic String".into(),
            "_partition Int32".into(),
            "_offset Int64".into(),
        ]);
        for t in ["json", "bin", "probe"] {
            exec(
                &client,
                &format!(
                    "CREATE TABLE {db}.{t} ({}) ENGINE = MergeTree ORDER BY _offset \
                     SETTINGS non_replicated_deduplication_window = 0",
                    ddl.join(", ")
                ),
            )
            .await;
        }
        let names: Vec<String> = SINK_SETTINGS.iter().map(|s| lit(s.0)).collect();
        let known = text(
            &client,
            &format!(
                "SELECT name FROM system.settings WHERE name IN ({})",
                names.join(",")
            ),
            &[],
        )
        .await
        .unwrap();
        let known: Vec<&str> = known.lines().collect();
        let mut settings: Vec<(String, String)> = SINK_SETTINGS
            .iter()
            .filter(|(n, _)| known.contains(n))
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        for (n, v) in profile.settings {
            settings.retain(|s| s.0 != *n);
            settings.push((n.to_string(), v.to_string()));
        }
        // The encoder's settings, as the insert sees them.
        let names: Vec<String> = InputSettings::NAMES.iter().map(|n| lit(n)).collect();
        let values = text(
            &client,
            &format!(
                "SELECT name, value FROM system.settings WHERE name IN ({})",
                names.join(",")
            ),
            &settings,
        )
        .await
        .unwrap();
        let values: HashMap<String, String> = values
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        let tz = text(&client, "SELECT timezone()", &settings).await.unwrap();
        let input =
            InputSettings::from_values(|n| values.get(n).map(String::as_str), tz.trim()).unwrap();
        let columns = text(
            &client,
            &format!(
                "SELECT name, type, default_kind FROM system.columns WHERE database = {} AND table = 'json' \
                 ORDER BY position FORMAT JSONEachRow",
                lit(&db)
            ),
            &[],
        )
        .await
        .unwrap();
        let specs: Vec<ColumnSpec> = columns
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                ColumnSpec {
                    name: v["name"].as_str().unwrap().into(),
                    type_name: v["type"].as_str().unwrap().into(),
                    default_kind: DefaultKind::parse(v["default_kind"].as_str().unwrap()).unwrap(),
                }
            })
            .collect();
        let layout = Layout::new(&specs, input);
        assert_eq!(
            layout.unusable(),
            None,
            "{family}/{}: the layout cannot be used",
            profile.name
        );
        Server {
            client,
            db,
            settings,
            layout,
            select: select.to_string(),
        }
    }

    /// Inserts `body` into `table` as the sink does.
    pub(crate) async fn insert(
        &self,
        table: &str,
        format: &str,
        body: Vec<u8>,
    ) -> Result<(), String> {
        let deadline = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis()
            + 3_600_000;
        let sql = format!(
            "INSERT INTO {}.{table} SELECT * FROM input() \
             WHERE (SELECT throwIf(toUnixTimestamp64Milli(now64(3)) > {deadline}, 'deadline passed')) = 0 \
             AND throwIf(toUnixTimestamp(nowInBlock()) * 1000 + 999 > {deadline}, 'deadline passed') = 0 \
             FORMAT {format}",
            self.db
        );
        let mut ins = self.client.insert_formatted_with(sql);
        for (k, v) in &self.settings {
            ins = ins.with_setting(k, v);
        }
        ins.send(Bytes::from(body))
            .await
            .map_err(|e| e.to_string())?;
        ins.end().await.map_err(|e| e.to_string())
    }

    /// Each row's bytes, by `_offset`.
    pub(crate) async fn read(&self, table: &str) -> BTreeMap<usize, String> {
        let sql = format!(
            "SELECT _offset, hex(formatRow('RowBinary', {})) FROM {}.{table} ORDER BY _offset",
            self.select, self.db
        );
        let out = text(&self.client, &sql, &[]).await.unwrap();
        out.lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(o, h)| (o.parse().unwrap(), h.to_string()))
            .collect()
    }

    /// A row as text, for a failure's message.
    pub(crate) async fn show(&self, table: &str, offset: usize) -> String {
        let sql = format!("SELECT * FROM {}.{table} WHERE _offset = {offset}", self.db);
        text(&self.client, &sql, &[]).await.unwrap_or_else(|e| e)
    }
}

/// What became of each column's focus values.
#[derive(Debug, Default, Clone)]
pub(crate) struct Tally {
    pub(crate) rows: usize,
    pub(crate) converted: usize,
    pub(crate) good: usize,
    pub(crate) good_converted: usize,
    pub(crate) json_refused: usize,
}

#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) per_col: Vec<Tally>,
    pub(crate) reasons: BTreeMap<&'static str, usize>,
    pub(crate) compared: usize,
}

/// The 1-based position in `left` of the first row JSONEachRow refuses,
/// found by inserting ever shorter prefixes into the scratch table. (The
/// stack's server cannot pass on an error whose message quotes bytes that
/// are not UTF-8, so such a refusal names no row.)
pub(crate) async fn first_refused(
    server: &Server,
    lines: &[Vec<u8>],
    left: &[usize],
) -> Option<usize> {
    let fails = |n: usize| async move {
        exec(
            &server.client,
            &format!("TRUNCATE TABLE {}.probe", server.db),
        )
        .await;
        let body: Vec<u8> = left[..n].iter().flat_map(|&i| lines[i].clone()).collect();
        server.insert("probe", "JSONEachRow", body).await.is_err()
    };
    if !fails(left.len()).await {
        return None;
    }
    // The shortest failing prefix: fails(hi) holds, fails(lo) does not.
    let (mut lo, mut hi) = (0, left.len());
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if fails(mid).await {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// "(at row N)" in a refusal: the 1-based row of the body.
pub(crate) fn refused_row(err: &str) -> Option<usize> {
    let at = err.find("(at row ")? + "(at row ".len();
    err[at..].split(')').next()?.trim().parse().ok()
}

pub(crate) async fn check(
    server: &Server,
    batch: &[Row],
    stats: &Mutex<Stats>,
    ncols: usize,
) -> Result<(), String> {
    let lines: Vec<Vec<u8>> = batch.iter().enumerate().map(|(i, r)| r.json(i)).collect();
    let mut encoded: Vec<Option<Vec<u8>>> = Vec::with_capacity(lines.len());
    let mut reasons: Vec<Option<&'static str>> = Vec::with_capacity(lines.len());
    for line in &lines {
        let mut out = Vec::new();
        match server.layout.encode(line, &mut out) {
            Ok(()) => {
                encoded.push(Some(out));
                reasons.push(None);
            }
            Err(e) => {
                encoded.push(None);
                reasons.push(Some(e.reason));
            }
        }
    }
    for t in ["json", "bin"] {
        exec(&server.client, &format!("TRUNCATE TABLE {}.{t}", server.db)).await;
    }
    // JSON: the whole batch; a refused row is taken out and the rest sent
    // again.
    let mut left: Vec<usize> = (0..lines.len()).collect();
    let mut refused = vec![false; lines.len()];
    while !left.is_empty() {
        let body: Vec<u8> = left.iter().flat_map(|&i| lines[i].clone()).collect();
        match server.insert("json", "JSONEachRow", body).await {
            Ok(()) => break,
            Err(e) => {
                let n = match refused_row(&e).filter(|n| (1..=left.len()).contains(n)) {
                    Some(n) => n,
                    None => first_refused(server, &lines, &left)
                        .await
                        .ok_or_else(|| format!("the JSON insert failed, but no row alone: {e}"))?,
                };
                let i = left.remove(n - 1);
                refused[i] = true;
                if encoded[i].is_some() {
                    return Err(format!(
                        "JSONEachRow refuses row {i} but the encoder converted it\nrow: {}\nerror: {e}",
                        String::from_utf8_lossy(&lines[i])
                    ));
                }
            }
        }
    }
    let body: Vec<u8> = encoded.iter().flatten().flatten().copied().collect();
    if !body.is_empty() {
        server
            .insert("bin", "RowBinaryWithDefaults", body)
            .await
            .map_err(|e| format!("the binary insert failed: {e}"))?;
    }
    let json = server.read("json").await;
    let bin = server.read("bin").await;
    let mut compared = 0;
    for (i, e) in encoded.iter().enumerate() {
        if e.is_none() {
            continue;
        }
        compared += 1;
        if json.get(&i) != bin.get(&i) {
            return Err(format!(
                "row {i} differs\nrow: {}\njson: {:?}\nbin:  {:?}\njson row: {}\nbin row:  {}",
                String::from_utf8_lossy(&lines[i]),
                json.get(&i),
                bin.get(&i),
                server.show("json", i).await,
                server.show("bin", i).await
            ));
        }
    }
    if bin.len() != compared {
        return Err(format!(
            "the binary table holds {} rows, {compared} were sent",
            bin.len()
        ));
    }
    let mut s = stats.lock().unwrap();
    s.per_col.resize(ncols, Tally::default());
    s.compared += compared;
    for (i, r) in batch.iter().enumerate() {
        let t = &mut s.per_col[r.focus];
        t.rows += 1;
        t.converted += usize::from(encoded[i].is_some());
        t.json_refused += usize::from(refused[i]);
        if r.good() {
            t.good += 1;
            t.good_converted += usize::from(encoded[i].is_some());
        }
        if let Some(why) = reasons[i] {
            *s.reasons.entry(why).or_default() += 1;
        }
    }
    Ok(())
}
