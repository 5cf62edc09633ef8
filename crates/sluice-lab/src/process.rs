//! `sluice run` as a child process the lab can start, kill -9, freeze,
//! thaw and stop.
//!
//! Each run gets its own config file and log under a scratch directory; the
//! child is killed when its handle is dropped, so the lab never leaves
//! processes behind.

use anyhow::Context;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The settings of one sink process.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub brokers: String,
    pub clickhouse_url: String,
    pub topic: String,
    pub table: String,
    pub group: String,
    /// `[kafka] session_timeout`: how long the coordinator waits for a
    /// silent member (the lab's 6 s makes rebalances after a kill quick).
    pub session_timeout: Duration,
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

/// A running `sluice run`.
pub struct SinkProcess {
    child: Option<Child>,
    pub log: PathBuf,
    /// The config file it runs with.
    pub config: PathBuf,
}

impl RunSpec {
    /// Starts this very binary as `sluice run`.
    pub fn start(&self) -> anyhow::Result<SinkProcess> {
        let exe = std::env::current_exe().context("locating the sluice binary")?;
        self.start_with(&exe)
    }

    /// Starts the `sluice` binary at `exe` as `sluice run`.
    pub fn start_with(&self, exe: &std::path::Path) -> anyhow::Result<SinkProcess> {
        let dir = std::env::temp_dir().join(super::fixture::Stack::unique("sluice_lab"));
        std::fs::create_dir_all(&dir)?;
        let cfg = dir.join("sluice.toml");
        std::fs::write(
            &cfg,
            format!(
                r#"[kafka]
brokers = "{brokers}"
group_id = "{group}"
session_timeout = "{st}ms"
heartbeat_interval = "1s"
{kafka_extra}
[clickhouse]
url = "{url}"
insert_timeout = "{it}ms"
settings = {{ {settings} }}
read_settings = {{ {read_settings} }}

[sink]
delivery = "{delivery}"
max_batch_rows = {rows}
max_batch_age = "{age}ms"
max_batch_bytes = {bytes}
{max_record}max_buffered_bytes = {buf}
commit_interval = "{ci}ms"
fence_wait = "{fw}ms"

{metrics}{dlq}
[[route]]
topic = "{topic}"
table = "{table}"
format = "{format}"
required = {required:?}
extra_fields = "{extra}"
{dedup}{registry}"#,
                brokers = self.brokers,
                group = self.group,
                st = self.session_timeout.as_millis(),
                settings = inline_table(&self.settings),
                read_settings = inline_table(&self.read_settings),
                url = self.clickhouse_url,
                it = self.insert_timeout.as_millis(),
                delivery = self.delivery,
                rows = self.max_batch_rows,
                bytes = self.max_batch_bytes,
                ci = self.commit_interval.as_millis(),
                age = self.max_batch_age.as_millis(),
                buf = self.max_buffered_bytes,
                fw = self.fence_wait.as_millis(),
                topic = self.topic,
                table = self.table,
                metrics = self
                    .metrics_listen
                    .as_ref()
                    .map(|a| format!("[metrics]\nlisten = \"{a}\"\n"))
                    .unwrap_or_default(),
                dlq = self
                    .dlq_topic
                    .as_ref()
                    .map(|t| format!("[dlq]\ntopic = \"{t}\"\n"))
                    .unwrap_or_default(),
                required = self.required,
                extra = self.extra_fields.unwrap_or("ignore"),
                max_record = self
                    .max_record_bytes
                    .map(|b| format!("max_record_bytes = {b}\n"))
                    .unwrap_or_default(),
                kafka_extra = [
                    ("auto_offset_reset", &self.auto_offset_reset),
                    ("instance_id", &self.instance_id),
                ]
                .iter()
                .filter_map(|(k, v)| Some(format!("{k} = \"{}\"\n", v.as_ref()?)))
                .chain((!self.kafka_properties.is_empty()).then(|| {
                    let p: Vec<String> = self
                        .kafka_properties
                        .iter()
                        .map(|(k, v)| format!("{k:?} = {v:?}"))
                        .collect();
                    format!("properties = {{ {} }}\n", p.join(", "))
                }))
                .collect::<String>(),
                format = self.format,
                registry = self
                    .schema_registry
                    .as_ref()
                    .map(|u| format!("\n[schema_registry]\nurl = \"{u}\"\n"))
                    .unwrap_or_default(),
                dedup = self
                    .dedup_key
                    .as_ref()
                    .map(|k| format!("dedup_key = [\"{k}\"]\ndedup_window = \"1h\"\n"))
                    .unwrap_or_default(),
            ),
        )?;
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
        Ok(SinkProcess {
            child: Some(child),
            log,
            config: cfg,
        })
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
        loop {
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
        }
    }
}

impl Drop for SinkProcess {
    fn drop(&mut self) {
        self.thaw();
        self.kill9();
    }
}

/// `k = "v", …`: the inside of a TOML inline table.
fn inline_table(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k} = {v:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}
