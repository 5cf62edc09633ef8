//! The lab's view of the stack: fresh topics and tables, a producer,
//! brokers of its own, and the counts every verdict comes from.
//!
//! Every number the lab reports is read here from ClickHouse
//! (`count()`, `uniqExact(_partition, _offset)`, `uniqExact(id)`) or from
//! the broker; none comes from the sink's own logs.

use anyhow::{anyhow, Context};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;
use serde::Serialize;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The `_topic` of the rows [`Stack::other_writer`] inserts.
pub const OTHER_WRITER: &str = "other-writer";

/// Where the lab runs: a broker and a ClickHouse HTTP endpoint.
#[derive(Debug, Clone)]
pub struct Stack {
    pub brokers: String,
    pub clickhouse_url: String,
}

/// What landed in a table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Landed {
    pub rows: u64,
    pub distinct_offsets: u64,
    pub distinct_ids: u64,
}

impl Stack {
    /// A name unique to this process and call.
    pub fn unique(prefix: &str) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() % 100_000_000);
        let n = N.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}_{}_{t}_{n}", std::process::id())
    }

    pub fn ch(&self) -> clickhouse::Client {
        sluice::ch::client(&sluice::config::ClickHouseConfig::at(
            self.clickhouse_url.clone(),
        ))
    }

    pub async fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .create()?;
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        for r in admin
            .create_topics(
                &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
                &opts,
            )
            .await?
        {
            r.map_err(|(t, e)| anyhow!("creating topic {t}: {e}"))?;
        }
        Ok(())
    }

    /// Deletes `topic` and creates it again with `partitions`, retrying
    /// while the broker still finishes the deletion.
    pub async fn recreate_topic(&self, topic: &str, partitions: i32) -> anyhow::Result<()> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .create()?;
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        for r in admin.delete_topics(&[topic], &opts).await? {
            r.map_err(|(t, e)| anyhow!("deleting topic {t}: {e}"))?;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
            match admin.create_topics(&[new], &opts).await?.remove(0) {
                Ok(_) => return Ok(()),
                Err((_, e)) if Instant::now() > deadline => {
                    anyhow::bail!("recreating topic {topic}: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }

    /// `kafka-consumer-groups --reset-offsets --to-earliest` for a group
    /// with no member: commits offset 0 on every partition of `topic`.
    pub fn reset_to_earliest(
        &self,
        group: &str,
        topic: &str,
        partitions: i32,
    ) -> anyhow::Result<()> {
        use rdkafka::consumer::CommitMode;
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", group)
            .create()?;
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, rdkafka::Offset::Offset(0))?;
        }
        c.commit(&tpl, CommitMode::Sync)?;
        Ok(())
    }

    /// Creates `db.events` with the metadata columns and the watermark
    /// projection; `window` is the table's `non_replicated_deduplication_window`.
    pub async fn create_table(&self, db: &str, window: u32) -> anyhow::Result<String> {
        self.create_table_partitioned(db, window, "tuple()").await
    }

    /// [`Self::create_table`], with `PARTITION BY partition_by`.
    pub async fn create_table_partitioned(
        &self,
        db: &str,
        window: u32,
        partition_by: &str,
    ) -> anyhow::Result<String> {
        let ch = self.ch();
        ch.query(&format!("CREATE DATABASE IF NOT EXISTS {db}"))
            .execute()
            .await?;
        ch.query(&format!(
            "CREATE TABLE {db}.events (
                id UInt64, payload String,
                _topic LowCardinality(String), _partition UInt32, _offset UInt64,
                PROJECTION watermark (SELECT _topic, _partition, max(_offset) GROUP BY _topic, _partition)
            ) ENGINE = MergeTree PARTITION BY {partition_by} ORDER BY (_topic, _partition, _offset)
            SETTINGS non_replicated_deduplication_window = {window},
                     deduplicate_merge_projection_mode = 'rebuild'"
        ))
        .execute()
        .await
        .with_context(|| format!("creating {db}.events"))?;
        Ok(format!("{db}.events"))
    }

    /// Produces `n` records with ids `start..start + n`, round-robin over
    /// `partitions`, and waits until the broker acknowledged all of them.
    pub fn produce(&self, topic: &str, partitions: i32, start: u64, n: u64) -> anyhow::Result<()> {
        self.produce_framed(topic, partitions, start, n, None)
    }

    /// [`Self::produce`], each record written with `framing` when given
    /// (Avro or Protobuf in the registry's wire format).
    pub fn produce_framed(
        &self,
        topic: &str,
        partitions: i32,
        start: u64,
        n: u64,
        framing: Option<&sluice::send::framing::Framing>,
    ) -> anyhow::Result<()> {
        let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("enable.idempotence", "true")
            .set("linger.ms", "20")
            .set("queue.buffering.max.messages", "1000000")
            .create()?;
        let pad = "x".repeat(60);
        for i in start..start + n {
            let text = format!(r#"{{"id":{i},"payload":"{pad}"}}"#);
            let value = match framing {
                Some(f) => f
                    .frame(&text)
                    .map_err(|e| anyhow!("framing record {i}: {e}"))?,
                None => text.into_bytes(),
            };
            let mut rec = BaseRecord::<(), [u8]>::to(topic)
                .payload(&value)
                .partition((i % partitions as u64) as i32);
            loop {
                match producer.send(rec) {
                    Ok(()) => break,
                    Err((
                        rdkafka::error::KafkaError::MessageProduction(
                            rdkafka::types::RDKafkaErrorCode::QueueFull,
                        ),
                        r,
                    )) => {
                        rec = r;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err((e, _)) => return Err(anyhow!("producing to {topic}: {e}")),
                }
            }
        }
        producer.flush(Duration::from_secs(120))?;
        Ok(())
    }

    /// Another writer of `table`, as a production table has: `blocks`
    /// one-row INSERTs, one every 200 ms. Each is a block of its own in the
    /// insert dedup window, and moves it on. Its rows carry `_topic =`
    /// [`OTHER_WRITER`], and the counts leave them out.
    pub async fn other_writer(&self, table: &str, blocks: u64) -> anyhow::Result<()> {
        let ch = self
            .ch()
            .with_setting("async_insert", "0")
            .with_setting("insert_deduplicate", "1");
        // Plain inserts, as an application's: ClickHouse 26.x records an
        // INSERT SELECT in the dedup window only when its SELECT is stable.
        for i in 0..blocks {
            let row = format!(
                r#"{{"id":{i},"payload":"filler","_topic":"{OTHER_WRITER}","_partition":0,"_offset":{i}}}"#
            );
            let mut insert =
                ch.insert_formatted_with(format!("INSERT INTO {table} FORMAT JSONEachRow"));
            insert
                .send(bytes::Bytes::from(row + "\n"))
                .await
                .with_context(|| format!("another writer's insert into {table}"))?;
            insert
                .end()
                .await
                .with_context(|| format!("another writer's insert into {table}"))?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    pub async fn landed(&self, table: &str) -> anyhow::Result<Landed> {
        let (rows, distinct_offsets, distinct_ids) = self
            .ch()
            .query(&format!(
                "SELECT count(), uniqExact(_partition, _offset), uniqExact(id) FROM {table} \
                 WHERE _topic != '{OTHER_WRITER}'"
            ))
            .fetch_one::<(u64, u64, u64)>()
            .await
            .with_context(|| format!("counting {table}"))?;
        Ok(Landed {
            rows,
            distinct_offsets,
            distinct_ids,
        })
    }

    /// Whether `group` has committed the end of every partition of `topic`:
    /// the sink has read, and made durable, everything there is.
    pub async fn caught_up(
        &self,
        group: &str,
        topic: &str,
        partitions: i32,
    ) -> anyhow::Result<bool> {
        let (brokers, group, topic) = (self.brokers.clone(), group.to_string(), topic.to_string());
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .set("group.id", &group)
                .create()?;
            let mut tpl = rdkafka::TopicPartitionList::new();
            for p in 0..partitions {
                tpl.add_partition(&topic, p);
            }
            let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
            for p in 0..partitions {
                let (_, high) = consumer.fetch_watermarks(&topic, p, Duration::from_secs(10))?;
                let at = committed
                    .find_partition(&topic, p)
                    .and_then(|e| e.offset().to_raw())
                    .unwrap_or(-1);
                if at < high {
                    return Ok(false);
                }
            }
            Ok(true)
        })
        .await?
    }

    /// Waits until the sinks of `group` have committed the end of `topic`
    /// and `table` has been still for `settle` (or `timeout` passed).
    /// Returns the count and when every one of `want` ids had first landed.
    pub async fn quiesce(
        &self,
        table: &str,
        (group, topic, partitions): (&str, &str, i32),
        want: u64,
        settle: Duration,
        timeout: Duration,
    ) -> anyhow::Result<(Landed, Option<Instant>)> {
        let deadline = Instant::now() + timeout;
        let mut complete_at = None;
        let mut last = self.landed(table).await?;
        let mut still_since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let now = self.landed(table).await?;
            if now.distinct_ids >= want && complete_at.is_none() {
                complete_at = Some(Instant::now());
            }
            if now != last {
                last = now;
                still_since = Instant::now();
            }
            let settled = still_since.elapsed() >= settle;
            if Instant::now() > deadline
                || (complete_at.is_some()
                    && settled
                    && self.caught_up(group, topic, partitions).await?)
            {
                return Ok((last, complete_at));
            }
        }
    }
}

/// A broker of the lab's own: an Apache Kafka node (`SLUICE_STACK_KAFKA_NODE`,
/// `scripts/kafka-node.sh`) on free loopback ports with its own log
/// directory, so it can be stopped, killed and started again without
/// disturbing anything else. Its log is `kafka.log` in that directory, kept
/// in `SLUICE_LAB_BROKER_LOGS` (a directory) when that is set.
pub struct PrivateBroker {
    node: std::path::PathBuf,
    dir: std::path::PathBuf,
    port: u16,
    controller_port: u16,
    /// The address clients are told to use (a proxy's), if not its own.
    advertised: Option<String>,
    child: Option<std::process::Child>,
}

impl PrivateBroker {
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_advertising(None).await
    }

    /// Starts a broker that tells clients to connect to `advertised`
    /// (`host:port`, a proxy in front of it) instead of its own port.
    pub async fn start_advertising(advertised: Option<String>) -> anyhow::Result<Self> {
        let node = std::env::var_os("SLUICE_STACK_KAFKA_NODE").context(
            "SLUICE_STACK_KAFKA_NODE is not set: the lab runs brokers of its own (make stack prints it)",
        )?;
        let free = || -> std::io::Result<u16> {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port())
        };
        // A free port can be taken by another process before the node
        // binds it: a node that exits at its first start is tried again,
        // afresh, on other ports.
        let mut tries = 0;
        loop {
            let dir = std::env::temp_dir().join(Stack::unique("lab_broker"));
            std::fs::create_dir_all(&dir)?;
            let mut b = Self {
                node: node.clone().into(),
                dir,
                port: free()?,
                controller_port: free()?,
                advertised: advertised.clone(),
                child: None,
            };
            match b.resume().await {
                Ok(()) => return Ok(b),
                Err(e) if tries < 2 => {
                    tries += 1;
                    eprintln!("lab: {e:#}; starting it again on other ports");
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts the broker process (the log directory survives a halt) and
    /// waits until a Metadata request answers with the broker in it.
    pub async fn resume(&mut self) -> anyhow::Result<()> {
        let log = self.dir.join("kafka.log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening the broker log {}", log.display()))?;
        // A Java broker's start costs a few CPU seconds; a dozen starting
        // at once on a small machine (the lab's scenarios side by side, the
        // tests beside them) took over a minute each. At most two start at
        // once, across processes; the wait for a slot is not the broker's.
        let _slot = start_slot().await?;
        let mut cmd = std::process::Command::new(&self.node);
        // Short-lived nodes: the quick-starting compiler over peak speed.
        if std::env::var_os("SLUICE_STACK_KAFKA_OPTS").is_none() {
            cmd.env("SLUICE_STACK_KAFKA_OPTS", "-XX:TieredStopAtLevel=1");
        }
        cmd.arg(&self.dir)
            .arg(self.port.to_string())
            .arg(self.controller_port.to_string());
        if let Some(a) = &self.advertised {
            cmd.arg(a);
        }
        let child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", self.node.display()))?;
        super::children::started(child.id());
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(c) = &mut self.child {
                if let Ok(Some(status)) = c.try_wait() {
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(5).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    anyhow::bail!(
                        "the lab's broker on port {} exited ({status}); the end of its log:\n{}",
                        self.port,
                        tail.join("\n")
                    );
                }
            }
            if self.answers().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "the lab's broker did not answer on port {} within 60 s; see {}",
                    self.port,
                    log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether a Metadata request (v0, all topics) on the broker's own port
    /// is answered naming a broker. Raw bytes, not a client: a client would
    /// go on to the advertised address, a proxy that may not run yet.
    async fn answers(&self) -> bool {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let ask = async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
            // api_key 3, version 0, correlation id 7, client id "ready", no topics.
            let mut req = vec![0, 0, 0, 19, 0, 3, 0, 0, 0, 0, 0, 7, 0, 5];
            req.extend_from_slice(b"ready");
            req.extend_from_slice(&[0, 0, 0, 0]);
            s.write_all(&req).await?;
            let mut head = [0u8; 12];
            s.read_exact(&mut head).await?;
            let corr = i32::from_be_bytes([head[4], head[5], head[6], head[7]]);
            let brokers = i32::from_be_bytes([head[8], head[9], head[10], head[11]]);
            std::io::Result::Ok(corr == 7 && brokers >= 1)
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(2), ask).await,
            Ok(Ok(true))
        )
    }

    /// Stops the broker (SIGTERM: a controlled shutdown; SIGKILL after
    /// 30 s) and waits for it to exit.
    pub fn halt(&mut self) {
        self.signal("-TERM", Duration::from_secs(30));
    }

    /// Kills the broker with SIGKILL, as a crash does: no controlled
    /// shutdown, nothing flushed; its log is recovered on [`Self::resume`].
    pub fn kill(&mut self) {
        self.signal("-KILL", Duration::from_secs(10));
    }

    fn signal(&mut self, sig: &str, grace: Duration) {
        if let Some(mut c) = self.child.take() {
            let _ = std::process::Command::new("kill")
                .args([sig, &c.id().to_string()])
                .status();
            let deadline = Instant::now() + grace;
            super::process::off_the_runtime(|| {
                while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(100));
                }
                let _ = c.kill();
                let _ = c.wait();
            });
        }
    }
}

