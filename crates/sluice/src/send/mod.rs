//! `sluice send` and `sluice resend`: producing JSON lines without losing
//! any.
//!
//! In: JSON lines ([`input`]). Out: records in a topic, confirmed by the
//! broker, and a retry file (`retry`) holding every record whose delivery
//! was not confirmed, with the reason. The producer is idempotent with
//! `acks=all`, so its own retries never write a record twice; what it
//! cannot confirm within `--delivery-timeout` goes to the retry file, never
//! nowhere. With `--transactional-id`, records go in transactions of
//! `--transaction-size`: a transaction that aborts puts all its records in
//! the retry file; a fenced producer (another instance took the id) stops
//! and puts everything not yet committed there.
//!
//! With `--format avro|protobuf` each line is written in the schema
//! registry's wire format ([`framing`]).
//!
//! [`resend`] is the manual re-send done right: it looks the keys up in
//! ClickHouse first and sends only the missing records.

pub mod framing;
pub mod input;
pub mod resend;
pub(crate) mod retry;

use crate::config::{ConfigError, KafkaConfig, RawConfig};
use crate::report::Outcome;
use input::Line;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext};
use retry::RetryFile;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `sluice send`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ProducerArgs {
    /// Kafka bootstrap servers: overrides the file's with --config;
    /// without it, SLUICE_KAFKA_BROKERS, then KAFKA_BROKERS stand in for it.
    #[arg(long)]
    pub(crate) brokers: Option<String>,
    /// Connect as `sluice run` does with this config file: its brokers,
    /// `security_protocol`, `[kafka.tls]`, `[kafka.sasl]` and
    /// `[kafka.properties]` (with `SLUICE_KAFKA_*` variables applied);
    /// `resend` also reads ClickHouse's side from it.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// The topic to produce to.
    #[arg(long)]
    pub(crate) topic: String,
    /// Use this top-level field of each record as its Kafka key (the key
    /// then decides the partition, as with Java clients).
    #[arg(long)]
    pub(crate) key_field: Option<String>,
    /// Send in transactions with this transactional.id (unique per
    /// producer instance; a second instance with the same id fences this one).
    #[arg(long)]
    pub(crate) transactional_id: Option<String>,
    /// Records per transaction.
    #[arg(long, default_value_t = 1000)]
    pub(crate) transaction_size: usize,
    /// Where records whose delivery is not confirmed are appended.
    #[arg(long, default_value = "sluice-retry.jsonl")]
    pub(crate) retry_file: PathBuf,
    /// How long the producer may retry one record (`delivery.timeout.ms`).
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub(crate) delivery_timeout: Duration,
    /// `transaction.timeout.ms`: the broker aborts a transaction open longer.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub(crate) transaction_timeout: Duration,
    /// An extra librdkafka property, `name=value` (repeatable).
    #[arg(long = "property", value_parser = parse_property)]
    pub(crate) properties: Vec<(String, String)>,
    #[command(flatten)]
    pub(crate) format: framing::FormatArgs,
}

/// `sluice send`'s command line.
#[derive(Debug, Clone, clap::Args)]
pub struct SendArgs {
    #[command(flatten)]
    pub(crate) producer: ProducerArgs,
    /// Input files of JSON lines (default: stdin).
    pub(crate) files: Vec<PathBuf>,
}

/// `sluice send`: sends the lines, prints the tally on stderr; found
/// something when a record ended in the retry file.
pub fn main(a: SendArgs) -> anyhow::Result<Outcome> {
    let mut opts = a.producer.options()?;
    let framing = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(a.producer.framing())?;
    opts.framing = framing.map(Arc::new);
    let report = send_stream(&opts, input::lines(&a.files))?;
    let retry = match report.failed {
        0 => String::new(),
        _ => format!(" ({})", opts.retry_file.display()),
    };
    let stopped = report
        .stopped
        .as_ref()
        .map(|s| format!("; {s}"))
        .unwrap_or_default();
    eprintln!(
        "sluice send: {} read, {} confirmed, {} in the retry file{retry}{stopped}",
        report.read, report.sent, report.failed
    );
    Ok(Outcome::found_if(report.failed > 0))
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("{s:?} is not name=value"))
}

impl ProducerArgs {
    /// The framing of `--format`, with the schema registered.
    pub(crate) async fn framing(&self) -> anyhow::Result<Option<framing::Framing>> {
        self.format
            .framing(&self.topic, self.config.as_deref())
            .await
    }

