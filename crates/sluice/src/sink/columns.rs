//! The columns of the tables of the routes that refuse records with a
//! field their table lacks (`extra_fields = "dlq"`), on the consumer thread.
//!
//! In: a record's row text (its JSON, or the registry decoder's). Out
//! ([`TableColumns::extra_field`]): the first top-level field the table has
//! no column for, if any; the record then goes to the DLQ as an
//! `extra-field`. The columns are read when the sink starts, and read again
//! before a record is refused, at most once per [`REREAD_AFTER`] per route
//! (a column added that long before the record is read is seen), within
//! [`READ_WITHIN`] so that a server that does not answer holds the consumer
//! thread only that long; after a failed read the columns last read decide
//! for [`AFTER_FAILURE`].
//!
//! This check is early, not final: the route's inserts do not skip unknown
//! fields ([`crate::config::Format::insert_settings`]), so a field the
//! cache took for a column (one dropped since, or one that cannot be
//! inserted) makes ClickHouse refuse the row, which goes to the DLQ under
//! the same kind, with every row of its batch that has the field; the
//! writer then marks the columns [`TableColumns::stale`], and they are read
//! again at the next record. Refusing here spares the inserts: ClickHouse
//! names one refused row per attempt.

use crate::ch::ClickHouse;
use crate::config::Route;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// How old the columns may be before a record is refused on their word.
pub(crate) const REREAD_AFTER: Duration = Duration::from_secs(1);
/// How long a read of the columns may hold the consumer thread.
pub(crate) const READ_WITHIN: Duration = Duration::from_secs(2);
/// How long the columns last read decide after a read failed.
pub(crate) const AFTER_FAILURE: Duration = Duration::from_secs(10);

/// The known columns of each route's table (`None`: the route ignores
/// extra fields).
pub(super) struct TableColumns {
    ch: ClickHouse,
    routes: Vec<Option<Known>>,
}

struct Known {
    route: Arc<Route>,
    names: HashSet<String>,
    /// When the columns may be read again.
    reread_at: Instant,
    /// ClickHouse refused a field these columns hold: read them again at
    /// the next record, extra-looking or not.
    stale: bool,
}

impl TableColumns {
    /// Reads the columns of the tables of the routes that need them.
    pub(crate) async fn read(
        ch: ClickHouse,
        routes: &[Arc<Route>],
    ) -> Result<Self, crate::ch::ChError> {
        let mut known = Vec::with_capacity(routes.len());
        for route in routes {
            known.push(match route.extra_to_dlq {
                false => None,
                true => Some(Known {
                    route: route.clone(),
                    names: ch.insertable_columns(route).await?.into_iter().collect(),
                    reread_at: Instant::now() + REREAD_AFTER,
                    stale: false,
                }),
            });
        }
        Ok(Self { ch, routes: known })
    }

    /// Marks route `ri`'s columns out of date: ClickHouse refused a field
    /// they hold (a column dropped since they were read).
    pub(crate) fn stale(&mut self, ri: usize) {
        if let Some(Some(known)) = self.routes.get_mut(ri) {
            known.stale = true;
        }
    }

    /// The first top-level field of `row` that route `ri`'s table has no
    /// column for, once the columns are fresh (see the module's header).
    pub(crate) fn extra_field(&mut self, ri: usize, row: &[u8], handle: &Handle) -> Option<String> {
        let ch = &self.ch;
        let known = self.routes.get_mut(ri)?.as_mut()?;
        let now = Instant::now();
        if known.stale && now >= known.reread_at {
            known.read(ch, handle, now);
        }
        let extra = sluice_formats::row::extra_field(row, &known.names)?;
        if now < known.reread_at {
            return Some(extra);
        }
        known.read(ch, handle, now);
        sluice_formats::row::extra_field(row, &known.names)
    }
}

impl Known {
    /// Reads the columns again, within [`READ_WITHIN`]; on failure the ones
    /// last read stay, for [`AFTER_FAILURE`].
    fn read(&mut self, ch: &ClickHouse, handle: &Handle, now: Instant) {
        // The timer is made inside the runtime: the consumer thread is not.
        let route = &self.route;
        let read = handle.block_on(async {
            tokio::time::timeout(READ_WITHIN, ch.insertable_columns(route)).await
        });
        let failed = match read {
            Ok(Ok(names)) if !names.is_empty() => {
                self.names = names.into_iter().collect();
                self.stale = false;
                None
            }
            Ok(Ok(_)) => Some("the table has no columns now".to_string()),
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {READ_WITHIN:?}")),
        };
        self.reread_at = match failed {
            None => now + REREAD_AFTER,
            Some(e) => {
                let table = self.route.table_ref();
                tracing::warn!(%table, error = %e, "cannot read the table's columns again; the ones last read decide for {AFTER_FAILURE:?}");
                now + AFTER_FAILURE
            }
        };
    }
}
