//! One record's way into its partition's batch, decided without I/O.
//!
//! In: a [`Record`] read from Kafka and its partition as the sink holds it
//! ([`Part`]: the protocol's [`Partition`](sluice_protocol::partition::Partition)
//! and the sink's [`super::Side`]). The partition's position says whether
//! the client delivered it a second time ([`admit`]); on a registry route its value was decoded first
//! ([`Value`], [`super::super::schemas`]); the encoder turns it into a row
//! of the batch being built; on a
//! dedup route, the key window says whether the row is written, dropped,
//! or written on condition that an in-flight copy of its key is not
//! stored; a record that cannot become a row is queued for the DLQ (or
//! stops the sink, without one). Out: its [`Fate`], which the sink counts
//! ([`super::Sink::note`]).

use super::{Letter, Part};
use sluice_formats::{RowEncoder, RowError};
use sluice_protocol::partition::{Admit, Keyed};
use sluice_protocol::{NextOffset, Offset};
use std::fmt;
use std::time::Instant;

/// A record as read from Kafka, borrowed from the client's message
/// ([`crate::sink::edge::record_of`]).
pub(crate) struct Record<'a> {
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) offset: Offset,
    pub(crate) timestamp: Option<i64>,
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) payload: Option<&'a [u8]>,
}

impl fmt::Display for Record<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]@{}", self.topic, self.partition, self.offset.0)
    }
}

/// A record's value as its route reads it.
#[derive(Debug)]
pub(super) enum Value<'a> {
    /// A JSON route: the record's own value.
    Json,
    /// A registry route: the row its schema's decoder wrote. The record's
    /// value is kept beside the batch, for the DLQ.
    Decoded(&'a [u8]),
    /// A registry route: the value does not decode.
    Refused(RowError),
}

/// What became of one record.
#[derive(Debug)]
pub(super) enum Fate {
    /// Its partition is not active here: fetched before a pause took hold;
    /// it is read again after the seek.
    Ignored,
    /// The client delivered it a second time: offsets only move forward
    /// within one activation, and taking it again would insert it twice.
    Redelivered { expected: Option<NextOffset> },
    /// A row of the batch being built; `keyless`: on a dedup route, without
    /// a usable key (kept).
    Row { keyless: bool },
    /// Its key was written within the dedup window.
    Dropped,
    /// It cannot become a row; `queued` for the DLQ when there is one.
    Refused { error: RowError, queued: bool },
}

/// Whether `rec` is for `part`'s batch: `Some` (ignored or delivered
/// twice) if not. A partition waiting for a schema ignores what was
/// fetched before its pause took hold: it is read again.
pub(super) fn admit(part: &Part, rec: &Record) -> Option<Fate> {
    match part.core.admit(rec.offset, part.extra.stalled.is_some()) {
        Admit::Take => None,
        Admit::Ignore => Some(Fate::Ignored),
        Admit::Redelivered { expected } => Some(Fate::Redelivered { expected }),
    }
}

/// Takes `rec`, whose value its route reads as `value`, into `part`'s
/// batch being built; `dlq`: whether records that cannot become rows go
/// to a DLQ.
pub(super) fn take(
    part: &mut Part,
    encoder: &RowEncoder,
    rec: &Record,
    value: Value,
    dlq: bool,
    now: Instant,
) -> Fate {
    if let Some(fate) = admit(part, rec) {
        return fate;
    }
    let offset = rec.offset;
    part.core.read(offset);
    let partition = rec.partition;
    let (payload, original) = match value {
        Value::Json => (Ok(rec.payload), None),
        Value::Decoded(row) => (Ok(Some(row)), rec.payload),
        Value::Refused(e) => (Err(e), None),
    };
    let mut keyless = false;
    let pushed = match payload {
        Err(e) => Err(e),
        Ok(payload) => push(part, encoder, rec, payload, now, &mut keyless),
    };
    match pushed {
        Ok(true) => {
            if let Some(v) = original {
                part.extra.originals.push(offset, v);
            }
            Fate::Row { keyless }
        }
        Ok(false) => Fate::Dropped,
        Err(error) if !dlq => Fate::Refused {
            error,
            queued: false,
        },
        Err(error) => {
            part.core.skip(offset, now);
            let letter = Letter {
                topic: rec.topic.to_string(),
                partition,
                offset: offset.0,
                timestamp: rec.timestamp,
                key: rec.key.map(<[u8]>::to_vec),
                value: rec.payload.map(<[u8]>::to_vec),
                kind: error.kind(),
                reason: error.to_string(),
            };
            part.extra.letter_bytes += letter.bytes();
            part.extra.letters.push(letter);
            Fate::Refused {
                error,
                queued: true,
            }
        }
    }
}