/// One of the machine's two broker start slots (a file lock in the temp
/// directory, held until the returned file is dropped), once one is free.
async fn start_slot() -> anyhow::Result<std::fs::File> {
    loop {
        for i in 0..2 {
            let path = std::env::temp_dir().join(format!("sluice-broker-start-{i}.lock"));
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            if f.try_lock().is_ok() {
                return Ok(f);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        self.halt();
        if let Some(keep) = std::env::var_os("SLUICE_LAB_BROKER_LOGS") {
            let to = std::path::Path::new(&keep).join(format!("kafka-{}.log", self.port));
            let _ = std::fs::copy(self.dir.join("kafka.log"), to);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private ClickHouse engine behind the stack's HTTP server
/// (`SLUICE_CHDB_SERVER`, run by `SLUICE_CHDB_PYTHON`), on its own port and
/// data directory: it can be stopped, or its clock stepped
/// (`--clock-file`), without disturbing anything else. Stopped and its
/// directory removed when dropped.
pub struct PrivateClickHouse {
    child: Option<std::process::Child>,
    port: u16,
    dir: std::path::PathBuf,
}

impl PrivateClickHouse {
    /// `args`: more arguments of `stack/chdb_server.py` (`--profile`,
    /// `--clock-file`).
    pub fn start(port: u16, dir: std::path::PathBuf, args: &[String]) -> anyhow::Result<Self> {
        let python = std::env::var("SLUICE_CHDB_PYTHON")
            .context("SLUICE_CHDB_PYTHON is not set: run `make test` or `make stack`")?;
        let server = std::env::var("SLUICE_CHDB_SERVER")
            .context("SLUICE_CHDB_SERVER is not set: run `make test` or `make stack`")?;
        std::fs::create_dir_all(&dir)?;
        let child = std::process::Command::new(python)
            .arg(server)
            .arg("--path")
            .arg(&dir)
            .args(["--port", &port.to_string()])
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting a private ClickHouse server")?;
        super::children::started(child.id());
        let me = Self {
            child: Some(child),
            port,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the private ClickHouse server on port {port} did not start within 60 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(me)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops the server (SIGTERM, then SIGKILL after 20 s); its data stays.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            super::process::off_the_runtime(|| {
                while matches!(c.try_wait(), Ok(None)) {
                    if Instant::now() > deadline {
                        let _ = c.kill();
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
    }
}

impl Drop for PrivateClickHouse {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
