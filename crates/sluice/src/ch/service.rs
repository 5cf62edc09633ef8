//! Inserts and protocol queries against ClickHouse over HTTP.
//!
//! In: encoded batches and questions about a table. Out: acknowledged
//! inserts, watermarks (the highest stored offset per partition), the set of
//! offsets present in a range, and "that attempt can no longer commit".
//! Every insert carries the settings the protocol relies on explicitly, so
//! the sink behaves the same on 25.3 (the documents' version) and 26.x
//! (which defaults to `async_insert=1`). Settings the server does not know
//! are left out after asking `system.settings` once at start.
//!
//! Replicas: every read the protocol relies on (watermarks, reconciliation,
//! the key window, the fence) goes through one path with the read settings.
//! On a `Replicated*` table the defaults make those reads see every
//! acknowledged insert: quorum inserts, linearized
//! (`insert_quorum = 'auto'`, `insert_quorum_parallel = 0`,
//! `insert_quorum_timeout` = `insert_timeout`), and
//! `select_sequential_consistency = 1`; on `Shared*` (ClickHouse Cloud) the
//! latter. The user's `settings` / `read_settings` win over these.
//!
//! Late requests: an exactly-once attempt carries an absolute deadline on the
//! *server's* clock, checked by the server when the query starts (a scalar
//! `throwIf` over `now64()`, evaluated before any data is read) and again
//! when its rows are processed (`nowInBlock()` in the row filter). A request
//! that reaches the server after its deadline (held in a proxy, queued,
//! retransmitted), or whose body is still arriving then, fails without
//! storing anything. [`ClickHouse::fence_attempt`]
//! then declares an attempt finished only once the server's clock has passed
//! its deadline and its query id is gone from `system.processes`: from then
//! on it can neither start nor still be running, whatever the client's clock
//! says.

use super::error::{ChError, ChErrorKind};
use crate::config::{ClickHouseConfig, Delivery, Route};
use crate::sql::{literal, TableRef};
use bytes::Bytes;
use sluice_formats::MetadataColumns;
use sluice_protocol::deadline::{self, FenceStep};
use sluice_protocol::dedup::{key_hash, KeyHash};
use sluice_protocol::token::query_scope;
use sluice_protocol::{Offset, Row};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The text of the error an attempt raises when it starts after its deadline.
pub(crate) const DEADLINE_PASSED: &str = "sluice: attempt deadline passed";

/// One insert attempt.
#[derive(Debug, Clone)]
pub struct InsertRequest {
    pub table: TableRef,
    pub body: Bytes,
    /// `insert_deduplication_token`, when the mode uses one.
    pub token: Option<String>,
    /// Unique per attempt, so the attempt can be found and killed.
    pub query_id: String,
    /// The server-clock instant (Unix ms) after which the attempt must not
    /// start (`ClickHouse::deadline_by`); `None`: a plain insert.
    pub deadline_ms: Option<i64>,
    /// Settings the rows' format relies on, over every other
    /// ([`crate::config::Format::insert_settings`]).
    pub format_settings: &'static [(&'static str, &'static str)],
    /// How `body` is written.
    pub format: RowFormat,
}

/// How an insert's body is written.
#[derive(Debug, Clone)]
pub enum RowFormat {
    /// One JSON object per line.
    Json,
    /// `RowBinaryWithDefaults`, in the table's columns as they were read
    /// with this guard ([`super::layout::TableLayout::guard`]).
    Binary { guard: Arc<str> },
}

#[derive(Clone)]
pub struct ClickHouse {
    client: clickhouse::Client,
    insert_timeout: Duration,
    insert_settings: Vec<(String, String)>,
    /// Settings of every protocol read.
    read_settings: Vec<(String, String)>,
    /// The user's own settings, which defaults never replace.
    user_settings: Vec<String>,
    columns: MetadataColumns,
    /// The server's clock, as measured from here.
    clock: Arc<SharedClock>,
    /// Look for attempts in the process lists of every replica of this
    /// cluster (`clusterAllReplicas`), not only the server answering.
    cluster: Option<String>,
    delivery: Delivery,
}

