//! The columns of the tables of the routes that refuse records with a
//! field their table lacks (`extra_fields = "dlq"`), on the consumer thread.
//!
//! In: a record's row text (its JSON, or the registry decoder's). Out
//! ([`TableColumns::extra_field`]): the first top-level field the table has
//! no column for, if any; the record then goes to the DLQ as an
//! `extra-field`. The columns are read when the sink starts, and read again
//! before a record is refused, at most once per [`REREAD_AFTER`] per route
//! (a column added that long before the record is read is seen). The
//! state does not read them itself: the answer [`Fields::Reread`] makes it
//! hold the record's partition back (paused, sought back to the record
//! once the columns are in) and queue a `RereadColumns` action, which the
//! edge runs off the consumer thread as [`reread`], within [`READ_WITHIN`];
//! the answer comes back to [`TableColumns::answered`]. After a failed read
//! the columns last read decide for [`AFTER_FAILURE`].
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

/// How old the columns may be before a record is refused on their word.
pub(crate) const REREAD_AFTER: Duration = Duration::from_secs(1);
/// How long a read of the columns may hold a record's partition back.
pub(crate) const READ_WITHIN: Duration = Duration::from_secs(2);
/// How long the columns last read decide after a read failed.
pub(crate) const AFTER_FAILURE: Duration = Duration::from_secs(10);

/// What the columns say of a record's fields.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Fields {
    /// The table has a column for each (or the route ignores extra fields).
    Fit,
    /// The table has no column for this one.
    Extra(String),
    /// The columns must be read again before the record is judged.
    Reread,
}

/// The known columns of each route's table (`None`: the route ignores
/// extra fields).
pub(super) struct TableColumns {
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
    /// Marked stale while a read was under way: that read may have been
    /// answered before the refusal, and does not clear it.
    stale_while_reading: bool,
    /// A read is under way (asked for by [`TableColumns::want`]).
    reading: bool,
}

impl TableColumns {
    /// Reads the columns of the tables of the routes that need them.
    pub(crate) async fn read(
        ch: &ClickHouse,
        routes: &[Arc<Route>],
    ) -> Result<Self, crate::ch::ChError> {
        let mut names = Vec::with_capacity(routes.len());
        for route in routes {
            names.push(match route.extra_to_dlq {
                false => None,
                true => Some(ch.insertable_columns(route).await?),
            });
        }
        Ok(Self::new(routes, names))
    }

    /// The columns `names` of each route's table, just read (`None`: the
    /// route ignores extra fields).
    pub(crate) fn new(routes: &[Arc<Route>], names: Vec<Option<Vec<String>>>) -> Self {
        let routes = routes
            .iter()
            .zip(names)
            .map(|(route, names)| {
                Some(Known {
                    route: route.clone(),
                    names: names?.into_iter().collect(),
                    reread_at: Instant::now() + REREAD_AFTER,
                    stale: false,
                    stale_while_reading: false,
                    reading: false,
                })
            })
            .collect();
        Self { routes }
    }

    /// Marks route `ri`'s columns out of date: ClickHouse refused a field
    /// they hold (a column dropped since they were read).
    pub(crate) fn stale(&mut self, ri: usize) {
        if let Some(Some(known)) = self.routes.get_mut(ri) {
            known.stale = true;
            known.stale_while_reading |= known.reading;
        }
    }

    /// What route `ri`'s columns say of `row`'s top-level fields at `now`
    /// (see the module's header). `may_reread`: false when the columns
    /// were read again for this very record already: they decide.
    pub(crate) fn extra_field(
        &self,
        ri: usize,
        row: &[u8],
        now: Instant,
        may_reread: bool,
    ) -> Fields {
        let Some(Some(known)) = self.routes.get(ri) else {
            return Fields::Fit;
        };
        let due = may_reread && now >= known.reread_at;
        if known.stale && due {
            return Fields::Reread;
        }
        match sluice_formats::row::extra_field(row, &known.names) {
            None => Fields::Fit,
            Some(_) if due => Fields::Reread,
            Some(extra) => Fields::Extra(extra),
        }
    }