    /// The options these flags describe; with `--config`, the file is read
    /// and validated as `sluice run` would.
    pub(crate) fn options(&self) -> Result<SendOptions, ConfigError> {
        let kafka = match &self.config {
            Some(path) => {
                let raw = RawConfig::load(path, std::env::vars())?;
                Some(raw.kafka_side(self.brokers.clone())?)
            }
            None => None,
        };
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let brokers = match &kafka {
            Some(k) => k.brokers.clone(),
            None => self
                .brokers
                .clone()
                .or_else(|| var("SLUICE_KAFKA_BROKERS"))
                .or_else(|| var("KAFKA_BROKERS"))
                .ok_or(ConfigError::Missing {
                    field: "--brokers",
                    expected: "host:port (or SLUICE_KAFKA_BROKERS / KAFKA_BROKERS, or --config)",
                })?,
        };
        Ok(SendOptions {
            brokers,
            kafka,
            topic: self.topic.clone(),
            key_field: self.key_field.clone(),
            transactional_id: self.transactional_id.clone(),
            transaction_size: self.transaction_size,
            retry_file: self.retry_file.clone(),
            delivery_timeout: self.delivery_timeout,
            transaction_timeout: self.transaction_timeout,
            properties: self.properties.clone(),
            framing: None,
        })
    }
}

/// How `sluice send` produces.
#[derive(Debug, Clone)]
pub struct SendOptions {
    pub brokers: String,
    /// The connection of a `sluice run` config (brokers, TLS, SASL,
    /// properties); without it, plain `brokers`.
    pub kafka: Option<KafkaConfig>,
    pub topic: String,
    /// The record key is this field's value (so the key decides the partition).
    pub key_field: Option<String>,
    pub transactional_id: Option<String>,
    pub transaction_size: usize,
    pub retry_file: PathBuf,
    /// `delivery.timeout.ms`: how long the producer may retry one record.
    pub delivery_timeout: Duration,
    /// `transaction.timeout.ms`.
    pub transaction_timeout: Duration,
    /// Extra librdkafka properties.
    pub properties: Vec<(String, String)>,
    /// How lines become record values (`None`: as they are, JSON).
    pub framing: Option<Arc<framing::Framing>>,
}

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("{0}")]
    Invalid(String),
    #[error("Kafka at {brokers}: {source}")]
    Kafka { brokers: String, source: KafkaError },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// What happened to the input.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SendReport {
    pub read: u64,
    /// Confirmed by the broker (committed, with transactions).
    pub sent: u64,
    /// In the retry file.
    pub failed: u64,
    pub transactions_committed: u64,
    pub(crate) transactions_aborted: u64,
    /// Why the producer stopped early, if it did.
    pub stopped: Option<String>,
}

struct Ctx {
    results: Mutex<Vec<(usize, Result<(), String>)>>,
}

impl ClientContext for Ctx {}

impl ProducerContext for Ctx {
    type DeliveryOpaque = Box<usize>;
    fn delivery(&self, r: &DeliveryResult<'_>, id: Box<usize>) {
        let res = r.as_ref().map(|_| ()).map_err(|(e, _)| e.to_string());
        self.results
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((*id, res));
    }
}

