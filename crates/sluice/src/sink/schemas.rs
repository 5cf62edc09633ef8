//! The schemas of the routes that read the registry's wire format, on the
//! consumer thread.
//!
//! In: a record value of an `avro` or `protobuf` route. Out
//! ([`Schemas::decode`]): its row, as JSON written by the decoder of the
//! schema its id names (`sluice_formats::avro`, `sluice_formats::protobuf`), or
//! why it cannot be one, or "schema id N is not known here yet".
//!
//! An id not known yet is asked for ([`Schemas::want`]: the state queues a
//! `FetchSchema` action, which the edge runs off the consumer thread as
//! [`fetch_task`]) while the record's partition waits: it is paused and,
//! once the answer is in ([`Schemas::fetched`]), sought back to that
//! record ([`super::state`]). Nothing is skipped and
//! the records of other partitions go on. A registry that does not answer,
//! refuses the credentials or answers strangely is asked again with
//! backoff, for as long as it takes. A 404 for the id is believed once it
//! has lasted [`UNKNOWN_AFTER`] (a registry replica can lag the one the
//! producer registered with); an id the registry does not know, of the
//! other format, or whose schema does not parse refuses its records (the
//! DLQ's `unknown-schema`) for [`REFUSED_FOR`], then it is asked again.

use super::event::Event;
use crate::config::Route;
use crate::registry::{Decoder, Registry, RegistryError};
use crate::retry::Delays;
use sluice_formats::wire::frame;
use sluice_formats::RowError;
use sluice_protocol::Offset;
use std::collections::HashMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long the registry must keep answering 404 for an id before its
/// records are refused.
pub(crate) const UNKNOWN_AFTER: Duration = Duration::from_secs(10);
/// How long an id refused stays refused before the registry is asked again.
pub(crate) const REFUSED_FOR: Duration = Duration::from_secs(60);
/// A row may be at most this many times `max_record_bytes` once decoded,
/// and at most an eighth of the memory bound: decoding stops there.
pub(crate) const MAX_EXPANSION: usize = 16;

/// What a record value decodes to.
#[derive(Debug)]
pub(super) enum Decoded {
    /// Its row is in the output buffer.
    Row,
    /// It cannot become a row.
    Refused(RowError),
    /// Its schema id is not known here yet: the partition waits for it.
    Missing(u32),
}

/// What is known of one schema id.
enum Known {
    Ready(Decoder),
    Fetching,
    Refused { reason: String, until: Instant },
}

/// The known ids of one route.
struct RouteSchemas {
    ids: HashMap<u32, Known>,
}

/// The schemas of every route, indexed like the routes (`None`: a JSON route).
pub(super) struct Schemas {
    routes: Vec<Option<RouteSchemas>>,
    /// The largest record value decoded (`sink.max_record_bytes`).
    max_bytes: usize,
    /// The largest row one may decode to.
    max_row_bytes: usize,
}

impl Schemas {
    /// `max_bytes`: `sink.max_record_bytes`; `buffer`: the batches' share
    /// of `max_buffered_bytes`.
    pub(crate) fn new(routes: &[std::sync::Arc<Route>], max_bytes: usize, buffer: usize) -> Self {
        let routes = routes
            .iter()
            .map(|r| {
                r.format.is_registry().then(|| RouteSchemas {
                    ids: HashMap::new(),
                })
            })
            .collect();
        Self {
            routes,
            max_bytes,
            max_row_bytes: max_bytes
                .saturating_mul(MAX_EXPANSION)
                .min(buffer / 8)
                .max(max_bytes),
        }
    }

    /// Whether route `ri` reads the registry's wire format.
    pub(crate) fn is_registry(&self, ri: usize) -> bool {
        self.routes.get(ri).is_some_and(Option::is_some)
    }

    /// Decodes `value` (a record of route `ri`, a registry route) into
    /// `out`, which it clears first.
    pub(crate) fn decode(
        &mut self,
        ri: usize,
        value: Option<&[u8]>,
        out: &mut Vec<u8>,
        now: Instant,
    ) -> Decoded {
        out.clear();
        let Some(route) = self.routes.get_mut(ri).and_then(Option::as_mut) else {
            return Decoded::Refused(RowError::UnknownSchema(
                "the route does not read the registry's wire format".into(),
            ));
        };
        let Some(value) = value else {
            return Decoded::Refused(RowError::Tombstone);
        };
        if value.len() > self.max_bytes {
            return Decoded::Refused(RowError::TooLarge {
                bytes: value.len(),
                max: self.max_bytes,
            });
        }
        let framed = match frame(value) {
            Ok(f) => f,
            Err(e) => return Decoded::Refused(RowError::NotFramed(e.to_string())),
        };
        let id = framed.schema_id;
        let decoder = match route.ids.get(&id) {
            Some(Known::Ready(d)) => d,
            Some(Known::Refused { reason, until }) if now < *until => {
                return Decoded::Refused(RowError::UnknownSchema(reason.clone()))
            }
            _ => return Decoded::Missing(id),
        };
        let cap = self.max_row_bytes;
        let decoded = match decoder {
            Decoder::Avro(s) => s
                .to_json(framed.payload, out, cap)
                .map_err(|e| e.to_string()),
            Decoder::Protobuf(s) => s
                .to_json(framed.payload, out, cap)
                .map_err(|e| e.to_string()),
        };
        match decoded {
            Ok(()) => Decoded::Row,
            Err(e) => {
                out.clear();
                Decoded::Refused(RowError::Undecodable(format!("schema id {id}: {e}")))
            }
        }
    }

