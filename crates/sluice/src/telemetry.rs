//! The sink's metrics: every series defined and described in one place.
//!
//! In: events from the consumer thread and the insert tasks (a record read,
//! a batch inserted, a retry, a reconciliation, a dedup drop, …). Out:
//! Prometheus series, rendered by [`Metrics::render`] for `/metrics`. The
//! names follow `sluice_<noun>_<unit>_total`. Log lines for the same events
//! stay beside the code that emits them; these functions only count.
//!
//! Without [`Metrics::install`] (tests, `sluice lab`) the counters are
//! no-ops.

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::time::Duration;

/// The metrics recorder could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot install the metrics recorder")]
pub(crate) struct MetricsError(#[source] metrics_exporter_prometheus::BuildError);

/// The installed recorder.
#[derive(Clone)]
pub(crate) struct Metrics {
    handle: PrometheusHandle,
}

impl Metrics {
    /// Installs the process-wide recorder. Fails if one is installed.
    pub(crate) fn install() -> Result<Self, MetricsError> {
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(INSERT_SECONDS.into()),
                &[
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                ],
            )
            .map_err(MetricsError)?
            .install_recorder()
            .map_err(MetricsError)?;
        describe();
        Ok(Self { handle })
    }

    /// The Prometheus text exposition of every series.
    pub(crate) fn render(&self) -> String {
        self.handle.render()
    }
}

const INSERT_SECONDS: &str = "sluice_insert_duration_seconds";

fn describe() {
    describe_counter!("sluice_records_total", "Records read from Kafka, by topic.");
    describe_counter!(
        "sluice_record_bytes_total",
        "Bytes of record values read, by topic."
    );
    describe_counter!(
        "sluice_batches_total",
        "Batches made durable in ClickHouse, by table."
    );
    describe_counter!(
        "sluice_rows_inserted_total",
        "Rows inserted into ClickHouse, by table."
    );
    describe_histogram!(
        INSERT_SECONDS,
        "Duration of successful insert attempts, by table."
    );
    describe_counter!(
        "sluice_insert_retries_total",
        "Insert attempts that failed and will be retried, by table and error kind."
    );
    describe_counter!(
        "sluice_json_fallback_batches_total",
        "Insert attempts sent as JSONEachRow instead of RowBinaryWithDefaults, by table and reason (a value the binary path does not convert exactly as ClickHouse's JSON parser would, a table it cannot encode, a binary insert refused)."
    );
    describe_counter!(
        "sluice_reconciliations_total",
        "Uncertain batches checked against ClickHouse, by table and outcome (all_present, some_present, none_present)."
    );
    describe_counter!(
        "sluice_dedup_dropped_records_total",
        "Records dropped because their business key was written within the dedup window, by topic."
    );
    describe_counter!(
        "sluice_redelivered_records_total",
        "Records the Kafka client delivered a second time (ignored), by topic."
    );
    describe_counter!(
        "sluice_dlq_records_total",
        "Records written to the dead-letter topic (acknowledged), by source topic and reason."
    );
    describe_gauge!("sluice_in_flight_bytes", "Bytes in batches being inserted.");
    describe_counter!(
        "sluice_schema_fetch_errors_total",
        "Failed schema registry requests for a schema id, by kind: `unavailable`, `unauthorized` and the like keep a partition waiting; `unknown-schema`, `wrong-type`, `invalid` send its records to the DLQ."
    );
    describe_gauge!(
        "sluice_consumer_lag_records",
        "Records between the broker's last stable offset and the durable frontier (every record before it is in ClickHouse or the DLQ), by topic and partition; every 10 s while this process holds the partition, 0 once it leaves."
    );
    describe_gauge!(
        "sluice_consumer_lag_seconds",
        "Age, by its Kafka timestamp, of the oldest record read but not yet durable, by topic and partition (0 when every record read is durable)."
    );
    describe_gauge!(
        "sluice_committed_offset",
        "The offset committed for the partition (the next record to read), by topic and partition; refreshed every commit interval while this process holds it."
    );
    describe_gauge!(
        "sluice_buffer_limit_bytes",
        "The bytes batches being built or inserted may hold before every partition pauses (the batches' share of sink.max_buffered_bytes)."
    );
    describe_gauge!("sluice_ready", "1 while /ready answers 200, else 0.");
    describe_gauge!(
        "process_start_time_seconds",
        "When the process started, in seconds since the Unix epoch."
    );
}