/// Encodes `payload` (the row's JSON) into the batch being built, or
/// decides on a dedup route that it is dropped (`Ok(false)`).
fn push(
    part: &mut Part,
    encoder: &RowEncoder,
    rec: &Record,
    payload: Option<&[u8]>,
    now: Instant,
    keyless: &mut bool,
) -> Result<bool, RowError> {
    let (offset, partition) = (rec.offset, rec.partition);
    if !part.core.keyed() {
        return part
            .core
            .push(offset, now, |buf| {
                encoder.encode(payload, partition, offset.0, buf)
            })
            .map(|_| true);
    }
    let keyed = part.core.push_keyed(offset, rec.timestamp, now, |buf| {
        encoder.encode_keyed(payload, partition, offset.0, buf)
    })?;
    Ok(match keyed {
        Keyed::Row { keyless: k } => {
            *keyless = k;
            true
        }
        Keyed::Dropped => false,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{building, Side};
    use super::*;
    use sluice_formats::MetadataColumns;
    use sluice_protocol::dedup::KeyWindow;
    use sluice_protocol::partition::{Partition, Phase};
    use sluice_protocol::{BatchLimits, PartitionId};
    use std::time::Duration;

    fn part(phase: Phase) -> Part {
        let id = PartitionId {
            topic: "t".into(),
            partition: 0,
        };
        let limits = BatchLimits {
            max_rows: 1000,
            max_bytes: 1 << 20,
            max_age: Duration::from_secs(60),
            aligned: false,
        };
        Part {
            core: Partition::new(id, limits, 1, phase),
            since: None,
            extra: Side::new(phase),
        }
    }

    fn rec(offset: i64, payload: &[u8]) -> Record<'_> {
        Record {
            topic: "t",
            partition: 0,
            offset: Offset(offset),
            timestamp: Some(1_000),
            key: None,
            payload: Some(payload),
        }
    }

    fn encoder() -> RowEncoder {
        RowEncoder::new("t", MetadataColumns::default())
    }

    #[test]
    fn a_preparing_partition_takes_nothing() {
        let mut p = part(Phase::Preparing);
        let fate = take(
            &mut p,
            &encoder(),
            &rec(5, br#"{"a":1}"#),
            Value::Json,
            false,
            Instant::now(),
        );
        assert!(matches!(fate, Fate::Ignored));
        assert!(p.core.frontier().is_none() && !building(&p));
    }

    #[test]
    fn a_record_at_or_below_the_position_is_a_redelivery() {
        let (mut p, e, now) = (part(Phase::Active), encoder(), Instant::now());
        assert!(matches!(
            take(&mut p, &e, &rec(5, br#"{"a":1}"#), Value::Json, false, now),
            Fate::Row { keyless: false }
        ));
        for offset in [5, 4] {
            let fate = take(
                &mut p,
                &e,
                &rec(offset, br#"{"a":1}"#),
                Value::Json,
                false,
                now,
            );
            assert!(
                matches!(
                    fate,
                    Fate::Redelivered {
                        expected: Some(NextOffset(6))
                    }
                ),
                "{fate:?}"
            );
        }
        assert!(matches!(
            take(&mut p, &e, &rec(9, br#"{"a":1}"#), Value::Json, false, now),
            Fate::Row { .. }
        ));
        let batch = p.core.cut().expect("a batch").batch;
        let offsets: Vec<Offset> = batch.rows().map(|r| r.offset).collect();
        assert_eq!(offsets, [Offset(5), Offset(9)]);
    }

    #[test]
    fn a_record_that_cannot_be_a_row_stops_the_sink_or_goes_to_the_dlq() {
        let (e, now) = (encoder(), Instant::now());
        let mut p = part(Phase::Active);
        let fate = take(&mut p, &e, &rec(3, b"not json"), Value::Json, false, now);
        assert!(
            matches!(fate, Fate::Refused { queued: false, .. }),
            "{fate:?}"
        );
        assert!(p.extra.letters.is_empty());

        let mut p = part(Phase::Active);
        let fate = take(&mut p, &e, &rec(3, b"not json"), Value::Json, true, now);
        assert!(
            matches!(fate, Fate::Refused { queued: true, .. }),
            "{fate:?}"
        );
        assert_eq!(p.extra.letters.len(), 1);
        assert_eq!(p.extra.letters[0].offset, 3);
        assert_eq!(p.extra.letters[0].value.as_deref(), Some(&b"not json"[..]));
        assert!(p.extra.letter_bytes > 0);
        // The batch accounts for the skipped offset: its end passes it.
        let batch = p
            .core
            .cut()
            .expect("the skipped offset is accounted for")
            .batch;
        assert_eq!(batch.end_of(0), Some(NextOffset(4)));
        assert!(batch.is_empty());
    }

    #[test]
    fn a_second_copy_of_a_key_in_flight_is_written_on_condition() {
        let (now, e) = (Instant::now(), encoder().with_key(vec!["id".into()]));
        let mut p = part(Phase::Preparing);
        let window = KeyWindow::new(Duration::from_secs(60), 100);
        p.core.activate(NextOffset(1), None, Some(window));
        let first = take(&mut p, &e, &rec(1, br#"{"id":7}"#), Value::Json, false, now);
        let second = take(&mut p, &e, &rec(2, br#"{"id":7}"#), Value::Json, false, now);
        let keyless = take(
            &mut p,
            &e,
            &rec(3, br#"{"other":1}"#),
            Value::Json,
            false,
            now,
        );
        assert!(matches!(first, Fate::Row { keyless: false }));
        assert!(matches!(second, Fate::Row { keyless: false }));
        assert!(matches!(keyless, Fate::Row { keyless: true }));
        let cut = p.core.cut().expect("a batch");
        assert_eq!(cut.conditional, [(Offset(2), Offset(1))]);
    }
}
