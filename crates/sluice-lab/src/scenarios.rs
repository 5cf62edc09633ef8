//! The fault scenarios, each written once and run against every delivery
//! mode.
//!
//! A scenario makes a fresh topic, table and group, produces a known set of
//! records, runs `sluice run` as child processes, injects its fault by real
//! means (a proxy that withholds or holds an insert, kill -9, SIGSTOP, a
//! ClickHouse that stops answering), waits until the table is still, and
//! counts in ClickHouse.

use super::fixture::{Landed, Stack};
use super::process::{SinkProcess, SinkSpec};
use super::proxy::{Fault, Proxy};
use anyhow::{bail, Context};
use serde::Serialize;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Every scenario, in the order of the matrix.
pub const SCENARIOS: &[&str] = &[
    "resubmit-after-timeout/window-large",
    "resubmit-after-timeout/window-small",
    "crash-replay",
    "crash-replay/avro",
    "crash-after-many-batches",
    "unknown-outcome-then-new-boundaries",
    "unknown-outcome-then-new-boundaries/avro",
    "late-insert",
    "clickhouse-outage",
    "broker-restart",
    "rebalance",
    "zombie",
    "coordinator-partition",
    "producer-retry",
    "manual-resend",
    "poison-records",
    "reject-every-type",
    "partition-limit",
    "recreated-topic",
    "slow-body",
    "clock-step",
];

/// Scenarios whose copies are made before Kafka (same key, new offset):
/// their duplicates are counted by key.
pub const PRODUCER_SIDE: &[&str] = &["producer-retry", "manual-resend"];

/// Every mode, in the order of the matrix: the delivery modes, and
/// exactly-once with key dedup on `id`.
pub const MODES: &[&str] = &[
    "exactly-once",
    "exactly-once+dedup",
    "at-least-once",
    "token-only",
];

/// Whether `scenario` runs in `mode`: an Avro route has no key dedup.
pub fn applies(scenario: &str, mode: &str) -> bool {
    !(scenario.ends_with(AVRO) && mode.ends_with("+dedup"))
}

/// The suffix of a scenario run with Avro records through the schema
/// registry (`SCHEMA_REGISTRY_URL`) instead of JSON.
const AVRO: &str = "/avro";

/// The lab's record, `{"id": …, "payload": …}`, as an Avro schema.
const LAB_AVRO: &str = r#"{"type":"record","name":"LabEvent","fields":[{"name":"id","type":"long"},{"name":"payload","type":"string"}]}"#;

/// A mode's delivery setting and key dedup field.
fn mode_settings(mode: &'static str) -> (&'static str, Option<String>) {
    match mode.strip_suffix("+dedup") {
        Some(delivery) => (delivery, Some("id".to_string())),
        None => (mode, None),
    }
}

const PARTITIONS: i32 = 4;

/// Sizes and durations of one lab run.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub records: u64,
    pub insert_timeout: Duration,
    pub outage: Duration,
    pub timeout: Duration,
}

impl Params {
    /// Small enough for `make test`.
    pub fn quick() -> Self {
        Self {
            records: 20_000,
            insert_timeout: Duration::from_secs(3),
            outage: Duration::from_secs(15),
            timeout: Duration::from_secs(120),
        }
    }

    /// The documents' timings: a 30 s client timeout, so the re-submit comes
    /// 30+ s after the first attempt; a 60 s outage.
    pub fn full() -> Self {
        Self {
            records: 200_000,
            insert_timeout: Duration::from_secs(30),
            outage: Duration::from_secs(60),
            timeout: Duration::from_secs(600),
        }
    }
}

/// One cell of the matrix.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Cell {
    pub scenario: String,
    pub mode: String,
    pub produced: u64,
    pub rows: u64,
    pub duplicates: u64,
    pub missing: u64,
    /// The sink stopped making progress (or exited) without an operator.
    pub stalled: bool,
    /// Seconds from the end of the fault until every record had landed.
    pub recovery_s: Option<f64>,
    /// Whether the fault was really injected.
    pub fault_injected: bool,
    /// Distinct source records in the dead-letter topic (the DLQ scenarios).
    #[serde(default)]
    pub dlq: Option<u64>,
    /// Extra copies in the dead-letter topic, which is at-least-once: a bad
    /// record read again after a lost partition is written again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dlq_copies: Option<u64>,
    /// Why the cell could not be measured (the harness failed, not the sink).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Cell {
    /// A cell the harness could not measure: counted as a stall, with why.
    pub fn failed(scenario: &str, mode: &str, error: String) -> Self {
        Self {
            scenario: scenario.into(),
            mode: mode.into(),
            produced: 0,
            rows: 0,
            duplicates: 0,
            missing: 0,
            stalled: true,
            recovery_s: None,
            fault_injected: false,
            dlq: None,
            dlq_copies: None,
            error: Some(error),
        }
    }
}

