//! `sluice run` as a child process the lab can start, kill -9, freeze,
//! thaw and stop.
//!
//! [`SinkSpec`] is the one way to start a sink: its config file is written
//! with `toml` from sluice's own config types. Each run gets its own config
//! file and log under a scratch directory; the child is killed when its
//! handle is dropped, so the lab never leaves processes behind.

use anyhow::Context;
use sluice::config::{Delivery, RawConfig, RawRoute};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The settings of one `sluice run`: the one way tests and the lab start a
/// sink. [`Default`] holds what the tests run with (short timeouts, so a
/// killed member's partitions move on quickly); [`SinkSpec::new`] points it
/// at the stack (`KAFKA_BROKERS`, `CLICKHOUSE_URL`) with a group of its own.
#[derive(Debug, Clone)]
pub struct SinkSpec {
    pub brokers: String,
    pub clickhouse_url: String,
    pub topic: String,
    pub table: String,
    pub group: String,
    /// `[kafka] session_timeout`: how long the coordinator waits for a
    /// silent member.
    pub session_timeout: Duration,
    /// `exactly-once`, `at-least-once` or `token-only`.
    pub delivery: &'static str,
    pub max_batch_rows: usize,
    pub max_batch_bytes: usize,
    pub insert_timeout: Duration,
    pub fence_wait: Duration,
    pub commit_interval: Duration,
    pub max_batch_age: Duration,
    pub max_buffered_bytes: usize,
    /// Key-level dedup on this field (`dedup_key`), with a one-hour window.
    pub dedup_key: Option<String>,
    /// Serve `/metrics`, `/health` and `/ready` here.
    pub metrics_listen: Option<String>,
    /// Send records that cannot become rows to this topic.
    pub dlq_topic: Option<String>,
    /// Fields every record must have.
    pub required: Vec<String>,
    /// Larger record values cannot become rows.
    pub max_record_bytes: Option<usize>,
    /// `[kafka] auto_offset_reset` (`earliest` when unset).
    pub auto_offset_reset: Option<String>,
    /// `[kafka] instance_id`: static group membership.
    pub instance_id: Option<String>,
    /// `[clickhouse] settings` (of inserts) and `read_settings`.
    pub settings: Vec<(String, String)>,
    pub read_settings: Vec<(String, String)>,
    /// `[kafka] properties`: librdkafka settings passed through.
    pub kafka_properties: Vec<(String, String)>,
    /// The route's `format`: `json`, or `avro` / `protobuf` read through
    /// the registry at `schema_registry`.
    pub format: &'static str,
    pub schema_registry: Option<String>,
    /// The route's `extra_fields` (`ignore` when unset).
    pub extra_fields: Option<&'static str>,
    /// More arguments to `sluice run`.
    pub args: Vec<String>,
}

impl Default for SinkSpec {
    fn default() -> Self {
        Self {
            brokers: String::new(),
            clickhouse_url: String::new(),
            topic: String::new(),
            table: String::new(),
            group: String::new(),
            session_timeout: Duration::from_secs(6),
            delivery: "exactly-once",
            max_batch_rows: 10_000,
            max_batch_bytes: 4 << 20,
            insert_timeout: Duration::from_secs(5),
            fence_wait: Duration::from_secs(6),
            commit_interval: Duration::from_secs(1),
            max_batch_age: Duration::from_millis(200),
            max_buffered_bytes: 64 << 20,
            dedup_key: None,
            metrics_listen: None,
            dlq_topic: None,
            required: Vec::new(),
            max_record_bytes: None,
            auto_offset_reset: None,
            instance_id: None,
            settings: Vec::new(),
            read_settings: Vec::new(),
            kafka_properties: Vec::new(),
            format: "json",
            schema_registry: None,
            extra_fields: None,
            args: Vec::new(),
        }
    }
}

/// A running `sluice run`.
pub struct SinkProcess {
    child: Option<Child>,
    pub log: PathBuf,
    /// The config file it runs with.
    pub config: PathBuf,
}