    /// Marks route `ri`'s columns as being read again: true if the read is
    /// to start (a `RereadColumns` action), false if one is under way.
    pub(crate) fn want(&mut self, ri: usize) -> bool {
        let Some(Some(known)) = self.routes.get_mut(ri) else {
            return false;
        };
        !std::mem::replace(&mut known.reading, true)
    }

    /// Whether a read of route `ri`'s columns is under way.
    pub(crate) fn reading(&self, ri: usize) -> bool {
        matches!(self.routes.get(ri), Some(Some(k)) if k.reading)
    }

    /// Takes the answer of a [`reread`] of route `ri`'s columns, at `now`;
    /// on failure the ones last read stay, for [`AFTER_FAILURE`].
    pub(crate) fn answered(
        &mut self,
        ri: usize,
        answer: Result<Vec<String>, String>,
        now: Instant,
    ) {
        let Some(Some(known)) = self.routes.get_mut(ri) else {
            return;
        };
        known.reading = false;
        let stale_again = std::mem::take(&mut known.stale_while_reading);
        let failed = match answer {
            Ok(names) if !names.is_empty() => {
                known.names = names.into_iter().collect();
                known.stale = stale_again;
                None
            }
            Ok(_) => Some("the table has no columns now".to_string()),
            Err(e) => Some(e),
        };
        known.reread_at = match failed {
            None => now + REREAD_AFTER,
            Some(e) => {
                let table = known.route.table_ref();
                tracing::warn!(%table, error = %e, "cannot read the table's columns again; the ones last read decide for {AFTER_FAILURE:?}");
                now + AFTER_FAILURE
            }
        };
    }
}

/// The task behind a `RereadColumns` action: `route`'s columns, read again
/// within [`READ_WITHIN`], or why they could not be.
pub(super) async fn reread(ch: &ClickHouse, route: &Route) -> Result<Vec<String>, String> {
    match tokio::time::timeout(READ_WITHIN, ch.insertable_columns(route)).await {
        Ok(Ok(names)) => Ok(names),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {READ_WITHIN:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Overrides, RawConfig};

    fn columns() -> TableColumns {
        let text = r#"
            [kafka]
            brokers = "127.0.0.1:9"
            group_id = "g"
            [clickhouse]
            url = "http://127.0.0.1:9"
            [[route]]
            topic = "orders"
            table = "shop.orders"
            extra_fields = "dlq"
        "#;
        let cfg = RawConfig::from_toml(text)
            .and_then(|raw| raw.validate(Overrides::default()))
            .expect("the test's config loads");
        let routes: Vec<Arc<Route>> = cfg.routes.into_iter().map(Arc::new).collect();
        TableColumns::new(&routes, vec![Some(vec!["id".into()])])
    }

    #[test]
    fn a_refusal_while_a_read_is_under_way_outlives_its_answer() {
        let mut c = columns();
        let fits = br#"{"id":1}"#;
        let due = |n: u32| Instant::now() + REREAD_AFTER * n;
        // Refused before the read: the read's answer clears it.
        c.stale(0);
        assert_eq!(c.extra_field(0, fits, due(1), true), Fields::Reread);
        assert!(c.want(0));
        c.answered(0, Ok(vec!["id".into()]), Instant::now());
        assert_eq!(c.extra_field(0, fits, due(2), true), Fields::Fit);
        // Refused while the read is out: it may have been answered before
        // the refusal, and the next record asks again.
        assert!(c.want(0));
        assert!(!c.want(0), "one read at a time");
        c.stale(0);
        c.answered(0, Ok(vec!["id".into()]), Instant::now());
        assert_eq!(c.extra_field(0, fits, due(2), true), Fields::Reread);
    }
}
