//! Inserts and protocol queries against ClickHouse over HTTP.
//!
//! In: encoded batches and questions about a table. Out: acknowledged
//! inserts, watermarks (the highest stored offset per partition), the set of
//! offsets present in a range, and "that attempt can no longer commit".
//! Every insert carries the settings the protocol relies on explicitly, so
//! the sink behaves the same on 25.3 (the documents' version) and 26.x
//! (which defaults to `async_insert=1`). Settings the server does not know
//! are left out after asking `system.settings` once at start.

use super::error::{ChError, ChErrorKind};
use crate::config::{ClickHouseConfig, Delivery, Route};
use bytes::Bytes;
use sluice_core::dedup::{key_hash, KeyHash};
use sluice_core::{MetadataColumns, Offset};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One insert attempt.
#[derive(Debug, Clone)]
pub struct InsertRequest {
    /// `` `db`.`table` ``.
    pub table: String,
    pub body: Bytes,
    /// `insert_deduplication_token`, when the mode uses one.
    pub token: Option<String>,
    /// Unique per attempt, so the attempt can be found and killed.
    pub query_id: String,
}

#[derive(Clone)]
pub struct ClickHouse {
    client: clickhouse::Client,
    insert_timeout: Duration,
    insert_settings: Vec<(String, String)>,
    columns: MetadataColumns,
}

