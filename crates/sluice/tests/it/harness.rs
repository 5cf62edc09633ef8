//! Test fixtures: the stack's addresses, topics, tables, a producer, sink
//! processes and the queries that count duplicates and losses.

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub fn brokers() -> String {
    std::env::var("KAFKA_BROKERS")
        .expect("KAFKA_BROKERS is not set: the stack is missing (run `make test`, or `make stack` and export its lines)")
}

pub fn clickhouse_url() -> String {
    std::env::var("CLICKHOUSE_URL")
        .expect("CLICKHOUSE_URL is not set: the stack is missing (run `make test`, or `make stack` and export its lines)")
}

/// A name unique to this test run and call.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        t % 100_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub async fn create_topic(name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .expect("admin client");
    let res = admin
        .create_topics(
            &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("create_topics");
    for r in res {
        r.unwrap_or_else(|e| panic!("creating topic {name}: {e:?}"));
    }
}

/// Produces `n` JSON records round-robin over `partitions`; record `i` has
/// `id = start + i`.
pub fn produce(topic: &str, partitions: i32, start: u64, n: u64) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("producer");
    let pad = "x".repeat(60);
    for i in start..start + n {
        let value = format!(r#"{{"id":{i},"payload":"{pad}"}}"#);
        let p = (i % partitions as u64) as i32;
        let mut rec = BaseRecord::<(), str>::to(topic)
            .payload(&value)
            .partition(p);
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((e, r)) => {
                    assert!(
                        matches!(
                            e,
                            rdkafka::error::KafkaError::MessageProduction(
                                rdkafka::types::RDKafkaErrorCode::QueueFull
                            )
                        ),
                        "produce: {e}"
                    );
                    rec = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(120)).expect("flush");
}

pub fn ch() -> clickhouse::Client {
    ch_at(&clickhouse_url())
}

pub fn ch_at(url: &str) -> clickhouse::Client {
    clickhouse::Client::default()
        .with_url(url)
        .with_validation(false)
}

pub async fn exec(client: &clickhouse::Client, sql: &str) {
    client
        .query(sql)
        .execute()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Creates a database and the test table in it; returns `db.table`.
pub async fn create_table(client: &clickhouse::Client, db: &str) -> String {
    exec(client, &format!("CREATE DATABASE IF NOT EXISTS {db}")).await;
    exec(
        client,
        &format!(
            "CREATE TABLE {db}.events (
                id UInt64,
                payload String,
                _topic LowCardinality(String),
                _partition UInt32,
                _offset UInt64,
                PROJECTION watermark (SELECT _topic, _partition, max(_offset) GROUP BY _topic, _partition)
            ) ENGINE = MergeTree ORDER BY (_topic, _partition, _offset)
            SETTINGS non_replicated_deduplication_window = 0, deduplicate_merge_projection_mode = 'rebuild'"
        ),
    )
    .await;
    format!("{db}.events")
}

/// A fresh topic with `partitions` partitions and `n` records in it, and a
/// fresh table: `(topic, table, client)`.
pub async fn setup(prefix: &str, partitions: i32, n: u64) -> (String, String, clickhouse::Client) {
    let topic = unique(prefix);
    create_topic(&topic, partitions).await;
    let ch = ch();
    let table = create_table(&ch, &unique("it")).await;
    if n > 0 {
        let t = topic.clone();
        tokio::task::spawn_blocking(move || produce(&t, partitions, 0, n))
            .await
            .unwrap();
    }
    (topic, table, ch)
}

/// What landed: rows, distinct `(partition, offset)`, distinct ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landed {
    pub rows: u64,
    pub distinct_offsets: u64,
    pub distinct_ids: u64,
}

impl Landed {
    pub fn duplicates(&self) -> u64 {
        self.rows - self.distinct_offsets
    }

    /// The later of two counts (rows only grow).
    pub fn max_rows(self, other: Landed) -> Landed {
        if self.rows >= other.rows {
            self
        } else {
            other
        }
    }
}

pub async fn landed(client: &clickhouse::Client, table: &str) -> Landed {
    let (rows, distinct_offsets, distinct_ids): (u64, u64, u64) = client
        .query(&format!(
            "SELECT count(), uniqExact(_partition, _offset), uniqExact(id) FROM {table}"
        ))
        .fetch_one()
        .await
        .unwrap_or_else(|e| panic!("counting {table}: {e}"));
    Landed {
        rows,
        distinct_offsets,
        distinct_ids,
    }
}

/// Ids in `0..n` that are not in the table.
pub async fn missing_ids(client: &clickhouse::Client, table: &str, n: u64) -> u64 {
    client
        .query(&format!(
            "SELECT {n} - uniqExact(id) FROM {table} WHERE id < {n}"
        ))
        .fetch_one::<u64>()
        .await
        .unwrap()
}