/// The series set once at start: the buffer's bound and the start time.
pub(crate) fn started(buffer_limit_bytes: usize) {
    gauge!("sluice_buffer_limit_bytes").set(buffer_limit_bytes as f64);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    gauge!("process_start_time_seconds").set(now.as_secs_f64().floor());
    // Served at 0 from the start: the first error shows as an increase.
    for kind in crate::registry::RegistryError::KINDS {
        counter!("sluice_schema_fetch_errors_total", "kind" => kind).increment(0);
    }
}

pub(crate) fn ready(ready: bool) {
    gauge!("sluice_ready").set(if ready { 1.0 } else { 0.0 });
}

/// The per-record counters of one topic, looked up once: bumping them is
/// an atomic add, with no label strings built on the hot path. Create them
/// after [`Metrics::install`], or they stay no-ops.
pub(crate) struct TopicCounters {
    records: metrics::Counter,
    bytes: metrics::Counter,
    dedup_dropped: metrics::Counter,
    redelivered: metrics::Counter,
}

impl TopicCounters {
    pub(crate) fn new(topic: &str) -> Self {
        let t = || topic.to_string();
        Self {
            records: counter!("sluice_records_total", "topic" => t()),
            bytes: counter!("sluice_record_bytes_total", "topic" => t()),
            dedup_dropped: counter!("sluice_dedup_dropped_records_total", "topic" => t()),
            redelivered: counter!("sluice_redelivered_records_total", "topic" => t()),
        }
    }

    pub(crate) fn record_read(&self, bytes: usize) {
        self.records.increment(1);
        self.bytes.increment(bytes as u64);
    }

    pub(crate) fn dedup_dropped(&self, records: u64) {
        self.dedup_dropped.increment(records);
    }

    pub(crate) fn redelivered(&self) {
        self.redelivered.increment(1);
    }
}

pub(crate) fn batch_inserted(table: &str, rows: usize, took: Duration) {
    counter!("sluice_batches_total", "table" => table.to_string()).increment(1);
    counter!("sluice_rows_inserted_total", "table" => table.to_string()).increment(rows as u64);
    histogram!(INSERT_SECONDS, "table" => table.to_string()).record(took.as_secs_f64());
}

pub(crate) fn insert_retried(table: &str, kind: &str) {
    counter!("sluice_insert_retries_total", "table" => table.to_string(), "kind" => kind.to_string())
        .increment(1);
}

/// An insert attempt sent as JSONEachRow though the route may go binary.
pub(crate) fn json_fallback(table: &str, reason: &'static str) {
    counter!("sluice_json_fallback_batches_total", "table" => table.to_string(), "reason" => reason)
        .increment(1);
}

pub(crate) fn reconciled(table: &str, present: usize, rows: usize) {
    let outcome = match present {
        0 => "none_present",
        p if p == rows => "all_present",
        _ => "some_present",
    };
    counter!("sluice_reconciliations_total", "table" => table.to_string(), "outcome" => outcome)
        .increment(1);
}

pub(crate) fn in_flight_bytes(bytes: usize) {
    gauge!("sluice_in_flight_bytes").set(bytes as f64);
}

pub(crate) fn consumer_lag(topic: &str, partition: i32, lag: i64) {
    gauge!("sluice_consumer_lag_records", "topic" => topic.to_string(), "partition" => partition.to_string())
        .set(lag.max(0) as f64);
}

/// A held partition's progress, every commit interval: its committed
/// offset, if any, and how long its oldest pending record has waited.
pub(crate) fn partition_progress(
    topic: &str,
    partition: i32,
    committed: Option<i64>,
    lag: Duration,
) {
    let labels = [
        ("topic", topic.to_string()),
        ("partition", partition.to_string()),
    ];
    if let Some(c) = committed {
        gauge!("sluice_committed_offset", &labels).set(c as f64);
    }
    gauge!("sluice_consumer_lag_seconds", &labels).set(lag.as_secs_f64());
}

/// A partition this process no longer holds: its lag is someone else's.
pub(crate) fn partition_left(topic: &str, partition: i32) {
    let labels = [
        ("topic", topic.to_string()),
        ("partition", partition.to_string()),
    ];
    gauge!("sluice_consumer_lag_records", &labels).set(0.0);
    gauge!("sluice_consumer_lag_seconds", &labels).set(0.0);
}

/// A record the DLQ acknowledged; `reason` is the error kind.
pub(crate) fn dlq_written(topic: &str, reason: &'static str) {
    counter!("sluice_dlq_records_total", "topic" => topic.to_string(), "reason" => reason)
        .increment(1);
}

pub(crate) fn schema_fetch_failed(kind: &'static str) {
    counter!("sluice_schema_fetch_errors_total", "kind" => kind).increment(1);
}