/// How a cell's error begins when a sink it started exited on its own:
/// sluice's failure, not the harness's.
pub const SINK_EXITED: &str = "the sink exited";

struct Run {
    stack: Stack,
    mode: &'static str,
    table: String,
    spec: SinkSpec,
    proxy: Option<Proxy>,
    params: Params,
    /// Avro records through the registry, for a `/avro` scenario.
    framing: Option<std::sync::Arc<sluice::send::framing::Framing>>,
}

impl Run {
    async fn new(
        stack: &Stack,
        mode: &'static str,
        params: Params,
        window: u32,
        proxied: bool,
    ) -> anyhow::Result<Self> {
        Self::with_format(stack, mode, params, window, proxied, false).await
    }

    /// [`Self::new`], with Avro records through the registry if `avro`.
    async fn with_format(
        stack: &Stack,
        mode: &'static str,
        params: Params,
        window: u32,
        proxied: bool,
        avro: bool,
    ) -> anyhow::Result<Self> {
        let topic = Stack::unique("lab");
        stack.create_topic(&topic, PARTITIONS).await?;
        let registry = match avro {
            false => None,
            true => Some(std::env::var("SCHEMA_REGISTRY_URL").context(
                "the /avro scenarios need a schema registry: SCHEMA_REGISTRY_URL (make stack)",
            )?),
        };
        let framing = match &registry {
            None => None,
            Some(url) => Some(std::sync::Arc::new(
                sluice::send::framing::Framing::register(
                    &sluice::config::SchemaRegistryConfig::from_url(url),
                    &format!("{topic}-value"),
                    "avro",
                    LAB_AVRO,
                    None,
                )
                .await?,
            )),
        };
        let table = stack.create_table(&Stack::unique("lab"), window).await?;
        let proxy = if proxied {
            let hold = params.insert_timeout * 2 + Duration::from_secs(1);
            Some(Proxy::start(Proxy::upstream_of(&stack.clickhouse_url), hold).await?)
        } else {
            None
        };
        let group = Stack::unique("lab");
        let (delivery, dedup_key) = mode_settings(mode);
        let spec = SinkSpec {
            brokers: stack.brokers.clone(),
            clickhouse_url: proxy
                .as_ref()
                .map_or(stack.clickhouse_url.clone(), |p| p.url.clone()),
            topic,
            table: table.clone(),
            group,
            delivery,
            max_batch_rows: 1_000,
            insert_timeout: params.insert_timeout,
            // The default fence: a 10 s lease and the 5 s margin.
            fence_wait: params.insert_timeout * 2 + Duration::from_secs(15),
            max_batch_age: Duration::from_millis(300),
            dedup_key,
            format: if avro { "avro" } else { "json" },
            schema_registry: registry,
            ..SinkSpec::default()
        };
        Ok(Self {
            stack: stack.clone(),
            mode,
            table,
            spec,
            proxy,
            params,
            framing,
        })
    }

    async fn produce(&self, start: u64, n: u64) -> anyhow::Result<()> {
        let (stack, topic) = (self.stack.clone(), self.spec.topic.clone());
        let framing = self.framing.clone();
        tokio::task::spawn_blocking(move || {
            stack.produce_framed(&topic, PARTITIONS, start, n, framing.as_deref())
        })
        .await?
    }

