//! One insert's body: a batch's `JSONEachRow` rows, sent as
//! `RowBinaryWithDefaults` in the route's table layout when every row
//! converts exactly, as they are otherwise.
//!
//! In: the rows left of a batch (its canonical form stays JSON: the DLQ,
//! the key window and reconciliation read it), per route the table's
//! [`TableLayout`]. Out: the body and its [`RowFormat`]. A row the encoder
//! does not know to land exactly as ClickHouse's JSON parser would store
//! it sends the whole attempt as JSON, counted in
//! `sluice_json_fallback_batches_total` with the reason; so does a route
//! whose table cannot be encoded here (an `EPHEMERAL` column, settings the
//! encoder does not mirror), or `clickhouse.insert_format = "json"`.
//!
//! Each route's layout is read when the sink starts, and again: after a
//! binary insert was refused (the writer then sends that batch as JSON,
//! [`Bodies::refused`]; the guard refuses every binary insert into a table
//! whose columns changed), [`AFTER_FAILURE`] after a read failed, and
//! [`UNUSABLE_FOR`] after it found a table it cannot encode or something in
//! front of the server refused a binary insert ([`Bodies::refused_in_front`]). Reads run in
//! the writer that needs them, one per route at a time, bounded by
//! [`READ_WITHIN`]; meanwhile the others use the layout last read.

use crate::ch::{ClickHouse, RowFormat, TableLayout};
use crate::config::{InsertFormat, Route};
use crate::telemetry;
use bytes::Bytes;
use sluice_protocol::Batch;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a read of a table's layout may take.
const READ_WITHIN: Duration = Duration::from_secs(2);
/// How long after a failed read the next one may start.
const AFTER_FAILURE: Duration = Duration::from_secs(10);
/// How long a table the encoder cannot take goes as JSON before its
/// layout is read again (an `ALTER` may have made it usable).
const UNUSABLE_FOR: Duration = Duration::from_secs(60);

const UNUSABLE: &str = "the table's rows cannot be encoded";
const REFUSED_IN_FRONT: &str = "something in front of ClickHouse refused a binary insert";

/// The binary path of each route.
pub(crate) struct Bodies {
    routes: Vec<Mutex<Slot>>,
}

struct Slot {
    /// The table as last read, or why its rows go as JSON.
    table: Result<Arc<TableLayout>, &'static str>,
    /// When to read it again (`None`: not before a binary insert is
    /// refused).
    reread_at: Option<Instant>,
    /// A read is under way.
    reading: bool,
}

impl Bodies {
    /// Reads the layout of each route's table (with `format = Json`: none,
    /// every body is JSON).
    pub(crate) async fn read(ch: &ClickHouse, routes: &[Arc<Route>], format: InsertFormat) -> Self {
        if format == InsertFormat::Json {
            return Self::json(routes.len());
        }
        let mut slots = Vec::with_capacity(routes.len());
        for route in routes {
            let mut slot = Slot {
                table: Err("the table's layout is not read yet"),
                reread_at: None,
                reading: false,
            };
            slot.answered(route, read(ch, route).await);
            slots.push(Mutex::new(slot));
        }
        Self { routes: slots }
    }

    /// Every body of `routes` routes as JSON.
    pub(crate) fn json(routes: usize) -> Self {
        let slot = || Slot {
            table: Err("insert_format = \"json\""),
            reread_at: None,
            reading: false,
        };
        Self {
            routes: (0..routes).map(|_| Mutex::new(slot())).collect(),
        }
    }

    /// The body of an attempt of `batch` on route `ri`, and its format;
    /// `json`: the writer sends this batch as JSON (a binary attempt of
    /// it was refused).
    pub(crate) async fn body(
        &self,
        ch: &ClickHouse,
        ri: usize,
        route: &Route,
        batch: &Batch,
        json: bool,
    ) -> (Bytes, RowFormat) {
        let table = match self.layout(ch, ri, route).await {
            _ if json => Err("a binary insert of the batch was refused"),
            t => t,
        };
        let label = || route.table_ref().to_string();
        let table = match table {
            Ok(t) => t,
            Err(why) => {
                telemetry::json_fallback(&label(), why);
                return (batch.body().clone(), RowFormat::Json);
            }
        };
        let mut out = Vec::with_capacity(batch.bytes() / 2);
        for i in 0..batch.len() {
            let Some((row, json)) = batch.row(i) else {
                break;
            };
            if let Err(f) = table.layout.encode(json, &mut out) {
                let column = f
                    .column
                    .and_then(|c| table.layout.columns().get(c))
                    .map(|c| c.name.as_str());
                tracing::debug!(table = %label(), partition = row.partition, offset = row.offset.0, column, reason = f.reason, "row sent as JSONEachRow");
                telemetry::json_fallback(&label(), f.reason);
                return (batch.body().clone(), RowFormat::Json);
            }
        }
        let guard = table.guard.clone();
        (Bytes::from(out), RowFormat::Binary { guard })
    }