impl ClickHouse {
    /// Connects and learns which insert settings the server knows.
    pub async fn connect(
        cfg: &ClickHouseConfig,
        columns: MetadataColumns,
        delivery: Delivery,
        max_batch_rows: usize,
    ) -> Result<Self, ChError> {
        let client = super::client(cfg);
        let secs = cfg.insert_timeout.as_secs().max(1).to_string();
        let block = (max_batch_rows + 1).max(1_048_449).to_string();
        let mut wanted: Vec<(&str, String)> = vec![
            ("async_insert", "0".into()),
            ("insert_deduplicate", "1".into()),
            ("max_insert_block_size", block.clone()),
            ("min_insert_block_size_rows", block),
            ("max_insert_block_size_bytes", "0".into()),
            ("min_insert_block_size_bytes", "0".into()),
            // `INSERT … SELECT FROM input()`: one stream, so one block, one part.
            ("max_insert_threads", "1".into()),
            // One stream of parsing too: a refused row's number counts from
            // the body's first row, and the row filter's deadline check runs
            // on the last block after the body's last byte (in parallel, a
            // segment can end there and leave an empty one to the end).
            ("input_format_parallel_parsing", "0".into()),
            ("max_execution_time", secs.clone()),
            ("http_receive_timeout", secs.clone()),
            ("http_send_timeout", secs),
            // 26.x: an `INSERT … SELECT FROM input()` without a token is
            // deduplicated (by the table's window, as a plain INSERT is)
            // only with this; a token makes it stable under any value.
            (
                "deduplicate_insert_select",
                "enable_even_for_bad_queries".into(),
            ),
        ];
        if delivery.sends_tokens() {
            // 26.x: `insert_deduplicate=0` no longer turns dedup off; this does.
            wanted.push(("deduplicate_insert", "enable".into()));
        }
        let names: Vec<&str> = wanted.iter().map(|w| w.0).collect();
        let known: Vec<String> = bounded(
            cfg.insert_timeout,
            client
                .query("SELECT name FROM system.settings WHERE name IN ?")
                .bind(names)
                .fetch_all::<String>(),
        )
        .await?;
        let insert_settings: Vec<(String, String)> = wanted
            .into_iter()
            .filter(|(n, _)| known.iter().any(|k| k == n))
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        let ch = Self::with_settings(cfg, client, columns, delivery, insert_settings);
        ch.server_now(true).await?;
        Ok(ch)
    }

    /// A handle that sends `insert_settings` (the ones the server knows
    /// of sluice's), overridden by the user's own; no request is made.
    fn with_settings(
        cfg: &ClickHouseConfig,
        client: clickhouse::Client,
        columns: MetadataColumns,
        delivery: Delivery,
        mut insert_settings: Vec<(String, String)>,
    ) -> Self {
        for (k, v) in &cfg.settings {
            insert_settings.retain(|(n, _)| n != k);
            insert_settings.push((k.clone(), v.clone()));
        }
        Self {
            client,
            insert_timeout: cfg.insert_timeout,
            insert_settings,
            read_settings: cfg
                .read_settings
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            user_settings: cfg
                .settings
                .keys()
                .chain(cfg.read_settings.keys())
                .cloned()
                .collect(),
            columns,
            clock: Arc::default(),
            cluster: cfg.cluster.clone(),
            delivery,
        }
    }

    /// A handle that has not met its server: for tests of what the sink
    /// decides, which never send it a request.
    #[cfg(test)]
    pub(crate) fn offline(cfg: &ClickHouseConfig, delivery: Delivery) -> Self {
        let client = super::client(cfg);
        Self::with_settings(
            cfg,
            client,
            MetadataColumns::default(),
            delivery,
            Vec::new(),
        )
    }

    /// The server's clock (Unix ms); also a new reading of it, kept if it is
    /// the most precise one yet, or the clock moved (or always, with `force`).
    /// The sink calls it every [`deadline::CLOCK_REREAD`].
    pub(crate) async fn server_now(&self, force: bool) -> Result<i64, ChError> {
        let before = Instant::now();
        let now: i64 = self
            .bounded(
                self.client
                    .query("SELECT toUnixTimestamp64Milli(now64(3))")
                    .fetch_one(),
            )
            .await?;
        self.clock.observe(now, before, Instant::now(), force);
        Ok(now)
    }