impl SendOptions {
    fn producer(&self) -> Result<ThreadedProducer<Ctx>, SendError> {
        if self.transactional_id.is_some() && self.delivery_timeout > self.transaction_timeout {
            return Err(SendError::Invalid(format!(
                "--delivery-timeout ({:?}) must not exceed --transaction-timeout ({:?}): \
                 librdkafka requires message.timeout.ms <= transaction.timeout.ms",
                self.delivery_timeout, self.transaction_timeout
            )));
        }
        let mut cc = match &self.kafka {
            Some(k) => k.client_config(),
            None => ClientConfig::new(),
        };
        cc.set("bootstrap.servers", &self.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("max.in.flight.requests.per.connection", "5")
            // Java's partitioner: the same key goes to the same partition
            // whichever client produced it.
            .set("partitioner", "murmur2_random")
            .set("linger.ms", "5")
            .set(
                "message.timeout.ms",
                self.delivery_timeout.as_millis().to_string(),
            );
        if let Some(id) = &self.transactional_id {
            cc.set("transactional.id", id).set(
                "transaction.timeout.ms",
                self.transaction_timeout.as_millis().to_string(),
            );
        }
        for (k, v) in &self.properties {
            cc.set(k, v);
        }
        cc.create_with_context(Ctx {
            results: Mutex::new(Vec::new()),
        })
        .map_err(|source| self.kafka(source))
    }

    fn kafka(&self, source: KafkaError) -> SendError {
        SendError::Kafka {
            brokers: self.brokers.clone(),
            source,
        }
    }
}

/// Records handled per round: read, sent, settled. Bounds memory whatever
/// the input's size.
pub(crate) const CHUNK: usize = 50_000;

/// Sends `lines`; blocks until every record is confirmed or in the retry
/// file.
pub fn send(opts: &SendOptions, lines: &[Line]) -> Result<SendReport, SendError> {
    let mut s = Sender::new(opts)?;
    for chunk in lines.chunks(CHUNK) {
        s.feed(chunk)?;
    }
    s.finish()
}

/// Sends lines as they are read, [`CHUNK`] at a time.
pub(crate) fn send_stream(
    opts: &SendOptions,
    lines: impl Iterator<Item = std::io::Result<Line>>,
) -> Result<SendReport, SendError> {
    let mut s = Sender::new(opts)?;
    let mut chunk = Vec::with_capacity(CHUNK);
    for l in lines {
        chunk.push(l?);
        if chunk.len() == CHUNK {
            s.feed(&chunk)?;
            chunk.clear();
        }
    }
    s.feed(&chunk)?;
    s.finish()
}

/// One producer, its retry file and the running report.
pub(crate) struct Sender<'o> {
    opts: &'o SendOptions,
    producer: ThreadedProducer<Ctx>,
    retry: RetryFile,
    report: SendReport,
}

impl<'o> Sender<'o> {
    pub(crate) fn new(opts: &'o SendOptions) -> Result<Self, SendError> {
        let producer = opts.producer()?;
        if opts.transactional_id.is_some() {
            let t = opts.transaction_timeout + Duration::from_secs(10);
            producer.init_transactions(t).map_err(|e| opts.kafka(e))?;
        }
        Ok(Self {
            opts,
            producer,
            retry: RetryFile::new(&opts.retry_file),
            report: SendReport::default(),
        })
    }

    /// Sends one chunk and settles it: every line is confirmed or in the
    /// retry file when this returns.
    pub(crate) fn feed(&mut self, lines: &[Line]) -> Result<(), SendError> {
        self.report.read += lines.len() as u64;
        if let Some(why) = self.report.stopped.clone() {
            for l in lines {
                self.retry
                    .add(&l.source, &l.text, &format!("not sent: {why}"))?;
            }
            return Ok(());
        }
        // Records that cannot be sent at all go straight to the retry file.
        let mut ok: Vec<usize> = Vec::with_capacity(lines.len());
        let mut keys: Vec<Option<String>> = vec![None; lines.len()];
        let mut values: Vec<Option<Vec<u8>>> = vec![None; lines.len()];
        for (i, l) in lines.iter().enumerate() {
            let checked = match &self.opts.key_field {
                Some(f) => input::key_of(&l.text, f).map(|k| keys[i] = Some(k)),
                None => input::check_object(&l.text),
            };
            let checked = match (checked, &self.opts.framing) {
                (Ok(()), Some(f)) => f.frame(&l.text).map(|v| values[i] = Some(v)),
                (checked, _) => checked,
            };
            match checked {
                Ok(()) => ok.push(i),
                Err(e) => self.retry.add(&l.source, &l.text, &e)?,
            }
        }
        let (opts, p) = (self.opts, &self.producer);
        let records = Records {
            lines,
            keys: &keys,
            values: &values,
        };
        if opts.transactional_id.is_some() {
            transactional(opts, p, &records, &ok, &mut self.retry, &mut self.report)
        } else {
            enqueue(opts, p, &records, &ok);
            let _ = p.flush(opts.delivery_timeout + Duration::from_secs(10));
            settle(p, lines, &ok, &mut self.retry, &mut self.report)
        }
    }

    pub(crate) fn finish(mut self) -> Result<SendReport, SendError> {
        self.report.failed = self.retry.written;
        self.retry.finish()?;
        Ok(self.report)
    }
}

/// One chunk of lines with their keys and, with a [`framing::Framing`],
/// their record values.
struct Records<'a> {
    lines: &'a [Line],
    keys: &'a [Option<String>],
    values: &'a [Option<Vec<u8>>],
}