    /// Sends records `start..start + n` (or the retry file `again`) as the
    /// application does, with `sluice send`: keyed by `id`, so the key
    /// decides the partition. Returns the report and the retry file.
    async fn send(
        &self,
        start: u64,
        n: u64,
        again: Option<&std::path::Path>,
        delivery_timeout: Duration,
    ) -> anyhow::Result<(sluice::send::SendReport, std::path::PathBuf)> {
        let pad = "x".repeat(60);
        let lines = match again {
            Some(f) => sluice::send::input::read_all(&[f.to_path_buf()])?,
            None => (start..start + n)
                .map(|i| sluice::send::input::Line {
                    source: format!("lab:{i}"),
                    text: format!(r#"{{"id":{i},"payload":"{pad}"}}"#),
                })
                .collect(),
        };
        let retry_file = std::env::temp_dir().join(format!("{}.jsonl", Stack::unique("lab_retry")));
        let opts = sluice::send::SendOptions {
            brokers: self.stack.brokers.clone(),
            kafka: None,
            topic: self.spec.topic.clone(),
            key_field: Some("id".into()),
            transactional_id: None,
            transaction_size: 1000,
            retry_file: retry_file.clone(),
            delivery_timeout,
            transaction_timeout: delivery_timeout.max(Duration::from_secs(60)),
            properties: Vec::new(),
            framing: None,
        };
        let report =
            tokio::task::spawn_blocking(move || sluice::send::send(&opts, &lines)).await??;
        Ok((report, retry_file))
    }

    /// docs/operations.md's way on after a recreated topic, first half: the rows
    /// of the old topic (ids below `old`) are kept elsewhere and taken out.
    async fn move_out_old_rows(&self, old: u64) -> anyhow::Result<()> {
        let ch = self.stack.ch();
        let (t, a) = (&self.table, format!("{}_before_recreate", self.table));
        for sql in [
            format!("CREATE TABLE {a} AS {t}"),
            format!("INSERT INTO {a} SELECT * FROM {t} WHERE id < {old}"),
            format!("ALTER TABLE {t} DELETE WHERE id < {old} SETTINGS mutations_sync = 2"),
        ] {
            ch.query(&sql)
                .execute()
                .await
                .with_context(|| sql.clone())?;
        }
        Ok(())
    }

    async fn rows(&self) -> anyhow::Result<u64> {
        Ok(self.stack.landed(&self.table).await?.rows)
    }

    /// Waits until at least `rows` rows landed. It gives up on a count
    /// asked after the deadline, not on an answer read after it: the lab's
    /// runtime can be held up (brokers starting beside it on a loaded
    /// machine), and an answer to a count sent before the rows landed,
    /// read minutes later, is not the sink's stall. A count that takes
    /// over 10 s is asked again.
    async fn wait_rows(&self, sink: &mut SinkProcess, rows: u64) -> anyhow::Result<()> {
        let deadline = Instant::now() + self.params.timeout;
        loop {
            let asked = Instant::now();
            let count = tokio::time::timeout(Duration::from_secs(10), self.rows()).await;
            if count.ok().transpose()?.is_some_and(|n| n >= rows) {
                return Ok(());
            }
            if !sink.is_running() {
                bail!(
                    "{SINK_EXITED} before {rows} rows landed; its log:\n{}",
                    sink.log_tail()
                );
            }
            if asked > deadline {
                bail!("no progress to {rows} rows (log: {})", sink.log.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Reads `want` records from the DLQ topic and counts them into `cell`:
    /// `n` records were produced, each must be a row or in the DLQ, and a
    /// second DLQ copy of a record is a duplicate. Returns the entries and
    /// the source coordinates they name.
    async fn count_dlq(
        &self,
        cell: &mut Cell,
        n: u64,
        dlq_topic: &str,
        bad: usize,
    ) -> anyhow::Result<(Vec<super::poison::DlqEntry>, BTreeSet<(i32, i64)>)> {
        let (brokers, t, timeout) = (
            self.stack.brokers.clone(),
            dlq_topic.to_string(),
            self.params.timeout,
        );
        let entries = tokio::task::spawn_blocking(move || {
            super::poison::read_dlq(&brokers, &t, bad, timeout)
        })
        .await??;
        let sources: BTreeSet<(i32, i64)> = entries
            .iter()
            .filter(|e| e.source_topic == self.spec.topic)
            .map(|e| (e.partition, e.offset))
            .collect();
        let in_dlq = sources.len() as u64;
        let stored = cell.rows - cell.duplicates;
        cell.produced = n;
        cell.missing = n.saturating_sub(stored + in_dlq);
        cell.dlq = Some(in_dlq);
        cell.dlq_copies = Some(entries.len() as u64 - in_dlq);
        Ok((entries, sources))
    }

    /// Waits for quiescence and builds the cell.
    async fn finish(
        &self,
        scenario: &str,
        mut sinks: Vec<SinkProcess>,
        produced: u64,
        fault_end: Instant,
    ) -> anyhow::Result<Cell> {
        let group = (
            self.spec.group.as_str(),
            self.spec.topic.as_str(),
            PARTITIONS,
        );
        let (got, complete_at): (Landed, _) = self
            .stack
            .quiesce(
                &self.table,
                group,
                produced,
                Duration::from_secs(2),
                self.params.timeout,
            )
            .await?;
        let exited = sinks.iter_mut().any(|s| !s.is_running());
        if complete_at.is_none() || exited {
            // What the sinks said, for whoever reads the lab's output: their
            // logs go with their scratch directories.
            let logs: Vec<String> = sinks
                .iter()
                .enumerate()
                .map(|(i, s)| format!("sink {i}:\n{}", s.log_tail()))
                .collect();
            eprintln!(
                "lab: {scenario} / {}: stalled; the sinks' logs:\n{}\nlab: end of the logs",
                self.mode,
                logs.join("\n")
            );
        }
        // All told at once, so their shutdowns overlap.
        for s in &sinks {
            s.signal("-TERM");
        }
        for s in &mut sinks {
            s.stop(Duration::from_secs(60));
        }
        let distinct = if PRODUCER_SIDE.contains(&scenario) {
            got.distinct_ids
        } else {
            got.distinct_offsets
        };
        Ok(Cell {
            scenario: scenario.into(),
            mode: self.mode.into(),
            produced,
            rows: got.rows,
            duplicates: got.rows.saturating_sub(distinct),
            missing: produced.saturating_sub(got.distinct_ids),
            stalled: complete_at.is_none() || exited,
            recovery_s: complete_at.map(|t| t.saturating_duration_since(fault_end).as_secs_f64()),
            fault_injected: self.proxy.as_ref().is_none_or(|p| p.fired() > 0),
            dlq: None,
            dlq_copies: None,
            error: None,
        })
    }
}

/// Runs one scenario in one mode.
pub async fn run(
    stack: &Stack,
    scenario: &str,
    mode: &'static str,
    p: Params,
) -> anyhow::Result<Cell> {
    let n = p.records;
    let (base, avro) = (scenario.trim_end_matches(AVRO), scenario.ends_with(AVRO));
    match base {
        "resubmit-after-timeout/window-large" | "resubmit-after-timeout/window-small" => {
            let window = if scenario.ends_with("large") { 1000 } else { 2 };
            let r = Run::new(stack, mode, p, window, true).await?;
            r.produce(0, n).await?;
            r.proxy
                .as_ref()
                .context("proxy")?
                .arm(Fault::WithholdResponse);
            let sink = r.spec.spawn_self()?;
            // The table's other writers move a small window on while the
            // client waits (the documents' table: 1000 blocks in about 8 s).
            let others = async {
                let proxy = r.proxy.as_ref().context("proxy")?;
                let deadline = Instant::now() + r.params.timeout;
                if window >= 1000 {
                    return Ok(());
                }
                while proxy.fired() == 0 {
                    if Instant::now() > deadline {
                        return Ok(());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // The sink's first re-submit is lost on its way (its
                // outcome unknown), so the one that reaches the server
                // comes a whole hold later: by then the other writers have
                // moved the window past the first insert, however slowly
                // the server committed that one or theirs.
                proxy.arm(Fault::HoldRequest);
                r.stack.other_writer(&r.table, 40).await
            };
            let (others, cell) =
                tokio::join!(others, r.finish(scenario, vec![sink], n, Instant::now()));
            others?;
            cell
        }
        "crash-replay" | "crash-after-many-batches" => {
            let mut r = Run::with_format(stack, mode, p, 1000, false, avro).await?;
            r.produce(0, n / 2).await?;
            // The documents' pipeline commits offsets every 60 s: the crash
            // comes before any commit.
            r.spec.commit_interval = Duration::from_secs(60);
            let mut sink = r.spec.spawn_self()?;
            let batches = if base == "crash-replay" { 1 } else { 6 };
            r.wait_rows(&mut sink, batches * r.spec.max_batch_rows as u64)
                .await?;
            sink.kill9();
            // More records arrive while the sink is down; the restart reads
            // with a different batch size.
            r.produce(n / 2, n - n / 2).await?;
            r.spec.max_batch_rows = 700;
            r.spec.commit_interval = Duration::from_secs(1);
            let sink = r.spec.spawn_self()?;
            r.finish(scenario, vec![sink], n, Instant::now()).await
        }
        "unknown-outcome-then-new-boundaries" => {
            let mut r = Run::with_format(stack, mode, p, 1000, true, avro).await?;
            r.produce(0, n).await?;
            r.spec.commit_interval = Duration::from_secs(60);
            let proxy = r.proxy.as_ref().context("proxy")?;
            proxy.arm(Fault::HoldRequest);
            let mut sink = r.spec.spawn_self()?;
            let deadline = Instant::now() + p.timeout;
            while proxy.fired() == 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // The client times out: the outcome is unknown (nothing landed).
            tokio::time::sleep(p.insert_timeout + Duration::from_millis(500)).await;
            sink.kill9();
            r.spec.max_batch_rows = 700;
            r.spec.commit_interval = Duration::from_secs(1);
            let sink = r.spec.spawn_self()?;
            r.finish(scenario, vec![sink], n, Instant::now()).await
        }
        "late-insert" => {
            // Every 7th INSERT is held in the proxy past the client's
            // timeout and then delivered: a load balancer, a server queue or
            // a retransmission can do this. No dedup window to hide behind.
            let r = Run::new(stack, mode, p, 0, true).await?;
            r.produce(0, n).await?;
            let proxy = r.proxy.as_ref().context("proxy")?;
            proxy.late_every(7);
            let mut sink = r.spec.spawn_self()?;
            let deadline = Instant::now() + p.timeout;
            while r.stack.landed(&r.table).await?.distinct_ids < n
                && Instant::now() < deadline
                && sink.is_running()
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            // Every held request reaches the server before the count.
            proxy.late_every(0);
            while proxy.late_pending() > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            r.finish(scenario, vec![sink], n, Instant::now()).await
        }
        "clickhouse-outage" => {
            let r = Run::new(stack, mode, p, 0, true).await?;
            r.produce(0, n / 2).await?;
            let mut sink = r.spec.spawn_self()?;
            r.wait_rows(&mut sink, n / 8).await?;
            let proxy = r.proxy.as_ref().context("proxy")?;
            proxy.set_down(true);
            r.produce(n / 2, n - n / 2).await?;
            tokio::time::sleep(p.outage).await;
            proxy.set_down(false);
            r.finish(scenario, vec![sink], n, Instant::now()).await
        }
        "broker-restart" => {
            let mut broker = super::fixture::PrivateBroker::start().await?;
            let own = Stack {
                brokers: broker.brokers(),
                clickhouse_url: stack.clickhouse_url.clone(),
            };
            let r = Run::new(&own, mode, p, 0, false).await?;
            r.produce(0, n / 2).await?;
            let mut sink = r.spec.spawn_self()?;
            r.wait_rows(&mut sink, n / 8).await?;
            broker.kill();
            tokio::time::sleep(p.outage / 2).await;
            broker.resume().await?;
            let fault_end = Instant::now();
            r.produce(n / 2, n - n / 2).await?;
            let cell = r.finish(scenario, vec![sink], n, fault_end).await;
            drop(r);
            cell
        }
        "rebalance" => {
            let r = Run::new(stack, mode, p, 0, false).await?;
            r.produce(0, n / 2).await?;
            let mut a = r.spec.spawn_self()?;
            let b = r.spec.spawn_self()?;
            r.wait_rows(&mut a, n / 8).await?;
            let c = r.spec.spawn_self()?;
            tokio::time::sleep(Duration::from_secs(4)).await;
            r.produce(n / 2, n - n / 2).await?;
            a.stop(Duration::from_secs(60));
            r.finish(scenario, vec![b, c], n, Instant::now()).await
        }
        "zombie" => {
            let r = Run::new(stack, mode, p, 0, false).await?;
            // B takes A's partitions while A is frozen; A wakes believing
            // it still holds them.
            r.produce(0, n / 2).await?;
            let mut a = r.spec.spawn_self()?;
            let b = r.spec.spawn_self()?;
            r.wait_rows(&mut a, n / 8).await?;
            a.freeze();
            r.produce(n / 2, n - n / 2).await?;
            // Past the 6 s session timeout: the group moves A's partitions.
            tokio::time::sleep(Duration::from_secs(14)).await;
            a.thaw();
            // The zombie's moment: A wakes holding batches of partitions it
            // no longer owns and must not write them; then it rejoins, and
            // the partitions may move back to it while B still flushes.
            tokio::time::sleep(Duration::from_secs(6)).await;
            a.stop(Duration::from_secs(60));
            r.finish(scenario, vec![b], n, Instant::now()).await
        }
        "coordinator-partition" => {
            // A broker of our own behind a proxy that can cut one member
            // off from its group coordinator, and hold its fetches.
            let super::kafka_proxy::ProxiedBroker {
                broker,
                proxy,
                stack: own,
            } = super::kafka_proxy::ProxiedBroker::start(&stack.clickhouse_url).await?;
            let mut r = Run::new(&own, mode, p, 0, false).await?;
            // Both members use one static instance id: B's join replaces A
            // at once (a new process started before the old one stopped).
            // The coordinator fences A at its next heartbeat, which the
            // proxy swallows: A learns nothing until its own session check.
            r.spec.instance_id = Some(Stack::unique("member"));
            // A believes it owns the partitions until its own session check
            // fails, 30 s after its last answered heartbeat: B must start
            // and A must read within that, with no producer in between.
            r.spec.session_timeout = Duration::from_secs(30);
            let member = |client: &str| {
                let mut s = r.spec.clone();
                s.kafka_properties = vec![("client.id".into(), client.into())];
                s
            };
            const A: &str = "lab-owner-a";
            r.produce(0, n / 2).await?;
            let mut a = member(A).spawn_self()?;
            r.wait_rows(&mut a, n / 8).await?;
            // A's fetches wait in the proxy; once one does, A has read
            // nothing produced since (one fetch in flight per broker).
            proxy.hold_fetches(Some(A));
            let deadline = Instant::now() + p.timeout;
            while proxy.fetches_waiting() == 0 {
                anyhow::ensure!(
                    Instant::now() < deadline && a.is_running(),
                    "coordinator-partition: the first member never fetched again; its log:\n{}",
                    a.log_tail()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // The overlap is in the broker before the fault: however slow
            // the producer, A still heartbeats and commits meanwhile.
            r.produce(n / 2, n - n / 2).await?;
            // A still reaches the partition leader and ClickHouse, not the
            // coordinator: no heartbeat, no commit, no offset read, no read
            // or renewal of its lease in the register of owners.
            proxy.cut_off_group(Some(A));
            let cut = Instant::now();
            let mut b = member("lab-owner-b").spawn_self()?;
            // The fault is two owners at once: B holds the partitions (in
            // exactly-once it has claimed them and waits out its fence)
            // before A is let read the records both will take.
            let owns = if mode.starts_with("exactly-once") {
                "claimed, waiting out the previous owner's inserts"
            } else {
                "assigned"
            };
            anyhow::ensure!(
                b.wait_for_log(owns, r.params.timeout).await,
                "coordinator-partition: the second member never held the partitions; its log:\n{}",
                b.log_tail()
            );
            // A's session check has not fired, or A would have let the
            // partitions go and read nothing more (no second owner then),
            // and leaves A 10 s to read and insert (its last heartbeat was
            // answered at most a second before the cut).
            let a_still_owns = a.is_running()
                && cut.elapsed() + Duration::from_secs(11) < r.spec.session_timeout
                && !std::fs::read_to_string(&a.log).is_ok_and(|l| l.contains("revoked"));
            proxy.hold_fetches(None);
            let fault_end = Instant::now();
            let mut cell = r.finish(scenario, vec![a, b], n, fault_end).await?;
            cell.fault_injected = proxy.swallowed() > 0 && proxy.held() > 0 && a_still_owns;
            drop(r);
            drop(broker);
            Ok(cell)
        }
        "producer-retry" => {
            // A broker of our own behind a proxy that can lose produce acks.
            let super::kafka_proxy::ProxiedBroker {
                broker,
                proxy,
                stack: own,
            } = super::kafka_proxy::ProxiedBroker::start(&stack.clickhouse_url).await?;
            let r = Run::new(&own, mode, p, 0, false).await?;
            r.send(0, n / 2, None, Duration::from_secs(60)).await?;
            let mut sink = r.spec.spawn_self()?;
            r.wait_rows(&mut sink, n / 8).await?;
            // The acks are lost: the broker stores the records, the
            // application's deliveries time out and go to its retry table...
            proxy.drop_acks(true);
            let (lost, retry) = r.send(n / 2, n / 4, None, Duration::from_secs(3)).await?;
            proxy.drop_acks(false);
            // ...which a retry job sends again.
            let (again, _) = r.send(0, 0, Some(&retry), Duration::from_secs(60)).await?;
            r.send(
                n / 2 + n / 4,
                n - n / 2 - n / 4,
                None,
                Duration::from_secs(60),
            )
            .await?;
            let fault_end = Instant::now();
            let mut cell = r.finish(scenario, vec![sink], n, fault_end).await?;
            cell.fault_injected = proxy.dropped() > 0 && lost.failed > 0 && again.sent > 0;
            drop(r);
            drop(broker);
            Ok(cell)
        }
        "manual-resend" => {
            let r = Run::new(stack, mode, p, 0, false).await?;
            let landed = n * 3 / 4;
            r.send(0, landed, None, Duration::from_secs(60)).await?;
            let mut sink = r.spec.spawn_self()?;
            r.wait_rows(&mut sink, landed).await?;
            // The retry table holds n/2..n; the first half of it had landed
            // after all. An operator re-sends all of it.
            let (again, _) = r
                .send(n / 2, n - n / 2, None, Duration::from_secs(60))
                .await?;
            let mut cell = r.finish(scenario, vec![sink], n, Instant::now()).await?;
            cell.fault_injected = again.sent == n - n / 2;
            Ok(cell)
        }
        "reject-every-type" => {
            use super::{poison, reject};
            // Every refusal costs exactly-once a reconciliation: a quarter
            // of the records (still every family many times over).
            let n = n / 4;
            let mut r = Run::new(stack, mode, p, 0, false).await?;
            // A table with a column of every type family instead.
            let db = Stack::unique("lab");
            let ch = stack.ch();
            ch.query(&format!("CREATE DATABASE IF NOT EXISTS {db}"))
                .execute()
                .await?;
            ch.query(&reject::table_ddl(&db)).execute().await?;
            r.table = format!("{db}.typed");
            r.spec.table = r.table.clone();
            let dlq_topic = Stack::unique("lab_dlq");
            stack.create_topic(&dlq_topic, 1).await?;
            r.spec.dlq_topic = Some(dlq_topic.clone());
            let (values, refused) = reject::mix(n, 100);
            let (brokers, topic) = (stack.brokers.clone(), r.spec.topic.clone());
            tokio::task::spawn_blocking(move || {
                poison::produce(&brokers, &topic, PARTITIONS, &values)
            })
            .await??;
            let sink = r.spec.spawn_self()?;
            let good = n - refused.len() as u64;
            let mut cell = r.finish(scenario, vec![sink], good, Instant::now()).await?;
            let (entries, sources) = r.count_dlq(&mut cell, n, &dlq_topic, refused.len()).await?;
            // Record i went to partition i % PARTITIONS, at offset i / PARTITIONS.
            let expected: BTreeSet<(i32, i64)> = refused
                .iter()
                .map(|&i| {
                    (
                        (i % PARTITIONS as u64) as i32,
                        (i / PARTITIONS as u64) as i64,
                    )
                })
                .collect();
            // Exactly the refused records reached the DLQ, each as `rejected`.
            cell.fault_injected =
                sources == expected && entries.iter().all(|e| e.kind == "rejected");
            Ok(cell)
        }
        "poison-records" => {
            use super::poison;
            let mut r = Run::new(stack, mode, p, 0, false).await?;
            let dlq_topic = Stack::unique("lab_dlq");
            stack.create_topic(&dlq_topic, 1).await?;
            r.spec.dlq_topic = Some(dlq_topic.clone());
            r.spec.required = vec!["id".into()];
            r.spec.max_record_bytes = Some(poison::MAX_RECORD_BYTES);
            let mix = poison::mix(n, 50);
            let (brokers, topic) = (stack.brokers.clone(), r.spec.topic.clone());
            let values = mix.values;
            tokio::task::spawn_blocking(move || {
                poison::produce(&brokers, &topic, PARTITIONS, &values)
            })
            .await??;
            let sink = r.spec.spawn_self()?;
            let mut cell = r
                .finish(scenario, vec![sink], mix.good, Instant::now())
                .await?;
            let bad = mix.bad.values().sum::<u64>() as usize;
            let (entries, _) = r.count_dlq(&mut cell, n, &dlq_topic, bad).await?;
            // Every kind of bad record reached the DLQ under its own name.
            cell.fault_injected = poison::KINDS
                .iter()
                .all(|k| entries.iter().any(|e| e.kind == *k));
            Ok(cell)
        }
        "partition-limit" => {
            // A backfill into a table partitioned by day: one day per 32
            // ids, so a batch of 1,000 rows of one Kafka partition spans
            // 125 days, past the 100 partitions one insert may create
            // parts for (`max_partitions_per_insert_block`, code 252).
            let n = n / 4;
            let mut r = Run::new(stack, mode, p, 0, false).await?;
            let db = Stack::unique("lab");
            r.table = stack
                .create_table_partitioned(
                    &db,
                    0,
                    "toYYYYMMDD(toDate('2025-01-01') + intDiv(id, 32))",
                )
                .await?;
            r.spec.table = r.table.clone();
            // The fault here is the refusal (code 252), not a timeout: an
            // insert creating ~100 parts can take over the quick 3 s under
            // load (other scenarios beside it), and a baseline's retry of an
            // insert that did land would count as duplicates this scenario
            // does not inject. A client timeout the inserts meet, and the
            // fence that goes with it.
            r.spec.insert_timeout = r.spec.insert_timeout.max(Duration::from_secs(15));
            r.spec.fence_wait = r.spec.insert_timeout * 2 + Duration::from_secs(15);
            r.produce(0, n).await?;
            let sink = r.spec.spawn_self()?;
            let log = sink.log.clone();
            let mut cell = r.finish(scenario, vec![sink], n, Instant::now()).await?;
            cell.fault_injected =
                std::fs::read_to_string(&log)?.contains("ClickHouse takes fewer rows per insert");
            Ok(cell)
        }
        "recreated-topic" => {
            // The table holds the old topic's rows; the topic is deleted
            // and created again, and its new records start at offset 0,
            // under those rows. Exactly-once stops (exit 2, the documented
            // stop); the operator follows docs/operations.md's way on (the old rows
            // out, the group reset), and every new record lands once. Only
            // the new topic's records are counted.
            let old = n / 4;
            let new = n / 8;
            let r = Run::new(stack, mode, p, 0, false).await?;
            r.produce(0, old).await?;
            let mut sink = r.spec.spawn_self()?;
            r.wait_rows(&mut sink, old).await?;
            sink.stop(Duration::from_secs(60));
            r.stack.recreate_topic(&r.spec.topic, PARTITIONS).await?;
            r.produce(old, new).await?;
            // Exactly-once stops on the table's rows past the log's end.
            // The baselines do not look at the table: with the group's
            // commits gone with the old topic, they read the new log from
            // its start.
            let mut sink = r.spec.spawn_self()?;
            let deadline = Instant::now() + r.params.timeout;
            while sink.is_running() && r.rows().await? < old + new && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let exactly_once = r.spec.delivery == "exactly-once";
            let stopped = if exactly_once {
                let said = std::fs::read_to_string(&sink.log)?
                    .contains("ClickHouse holds rows up to offset");
                let stopped = !sink.is_running() && sink.exit_code() == Some(2) && said;
                sink.stop(Duration::from_secs(30));
                anyhow::ensure!(
                    r.rows().await? == old,
                    "recreated-topic: rows landed before the operator moved the old ones out"
                );
                r.move_out_old_rows(old).await?;
                r.stack
                    .reset_to_earliest(&r.spec.group, &r.spec.topic, PARTITIONS)?;
                sink = r.spec.spawn_self()?;
                stopped
            } else {
                r.move_out_old_rows(old).await?;
                true
            };
            let mut cell = r.finish(scenario, vec![sink], new, Instant::now()).await?;
            cell.fault_injected = stopped;
            Ok(cell)
        }
        "slow-body" => {
            // The first insert's head and the first bytes of its body reach
            // the server at once, the rest past the client's timeout while
            // its owner is killed; a new owner writes the partition in
            // other batches. The old body must commit nothing.
            let n = n / 4;
            let mut r = Run::new(stack, mode, p, 0, true).await?;
            r.produce(0, n).await?;
            let proxy = r.proxy.as_ref().context("proxy")?;
            proxy.arm(Fault::SlowBody);
            let mut a = r.spec.spawn_self()?;
            let deadline = Instant::now() + p.timeout;
            while proxy.fired() == 0 && Instant::now() < deadline && a.is_running() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            a.kill9();
            r.spec.max_batch_rows = 700;
            let b = r.spec.spawn_self()?;
            let proxy = r.proxy.as_ref().context("proxy")?;
            while proxy.late_pending() > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            r.finish(scenario, vec![b], n, Instant::now()).await
        }
        "clock-step" => {
            // A ClickHouse of the lab's own whose clock steps back a minute
            // while the sink runs, and every 7th insert delivered after the
            // client gave up: deadlines counted on the old clock would let
            // a late attempt start a minute after its fence.
            let clock = std::env::temp_dir().join(Stack::unique("lab_clock"));
            std::fs::write(&clock, "0")?;
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let dir = std::env::temp_dir().join(Stack::unique("lab_chdb"));
            let server = super::fixture::PrivateClickHouse::start(
                port,
                dir,
                &[format!("--clock-file={}", clock.display())],
            )
            .context("clock-step needs the stack's test server, whose clock can be stepped")?;
            let own = Stack {
                brokers: stack.brokers.clone(),
                clickhouse_url: server.url(),
            };
            let r = Run::new(&own, mode, p, 0, true).await?;
            r.produce(0, n / 2).await?;
            let proxy = r.proxy.as_ref().context("proxy")?;
            proxy.late_every(7);
            let mut sink = r.spec.spawn_self()?;
            r.wait_rows(&mut sink, n / 8).await?;
            std::fs::write(&clock, "-60000")?;
            r.produce(n / 2, n - n / 2).await?;
            let deadline = Instant::now() + p.timeout;
            while r.stack.landed(&r.table).await?.distinct_ids < n
                && Instant::now() < deadline
                && sink.is_running()
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            proxy.late_every(0);
            while proxy.late_pending() > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let mut cell = r.finish(scenario, vec![sink], n, Instant::now()).await?;
            cell.fault_injected &= std::fs::read_to_string(&clock)? == "-60000";
            drop(r);
            drop(server);
            let _ = std::fs::remove_file(&clock);
            Ok(cell)
        }
        other => bail!(
            "unknown scenario {other:?}; known: {}",
            SCENARIOS.join(", ")
        ),
    }
}
