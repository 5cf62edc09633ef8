//! The `[sink]` section: how records become batches and inserts, and how
//! strongly they are delivered.
//!
//! In: the section as written ([`RawSink`], with `[sink.columns]`), the
//! `--delivery` and `--max-batch-rows` flags, and the validated
//! `[clickhouse]` section (its insert timeout sets the default fence; its
//! settings must leave exactly-once's own alone). Out: a [`SinkConfig`]
//! with every default filled in, or a [`ConfigError`] naming the field.

use super::{bounded, invalid, positive, ClickHouseConfig, ConfigError, Overrides};
use serde::{Deserialize, Serialize};
use sluice_formats::MetadataColumns;
use sluice_protocol::timing::{FENCE_MARGIN, MAX_LEASE};
use sluice_protocol::BatchLimits;
use std::time::Duration;

/// Rows per insert when the file does not say.
pub(crate) const DEFAULT_MAX_BATCH_ROWS: usize = 100_000;
/// Bytes per insert when the file does not say.
pub(crate) const DEFAULT_MAX_BATCH_BYTES: usize = 16 << 20;
/// The most `max_batch_bytes` may be.
pub(crate) const MAX_BATCH_BYTES: usize = 1 << 30;
/// How long a row may wait for its batch when the file does not say.
pub(crate) const DEFAULT_MAX_BATCH_AGE: Duration = Duration::from_secs(1);
/// The memory bound when the file does not say.
pub(crate) const DEFAULT_MAX_BUFFERED_BYTES: usize = 256 << 20;
/// Inserts at once when the file does not say.
pub(crate) const DEFAULT_MAX_CONCURRENT_INSERTS: usize = 4;
/// How often positions are committed when the file does not say.
pub(crate) const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_secs(1);
/// How often the progress line is logged when the file does not say.
pub(crate) const DEFAULT_PROGRESS_INTERVAL: Duration = Duration::from_secs(10);

/// Insert settings exactly-once relies on: a bound on a running insert,
/// one part per insert, one parsing stream, synchronous inserts, a bound on
/// a quorum insert.
const PROTOCOL_SETTINGS: &[&str] = &[
    "max_execution_time",
    "timeout_overflow_mode",
    "max_insert_threads",
    "async_insert",
    "insert_quorum_timeout",
    "max_insert_block_size",
    "min_insert_block_size_rows",
    "input_format_parallel_parsing",
];

/// Insert settings that make ClickHouse skip rows it cannot parse and still
/// answer 200: sluice would count those records stored and commit past them.
const ROW_SKIPPING_SETTINGS: &[&str] = &[
    "input_format_allow_errors_num",
    "input_format_allow_errors_ratio",
];

/// How strongly records are delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Delivery {
    /// Resume from ClickHouse, reconcile unknown outcomes, fence on rebalance.
    #[default]
    ExactlyOnce,
    /// Commit after insert and re-send blindly on failure (today's pipelines).
    AtLeastOnce,
    /// Deterministic batch boundaries and an `insert_deduplication_token` on
    /// every insert, nothing else: the design of sinks that rely on
    /// ClickHouse's dedup window. A baseline for `sluice lab`.
    TokenOnly,
}

impl Delivery {
    /// Whether the sink resumes from ClickHouse, reconciles and fences.
    pub(crate) fn is_exactly_once(self) -> bool {
        self == Delivery::ExactlyOnce
    }

    /// Whether every insert carries a deterministic dedup token.
    pub fn sends_tokens(self) -> bool {
        self != Delivery::AtLeastOnce
    }
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawSink {
    /// `exactly-once` (default), `at-least-once` or `token-only`.
    pub delivery: Option<Delivery>,
    /// Rows per insert, at most. Default 100000.
    pub max_batch_rows: Option<usize>,
    /// Bytes per insert, at most (approximately). Default 16 MiB.
    pub max_batch_bytes: Option<usize>,
    /// How long a row may wait for its batch to fill. Default 1s.
    #[serde(default, with = "humantime_serde")]
    pub max_batch_age: Option<Duration>,
    /// Bytes buffered in batches being built or sent; over it, fetching
    /// pauses. Default 256 MiB.
    pub max_buffered_bytes: Option<usize>,
    /// Inserts running at once. Default 4.
    pub(crate) max_concurrent_inserts: Option<usize>,
    /// How often durable positions are committed to Kafka. Default 1s.
    #[serde(default, with = "humantime_serde")]
    pub commit_interval: Option<Duration>,
    /// How long a new owner waits before reading ClickHouse when the previous
    /// owner did not hand the partition over cleanly: the previous owner's
    /// last attempt may start up to an insert timeout after the group let it
    /// go and run for another, after a lease of up to 10 s. Default:
    /// 2 × insert timeout + 10s (the longest lease) + 5s.
    #[serde(default, with = "humantime_serde")]
    pub fence_wait: Option<Duration>,
    /// A record value larger than this cannot become a row (it goes to the
    /// DLQ). Default: `max_batch_bytes`.
    pub max_record_bytes: Option<usize>,
    /// How often a one-line progress summary is logged; `0s`: never.
    /// Default 10s.
    #[serde(default, with = "humantime_serde")]
    pub(crate) progress_interval: Option<Duration>,
    /// Names of the metadata columns.
    #[serde(default)]
    pub(crate) columns: RawColumns,
}

#[serde_with::skip_serializing_none]
#[derive(Debug, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawColumns {
    /// Column for the source topic. Default `_topic`.
    pub(crate) topic: Option<String>,
    /// Column for the source partition. Default `_partition`.
    pub(crate) partition: Option<String>,
    /// Column for the source offset. Default `_offset`.
    pub(crate) offset: Option<String>,
}