    /// How many readings found the server's clock ahead of what ours
    /// predicted: ours may have stood still (a suspended host), and every
    /// lease with it ([`crate::sink`] suspects them).
    pub(crate) fn clock_jumps(&self) -> u64 {
        self.clock.jumps.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The deadline of an attempt that must start by `latest` (a lease's
    /// end) on our clock: `insert_timeout` after the earlier of now and
    /// `latest`, on the server's clock. A process stopped between checking
    /// its lease and sending the attempt gets a deadline already past.
    pub(crate) fn deadline_by(&self, latest: Instant) -> i64 {
        deadline::attempt_deadline(
            |t| self.clock.ms_at(t),
            latest,
            Instant::now(),
            self.insert_timeout,
        )
    }

    /// The engine of `route`'s table (empty: no such table).
    pub async fn engine(&self, route: &Route) -> Result<String, ChError> {
        let engines: Vec<String> = self
            .bounded(
                self.client
                    .query("SELECT engine FROM system.tables WHERE database = ? AND name = ?")
                    .bind(&route.database)
                    .bind(&route.table)
                    .fetch_all(),
            )
            .await?;
        Ok(engines.into_iter().next().unwrap_or_default())
    }

    /// Adds the settings that make the protocol's reads consistent on
    /// `table`, of engine `engine` (see the module header), where the user
    /// set none; refuses a table whose engine the delivery cannot keep its
    /// promise on (`refusal`).
    pub fn consistent_for(&mut self, table: &TableRef, engine: &str) -> Result<(), ChError> {
        let (insert, read) = consistency_defaults(engine);
        add_defaults(&mut self.insert_settings, insert, &self.user_settings);
        add_defaults(&mut self.read_settings, read, &self.user_settings);
        let cluster = self.cluster.is_some();
        if let Some(why) = refusal(engine, self.delivery, cluster, &self.insert_settings) {
            return Err(ChError::client(format!("table {table} is {engine}: {why}")));
        }
        if engine.starts_with("Replicated") || engine == "Distributed" {
            // A part that missed its quorum must not turn up after the
            // insert's own bound: wait for the quorum no longer than that.
            let ms = self.insert_timeout.as_millis().to_string();
            self.insert_settings
                .retain(|(n, _)| n != "insert_quorum_timeout");
            self.insert_settings
                .push(("insert_quorum_timeout".into(), ms));
        }
        Ok(())
    }

    /// A read the protocol relies on, with the read settings.
    fn read(&self, sql: &str) -> clickhouse::query::Query {
        let mut q = self.client.query(sql);
        for (k, v) in &self.read_settings {
            q = q.with_setting(k, v);
        }
        q
    }

    pub(super) fn client(&self) -> &clickhouse::Client {
        &self.client
    }

    /// The settings `route`'s inserts carry: sluice's, the user's over
    /// them, the route's format settings over every other.
    pub(crate) fn insert_settings_of(&self, route: &Route) -> Vec<(String, String)> {
        let mut settings = self.insert_settings.clone();
        for (k, v) in route.insert_settings() {
            settings.retain(|(n, _)| n != k);
            settings.push((k.to_string(), v.to_string()));
        }
        settings
    }

    /// The settings of inserts, for the start-up log.
    pub(crate) fn insert_settings(&self) -> &[(String, String)] {
        &self.insert_settings
    }

    /// The settings of protocol reads, for the start-up log.
    pub(crate) fn read_settings(&self) -> &[(String, String)] {
        &self.read_settings
    }

    /// The column names of `route`'s table (empty: no such table).
    async fn columns_of(&self, route: &Route) -> Result<Vec<String>, ChError> {
        self.bounded(
            self.client
                .query("SELECT name FROM system.columns WHERE database = ? AND table = ?")
                .bind(&route.database)
                .bind(&route.table)
                .fetch_all(),
        )
        .await
    }

    /// The columns of `route`'s table a sluice INSERT takes a value for:
    /// all but the `MATERIALIZED` and `ALIAS` ones, and the `EPHEMERAL` ones
    /// (`SELECT * FROM input()`, the shape of the exactly-once insert, has
    /// no place for them).
    pub(crate) async fn insertable_columns(&self, route: &Route) -> Result<Vec<String>, ChError> {
        self.bounded(
            self.client
                .query(
                    "SELECT name FROM system.columns WHERE database = ? AND table = ? \
                     AND default_kind NOT IN ('MATERIALIZED', 'ALIAS', 'EPHEMERAL')",
                )
                .bind(&route.database)
                .bind(&route.table)
                .fetch_all(),
        )
        .await
    }

    /// Checks that `route`'s table exists and has the metadata columns.
    pub async fn check_table(&self, route: &Route) -> Result<(), ChError> {
        let cols = self.columns_of(route).await?;
        if cols.is_empty() {
            return Err(ChError::client(format!(
                "table {}.{} (for topic {:?}) does not exist; `sluice schema` prints a recommended DDL",
                route.database, route.table, route.topic
            )));
        }
        let c = &self.columns;
        let missing: Vec<&str> = [&c.topic, &c.partition, &c.offset]
            .into_iter()
            .filter(|m| !cols.iter().any(|x| x == *m))
            .map(|s| s.as_str())
            .collect();
        if !missing.is_empty() {
            return Err(ChError::client(format!(
                "table {}.{} lacks the metadata column(s) {}; sluice stores each row's topic, partition and offset there",
                route.database,
                route.table,
                missing.join(", ")
            )));
        }
        Ok(())
    }

    /// Checks that `route`'s table has the `fields` (its dedup key).
    pub(crate) async fn check_columns(
        &self,
        route: &Route,
        fields: &[String],
    ) -> Result<(), ChError> {
        let cols = self.columns_of(route).await?;
        let missing: Vec<&str> = fields
            .iter()
            .filter(|f| !cols.contains(f))
            .map(String::as_str)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(ChError::client(format!(
            "table {}.{} lacks the dedup_key column(s) {} of the route for topic {:?}; \
             the key dedup window is rebuilt from them",
            route.database,
            route.table,
            missing.join(", "),
            route.topic
        )))
    }

    /// Runs one insert attempt, bounded by the insert timeout.
    pub async fn insert(&self, req: InsertRequest) -> Result<(), ChError> {
        let table = req.table.sql();
        // The scalar subquery runs when the query starts, before any row;
        // the row filter when the rows' block is processed, so a body that
        // arrives slowly cannot commit after the deadline either
        // (`nowInBlock()` counts whole seconds: a block passes only if its
        // whole second ends by the deadline).
        let deadline = req.deadline_ms.map(|d| {
            format!(
                "(SELECT throwIf(toUnixTimestamp64Milli(now64(3)) > {d}, '{DEADLINE_PASSED}')) = 0 \
                 AND throwIf(toUnixTimestamp(nowInBlock()) * 1000 + 999 > {d}, '{DEADLINE_PASSED}') = 0"
            )
        });
        let sql = match (&req.format, deadline) {
            (RowFormat::Json, None) => format!("INSERT INTO {table} FORMAT JSONEachRow"),
            (RowFormat::Json, Some(d)) => {
                format!("INSERT INTO {table} SELECT * FROM input() WHERE {d} FORMAT JSONEachRow")
            }
            (RowFormat::Binary { guard }, d) => format!(
                "INSERT INTO {table} SELECT * FROM input() WHERE {guard}{}{} \
                 FORMAT RowBinaryWithDefaults",
                if d.is_some() { " AND " } else { "" },
                d.unwrap_or_default()
            ),
        };
        let mut ins = self
            .client
            .insert_formatted_with(sql)
            .with_timeouts(Some(self.insert_timeout), Some(self.insert_timeout))
            .with_setting("query_id", &req.query_id);
        for (k, v) in &self.insert_settings {
            ins = ins.with_setting(k, v);
        }
        for (k, v) in req.format_settings {
            ins = ins.with_setting(*k, *v);
        }
        if let Some(token) = &req.token {
            ins = ins.with_setting("insert_deduplication_token", token);
        }
        let work = async {
            ins.send(req.body).await?;
            ins.end().await
        };
        // A client-side bound on the whole attempt, on top of the crate's.
        match tokio::time::timeout(self.insert_timeout + Duration::from_secs(1), work).await {
            Ok(r) => r.map_err(ChError::from),
            Err(_) => Err(ChError::timeout("insert timed out")),
        }
    }

    /// The highest stored offset of each partition of `topic` in `route`'s table.
    pub async fn watermarks(&self, route: &Route) -> Result<HashMap<i32, Offset>, ChError> {
        let c = &self.columns;
        let (p, o) = (q(&c.partition), q(&c.offset));
        let rows: Vec<(i32, i64)> = self
            .bounded(
                self.rows_of(
                    route,
                    &format!("toInt32({p}), toInt64(max({o}))"),
                    &[],
                    &format!("GROUP BY {p}"),
                )
                .fetch_all(),
            )
            .await?;
        Ok(rows.into_iter().map(|(p, o)| (p, Offset(o))).collect())
    }

    /// The rows the table holds in `spans` (per partition, `first..=last`),
    /// ascending by partition and offset (duplicates included once or
    /// more). Sorted here, not trusted to the server's `ORDER BY`: read
    /// settings can make it sort by a user's column of the same name.
    pub async fn present_rows(
        &self,
        route: &Route,
        spans: &[(i32, Offset, Offset)],
    ) -> Result<Vec<Row>, ChError> {
        if spans.is_empty() {
            return Ok(Vec::new());
        }
        let (p, o) = (q(&self.columns.partition), q(&self.columns.offset));
        let rows: Vec<(i32, i64)> = self
            .bounded(
                self.rows_of(route, &format!("toInt32({p}), toInt64({o})"), spans, "")
                    .fetch_all(),
            )
            .await?;
        let mut rows: Vec<Row> = rows.into_iter().map(|(p, o)| Row::new(p, o)).collect();
        rows.sort_unstable();
        Ok(rows)
    }

    /// How many distinct offsets in `first..=last` of one partition the table
    /// holds.
    pub(crate) async fn distinct_offsets(
        &self,
        route: &Route,
        partition: i32,
        first: Offset,
        last: Offset,
    ) -> Result<u64, ChError> {
        let o = q(&self.columns.offset);
        self.bounded(
            self.rows_of(
                route,
                &format!("uniqExact({o})"),
                &[(partition, first, last)],
                "",
            )
            .fetch_one(),
        )
        .await
    }

    /// The business keys of the rows of one partition in `first..=last`,
    /// hashed as [`sluice_formats::RowEncoder::encode_keyed`] hashes a record's:
    /// each field's `toString`, joined by `0x1f`. Rows with a NULL key field
    /// are left out (such records are never deduped).
    pub(crate) async fn keys_between(
        &self,
        route: &Route,
        fields: &[String],
        partition: i32,
        first: Offset,
        last: Offset,
    ) -> Result<Vec<KeyHash>, ChError> {
        let parts: Vec<String> = fields
            .iter()
            .map(|f| format!("toString({})", q(f)))
            .collect();
        let not_null: String = fields
            .iter()
            .map(|f| format!(" AND isNotNull({})", q(f)))
            .collect();
        let mut cursor = self
            .rows_of(
                route,
                &format!("arrayStringConcat([{}], '\\x1f')", parts.join(", ")),
                &[(partition, first, last)],
                &not_null,
            )
            .fetch::<String>()?;
        self.bounded(async {
            let mut keys = Vec::new();
            while let Some(k) = cursor.next().await? {
                keys.push(key_hash([k.as_bytes()]));
            }
            Ok(keys)
        })
        .await
    }

    /// `SELECT {select} … {tail}` over the route's rows: those of its topic
    /// and, with `range`, of one partition with offsets in `first..=last`.
    /// The one WHERE clause of every protocol read.
    fn rows_of(
        &self,
        route: &Route,
        select: &str,
        spans: &[(i32, Offset, Offset)],
        tail: &str,
    ) -> clickhouse::query::Query {
        let c = &self.columns;
        let span = format!(
            "{} = ? AND {} BETWEEN ? AND ?",
            q(&c.partition),
            q(&c.offset)
        );
        let within = match spans.len() {
            0 => String::new(),
            n => format!(" AND ({})", vec![span; n].join(" OR ")),
        };
        let sql = format!(
            "SELECT {select} FROM {t} WHERE {tp} = ?{within} {tail}",
            tp = q(&c.topic),
            t = route.table_ref().sql()
        );
        let mut query = self.read(&sql).bind(&route.topic);
        for &(partition, first, last) in spans {
            query = query.bind(partition).bind(first.0).bind(last.0);
        }
        query
    }

    /// Makes sure the attempt `query_id`, whose deadline is `deadline_ms` on
    /// the server's clock, can no longer commit. The server is asked to kill
    /// it; then sluice waits until the server's clock is past the deadline
    /// (plus a margin) and the id is gone from `system.processes`: the
    /// attempt can no longer start, and is not running. Where the process
    /// list cannot be read, the server's `max_execution_time` (the insert
    /// timeout) after the deadline bounds a run that started in time.
    pub(crate) async fn fence_attempt(
        &self,
        query_id: &str,
        deadline_ms: i64,
    ) -> Result<(), ChError> {
        let give_up = Instant::now() + self.insert_timeout * 3 + Duration::from_secs(5);
        let mut fence = deadline::Fence::new(deadline_ms, self.insert_timeout);
        self.kill(query_id).await;
        loop {
            let sent = Instant::now();
            let seen = self
                .bounded(
                    self.read(&format!(
                        "SELECT toUnixTimestamp64Milli(now64(3)), \
                         (SELECT count() FROM {} WHERE query_id = ? OR initial_query_id = ?)",
                        self.processes()
                    ))
                    .bind(query_id)
                    .bind(query_id)
                    .fetch_one::<(i64, u64)>(),
                )
                .await;
            let (now, running) = match seen {
                Ok((now, running)) => {
                    self.clock.observe(now, sent, Instant::now(), false);
                    (now, Some(running))
                }
                // No view of the processes: the time bound alone decides.
                Err(e) if e.kind == ChErrorKind::Server => (self.server_now(false).await?, None),
                Err(e) => return Err(e),
            };
            match fence.step(now, running) {
                FenceStep::Done => return Ok(()),
                FenceStep::KillAgain if Instant::now() >= give_up => {
                    return Err(ChError::client(format!(
                        "insert {query_id} is still running after a kill and three times its timeout"
                    )));
                }
                FenceStep::KillAgain => {
                    self.kill(query_id).await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                FenceStep::WaitUntil(until) => {
                    tokio::time::sleep(Duration::from_millis(
                        (until - now + 1).clamp(1, 1_000) as u64
                    ))
                    .await;
                }
            }
        }
    }

    /// Ends every insert any process still runs for `partitions` of
    /// `route` (their query ids name one of them: [`query_scope`]) and
    /// waits until the process lists show none. A new owner does this after
    /// its claim and before it reads what the table holds: an earlier
    /// owner's insert that outlived its deadline (a part written late, a
    /// paused server) cannot commit after that read, whichever other
    /// partitions it holds rows of. Errs while one still runs after a kill
    /// and the insert timeout, for the caller to retry.
    pub(crate) async fn end_partition_queries(
        &self,
        route: &Route,
        partitions: &[i32],
    ) -> Result<(), ChError> {
        let cond = names_a_partition(&query_scope(&route.table_ref().sql(), &route.topic));
        let named: Vec<String> = partitions.iter().map(i32::to_string).collect();
        let give_up = Instant::now() + self.insert_timeout + Duration::from_secs(5);
        loop {
            let seen = self
                .bounded(
                    self.read(&format!(
                        "SELECT count() FROM {} WHERE {cond}",
                        self.processes()
                    ))
                    .bind(&named)
                    .fetch_one::<u64>(),
                )
                .await;
            let running = match seen {
                Ok(n) => n,
                // No view of the processes, for good (no grant, no such
                // table): the claim's fence alone bounds an earlier owner's
                // inserts. A busy server is asked again.
                Err(e) if e.kind == ChErrorKind::Server && !e.is_retriable() => {
                    tracing::warn!(error = %e, "cannot read the process list; relying on the claim's fence alone");
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            if running == 0 {
                return Ok(());
            }
            if Instant::now() >= give_up {
                return Err(ChError::client(format!(
                    "{running} insert(s) of an earlier owner of {}{partitions:?} still run after a kill and the insert timeout",
                    route.topic
                )));
            }
            tracing::warn!(
                running,
                topic = %route.topic,
                ?partitions,
                "an earlier owner's inserts of these partitions still run; ending them before reading the table"
            );
            self.kill_where(&cond, &named).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Asks the server (every replica of `cluster`) to end `query_id` (best
    /// effort: it may be gone, or the server may not know it).
    async fn kill(&self, query_id: &str) {
        self.kill_where("? IN (query_id, initial_query_id)", query_id)
            .await
    }

    /// Asks the server (every replica of `cluster`) to end every query that
    /// matches `cond`, whose one `?` is `bind` (best effort).
    async fn kill_where(&self, cond: &str, bind: impl serde::Serialize) {
        let on = self
            .cluster
            .as_ref()
            .map(|c| format!(" ON CLUSTER {}", q(c)))
            .unwrap_or_default();
        let _ = self
            .bounded(
                self.client
                    .query(&format!("KILL QUERY{on} WHERE {cond} SYNC"))
                    .bind(bind)
                    .execute(),
            )
            .await;
    }

    /// The process lists the fence looks in.
    fn processes(&self) -> String {
        match &self.cluster {
            Some(c) => format!("clusterAllReplicas({}, system.processes)", literal(c)),
            None => "system.processes".into(),
        }
    }
}

impl ClickHouse {
    /// `work` (a query), bounded like an insert: no call to ClickHouse may
    /// hang a task forever (a connection that never answers).
    pub(super) async fn bounded<T>(
        &self,
        work: impl std::future::Future<Output = clickhouse::error::Result<T>>,
    ) -> Result<T, ChError> {
        bounded(self.insert_timeout, work).await
    }
}

/// A `WHERE` condition true for a query (or one it was started by) whose
/// id, of `scope` ([`query_scope`]: hex digits, no quote), names one of the
/// partitions bound to its one `?` (an array of strings): the third
/// `-`-separated field of the id, split at `.`.
fn names_a_partition(scope: &str) -> String {
    format!(
        "arrayExists(id -> startsWith(id, '{scope}') \
         AND hasAny(splitByChar('.', splitByChar('-', id)[3]), ?), [query_id, initial_query_id])"
    )
}

async fn bounded<T>(
    limit: Duration,
    work: impl std::future::Future<Output = clickhouse::error::Result<T>>,
) -> Result<T, ChError> {
    match tokio::time::timeout(limit + Duration::from_secs(5), work).await {
        Ok(r) => r.map_err(ChError::from),
        Err(_) => Err(ChError::timeout(format!(
            "no answer within {:?}",
            limit + Duration::from_secs(5)
        ))),
    }
}

type Settings = &'static [(&'static str, &'static str)];

/// The settings that make the protocol's reads see every acknowledged insert
/// on a table with `engine`: `(insert, read)`.
fn consistency_defaults(engine: &str) -> (Settings, Settings) {
    if engine.starts_with("Replicated") {
        (
            &[("insert_quorum", "auto"), ("insert_quorum_parallel", "0")],
            &[("select_sequential_consistency", "1")],
        )
    } else if engine == "Distributed" {
        // Inserts wait for the shards; quorums and sequential reads hold on
        // shards of `Replicated*` tables and are ignored by plain ones.
        (
            &[
                ("distributed_foreground_insert", "1"),
                ("insert_quorum", "auto"),
                ("insert_quorum_parallel", "0"),
            ],
            &[("select_sequential_consistency", "1")],
        )
    } else if engine.starts_with("Shared") {
        (&[], &[("select_sequential_consistency", "1")])
    } else {
        (&[], &[])
    }
}

/// Why `delivery` cannot keep its promise on a table of `engine`, if it
/// cannot; `cluster`: `[clickhouse] cluster` is set.
fn refusal(
    engine: &str,
    delivery: Delivery,
    cluster: bool,
    settings: &[(String, String)],
) -> Option<&'static str> {
    match engine {
        "Buffer" => Some(
            "it acknowledges rows it holds in memory, which a server restart loses after \
             sluice committed past them; insert into the table it flushes to",
        ),
        "Null" if delivery.is_exactly_once() => Some(
            "it keeps no rows, so exactly-once cannot find what is stored; route the topic to \
             the table its materialized views write to",
        ),
        "Distributed" if !foreground(settings) => Some(
            "its inserts would be asynchronous: ClickHouse acknowledges them before the shards \
             hold the rows, so sluice could not find them to reconcile; leave \
             settings.distributed_foreground_insert at 1, or insert into the shards' tables",
        ),
        "Distributed" if delivery.is_exactly_once() && !cluster => Some(
            "the fence must see an attempt's inserts on every shard: set [clickhouse] cluster \
             to the table's cluster",
        ),
        "Distributed" if delivery == Delivery::TokenOnly => Some(
            "a retry spreads its rows over the shards differently, so one token stands for \
             other rows on each shard",
        ),
        _ => None,
    }
}

/// Whether inserts with `settings` into a `Distributed` table return only
/// once the shards hold the rows (both names of the setting, old and new).
fn foreground(settings: &[(String, String)]) -> bool {
    settings
        .iter()
        .filter(|(n, _)| n == "distributed_foreground_insert" || n == "insert_distributed_sync")
        .all(|(_, v)| matches!(v.trim(), "1" | "true"))
}

/// Adds each of `wanted` to `list` unless the user set it or it is there.
fn add_defaults(list: &mut Vec<(String, String)>, wanted: Settings, user: &[String]) {
    for (k, v) in wanted {
        if !user.iter().any(|u| u == k) && !list.iter().any(|(n, _)| n == k) {
            list.push((k.to_string(), v.to_string()));
        }
    }
}

/// The client's wall clock, Unix ms.
fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The server's clock as read from here ([`deadline::ServerClock`]), shared
/// by the tasks of one service.
#[derive(Debug, Default)]
struct SharedClock {
    held: std::sync::Mutex<deadline::ServerClock<Instant>>,
    /// Readings that found the server's clock ahead of what ours predicted.
    jumps: std::sync::atomic::AtomicU64,
}

impl SharedClock {
    /// Takes a reading; logs a clock that moved (stepped, or drifted
    /// against ours) by more than [`deadline::CLOCK_STEP_MS`].
    fn observe(&self, server_ms: i64, sent: Instant, received: Instant, force: bool) {
        let moved = {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            let moved = held.observe(server_ms, sent, received, force);
            // Counted before the new reading can be used: a deadline on it
            // is computed after the count grew. Servers behind one address
            // may disagree by the margin: only a larger jump counts.
            if moved.is_some_and(|ms| ms > deadline::CLOCK_MARGIN_MS) {
                self.jumps.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            moved
        };
        match moved {
            Some(ms) if ms < -deadline::CLOCK_MARGIN_MS => tracing::error!(
                moved_ms = ms,
                "ClickHouse's clock went back by more than the {} ms exactly-once tolerates: \
                 an attempt sent before the step may start that much later than its deadline \
                 meant; deadlines follow the new clock from now on",
                deadline::CLOCK_MARGIN_MS
            ),
            Some(ms) => tracing::warn!(
                moved_ms = ms,
                "ClickHouse's clock moved against ours; deadlines follow it from now on"
            ),
            None => {}
        }
    }

    /// The server's clock at `t` on ours (Unix ms); the client's wall clock
    /// until the first reading.
    fn ms_at(&self, t: Instant) -> i64 {
        let held = *self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.ms_at(t).unwrap_or_else(|| {
            unix_ms() - Instant::now().saturating_duration_since(t).as_millis() as i64
        })
    }
}

/// Whether `e` is an attempt refusing to start after its deadline: nothing
/// of it was stored.
pub(crate) fn deadline_passed(e: &ChError) -> bool {
    e.kind == ChErrorKind::Server && e.code == Some(395) && e.message.contains(DEADLINE_PASSED)
}

fn q(name: &str) -> String {
    crate::sql::ident(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_that_break_the_promise_are_refused() {
        let none: &[(String, String)] = &[];
        let eo = Delivery::ExactlyOnce;
        assert!(refusal("MergeTree", eo, false, none).is_none());
        assert!(refusal("Buffer", Delivery::AtLeastOnce, false, none).is_some());
        assert!(refusal("Null", eo, false, none).is_some());
        assert!(refusal("Null", Delivery::AtLeastOnce, false, none).is_none());
        let (insert, _) = consistency_defaults("Distributed");
        let mut defaults = Vec::new();
        add_defaults(&mut defaults, insert, &[]);
        assert!(refusal("Distributed", eo, false, &defaults).is_some());
        assert!(refusal("Distributed", eo, true, &defaults).is_none());
        assert!(refusal("Distributed", Delivery::AtLeastOnce, false, &defaults).is_none());
        assert!(refusal("Distributed", Delivery::TokenOnly, true, &defaults).is_some());
    }

    #[test]
    fn distributed_inserts_must_wait_for_the_shards() {
        let set = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let (insert, _) = consistency_defaults("Distributed");
        let mut defaults = Vec::new();
        add_defaults(&mut defaults, insert, &[]);
        assert!(foreground(&defaults));
        assert!(!foreground(&set(&[("distributed_foreground_insert", "0")])));
        assert!(!foreground(&set(&[
            ("distributed_foreground_insert", "1"),
            ("insert_distributed_sync", "0")
        ])));
    }

    #[test]
    fn replicated_tables_get_quorum_inserts_and_consistent_reads() {
        let mut insert = vec![("async_insert".to_string(), "0".to_string())];
        let mut read = Vec::new();
        let (i, r) = consistency_defaults("ReplicatedMergeTree");
        add_defaults(&mut insert, i, &[]);
        add_defaults(&mut read, r, &[]);
        assert!(insert.contains(&("insert_quorum".into(), "auto".into())));
        assert!(insert.contains(&("insert_quorum_parallel".into(), "0".into())));
        assert_eq!(
            read,
            vec![("select_sequential_consistency".into(), "1".into())]
        );
        // The user's own choice of a name wins.
        let mut read = vec![("select_sequential_consistency".to_string(), "0".to_string())];
        let user = vec![
            "select_sequential_consistency".to_string(),
            "insert_quorum".to_string(),
        ];
        let mut insert = vec![("insert_quorum".to_string(), "2".to_string())];
        add_defaults(&mut insert, i, &user);
        add_defaults(&mut read, r, &user);
        assert_eq!(
            read,
            vec![("select_sequential_consistency".into(), "0".into())]
        );
        assert_eq!(insert.len(), 2, "{insert:?}");
        assert!(!insert.contains(&("insert_quorum".into(), "auto".into())));
        // Cloud reads; nothing for plain MergeTree.
        assert_eq!(consistency_defaults("SharedReplacingMergeTree").1.len(), 1);
        assert_eq!(consistency_defaults("MergeTree"), (&[][..], &[][..]));
        assert_eq!(
            consistency_defaults("ReplacingMergeTree"),
            (&[][..], &[][..])
        );
    }

    #[test]
    fn a_late_attempt_is_recognised_by_its_own_message() {
        let late = ChError::from(clickhouse::error::Error::BadResponse(format!(
            "Code: 395. DB::Exception: {DEADLINE_PASSED}: while executing 'FUNCTION throwIf(…)'"
        )));
        assert!(deadline_passed(&late));
        let other = ChError::from(clickhouse::error::Error::BadResponse(
            "Code: 395. DB::Exception: Value passed to 'throwIf' function is non-zero".into(),
        ));
        assert!(!deadline_passed(&other));
    }
}