impl ClickHouse {
    /// Connects and learns which insert settings the server knows.
    pub async fn connect(
        cfg: &ClickHouseConfig,
        columns: MetadataColumns,
        delivery: Delivery,
        max_batch_rows: usize,
    ) -> Result<Self, ChError> {
        let client = clickhouse::Client::default()
            .with_url(&cfg.url)
            .with_user(&cfg.user)
            .with_password(cfg.password.expose())
            .with_database(&cfg.database)
            .with_validation(false);
        let secs = cfg.insert_timeout.as_secs().max(1).to_string();
        let block = (max_batch_rows + 1).max(1_048_449).to_string();
        let mut wanted: Vec<(&str, String)> = vec![
            ("async_insert", "0".into()),
            ("insert_deduplicate", "1".into()),
            ("max_insert_block_size", block.clone()),
            ("min_insert_block_size_rows", block),
            ("max_insert_block_size_bytes", "0".into()),
            ("max_execution_time", secs.clone()),
            ("timeout_overflow_mode", "throw".into()),
            ("http_receive_timeout", secs.clone()),
            ("http_send_timeout", secs),
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
        let mut insert_settings: Vec<(String, String)> = wanted
            .into_iter()
            .filter(|(n, _)| known.iter().any(|k| k == n))
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        for (k, v) in &cfg.settings {
            insert_settings.retain(|(n, _)| n != k);
            insert_settings.push((k.clone(), v.clone()));
        }
        Ok(Self {
            client,
            insert_timeout: cfg.insert_timeout,
            insert_settings,
            columns,
        })
    }

    /// The longest an insert can live on the client and on the server.
    pub fn insert_timeout(&self) -> Duration {
        self.insert_timeout
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
    pub async fn check_columns(&self, route: &Route, fields: &[String]) -> Result<(), ChError> {
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
        let sql = format!("INSERT INTO {} FORMAT JSONEachRow", req.table);
        let mut ins = self
            .client
            .insert_formatted_with(sql)
            .with_timeouts(Some(self.insert_timeout), Some(self.insert_timeout))
            .with_setting("query_id", &req.query_id);
        for (k, v) in &self.insert_settings {
            ins = ins.with_setting(k, v);
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
            Err(_) => Err(ChError {
                kind: ChErrorKind::Timeout,
                code: None,
                message: "insert timed out".into(),
            }),
        }
    }

    /// The highest stored offset of each partition of `topic` in `route`'s table.
    pub async fn watermarks(&self, route: &Route) -> Result<HashMap<i32, Offset>, ChError> {
        let c = &self.columns;
        let sql = format!(
            "SELECT toInt32({p}), toInt64(max({o})) FROM {t} WHERE {tp} = ? GROUP BY {tp}, {p}",
            p = q(&c.partition),
            o = q(&c.offset),
            tp = q(&c.topic),
            t = route.qualified()
        );
        let rows: Vec<(i32, i64)> = self
            .bounded(self.client.query(&sql).bind(&route.topic).fetch_all())
            .await?;
        Ok(rows.into_iter().map(|(p, o)| (p, Offset(o))).collect())
    }

    /// The offsets in `first..=last` of one partition that the table holds,
    /// ascending (duplicates included once or more).
    pub async fn present_offsets(
        &self,
        route: &Route,
        partition: i32,
        first: Offset,
        last: Offset,
    ) -> Result<Vec<Offset>, ChError> {
        let o = q(&self.columns.offset);
        let rows: Vec<i64> = self
            .bounded(
                self.range_query(
                    route,
                    &format!("toInt64({o}) AS o"),
                    "ORDER BY o",
                    (partition, first, last),
                )
                .fetch_all(),
            )
            .await?;
        Ok(rows.into_iter().map(Offset).collect())
    }

    /// How many distinct offsets in `first..=last` of one partition the table
    /// holds.
    pub async fn distinct_offsets(
        &self,
        route: &Route,
        partition: i32,
        first: Offset,
        last: Offset,
    ) -> Result<u64, ChError> {
        let o = q(&self.columns.offset);
        self.bounded(
            self.range_query(
                route,
                &format!("uniqExact({o})"),
                "",
                (partition, first, last),
            )
            .fetch_one(),
        )
        .await
    }

    /// The business keys of the rows of one partition in `first..=last`,
    /// hashed as [`sluice_core::RowEncoder::encode_keyed`] hashes a record's:
    /// each field's `toString`, joined by `0x1f`. Rows with a NULL key field
    /// are left out (such records are never deduped).
    pub async fn keys_between(
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
            .range_query(
                route,
                &format!("arrayStringConcat([{}], '\\x1f')", parts.join(", ")),
                &not_null,
                (partition, first, last),
            )
            .fetch::<String>()?;
        let mut keys = Vec::new();
        while let Some(k) = cursor.next().await? {
            keys.push(key_hash([k.as_bytes()]));
        }
        Ok(keys)
    }

    /// `SELECT {select} … {tail}` over the rows of one partition whose offsets
    /// lie in `first..=last`.
    fn range_query(
        &self,
        route: &Route,
        select: &str,
        tail: &str,
        (partition, first, last): (i32, Offset, Offset),
    ) -> clickhouse::query::Query {
        let c = &self.columns;
        let sql = format!(
            "SELECT {select} FROM {t} WHERE {tp} = ? AND {p} = ? AND {o} BETWEEN ? AND ? {tail}",
            p = q(&c.partition),
            o = q(&c.offset),
            tp = q(&c.topic),
            t = route.qualified()
        );
        self.client
            .query(&sql)
            .bind(&route.topic)
            .bind(partition)
            .bind(first.0)
            .bind(last.0)
    }

    /// Makes sure the attempt `query_id`, started at `started`, can no longer
    /// commit. The server is asked to kill it, and sluice waits until it has
    /// left `system.processes`; then, because a server may not know the query
    /// by that id (or its bytes may not have arrived yet), until the
    /// attempt's lifetime bound has passed: after `insert_timeout` the
    /// server's `max_execution_time` and HTTP timeouts have ended it.
    pub async fn fence_attempt(&self, query_id: &str, started: Instant) -> Result<(), ChError> {
        let bound = started + self.insert_timeout + Duration::from_secs(1);
        let _ = self
            .bounded(
                self.client
                    .query("KILL QUERY WHERE query_id = ? SYNC")
                    .bind(query_id)
                    .execute(),
            )
            .await;
        loop {
            let running = self
                .bounded(
                    self.client
                        .query("SELECT count() FROM system.processes WHERE query_id = ?")
                        .bind(query_id)
                        .fetch_one::<u64>(),
                )
                .await;
            match running {
                Ok(0) => break,
                Ok(_) if Instant::now() >= bound + self.insert_timeout => {
                    return Err(ChError::client(format!(
                        "insert {query_id} is still running after a kill and twice its timeout"
                    )));
                }
                Ok(_) => {}
                // No view of the processes: the lifetime bound alone decides.
                Err(e) if e.kind == ChErrorKind::Server => break,
                Err(e) => return Err(e),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep_until(bound.into()).await;
        Ok(())
    }

    /// A trivial round trip, for readiness.
    pub async fn ping(&self) -> Result<(), ChError> {
        self.bounded(self.client.query("SELECT 1").fetch_one::<u8>())
            .await
            .map(|_| ())
    }
}

impl ClickHouse {
    /// `work` (a query), bounded like an insert: no call to ClickHouse may
    /// hang a task forever (a connection that never answers).
    async fn bounded<T>(
        &self,
        work: impl std::future::Future<Output = clickhouse::error::Result<T>>,
    ) -> Result<T, ChError> {
        bounded(self.insert_timeout, work).await
    }
}

async fn bounded<T>(
    limit: Duration,
    work: impl std::future::Future<Output = clickhouse::error::Result<T>>,
) -> Result<T, ChError> {
    match tokio::time::timeout(limit + Duration::from_secs(5), work).await {
        Ok(r) => r.map_err(ChError::from),
        Err(_) => Err(ChError {
            kind: ChErrorKind::Timeout,
            code: None,
            message: format!("no answer within {:?}", limit + Duration::from_secs(5)),
        }),
    }
}

fn q(ident: &str) -> String {
    crate::config::quote_ident(ident)
}