#[derive(Debug, Clone)]
pub struct SinkConfig {
    pub delivery: Delivery,
    pub limits: BatchLimits,
    pub(crate) max_buffered_bytes: usize,
    pub max_concurrent_inserts: usize,
    pub(crate) commit_interval: Duration,
    pub fence_wait: Duration,
    pub(crate) max_record_bytes: usize,
    /// How often the progress line is logged, if at all.
    pub(crate) progress_interval: Option<Duration>,
    pub columns: MetadataColumns,
}

impl SinkConfig {
    /// The part of `max_buffered_bytes` for librdkafka's prefetch queue: a
    /// quarter (1 MiB to 64 MiB).
    pub(crate) fn kafka_buffer_bytes(&self) -> usize {
        (self.max_buffered_bytes / 4).clamp(1 << 20, 64 << 20)
    }

    /// The part of `max_buffered_bytes` for batches being built or inserted.
    pub(crate) fn batch_buffer_bytes(&self) -> usize {
        self.max_buffered_bytes - self.kafka_buffer_bytes().min(self.max_buffered_bytes / 2)
    }
}

impl RawSink {
    /// The section with `o`'s flags applied and defaults filled in.
    pub(crate) fn validate(
        self,
        o: &Overrides,
        clickhouse: &ClickHouseConfig,
    ) -> Result<SinkConfig, ConfigError> {
        let s = self;
        let delivery = o.delivery.or(s.delivery).unwrap_or_default();
        let limits = BatchLimits {
            max_rows: positive(
                "sink.max_batch_rows",
                o.max_batch_rows.or(s.max_batch_rows),
                DEFAULT_MAX_BATCH_ROWS,
            )?,
            max_bytes: positive(
                "sink.max_batch_bytes",
                s.max_batch_bytes,
                DEFAULT_MAX_BATCH_BYTES,
            )?,
            max_age: bounded("sink.max_batch_age", s.max_batch_age)?
                .unwrap_or(DEFAULT_MAX_BATCH_AGE),
            aligned: delivery == Delivery::TokenOnly,
        };
        if let Some(name) = ROW_SKIPPING_SETTINGS
            .iter()
            .find(|n| clickhouse.settings.contains_key(**n))
        {
            return Err(invalid(
                &format!("clickhouse.settings.{name}"),
                "not set: ClickHouse would drop rows it cannot parse and sluice would commit past them \
                 (records that cannot become rows go to the DLQ, see [dlq])",
                &clickhouse.settings[*name],
            ));
        }
        if delivery.is_exactly_once() {
            if let Some(name) = PROTOCOL_SETTINGS
                .iter()
                .find(|n| clickhouse.settings.contains_key(**n))
            {
                return Err(invalid(
                    &format!("clickhouse.settings.{name}"),
                    "not set: exactly-once sets it (its bounds come from clickhouse.insert_timeout)",
                    &clickhouse.settings[*name],
                ));
            }
        }
        if limits.max_bytes > MAX_BATCH_BYTES {
            return Err(invalid(
                "sink.max_batch_bytes",
                "at most 1 GiB",
                &limits.max_bytes.to_string(),
            ));
        }
        let max_buffered_bytes = positive(
            "sink.max_buffered_bytes",
            s.max_buffered_bytes,
            DEFAULT_MAX_BUFFERED_BYTES,
        )?;
        if max_buffered_bytes < 2 * limits.max_bytes {
            return Err(ConfigError::BufferTooSmall {
                buffered: max_buffered_bytes,
                batch: limits.max_bytes,
            });
        }
        let columns = s.columns.validate()?;
        let max_record_bytes = positive(
            "sink.max_record_bytes",
            s.max_record_bytes,
            limits.max_bytes,
        )?;
        if max_record_bytes > limits.max_bytes {
            return Err(invalid(
                "sink.max_record_bytes",
                "at most sink.max_batch_bytes",
                &max_record_bytes.to_string(),
            ));
        }
        let insert_timeout = clickhouse.insert_timeout;
        Ok(SinkConfig {
            delivery,
            limits,
            max_buffered_bytes,
            max_concurrent_inserts: positive(
                "sink.max_concurrent_inserts",
                s.max_concurrent_inserts,
                DEFAULT_MAX_CONCURRENT_INSERTS,
            )?,
            commit_interval: bounded("sink.commit_interval", s.commit_interval)?
                .unwrap_or(DEFAULT_COMMIT_INTERVAL),
            fence_wait: bounded("sink.fence_wait", s.fence_wait)?
                .unwrap_or(insert_timeout * 2 + MAX_LEASE + FENCE_MARGIN),
            max_record_bytes,
            progress_interval: Some(
                bounded("sink.progress_interval", s.progress_interval)?
                    .unwrap_or(DEFAULT_PROGRESS_INTERVAL),
            )
            .filter(|d| !d.is_zero()),
            columns,
        })
    }
}

impl RawColumns {
    /// The names, defaults filled in: distinct and non-empty.
    pub(super) fn validate(self) -> Result<MetadataColumns, ConfigError> {
        let d = MetadataColumns::default();
        let c = MetadataColumns {
            topic: self.topic.unwrap_or(d.topic),
            partition: self.partition.unwrap_or(d.partition),
            offset: self.offset.unwrap_or(d.offset),
        };
        let names = [&c.topic, &c.partition, &c.offset];
        if names.iter().any(|n| n.is_empty())
            || c.topic == c.partition
            || c.topic == c.offset
            || c.partition == c.offset
        {
            return Err(ConfigError::Columns);
        }
        Ok(c)
    }
}
