//! The columns of the tables of the routes that refuse records with a
//! field their table lacks (`extra_fields = "dlq"`), on the consumer thread.
//!
//! In: a record's row text (its JSON, or the registry decoder's). Out
//! ([`TableColumns::extra_field`]): the first top-level field the table has
//! no column for, if any; the record then goes to the DLQ as an
//! `extra-field`. The columns are read when the sink starts, and read again
//! before a record is refused, at most once per [`REREAD_AFTER`] per route:
//! a column added that long before the record is read is seen. If that
//! read fails, the columns last read decide.

use crate::ch::ClickHouse;
use crate::config::Route;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// How old the columns may be before a record is refused on their word.
pub const REREAD_AFTER: Duration = Duration::from_secs(1);

/// The known columns of each route's table (`None`: the route ignores
/// extra fields).
pub(super) struct TableColumns {
    ch: ClickHouse,
    routes: Vec<Option<Known>>,
}

struct Known {
    route: Arc<Route>,
    names: HashSet<String>,
    read_at: Instant,
}

impl TableColumns {
    /// Reads the columns of the tables of the routes that need them.
    pub async fn read(ch: ClickHouse, routes: &[Arc<Route>]) -> Result<Self, crate::ch::ChError> {
        let mut known = Vec::with_capacity(routes.len());
        for route in routes {
            known.push(match route.extra_to_dlq {
                false => None,
                true => Some(Known {
                    route: route.clone(),
                    names: ch.columns_of(route).await?.into_iter().collect(),
                    read_at: Instant::now(),
                }),
            });
        }
        Ok(Self { ch, routes: known })
    }

    /// The first top-level field of `row` that route `ri`'s table has no
    /// column for, once the columns are fresh (see the module's header).
    pub fn extra_field(&mut self, ri: usize, row: &[u8], handle: &Handle) -> Option<String> {
        let known = self.routes.get_mut(ri)?.as_mut()?;
        let extra = sluice_core::row::extra_field(row, &known.names)?;
        if known.read_at.elapsed() < REREAD_AFTER {
            return Some(extra);
        }
        known.read_at = Instant::now();
        match handle.block_on(self.ch.columns_of(&known.route)) {
            Ok(names) if !names.is_empty() => known.names = names.into_iter().collect(),
            Ok(_) => {
                tracing::warn!(table = %known.route.table_ref(), "the table has no columns now; keeping the ones last read")
            }
            Err(e) => {
                tracing::warn!(table = %known.route.table_ref(), error = %e, "cannot read the table's columns again; the ones last read decide")
            }
        }
        sluice_core::row::extra_field(row, &known.names)
    }
}
