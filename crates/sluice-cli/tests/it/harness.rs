//! Test fixtures: the stack's addresses, topics, tables, a producer, sink
//! processes and the queries that count duplicates and losses.

pub use sluice_lab::fixture::PrivateClickHouse;
use sluice_lab::fixture::{PrivateBroker, Stack};
use sluice_lab::process::SinkProcess;
pub use sluice_lab::process::SinkSpec;
use std::time::{Duration, Instant};

pub fn brokers() -> String {
    std::env::var("KAFKA_BROKERS")
        .expect("KAFKA_BROKERS is not set: the stack is missing (run `make test`, or `make stack` and export its lines)")
}

pub fn clickhouse_url() -> String {
    std::env::var("CLICKHOUSE_URL")
        .expect("CLICKHOUSE_URL is not set: the stack is missing (run `make test`, or `make stack` and export its lines)")
}

/// `sluice ARGS`, pointed at the stack (`KAFKA_BROKERS`, `CLICKHOUSE_URL`):
/// the one way tests run the binary. Tests that must not see the stack
/// remove the variables from the returned command.
pub fn sluice<I, S>(args: I) -> std::process::Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args(args)
        .env("KAFKA_BROKERS", brokers())
        .env("CLICKHOUSE_URL", clickhouse_url())
        .env("SLUICE_LOG", "warn");
    cmd
}

/// What a finished `sluice` command left.
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` to its end.
pub fn run(cmd: &mut std::process::Command) -> Ran {
    let out = cmd.output().expect("running sluice");
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `GET path` on `addr` with hyper's client; returns (status, body).
pub async fn get(addr: &str, path: &str) -> (u16, String) {
    use http_body_util::{BodyExt, Empty};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<bytes::Bytes>>();
    let uri = format!("http://{addr}{path}").parse().expect("a URI");
    let resp = client
        .get(uri)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The stack as the lab's fixtures see it; topics and producers come from
/// there.
pub fn stack() -> Stack {
    Stack {
        brokers: brokers(),
        clickhouse_url: clickhouse_url(),
    }
}

/// A name unique to this test run and call.
pub fn unique(prefix: &str) -> String {
    Stack::unique(prefix)
}

pub async fn create_topic(name: &str, partitions: i32) {
    stack()
        .create_topic(name, partitions)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
}

/// Produces `n` JSON records round-robin over `partitions`; record `i` has
/// `id = start + i`.
pub fn produce(topic: &str, partitions: i32, start: u64, n: u64) {
    stack()
        .produce(topic, partitions, start, n)
        .unwrap_or_else(|e| panic!("{e:#}"));
}

/// A fault-injecting proxy in front of the stack's ClickHouse; `hold` is
/// how long its holding faults hold.
pub async fn clickhouse_proxy(hold: Duration) -> sluice_lab::proxy::Proxy {
    use sluice_lab::proxy::Proxy;
    Proxy::start(Proxy::upstream_of(&clickhouse_url()), hold)
        .await
        .expect("starting a proxy in front of ClickHouse")
}

pub fn ch() -> clickhouse::Client {
    ch_at(&clickhouse_url())
}

pub fn ch_at(url: &str) -> clickhouse::Client {
    sluice::ch::client(&sluice::config::ClickHouseConfig::at(url.into()))
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
    setup_on(&stack(), prefix, partitions, n).await
}

/// [`setup`] with the topic on `kafka` (a test's own broker).
pub async fn setup_on(
    kafka: &Stack,
    prefix: &str,
    partitions: i32,
    n: u64,
) -> (String, String, clickhouse::Client) {
    let topic = unique(prefix);
    kafka
        .create_topic(&topic, partitions)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let ch = ch();
    let table = create_table(&ch, &unique("it")).await;
    if n > 0 {
        let (k, t) = (kafka.clone(), topic.clone());
        tokio::task::spawn_blocking(move || k.produce(&t, partitions, 0, n))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{e:#}"));
    }
    (topic, table, ch)
}

/// A broker of the test's own (an Apache Kafka node, as in the stack) and
/// the stack seen through it: for the tests that stop, kill or restart their
/// broker, or whose load should not reach the others'.
pub async fn own_kafka() -> (PrivateBroker, Stack) {
    let broker = PrivateBroker::start()
        .await
        .unwrap_or_else(|e| panic!("starting a broker of the test's own: {e:#}"));
    let kafka = Stack {
        brokers: broker.brokers(),
        clickhouse_url: clickhouse_url(),
    };
    (broker, kafka)
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

/// Starts a [`SinkSpec`] as `sluice run` with the binary under test.
pub trait StartSink {
    fn start(&self) -> Sink;
}

impl StartSink for SinkSpec {
    fn start(&self) -> Sink {
        self.spawn(env!("CARGO_BIN_EXE_sluice").as_ref())
            .expect("starting sluice")
    }
}

/// A running `sluice run` process; killed on drop.
pub type Sink = SinkProcess;

/// A port nothing listens on right now, on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits (up to `timeout`) until the sink's log says `what`.
pub async fn wait_for_log(sink: &Sink, what: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !std::fs::read_to_string(&sink.log)
        .unwrap_or_default()
        .contains(what)
    {
        assert!(
            Instant::now() < deadline,
            "never {what:?}: {}",
            sink.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits for the sink to exit; its exit code and log.
pub fn exit_of(mut sink: Sink, timeout: Duration) -> (Option<i32>, String) {
    let deadline = Instant::now() + timeout;
    while sink.is_running() {
        assert!(
            Instant::now() < deadline,
            "sluice kept running: {}",
            sink.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let code = sink.exit_code();
    (code, std::fs::read_to_string(&sink.log).unwrap())
}

/// The committed position of `group` on partition 0 of `topic`.
pub fn committed(brokers: &str, group: &str, topic: &str) -> Option<i64> {
    committed_in(brokers, group, topic, 0)
}

/// The committed position of `group` on `partition` of `topic`.
pub fn committed_in(brokers: &str, group: &str, topic: &str, partition: i32) -> Option<i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()
        .ok()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let got = c.committed_offsets(tpl, Duration::from_secs(10)).ok()?;
    match got.find_partition(topic, partition)?.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// A private ClickHouse engine (see the lab's fixture), started or the
/// test fails.
pub fn private_clickhouse(
    port: u16,
    dir: std::path::PathBuf,
    args: &[String],
) -> PrivateClickHouse {
    PrivateClickHouse::start(port, dir, args).unwrap_or_else(|e| panic!("{e:#}"))
}