/// Hands records to the producer, waiting while its queue is full.
fn enqueue(opts: &SendOptions, p: &ThreadedProducer<Ctx>, records: &Records, which: &[usize]) {
    for &i in which {
        let value = match &records.values[i] {
            Some(v) => v.as_slice(),
            None => records.lines[i].text.as_bytes(),
        };
        let mut rec = BaseRecord::with_opaque_to(&opts.topic, Box::new(i)).payload(value);
        if let Some(k) = &records.keys[i] {
            rec = rec.key(k.as_str());
        }
        loop {
            match p.send(rec) {
                Ok(()) => break,
                Err((
                    KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                    r,
                )) => {
                    rec = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, r)) => {
                    // Reported like a failed delivery.
                    let id = *r.delivery_opaque;
                    p.context()
                        .results
                        .lock()
                        .unwrap_or_else(|x| x.into_inner())
                        .push((id, Err(e.to_string())));
                    break;
                }
            }
        }
    }
}

/// Collects delivery reports for `which`: confirmed ones count as sent,
/// the rest (failed, or never reported) go to the retry file.
fn settle(
    p: &ThreadedProducer<Ctx>,
    lines: &[Line],
    which: &[usize],
    retry: &mut RetryFile,
    report: &mut SendReport,
) -> Result<(), SendError> {
    let results = std::mem::take(
        &mut *p
            .context()
            .results
            .lock()
            .unwrap_or_else(|x| x.into_inner()),
    );
    let mut outcome: std::collections::HashMap<usize, Result<(), String>> =
        results.into_iter().collect();
    for &i in which {
        match outcome.remove(&i) {
            Some(Ok(())) => report.sent += 1,
            Some(Err(e)) => retry.add(&lines[i].source, &lines[i].text, &e)?,
            None => retry.add(
                &lines[i].source,
                &lines[i].text,
                "no delivery report before the timeout",
            )?,
        }
    }
    Ok(())
}

fn transactional(
    opts: &SendOptions,
    p: &ThreadedProducer<Ctx>,
    records: &Records,
    ok: &[usize],
    retry: &mut RetryFile,
    report: &mut SendReport,
) -> Result<(), SendError> {
    let lines = records.lines;
    let t = opts.transaction_timeout + Duration::from_secs(10);
    let chunks: Vec<&[usize]> = ok.chunks(opts.transaction_size.max(1)).collect();
    for (n, chunk) in chunks.iter().enumerate() {
        let failed = |retry: &mut RetryFile, why: &str, from: usize| -> Result<(), SendError> {
            p.context()
                .results
                .lock()
                .unwrap_or_else(|x| x.into_inner())
                .clear();
            for c in &chunks[from..] {
                for &i in *c {
                    retry.add(&lines[i].source, &lines[i].text, why)?;
                }
            }
            Ok(())
        };
        if let Err(e) = p.begin_transaction() {
            report.stopped = Some(format!("cannot begin a transaction: {e}"));
            return failed(retry, &format!("not sent: {e}"), n);
        }
        enqueue(opts, p, records, chunk);
        let mut attempts = 0;
        let committed = loop {
            match p.commit_transaction(t) {
                Ok(()) => break Ok(()),
                Err(KafkaError::Transaction(e)) if e.is_retriable() && attempts < 3 => {
                    attempts += 1;
                }
                Err(e) => break Err(e),
            }
        };
        match committed {
            Ok(()) => {
                report.transactions_committed += 1;
                settle(p, lines, chunk, retry, report)?;
            }
            Err(KafkaError::Transaction(e)) if e.txn_requires_abort() => {
                let _ = p.abort_transaction(t);
                report.transactions_aborted += 1;
                for &i in *chunk {
                    retry.add(
                        &lines[i].source,
                        &lines[i].text,
                        &format!("transaction aborted: {e}"),
                    )?;
                }
                p.context()
                    .results
                    .lock()
                    .unwrap_or_else(|x| x.into_inner())
                    .clear();
            }
            Err(e) => {
                // Fatal (fenced, or the outcome is unknown): stop; nothing
                // from this transaction on counts as sent.
                report.stopped = Some(format!("transactional producer stopped: {e}"));
                return failed(retry, &format!("not confirmed: {e}"), n);
            }
        }
    }
    Ok(())
}