    /// Whether `id` of route `ri` has an answer a waiting partition can go
    /// on with (its decoder, or a refusal): `None` if it is neither known
    /// nor being fetched (a refusal ran out), so it must be fetched again.
    pub(crate) fn settled(&self, ri: usize, id: u32, now: Instant) -> Option<bool> {
        let known = self.routes.get(ri).and_then(Option::as_ref);
        match known.and_then(|r| r.ids.get(&id)) {
            Some(Known::Ready(_)) => Some(true),
            Some(Known::Refused { until, .. }) if now < *until => Some(true),
            Some(Known::Fetching) => Some(false),
            _ => None,
        }
    }

    /// Marks `id` of route `ri` as being fetched: true if the fetch is to
    /// start (an `Action::FetchSchema`), false if one is under way already
    /// or the route reads no registry.
    pub(crate) fn want(&mut self, ri: usize, id: u32) -> bool {
        let Some(route) = self.routes.get_mut(ri).and_then(Option::as_mut) else {
            return false;
        };
        if matches!(route.ids.get(&id), Some(Known::Fetching)) {
            return false;
        }
        route.ids.insert(id, Known::Fetching);
        true
    }

    /// Takes the answer of a [`fetch_task`].
    pub(crate) fn fetched(
        &mut self,
        ri: usize,
        id: u32,
        answer: Result<Decoder, String>,
        now: Instant,
    ) {
        let Some(route) = self.routes.get_mut(ri).and_then(Option::as_mut) else {
            return;
        };
        let known = match answer {
            Ok(d) => Known::Ready(d),
            Err(reason) => {
                // Refusals that ran out are forgotten: made-up ids do not
                // pile up.
                route
                    .ids
                    .retain(|_, k| !matches!(k, Known::Refused { until, .. } if *until <= now));
                Known::Refused {
                    reason,
                    until: now + REFUSED_FOR,
                }
            }
        };
        route.ids.insert(id, known);
    }
}

/// The task behind an `Action::FetchSchema`: the decoder of schema `id`
/// (of `format`) for route `ri`, or why its records cannot be read,
/// reported as an [`Event::Schema`]; nothing if the sink stopped first.
pub(super) async fn fetch_task(
    registry: Option<Registry>,
    ri: usize,
    id: u32,
    format: &'static str,
    tx: mpsc::Sender<Event>,
    stopping: CancellationToken,
) {
    let answer = match registry {
        None => Err("no [schema_registry] is configured".into()),
        Some(registry) => {
            // A panic while building the decoder (in a parser) refuses
            // the id rather than leaving it fetched for ever.
            let fetching =
                tokio::spawn(async move { fetch(&registry, id, format, &stopping).await });
            match fetching.await {
                Ok(Some(answer)) => answer,
                Ok(None) => return,
                Err(e) => Err(format!(
                    "building the decoder of schema id {id} failed: {e}"
                )),
            }
        }
    };
    let _ = tx.send(Event::Schema {
        route: ri,
        id,
        answer,
    });
}

/// Asks the registry for the decoder of `id` until it gives one or says
/// why no record written with it can be read (the reason: `Err`); `None`
/// if the sink stopped first.
async fn fetch(
    registry: &Registry,
    id: u32,
    format: &'static str,
    stopping: &CancellationToken,
) -> Option<Result<Decoder, String>> {
    let started = Instant::now();
    let mut delays = Delays::new(Duration::from_millis(250));
    loop {
        match registry.decoder(id, format).await {
            Ok(d) => {
                tracing::info!(schema_id = id, format, "schema fetched");
                return Some(Ok(d));
            }
            Err(e @ RegistryError::UnknownSchema(_)) if started.elapsed() < UNKNOWN_AFTER => {
                tracing::debug!(schema_id = id, error = %e, "asking again before believing it");
            }
            Err(e) if e.refuses_records() => {
                tracing::warn!(schema_id = id, error = %e, "records written with this schema id go to the DLQ");
                crate::telemetry::schema_fetch_failed(e.kind());
                return Some(Err(e.to_string()));
            }
            Err(e) => {
                tracing::warn!(schema_id = id, error = %e, "cannot fetch the schema; its partition waits");
                crate::telemetry::schema_fetch_failed(e.kind());
            }
        }
        if !delays.wait(stopping).await {
            return None;
        }
    }
}

/// The original values of a batch's rows on a registry route, by offset:
/// a row ClickHouse rejects goes to the DLQ as it came, not as its JSON.
#[derive(Debug, Default, Clone)]
pub(super) struct Originals {
    bytes: Vec<u8>,
    /// Per row: its offset and the end of its bytes.
    rows: Vec<(Offset, usize)>,
}

impl Originals {
    pub(crate) fn push(&mut self, offset: Offset, value: &[u8]) {
        self.bytes.extend_from_slice(value);
        self.rows.push((offset, self.bytes.len()));
    }

    /// The value of the row at `offset`.
    pub(crate) fn get(&self, offset: Offset) -> Option<&[u8]> {
        let i = self.rows.binary_search_by_key(&offset, |r| r.0).ok()?;
        let start = if i == 0 { 0 } else { self.rows[i - 1].1 };
        Some(&self.bytes[start..self.rows[i].1])
    }

    /// The memory it holds.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.len() + self.rows.len() * std::mem::size_of::<(Offset, usize)>()
    }

    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.rows.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn originals_are_found_by_offset() {
        let mut o = Originals::default();
        o.push(Offset(3), b"abc");
        o.push(Offset(7), b"");
        o.push(Offset(9), b"\x00\x01");
        assert_eq!(o.get(Offset(3)), Some(&b"abc"[..]));
        assert_eq!(o.get(Offset(7)), Some(&b""[..]));
        assert_eq!(o.get(Offset(9)), Some(&b"\x00\x01"[..]));
        assert_eq!(o.get(Offset(8)), None);
        o.clear();
        assert_eq!(o.get(Offset(3)), None);
    }
}