    /// A binary insert of route `ri` was refused: its layout is read again
    /// before the next one (its table may have changed).
    pub(crate) fn refused(&self, ri: usize) {
        if let Some(slot) = self.routes.get(ri) {
            let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            if slot.table.is_ok() {
                slot.reread_at = Some(Instant::now());
            }
        }
    }

    /// Something in front of the server refused a binary insert of route
    /// `ri` (a URL too long for it, a rule on the body): the route's
    /// inserts go as JSON for [`UNUSABLE_FOR`] (each refusal costs a fence),
    /// then its layout is read again.
    pub(crate) fn refused_in_front(&self, ri: usize) {
        if let Some(slot) = self.routes.get(ri) {
            let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            if slot.table.is_ok() {
                tracing::warn!(
                    for_secs = UNUSABLE_FOR.as_secs(),
                    "{REFUSED_IN_FRONT}: inserts go as JSONEachRow"
                );
                slot.table = Err(REFUSED_IN_FRONT);
                slot.reread_at = Some(Instant::now() + UNUSABLE_FOR);
            }
        }
    }

    /// Route `ri`'s layout, read again first if due (unless another
    /// writer is reading it).
    async fn layout(
        &self,
        ch: &ClickHouse,
        ri: usize,
        route: &Route,
    ) -> Result<Arc<TableLayout>, &'static str> {
        let Some(slot) = self.routes.get(ri) else {
            return Err("no such route");
        };
        let due = {
            let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
            let due = !s.reading && s.reread_at.is_some_and(|at| Instant::now() >= at);
            s.reading |= due;
            due
        };
        if due {
            let answer = read(ch, route).await;
            let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
            s.answered(route, answer);
        }
        let s = slot.lock().unwrap_or_else(|p| p.into_inner());
        s.table.clone()
    }
}

/// What a read of a route's layout found.
enum Read {
    Usable(Box<TableLayout>),
    /// Rows of this table go as JSON, for this reason.
    Unusable(String),
    Failed(String),
}

async fn read(ch: &ClickHouse, route: &Route) -> Read {
    match tokio::time::timeout(READ_WITHIN, ch.table_layout(route)).await {
        Ok(Ok(Ok(t))) => Read::Usable(Box::new(t)),
        Ok(Ok(Err(why))) => Read::Unusable(why),
        Ok(Err(e)) => Read::Failed(e.to_string()),
        Err(_) => Read::Failed(format!("no answer within {READ_WITHIN:?}")),
    }
}

impl Slot {
    fn answered(&mut self, route: &Route, read: Read) {
        self.reading = false;
        let table = route.table_ref();
        match read {
            Read::Usable(t) => {
                if self.table.is_err() {
                    tracing::info!(%table, "inserts go as RowBinaryWithDefaults");
                }
                self.table = Ok(Arc::from(t));
                self.reread_at = None;
            }
            Read::Unusable(why) => {
                let again = matches!(self.table, Err(UNUSABLE));
                if !again {
                    tracing::info!(%table, reason = %why, "inserts go as JSONEachRow: the binary path cannot encode this table's rows");
                }
                self.table = Err(UNUSABLE);
                self.reread_at = Some(Instant::now() + UNUSABLE_FOR);
            }
            Read::Failed(e) => {
                tracing::warn!(%table, error = %e, "cannot read the table's columns; inserts go as JSONEachRow until they are read");
                self.table = Err("the table's columns could not be read");
                self.reread_at = Some(Instant::now() + AFTER_FAILURE);
            }
        }
    }
}