impl SinkSpec {
    /// `topic` into `table` on the stack the environment names
    /// (`KAFKA_BROKERS`, `CLICKHOUSE_URL`), in a group of its own. Panics
    /// naming the variable when the stack is not there: a test that needs
    /// it fails, never skips.
    pub fn new(topic: &str, table: &str) -> Self {
        let stack = |var: &str| {
            std::env::var(var).unwrap_or_else(|_| {
                panic!("{var} is not set: start the stack (make stack) and export scripts/stack.sh env")
            })
        };
        Self {
            brokers: stack("KAFKA_BROKERS"),
            clickhouse_url: stack("CLICKHOUSE_URL"),
            topic: topic.into(),
            table: table.into(),
            group: super::fixture::Stack::unique("g"),
            ..Self::default()
        }
    }

    /// The config file this spec stands for, as sluice's own config types.
    pub fn config(&self) -> anyhow::Result<RawConfig> {
        let delivery = <Delivery as clap::ValueEnum>::from_str(self.delivery, false)
            .map_err(|e| anyhow::anyhow!("delivery {:?}: {e}", self.delivery))?;
        let pairs = |v: &[(String, String)]| v.iter().cloned().collect();
        let mut c = RawConfig::default();
        c.kafka.brokers = Some(self.brokers.clone());
        c.kafka.group_id = Some(self.group.clone());
        c.kafka.session_timeout = Some(self.session_timeout);
        c.kafka.heartbeat_interval = Some(Duration::from_secs(1));
        c.kafka.auto_offset_reset = self.auto_offset_reset.clone();
        c.kafka.instance_id = self.instance_id.clone();
        c.kafka.properties = pairs(&self.kafka_properties);
        c.clickhouse.url = Some(self.clickhouse_url.clone());
        c.clickhouse.insert_timeout = Some(self.insert_timeout);
        c.clickhouse.settings = pairs(&self.settings);
        c.clickhouse.read_settings = pairs(&self.read_settings);
        c.sink.delivery = Some(delivery);
        c.sink.max_batch_rows = Some(self.max_batch_rows);
        c.sink.max_batch_age = Some(self.max_batch_age);
        c.sink.max_batch_bytes = Some(self.max_batch_bytes);
        c.sink.max_record_bytes = self.max_record_bytes;
        c.sink.max_buffered_bytes = Some(self.max_buffered_bytes);
        c.sink.commit_interval = Some(self.commit_interval);
        c.sink.fence_wait = Some(self.fence_wait);
        c.metrics.listen = self.metrics_listen.clone();
        c.dlq.topic = self.dlq_topic.clone();
        c.schema_registry.url = self.schema_registry.clone();
        c.routes = vec![RawRoute {
            topic: self.topic.clone(),
            table: self.table.clone(),
            dedup_key: self.dedup_key.iter().cloned().collect(),
            dedup_window: self.dedup_key.as_ref().map(|_| Duration::from_secs(3600)),
            dedup_max_keys: None,
            required: self.required.clone(),
            format: Some(self.format.into()),
            subject: None,
            extra_fields: Some(self.extra_fields.unwrap_or("ignore").into()),
        }];
        Ok(c)
    }

    /// Starts the `sluice` binary at `exe` as `sluice run`, with this
    /// spec's config in a scratch directory of its own and its log beside it.
    pub fn spawn(&self, exe: &Path) -> anyhow::Result<SinkProcess> {
        let dir = std::env::temp_dir().join(super::fixture::Stack::unique("sluice_lab"));
        std::fs::create_dir_all(&dir)?;
        let cfg = dir.join("sluice.toml");
        std::fs::write(&cfg, toml::to_string(&self.config()?)?)?;
        let log = dir.join("sluice.log");
        let child = Command::new(exe)
            .args(["run", "--config"])
            .arg(&cfg)
            .args(&self.args)
            .env(
                "SLUICE_LOG",
                std::env::var("SLUICE_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env_remove("KAFKA_BROKERS")
            .env_remove("CLICKHOUSE_URL")
            .env_remove("SCHEMA_REGISTRY_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting sluice run")?;
        super::children::started(child.id());
        Ok(SinkProcess {
            child: Some(child),
            log,
            config: cfg,
        })
    }

    /// Starts this very binary (`sluice lab`) as `sluice run`.
    pub fn spawn_self(&self) -> anyhow::Result<SinkProcess> {
        let exe = std::env::current_exe().context("locating the sluice binary")?;
        self.spawn(&exe)
    }
}

impl SinkProcess {
    /// The process id (0 once it was reaped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// The exit code, once the process has ended on its own.
    pub fn exit_code(&mut self) -> Option<i32> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
            .and_then(|s| s.code())
    }

    /// Resident memory in KiB, from /proc.
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

    /// The last lines of the log, for error messages.
    /// The log's last 40 lines other than the periodic progress lines, then
    /// the last progress line: what a failing test prints.
    pub fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let is_progress = |l: &&str| l.contains(" progress records=");
        let mut lines: Vec<&str> = s.lines().filter(|l| !is_progress(l)).collect();
        lines.drain(..lines.len().saturating_sub(40));
        lines.extend(s.lines().rev().find(is_progress));
        lines.join("\n")
    }