/// Waits until the table holds `want` distinct offsets, or the timeout.
pub async fn wait_for(
    client: &clickhouse::Client,
    table: &str,
    want: u64,
    timeout: Duration,
) -> Landed {
    let deadline = Instant::now() + timeout;
    loop {
        let l = landed(client, table).await;
        if l.distinct_offsets >= want || Instant::now() > deadline {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A consumer that sits in a group, subscribed to a topic of its own, and
/// heartbeats. tansu 0.6 evicts dead members only while handling some
/// member's heartbeat; after a kill -9 of the group leader, the survivors
/// loop in JoinGroup/SyncGroup (no heartbeats) and the group never
/// recovers. This member's heartbeats let the broker evict the dead one, as
/// a real Kafka coordinator does on its own. It takes no partitions of the
/// sink's topics.
pub struct GroupKeepalive {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GroupKeepalive {
    pub async fn start(group: &str) -> Self {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let topic = unique("keepalive");
        create_topic(&topic, 1).await;
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("group.id", group)
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500")
            .create()
            .expect("keepalive consumer");
        consumer.subscribe(&[&topic]).expect("keepalive subscribe");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let _ = consumer.poll(Duration::from_millis(100));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for GroupKeepalive {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Settings for one sink process.
#[derive(Debug, Clone)]
pub struct SinkSpec {
    pub topic: String,
    pub table: String,
    pub group: String,
    pub clickhouse_url: String,
    pub brokers: String,
    pub delivery: &'static str,
    pub max_batch_rows: usize,
    pub insert_timeout_s: u64,
    pub fence_wait_ms: u64,
    pub commit_interval_ms: u64,
    pub max_buffered_mb: usize,
    /// Static membership id, for restarts that take the partitions back.
    pub instance_id: Option<String>,
}

impl SinkSpec {
    pub fn new(topic: &str, table: &str) -> Self {
        Self {
            topic: topic.into(),
            table: table.into(),
            group: unique("g"),
            clickhouse_url: clickhouse_url(),
            brokers: brokers(),
            delivery: "exactly-once",
            max_batch_rows: 10_000,
            insert_timeout_s: 5,
            fence_wait_ms: 6_000,
            commit_interval_ms: 1_000,
            max_buffered_mb: 64,
            instance_id: None,
        }
    }

    fn write(&self) -> PathBuf {
        let dir = std::env::temp_dir().join(unique("sluice_cfg"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sluice.toml");
        std::fs::write(
            &path,
            format!(
                r#"
[kafka]
brokers = "{brokers}"
group_id = "{group}"
{instance}
session_timeout = "6s"
heartbeat_interval = "1s"

[clickhouse]
url = "{url}"
insert_timeout = "{it}s"

[sink]
delivery = "{delivery}"
max_batch_rows = {rows}
max_batch_age = "200ms"
max_batch_bytes = 4194304
max_buffered_bytes = {buf}
commit_interval = "{ci}ms"
fence_wait = "{fw}ms"

[[route]]
topic = "{topic}"
table = "{table}"
"#,
                brokers = self.brokers,
                group = self.group,
                instance = self
                    .instance_id
                    .as_ref()
                    .map_or(String::new(), |i| format!("instance_id = \"{i}\"")),
                url = self.clickhouse_url,
                it = self.insert_timeout_s,
                delivery = self.delivery,
                rows = self.max_batch_rows,
                buf = self.max_buffered_mb << 20,
                ci = self.commit_interval_ms,
                fw = self.fence_wait_ms,
                topic = self.topic,
                table = self.table,
            ),
        )
        .unwrap();
        path
    }

    pub fn start(&self) -> Sink {
        let cfg = self.write();
        let log = cfg.with_extension("log");
        let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["run", "--config"])
            .arg(&cfg)
            .env("SLUICE_LOG", "info,sluice=info")
            .env_remove("KAFKA_BROKERS")
            .env_remove("CLICKHOUSE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting sluice");
        Sink {
            child: Some(child),
            log,
        }
    }
}

/// A running `sluice run` process; killed on drop.
pub struct Sink {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Sink {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {sig}");
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn stop(&mut self, timeout: Duration) -> std::process::ExitStatus {
        self.signal("-TERM");
        let mut c = self.child.take().expect("running");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!(
                    "sluice did not stop within {timeout:?}; log: {}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The exit code once the process has ended.
    pub fn exit_code(&mut self) -> Option<i32> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
            .and_then(|s| s.code())
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    pub fn rss_kb(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            })
            .unwrap_or(0)
    }

    pub fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