    /// Sends a signal (`-TERM`, `-STOP`, …) with kill(1).
    pub fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args([sig, &c.id().to_string()])
                .status();
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    /// Whether the process is still running (false once it exited on its own).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Waits until the log mentions `what` (or the timeout).
    pub async fn wait_for_log(&mut self, what: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline && self.is_running() {
            if std::fs::read_to_string(&self.log).is_ok_and(|s| s.contains(what)) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// SIGTERM, then waits; true if it exited cleanly in time.
    pub fn stop(&mut self, timeout: Duration) -> bool {
        self.signal("-TERM");
        let Some(mut c) = self.child.take() else {
            return false;
        };
        let deadline = Instant::now() + timeout;
        off_the_runtime(|| loop {
            match c.try_wait() {
                Ok(Some(s)) => return s.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                _ => {
                    let _ = c.kill();
                    let _ = c.wait();
                    return false;
                }
            }
        })
    }
}

/// Runs a wait that blocks (for a process to exit) without holding up the
/// tasks of a multi-threaded runtime it is called on: the lab's proxies and
/// the cells beside this one keep running meanwhile (a current-thread
/// runtime, or none, just waits).
pub(crate) fn off_the_runtime<R>(wait: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    }
}

impl Drop for SinkProcess {
    fn drop(&mut self) {
        self.thaw();
        self.kill9();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice::config::Overrides;

    /// What the spec writes is a file sluice loads, with the spec's values.
    #[test]
    fn the_written_config_loads_with_the_specs_values() {
        let spec = SinkSpec {
            brokers: "127.0.0.1:1".into(),
            clickhouse_url: "http://127.0.0.1:2".into(),
            topic: "t".into(),
            table: "db.t".into(),
            group: "g".into(),
            delivery: "token-only",
            max_batch_rows: 7,
            fence_wait: Duration::from_millis(1_500),
            dedup_key: Some("id".into()),
            dlq_topic: Some("dlq".into()),
            settings: vec![("a b".into(), "it's \"quoted\"".into())],
            extra_fields: Some("dlq"),
            ..SinkSpec::default()
        };
        let text = toml::to_string(&spec.config().unwrap()).unwrap();
        let cfg = RawConfig::from_toml(&text)
            .and_then(|c| c.validate(Overrides::default()))
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(cfg.sink.delivery, Delivery::TokenOnly);
        assert_eq!(cfg.sink.limits.max_rows, 7);
        assert_eq!(cfg.sink.fence_wait, Duration::from_millis(1_500));
        assert_eq!(cfg.dlq.as_deref(), Some("dlq"));
        let route = &cfg.routes[0];
        assert_eq!((route.database.as_str(), route.table.as_str()), ("db", "t"));
        assert!(route.extra_to_dlq);
        assert_eq!(route.dedup.as_ref().unwrap().fields, ["id"]);
        assert_eq!(cfg.clickhouse.settings["a b"], "it's \"quoted\"");
    }

    #[test]
    fn an_unknown_delivery_is_named() {
        let spec = SinkSpec {
            delivery: "twice",
            ..SinkSpec::default()
        };
        assert!(spec.config().unwrap_err().to_string().contains("twice"));
    }
}
